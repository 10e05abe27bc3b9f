#!/usr/bin/env bash
# One-H100 commands (stop 47), issues 27 and 30:
#   a: the items' half-step on the tensor cores at large f — the mma form with its register
#      write-back spread over 1, 2 or 4 work-groups per row (direct=N; no run had timed it at
#      f >= 128) — against auto, the users' side kept at auto's choice (side_profile.py --vary
#      items): implicit f = 256 / 200 / 128 (tf32), explicit f = 256 / 128 (fp32 and tf32).
#   b: registers, spills and work-group limits of the kernels auto runs at f = 256 / 128 / 100 / 50
#      and of the mma direct form (benchmarks/kernel_resources.py: ptxas -v on the driver's PTX
#      where ptxas exists, the driver's kernel work-group info); then the dims form at f = 256
#      (implicit) with shapes no run had timed: 512-wide work-groups, 8 lanes per entry (dims_q=8).
#   c: the dims form and the syrk S1 with NVIDIA's per-work-item register cap (CLMF_NV_MAXRREG:
#      -cl-nv-maxrregcount) at 128 and 96 against none: at f = 256 the dims form's 179-190
#      registers (b) leave one 256-wide work-group per SM; auto's pair at implicit f = 256 / 128
#      and explicit f = 100 / 50. Result: the same times with every cap — NVIDIA's compiler
#      ignores the option (its -cl-nv-verbose log: s3_fcg still 190 registers with the cap at
#      96); the switch was removed after this run (it only ever existed at a31fc27).
#   d: the dims form with the first dims_cache entries' rows kept in local memory for the CG's
#      later passes, the users' side varied from auto's choice (the items' kept): implicit
#      f = 256 / 128, explicit f = 100. Result: slower (users f = 256 0.218 -> 0.271-0.275 s,
#      f = 128 0.069 -> 0.081-0.083 s; f = 100 within 2 %): the option was removed again (it
#      only ever existed at 3c9e1db).
#   e: the dims form's sum over its entry groups in 1.5·s local-memory slots (two regions taken in
#      turn) instead of one per group — 12 KB instead of 16 KB at f = 256, so its local memory
#      passes under 16 KB ("new", this tree) — against the wheel of 5b66d90 (.whl/base49,
#      "base"), alternating, auto's pair (side_profile.py, no variants): implicit f = 256 / 128 /
#      64, explicit f = 100. Result: the same times (f = 256 users 0.2161 / 0.2161 against
#      0.2163 / 0.2166): reverted (it only ever existed at 45d56b0).
#   f: wrow — S1 and S2 at small f with 32 work-items per row summing in registers (new) —
#      against auto on both sides (side_profile.py): explicit and implicit f = 10 and 16.
#      Result: S1 twice auto's syrk (explicit f = 10: users 7.6 against 3.3 ms, items 4.6
#      against 2.3 ms; 96 registers, no spills): removed (it only ever existed at 7dc112b).
#   g, h: the selection model's leave-one-out picks that no run of their H100 cell had timed
#      ("unmeasured" in results/tuning/reports/offline-loo.md after loo11), timed in short tuning
#      runs of those cells (the picks among the starts) into tune-47g.jsonl / tune-47h.jsonl:
#      g the Netflix shape (biased f = 64 / 256, explicit f = 10 / 50, implicit f = 100), h the
#      MovieLens-20M shape (explicit f = 64 / 128, implicit f = 64 / 128 / 256).
#   i: the same for the 7 picks still unmeasured after g and h (offline-loo.md at 2f65f77): the
#      Netflix shape's explicit f = 32 / 50 / 100, the new MovieLens-20M cell's explicit f = 128,
#      and MovieLens-100K's ua.base at explicit f = 10 / 50 / 100 (carry .data/ml-100k, a copy of
#      ../shared/data/ml-100k: never committed) into tune-47i.jsonl.
#   j: auto at f = 50 (explicit, implicit), whose Netflix choices changed with the runs g-i'
#      records (explicit: items syrk ks=8,solve_wg=32 -> ks=4; implicit: users mma tf32 -> the
#      dims form), this tree ("new") against the wheel of 5b66d90 (.whl/base49, "base"),
#      alternating twice (side_profile.py, no variants; the pairs' s/it).
#   k: the two f = 50 cells j found slower tuned again with both choices among the starts and a
#      longer search (--budget 20 --max-wall 60) into tune-47k.jsonl, then auto with those records
#      in front (CLMF_TUNING_DB) against the wheel of 5b66d90 as in j.
#   l: the Netflix cells auto still answered from the model (biased f = 10 and 50, implicit
#      f = 10) tuned (--budget 20 --max-wall 60, the neighbouring tuned choices among the starts)
#      into tune-47l.jsonl, then auto with those records in front against the wheel of 5b66d90.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session47.sh a
. "$(dirname "$0")/gpu_preamble.sh"
M="batch+vec4+mma:solver=cg"
T0=$SECONDS
DEV=${DEV:-gpu} SCALE=${SCALE:-1.0}   # (a CPU check: DEV=cpu SCALE=0.002 CLMF_MMA_EMULATION=1)
part=${1:-a}
case "$part" in
a)
    V="$M,tx=8,nnz_batch=16,direct=2,precision=tf32;$M,tx=8,nnz_batch=32,direct=2,precision=tf32"
    V="$V;$M,tx=8,nnz_batch=16,direct=4,precision=tf32;$M,tx=4,nnz_batch=16,direct=4,precision=tf32"
    V="$V;$M,tx=16,nnz_batch=16,direct=1,precision=tf32;$M,tx=8,nnz_batch=16,direct=1,precision=tf32"
    V="$V;$M,tx=8,nnz_batch=16,direct=2,precision=fp32"
    timeout 330 python3 "$R/benchmarks/side_profile.py" --device "$DEV" --scale "$SCALE" --out "$OUT/a" \
        --factors 256,200,128 --modes implicit --vary items --iterations 3 --max-seconds 320 \
        --variants "$V" 2>&1 | grep -v "CompilerWarning\|lambda: self"
    mkdir -p "$OUT/a2"
    timeout 230 python3 "$R/benchmarks/side_profile.py" --device "$DEV" --scale "$SCALE" --out "$OUT/a2" \
        --factors 256,128 --modes explicit --vary items --iterations 3 --max-seconds 200 \
        --variants "$V" 2>&1 | grep -v "CompilerWarning\|lambda: self"
    ;;
