#!/usr/bin/env bash
# One H100 command (stop 44, seventh): issue 27's coverage at f = 200, which no tuning covered
# (the issue's f list) — scripts/gpu_implicit.py's coverage phase: each cell (implicit,
# explicit, biased; Netflix shape) tuned with a 30-second budget, then auto and the selection
# model's leave-one-out choice timed side by side; the tuning records come back in
# final/tuning.jsonl.gz (appended to the H100 journal and distilled afterwards).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session44g.sh
. "$(dirname "$0")/gpu_preamble.sh"
mkdir -p "$OUT/final"
timeout 575 python3 "$S/gpu_implicit.py" --out "$OUT/final" --phases coverage --factors 200 \
    --modes implicit,explicit,biased --tune-budget 30 --max-seconds 560 2>&1 \
    | grep -v "CompilerWarning\|lambda: self\|^\s*$" | tail -25
echo "done at $SECONDS s"
