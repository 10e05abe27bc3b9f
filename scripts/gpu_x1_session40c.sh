#!/usr/bin/env bash
# One H100 command (stop 40, third): the selection model's leave-one-out after the model's
# changes (case_key, align_d2; python -m clmf.autotune.loo lists the picks offline) timed on the
# device: the coverage phase's cells whose leave-one-out pick was never timed in the cell, and
# the two remaining offline misses (Netflix implicit f = 256, MovieLens-20M implicit f = 128);
# auto and the leave-one-out pick side by side per cell (tuner/coverage.measure_cell).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session40c.sh
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
export PYTHONFAULTHANDLER=1
G="CompilerWarning\|lambda: self\|^\s*$"
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/netflix-e" --phases coverage \
    --factors 10,50,64,128 --modes explicit --iterations 5 --max-seconds 190 2>&1 | grep -v "$G"
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/netflix-bi" --phases coverage \
    --factors 32,64,100,256 --modes biased,implicit --iterations 5 --max-seconds 210 \
    2>&1 | grep -v "$G"
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/movielens-20m" --preset movielens-20m \
    --phases coverage --factors 64,128,256 --modes implicit,explicit --iterations 5 \
    --tune-budget 15 --max-seconds 140 2>&1 | grep -v "$G"
