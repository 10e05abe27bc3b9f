"""The public recommend calls against the ranker's own time, per CPU OpenCL device (issue 29).

For every OpenCL CPU device (PoCL, Intel): random factors (``clmf.autotune.topk.synthetic_problem``)
for USERS users × ITEMS items at f, a popularity-skewed seen-items CSR; then, warm (medians of
REPS calls after one warm-up):

* the ranker's own time: :class:`clmf.inference.topk.DeviceTopK` with the user factors and the
  seen CSR already on the device (``query_rows(0, m, N, exclude="resident")``), its calls
  interleaved with the public ones (a slow spell of a shared machine hits all three);
* ``model.recommend(np.arange(m), R, N)`` and ``model.recommend_all(N, user_items=R)`` of a model
  holding the same factors; their ratio to the ranker's time, and the ids checked equal.

Only the public API and ``DeviceTopK`` are used, so the same script measures an older installed
package too: ``--before DIR`` (a directory holding an older ``clmf`` package) runs it there in a
child process first, then here, and writes both to ``OUT.json`` and a before/after table to
``OUT.md``::

    python benchmarks/recommend_overhead.py --users 100000 --items 2000 --f 64 --out OUT.json
    python benchmarks/recommend_overhead.py --before /tmp/clmf_before --out OUT.json
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from bench_topk import make_model  # benchmarks/: one copy

log = logging.getLogger("recommend_overhead")


def _median(fn, reps):
    """(median seconds, last result) of ``reps`` calls of ``fn``."""
    ts, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


def cpu_devices():
    """The OpenCL CPU devices (Oclgrind left out)."""
    import pyopencl as cl
    return [d for p in cl.get_platforms() if "oclgrind" not in p.name.lower()
            for d in p.get_devices() if d.type & cl.device_type.CPU]


def run(a):
    """One row per device: ranker, recommend, recommend_all (seconds) and their ratios."""
    import clmf
    from clmf.autotune.topk import synthetic_problem
    from clmf.inference import topk as T
    X, Y, R = synthetic_problem(a.users, a.items, a.f, a.seen, seed=0)
    users = np.arange(a.users)
    rows = []
    for d in cpu_devices():
        name = f"{d.platform.name.strip()} | {d.name.strip()}"
        with T.inference_options(device=d, min_work=0):
            dtk = T.DeviceTopK(Y, d).set_queries(X).set_exclude(R)
            m = make_model(X, Y, d)
            t_first = time.perf_counter()
            m.recommend(users, R, N=a.N)
            t_first = time.perf_counter() - t_first
            calls = {"ranker": lambda: dtk.query_rows(0, a.users, a.N, exclude="resident"),
                     "recommend": lambda: m.recommend(users, R, N=a.N),
                     "recommend_all": lambda: m.recommend_all(a.N, user_items=R)}
            times = {k: [] for k in calls}
            out = {k: fn() for k, fn in calls.items()}              # warm-up
            for _ in range(a.reps):             # interleaved: a slow spell hits all three
                for k, fn in calls.items():
                    t, out[k] = _median(fn, 1)
                    times[k].append(t)
            t_rank, t_rec, t_all = (statistics.median(times[k]) for k in calls)
            ids0, ids1, ids2 = (out[k][0] for k in calls)
            dtk = None
        row = {"device": name, "driver": d.driver_version, "ranker_s": t_rank,
               "recommend_first_s": t_first, "recommend_s": t_rec, "recommend_all_s": t_all,
               "recommend_ratio": t_rec / t_rank, "recommend_all_ratio": t_all / t_rank,
               "same_ids": bool(np.array_equal(ids0, ids1) and np.array_equal(ids0, ids2)),
               "runs": times}
        log.info("%s", row)
        rows.append(row)
    from clmf.provenance import commit
    return {"users": a.users, "items": a.items, "f": a.f, "N": a.N, "seen_nnz": int(R.nnz),
            "reps": a.reps, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "clmf": clmf.__file__, "commit": commit(), "rows": rows}


def main(argv=None):
    """Parse the arguments, run, print (and write) the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--items", type=int, default=2000)
    p.add_argument("--f", type=int, default=64)
    p.add_argument("--N", type=int, default=10)
    p.add_argument("--seen", type=int, default=50)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", type=pathlib.Path)
    p.add_argument("--before", type=pathlib.Path,
                   help="a directory holding an older clmf package: measured first, in a child")
    p.add_argument("--before-label", default=None,
                   help="what the older package is (e.g. 'main 916c623'; default its commit)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    res = {}
    if a.before:
        with tempfile.TemporaryDirectory() as tmp:
            args = [f"--{k}={getattr(a, k)}" for k in ("users", "items", "f", "N", "seen", "reps")]
            out = pathlib.Path(tmp) / "before.json"
            env = dict(os.environ, PYTHONPATH=str(a.before.resolve()))
            subprocess.run([sys.executable, __file__, *args, "--out", str(out)], env=env,
                           check=True, cwd=tmp)
            res["before"] = json.loads(out.read_text())
            if a.before_label:
                res["before"]["commit"] = a.before_label
    res["after" if a.before else "run"] = run(a)
    text = json.dumps(res if a.before else res["run"], indent=1)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
        if a.before:
            a.out.with_suffix(".md").write_text(table(res))


def table(res):
    """A before/after markdown table of ``--before`` runs."""
    b, r = res["before"], res["after"]
    L = [f"# recommend vs the ranker's own time, {r['users']:,} users × {r['items']:,} items, "
         f"f = {r['f']}, N = {r['N']}, {r['seen_nnz']:,} seen items", "",
         f"{r['date']}; before: commit {b['commit']}, after: commit {r['commit']}; medians of "
         f"{r['reps']} interleaved warm calls (s), ratio to the ranker in brackets, then the "
         "ratio of the fastest calls (a shared machine's slow spells left out).", "",
         "| device | | ranker | recommend(np.arange(m), R) | recommend_all(user_items=R) |",
         "|---|---|---|---|---|"]
    for rb, ra in zip(b["rows"], r["rows"]):
        for lab, x in (("before", rb), ("after", ra)):
            dev = x["device"].replace(" | ", " / ")
            best = {k: min(v) for k, v in x["runs"].items()}
            L.append(f"| {dev} ({x['driver']}) | {lab} | {x['ranker_s']:.3f} | "
                     f"{x['recommend_s']:.3f} ({x['recommend_ratio']:.2f}×; "
                     f"{best['recommend'] / best['ranker']:.2f}×) | "
                     f"{x['recommend_all_s']:.3f} ({x['recommend_all_ratio']:.2f}×; "
                     f"{best['recommend_all'] / best['ranker']:.2f}×) |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
