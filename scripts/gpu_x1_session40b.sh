#!/usr/bin/env bash
# One H100 command (stop 40, second): the dims-form fused CG with the Gram term folded into the
# apply's group sum (one tree per application instead of two, two barriers fewer) against the
# form before (the wheel in .whl/base/, installed into /tmp/site-base), per side, implicit
# f = 100 and 128 on the Netflix shape (benchmarks/side_profile.py: auto and the dims forms that
# the H100's tunings chose); then a bounded re-tuning of implicit f = 100 with the new kernel,
# and auto for explicit and implicit f = 100 side by side with its records in front.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session40b.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$(cd "$(dirname "$0")" && pwd)
R=$(cd "$S/.." && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-base \
    "$R"/.whl/base/clmf-*.whl || exit 1
cd /tmp || exit 1     # import the installed clmf, not the checkout
V="batch+vec4:solver=fusedcg,fused_dims=1,dims_q=2,solve_wg=128,nnz_batch=8"
V="$V;batch+vec4:solver=fusedcg,fused_dims=1,dims_q=2,dims_p=0,solve_wg=128,nnz_batch=8"
for tag in new base; do
    pp=$PYTHONPATH
    [ "$tag" = base ] && pp="/tmp/site-base:$PYTHONPATH"
    PYTHONPATH=$pp python3 -c "import clmf, sys; print('$tag', clmf.__file__)"
    PYTHONPATH=$pp python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/sp-$tag" \
        --factors 100,128 --modes implicit --variants "$V" --iterations 3 --max-seconds 140 \
        2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$" | tail -12
done
TUNE_DB=tune-40b.jsonl
. "$S/gpu_tune.sh"
IMP=(--feedback implicit --alpha 2)
tune 150 100 "${IMP[@]}" -- "$F,dims_q=2,solve_wg=128,nnz_batch=8" \
    "$F,dims_q=2,dims_p=0,solve_wg=128,nnz_batch=8" "batch+vec4+syrk:bx=8,ks=2,solver=cg"
CLMF_TUNING_DB="$OUT/$TUNE_DB" python3 "$S/gpu_implicit.py" --out "$OUT/auto100" \
    --phases auto --factors 100 --modes explicit,implicit --iterations 6 --max-seconds 100 \
    2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
echo "done at $((SECONDS - T0)) s"
