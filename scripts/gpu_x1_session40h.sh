#!/usr/bin/env bash
# One H100 command (stop 40, eighth): issue 27's side-by-side table with this stop's code (the
# Gram eigenbasis, the re-tunings): auto explicit and implicit at f = 64 / 128 / 256 and the
# `implicit` library at the same f, in one command.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session40h.sh
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/final" --phases auto,peers \
    --factors 64,128,256 --modes explicit,implicit --peer-factors 64,128,256 --iterations 6 \
    --max-seconds 400 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
