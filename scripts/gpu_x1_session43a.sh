#!/usr/bin/env bash
# One H100 command (stop 43, first): the Gram rotation reworked (issue 27, f = 256 at 3× the
# `implicit` library) — the rotation kernel tiled (rt_rotate: 4 × 8 outputs per lane, 32-row
# tiles), the host's eigendecomposition overlapped with the head rows' solves, both sides
# rotated as an option: its tests on the GPU, then benchmarks/rotation_modes.py (the kernel and
# the eigendecomposition alone, then whole implicit fits off / serial / overlapped / both sides
# at f = 128 and 256, round-robin).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session43a.sh
. "$(dirname "$0")/gpu_preamble.sh"
gpu_tests 120 "$R/tests/test_rotate.py" | tee "$OUT/tests.txt"
timeout 420 python3 "$R/benchmarks/rotation_modes.py" "$OUT/modes" --device gpu \
    --factors 128,256 --rounds 2 --iterations 8 --max-seconds 380 2>&1 \
    | grep -v "CompilerWarning\|lambda: self\|^\s*$"
