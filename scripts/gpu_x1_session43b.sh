#!/usr/bin/env bash
# One H100 command (stop 43, second): the rotation kernel staged through local memory (V's rows
# in slabs, 8 × 8 outputs per lane) — its tests, benchmarks/rotation_modes.py (off / serial /
# overlapped at f = 128 and 256, one round) — then issue 27's side-by-side table with 15
# iterations a fit (the libraries' default): auto explicit and implicit at f = 64 / 128 / 256
# and the `implicit` library at the same f.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session43b.sh
. "$(dirname "$0")/gpu_preamble.sh"
gpu_tests 120 "$R/tests/test_rotate.py" | tee "$OUT/tests.txt"
timeout 150 python3 "$R/benchmarks/rotation_modes.py" "$OUT/modes" --device gpu \
    --factors 128,256 --settings 0,serial,1 --rounds 1 --iterations 8 --max-seconds 130 2>&1 \
    | grep -v "CompilerWarning\|lambda: self\|^\s*$" | tail -12
timeout 370 python3 "$R/scripts/gpu_implicit.py" --out "$OUT/final" --phases auto,peers \
    --factors 64,128,256 --modes explicit,implicit --peer-factors 64,128,256 --iterations 15 \
    --max-seconds 350 2>&1 | grep -v "CompilerWarning\|lambda: self\|^\s*$"
rm -f "$OUT/final/tuning.jsonl.gz"
