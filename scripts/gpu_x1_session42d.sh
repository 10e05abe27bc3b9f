#!/usr/bin/env bash
# One H100 command (stop 42, fourth): the dims form's gathers software-pipelined (`dims_pipe=1`:
# a chunk's rows loaded while the previous chunk's are summed), per side at f = 256 (implicit,
# explicit; f = 128 implicit at the end if time is left) against 42c's best shapes, ptxas' registers, then f = 256
# implicit re-tuned with them among the starts (on 42c's journal) and auto beside the `implicit`
# library. Everything but the tuning journal and the log is packed into $OUT/42d.tgz (the device
# returns at most 8 files).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session42d.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/x"
R=$(cd "$(dirname "$0")/.." && pwd)
S=$R/scripts
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/x/gpu.csv"
cd /tmp || exit 1     # import the installed clmf, not the checkout
TUNE_DB=tune-42d.jsonl
. "$S/gpu_tune.sh"
[ -f "$R/results/bench/gpu-implicit/run-42/42c/tune-42c.jsonl" ] && \
    cp "$R/results/bench/gpu-implicit/run-42/42c/tune-42c.jsonl" "$OUT/$TUNE_DB"
timeout 100 env CLMF_TEST_INSTALLED=1 python3 -m pytest -q -p no:cacheprovider --rootdir="$R" \
    --import-mode=importlib "$R/tests/test_variants.py" -k "shuffle or shared_weights or pipe" \
    2>&1 | tail -3 | tee "$OUT/x/tests.txt"
B="$F,dims_shfl=1"
V=("$B,dims_rsum=1,dims_q=4,solve_wg=256,nnz_batch=4" "$B,dims_rsum=1,dims_q=4,solve_wg=256,nnz_batch=2"
   "$B,dims_rsum=1,dims_pipe=1,dims_q=4,solve_wg=256,nnz_batch=2"
   "$B,dims_rsum=1,dims_pipe=1,dims_q=2,solve_wg=256,nnz_batch=4"
   "$B,dims_pipe=1,dims_q=4,solve_wg=256,nnz_batch=2"
   "$B,dims_wshfl=1,dims_pipe=1,dims_q=4,solve_wg=256,nnz_batch=2"
   "$F,dims_pipe=1,dims_q=4,dims_p=0,solve_wg=256,nnz_batch=2")
for fm in "256 implicit" "256 explicit"; do
    set -- $fm
    timeout 110 python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/x/sp-$1-$2" \
        --factors "$1" --modes "$2" --variants "$(IFS=';'; echo "${V[*]}")" \
        --iterations 3 --max-seconds 95 2>&1 | grep -v "CompilerWarning\|lambda: self\|prg.build" \
        | grep " ok \|best pair\|rror"
done
timeout 40 python3 "$S/archive/nv_regs.py" -f 256 --kernel s3_fcg --implicit --variant "${V[@]}" \
    2>&1 | grep -v "CompilerWarning\|prg.build" | sed 's/.*nnz_batch/nnz_batch/' | tee "$OUT/x/regs.txt"
tune 130 256 --feedback implicit --alpha 2 --budget 20 --max-wall 75 -- \
    "$B,dims_rsum=1,dims_pipe=1,solve_wg=256,nnz_batch=2,dims_q=4" \
    "$B,dims_rsum=1,dims_pipe=1,solve_wg=256,nnz_batch=4,dims_q=2" \
    "$B,dims_rsum=1,dims_pipe=1,solve_wg=128,nnz_batch=2,dims_q=4" \
    "$B,dims_rsum=1,solve_wg=256,nnz_batch=4,dims_q=4"
mkdir -p "$OUT/x/auto256"      # gpu_implicit.py's database starts from OUT's tuning.jsonl.gz
gzip -c "$OUT/$TUNE_DB" > "$OUT/x/auto256/tuning.jsonl.gz"
timeout 110 python3 "$S/gpu_implicit.py" --out "$OUT/x/auto256" \
    --phases auto,peers --factors 256 --modes explicit,implicit --peer-factors 256 \
    --iterations 6 --max-seconds 100 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$" | tail -8
if [ $((SECONDS - T0)) -lt 420 ]; then
    timeout 100 python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/x/sp-128-implicit" \
        --factors 128 --modes implicit --variants "$(IFS=';'; echo "${V[*]}")" --iterations 3 \
        --max-seconds $((500 - SECONDS + T0)) 2>&1 | grep " ok \|best pair\|rror"
fi
echo "done at $((SECONDS - T0)) s"
(cd "$OUT/x" && tar czf "$OUT/42d.tgz" . ) && rm -rf "$OUT/x"
