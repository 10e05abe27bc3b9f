#!/usr/bin/env bash
# One H100 command, prepared at stop 41 and not yet run (the session's device time was spent):
# the dims form's shared weights (`dims_wshfl=1`: one lane loads an entry's weight factors, the
# others take them by shuffles) against the per-lane weights of `dims_shfl=1` and against no
# shuffles, per side at f = 128 / 256 in implicit and explicit fits (41c: the shuffles lost
# 13-31 % in implicit half-steps with 8 entries per group), then ptxas' registers of each.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_next_dims_weights.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=$(cd "$(dirname "$0")/.." && pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
cd /tmp || exit 1     # import the installed clmf, not the checkout
F="batch+vec4:solver=fusedcg,fused_dims=1"
V=()
for g in "dims_q=4,solve_wg=256,nnz_batch=4" "dims_q=2,solve_wg=128,nnz_batch=8" \
         "dims_q=2,solve_wg=256,nnz_batch=8"; do
    V+=("$F,$g" "$F,dims_shfl=1,$g" "$F,dims_shfl=1,dims_wshfl=1,$g")
done
timeout 330 python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/sp" \
    --factors 128,256 --modes implicit,explicit --variants "$(IFS=';'; echo "${V[*]}")" \
    --iterations 3 --max-seconds 300 2>&1 | grep -v "CompilerWarning\|lambda: self\|prg.build" \
    | grep -v "best pair" | tail -40
for mode in explicit implicit; do
    flag=(); [ $mode = implicit ] && flag=(--implicit)
    echo "== $mode"
    timeout 100 python3 "$R/scripts/archive/nv_regs.py" -f 128 256 --kernel s3_fcg "${flag[@]}" \
        --variant "${V[@]}" 2>&1 | grep -v "CompilerWarning\|prg.build"
done | tee "$OUT/regs.txt"
