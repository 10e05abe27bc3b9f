#!/usr/bin/env bash
# One 4-GPU command (stop 38, second): Hugewiki x 0.25 at f = 100 on 1, 2, 4 GPUs with the
# pipelined reduce's batches of packed systems at 64 MiB (merged default) and 256 MiB side by
# side (the first 4-GPU run's kernels took 0.59 s against 0.49 before the reduce change: more,
# smaller launches of long rows?), per-stage kernel seconds in the split.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x4_session38b.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" .data/layouts
so() {  # so TAG MIB GPUS LIMIT
    timeout "$4" python3 benchmarks/scaleout.py "$OUT/scaleout" --preset hugewiki --fraction 0.25 \
        --factors 100 --gpus "$3" --iterations 3 --budget 12 --cache .data/layouts --tag "$1" \
        --packed-batch-mb "$2"
    echo "scaleout $1: exit $?"
}
so p256 256 1,2,4 200
so p64 64 2,4 120
cat "$OUT/scaleout/summary.md"
