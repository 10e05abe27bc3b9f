#!/usr/bin/env bash
# One H100 command (stop 38, second): the 1M x 1M recommend with whole-wave batches (issue 29),
# then the explicit f = 128 tuning with room for its finalists and showdown (issue 27; stop 38's
# first command cut it at 210 s, after the search's 150 s).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session38b.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 170 python3 benchmarks/recommend_gpu.py --out "$OUT/recommend-1gpu" --device gpu \
    --factors 100 --skip-implicit --check
echo "recommend: exit $?"
cd /tmp || exit 1     # import the installed clmf, not the checkout
S1="batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=256,nnz_batch=4"
S2="batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=256,nnz_batch=8"
S3="batch+vec4+mma:tx=4,ks=2,solver=cg,precision=tf32"
S4="batch+vec4+gemm:bx=32,nnz_batch=16,solver=cg"
timeout 400 python3 -m clmf tune --preset netflix --factors 128 --device gpu --budget 15 \
    --max-wall 120 --sample full --start "$S1" --start "$S2" --start "$S4" --start "$S3" \
    --db "$OUT/tune-explicit.jsonl" --no-progress
echo "tune explicit: exit $?"
