#!/usr/bin/env bash
# One H100 command (stop 44, third): the hand-over's GPU tests (the ranker's padded rows at
# f = 64 filled on the device by a rectangular copy), whole fits base (5442232) against new
# after that copy (benchmarks/whole_fit.py, implicit f = 64 and explicit f = 100), issue 27's
# side by side with a one-iteration warm-up fit before each timed fit (clmf's programs cached,
# the peer's libraries loaded: whole fits with a warm cache), and the host copy rates by kind
# of host memory (benchmarks/host_copy_modes.py, issue 28's Dask exchange).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session44c.sh
. "$(dirname "$0")/gpu_preamble.sh"
gpu_tests 90 "$R/tests/test_resident.py" "$R/tests/test_setup.py" \
    -k "hands or early_stopped or staging or keeps_the_factors"
python3 -m pip install -q --no-deps --target /tmp/site-base "$R"/.whl/base44/clmf-*.whl 2>&1 | tail -2
for run in "implicit 64" "explicit 100"; do
    set -- $run
    timeout 100 python3 "$R/benchmarks/whole_fit.py" "$OUT/wf-$1-$2" --data netflix --device gpu \
        --feedback "$1" --factors "$2" --iterations 15 --processes 1 --fits 3 \
        --sites base=/tmp/site-base new= 2>&1 | grep -v "CompilerWarning\|lambda: self" | tail -3
    rm -rf "$OUT/wf-$1-$2/data" "$OUT/wf-$1-$2/whole_fit.json"
done
echo "whole fits done at $SECONDS s"
mkdir -p "$OUT/final"
timeout 310 python3 "$S/gpu_implicit.py" --out "$OUT/final" --phases auto,peers --warm-up-fits \
    --factors 64,128,256 --modes explicit,implicit --peer-factors 64,128,256 --iterations 15 \
    --max-seconds 290 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
echo "side by side done at $SECONDS s"
timeout 60 python3 "$R/benchmarks/host_copy_modes.py" "$OUT/copies" --device gpu --megabytes 192 \
    2>&1 | tail -12
echo "done at $SECONDS s"
