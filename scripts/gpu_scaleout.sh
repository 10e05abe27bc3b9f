#!/usr/bin/env bash
# The 4-GPU runs of issue 28 (and 29's multi-GPU recommend), one phase per device command
# (each under 10 minutes; results written under $OUT as they come):
#
#   source .whl/gpu-opencl.sh activate && bash scripts/gpu_scaleout.sh PHASE
#
# PHASE:
#   inproc    Netflix and 4 x Netflix at f = 100 on 1, 2, 4 GPUs in process, this tree ("new")
#             and the build unpacked in .base/ ("base": the commit before the change) side by
#             side (benchmarks/scaleout.py; layouts cached in .data/layouts for both)
#   huge      the same for Hugewiki x 0.25 (756M ratings)
#   dask      clmf.dask.ALS, one worker per GPU, against the in-process fit: Netflix (blocks
#             through shared memory, then Dask's comms) and 4 x Netflix (shared memory)
#   recommend all users' top-10 on every GPU of the host (benchmarks/recommend_gpu.py)
set -u
phase=${1:?phase: inproc, huge, dask or recommend}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" .data/layouts
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpus-$phase.csv" 2>&1
df -h /dev/shm > "$OUT/shm-$phase.txt" 2>&1
so() {  # so TAG PRESET FRACTION BUDGET: one scaleout run, bounded
    local tag=$1 preset=$2 frac=$3 limit=$4
    local run=(python3 benchmarks/scaleout.py "$OUT/scaleout" --preset "$preset" --fraction "$frac"
               --gpus 1,2,4 --iterations 4 --budget 20 --cache .data/layouts --tag "$tag")
    if [ "$tag" = base ]; then
        timeout "$limit" env PYTHONPATH="$PWD/.base:${PYTHONPATH:-}" "${run[@]}"
    else
        timeout "$limit" "${run[@]}"
    fi
    echo "scaleout $tag $preset@$frac: exit $?"
}
case "$phase" in
  inproc)
    so new netflix 1 100
    so base netflix 1 100
    so new netflix-4x 1 170
    so base netflix-4x 1 170
    ;;
  huge)
    so new hugewiki 0.25 280
    so base hugewiki 0.25 260
    ;;
  dask)
    timeout 330 python3 benchmarks/dask_gpu_runs.py "$OUT/dask" --preset netflix --transport both \
        --iterations 4 --budget 20 --data-dir .data/parquet
    echo "dask netflix: exit $?"
    timeout 240 python3 benchmarks/dask_gpu_runs.py "$OUT/dask" --preset netflix-4x --transport shm \
        --iterations 3 --budget 20 --data-dir .data/parquet
    echo "dask netflix-4x: exit $?"
    ;;
  recommend)
    timeout 560 python3 benchmarks/recommend_gpu.py --out "$OUT/recommend-4gpu" --device gpu:all
    echo "recommend: exit $?"
    ;;
  *)
    echo "unknown phase $phase" >&2
    exit 2
    ;;
esac
ls -R "$OUT" | head -50
