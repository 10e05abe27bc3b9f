#!/usr/bin/env bash
# One H100 command (stop 44, first): where a whole fit's time outside the iterations goes on the
# GPU (issues 27 and 30) — benchmarks/whole_fit.py on the Netflix shape, one fresh process with
# three fits (the first builds programs; the later two are what a process pays every time), each
# under cProfile (the main thread's 70 costliest functions: the factors read back, the ranker's
# hand-over, the buffers' release), implicit feedback at f = 64 and explicit at f = 100.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session44a.sh
. "$(dirname "$0")/gpu_preamble.sh"
for run in "implicit 64" "explicit 100"; do
    set -- $run
    timeout 200 python3 "$R/benchmarks/whole_fit.py" "$OUT/wf-$1-$2" --data netflix --device gpu \
        --feedback "$1" --factors "$2" --iterations 15 --processes 1 --fits 3 --profile 70 \
        2>&1 | grep -v "CompilerWarning\|lambda: self" | tail -8
    rm -rf "$OUT/wf-$1-$2/data"
done
echo "done at $SECONDS s"
