#!/usr/bin/env bash
# One H100 command (stop 38, fourth): tunings that put the fused CG dims geometries measured by
# gpu_x1_session38c.sh (results/bench/side-profile-h100/dims-38/) into the H100's records, Netflix
# shape: implicit and explicit at f = 128 and 256, the side profile's winners as starts, sampled
# (--sample auto) and bounded (--max-wall). A run still sitting past its limit is stopped with
# SIGABRT so Python's fault handler prints where it was (stop 37/38's explicit f = 128 runs sat
# minutes after their last measurement).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session38d.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$(cd "$(dirname "$0")" && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
TUNE_DB=tune-38d.jsonl
. "$S/gpu_tune.sh"
tune 140 128 --feedback implicit --alpha 2 -- "$F,dims_q=2,dims_p=0,solve_wg=128,nnz_batch=8" \
    "$F,solve_wg=256,nnz_batch=8" "$MMA"
tune 130 128 -- "$F,dims_q=2,dims_p=0,solve_wg=128,nnz_batch=8" "$F,dims_q=2,solve_wg=256,nnz_batch=8"
tune 160 256 --feedback implicit --alpha 2 -- "$F,dims_q=2,solve_wg=256,nnz_batch=8" \
    "$F,dims_q=4,dims_p=0,solve_wg=256,nnz_batch=4" "$GEMM"
tune 140 256 -- "$F,dims_q=4,dims_p=0,solve_wg=256,nnz_batch=4" "$F,dims_q=2,solve_wg=256,nnz_batch=8"
