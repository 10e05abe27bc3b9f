#!/usr/bin/env bash
# One H100 command (stop 40, seventh): the leave-one-out picks that 40f's records changed
# (python -m clmf.autotune.loo: implicit f = 32 / 100 / 128 now dims-form users with TF32 mma
# items; biased f = 32 syrk), each timed side by side with the cell's auto.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session40g.sh
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
G="CompilerWarning\|lambda: self\|^\s*$"
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/loo-i" --phases coverage --factors 32,100,128 \
    --modes implicit --iterations 5 --max-seconds 200 2>&1 | grep -v "$G"
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/loo-b" --phases coverage --factors 32 \
    --modes biased --iterations 5 --max-seconds 150 2>&1 | grep -v "$G"
