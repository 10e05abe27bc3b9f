#!/bin/bash
# Multi-device recommend on CPU devices before/after issue 29's fixes, alternated in one run.
# before = main at 6963a5b: its clmf/inference/{topk,resident,ranking}.py laid over a copy of
# the installed package in /tmp/mr/before_pkg; after = the branch's installed package copied
# to /tmp/mr/after_pkg (both put first on PYTHONPATH). Usage: before_after.sh OUTDIR
set -u
cd "$(dirname "$0")/../../../benchmarks"
export OCL_ICD_VENDORS=$PWD/../.icd POCL_DEVICES="pthread pthread pthread pthread"
OUT=$1
run() {  # name, version, args...
  local name=$1 ver=$2; shift 2
  PYTHONPATH=/tmp/mr/${ver}_pkg nice ../.venv/bin/python recommend_scaling.py \
    --out $OUT/$name-$ver "$@" > /dev/null 2>$OUT/$name-$ver.err || echo "FAILED $name $ver"
  python3 -c "import json; r=json.load(open('$OUT/$name-$ver/recommend_scaling.json'))['result']; print('$name $ver', 'first %.3f warm %.3f gil %.3f sum/tog %.2f slowest/tog %.2f' % (r['first_s'], r['warm_s'], r['gil_gap_s'], r['sum_alone_over_together'], r['slowest_alone_over_together']), 'runs', ['%.3f'%x for x in r['warm_runs']])"
}
for round in 1 2; do
 for ver in before after; do
  run pocl4-filtered $ver --device "0:0;0:1;0:2;0:3" --users 400000 --items 2000 --factors 16 --seen-per-user 20
  run pocl1-filtered $ver --device "0:0" --users 400000 --items 2000 --factors 16 --seen-per-user 20
  run intel1-filtered $ver --device "1:0" --users 400000 --items 2000 --factors 16 --seen-per-user 20
  run pocl4-catalog $ver --device "0:0;0:1;0:2;0:3" --users 20000 --items 200000 --factors 32
 done
done
