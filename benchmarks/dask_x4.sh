#!/usr/bin/env bash
# clmf.dask against the in-process fit on one host, one Dask worker per GPU (issue 28, branch
# dask, dask2): this checkout's clmf ("after") and the same with the five Dask modules of
# the branch's base commit ("before", from git when the history is there, else skipped) side
# by side, alternating (the base's files from git, or from BASE_DIR, default .base-dask/, where
# the copy has no history: `git show BASE:FILE` of each into it, carried), each step's results
# written under $OUT/after and $OUT/before as it ends; the whole run stays under 9 minutes
# (later steps get what time is left, 4 x Netflix last):
#   1-2. Netflix shape, f = 100: in-process s/it and Dask s/it (workers' loop through shared
#        memory, each iteration's parts per worker: compute, exchange, take, publish_copy and
#        the tails after its kernels: publish, peers, fetch, upload; each worker's host copy
#        rates out of and into page-locked memory), time to the first iteration
#        (benchmarks/dask_gpu_runs.py); then the Dask fit again as "after-dev" (own rows
#        published by a second device -> host copy, CLMF_DASK_PUBLISH=device) and
#        "after-nomirror" (the peers' rows uploaded from their segments, CLMF_DASK_PIN_LIMIT=0)
#        and "after-devnm" (both: no host copy of rows by the workers at all);
#        with "netflix-1t" in PARTS also "after-1t" (CLMF_DASK_COPY_THREADS=1: no copy threads)
#   3-4. Netflix: time to the first iteration with a new cluster per fit, in-process alongside,
#        the set-up's stages per worker and the last fit's tasks (benchmarks/dask_setup.py
#        --fresh); with "setup-1s" in PARTS then "after-1s": the same with
#        CLMF_DASK_SPLIT_THREADS=1 (each worker's splits in turn, not several at once)
#   5-6. 4 x Netflix as 1-2 (the "before" Dask fit only, if time is left); with
#        "netflix-4x-dma" in PARTS then "after-dma": the Dask fit again with each worker's rows
#        published by its device into a buffer wrapping its segment (CLMF_DASK_PUBLISH=dma);
#        "netflix-dma": 1-2 and that Dask fit on the Netflix shape (no other variants)
#
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash benchmarks/dask_x4.sh
#   (4 x Netflix whole, in a second command: PARTS=netflix-4x OUT=$OUT bash benchmarks/dask_x4.sh)
#
# CPU smoke test (PoCL + Intel, tiny; a few minutes on 2 cores):
#   POCL_DEVICES="pthread pthread" DEVICES=cpu FRACTION=0.002 FACTORS=8 PY=.venv/bin/python \
#       OUT=/tmp/dask-x4 bash benchmarks/dask_x4.sh
set -u
OUT=${OUT:-/tmp/out}
DEVICES=${DEVICES:-gpu}
FRACTION=${FRACTION:-1}
FACTORS=${FACTORS:-100}
PY=${PY:-python3}
BASE=${BASE:-69dcf02}          # main when the branch (dask2) started
BUDGET=${BUDGET:-535}          # seconds for the whole run
PARTS=${PARTS:-netflix setup netflix-4x}   # which steps (a second command: PARTS=netflix-4x)
ROUNDS=${ROUNDS:-2}            # dask_setup.py's rounds (the first a warm-up)
SETUP_S=${SETUP_S:-90}         # seconds for each dask_setup.py step
START=$(date +%s)
VARIANTS="after-dev after-nomirror after-devnm after-1t after-1s after-dma"
for name in after before $VARIANTS; do mkdir -p "$OUT/$name"; done
mkdir -p .data/parquet
export PYTHONUNBUFFERED=1
PKG=$(mktemp -d)
trap 'rm -rf "$PKG"' EXIT

