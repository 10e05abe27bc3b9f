"""Where a ``clmf.dask`` fit's time goes, task by task (issue 28): a fresh LocalCluster of one
single-threaded worker process per device fits a parquet folder for one iteration under Dask's
task stream; prints the fit's stages (``fit_times_``) and, per kind of task (its key's prefix)
and action (``compute``, or ``transfer``: its inputs fetched from other workers), how many ran,
their summed seconds and the first start and last end from ``fit`` entry.

    POCL_DEVICES="pthread pthread" python benchmarks/dask_timeline.py PARQUET_DIR \\
        --workers 2 --device Portable --factors 16 [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import time


def task_summary(records, t0):
    """Dask's task-stream ``records`` summed per kind of task (its key's prefix) and action:
    ``{(kind, action): (count, summed seconds, first start, last end)}``, times from ``t0``."""
    tasks = {}
    for t in records:
        key = t["key"] if isinstance(t["key"], str) else str(t["key"][0])
        kind = key.split("-")[0].strip("('")
        for s in t["startstops"]:
            n, total, first, last = tasks.get((kind, s["action"]), (0, 0.0, float("inf"), 0.0))
            tasks[(kind, s["action"])] = (n + 1, total + s["stop"] - s["start"],
                                          min(first, s["start"] - t0), max(last, s["stop"] - t0))
    return tasks


def main(argv=None):
    """Run the fit; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parquet")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="Portable")
    ap.add_argument("--factors", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import dask.dataframe as dd
    import distributed

    import clmf
    import clmf.dask
    cluster = distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1,
                                       processes=True, dashboard_address=None, silence_logs=40)
    client = distributed.Client(cluster)
    try:
        with distributed.get_task_stream(client) as ts:
            t0 = time.time()
            m = clmf.dask.ALS(client=client, factors=args.factors, iterations=1,
                              device=args.device, random_state=0).fit(
                dd.read_parquet(args.parquet), show_progress=False)
            fit_s = time.time() - t0
    finally:
        client.close()
        cluster.close()
    tasks = task_summary(ts.data, t0)
    print(f"{clmf.__file__}: fit {fit_s:.2f} s, first iteration after "
          f"{m.time_to_first_iteration_:.2f} s")
    print({k: v for k, v in m.fit_times_.items() if k not in ("workers", "loop")})
    print(f"{'task':22s} {'action':9s} {'n':>4s} {'sum s':>7s} {'first':>7s} {'last':>7s}")
    for (kind, action), (n, total, first, last) in sorted(tasks.items(),
                                                          key=lambda kv: kv[1][2]):
        print(f"{kind:22s} {action:9s} {n:4d} {total:7.3f} {first:7.3f} {last:7.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"clmf": clmf.__file__, "fit_s": fit_s,
                       "time_to_first_iteration_s": m.time_to_first_iteration_,
                       "fit_times": m.fit_times_,
                       "tasks": [[k[0], k[1], *v] for k, v in tasks.items()]},
                      fh, indent=1, default=str)


if __name__ == "__main__":
    main()
