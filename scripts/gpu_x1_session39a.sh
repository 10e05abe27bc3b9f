#!/usr/bin/env bash
# One H100 command (stop 39, first): implicit-feedback tunings after the Gram kernel's rewrite
# (8c4ff32: G = YᵀY by its own tiled kernels, no longer the side's S1 variant: the dims form's
# items half-step spent 0.179 s of 0.40 s at f = 256 in it). The H100's implicit records were
# measured with the old Gram, which penalised the fused CG forms on the items side; these runs
# re-measure f = 256, 128, 64 (Netflix shape, sampled, bounded), then biased f = 256 with the
# dims starts if time is left. A run still sitting past its limit gets SIGABRT (stack dump).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session39a.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$(cd "$(dirname "$0")" && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
TUNE_DB=tune-39a.jsonl
. "$S/gpu_tune.sh"
IMP=(--feedback implicit --alpha 2)
tune 160 256 "${IMP[@]}" -- "$F,dims_q=2,solve_wg=256,nnz_batch=8" \
    "$F,dims_q=4,dims_p=0,solve_wg=256,nnz_batch=4" "$GEMM"
tune 140 128 "${IMP[@]}" -- "$F,dims_q=2,solve_wg=256,nnz_batch=8" \
    "$F,solve_wg=256,nnz_batch=8" "$MMA"
tune 130 64 "${IMP[@]}" -- "$F,solve_wg=128,nnz_batch=8" "$F,dims_q=2,solve_wg=128,nnz_batch=8" \
    "$MMA"
left=$((575 - (SECONDS - T0)))
if [ "$left" -gt 100 ]; then
    tune "$left" 256 --biases -- "$F,dims_q=2,solve_wg=256,nnz_batch=8" \
        "$F,dims_q=4,dims_p=0,solve_wg=256,nnz_batch=4"
fi
