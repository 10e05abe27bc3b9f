#!/usr/bin/env bash
# One 4-GPU command (stop 38): all users' top-10 on the 4 GPUs with whole-wave batches (issue 29),
# Hugewiki x 0.25 scale-out with the pipelined, packed reduce (issue 28; scripts/gpu_x4_reduce.sh,
# this tree only: the 1-GPU baseline is in the same run and has no reduce), then clmf.dask's
# workers' loop against the in-process fit on the same 4 GPUs, Netflix and 4 x Netflix (issue 28).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x4_session38.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 120 python3 benchmarks/recommend_gpu.py --out "$OUT/recommend-4gpu" --device gpu:all \
    --factors 100 --skip-implicit --check
echo "recommend: exit $?"
LIMIT=240 OUT=$OUT bash scripts/gpu_x4_reduce.sh
timeout 220 python3 benchmarks/dask_gpu_runs.py "$OUT/dask" --preset netflix netflix-4x \
    --transport shm --iterations 4 --budget 10 --data-dir .data/parquet
echo "dask: exit $?"
