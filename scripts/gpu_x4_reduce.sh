#!/usr/bin/env bash
# One 4-GPU command (issue 28, the reduce mode pipelined and packed): Hugewiki x 0.25 (756M
# ratings, the items' partial systems reduced) at f = 100 on 1, 2, 4 GPUs, this tree ("new") and
# the build unpacked in .base/ ("base", the commit before the change; skipped when absent) side by
# side on the same machine, the layout generated once (.data/layouts). Results in $OUT/scaleout
# (summary.md, scaleout.jsonl: the split with reduce_sum / reduce_copies / reduce_wait) as they
# come. About 4-6 minutes on 4 x H100 (each tag at most LIMIT = 270 s).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x4_reduce.sh
# (carry .whl, holding the clmf wheel built from this tree, and .base). A tiny run on CPU devices
# first, e.g. (the checkout's .venv and .icd):
#   PATH=$PWD/.venv/bin:$PATH OCL_ICD_VENDORS=$PWD/.icd POCL_DEVICES="pthread pthread" \
#       DEVICES=cpu FRACTION=2e-5 FACTORS=8 GPUS=1,2 MODES=replicate,reduce OUT=/tmp/out \
#       bash scripts/gpu_x4_reduce.sh
set -u
OUT=${OUT:-/tmp/out}
DEVICES=${DEVICES:-gpu}
FRACTION=${FRACTION:-0.25}
FACTORS=${FACTORS:-100}
GPUS=${GPUS:-1,2,4}
LIMIT=${LIMIT:-270}        # seconds per tag (new: generating and caching the layout too)
MODES=${MODES:-}        # e.g. replicate,reduce (USERS,ITEMS); default: the partition rule's
mkdir -p "$OUT" .data/layouts
# "new" must be this tree's clmf (the wheel in .whl built from it), not an older one
python3 -c 'import clmf.parallel.reducer' ||
    { echo "the clmf imported is not this tree's (no clmf.parallel.reducer)"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpus.csv" 2>&1
so() {  # so TAG: one scale-out run of the preset, bounded
    local run=(python3 benchmarks/scaleout.py "$OUT/scaleout" --preset hugewiki
               --fraction "$FRACTION" --factors "$FACTORS" --gpus "$GPUS" --devices "$DEVICES"
               --iterations 3 --budget 15 --cache .data/layouts --tag "$1"
               ${MODES:+--modes "$MODES"})
    if [ "$1" = base ]; then
        timeout "$LIMIT" env PYTHONPATH="$PWD/.base:${PYTHONPATH:-}" "${run[@]}"
    else
        timeout "$LIMIT" "${run[@]}"
    fi
    echo "scaleout $1 hugewiki@$FRACTION: exit $?"
}
so new
if [ -d .base/clmf ]; then so base; else echo "no .base/: the base run skipped"; fi
cat "$OUT/scaleout/summary.md"
