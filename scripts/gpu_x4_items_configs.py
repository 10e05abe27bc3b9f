#!/usr/bin/env python3
"""One 4-GPU command (stop 40): which items-side S1 configuration suits the reduce mode's
partial systems on 4 GPUs (Hugewiki x 0.25, f = 100; each device's items rows carry a quarter of
the ratings, where the lookup chose for the whole side). The users' side keeps the lookup's
choice; the items' side takes each candidate in turn; 4 GPUs with device sums, then the two best
on one GPU (is the one-GPU choice still right?). Rows appended to OUT/items.jsonl as they come.

    source .whl/gpu-opencl.sh activate && python3 scripts/gpu_x4_items_configs.py $OUT/items

A CPU check at a tiny size: ``POCL_DEVICES="pthread pthread pthread pthread" python3
scripts/gpu_x4_items_configs.py /tmp/items 0.0002 cpu``.
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from scaleout import load_layout, say  # noqa: E402

CANDIDATES = ["batch+vec4+syrk:bx=8,ks=2,solver=cg", "batch+vec4+syrk:bx=8,ks=4,solver=cg",
              "batch+vec4+mma:tx=4,ks=2,solver=cg,precision=tf32",
              "batch+vec4+gemm:bx=64,nnz_batch=8,solver=cg",
              "batch+vec4+syrk:bx=8,ks=1,solver=cg"]


def main():
    """Run the candidates; see the module docstring."""
    import pyopencl as cl

    from clmf.engine.config import KernelConfig
    from clmf.parallel.scaling import configs_for, timed_fit
    out = pathlib.Path(sys.argv[1])
    fraction = float(sys.argv[2]) if len(sys.argv) > 2 else 0.25
    kind = cl.device_type.CPU if sys.argv[3:] == ["cpu"] else cl.device_type.GPU
    out.mkdir(parents=True, exist_ok=True)
    gpus = [d for p in cl.get_platforms() for d in p.get_devices() if d.type & kind][:4]
    layout = load_layout("hugewiki", fraction, ".data/layouts" if fraction >= 0.25 else None)
    users = configs_for(gpus[:1], layout, 100)[0][0]
    say(f"users side: {users}")
    rows = []
    for n, cands in ((4, CANDIDATES), (1, None)):
        if cands is None:               # the two best on 4 GPUs, on one
            cands = [r["items"] for r in sorted(rows, key=lambda r: r["s_per_it"])[:2]]
        for c in cands:
            if time.time() - T0 > 520:
                say("time budget reached")
                return
            cfg = KernelConfig.parse(c)
            try:
                r = timed_fit(gpus[:n], layout, 100, iterations=3, budget_s=8.0, say=say,
                              label=f"{n} GPU(s) items {c}", configs=[(users, cfg)] * n,
                              **({"reduce_sum": "device"} if n > 1 else {}))
            except Exception as e:      # noqa: BLE001 - a refused candidate is a result too
                say(f"{c} on {n}: {type(e).__name__}: {e}")
                continue
            row = {"devices": n, "items": c, "users": str(users), "s_per_it": r["s_per_it"],
                   "split": r.get("split"), "commit": __import__("os").environ.get("CLMF_COMMIT")}
            if n == 4:
                rows.append(row)
            with open(out / "items.jsonl", "a") as fh:
                fh.write(json.dumps(row) + "\n")
            say(f"{n} GPU(s) items {c}: {r['s_per_it']:.4f} s/it")


T0 = time.time()
if __name__ == "__main__":
    main()
