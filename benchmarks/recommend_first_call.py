"""The first ``recommend_all(user_items=R)`` after ``fit(R)`` against warm calls, and the fit's
wall time, per device, optionally before/after a change (issue 29).

Each run is a fresh process (the first call is the process's first top-k): a synthetic set of
USERS × ITEMS with NNZ ratings (``clmf.data.synthetic``), ``ALS(factors=F, iterations=3)`` fitted
on its CSR ``R`` (wall time), then ``model.recommend_all(10, user_items=R)`` once (the first call)
and three times more (warm: the median); the ids of the first and a warm call checked equal.
``--before DIR`` (a directory holding an older ``clmf`` package) runs the same in it, the runs
interleaved (a slow spell of a shared machine hits both)::

    python benchmarks/recommend_first_call.py --device Portable --device Intel \\
        --before /tmp/clmf_before --reps 3 --out OUT.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def one_run(dev, users, items, nnz, f):
    """Fit and rank in this process: {fit, first, warm} seconds."""
    import numpy as np

    import clmf
    from clmf.data import synthetic
    R = synthetic(shape=(users, items), nnz=nnz, seed=0).to_csr()
    model = clmf.ALS(factors=f, iterations=3, device=dev, random_state=0)
    t = time.perf_counter()
    model.fit(R, show_progress=False)
    fit = time.perf_counter() - t
    t = time.perf_counter()
    first = model.recommend_all(10, user_items=R)
    t_first = time.perf_counter() - t
    warm = []
    for _ in range(3):
        t = time.perf_counter()
        again = model.recommend_all(10, user_items=R)
        warm.append(time.perf_counter() - t)
    if not np.array_equal(first[0], again[0]):
        raise SystemExit("the first and a warm call differ")
    return {"fit": fit, "first": t_first, "warm": statistics.median(warm)}


def main():
    """Interleave the runs (before/after, devices) and write OUT.json."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", action="append", required=True)
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--items", type=int, default=2_000)
    ap.add_argument("--nnz", type=int, default=10_000_000)
    ap.add_argument("--f", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--before", help="a directory holding an older clmf package")
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(one_run(a.child[0], a.users, a.items, a.nnz, a.f)))
        return
    variants = ([("before", a.before)] if a.before else []) + [("after", None)]
    rows = []
    for rep in range(a.reps):
        for dev in a.device:
            for name, path in variants:
                env = dict(os.environ)
                env.pop("PYTHONPATH", None)
                if path:
                    env["PYTHONPATH"] = path
                cmd = [sys.executable, os.path.abspath(__file__), "--device", dev, "--users",
                       str(a.users), "--items", str(a.items), "--nnz", str(a.nnz), "--f",
                       str(a.f), "--out", "-", "--child", dev, "x"]
                out = subprocess.run(cmd, env=env, cwd="/", capture_output=True, text=True,
                                     check=True).stdout.strip().splitlines()[-1]
                row = {"variant": name, "device": dev, "rep": rep, **json.loads(out)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(a.out, "w") as fh:
        json.dump({"args": vars(a), "runs": rows}, fh, indent=1)
    for dev in a.device:
        for name, _ in variants:
            r = [x for x in rows if x["device"] == dev and x["variant"] == name]
            print(f"{dev} {name}: fit {statistics.median(x['fit'] for x in r):.3f} s, first "
                  f"{statistics.median(x['first'] for x in r):.3f} s, warm "
                  f"{statistics.median(x['warm'] for x in r):.3f} s, first - warm "
                  f"{statistics.median(x['first'] - x['warm'] for x in r):.3f} s")


if __name__ == "__main__":
    main()
