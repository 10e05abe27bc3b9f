#!/usr/bin/env bash
# One H100 command (stop 39, third): issue 27's tables after the Gram rewrite and the re-tunings
# of scripts/gpu_x1_session39a.sh / 39b.sh (distilled into the shipped database): on the Netflix
# shape, auto's s/it for every mode and f, the `implicit` library's CUDA ALS at f = 64/128/256,
# and the coverage table with the leave-one-out check (no tunings needed: every cell has its
# runs); then a second shape (MovieLens-20M's, never tuned on the H100): a short tuning per
# cell, and the leave-one-out choice — the model's prediction from the Netflix shape's runs.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session39c.sh
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
export PYTHONFAULTHANDLER=1
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/netflix" --phases auto,peers,coverage \
    --factors 16,32,64,100,128,256 --modes explicit,biased,implicit --peer-factors 64,128,256 \
    --iterations 5 --max-seconds 290 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/movielens-20m" --preset movielens-20m \
    --phases coverage --factors 64,128 --modes implicit,explicit --iterations 5 \
    --tune-budget 15 --max-seconds 280 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
