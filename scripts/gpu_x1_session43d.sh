#!/usr/bin/env bash
# One H100 command (stop 43, fourth): 43c's coverage found the leave-one-out choice for implicit
# f = 128 (items dims_shfl,dims_rsum,dims_q=4) 10 % faster than the shipped tuning (0.1388 vs
# 0.1542 s/it): implicit f = 128 and f = 64 re-tuned with the shuffle forms among the starts
# (fresh journal tune-43d.jsonl), then issue 27's side by side (15 iterations) with those
# records in front of the shipped ones.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session43d.sh
. "$(dirname "$0")/gpu_preamble.sh"
TUNE_DB=tune-43d.jsonl
. "$S/gpu_tune.sh"
W="$F,dims_shfl=1"
tune 200 128 --feedback implicit --alpha 2 --budget 20 --max-wall 130 -- \
    "$F,solve_wg=128,nnz_batch=8,dims_q=2" "$F,solve_wg=128,nnz_batch=8,dims_q=2,dims_p=0" \
    "$W,dims_rsum=1,solve_wg=256,nnz_batch=4,dims_q=4" "$W,dims_rsum=1,solve_wg=128,nnz_batch=8,dims_q=2" \
    "$W,dims_rsum=1,dims_pipe=1,solve_wg=256,nnz_batch=2,dims_q=4" "$W,solve_wg=256,nnz_batch=4,dims_q=4"
tune 150 64 --feedback implicit --alpha 2 --budget 15 --max-wall 90 -- \
    "$F,solve_wg=128,nnz_batch=8" "$W,dims_rsum=1,solve_wg=128,nnz_batch=8,dims_q=2" \
    "$W,dims_rsum=1,solve_wg=128,nnz_batch=4,dims_q=4" "$W,solve_wg=128,nnz_batch=8"
side_by_side "$OUT/$TUNE_DB"
echo "done at $((SECONDS - T0)) s"
