#!/usr/bin/env bash
# One H100 command (stop 44, eighth): f = 200 tuned again for implicit and explicit feedback
# with the neighbouring f's tuned shapes among the starts (44g's 30-second runs timed only the
# default space's first few: with their records the selection model's leave-one-out picks for
# f = 256 came from f = 200 shapes it never compared with f = 256's own), into tune-44h.jsonl.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session44h.sh
. "$(dirname "$0")/gpu_preamble.sh"
TUNE_DB=tune-44h.jsonl
. "$S/gpu_tune.sh"
W="$F,dims_shfl=1"
tune 150 200 --feedback implicit --alpha 2 --budget 20 --max-wall 100 -- \
    "$W,dims_rsum=1,dims_pipe=1,solve_wg=256,nnz_batch=2,dims_q=4" \
    "$W,dims_rsum=1,solve_wg=256,nnz_batch=4,dims_q=4" "$W,dims_rsum=1,solve_wg=128,nnz_batch=8,dims_q=2" \
    "$F,solve_wg=256,nnz_batch=8,dims_q=2"
tune 150 200 --budget 20 --max-wall 100 -- \
    "$W,solve_wg=256,nnz_batch=4,dims_q=4" "$W,solve_wg=128,nnz_batch=8,dims_q=2" \
    "$W,dims_rsum=1,solve_wg=256,nnz_batch=4,dims_q=4" "$F,solve_wg=256,nnz_batch=8,dims_q=2"
gzip -f "$OUT/$TUNE_DB"
echo "done at $((SECONDS - T0)) s"
