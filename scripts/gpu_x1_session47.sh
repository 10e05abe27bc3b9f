#!/usr/bin/env bash
# One-H100 commands (stop 47), issues 27 and 30:
#   a: the items' half-step on the tensor cores at large f — the mma form with its register
#      write-back spread over 1, 2 or 4 work-groups per row (direct=N; no run had timed it at
#      f >= 128) — against auto, the users' side kept at auto's choice (side_profile.py --vary
#      items): implicit f = 256 / 200 / 128 (tf32), explicit f = 256 / 128 (fp32 and tf32).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session47.sh a
. "$(dirname "$0")/gpu_preamble.sh"
M="batch+vec4+mma:solver=cg"
T0=$SECONDS
DEV=${DEV:-gpu} SCALE=${SCALE:-1.0}   # (a CPU check: DEV=cpu SCALE=0.002 CLMF_MMA_EMULATION=1)
part=${1:-a}
case "$part" in
a)
    V="$M,tx=8,nnz_batch=16,direct=2,precision=tf32;$M,tx=8,nnz_batch=32,direct=2,precision=tf32"
    V="$V;$M,tx=8,nnz_batch=16,direct=4,precision=tf32;$M,tx=4,nnz_batch=16,direct=4,precision=tf32"
    V="$V;$M,tx=16,nnz_batch=16,direct=1,precision=tf32;$M,tx=8,nnz_batch=16,direct=1,precision=tf32"
    V="$V;$M,tx=8,nnz_batch=16,direct=2,precision=fp32"
    timeout 330 python3 "$R/benchmarks/side_profile.py" --device "$DEV" --scale "$SCALE" --out "$OUT/a" \
        --factors 256,200,128 --modes implicit --vary items --iterations 3 --max-seconds 320 \
        --variants "$V" 2>&1 | grep -v "CompilerWarning\|lambda: self"
    mkdir -p "$OUT/a2"
    timeout 230 python3 "$R/benchmarks/side_profile.py" --device "$DEV" --scale "$SCALE" --out "$OUT/a2" \
        --factors 256,128 --modes explicit --vary items --iterations 3 --max-seconds 200 \
        --variants "$V" 2>&1 | grep -v "CompilerWarning\|lambda: self"
    ;;
esac
echo "done at $((SECONDS - T0)) s"
