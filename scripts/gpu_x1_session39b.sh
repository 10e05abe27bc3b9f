#!/usr/bin/env bash
# One H100 command (stop 39, second): re-tunings of the Netflix-shape cells whose shipped
# records predate the fused CG's dims geometries (stop 38) and lost in the coverage run of
# a498da3 to the selection model's pick (results/bench/gpu-implicit/run-39: explicit f = 64
# 0.0737 vs 0.0553 s/it, f = 100 0.140 vs 0.115, biased f = 128 0.445 vs 0.249, f = 64 0.106 vs
# 0.094, implicit f = 32 0.0356 vs 0.0306): those picks (dims form on the users' side, TF32 mma
# hermitians on the items') as starts, sampled and bounded like scripts/gpu_x1_session39a.sh.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session39b.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd /tmp || exit 1     # import the installed clmf, not the checkout
export PYTHONFAULTHANDLER=1
T0=$SECONDS
F="batch+vec4:solver=fusedcg,fused_dims=1"
MMA="batch+vec4+mma:tx=4,ks=2,solver=cg,precision=tf32"
GEMM="batch+vec4+gemm:bx=64,nnz_batch=8,solver=cg"
tune() {  # tune LIMIT F MODE-ARGS... -- STARTS...
    local limit=$1 f=$2; shift 2
    local args=() starts=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
    shift
    for s in "$@"; do starts+=(--start "$s"); done
    timeout -s ABRT "$limit" python3 -m clmf -v tune --preset netflix --factors "$f" --device gpu \
        --budget 10 --max-wall 45 --sample auto "${args[@]}" "${starts[@]}" \
        --db "$OUT/tune-39b.jsonl" --no-progress 2>&1 | grep -v "CompilerWarning\|lambda: self" \
        | tail -30
    echo "tune f=$f ${args[*]}: exit ${PIPESTATUS[0]} at $((SECONDS - T0)) s"
}
IMP=(--feedback implicit --alpha 2)
tune 120 64 -- "$F,solve_wg=128,nnz_batch=8" "$MMA"
tune 120 100 -- "$F,dims_q=2,dims_p=0,solve_wg=128,nnz_batch=8" "$MMA"
tune 130 128 --biases -- "$F,solve_wg=256,nnz_batch=8" "$MMA"
tune 110 64 --biases -- "$F,solve_wg=128,nnz_batch=8" "$MMA"
left=$((580 - (SECONDS - T0)))
if [ "$left" -gt 80 ]; then
    tune "$left" 32 "${IMP[@]}" -- "$F,solve_wg=128,nnz_batch=8" "$MMA"
fi
