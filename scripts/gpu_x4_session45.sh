#!/usr/bin/env bash
# 4-GPU commands (stop 45), issue 28:
#   a: the reduced side's long rows cut into pieces (splits in the reduce pipeline's partial
#      systems) — Hugewiki x 0.25 at f = 100 on 1, 2, 4 GPUs with this tree ("new"), then 2 and
#      4 GPUs with the base wheel (.whl/base45: main before the change) on the same layout;
#      then Hugewiki x 0.5 on 1, 2, 4 GPUs ("new"), time allowing.
#   b: clmf.dask's time to the first iteration with new workers (Netflix shape, one worker per
#      GPU, a new LocalCluster per fit) against the in-process fit, this tree ("new") and the base
#      wheel alternating, twice each (benchmarks/dask_setup.py --fresh --rounds 3: a warm-up
#      round, then two); then Netflix and 4 x Netflix on 1, 2, 4 GPUs (benchmarks/scaleout.py,
#      this tree). Everything under $W, packed into $OUT/b.tgz after each step (a command
#      returns at most 8 files).
#   c: the reduced side's batch of packed systems (the last owner's rows wait for the last
#      batch's copies): Hugewiki x 0.25 on 1 GPU, then 4 GPUs at 256 (the default), 64 and 32
#      MiB batches (scaleout.py --packed-batch-mb), this tree; then clmf.dask against the
#      in-process fit on the Netflix shape (s/it; benchmarks/dask_gpu_runs.py), this tree.
#   d: the exchanged sides' last launch tapered (few rows in flight when a device's kernels
#      end): Netflix and 4 x Netflix on 1 and 4 GPUs with this tree, 4 GPUs with the wheel of
#      08fd7d6 (.whl/base46: before the taper), alternating; then clmf.dask against the
#      in-process fit on the Netflix shape (this tree).
#   e: clmf.dask's time to the first iteration again, this tree (the scans out of the workers'
#      pools) against the wheel of 08fd7d6 (.whl/base46), alternating, twice each.
#   f: where a four-GPU iteration's time outside the kernels goes (benchmarks/multidev_trace.py:
#      per device and half-step), Netflix, 4 x Netflix and Hugewiki x 0.25, this tree.
#   g: the exchanged sides launched in 8 parts (each published as it ends): Netflix and
#      4 x Netflix on 1 and 4 GPUs with this tree, 4 GPUs with the wheel of 08fd7d6
#      (.whl/base46), then this tree again; the four-GPU trace of each with this tree.
#   h: the Netflix four-GPU trace as in f, then with Python's garbage collector off, then with
#      a 0.2 ms thread switch interval, then both (benchmarks/multidev_trace.py).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x4_session45.sh a|b|c|d|e|f|g|h
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT" "$R/.data/layouts"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpus.csv"
START=$(date +%s)
left() { echo $(( ${1:-560} - ($(date +%s) - START) )); }
W=${W:-$OUT}
PY=${PY:-python3}          # CPU smoke test: PY=.venv/bin/python DEV=Portable FRAC=0.01 ... b
DEV=${DEV:-gpu}
KIND=$([ "$DEV" = gpu ] && echo gpu || echo cpu)    # the device type of scaleout.py and others
FRAC=${FRAC:-1}
scale() {  # scale TAG FRACTION GPUS SITE [PRESET [ARGS...]]: benchmarks/scaleout.py into $W/scaleout
    local tag=$1 frac=$2 gpus=$3 site=$4 preset=${5:-hugewiki} t
    shift 4; [ $# -gt 0 ] && shift
    t=$(left 570)
    [ "$t" -gt 40 ] || { echo "skip $tag $preset $frac $gpus: ${t}s left"; return; }
    (cd /tmp && PYTHONPATH=${site:+$site:}${PYTHONPATH:-} timeout "$t" $PY \
        "$R/benchmarks/scaleout.py" "$W/scaleout" --preset "$preset" --fraction "$frac" \
        --devices "$KIND" \
        --factors 100 --gpus "$gpus" --iterations 3 --budget 8 --cache "$R/.data/layouts" \
        --tag "$tag" "$@" 2>&1 | grep -v "CompilerWarning\|lambda: self" >> "$W/scaleout.log")
    echo "scaleout $tag $preset $frac $gpus: exit $? at +$(( $(date +%s) - START ))s"
}
setup() {  # setup TAG SITE: benchmarks/dask_setup.py (new workers per fit) into $W/setup-TAG
    local tag=$1 site=$2 t
    t=$(left 560)
    [ "$t" -gt 70 ] || { echo "skip setup $tag: ${t}s left"; return; }
    (cd /tmp && PYTHONPATH=${site:+$site:}${PYTHONPATH:-} timeout "$(( t < 130 ? t : 130 ))" \
        $PY "$R/benchmarks/dask_setup.py" "$W/setup-$tag" --devices "$DEV" --preset netflix \
        --fraction "$FRAC" \
        --rounds 3 --fresh --data-dir "$R/.data/parquet" --note "$tag" 2>&1 \
        | grep -v "CompilerWarning\|lambda: self" >> "$W/setup.log")
    echo "setup $tag: exit $? at +$(( $(date +%s) - START ))s"
}
pack() { tar czf "$OUT/b.tgz" -C "$W" . ; }
base() {  # base WHEEL_DIR SITE: the base wheel installed into SITE
    $PY -m pip install -q --no-deps --target "$2" "$R"/.whl/"$1"/clmf-*.whl 2>&1 | tail -2
}
setups() {  # setups SITE: new and base (SITE) dask_setup.py runs alternating, twice each
    for k in 1 2; do
      setup "new-$k" ""; pack
      setup "base-$k" "$1"; pack
    done
}
pairs() {  # pairs SITE: Netflix and 4 x Netflix on 1 and 4 GPUs, new, base (SITE), new again
    for p in netflix netflix-4x; do
      scale new "$FRAC" 1,4 "" "$p"
      scale base "$FRAC" 4 "$1" "$p"
      scale new2 "$FRAC" 4 "" "$p"
    done
}
trace() {  # trace NAME PRESET FRACTION ITERATIONS LIMIT LINES [ARGS...]: multidev_trace.py
    local name=$1 preset=$2 frac=$3 its=$4 limit=$5 lines=$6
    shift 6
    (cd /tmp && timeout "$limit" $PY "$R/benchmarks/multidev_trace.py" "$OUT/trace-$name" \
        --preset "$preset" --fraction "$frac" --gpus 4 --factors 100 --iterations "$its" \
        --devices "$KIND" --cache "$R/.data/layouts" \
        "$@" 2>&1 | grep -v "CompilerWarning\|lambda: self" | tail -"$lines")
}
case "${1:-a}" in
  a)
    base base45 /tmp/site-base
    scale new 0.25 1,2,4 ""
    scale base 0.25 2,4 /tmp/site-base
    rm -rf "$R/.data/layouts/hugewiki@0.25"
    scale new 0.5 1,2,4 ""
    cat "$OUT/scaleout/summary.md"
    ;;
  b)
    W=/tmp/w45b; mkdir -p "$W" "$R/.data/parquet"
    base base45 /tmp/site-base
    setups /tmp/site-base
    scale new "$FRAC" 1,2,4 "" netflix; pack
    scale new "$FRAC" 1,2,4 "" netflix-4x; pack
    for d in "$W"/setup-*; do tail -n 4 "$d/README.md" 2>/dev/null | head -3; grep "^| median" "$d/README.md"; done
    cat "$W/scaleout/summary.md"
    ;;
  g)
    base base46 /tmp/site-base46
    pairs /tmp/site-base46
    cat "$W/scaleout/summary.md"
    TRACES="netflix:1 netflix-4x:1"
    ;;&
  h)
    for v in plain gc:--gc-off si:--switch-interval=0.0002 both:--gc-off:--switch-interval=0.0002; do
      name=${v%%:*}
      # shellcheck disable=SC2046 - the variant's options, split on purpose
      trace "$name" netflix "$FRAC" 8 100 14 $(echo "${v#"$name"}" | tr ':' ' ')
      echo "trace $name: at +$(( $(date +%s) - START ))s"
    done
    ;;
  f|g)
    for p in ${TRACES:-netflix:1 netflix-4x:1 hugewiki:"${HW:-0.25}"}; do
      t=$(left 560)
      [ "$t" -gt 60 ] || { echo "skip trace $p: ${t}s left"; continue; }
      trace "${p%%:*}" "${p%%:*}" "${p##*:}" 6 "$t" 16
      echo "trace $p: at +$(( $(date +%s) - START ))s"
    done
    ;;
  e)
    W=/tmp/w45e; mkdir -p "$W" "$R/.data/parquet"
    base base46 /tmp/site-base46
    setups /tmp/site-base46
    for d in "$W"/setup-*; do echo "$d"; grep "^| [0-9]\|^| median" "$d/README.md"; done
    ;;
  d)
    base base46 /tmp/site-base46
    pairs /tmp/site-base46
    DASK_ONLY=1
    ;;&
  c|d)
    if [ -z "${DASK_ONLY:-}" ]; then
    scale new "${HW:-0.25}" 1 ""
    for mb in 256 64 32; do scale "pb$mb" "${HW:-0.25}" 4 "" hugewiki --packed-batch-mb "$mb"; done
    fi
    t=$(left 580)
    if [ "$t" -gt 60 ]; then
      mkdir -p "$R/.data/parquet"
      (cd /tmp && timeout "$t" $PY "$R/benchmarks/dask_gpu_runs.py" "$W/dask" --preset netflix \
          --fraction "$FRAC" --transport shm --iterations 4 --budget 10 \
          --devices "$KIND" \
          --data-dir "$R/.data/parquet" 2>&1 | grep -v "CompilerWarning\|lambda: self" > "$W/dask.log")
      echo "dask: at +$(( $(date +%s) - START ))s"
    fi
    cat "$W/scaleout/summary.md"; cat "$W"/dask/summary.md 2>/dev/null
    ;;
esac
