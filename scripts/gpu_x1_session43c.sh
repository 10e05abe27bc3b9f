#!/usr/bin/env bash
# One H100 command (stop 43, third): the dims form's weight factors loaded a chunk ahead with
# dims_pipe (d69104e) — its GPU tests, then implicit f = 128 and 256 auto fits of main before
# it (9cdd7fc, unpacked from .whl/base43) and after, alternating, two rounds — then the
# on-device coverage of the implicit cells f = 256 and 128 with loo4's selection model (auto
# and the leave-one-out choice side by side).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session43c.sh
. "$(dirname "$0")/gpu_preamble.sh"
gpu_tests 200 "$R/tests/test_variants.py" -k "pipe or rsum or shared_weights or shuffle" \
    | tee "$OUT/tests.txt"
python3 -m pip install -q --no-deps --target /tmp/base43 "$R"/.whl/base43/clmf-*.whl 2>&1 | tail -2
for round in 1 2; do
    for site in before after; do
        PP=$PYTHONPATH; [ $site = before ] && PP=/tmp/base43:$PYTHONPATH
        PYTHONPATH=$PP timeout 100 python3 "$R/benchmarks/rotation_modes.py" "$OUT/$site" \
            --device gpu --factors 128,256 --settings 1 --rounds 1 --iterations 8 2>&1 \
            | grep "s/it (whole"
    done
done
timeout 330 python3 "$R/scripts/gpu_implicit.py" --out "$OUT/coverage" --phases coverage \
    --modes implicit --factors 256,128 --max-seconds 320 2>&1 \
    | grep -v "CompilerWarning\|lambda: self\|^\s*$" | tail -20
rm -f "$OUT/coverage/tuning.jsonl.gz"
