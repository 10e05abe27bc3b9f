#!/usr/bin/env bash
# One-H100 commands (stop 48), issues 27 and 30: what bounds the kernels, measured.
#   a: Nsight Compute counters of the kernels auto runs on the Netflix shape — implicit f = 256
#      (the dims form, both sides), explicit f = 100 and f = 10 (S1 and S3) — through
#      benchmarks/ncu_replay.py: each side's largest launch captured from a real half-step (PTX,
#      arguments, buffers before and after), replayed through the CUDA driver API and checked
#      against the OpenCL result, timed beside the OpenCL event time, then profiled by
#      `ncu --set full`; $OUT/replay.jsonl, $OUT/ncu.tgz (reports, summaries, details as CSV).
#   b: the dimensions form launched past its (unused) scratch's rows (clmf.engine.memory.
#      launch_rows: up to 65,536 rows a launch instead of 2,040 at f = 256, 8,160 at f = 128),
#      this tree ("new") against the wheel of 278f4a6 (.whl/base50, "base": the same tree before
#      the change), alternating twice: auto's pair (side_profile.py, no variants, 5 iterations)
#      at implicit f = 256 / 128 / 64 and explicit f = 256 / 128.
#   c: issue 27's side-by-side table (gpu_implicit.py: explicit and implicit auto fits at
#      f = 64 / 128 / 256 beside the `implicit` library, 15 iterations; needs prepare-peers'
#      wheels in .whl), then part a's capture and counters of implicit f = 256's new launches.
#   d: auto in every mode at f = 10 ... 256 after b's change (side_profile.py, no variants,
#      3 iterations, one process per mode): does s/it still never rise when f falls?
#   e: the cells d found on stale choices tuned again with this tree (the dims form's launches of
#      b, its shuffle sums at any f with D rounded up to a power of two): explicit f = 200 (0.352
#      s/it against 0.218 at f = 256: s/it rose as f fell), biased f = 256 / 200, explicit
#      f = 128 (--budget 20 --max-wall 60, the padded shuffle forms and the current choices among
#      the starts) into tune-48e.jsonl; then d's explicit and biased rows again with those
#      records in front (CLMF_TUNING_DB).
#   f: the cells whose items' side e's sampled tuning kept on the S1 forms (the dims form timed on
#      1,057 of 17,770 item rows, where its longest rows dominate a launch) tuned on whole
#      half-steps (--sample full): explicit f = 128, biased f = 200 / 256, into tune-48f.jsonl;
#      then auto with those records in front at explicit and biased f = 128 / 200 / 256.
#   g (prepared at the end of stop 48, not run: device time spent): the tuner's balanced GPU
#      samples (64db268) on the cells 48f found misranked — explicit f = 128, biased f =
#      200 — and explicit f = 100, whose leave-one-out pick (the padded shuffle form) no run timed,
#      the picks among the starts, into tune-48g.jsonl (3 × 140 s at most); then auto with those
#      records in front at explicit and biased f = 100 / 128 / 200 (one 10-minute command).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session48.sh a
. "$(dirname "$0")/gpu_preamble.sh"
NR=$R/benchmarks/ncu_replay.py
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
part=${1:-a}
profile() {  # profile DIR...: replay (check, 3 timed runs) and ncu each capture, while time lasts
    local d name
    mkdir -p "$OUT/ncu"
    for d in "$@"; do
        [ -d "$d" ] || continue
        name=$(basename "$d")
        if [ $((SECONDS - T0)) -gt "${LIMIT:-520}" ]; then echo "time: $name skipped"; continue; fi
        timeout 90 python3 "$NR" replay "$d" --reps 3 >> "$OUT/replay.jsonl" 2>> "$OUT/replay.err" \
            || echo "$name: replay failed (see replay.err)"
        tail -1 "$OUT/replay.jsonl"
        [ -n "$NCU" ] || continue
        timeout 150 "$NCU" --set full -c 1 -f -o "$OUT/ncu/$name" python3 "$NR" replay "$d" \
            > "$OUT/ncu/$name.log" 2>&1 || echo "$name: ncu rc $?"
        if [ -f "$OUT/ncu/$name.ncu-rep" ]; then
            python3 "$NR" summary "$OUT/ncu/$name.ncu-rep" --ncu "$NCU" > "$OUT/ncu/$name.txt" 2>&1
            "$NCU" --import "$OUT/ncu/$name.ncu-rep" --page details --csv \
                > "$OUT/ncu/$name.details.csv" 2>&1
            head -40 "$OUT/ncu/$name.txt"
        else
            tail -5 "$OUT/ncu/$name.log"
        fi
    done
    tar czf "$OUT/ncu.tgz" -C "$OUT" ncu && rm -rf "$OUT/ncu"
}
case $part in
a)
    echo "ncu: ${NCU:-none}"; [ -n "$NCU" ] && "$NCU" --version | tail -1
    CAP=/tmp/cap48a
    timeout 300 python3 "$NR" capture --device "$DEV" --data "$DATA" --scale "$SCALE" \
        --out "$CAP" --cells "implicit:256;explicit:100;explicit:10" \
        --kernels s3_fcg,s1_hermitian,s3_solve,s3_fused 2>&1 | grep -v "CompilerWarning\|lambda: self"
    du -sh "$CAP"
    profile "$CAP"/implicit256-s3_fcg-users "$CAP"/implicit256-s3_fcg-items \
        "$CAP"/explicit100-s1_hermitian-items "$CAP"/explicit100-s1_hermitian-users \
        "$CAP"/explicit10-s1_hermitian-users "$CAP"/explicit10-s1_hermitian-items \
        "$CAP"/explicit100-s3_solve-users "$CAP"/explicit10-s3_solve-users
    ;;
