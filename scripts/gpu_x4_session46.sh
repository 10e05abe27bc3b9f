#!/usr/bin/env bash
# 4-GPU commands (stop 46), issue 28:
#   a: every command of each device's half-steps timed on the host (the enqueue calls) and on the
#      device (queued / submit / start / end): Netflix on 4 and 2 GPUs, 4 x Netflix on 4 GPUs
#      (benchmarks/multidev_trace.py --events), this tree — is a device's idle within its part
#      the host enqueuing late (the interpreter's or the driver's lock) or the device waiting?
#   b: host memory kinds per device context (benchmarks/host_pin_contexts.py), then the Netflix
#      and 4 x Netflix four-GPU traces with the exchange's page-locked arrays registered in every
#      device's context (CLMF_EXCHANGE_REGISTER=1) and not (0, as before), alternating.
#   c: a resident side's kernels all enqueued before its rows are read back, the flag reset by a
#      fill, the flag read into page-locked memory ("new", this tree) against the wheel of
#      1a363eb (.whl/base47, "base"): Netflix and 4 x Netflix on 1 and 4 GPUs new, 4 GPUs base,
#      4 GPUs new again (benchmarks/scaleout.py); the Netflix four-GPU trace with --events
#      (new); then Hugewiki x 0.25 on 4 GPUs new and base, time allowing.
#   d: as c with every kernel told its scalar arguments' types (pyopencl's untyped launches
#      took ~90 µs each holding the interpreter's lock); base also on 1 GPU.
#   e: as d with the flag's reset moved after its read (off the next half-step's first launch)
#      and each device's publishing thread started at its first use, with it noting the
#      flag read's end (no watcher thread); Hugewiki x 0.25 on 1 GPU too.
#   f: as e with the devices' launches of a resident side interleaved from the calling thread
#      (each device's thread then only waits and exchanges); new also on 2 GPUs.
#   g: clmf.dask against the in-process fit (benchmarks/dask_gpu_runs.py, one worker per GPU):
#      Netflix and 4 x Netflix with the workers' rows published through page-locked staging
#      (CLMF_DASK_PUBLISH=dma, the default) and with every row segment registered in each
#      worker's context instead (register: no staging, no host copies); then the time to the
#      first iteration with new workers (benchmarks/dask_setup.py), time allowing.
#   h: the final tree: Netflix and 4 x Netflix on 1, 2, 4 GPUs in process, then clmf.dask with
#      its defaults (rows registered in each worker's context on NVIDIA) on both.
#   i: clmf.dask's time to the first iteration with new workers, a partition's two sides
#      ordered in two threads ("new", this tree) against the wheel of d7aa449 (.whl/base48),
#      alternating (benchmarks/dask_setup.py --fresh --rounds 3 each).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x4_session46.sh a
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT" "$R/.data/layouts"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpus.csv" 2>/dev/null
START=$(date +%s)
left() { echo $(( ${1:-560} - ($(date +%s) - START) )); }
PY=${PY:-python3}          # CPU smoke test: PY=.venv/bin/python DEV=cpu FRAC=0.005 ... a
DEV=${DEV:-gpu}
FRAC=${FRAC:-1}
GPUS=${GPUS:-4}
trace() {  # trace NAME PRESET FRACTION GPUS ITERATIONS LINES [ARGS...]: multidev_trace.py
    local name=$1 preset=$2 frac=$3 gpus=$4 its=$5 lines=$6 t
    shift 6
    t=$(left 560)
    [ "$t" -gt 50 ] || { echo "skip trace $name: ${t}s left"; return; }
    (cd /tmp && timeout "$t" $PY "$R/benchmarks/multidev_trace.py" "$OUT/trace-$name" \
        --preset "$preset" --fraction "$frac" --gpus "$gpus" --factors 100 --iterations "$its" \
        --devices "$DEV" --cache "$R/.data/layouts" \
        "$@" 2>&1 | grep -v "CompilerWarning\|lambda: self" | tail -"$lines")
    echo "trace $name: at +$(( $(date +%s) - START ))s"
}
W=$OUT
scale() {  # scale TAG FRACTION GPUS SITE [PRESET [ARGS...]]: benchmarks/scaleout.py into $W/scaleout
    local tag=$1 frac=$2 gpus=$3 site=$4 preset=${5:-hugewiki} t
    shift 4; [ $# -gt 0 ] && shift
    t=$(left 570)
    [ "$t" -gt 40 ] || { echo "skip $tag $preset $frac $gpus: ${t}s left"; return; }
    (cd /tmp && PYTHONPATH=${site:+$site:}${PYTHONPATH:-} timeout "$t" $PY \
        "$R/benchmarks/scaleout.py" "$W/scaleout" --preset "$preset" --fraction "$frac" \
        --devices "$DEV" \
        --factors 100 --gpus "$gpus" --iterations 3 --budget 8 --cache "$R/.data/layouts" \
        --tag "$tag" "$@" 2>&1 | grep -v "CompilerWarning\|lambda: self" >> "$W/scaleout.log")
    echo "scaleout $tag $preset $frac $gpus: exit $? at +$(( $(date +%s) - START ))s"
}
base() {  # base WHEEL_DIR SITE: the base wheel installed into SITE
    $PY -m pip install -q --no-deps --target "$2" "$R"/.whl/"$1"/clmf-*.whl 2>&1 | tail -2
}
case "${1:-a}" in
  a)
    trace netflix-4 netflix "$FRAC" "$GPUS" 6 30 --events
    trace netflix-2 netflix "$FRAC" 2 6 24 --events
    trace netflix4x-4 netflix-4x "$FRAC" "$GPUS" 4 30 --events
    ;;
  b)
    (cd /tmp && timeout 120 $PY "$R/benchmarks/host_pin_contexts.py" "$OUT/pin" --devices "$DEV" \
        --megabytes 48 --chunks 12 2>&1 | grep -v "CompilerWarning\|lambda: self" | tail -60)
    for k in 1 2; do
      for r in 0 1; do
        CLMF_EXCHANGE_REGISTER=$r trace "netflix-r$r-$k" netflix "$FRAC" "$GPUS" 6 14 --events
      done
    done
    for r in 0 1; do
      CLMF_EXCHANGE_REGISTER=$r trace "netflix4x-r$r" netflix-4x "$FRAC" "$GPUS" 4 14 --events
    done
    tar czf "$OUT/b.tgz" -C "$OUT" pin $(cd "$OUT" && ls -d trace-*)
    rm -rf "$OUT"/trace-* "$OUT/pin"
    ;;
  h)
    for p in netflix netflix-4x; do scale final "$FRAC" 1,2,4 "" "$p"; done
    cat "$W/scaleout/summary.md"
    ;;&
  g|h)
    mkdir -p "$R/.data/parquet"
    for p in netflix netflix-4x; do
      for m in $([ "$1" = h ] && echo default || echo dma register); do
        t=$(left 560)
        [ "$t" -gt 60 ] || { echo "skip dask $p $m: ${t}s left"; continue; }
        (cd /tmp && CLMF_DASK_PUBLISH=${m/default/} timeout "$t" $PY "$R/benchmarks/dask_gpu_runs.py" \
            "$W/dask-$p-$m" --preset "$p" --fraction "$FRAC" --transport shm --iterations 4 \
            --budget 10 --devices "$DEV" --data-dir "$R/.data/parquet" 2>&1 \
            | grep -v "CompilerWarning\|lambda: self" > "$W/dask-$p-$m.log")
        echo "dask $p $m: at +$(( $(date +%s) - START ))s"; cat "$W/dask-$p-$m/summary.md"
      done
    done
    t=$(left 560)
    if [ "$1" = g ] && [ "$t" -gt 100 ]; then
      (cd /tmp && CLMF_DASK_PUBLISH=register timeout "$t" $PY "$R/benchmarks/dask_setup.py" \
          "$W/setup" --devices "$DEV" --preset netflix --fraction "$FRAC" --rounds 3 --fresh \
          --data-dir "$R/.data/parquet" --note register 2>&1 \
          | grep -v "CompilerWarning\|lambda: self" > "$W/setup.log")
      grep "^| [0-9]\|^| median" "$W/setup/README.md"
    fi
    tar czf "$OUT/$1.tgz" -C "$W" $(cd "$W" && ls -d dask-* setup* scaleout* 2>/dev/null)
    rm -rf "$W"/dask-* "$W"/setup* "$W"/scaleout*
    ;;
  i)
    base base48 /tmp/site-base
    mkdir -p "$R/.data/parquet"
    for tag in new-1 base-1 new-2; do
      t=$(left 250)
      [ "$t" -gt 50 ] || { echo "skip setup $tag: ${t}s left"; continue; }
      site=$([ "${tag%-*}" = base ] && echo /tmp/site-base || echo "")
      (cd /tmp && PYTHONPATH=${site:+$site:}${PYTHONPATH:-} timeout "$t" $PY \
          "$R/benchmarks/dask_setup.py" "$W/setup-$tag" --devices "$DEV" --preset netflix \
          --fraction "$FRAC" --rounds 3 --fresh --data-dir "$R/.data/parquet" --note "$tag" \
          2>&1 | grep -v "CompilerWarning\|lambda: self" > "$W/setup-$tag.log")
      echo "setup $tag: at +$(( $(date +%s) - START ))s"
      grep "^| [0-9]\|^| median" "$W/setup-$tag/README.md"
    done
    tar czf "$OUT/i.tgz" -C "$W" $(cd "$W" && ls -d setup-* 2>/dev/null)
    rm -rf "$W"/setup-*
    ;;
  c|d|e|f)
    base base47 /tmp/site-base
    for p in netflix netflix-4x; do
      scale new "$FRAC" $([ "$1" = f ] && echo 1,2,4 || echo 1,4) "" "$p"
      [ "$1" = d ] && scale base "$FRAC" 1 /tmp/site-base "$p"
      scale base "$FRAC" 4 /tmp/site-base "$p"
      scale new2 "$FRAC" 4 "" "$p"
    done
    cat "$W/scaleout/summary.md"
    trace netflix-new netflix "$FRAC" "$GPUS" 6 30 --events
    scale new "${HW:-0.25}" $(case $1 in e) echo 1,4;; f) echo 1,2,4;; *) echo 4;; esac) "" \
        hugewiki
    scale base "${HW:-0.25}" 4 /tmp/site-base hugewiki
    cat "$W/scaleout/summary.md" | tail -3
    tar czf "$OUT/$1.tgz" -C "$OUT" scaleout scaleout.log $(cd "$OUT" && ls -d trace-*)
    rm -rf "$OUT"/trace-* "$OUT/scaleout"
    ;;
esac