b)
    F="batch+vec4:solver=fusedcg,fused_dims=1"
    W="$F,dims_shfl=1,dims_rsum=1"
    C="implicit:256:$W,dims_pipe=1,solve_wg=256,nnz_batch=2,dims_q=4"
    C="$C;implicit:256:$W,solve_wg=256,nnz_batch=4,dims_q=4"
    C="$C;implicit:128:$W,solve_wg=128,nnz_batch=8,dims_q=2"
    C="$C;implicit:128:$W,solve_wg=256,nnz_batch=4,dims_q=4"
    C="$C;explicit:100:$F,solve_wg=128,nnz_batch=8,dims_q=2"
    C="$C;explicit:100:batch+vec4+syrk:bx=8,ks=2,solver=cg"
    C="$C;explicit:50:batch+vec4+syrk:bx=8,ks=8,solve_wg=32,solver=cg"
    C="$C;explicit:10:batch+vec4+syrk:bx=4,ks=16,nnz_batch=64,solver=cg"
    C="$C;implicit:256:$M,tx=8,nnz_batch=32,direct=2,precision=tf32"
    C="$C;implicit:256:$W,solve_wg=512,nnz_batch=4,dims_q=4"
    C="$C;implicit:256:$W,solve_wg=256,nnz_batch=2,dims_q=8"
    timeout 200 python3 "$R/benchmarks/kernel_resources.py" --device "$DEV" --out "$OUT/b" \
        --cells "$C" 2>&1 | grep -v "CompilerWarning\|lambda: self" | cut -c1-400
    (cd "$OUT/b" && tar czf ptx.tgz ptx && rm -rf ptx)
    V="$W,solve_wg=512,nnz_batch=4,dims_q=4;$W,dims_pipe=1,solve_wg=512,nnz_batch=2,dims_q=4"
    V="$V;$W,solve_wg=256,nnz_batch=2,dims_q=8;$W,solve_wg=512,nnz_batch=2,dims_q=8"
    V="$V;$W,dims_pipe=1,solve_wg=256,nnz_batch=1,dims_q=8;$W,solve_wg=1024,nnz_batch=2,dims_q=8"
    V="$V;$W,solve_wg=128,nnz_batch=4,dims_q=4"
    timeout 300 python3 "$R/benchmarks/side_profile.py" --device "$DEV" --scale "$SCALE" \
        --out "$OUT/b2" --factors 256 --modes implicit --iterations 3 --max-seconds 280 \
        --variants "$V" 2>&1 | grep -v "CompilerWarning\|lambda: self"
    ;;
