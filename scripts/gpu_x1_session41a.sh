#!/usr/bin/env bash
# One H100 command (stop 41, first): the mma variant's register write-back (`direct=N`: the
# packed triangle kept out of local memory, a row's blocks over N work-groups) on the tensor
# cores: its tests against NumPy at every f up to 256, then per-side times at f = 256 (implicit,
# explicit) against the dims-form CG and gemm, and at f = 100 (explicit) against the packed form.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session41a.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$(cd "$(dirname "$0")" && pwd)
R=$(cd "$S/.." && pwd)
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
cd /tmp || exit 1     # import the installed clmf, not the checkout
CLMF_TEST_INSTALLED=1 timeout 200 python3 -m pytest -q -x -p no:cacheprovider --rootdir="$R" \
    --import-mode=importlib "$R/tests/test_mma.py" -k direct 2>&1 \
    | grep -v "CompilerWarning\|prg.build" | tail -25 > "$OUT/tests.txt"
echo "tests at $((SECONDS - T0)) s: $(tail -1 "$OUT/tests.txt")"
D="batch+vec4+mma:solver=cg"
V="$D,tx=8,direct=2,nnz_batch=16;$D,tx=8,direct=4,nnz_batch=16;$D,tx=4,direct=8,nnz_batch=16"
V="$V;$D,tx=4,direct=4,nnz_batch=16;$D,tx=8,direct=4,nnz_batch=32;$D,tx=8,direct=2,nnz_batch=32"
V="$V;$D,tx=8,direct=4,nnz_batch=16,precision=tf32"
V="$V;batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=256,nnz_batch=4,dims_q=4,dims_p=0"
V="$V;batch+vec4+gemm:bx=64,nnz_batch=8,solver=cg"
timeout 300 python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/sp256" --factors 256 \
    --modes implicit,explicit --variants "$V" --iterations 2 --max-seconds 220 2>&1 \
    | grep -v "CompilerWarning\|lambda: self\|prg.build" | tail -40
echo "side profile f=256 at $((SECONDS - T0)) s"
V="$D,tx=4,ks=2;$D,tx=7,direct=1,nnz_batch=32;$D,tx=4,direct=2,nnz_batch=16"
V="$V;$D,tx=4,direct=4,nnz_batch=16;$D,tx=2,direct=4,nnz_batch=32;batch+vec4+syrk:bx=8,ks=2,solver=cg"
timeout 200 python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/sp100" --factors 100 \
    --modes explicit --variants "$V" --iterations 2 --max-seconds 150 2>&1 \
    | grep -v "CompilerWarning\|lambda: self\|prg.build" | tail -20
echo "done at $((SECONDS - T0)) s"