b)
    AB_LIMIT=110 ab b base50 "" implicit:256,128,64 explicit:256,128
    ;;
c)
    side_by_side /dev/null
    CAP=/tmp/cap48c
    timeout 200 python3 "$NR" capture --device "$DEV" --data "$DATA" --scale "$SCALE" \
        --out "$CAP" --cells "implicit:256" --kernels s3_fcg 2>&1 | grep -v "CompilerWarning\|lambda: self"
    LIMIT=540 profile "$CAP"/implicit256-s3_fcg-users "$CAP"/implicit256-s3_fcg-items
    ;;
d)
    for mode in implicit explicit biased; do
        timeout 170 python3 "$R/benchmarks/side_profile.py" --device "$DEV" --scale "$SCALE" \
            --out "$OUT/d-$mode" --factors 10,16,32,50,64,100,128,200,256 --modes "$mode" \
            --iterations 3 --max-seconds 160 --variants "" 2>&1 | grep " auto \["
    done
    (cd "$OUT" && tar czf d.tgz d-* && rm -rf d-*/)
    ;;
e|f|g)
    TUNE_DB=tune-48$part.jsonl
    D="batch+vec4:solver=fusedcg,fused_dims=1"
    S="$D,dims_shfl=1,dims_rsum=1"
    G="batch+vec4+gemm:bx=64,nnz_batch=8,solver=cg"
    if [ "$part" = g ]; then
        TW=60
        P2="$S,tx=1,ty=1,nnz_batch=8,solve_wg=128,dims_q=2"
        tune 140 128 -- "$S,nnz_batch=4,solve_wg=256,dims_q=4" "$P2" "$G"
        tune 140 200 --biases -- "$S,nnz_batch=4,solve_wg=256,dims_q=4" \
            "$D,tx=1,ty=1,nnz_batch=8,solve_wg=256" "$G"
        tune 140 100 -- "$P2" "$D,tx=1,ty=1,nnz_batch=8,solve_wg=128,dims_q=2,dims_p=0" \
            "batch+vec4+syrk:bx=8,ks=2,solver=cg"
        with_records g 100,128,200
        exit 0
    fi
    if [ "$part" = f ]; then
        SAMPLE=full TW=50
        tune 90 128 -- "$S,nnz_batch=4,solve_wg=256,dims_q=4" \
            "$D,tx=1,ty=1,nnz_batch=8,solve_wg=128,dims_shfl=1,dims_q=2" "$G"
        tune 95 256 --biases -- "$S,nnz_batch=2,solve_wg=256,dims_q=5" \
            "$D,tx=1,ty=1,nnz_batch=4,solve_wg=256,dims_q=4,dims_p=0" "$G"
        tune 95 200 --biases -- "$S,nnz_batch=4,solve_wg=256,dims_q=4" \
            "$D,tx=1,ty=1,nnz_batch=8,solve_wg=256" "$G"
        with_records f 128,200,256
        exit 0
    fi
    tune 105 200 -- "$S,nnz_batch=4,solve_wg=256,dims_q=4" "$S,nnz_batch=8,solve_wg=256,dims_q=2" \
        "$D,tx=1,ty=1,nnz_batch=8,solve_wg=256,dims_q=2" "$G"
    tune 105 256 --biases -- "$S,nnz_batch=2,solve_wg=256,dims_q=5" \
        "$S,nnz_batch=4,solve_wg=256,dims_q=3" "$D,tx=1,ty=1,nnz_batch=4,solve_wg=256,dims_q=4,dims_p=0" "$G"
    tune 105 200 --biases -- "$S,nnz_batch=4,solve_wg=256,dims_q=4" \
        "$D,tx=1,ty=1,nnz_batch=8,solve_wg=256" "$G"
    tune 100 128 -- "$S,nnz_batch=4,solve_wg=256,dims_q=4" "$S,nnz_batch=8,solve_wg=128,dims_q=2" \
        "$D,tx=1,ty=1,nnz_batch=8,solve_wg=128,dims_shfl=1,dims_q=2" "$G"
    for mode in explicit biased; do
        CLMF_TUNING_DB=$OUT/$TUNE_DB timeout 75 python3 "$R/benchmarks/side_profile.py" \
            --device "$DEV" --scale "$SCALE" --out "$OUT/e-$mode" --factors 100,128,200,256 \
            --modes "$mode" --iterations 3 --max-seconds 70 --variants "" 2>&1 | grep " auto \["
    done
    (cd "$OUT" && tar czf e.tgz e-* && rm -rf e-*/)
    gzip -f "$OUT/$TUNE_DB"
    ;;
esac
echo "part $part: $((SECONDS - T0)) s"
