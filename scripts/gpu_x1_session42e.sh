#!/usr/bin/env bash
# One H100 command (stop 42, fifth): the Gram rotation's host eigendecomposition on one BLAS
# thread (threadpoolctl) against the default threads, the implicit f = 256 users side's stages
# (eigh, rotate, s3) with the shipped records (42b-42d appended and distilled), then issue 27's
# side-by-side table: auto explicit and implicit at f = 64 / 128 / 256 and the `implicit`
# library at the same f, in one command (as 40h).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session42e.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=$(cd "$(dirname "$0")/.." && pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
cd /tmp || exit 1     # import the installed clmf, not the checkout
python3 - <<'PY' 2>&1 | tee "$OUT/eigh.txt"
import time, numpy as np
from threadpoolctl import threadpool_limits, threadpool_info
from clmf.engine.rotate import eigh
A = np.random.default_rng(0).random((256, 256), dtype=np.float32); G = A @ A.T
def t(fn, n=20):
    fn(); t0 = time.perf_counter(); [fn() for _ in range(n)]; return (time.perf_counter() - t0) / n * 1e3
print("blas", [(i["internal_api"], i["num_threads"]) for i in threadpool_info()])
print(f"eigh 256 default threads {t(lambda: np.linalg.eigh(G.astype(np.float64))):.2f} ms, "
      f"one thread (clmf.engine.rotate.eigh) {t(lambda: eigh(G)):.2f} ms")
PY
B="batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_rsum=1"
timeout 80 python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/sp" --factors 256 \
    --modes implicit --variants "$B,dims_pipe=1,dims_q=4,solve_wg=256,nnz_batch=2" --iterations 3 \
    --max-seconds 70 2>&1 | grep " ok \|best pair\|rror"
grep "implicit | 256" "$OUT/sp/side_profile.md" | cut -c1-400; rm -f "$OUT"/sp/*.json*
timeout 450 python3 "$R/scripts/gpu_implicit.py" --out "$OUT/final" --phases auto,peers \
    --factors 64,128,256 --modes explicit,implicit --peer-factors 64,128,256 --iterations 6 \
    --max-seconds 420 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
rm -f "$OUT/final/tuning.jsonl.gz"
