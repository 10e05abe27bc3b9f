#!/usr/bin/env bash
# One H100 command (stop 41, second): the fused CG dimensions form with the entry sums as PTX
# butterflies (`solve_fcgdims.cl.j2` fd_shfl, clmf.engine.kernels.dims_shuffle): its tests
# against NumPy on the GPU, then per-side times with the shuffles off (CLMF_DIMS_SHUFFLE=0) and
# on, one after the other, at f = 64 / 100 / 256 (implicit, explicit; FACTORS=... others).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session41b.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$(cd "$(dirname "$0")" && pwd)
R=$(cd "$S/.." && pwd)
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
cd /tmp || exit 1     # import the installed clmf, not the checkout
CLMF_TEST_INSTALLED=1 timeout 150 python3 -m pytest -q -x -p no:cacheprovider --rootdir="$R" \
    --import-mode=importlib "$R/tests/test_variants.py" "$R/tests/test_rotate.py" \
    -k "shuffle or fused_dims or rotat" 2>&1 | grep -v "CompilerWarning\|prg.build" | tail -25 \
    > "$OUT/tests.txt"
echo "tests at $((SECONDS - T0)) s: $(tail -1 "$OUT/tests.txt")"
F="batch+vec4:solver=fusedcg,fused_dims=1"
V="$F,solve_wg=256,nnz_batch=4,dims_q=4,dims_p=0;$F,dims_q=2,solve_wg=128,nnz_batch=8"
for sh in 0 1; do
    CLMF_DIMS_SHUFFLE=$sh timeout 200 python3 "$R/benchmarks/side_profile.py" --device gpu \
        --out "$OUT/sp-shfl$sh" --factors "${FACTORS:-64,100,256}" --modes implicit,explicit --variants "$V" \
        --iterations 3 --max-seconds 170 2>&1 | grep -v "CompilerWarning\|lambda: self\|prg.build" \
        | grep -v "best pair" | tail -20
    echo "shuffle=$sh at $((SECONDS - T0)) s"
done
