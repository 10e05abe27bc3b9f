#!/usr/bin/env bash
# One H100 command (stop 44, ninth): the selection model's leave-one-out picks that no run of
# their cell had timed ("unmeasured" in results/tuning/reports/offline-loo.md after loo8), timed
# in short tuning runs of those Netflix-shape cells with the picks among the starts (explicit
# f = 128 / 256, implicit f = 128 / 64), into tune-44i.jsonl.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session44i.sh
. "$(dirname "$0")/gpu_preamble.sh"
TUNE_DB=tune-44i.jsonl
. "$S/gpu_tune.sh"
B="batch+vec4:solver=fusedcg,fused_dims=1"
tune 90 128 --budget 10 --max-wall 40 -- \
    "$B,nnz_batch=8,solve_wg=128,dims_shfl=1,dims_rsum=1,dims_q=2" \
    "$B,nnz_batch=4,solve_wg=256,dims_shfl=1,dims_rsum=1,dims_q=4"
tune 90 256 --budget 10 --max-wall 40 -- "$B,nnz_batch=4,solve_wg=256,dims_shfl=1,dims_rsum=1,dims_q=4"
tune 90 128 --feedback implicit --alpha 2 --budget 10 --max-wall 40 -- \
    "$B,tx=1,ty=1,nnz_batch=8,solve_wg=128,dims_shfl=1,dims_q=2" "$B,nnz_batch=8,solve_wg=256,dims_q=2"
tune 80 64 --feedback implicit --alpha 2 --budget 10 --max-wall 40 -- \
    "$B,tx=1,ty=1,nnz_batch=8,solve_wg=128,dims_shfl=1,dims_q=2"
gzip -f "$OUT/$TUNE_DB"
echo "done at $((SECONDS - T0)) s"
