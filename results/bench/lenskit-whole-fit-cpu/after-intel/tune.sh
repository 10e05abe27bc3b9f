#!/bin/bash
# the Intel re-tunes of issue 16 (fused CG in explicit vectors as starts)
DB=results/tuning/intel-r-opencl-amd-epyc-lenskit.jsonl
S1="batch+vec16:tx=1,ty=1,solve_wg=1,solve_vec=16,solver=fusedcg"
S2="batch+vec8:tx=1,ty=1,solve_wg=1,solve_vec=8,solver=fusedcg"
for data in synthetic:6040x3706x1000209 ../shared/data/ml-latest-small; do
  for b in "" --biases; do
    echo "=== $(date -u +%FT%TZ) $data f=50,100 $b load $(cut -d' ' -f1-3 /proc/loadavg)"
    python -m clmf.cli tune $data -f 100,50 $b --device intel \
      --budget 30 --start "$S1" --start "$S2" --db $DB --no-progress
  done
done
echo "=== done $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
