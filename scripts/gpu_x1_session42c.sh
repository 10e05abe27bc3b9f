#!/usr/bin/env bash
# One H100 command (stop 42, third): the dims form's reduce-scattered entry sums (`dims_rsum=1`:
# 2·NB - 1 + log2(D/NB) shuffles a chunk instead of NB·log2(D), each lane forming one entry's
# weight) and the CG's scalar products as segment butterflies (every `dims_shfl` kernel now),
# per side against the butterflies and the shared weights at f = 128 / 256 in implicit and
# explicit fits, ptxas' registers, then f = 256 implicit re-tuned with them among the starts
# (on 42b's records) and auto beside the `implicit` library.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session42c.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=$(cd "$(dirname "$0")/.." && pwd)
S=$R/scripts
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
cd /tmp || exit 1     # import the installed clmf, not the checkout
TUNE_DB=tune-42c.jsonl
. "$S/gpu_tune.sh"
[ -f "$R/results/bench/gpu-implicit/run-42/42b/tune-42b.jsonl" ] && \
    cp "$R/results/bench/gpu-implicit/run-42/42b/tune-42b.jsonl" "$OUT/$TUNE_DB"
timeout 120 env CLMF_TEST_INSTALLED=1 python3 -m pytest -q -p no:cacheprovider --rootdir="$R" \
    --import-mode=importlib "$R/tests/test_variants.py" -k "shuffle or shared_weights" 2>&1 \
    | tail -3 | tee "$OUT/tests.txt"
B="$F,dims_shfl=1"
V=("$B,dims_q=4,solve_wg=256,nnz_batch=4" "$B,dims_wshfl=1,dims_q=4,solve_wg=256,nnz_batch=4"
   "$B,dims_rsum=1,dims_q=4,solve_wg=256,nnz_batch=4" "$B,dims_rsum=1,dims_q=2,solve_wg=256,nnz_batch=8"
   "$B,dims_rsum=1,dims_q=2,solve_wg=256,nnz_batch=4" "$B,dims_rsum=1,dims_q=4,solve_wg=256,nnz_batch=2")
timeout 240 python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/sp" \
    --factors 256,128 --modes implicit,explicit --variants "$(IFS=';'; echo "${V[*]}")" \
    --iterations 3 --max-seconds 220 2>&1 | grep -v "CompilerWarning\|lambda: self\|prg.build" \
    | grep -v "best pair" | tail -30
timeout 40 python3 "$S/archive/nv_regs.py" -f 256 --kernel s3_fcg --implicit --variant "${V[@]}" \
    2>&1 | grep -v "CompilerWarning\|prg.build" | tee "$OUT/regs.txt"
tune 150 256 --feedback implicit --alpha 2 --budget 20 --max-wall 90 -- \
    "$B,dims_rsum=1,solve_wg=256,nnz_batch=4,dims_q=4" "$B,dims_rsum=1,solve_wg=256,nnz_batch=8,dims_q=2" \
    "$B,dims_rsum=1,solve_wg=128,nnz_batch=4,dims_q=4" "$B,dims_wshfl=1,solve_wg=256,nnz_batch=4,dims_q=4"
mkdir -p "$OUT/auto256"        # gpu_implicit.py's database starts from OUT's tuning.jsonl.gz
gzip -c "$OUT/$TUNE_DB" > "$OUT/auto256/tuning.jsonl.gz"
timeout 120 python3 "$S/gpu_implicit.py" --out "$OUT/auto256" \
    --phases auto,peers --factors 256 --modes explicit,implicit --peer-factors 256 \
    --iterations 6 --max-seconds 110 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$" | tail -30
echo "done at $((SECONDS - T0)) s"
