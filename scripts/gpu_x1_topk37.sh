#!/usr/bin/env bash
# One H100 command (stop 37): tune the top-k kernel for a 1M-item catalog at f = 128 (issue 29),
# then all users' top-10 of the 1M x 1M model with that tuning on one GPU; then the implicit
# f = 128 half-steps of a few more variants (issue 27: fused CG work-groups of 512, mma shapes).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_topk37.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd /tmp || exit 1     # import the installed clmf, not the checkout
timeout 200 python3 - <<'PY'
import json, os
from clmf.autotune.topk import tune_topk
from clmf.tuning.database import user_db_path
s = tune_topk("gpu", n_items=1_000_000, f=128, users=65536, seen_per_user=0, progress=False)
print(json.dumps({k: v for k, v in s.items() if k != "candidates"}, default=str)[:3000])
for r in s.get("candidates", []):
    print(r.get("config_str"), r.get("status"), r.get("seconds"), r.get("kernel_seconds"))
os.system(f"cp {user_db_path()} {os.environ['OUT']}/topk-tuning.jsonl")
PY
echo "tune_topk: exit $?"
cd - >/dev/null || exit 1
timeout 150 python3 benchmarks/recommend_gpu.py --out "$OUT/recommend-1gpu" --device gpu \
    --factors 100 --skip-implicit --check
echo "recommend: exit $?"
F="batch+vec4:solver=fusedcg,fused_dims=1"
timeout 150 python3 benchmarks/side_profile.py --device gpu --out "$OUT/sp" --factors 128 \
    --modes implicit --max-seconds 130 --variants \
    "$F,solve_wg=512,nnz_batch=4;$F,solve_wg=512,nnz_batch=8;batch+vec4+mma:tx=8,ks=2,solver=cg,precision=tf32;batch+vec4+mma:tx=4,ks=1,solver=cg,precision=tf32;batch+vec4+mma:tx=2,ks=4,solver=cg,precision=tf32"
echo "side_profile: exit $?"
