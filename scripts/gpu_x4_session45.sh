#!/usr/bin/env bash
# 4-GPU commands (stop 45), issue 28:
#   a: the reduced side's long rows cut into pieces (splits in the reduce pipeline's partial
#      systems) — Hugewiki x 0.25 at f = 100 on 1, 2, 4 GPUs with this tree ("new"), then 2 and
#      4 GPUs with the base wheel (.whl/base45: main before the change) on the same layout;
#      then Hugewiki x 0.5 on 1, 2, 4 GPUs ("new"), time allowing.
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x4_session45.sh a
set -u
OUT=${OUT:-/tmp/out}
R=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT" "$R/.data/layouts"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpus.csv"
START=$(date +%s)
left() { echo $(( ${1:-560} - ($(date +%s) - START) )); }
scale() {  # scale TAG FRACTION GPUS SITE: benchmarks/scaleout.py into $OUT/scaleout
    local tag=$1 frac=$2 gpus=$3 site=$4 t
    t=$(left 570)
    [ "$t" -gt 40 ] || { echo "skip $tag $frac $gpus: ${t}s left"; return; }
    (cd /tmp && PYTHONPATH=${site:+$site:}${PYTHONPATH:-} timeout "$t" python3 \
        "$R/benchmarks/scaleout.py" "$OUT/scaleout" --preset hugewiki --fraction "$frac" \
        --factors 100 --gpus "$gpus" --iterations 3 --budget 8 --cache "$R/.data/layouts" \
        --tag "$tag" 2>&1 | grep -v "CompilerWarning\|lambda: self" >> "$OUT/scaleout.log")
    echo "scaleout $tag $frac $gpus: exit $? at +$(( $(date +%s) - START ))s"
}
case "${1:-a}" in
  a)
    python3 -m pip install -q --no-deps --target /tmp/site-base "$R"/.whl/base45/clmf-*.whl 2>&1 | tail -2
    scale new 0.25 1,2,4 ""
    scale base 0.25 2,4 /tmp/site-base
    rm -rf "$R/.data/layouts/hugewiki@0.25"
    scale new 0.5 1,2,4 ""
    cat "$OUT/scaleout/summary.md"
    ;;
esac
