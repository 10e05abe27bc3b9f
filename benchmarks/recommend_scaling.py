"""All users' top-N of a multi-device model: the devices together against each device's share
alone, where each device's time goes, and whether the host is free while they rank (issue 29).

A model of random factors (normal × 0.1; ``--users`` × ``--items`` at ``--factors``) on the
devices of ``--device`` (its users split over them, :mod:`clmf.inference.resident`); after a
first call, ``--reps`` warm calls of ``model.recommend_all(N, filter_already_liked_items=False)``
(with ``--seen-per-user`` > 0: that many random seen items per user, filtered) and, per device,
its share of the users ranked alone (``ResidentRanker.iter_rank`` over its users only). Reported:

* wall of the public call (median) and of each share alone; ``sum alone ÷ together`` (with
  devices that compute independently, up to the number of devices) and ``slowest alone ÷
  together`` (1 when the split adds nothing over its slowest device);
* the longest stretch in which a Python thread could not run (a ticker thread that wakes every
  millisecond): a thread holding the GIL while a device computes shows here as a gap as long as
  a batch's kernels;
* per device, from :meth:`ResidentRanker.split_summary`: its thread's start and end, host
  seconds (enqueue, wait, finish), device seconds (kernel, copy, busy, idle), and
  ``devices_overlap`` (sum of the devices' busy seconds over their union: 1 = one at a time).

Results go to ``OUT/recommend_scaling.json`` and ``.md`` with device, driver, date and commit::

    python benchmarks/recommend_scaling.py --out OUT --device gpu:all                 # 4 GPUs
    python benchmarks/recommend_scaling.py --out OUT --device gpu:all --seen-per-user 200 \\
        --users 480189 --items 17770 --factors 100                                  # Netflix shape
    POCL_DEVICES="pthread pthread pthread pthread" python benchmarks/recommend_scaling.py \\
        --out OUT --device "0:0;0:1;0:2;0:3" --users 400000 --items 2000 --factors 16
"""
from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import sys
import threading
import time

import numpy as np
import scipy.sparse as sp
from bench_topk import _commit, _now, make_model  # benchmarks/: one copy of each


def gil_gap(fn):
    """``(seconds, longest gap, result)`` of ``fn()``: the gap is the longest stretch of the
    call in which a Python thread waking every millisecond did not run."""
    ticks, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)
    th = threading.Thread(target=tick, daemon=True)
    th.start()
    time.sleep(0.01)
    t0 = time.perf_counter()
    out = fn()
    t1 = time.perf_counter()
    stop.set()
    th.join()
    inside = [t for t in ticks if t0 <= t <= t1]
    gap = float(np.diff(np.concatenate([[t0], inside, [t1]])).max())
    return t1 - t0, gap, out


def seen_matrix(m, n, per_user, seed):
    """A CSR of up to ``per_user`` random items per user (drawn with replacement, duplicates
    merged), or None."""
    if per_user <= 0:
        return None
    rng = np.random.default_rng(seed)
    cols = rng.integers(0, n, (m, per_user), dtype=np.int32)
    R = sp.csr_matrix((np.ones(cols.size, np.float32), cols.ravel(),
                       np.arange(0, cols.size + 1, per_user)), shape=(m, n))
    R.sum_duplicates()
    return R


