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
S=$(cd "$(dirname "$0")" && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
TUNE_DB=tune-39b.jsonl
. "$S/gpu_tune.sh"
IMP=(--feedback implicit --alpha 2)
tune 120 64 -- "$F,solve_wg=128,nnz_batch=8" "$MMA"
tune 120 100 -- "$F,dims_q=2,dims_p=0,solve_wg=128,nnz_batch=8" "$MMA"
tune 130 128 --biases -- "$F,solve_wg=256,nnz_batch=8" "$MMA"
tune 110 64 --biases -- "$F,solve_wg=128,nnz_batch=8" "$MMA"
left=$((580 - (SECONDS - T0)))
if [ "$left" -gt 80 ]; then
    tune "$left" 32 "${IMP[@]}" -- "$F,solve_wg=128,nnz_batch=8" "$MMA"
fi