c)
    for cap in "" 128 96 ""; do
        echo "== CLMF_NV_MAXRREG=$cap"
        CLMF_NV_MAXRREG=$cap timeout 150 python3 "$R/benchmarks/side_profile.py" --device "$DEV" \
            --scale "$SCALE" --out "$OUT/c-${cap:-none}" --factors 256,128 --modes implicit \
            --iterations 3 --max-seconds 140 --variants "" 2>&1 | grep "auto"
        CLMF_NV_MAXRREG=$cap timeout 100 python3 "$R/benchmarks/side_profile.py" --device "$DEV" \
            --scale "$SCALE" --out "$OUT/c-${cap:-none}-x" --factors 100,50 --modes explicit \
            --iterations 3 --max-seconds 90 --variants "" 2>&1 | grep "auto"
    done
    ;;
d)
    U="batch+vec4:nnz_batch=2,solve_wg=256,solver=fusedcg,fused_dims=1,dims_shfl=1,dims_rsum=1"
    U="$U,dims_pipe=1,dims_q=4"
    timeout 120 python3 "$R/benchmarks/side_profile.py" --device "$DEV" --scale "$SCALE" \
        --out "$OUT/d256" --factors 256 --modes implicit --vary users --iterations 3 \
        --max-seconds 110 --variants "$U,dims_cache=16;$U,dims_cache=24;$U,dims_cache=30;$U" \
        2>&1 | grep -v "CompilerWarning\|lambda: self"
    U="batch+vec4:nnz_batch=8,solve_wg=128,solver=fusedcg,fused_dims=1,dims_shfl=1,dims_rsum=1"
    U="$U,dims_q=2"
    timeout 100 python3 "$R/benchmarks/side_profile.py" --device "$DEV" --scale "$SCALE" \
        --out "$OUT/d128" --factors 128 --modes implicit --vary users --iterations 3 \
        --max-seconds 90 --variants "$U,dims_cache=32;$U,dims_cache=64;$U,dims_cache=80" \
        2>&1 | grep -v "CompilerWarning\|lambda: self"
    U="batch+vec4:tx=1,ty=1,nnz_batch=8,solve_wg=128,solver=fusedcg,fused_dims=1,dims_q=2,dims_p=0"
    timeout 100 python3 "$R/benchmarks/side_profile.py" --device "$DEV" --scale "$SCALE" \
        --out "$OUT/d100" --factors 100 --modes explicit --vary users --iterations 3 \
        --max-seconds 90 --variants "$U,dims_cache=32;$U,dims_cache=64;$U,dims_cache=90" \
        2>&1 | grep -v "CompilerWarning\|lambda: self"
    (cd "$OUT" && tar czf d.tgz d256 d128 d100 && rm -rf d256 d128 d100)
    ;;
