#!/usr/bin/env bash
# One H100 command (stop 41, sixth): ptxas' registers of the dims-form CG kernel with and without
# the warp-shuffle entry sums, implicit and explicit, at f = 128 / 256 (41c: the shuffles gain in
# explicit fits everywhere and lose 13-31 % in implicit ones with 8 entries per group).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session41f.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
F="batch+vec4:solver=fusedcg,fused_dims=1"
V=("$F,dims_q=4,solve_wg=256,nnz_batch=4" "$F,dims_shfl=1,dims_q=4,solve_wg=256,nnz_batch=4"
   "$F,dims_q=2,solve_wg=256,nnz_batch=8" "$F,dims_shfl=1,dims_q=2,solve_wg=256,nnz_batch=8"
   "$F,dims_q=2,solve_wg=128,nnz_batch=8" "$F,dims_shfl=1,dims_q=2,solve_wg=128,nnz_batch=8")
for mode in explicit implicit; do
    flag=(); [ $mode = implicit ] && flag=(--implicit)
    echo "== $mode"
    timeout 200 python3 "$R/scripts/archive/nv_regs.py" -f 128 256 --kernel s3_fcg "${flag[@]}" --variant "${V[@]}" \
        2>&1 | grep -v "CompilerWarning\|prg.build"
done | tee "$OUT/regs.txt"
