#!/usr/bin/env bash
# One 4-GPU command (stop 37): the engine's held copy events (issue 28) and the ranker's (issue 29)
# measured together: in-process scale-out on Netflix and Hugewiki x 0.25 at 1, 2, 4 GPUs, then all
# users' top-10 on the 4 GPUs (Netflix f = 100 and the 1M x 1M catalog at f = 128), checked.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x4_session37.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" .data/layouts
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpus.csv" 2>&1
so() {  # so PRESET FRACTION ITERATIONS LIMIT
    timeout "$4" python3 benchmarks/scaleout.py "$OUT/scaleout" --preset "$1" --fraction "$2" \
        --gpus 1,2,4 --iterations "$3" --budget 20 --cache .data/layouts --tag new
    echo "scaleout $1@$2: exit $?"
}
so netflix 1 4 100
so hugewiki 0.25 3 230
timeout 160 python3 benchmarks/recommend_gpu.py --out "$OUT/recommend-4gpu" --device gpu:all \
    --factors 100 --skip-implicit --check
echo "recommend: exit $?"