e)
    python3 -m pip install -q --no-deps --target /tmp/site-base "$R"/.whl/base49/clmf-*.whl 2>&1 | tail -2
    for round in 1 2; do
        for site in base new; do
            sp=""; [ "$site" = base ] && sp=/tmp/site-base
            echo "== $site round $round"
            PYTHONPATH=${sp:+$sp:}${PYTHONPATH:-} timeout 110 python3 "$R/benchmarks/side_profile.py" \
                --device "$DEV" --scale "$SCALE" --out "$OUT/e-$site-$round" --factors 256,128,64 \
                --modes implicit --iterations 3 --max-seconds 100 --variants "" 2>&1 | grep "auto:\|clmf from"
            PYTHONPATH=${sp:+$sp:}${PYTHONPATH:-} timeout 40 python3 "$R/benchmarks/side_profile.py" \
                --device "$DEV" --scale "$SCALE" --out "$OUT/e-$site-$round-x" --factors 100 \
                --modes explicit --iterations 3 --max-seconds 35 --variants "" 2>&1 | grep "auto:\|clmf from"
        done
    done
    (cd "$OUT" && tar czf e.tgz e-* && rm -rf e-*/)
    ;;
f)
    B="batch+vec4:solver=cholesky"
    V="$B,wrow=1;$B,wrow=2;$B,wrow=4;batch+vec4:solver=cg,wrow=2;batch+vec4:solver=cg,wrow=4"
    for mode in explicit implicit; do
        timeout 150 python3 "$R/benchmarks/side_profile.py" --device "$DEV" --scale "$SCALE" \
            --out "$OUT/f-$mode" --factors 10,16 --modes $mode --iterations 5 \
            --max-seconds 140 --variants "$V" 2>&1 | grep -v "CompilerWarning\|lambda: self"
    done
    (cd "$OUT" && tar czf f.tgz f-* && rm -rf f-*/)
    ;;
