#!/bin/bash
# per-iteration, before/after alternately: dask_overhead.py (2 PoCL devices, ML-100K f=32, in-process and the workers' loop with staging as on GPUs)
while [ ! -f /tmp/sb2/DONE ]; do sleep 5; done
export OCL_ICD_VENDORS=/work/wt-dask/.icd POCL_DEVICES="pthread pthread"
cd /work/wt-dask
O=results/bench/dask-overhead-cpu-2
for r in 1 2 3; do
  for v in before after; do
    PYTHONPATH=/tmp/dask-$v nice .venv/bin/python benchmarks/dask_overhead.py --rounds 2 --iterations 10 --paths inprocess,dask_loop --staging --json $O/$v-staged-$r.json 2>&1 | grep -v "INFO\|WARN\|Warn\|warn" > $O/$v-staged-$r.log
  done
done
echo done > /tmp/ov/DONE2
