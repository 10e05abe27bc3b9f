#!/usr/bin/env bash
# One H100 command (stop 38): all users' top-10 through the public API with the split fix and the
# 1M-catalog top-k tuning (issue 29), then the explicit and biased f = 128 tunings that stop 37's
# run cut short (issue 27), each bounded by --max-wall so a cut run still writes its best records.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session38a.sh
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
timeout 210 python3 -m clmf tune --preset netflix --factors 128 --device gpu --budget 15 \
    --max-wall 150 --sample full --start "$S1" --start "$S2" --start "$S3" --start "$S4" \
    --db "$OUT/tune-explicit.jsonl" --no-progress
echo "tune explicit: exit $?"
timeout 190 python3 -m clmf tune --preset netflix --factors 128 --device gpu --budget 15 \
    --max-wall 130 --sample full --biases --start "$S1" --start "$S2" --start "$S3" --start "$S4" \
    --db "$OUT/tune-biased.jsonl" --no-progress
echo "tune biased: exit $?"
