#!/usr/bin/env bash
# One H100 command (stop 43, sixth): the register cap (nv_regs, -cl-nv-maxrregcount) — its GPU
# test against the reference, then per side (benchmarks/side_profile.py) the tuned f = 256
# implicit and explicit shapes (175-190 registers: one work-group of 256 per multiprocessor)
# with nv_regs=128 (two) against none, and f = 128 implicit's (wg 128) with 128 and 96.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session43f.sh
. "$(dirname "$0")/gpu_preamble.sh"
gpu_tests 60 "$R/tests/test_variants.py" -k "nv_regs and full_sweep" | tee "$OUT/tests.txt"
B="batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1"
U="$B,dims_rsum=1,dims_pipe=1,dims_q=4,solve_wg=256,nnz_batch=2"
I="$B,dims_rsum=1,dims_q=4,solve_wg=256,nnz_batch=4"
E="$B,dims_q=4,solve_wg=256,nnz_batch=4"
timeout 150 python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/sp256" \
    --factors 256 --modes implicit --iterations 2 --max-seconds 130 \
    --variants "$U;$U,nv_regs=128;$I;$I,nv_regs=128" 2>&1 | grep " ok \|best pair\|rror"
timeout 60 python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/sp256e" \
    --factors 256 --modes explicit --iterations 2 --max-seconds 50 \
    --variants "$E;$E,nv_regs=128" 2>&1 | grep " ok \|best pair\|rror"
T="$B,dims_rsum=1,dims_q=2,solve_wg=128,nnz_batch=8"
timeout 60 python3 "$R/benchmarks/side_profile.py" --device gpu --out "$OUT/sp128" \
    --factors 128 --modes implicit --iterations 2 --max-seconds 50 \
    --variants "$T;$T,nv_regs=128;$T,nv_regs=96" 2>&1 | grep " ok \|best pair\|rror"
for d in sp256 sp256e sp128; do rm -f "$OUT"/$d/*.json*; done
echo "done at $SECONDS s"