def measure(a, devs):
    """The measurements of one run (see the module docstring)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((a.users, a.factors), dtype=np.float32)
    X *= 0.1
    Y = rng.standard_normal((a.items, a.factors), dtype=np.float32)
    Y *= 0.1
    R = seen_matrix(a.users, a.items, a.seen_per_user, 1)
    model = make_model(X, Y, devs if len(devs) > 1 else devs[0])
    from clmf.inference.topk import inference_options

    def call():
        if R is None:
            return model.recommend_all(N=a.N, filter_already_liked_items=False,
                                       batch_size=a.batch_size)
        return model.recommend_all(N=a.N, user_items=R, batch_size=a.batch_size)

    row = {}
    with inference_options(min_work=0):
        row["first_s"], _g, _ = gil_gap(call)
        walls, gaps, splits = [], [], []
        for _ in range(a.reps):
            t, g, _ = gil_gap(call)
            walls.append(t)
            gaps.append(g)
            res = model._topk_cache["resident"][1]
            if hasattr(res, "split_summary"):
                splits.append(res.split_summary())
        row.update(warm_s=statistics.median(walls), warm_runs=walls,
                   gil_gap_s=statistics.median(gaps), gil_gap_runs=gaps)
        if splits:
            mid = sorted(range(len(walls)), key=walls.__getitem__)[len(walls) // 2]
            row["split"] = splits[mid]
        res = model._topk_cache["resident"][1]
        seen = None
        if R is not None:
            seen, _ = res.seen_for(R, 0, None)
        alone = []
        for p in res.parts:
            r0, r1 = p["rows"]
            ts, gs = [], []
            for _ in range(a.reps):
                t, g, _ = gil_gap(lambda: sum(1 for _ in res.iter_rank(
                    r0, r1, a.N, None, seen, a.batch_size or 65536)))
                ts.append(t)
                gs.append(g)
            alone.append({"users": [r0, r1], "wall_s": statistics.median(ts),
                          "gil_gap_s": statistics.median(gs)})
        row["alone"] = alone
    s = sum(x["wall_s"] for x in alone)
    row["sum_alone_over_together"] = s / row["warm_s"]
    row["slowest_alone_over_together"] = max(x["wall_s"] for x in alone) / row["warm_s"]
    return row


def markdown(meta, row):
    """The report's tables."""
    def f(v):
        return "—" if v is None else f"{v:.3f}"
    L = ["# recommend_all over several devices: together against alone (issue 29)", "",
         f"Device: {meta['device']} (driver {meta['driver']}); {meta['date']}; commit "
         f"{meta['commit']}; host {meta['host']}.", "", f"Command: `{meta['command']}`", "",
         f"Model: {meta['data']}; warm = median of {meta['reps']} calls.", "",
         "| first s | warm s | longest GIL gap s | sum alone ÷ together | slowest alone ÷ "
         "together | devices overlap |", "|---|---|---|---|---|---|",
         f"| {f(row['first_s'])} | {f(row['warm_s'])} | {f(row['gil_gap_s'])} | "
         f"{f(row['sum_alone_over_together'])} | {f(row['slowest_alone_over_together'])} | "
         f"{f(row.get('split', {}).get('devices_overlap'))} |", "",
         "| device | users | alone s | alone GIL gap s | thread start s | thread end s | "
         "enqueue s | wait s | finish s | kernel s | copy s | busy s | idle s | "
         "first kernel s | last end s |", "|---" * 15 + "|"]
    devs = row.get("split", {}).get("devices", [])
    for i, x in enumerate(row["alone"]):
        d = devs[i] if i < len(devs) else {}
        L.append(f"| {d.get('device', i)} | {x['users'][0]}–{x['users'][1]} | "
                 f"{f(x['wall_s'])} | {f(x['gil_gap_s'])} | " + " | ".join(
                     f(d.get(k)) for k in ("thread_start_s", "thread_end_s", "enqueue_s",
                                           "wait_s", "finish_s", "kernel_s", "copy_s",
                                           "device_busy_s", "device_idle_s", "first_start_s",
                                           "last_end_s")) + " |")
    return "\n".join(L) + "\n"


def main(argv=None):
    """Parse the arguments, measure, write the report."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="gpu:all",
                   help='devices: one spec ("gpu:all") or specs separated by ";"')
    p.add_argument("--users", type=int, default=1_000_000)
    p.add_argument("--items", type=int, default=1_000_000)
    p.add_argument("--factors", type=int, default=128)
    p.add_argument("--N", type=int, default=10)
    p.add_argument("--seen-per-user", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    import clmf
    from clmf.engine.device import device_label, select_devices
    spec = a.device.split(";") if ";" in a.device else a.device
    devs = select_devices(spec)
    meta = {"device": " + ".join(device_label(d) for d in devs),
            "driver": " + ".join(d.driver_version for d in devs), "date": _now(),
            "commit": _commit(), "host": platform.node(), "command": " ".join(sys.argv),
            "data": f"{a.users:,} users × {a.items:,} items, f = {a.factors}, N = {a.N}, "
                    f"{a.seen_per_user} seen items per user", "reps": a.reps,
            "clmf": clmf.__version__}
    row = measure(a, devs)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recommend_scaling.json").write_text(json.dumps({"meta": meta, "result": row},
                                                           indent=1) + "\n")
    (out / "recommend_scaling.md").write_text(markdown(meta, row))
    print(markdown(meta, row))


if __name__ == "__main__":
    main()
