#!/usr/bin/env bash
# One-H100 commands (stop 49), issue 27: the H100's tunings again with the tuner's fixes of stop
# 49 (the final side-by-side times, on each sampled side, the fastest configuration of every
# other kernel form on the reference rows — the whole side where affordable — and records those
# times as measurements of fidelity "reference"; a hopeless candidate is timed by its warm-up
# alone), on the Netflix shape:
#   a: the cells whose sampled tunings misranked the forms (48f, 48g): explicit f = 128, biased
#      f = 128 (its leave-one-out pick measured 6.57x its cell's best) and biased f = 200, with
#      the leave-one-out picks and the current choices among the starts, into tune-49a.jsonl;
#      then auto with those records in front at explicit and biased f = 128 / 200.
#   b: biased f = 256, and the cells whose leave-one-out picks no run timed: implicit f = 200 and
#      100, explicit f = 100 (the picks among the starts), into tune-49b.jsonl; then auto with
#      those records in front (explicit, biased, implicit at f = 100 / 200 / 256).
#   c: with the sample check of every kernel form (ae81953: the items' sample grows where the
#      dims form's estimate is off) and the engines' shared column counts: explicit f = 100 (b's
#      run hit its limit in the final side by side), biased f = 256 and 200 (their
#      leave-one-out picks, the dims form on both sides, read 2.3-3x their cells' best from
#      sampled items times), into tune-49c.jsonl; then biased auto with those records in front.
#   d: the Netflix cells whose leave-one-out picks no run timed (after c and the split run ids):
#      explicit f = 50 and 200, biased f = 50 and 64, implicit f = 50, short runs (budget 10 s,
#      --max-wall 30) with the picks among the starts, into tune-49d.jsonl (no auto timing).
#   e (prepared at the end of stop 49, not run: device time spent): the cells whose
#      leave-one-out picks no run timed after d — explicit f = 200 (d's run was cut) and implicit
#      f = 200 on the Netflix shape, implicit f = 64 / 128 / 256 on the MovieLens-20M shape — with
#      the picks among the starts, into tune-49e.jsonl (no auto timing).
#   Each tuning run's whole log is in logs.tgz (a run stopped at its limit leaves its traceback).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session49.sh a
. "$(dirname "$0")/gpu_preamble.sh"
part=${1:-a}
TUNE_DB=tune-49$part.jsonl
D="batch+vec4:solver=fusedcg,fused_dims=1"
S="$D,dims_shfl=1,dims_rsum=1"
G="batch+vec4+gemm:bx=64,nnz_batch=8,solver=cg"
MMA="batch+vec4+mma:tx=4,ks=2,solver=cg,precision=tf32"
T1="tx=1,ty=1"
case $part in
a)
    tune 150 128 -- "$S,$T1,nnz_batch=4,solve_wg=256,dims_q=4" \
        "$S,$T1,nnz_batch=8,solve_wg=128,dims_q=2" "$G"
    tune 130 128 --biases -- "$D,$T1,nnz_batch=8,solve_wg=256" \
        "$D,$T1,nnz_batch=8,solve_wg=128,dims_q=2,dims_p=0" "$S,$T1,nnz_batch=4,solve_wg=256,dims_q=4" "$MMA"
    tune 130 200 --biases -- "$S,$T1,nnz_batch=4,solve_wg=256,dims_q=4" \
        "$D,$T1,nnz_batch=4,solve_wg=256,dims_q=4,dims_p=0" "$G"
    with_records a 128,200
    ;;
b)
    tune 130 256 --biases -- "$S,$T1,nnz_batch=2,solve_wg=256,dims_q=5" \
        "$D,$T1,nnz_batch=8,solve_wg=256" "$G"
    tune 120 200 --feedback implicit --alpha 2 -- "$S,$T1,nnz_batch=4,solve_wg=256,dims_q=4"
    tune 110 100 --feedback implicit --alpha 2 -- "$S,nnz_batch=8,solve_wg=128,dims_q=2" "$S,nnz_batch=4,solve_wg=256,dims_q=4"
    tune 100 100 -- "$D,$T1,nnz_batch=8,solve_wg=128,dims_shfl=1,dims_q=2" \
        "$S,$T1,nnz_batch=4,solve_wg=256,dims_q=4"
    with_records b 100,200,256 "explicit biased implicit"
    ;;
c)
    tune 160 100 -- "$D,$T1,nnz_batch=8,solve_wg=128,dims_shfl=1,dims_q=2" \
        "$S,$T1,nnz_batch=4,solve_wg=256,dims_q=4"
    tune 160 256 --biases -- "$D,$T1,nnz_batch=8,solve_wg=256" "$S,$T1,nnz_batch=2,solve_wg=256,dims_q=5" "$G"
    tune 160 200 --biases -- "$D,$T1,nnz_batch=4,solve_wg=256,dims_q=4,dims_p=0" \
        "$S,$T1,nnz_batch=4,solve_wg=256,dims_q=4" "$D,$T1,nnz_batch=8,solve_wg=256" "$G"
    with_records c 200,256 biased
    ;;
d)
    SQ2="$S,nnz_batch=8,solve_wg=128,dims_q=2"
    BUDGET=10 TW=30
    tune 90 50 -- "$S,$T1,nnz_batch=8,solve_wg=128,dims_q=2" "batch+vec4+syrk:bx=8,ks=4,solver=cg"
    tune 90 50 --biases -- "$S,$T1,nnz_batch=8,solve_wg=128,dims_q=2" "$MMA"
    tune 90 64 --biases -- "$S,$T1,nnz_batch=8,solve_wg=128,dims_q=2" "$MMA"
    tune 90 50 --feedback implicit --alpha 2 -- "$SQ2" "$MMA"
    tune 110 200 -- "$S,nnz_batch=2,solve_wg=256,dims_pipe=1,dims_q=4" "$S,nnz_batch=4,solve_wg=256,dims_q=4"
    gzip -f "$OUT/$TUNE_DB"
    [ -d "$OUT/logs" ] && (cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
    ;;
e)
    BUDGET=10 TW=30
    tune 170 200 -- "$S,nnz_batch=2,solve_wg=256,dims_pipe=1,dims_q=4" "$S,nnz_batch=4,solve_wg=256,dims_q=4"
    tune 140 200 --feedback implicit --alpha 2 -- "$D,$T1,nnz_batch=4,solve_wg=256,dims_shfl=1,dims_q=4"
    DATA=movielens-20m
    tune 80 64 --feedback implicit --alpha 2 -- "$S,$T1,nnz_batch=8,solve_wg=128,dims_q=2" \
        "$D,$T1,nnz_batch=8,solve_wg=128,dims_shfl=1,dims_q=2"
    tune 80 128 --feedback implicit --alpha 2 -- "$D,$T1,nnz_batch=8,solve_wg=128,dims_shfl=1,dims_q=2"
    tune 90 256 --feedback implicit --alpha 2 -- "$S,nnz_batch=2,solve_wg=256,dims_pipe=1,dims_q=4" \
        "$S,nnz_batch=4,solve_wg=256,dims_q=4"
    gzip -f "$OUT/$TUNE_DB"
    [ -d "$OUT/logs" ] && (cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
    ;;
esac
echo "part $part done at $((SECONDS - T0)) s"
