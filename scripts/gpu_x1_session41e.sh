#!/usr/bin/env bash
# One H100 command (stop 41, fifth): implicit f = 256 re-tuned longer (90 s search) from 41d's
# best with more dims-form geometries among the starts, then f = 128 (implicit, explicit) with the
# warp-shuffle entry sums (`dims_shfl=1`) among the starts.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session41e.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
cd /tmp || exit 1     # import the installed clmf, not the checkout
TUNE_DB=tune-41e.jsonl
. "$S/gpu_tune.sh"
IMP=(--feedback implicit --alpha 2)
FS="$F,dims_shfl=1"
tune 210 256 "${IMP[@]}" --max-wall 90 -- "$FS,solve_wg=256,nnz_batch=4,dims_q=4" \
    "$FS,solve_wg=256,nnz_batch=2,dims_q=4" "$FS,solve_wg=128,nnz_batch=4,dims_q=4" \
    "$FS,solve_wg=256,nnz_batch=4,dims_q=2" "$FS,solve_wg=256,nnz_batch=8,dims_q=4" \
    "$F,solve_wg=256,nnz_batch=4,dims_q=4,dims_p=0"
tune 130 128 "${IMP[@]}" -- "$F,dims_q=2,dims_p=0,solve_wg=128,nnz_batch=8" \
    "$FS,solve_wg=256,nnz_batch=4,dims_q=4" "$FS,solve_wg=128,nnz_batch=4,dims_q=2" "$MMA"
tune 130 128 -- "$F,dims_q=2,dims_p=0,solve_wg=128,nnz_batch=8" \
    "$FS,solve_wg=128,nnz_batch=8,dims_q=2" "$FS,solve_wg=256,nnz_batch=4,dims_q=4" "$GEMM"
echo "done at $((SECONDS - T0)) s"
