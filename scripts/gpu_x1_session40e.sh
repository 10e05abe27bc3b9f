#!/usr/bin/env bash
# One H100 command (stop 40, fifth): what 40d left (its coverage calls stopped at once: the
# coverage phase wants its tuning budget left): the leave-one-out picks loo2's model changed,
# then auto implicit with the Gram eigenbasis again after the programs are cached (40d's first
# implicit pass built them, so its whole-fit times are not comparable).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session40e.sh
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
export PYTHONFAULTHANDLER=1
G="CompilerWarning\|lambda: self\|^\s*$"
cov() {  # cov DIR MODES FACTORS
    python3 "$R/scripts/gpu_implicit.py" --out "$OUT/$1" --phases coverage --factors "$3" \
        --modes "$2" --iterations 5 --max-seconds 150 2>&1 | grep -v "$G"
}
cov loo-e explicit 64,100
cov loo-b biased 64
cov loo-i implicit 256
for rot in 0 1; do
    CLMF_GRAM_ROTATION=$rot python3 "$R/scripts/gpu_implicit.py" --out "$OUT/rot$rot" \
        --phases auto --factors 64,100,128,256 --modes implicit --iterations 6 \
        --max-seconds 100 2>&1 | grep -v "$G"
done
