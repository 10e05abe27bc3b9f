#!/usr/bin/env bash
# One H100 command (stop 41, fourth): f = 256 re-tuned with the dims form's warp-shuffle entry
# sums (`dims_shfl=1`) among the starts (implicit, then explicit), then auto with those records
# in front of the shipped ones (gpu_implicit.py's database) side by side with the `implicit` library.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session41d.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
cd /tmp || exit 1     # import the installed clmf, not the checkout
TUNE_DB=tune-41d.jsonl
. "$S/gpu_tune.sh"
IMP=(--feedback implicit --alpha 2)
tune 150 256 "${IMP[@]}" -- "$F,dims_shfl=1,solve_wg=256,nnz_batch=4,dims_q=4" \
    "$F,solve_wg=256,nnz_batch=4,dims_q=4,dims_p=0" "$F,dims_shfl=1,solve_wg=256,nnz_batch=2,dims_q=4" \
    "$F,dims_shfl=1,solve_wg=512,nnz_batch=4,dims_q=4"
tune 130 256 -- "$F,dims_shfl=1,solve_wg=256,nnz_batch=4,dims_q=4" \
    "$F,solve_wg=256,nnz_batch=4,dims_q=4,dims_p=0" "$F,dims_shfl=1,solve_wg=256,nnz_batch=2,dims_q=4"
mkdir -p "$OUT/auto256"        # gpu_implicit.py's database starts from OUT's tuning.jsonl.gz
gzip -c "$OUT/$TUNE_DB" > "$OUT/auto256/tuning.jsonl.gz"
timeout 260 python3 "$S/gpu_implicit.py" --out "$OUT/auto256" \
    --phases auto,peers --factors 256 --modes explicit,implicit --peer-factors 256 \
    --iterations 6 --max-seconds 230 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$" | tail -30
echo "done at $((SECONDS - T0)) s"
