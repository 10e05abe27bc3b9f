#!/usr/bin/env bash
# One H100 command (stop 40, fourth): implicit half-steps in the Gram matrix's eigenbasis
# (clmf/engine/rotate.py: the dims-form CG's Gram term diagonal, f per application instead of
# f²) against the same code with CLMF_GRAM_ROTATION=0, side by side on one machine: auto's
# implicit fits at f = 32 .. 256 on the Netflix shape (rotation on, off, on again: the order's
# effect shows), explicit auto at the same f for the ratio, the `implicit` library at f = 256;
# then the leave-one-out picks that the model of loo2 (81b4689) changed and nobody timed.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session40d.sh
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
export PYTHONFAULTHANDLER=1
G="CompilerWarning\|lambda: self\|^\s*$"
T0=$SECONDS
auto() {  # auto DIR ROTATION MODES FACTORS SECONDS [more args]
    local d=$1 rot=$2 modes=$3 fs=$4 secs=$5; shift 5
    CLMF_GRAM_ROTATION=$rot python3 "$R/scripts/gpu_implicit.py" --out "$OUT/$d" --phases auto \
        --factors "$fs" --modes "$modes" --iterations 6 --max-seconds "$secs" "$@" 2>&1 \
        | grep -v "$G"
    echo "$d: exit ${PIPESTATUS[0]} at $((SECONDS - T0)) s"
}
auto rot1 1 implicit 32,64,100,128,256 110
auto rot0 0 implicit 32,64,100,128,256 110
auto explicit 1 explicit 32,64,100,128,256 100
CLMF_GRAM_ROTATION=1 python3 "$R/scripts/gpu_implicit.py" --out "$OUT/peers" --phases peers \
    --factors 256 --modes implicit --peer-factors 256 --iterations 6 --max-seconds 60 2>&1 \
    | grep -v "$G"
cov() {  # cov DIR MODES FACTORS SECONDS
    python3 "$R/scripts/gpu_implicit.py" --out "$OUT/$1" --phases coverage --factors "$3" \
        --modes "$2" --iterations 5 --max-seconds "$4" 2>&1 | grep -v "$G"
}
cov loo-e explicit 64,100 60
cov loo-b biased 64 40
cov loo-i implicit 256 50
echo "done at $((SECONDS - T0)) s"
