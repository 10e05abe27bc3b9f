#!/usr/bin/env bash
# 4-GPU commands (stop 40), issue 28:
#   a: Hugewiki x 0.25 at f = 100 on 1, 2, 4 GPUs, the reduce mode's sums on the host (the host
#      threads of stop 38) and on the owner devices (devsum: own rows never leave the device,
#      each peer's copy uploaded as it lands, summed in the unpack), side by side in one run;
#   b: clmf.dask with one worker per GPU against the in-process fit (Netflix, shared-memory
#      boards), then the time to the first iteration with a new cluster per fit.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x4_session40.sh a|b
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" .data/layouts .data/parquet
export PYTHONUNBUFFERED=1
case "${1:-a}" in
  a)
    timeout 540 python3 benchmarks/scaleout.py "$OUT/scaleout" --preset hugewiki --fraction 0.25 \
        --factors 100 --gpus 1,2,4 --iterations 3 --budget 12 --cache .data/layouts \
        --tag devsum --reduce-sum host,device
    echo "scaleout: exit $?"
    cat "$OUT/scaleout/summary.md"
    ;;
  b)
    timeout 250 python3 benchmarks/dask_gpu_runs.py "$OUT/dask" --preset netflix \
        --transport shm --iterations 4 --budget 10 --data-dir .data/parquet
    echo "dask: exit $?"
    timeout 280 python3 benchmarks/dask_setup.py "$OUT/dask-setup" --devices gpu \
        --preset netflix --rounds 2 --fresh --data-dir .data/parquet
    echo "dask_setup: exit $?"
    ;;
esac
