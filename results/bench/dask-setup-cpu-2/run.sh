#!/bin/bash
# time to the first iteration, before/after alternately: dask_setup.py (fresh clusters, 2 PoCL devices, Netflix x 0.25, f=16)
export OCL_ICD_VENDORS=/work/wt-dask/.icd POCL_DEVICES="pthread pthread"
cd /work/wt-dask
for r in 1 2 3; do
  for v in before after; do
    PYTHONPATH=/tmp/dask-$v nice .venv/bin/python benchmarks/dask_setup.py /tmp/sb2/$v-$r --devices Portable --preset netflix --fraction 0.25 --factors 16 --rounds 2 --fresh --data-dir /tmp/pqdir --note "$v" > /tmp/sb2/$v-$r.log 2>&1
  done
done
echo done > /tmp/sb2/DONE
