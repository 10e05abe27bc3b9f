#!/usr/bin/env bash
# One H100 command (stop 44, fourth): issue 27's side by side after the alpha·r ratings stopped
# being a float64 copy of the CSR (7e75daf), with a one-iteration warm-up fit before each timed
# fit (whole fits with warm program caches), then the on-device coverage of the implicit and
# explicit cells at f = 64 / 128 / 256 (auto against the selection model's leave-one-out
# choice, side by side) as long as the command's time lasts.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session44d.sh
. "$(dirname "$0")/gpu_preamble.sh"
mkdir -p "$OUT/final"
timeout 560 python3 "$S/gpu_implicit.py" --out "$OUT/final" --phases auto,peers,coverage \
    --warm-up-fits --factors 64,128,256 --modes explicit,implicit --peer-factors 64,128,256 \
    --iterations 15 --max-seconds 540 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
echo "done at $SECONDS s"
