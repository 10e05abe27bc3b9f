#!/usr/bin/env bash
# One H100 command (stop 38, third): per-side times of the fused CG dimensions form's new
# geometries (dims_q slices per work-item, dims_p work-items per entry's sum; issue 27) at
# f = 128 and 256, implicit and explicit, beside the old shapes, on the Netflix shape.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session38c.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
F="batch+vec4:solver=fusedcg,fused_dims=1"
V="$F,solve_wg=256,nnz_batch=8;$F,solve_wg=128,nnz_batch=8;$F,dims_p=0,solve_wg=256,nnz_batch=8"
V="$V;$F,dims_q=2,solve_wg=256,nnz_batch=8;$F,dims_q=2,dims_p=0,solve_wg=256,nnz_batch=8"
V="$V;$F,dims_q=2,dims_p=0,solve_wg=256,nnz_batch=4;$F,dims_q=4,dims_p=0,solve_wg=256,nnz_batch=4"
V="$V;$F,dims_q=2,dims_p=0,solve_wg=128,nnz_batch=8;$F,dims_q=4,dims_p=0,solve_wg=128,nnz_batch=4"
V="$V;$F,dims_q=2,dims_p=0,solve_wg=512,nnz_batch=4;$F,dims_q=4,dims_p=0,solve_wg=64,nnz_batch=4"
timeout 560 python3 benchmarks/side_profile.py --device gpu --out "$OUT/sp" --factors 128,256 \
    --modes implicit,explicit --max-seconds 520 --variants "$V"
echo "side_profile: exit $?"
