#!/usr/bin/env bash
# One H100 command (stop 43, fifth): explicit f = 64 and f = 128 re-tuned with the shuffle forms
# among the starts (43d found them ahead for implicit feedback at both f; explicit's shipped f = 64
# choice predates them), the rotation tests on the GPU, then issue 27's side by side (15
# iterations) with the new records in front of the shipped ones (43d's included there).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session43e.sh
. "$(dirname "$0")/gpu_preamble.sh"
gpu_tests 100 "$R/tests/test_rotate.py" | tee "$OUT/tests.txt"
TUNE_DB=tune-43e.jsonl
. "$S/gpu_tune.sh"
W="$F,dims_shfl=1"
tune 150 64 --budget 15 --max-wall 90 -- \
    "$F,tx=1,ty=1,solve_wg=128,nnz_batch=8" "$W,solve_wg=128,nnz_batch=8,dims_q=2" \
    "$W,dims_rsum=1,solve_wg=128,nnz_batch=8,dims_q=2" "$W,solve_wg=128,nnz_batch=4,dims_q=4"
tune 170 128 --budget 20 --max-wall 110 -- \
    "$W,tx=1,ty=1,solve_wg=128,nnz_batch=8,dims_q=2" "$W,dims_rsum=1,solve_wg=128,nnz_batch=8,dims_q=2" \
    "$W,solve_wg=256,nnz_batch=4,dims_q=4" "$W,dims_pipe=1,solve_wg=256,nnz_batch=2,dims_q=4"
side_by_side "$OUT/$TUNE_DB"
echo "done at $((SECONDS - T0)) s"
