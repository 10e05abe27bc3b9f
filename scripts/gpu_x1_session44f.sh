#!/usr/bin/env bash
# One H100 command (stop 44, sixth): after the factors' read-back and the ranker's uploads went
# through the kept pinned staging buffers — whole fits base (5442232) against new
# (benchmarks/whole_fit.py, implicit f = 256, the fit whose read-back is largest), then issue
# 27's side by side with a one-iteration warm-up fit before each timed fit.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session44f.sh
. "$(dirname "$0")/gpu_preamble.sh"
python3 -m pip install -q --no-deps --target /tmp/site-base "$R"/.whl/base44/clmf-*.whl 2>&1 | tail -2
timeout 150 python3 "$R/benchmarks/whole_fit.py" "$OUT/wf-implicit-256" --data netflix --device gpu \
    --feedback implicit --factors 256 --iterations 15 --processes 1 --fits 3 \
    --sites base=/tmp/site-base new= 2>&1 | grep -v "CompilerWarning\|lambda: self" | tail -3
rm -rf "$OUT/wf-implicit-256/data" "$OUT/wf-implicit-256/whole_fit.json"
echo "whole fits done at $SECONDS s"
mkdir -p "$OUT/final"
timeout 330 python3 "$S/gpu_implicit.py" --out "$OUT/final" --phases auto,peers --warm-up-fits \
    --factors 64,128,256 --modes explicit,implicit --peer-factors 64,128,256 --iterations 15 \
    --max-seconds 310 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
echo "done at $SECONDS s"
