#!/usr/bin/env bash
# One H100 command (stop 44, fifth): 44d's side by side again (the same wheel, b3807ec, a new
# machine), with a one-iteration warm-up fit before each timed fit: the whole-fit ratios a
# second time.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session44e.sh
. "$(dirname "$0")/gpu_preamble.sh"
mkdir -p "$OUT/final"
timeout 400 python3 "$S/gpu_implicit.py" --out "$OUT/final" --phases auto,peers \
    --warm-up-fits --factors 64,128,256 --modes explicit,implicit --peer-factors 64,128,256 \
    --iterations 15 --max-seconds 380 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
echo "done at $SECONDS s"
