#!/usr/bin/env bash
# One H100 command (stop 44, second): the whole fit's time outside the iterations after the
# factor buffers' hand-over to the ranker, the kept pinned staging buffers and the start drawn
# over threads — benchmarks/whole_fit.py, base (the wheel of 5442232 in .whl/base44) and new
# side by side, one process each in turn, three fits a process, implicit f = 64 and explicit
# f = 100 on the Netflix shape; the host scans by thread count (benchmarks/host_scans.py);
# then issue 27's side by side with the `implicit` library (whole fits, 15 iterations).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session44b.sh
. "$(dirname "$0")/gpu_preamble.sh"
python3 -m pip install -q --no-deps --target /tmp/site-base "$R"/.whl/base44/clmf-*.whl 2>&1 | tail -2
timeout 100 python3 "$R/benchmarks/host_scans.py" "$OUT/scans" --repeats 3 2>&1 | tail -3
for run in "implicit 64" "explicit 100"; do
    set -- $run
    timeout 170 python3 "$R/benchmarks/whole_fit.py" "$OUT/wf-$1-$2" --data netflix --device gpu \
        --feedback "$1" --factors "$2" --iterations 15 --processes 2 --fits 3 \
        --sites base=/tmp/site-base new= 2>&1 | grep -v "CompilerWarning\|lambda: self" | tail -4
    rm -rf "$OUT/wf-$1-$2/data"
    rm -f "$OUT/wf-$1-$2/whole_fit.json" "$OUT/scans/host_scans.json"
done
echo "whole fits done at $SECONDS s"
: > /tmp/empty.jsonl
side_by_side /tmp/empty.jsonl
rm -f "$OUT/final/"*.jsonl.gz
echo "done at $SECONDS s"
