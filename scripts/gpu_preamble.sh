# Sourced first by the one-off GPU commands (scripts/gpu_x1_session43a.sh and later): $OUT made,
# $R the checkout, $S its scripts, the GPU's name, driver and memory in $OUT/gpu.csv, the working
# directory /tmp (the installed clmf is imported, not the checkout's), CLMF_COMMIT kept, Python's
# fault handler on, and `gpu_tests LIMIT ARGS...`: the checkout's tests run against the installed
# clmf, stopped after LIMIT seconds; `side_by_side JOURNAL`: issue 27's table (explicit and
# implicit auto fits at f = 64 / 128 / 256 beside the `implicit` library, 15 iterations) with the
# journal's tuning records in front of the shipped ones, in $OUT/final; `ab TAG BASE DB CELL...`:
# a base wheel against this tree, alternating; `tune` and `with_records`: a budgeted tuning run
# of the $DATA shape and auto's timing with its records in front (below).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
S=$R/scripts
export PYTHONFAULTHANDLER=1 CLMF_COMMIT=${CLMF_COMMIT:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
cd /tmp || exit 1
T0=${T0:-$SECONDS}
DEV=${DEV:-gpu} SCALE=${SCALE:-1.0} DATA=${DATA:-netflix}
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
ab() {  # ab TAG BASE DB CELL...: auto (side_profile.py, 5 iterations) of each CELL = MODE:F[,F..]
        # on the wheel in .whl/BASE ("base") and this tree ("new", with the tuning records DB in
        # front; empty: none), alternating twice, each run within AB_LIMIT seconds (default 60);
        # $OUT/TAG.tgz
    local tag=$1 base=$2 db=$3 round site sp d cell mode limit=${AB_LIMIT:-60}; shift 3
    python3 -m pip install -q --no-deps --target /tmp/site-base "$R"/.whl/"$base"/clmf-*.whl 2>&1 | tail -2
    for round in 1 2; do
        for site in base new; do
            sp=""; d=""
            if [ "$site" = base ]; then sp=/tmp/site-base; else d=$db; fi
            for cell in "$@"; do
                mode=${cell%%:*}
                echo "== $site round $round $cell"
                CLMF_TUNING_DB=$d PYTHONPATH=${sp:+$sp:}${PYTHONPATH:-} timeout "$limit" python3 \
                    "$R/benchmarks/side_profile.py" --device "$DEV" --scale "$SCALE" \
                    --out "$OUT/$tag-$site-$round-$mode" --factors "${cell#*:}" --modes "$mode" \
                    --iterations 5 --max-seconds $((limit - 5)) --variants "" 2>&1 | grep "auto\|clmf from"
            done
        done
    done
    (cd "$OUT" && tar czf "$tag.tgz" "$tag"-* && rm -rf "$tag"-*/)
}
tune() {  # tune LIMIT F MODE-ARGS... -- STARTS...: `clmf tune` of the $DATA shape into
          # $OUT/$TUNE_DB (--budget $BUDGET, default 20 s; --max-wall $TW, default 60; --sample
          # $SAMPLE, default auto), stopped after LIMIT s
          # (SIGABRT: the fault handler's traceback); its whole log in $OUT/logs
    local limit=$1 f=$2 rc log; shift 2
    local args=() starts=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
    shift
    for x in "$@"; do starts+=(--start "$x"); done
    mkdir -p "$OUT/logs"
    log=$OUT/logs/tune-f$f$(printf '%s' "${args[*]:-}" | tr -c 'a-z0-9' '_').log
    timeout -s ABRT "$limit" python3 -m clmf -v tune --preset "$DATA" --scale "$SCALE" \
        --factors "$f" --device "$DEV" --budget "${BUDGET:-20}" --max-wall "${TW:-60}" --sample "${SAMPLE:-auto}" \
        ${args[@]+"${args[@]}"} "${starts[@]}" --db "$OUT/$TUNE_DB" --no-progress > "$log" 2>&1
    rc=$?
    grep -v "CompilerWarning\|lambda: self" "$log" | grep "side by side\|sample check\|database\|^  " \
        | tail -6
    echo "tune f=$f ${args[*]:-}: exit $rc at $((SECONDS - T0)) s"
}
with_records() {  # with_records TAG FACTORS [MODES]: auto at each mode (default explicit and
                  # biased) and FACTORS with $OUT/$TUNE_DB's records in front (2 iterations),
                  # $OUT/TAG.tgz; then the records gzipped and the logs packed ($OUT/logs.tgz)
    local mode
    for mode in ${3:-explicit biased}; do
        CLMF_TUNING_DB=$OUT/$TUNE_DB timeout 60 python3 "$R/benchmarks/side_profile.py" \
            --device "$DEV" --scale "$SCALE" --out "$OUT/$1-$mode" --factors "$2" \
            --modes "$mode" --iterations 2 --max-seconds 55 --variants "" 2>&1 | grep " auto \["
    done
    (cd "$OUT" && tar czf "$1.tgz" "$1"-* && rm -rf "$1"-*/)
    gzip -f "$OUT/$TUNE_DB"
    [ -d "$OUT/logs" ] && (cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
}
