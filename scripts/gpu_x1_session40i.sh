#!/usr/bin/env bash
# One H100 command (stop 40, ninth): the first rotated iteration after bdeef98 (the rotation
# kernel among the set-up's warm launches): auto implicit at f = 128 / 256 with the Gram
# eigenbasis (programs built), without, and with again (whole fits comparable: cache warm).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session40i.sh
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
for run in rot1 rot0 rot1b; do
    rot=1; [ "$run" = rot0 ] && rot=0
    CLMF_GRAM_ROTATION=$rot python3 "$R/scripts/gpu_implicit.py" --out "$OUT/$run" \
        --phases auto --factors 128,256 --modes implicit --iterations 6 --max-seconds 60 \
        2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
done