pkg() {
  # pkg NAME [REV]: clmf laid out as its wheel installs it (kernels, tuner, shipped tunings)
  # from the working tree in $PKG/NAME; with REV, the Dask modules this branch changed taken
  # from git at REV (so "before" differs from "after" by this branch's changes alone, whatever
  # else the tree holds by then)
  local dst=$PKG/$1 f
  mkdir -p "$dst"
  cp -r clmf "$dst/"
  cp -r cl_kernels "$dst/clmf/cl_kernels"
  cp -r tuner "$dst/clmf/autotune"
  rm -rf "$dst/clmf/tuning/shipped" && cp -r results/tuning/shipped "$dst/clmf/tuning/shipped"
  if [ $# -gt 1 ]; then
    for f in $DASK_FILES; do
      git show "$2:$f" > "$dst/$f" || return 1
    done
  fi
  find "$dst" -name __pycache__ -prune -exec rm -rf {} +
}

left() { echo $(( BUDGET - ($(date +%s) - START) )); }

step() {
  # step NAME SECONDS LOG ARGS...: run one benchmark with package NAME ("after-1t": after,
  # each worker copying rows with one thread; "after-1s": after, each worker's splits in
  # turn), within its share of the time left
  local name=$1 want=$2 log=$3 t threads= splits=auto publish=copy pinlimit=
  shift 3
  t=$(left)
  [ "$t" -gt "$want" ] && t=$want
  if [ "$t" -lt 30 ]; then echo "[$name] skipped: ${t}s left" | tee -a "$log"; return; fi
  echo "[$name] $(date -u +%H:%M:%S) timeout ${t}s: $*" | tee -a "$log"
  [ "$name" = after-1t ] && threads=1
  [ "$name" = after-1s ] && splits=1
  case $name in after-dev|after-devnm) publish=device ;; after-dma) publish=dma ;; esac
  case $name in after-nomirror|after-devnm) pinlimit=0 ;; esac
  CLMF_DASK_COPY_THREADS=$threads CLMF_DASK_SPLIT_THREADS=$splits CLMF_DASK_PUBLISH=$publish \
    CLMF_DASK_PIN_LIMIT=$pinlimit PYTHONPATH=$PKG/${name%%-*}${PYTHONPATH:+:$PYTHONPATH} \
    timeout "$t" "$PY" "$@" >> "$log" 2>&1
  echo "[$name] exit $? at +$(( $(date +%s) - START ))s" | tee -a "$log"
}

DASK_FILES="clmf/dask.py clmf/parallel/dask_backend.py clmf/parallel/dask_tasks.py
            clmf/parallel/dask_prepare.py clmf/parallel/shared_blocks.py"
pkg after
if git cat-file -e "$BASE^{commit}" 2>/dev/null && pkg before "$BASE"; then
  BEFORE=1
elif [ -d "${BASE_DIR:-.base-dask}" ]; then   # the base's Dask files carried in (no git there)
  pkg before && for f in $DASK_FILES; do cp "${BASE_DIR:-.base-dask}/$f" "$PKG/before/$f"; done
  BEFORE=1
else
  BEFORE=0
  echo "no git history for $BASE here: the 'before' runs are skipped" | tee "$OUT/before/SKIPPED"
fi
echo "after: $(git rev-parse --short HEAD 2>/dev/null || echo '?') (+ working tree); before: the" \
  "same with $DASK_FILES of $BASE" > "$OUT/packages.txt"

COMMON=(--factors "$FACTORS" --fraction "$FRACTION" --devices "$DEVICES" --data-dir .data/parquet)
run() {   # run NAME SECONDS PRESET [extra args]: dask_gpu_runs.py
  local name=$1 want=$2 preset=$3
  shift 3
  step "$name" "$want" "$OUT/$name/log.txt" benchmarks/dask_gpu_runs.py "$OUT/$name/runs" \
    --preset "$preset" --transport shm --iterations 8 --budget 10 "${COMMON[@]}" "$@"
}
setup() {   # setup NAME SECONDS: dask_setup.py --fresh
  local name=$1 want=$2
  step "$name" "$want" "$OUT/$name/log.txt" benchmarks/dask_setup.py "$OUT/$name/setup" \
    --devices "$DEVICES" --preset netflix --fraction "$FRACTION" --factors "$FACTORS" \
    --rounds "$ROUNDS" --fresh --data-dir .data/parquet
}

if [[ " $PARTS " == *" netflix "* ]]; then
  run after 80 netflix
  [ $BEFORE = 1 ] && run before 80 netflix
  run after-dev 60 netflix --skip-inprocess
  run after-nomirror 60 netflix --skip-inprocess
  run after-devnm 60 netflix --skip-inprocess
fi
if [[ " $PARTS " == *" netflix-dma "* ]]; then
  run after 80 netflix
  run after-dma 60 netflix --skip-inprocess
fi
if [[ " $PARTS " == *" netflix-1t "* ]]; then
  run after-1t 60 netflix --skip-inprocess
fi
if [[ " $PARTS " == *" setup "* ]]; then
  setup after "$SETUP_S"
  [ $BEFORE = 1 ] && setup before "$SETUP_S"
fi
if [[ " $PARTS " == *" setup-1s "* ]]; then
  setup after-1s "$SETUP_S"
fi
if [[ " $PARTS " == *" netflix-4x "* ]]; then
  run after 240 netflix-4x
  [ $BEFORE = 1 ] && run before 200 netflix-4x --skip-inprocess
fi
if [[ " $PARTS " == *" netflix-4x-dma "* ]]; then
  run after-dma 200 netflix-4x --skip-inprocess
fi

for name in after before $VARIANTS; do
  for f in "$OUT/$name/runs/summary.md" "$OUT/$name/setup/README.md"; do
    [ -f "$f" ] && { echo "== $name: $f"; head -12 "$f"; }
  done
  grep -h "loop parts\|board:" "$OUT/$name/log.txt" 2>/dev/null
done | tee "$OUT/summary.txt"
