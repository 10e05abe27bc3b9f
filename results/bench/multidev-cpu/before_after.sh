#!/bin/bash
export OCL_ICD_VENDORS=/work/wt-engine/.icd
PY=/work/wt-engine/.venv/bin/python
S=/work/wt-engine/benchmarks/multidev_profile.py
DATA=${DATA:-synthetic:20000x2000x600000}
IT=${IT:-10}
cd /tmp
run() { # name pocl_devices devices [extra args]
  local name=$1 pd=$2 devs=$3; shift 3
  for ver in before after; do
    if [ $ver = before ]; then PP=/tmp/clmf_main; else PP=; fi
    PYTHONPATH=$PP POCL_DEVICES="$pd" nice $PY $S --data $DATA --f 32 --iterations $IT --devices "$devs" --out /tmp/prof/$ver/$name "$@" 2>&1 | grep -E "median|Error|error" | sed "s/^/$ver $name: /"
  done
}
for what in ${WHAT:-one two reduce mixed}; do
  case $what in
    one) run one "pthread" "0:0" ;;
    two) run two "pthread pthread" "0:0;0:1" ;;
    reduce) run reduce "pthread pthread" "0:0;0:1" --modes users=replicate,items=reduce --solver cg ;;
    mixed) run mixed "pthread" "0:0;1:0" ;;
  esac
done
if [ -n "$FP16" ]; then
  for r in 1 2; do
  PYTHONPATH= POCL_DEVICES="pthread pthread" nice $PY $S --data $DATA --f 32 --iterations $IT --devices "0:0;0:1" --out /tmp/prof/after/two32 2>&1 | grep -E "median" | sed "s/^/after two32: /"
  PYTHONPATH= POCL_DEVICES="pthread pthread" nice $PY $S --data $DATA --f 32 --iterations $IT --devices "0:0;0:1" --exchange-dtype float16 --out /tmp/prof/after/two16 2>&1 | grep -E "median" | sed "s/^/after two16: /"
  done
fi
