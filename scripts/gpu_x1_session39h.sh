#!/usr/bin/env bash
# One H100 command (stop 39, last): implicit f = 100 re-tuned after the Gram rewrite (its records
# predate it; implicit ran 1.21x explicit's s/it there in run-39c), into the per-user database
# that variant="auto" reads, then auto at f = 100, explicit and implicit, side by side.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session39h.sh
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
cd /tmp || exit 1     # import the installed clmf, not the checkout
export PYTHONFAULTHANDLER=1
F="batch+vec4:solver=fusedcg,fused_dims=1"
MMA="batch+vec4+mma:tx=4,ks=2,solver=cg,precision=tf32"
timeout -s ABRT 150 python3 -m clmf -v tune --preset netflix --factors 100 --device gpu \
    --budget 10 --max-wall 40 --sample auto --feedback implicit --alpha 2 \
    --start "$F,dims_q=2,dims_p=0,solve_wg=128,nnz_batch=8" \
    --start "batch+vec4+syrk:bx=8,ks=2,solver=cg" --start "$MMA" --no-progress 2>&1 \
    | grep -E "^f=|^  users|^  items|incumbent:"
U=$(python3 -c "from clmf.tuning.database import user_db_path; print(user_db_path())")
cp "$U" "$OUT/tune-39h.jsonl"
python3 "$R/scripts/gpu_implicit.py" --out "$OUT/auto" --phases auto --factors 100 \
    --modes explicit,implicit --iterations 5 --max-seconds 100 2>&1 | grep -E "auto |done"
