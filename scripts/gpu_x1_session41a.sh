#!/usr/bin/env bash
# One H100 command (stop 41, first): the mma variant's register write-back (`direct=1`, the
# packed triangle kept out of local memory) on the tensor cores: its tests against NumPy at every
# f up to 256, then per-side times at f = 256 (implicit, explicit) against the dims-form CG and
# gemm.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session41a.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$(cd "$(dirname "$0")" && pwd)
R=$(cd "$S/.." && pwd)
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
(cd "$R" && timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_mma.py -k direct \
    2>&1 | grep -v "CompilerWarning\|prg.build" | tail -25) > "$OUT/tests.txt" 2>&1
echo "tests at $((SECONDS - T0)) s: $(tail -1 "$OUT/tests.txt")"
cd /tmp || exit 1     # import the installed clmf, not the checkout
D="batch+vec4+mma:solver=cg,direct=1"
V="$D,tx=16,nnz_batch=16;$D,tx=24,nnz_batch=16;$D,tx=32,nnz_batch=16;$D,tx=12,nnz_batch=32"
V="$V;$D,tx=16,nnz_batch=32;$D,tx=24,nnz_batch=8;$D,tx=16,nnz_batch=16,precision=tf32"
V="$V;batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=256,nnz_batch=4,dims_q=4,dims_p=0"
V="$V;batch+vec4+gemm:bx=64,nnz_batch=8,solver=cg"
timeout 300 python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/sp" --factors 256 \
    --modes implicit,explicit --variants "$V" --iterations 2 --max-seconds 230 2>&1 \
    | grep -v "CompilerWarning\|lambda: self\|prg.build" | tail -40
echo "side profile at $((SECONDS - T0)) s"
