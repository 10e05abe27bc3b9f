#!/usr/bin/env bash
# One H100 command (stop 39, last of issue 27's): the coverage cells scripts/gpu_x1_session39c.sh
# left (Netflix shape: explicit f = 32/100 and biased; their tunings from run-39 now in the
# shipped database), then more of the second shape (MovieLens-20M's: implicit and explicit at
# f = 32 and 256, biased at 64 and 128), each a short tuning then auto and the leave-one-out
# choice side by side; both resume results/bench/gpu-implicit/run-39c.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session39e.sh
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
export PYTHONFAULTHANDLER=1
B=$R/results/bench/gpu-implicit/run-39c
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/netflix" --resume "$B/netflix" --phases coverage \
    --factors 16,32,64,100,128,256 --modes explicit,biased,implicit --iterations 5 \
    --max-seconds 150 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/ml20m-a" --resume "$B/movielens-20m" \
    --preset movielens-20m --phases coverage --factors 32,256 --modes implicit,explicit \
    --iterations 5 --tune-budget 15 --max-seconds 200 2>&1 \
    | grep -v "CompilerWarning\|lambda: self\|^\s*$"
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/ml20m-b" --resume "$B/movielens-20m" \
    --preset movielens-20m --phases coverage --factors 64,128 --modes biased \
    --iterations 5 --tune-budget 15 --max-seconds 140 2>&1 \
    | grep -v "CompilerWarning\|lambda: self\|^\s*$"
