#!/usr/bin/env bash
# Tunings for PyPI's PoCL (pocl-binary-distribution 3.0, device "pthread-<CPU>", driver 3.0-rc2):
# the first-fit cases of issue 34 (ML-100K and Last.fm, every mode, f = 16/64/128), budgeted, run
# in a pip-only venv with the system runtimes hidden, into
# results/tuning/portable-computing-language-pthread-<cpu>.jsonl.gz; distil afterwards
# (python -m clmf.autotune.distill results/tuning/*.jsonl.gz -o results/tuning/shipped).
#
# usage: scripts/tune_pip_pocl.sh VENV_BIN_DIR OUT.jsonl.gz [DATA_DIR]
#   VENV_BIN_DIR: bin/ of a venv made as scripts/pip_only_check.sh makes it (wheel + pyopencl[pocl])
#   env BUDGET (seconds of measurement per case, default 30)
set -euo pipefail
BIN=${1:?venv bin dir}; DB=${2:?output database}; DATA=${3:-$(dirname "$0")/../../shared/data}
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/no-icd"
export OCL_ICD_VENDORS="$WORK/no-icd" CLMF_CACHE_DIR="$WORK/cache" XDG_CACHE_HOME="$WORK/cache"
C="$BIN/clmf"
ML="$DATA/ml-100k"
LF="$DATA/hetrec2011-lastfm-2k"
B=${BUDGET:-30}
for f in 64 128 16; do
  "$C" tune "$ML" -f $f --feedback implicit --alpha 2 --budget "$B" --db "$DB" --no-progress
  "$C" tune "$LF" --log1p -f $f --feedback implicit --alpha 2 --budget "$B" --db "$DB" --no-progress
  "$C" tune "$ML" -f $f --budget "$B" --db "$DB" --no-progress
  "$C" tune "$ML" -f $f --biases --budget "$B" --db "$DB" --no-progress
  "$C" tune "$LF" --log1p -f $f --budget "$B" --db "$DB" --no-progress
  "$C" tune "$LF" --log1p -f $f --biases --budget "$B" --db "$DB" --no-progress
done
