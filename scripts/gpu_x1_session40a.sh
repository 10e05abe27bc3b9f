#!/usr/bin/env bash
# One H100 command (stop 40, first): issue 27's implicit f = 100 cell, whose records predate the
# Gram kernel (8c4ff32) — implicit ÷ explicit was 1.21 there against ≤ 1.15 at every other f.
# A bounded re-tuning of implicit f = 100 on the Netflix shape (starts: the dims form that won
# f = 64/128, the syrk form that wins explicit f = 100, the TF32 mma), then auto for explicit and
# implicit f = 100 side by side with the new records in front of the shipped ones
# ($CLMF_TUNING_DB), then the peers (the `implicit` library) at f = 100 if time is left.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session40a.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$(cd "$(dirname "$0")" && pwd)
cd /tmp || exit 1     # import the installed clmf, not the checkout
TUNE_DB=tune-40a.jsonl
. "$S/gpu_tune.sh"
IMP=(--feedback implicit --alpha 2)
tune 220 100 "${IMP[@]}" -- "$F,dims_q=2,dims_p=0,solve_wg=128,nnz_batch=8" \
    "batch+vec4+syrk:bx=8,ks=2,solver=cg" "$F,dims_q=2,solve_wg=128,nnz_batch=8" "$MMA"
CLMF_TUNING_DB="$OUT/$TUNE_DB" python3 "$S/gpu_implicit.py" --out "$OUT/auto100" \
    --phases auto,peers --factors 100 --modes explicit,implicit,biased --peer-factors 100 \
    --iterations 6 --max-seconds 300 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
echo "done at $((SECONDS - T0)) s"
