#!/usr/bin/env bash
# One H100 command (issue 30, whole fit's set-up): Netflix shape, f = 100, 15 iterations from a
# host CSR (benchmarks/whole_fit.py), each run writing its table to $OUT as its processes end:
#   1. the breakdown: processes 0 and 2 start from empty caches (clmf's index, pyopencl's, NVIDIA's
#      compute cache), 1 and 3 find them warm; each runs a first and a later fit; cProfile of
#      every fit's main thread;
#   2. the same with the programs built one after the other (--build-threads 1: before the
#      threaded builds), empty / warm, side by side with 1 in the same minutes;
#   3. ALS.warm_up(R) called 3 s before the first fit (the user's other work meanwhile) against
#      the same fit without it, process by process in turn, empty / warm caches.
# Each run's table and JSON land in $OUT/<run>/ (a run cut by its time limit keeps the processes
# that ended). Tested at a tiny size on a CPU (env OUT=... DATA=synthetic:3000x500x60000
# DEVICE=portable ITER=2 F=8 bash scripts/gpu_x1_setup30.sh).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_setup30.sh
set -u
OUT=${OUT:-/tmp/out}
DATA=${DATA:-netflix}
DEVICE=${DEVICE:-gpu}
ITER=${ITER:-15}
F=${F:-100}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/setup30-XXXX)       # the generated data set (not in $OUT: 800 MB)
run() {   # run NAME LIMIT ARGS...: one whole_fit run into $OUT/NAME (at most LIMIT seconds)
    local name=$1 limit=$2; shift 2
    mkdir -p "$WORK/$name" && ln -sfn "$WORK/data" "$WORK/$name/data"
    timeout "$limit" python3 benchmarks/whole_fit.py "$WORK/$name" --data "$DATA" --device "$DEVICE" \
        --factors "$F" --iterations "$ITER" --cache empty "$@" 2>&1 | tail -n 40
    echo "$name: exit ${PIPESTATUS[0]}"
    mkdir -p "$OUT/$name" && cp "$WORK/$name"/whole_fit.* "$OUT/$name/" 2>/dev/null
}
timeout 100 python3 -c "
import pathlib, sys; sys.path.insert(0, 'benchmarks'); import whole_fit
whole_fit.make_data('$DATA', pathlib.Path('$WORK/data'))" || exit 1
# (at most 100 + 220 + 110 + 100 s = 8m50s; about 2 minutes expected on an H100 host)
run breakdown 220 --processes 4 --fits 2 --profile 25
run build-threads-1 110 --processes 2 --fits 2 --build-threads 1
run warm-up 100 --processes 2 --fits 1 --sites plain= warm-up= --warm-up 3 \
    --warm-up-sites warm-up
rm -rf "$WORK"
