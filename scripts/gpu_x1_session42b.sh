#!/usr/bin/env bash
# One H100 command (stop 42, second): f = 256 implicit re-tuned with the dims form's shared
# weights (`dims_wshfl=1`, 42a: users 0.2357 -> 0.2284 s, items 0.2143 -> 0.1926) among the
# starts, a longer search (fresh journal), then auto with those records in front of the shipped
# ones (gpu_implicit.py's database) side by side with the `implicit` library at f = 256.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session42b.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
cd /tmp || exit 1     # import the installed clmf, not the checkout
TUNE_DB=tune-42b.jsonl
. "$S/gpu_tune.sh"
W="$F,dims_shfl=1,dims_wshfl=1"
tune 290 256 --feedback implicit --alpha 2 --budget 30 --max-wall 200 -- \
    "$W,solve_wg=256,nnz_batch=4,dims_q=4" "$W,solve_wg=256,nnz_batch=8,dims_q=2" \
    "$W,solve_wg=512,nnz_batch=4,dims_q=4" "$W,solve_wg=256,nnz_batch=2,dims_q=4" \
    "$W,solve_wg=128,nnz_batch=4,dims_q=4" "$F,dims_shfl=1,solve_wg=256,nnz_batch=4,dims_q=4"
mkdir -p "$OUT/auto256"        # gpu_implicit.py's database starts from OUT's tuning.jsonl.gz
gzip -c "$OUT/$TUNE_DB" > "$OUT/auto256/tuning.jsonl.gz"
timeout 250 python3 "$S/gpu_implicit.py" --out "$OUT/auto256" \
    --phases auto,peers --factors 256 --modes explicit,implicit --peer-factors 256 \
    --iterations 6 --max-seconds 230 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$" | tail -30
echo "done at $((SECONDS - T0)) s"