g|h|i|k|l)
    export PYTHONFAULTHANDLER=1
    TUNE_DB=tune-47$part.jsonl
    tune() {  # tune LIMIT PRESET F MODE-ARGS... -- STARTS...
        local limit=$1 preset=$2 f=$3; shift 3
        local args=() starts=()
        while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
        shift
        for x in "$@"; do starts+=(--start "$x"); done
        local src=(--preset "$preset" --scale "$SCALE")
        [ -d "$preset" ] && src=("$preset")            # a ratings directory (ml-100k: ua.base)
        timeout -s ABRT "$limit" python3 -m clmf -v tune "${src[@]}" --factors "$f" \
            --device "$DEV" --budget "${TB:-10}" --max-wall "${TW:-40}" --sample auto "${args[@]}" "${starts[@]}" \
            --db "$OUT/$TUNE_DB" --no-progress 2>&1 | grep -v "CompilerWarning\|lambda: self" \
            | tail -4
        echo "tune $preset f=$f ${args[*]}: exit ${PIPESTATUS[0]} at $((SECONDS - T0)) s"
    }
    D="batch+vec4:solver=fusedcg,fused_dims=1"
    S="$D,dims_shfl=1"
    IMP=(--feedback implicit --alpha 2)
    if [ "$part" = l ]; then
        TB=20 TW=60
        X10="batch+vec4+syrk:bx=4,ks=16,nnz_batch=64,solver=cg"
        tune 110 netflix 10 --biases -- "$X10" "batch+vec4+syrk:bx=4,ks=32,nnz_batch=128,solve_wg=8,solver=cg"
        tune 110 netflix 50 --biases -- "batch+vec4+syrk:bx=8,ks=4,solver=cg" \
            "batch+vec4+syrk:bx=8,ks=8,solve_wg=32,solver=cg"
        tune 110 netflix 10 "${IMP[@]}" -- "$X10"
        ab l base49 "$OUT/$TUNE_DB" biased:10,50 implicit:10
    elif [ "$part" = k ]; then
        TB=20 TW=60
        tune 120 netflix 50 "${IMP[@]}" -- "batch+vec4+mma:tx=4,ks=2,solver=cg,precision=tf32" \
            "$D,tx=1,ty=1,nnz_batch=8,solve_wg=256"
        tune 120 netflix 50 -- "batch+vec4+syrk:bx=8,ks=4,solver=cg" \
            "batch+vec4+syrk:bx=8,ks=8,solve_wg=32,solver=cg"
        ab k base49 "$OUT/$TUNE_DB" explicit:50 implicit:50
    elif [ "$part" = i ]; then
        tune 80 netflix 32 -- "$S,tx=1,ty=1,nnz_batch=8,solve_wg=128,dims_q=2" "$D,nnz_batch=8,solve_wg=128"
        tune 80 netflix 50 -- "$D,tx=1,ty=1,nnz_batch=8,solve_wg=256" "batch+vec4+syrk:bx=8,ks=4,solver=cg"
        tune 90 netflix 100 -- "$D,nnz_batch=8,solve_wg=128,dims_q=2" "$D,nnz_batch=8,solve_wg=256,dims_q=2"
        tune 80 movielens-20m 128 -- "$S,nnz_batch=8,solve_wg=128,dims_rsum=1,dims_q=2"
        M1="$R/.data/ml-100k"
        tune 60 "$M1" 10 -- "batch+vec4+syrk:bx=4,ks=16,nnz_batch=64,solver=cg" \
            "batch+vec4+syrk:bx=4,ks=32,nnz_batch=128,solve_wg=8,solver=cg"
        tune 60 "$M1" 50 -- "batch+reg+vec4+tile:ty=4,bx=48,by=16"
        tune 60 "$M1" 100 -- "batch+reg+local+vec4+tile:ty=4,bx=16,by=16,tz=4,solve_wg=32" \
            "batch+reg+local+vec4+tile:ty=4,bx=16,by=16,tz=4,solve_wg=8"
    elif [ "$part" = g ]; then
        tune 100 netflix 64 --biases -- "$D,tx=1,ty=1,nnz_batch=8,solve_wg=256" \
            "batch+vec4+mma:tx=4,ks=2,solver=cg,precision=tf32"
        tune 110 netflix 256 --biases -- "$D,tx=1,ty=1,nnz_batch=8,solve_wg=256" \
            "batch+vec4+gemm:bx=64,nnz_batch=8,solver=cg"
        tune 90 netflix 10 -- "batch+vec4+syrk:bx=4,ks=16,nnz_batch=64,solver=cg"
        tune 90 netflix 50 -- "$D,tx=1,ty=1,nnz_batch=8,solve_wg=128" "batch+vec4+syrk:bx=8,ks=4,solver=cg"
        tune 100 netflix 100 "${IMP[@]}" -- "$D,tx=1,ty=1,nnz_batch=8,solve_wg=128,dims_q=2,dims_p=0" \
            "$D,nnz_batch=8,solve_wg=256,dims_q=2"
    else
        tune 80 movielens-20m 64 -- "$S,tx=1,ty=1,nnz_batch=8,solve_wg=128,dims_rsum=1,dims_q=2"
        tune 90 movielens-20m 128 -- "$S,tx=1,ty=1,nnz_batch=8,solve_wg=128,dims_q=2" \
            "$S,nnz_batch=4,solve_wg=256,dims_rsum=1,dims_q=4"
        tune 80 movielens-20m 64 "${IMP[@]}" -- "$S,nnz_batch=8,solve_wg=128,dims_rsum=1,dims_q=2"
        tune 90 movielens-20m 128 "${IMP[@]}" -- "$S,nnz_batch=8,solve_wg=128,dims_rsum=1,dims_q=2" \
            "$S,nnz_batch=4,solve_wg=256,dims_rsum=1,dims_q=4"
        tune 100 movielens-20m 256 "${IMP[@]}" -- "$S,nnz_batch=4,solve_wg=256,dims_rsum=1,dims_q=4"
    fi
    gzip -f "$OUT/$TUNE_DB"
    ;;
j)
    ab j base49 "" explicit:50 implicit:50
    ;;
esac
echo "done at $((SECONDS - T0)) s"
