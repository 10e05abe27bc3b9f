# Sourced first by the one-off GPU commands (scripts/gpu_x1_session43a.sh and later): $OUT made,
# $R the checkout, $S its scripts, the GPU's name, driver and memory in $OUT/gpu.csv, the working
# directory /tmp (the installed clmf is imported, not the checkout's), CLMF_COMMIT kept, Python's
# fault handler on, and `gpu_tests LIMIT ARGS...`: the checkout's tests run against the installed
# clmf, stopped after LIMIT seconds; `side_by_side JOURNAL`: issue 27's table (explicit and
# implicit auto fits at f = 64 / 128 / 256 beside the `implicit` library, 15 iterations) with the
# journal's tuning records in front of the shipped ones, in $OUT/final.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
S=$R/scripts
export PYTHONFAULTHANDLER=1 CLMF_COMMIT=${CLMF_COMMIT:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
cd /tmp || exit 1
gpu_tests() {  # gpu_tests LIMIT PYTEST-ARGS...: quiet, no cache, the checkout's tests
    local limit=$1; shift
    CLMF_TEST_INSTALLED=1 timeout "$limit" python3 -m pytest -q -p no:cacheprovider --rootdir="$R" \
        --import-mode=importlib "$@" 2>&1 | grep -v "CompilerWarning\|lambda: self" | tail -4
}
side_by_side() {  # side_by_side JOURNAL: gpu_implicit.py's auto and peers phases
    mkdir -p "$OUT/final"     # gpu_implicit.py's database starts from OUT's tuning.jsonl.gz
    gzip -c "$1" > "$OUT/final/tuning.jsonl.gz"
    timeout 200 python3 "$S/gpu_implicit.py" --out "$OUT/final" --phases auto,peers \
        --factors 64,128,256 --modes explicit,implicit --peer-factors 64,128,256 --iterations 15 \
        --max-seconds 190 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
    rm -f "$OUT/final/tuning.jsonl.gz"
}
