#!/bin/bash
echo "=== start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
PYTHONPATH=/tmp/site-clmf OCL_ICD_VENDORS=$PWD/.icd /tmp/venv-lk/bin/python \
  benchmarks/lenskit_whole_fit.py "${OUTDIR:-results/bench/lenskit-whole-fit-cpu/after-intel}" \
  --data synthetic:6040x3706x1000209 ../shared/data/ml-latest-small -f 50 100 \
  --devices intel --reps 3 --cold 1
echo "=== end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
