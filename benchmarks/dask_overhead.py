"""The Dask backend's per-iteration overhead on CPU devices (issue 28): ``clmf.dask.ALS`` on a
LocalCluster of one single-threaded worker process per device against the in-process fit on the
same devices (``clmf.ALS(device=[...])``), the workers' own loop (``CLMF_DASK_WORKER_LOOP=1``,
one task per iteration) and the tasks per half-step (``=0``) alternately, on one data set.

    POCL_DEVICES="pthread pthread" python benchmarks/dask_overhead.py --rounds 3 \
        --iterations 8 [--data ml100k|synthetic|wide] [--staging] [--paths inprocess,dask_loop]

The in-process fit takes the first ``--workers`` devices of the platform named by ``--device``;
each Dask worker the ``rank``-th (``device="cpu"`` picks by type: give the workers only those
devices, e.g. OCL_ICD_VENDORS naming PoCL alone).

Prints the median s/it of each (iterations after the first of each fit), the absolute
overhead over in-process in ms per iteration and, for the workers' loop, the client's wall
per iteration beyond the workers' own time; ``--json PATH`` writes the record.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time

import numpy as np


def data(kind, seed=0):
    """The ratings: ML-100K from the shared data, a synthetic 1M-rating set, or a wide one
    (``wide``: 400K users × 4K items, 2M ratings — many factor rows to exchange per rating, as
    the Netflix shape's users on GPUs)."""
    import scipy.sparse as sp
    if kind == "ml100k":
        import pandas as pd
        path = os.path.join(os.environ.get("CLMF_DATA", "/work/shared/data"), "ml-100k/u.data")
        raw = pd.read_csv(path, sep="\t", names=["user", "item", "rating", "ts"])
        u, i = raw.user.to_numpy() - 1, raw.item.to_numpy() - 1
        return sp.csr_matrix((raw.rating.to_numpy(np.float32), (u, i)))
    rng = np.random.default_rng(seed)
    m, n, nnz = (400_000, 4_000, 2_000_000) if kind == "wide" else (20_000, 2_000, 1_000_000)
    keys = np.unique(rng.integers(0, m * n, int(nnz * 1.05)))[:nnz]
    return sp.csr_matrix((rng.uniform(1, 5, len(keys)).astype(np.float32),
                          (keys // n, keys % n)), shape=(m, n))


def main(argv=None):
    """Run the comparison; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="ml100k", choices=["ml100k", "synthetic", "wide"])
    ap.add_argument("--factors", type=int, default=32)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="Portable")
    ap.add_argument("--json", default=None)
    ap.add_argument("--paths", default="inprocess,dask_loop,dask_halfsteps",
                    help="which fits, comma-separated (inprocess, dask_loop, dask_halfsteps)")
    ap.add_argument("--staging", action="store_true",
                    help="the workers' rows through page-locked staging arrays, as on GPUs "
                         "(CLMF_DASK_PINNED_STAGING=1 in the workers' environment)")
    args = ap.parse_args(argv)
    if args.staging:
        os.environ["CLMF_DASK_PINNED_STAGING"] = "1"
    logging.basicConfig(level=logging.WARNING)
    import distributed
    import pyopencl as cl

    import clmf
    import clmf.dask
    R = data(args.data)
    devs = [d for p in cl.get_platforms() if args.device.lower() in p.name.lower()
            for d in p.get_devices()][:args.workers]
    if len(devs) < args.workers:
        raise SystemExit(f"{len(devs)} {args.device} device(s), {args.workers} wanted (PoCL: "
                         'POCL_DEVICES="pthread pthread")')
    kw = dict(factors=args.factors, regularization=0.1, iterations=args.iterations + 1,
              random_state=0, solver="cholesky")
    cluster = distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1,
                                       processes=True, dashboard_address=None, silence_logs=40)
    client = distributed.Client(cluster)
    runs = {k: [] for k in args.paths.split(",")}
    parts = []           # the workers' loop: per iteration after the first, the slowest's parts
    rmse = {}
    # the workers' loop: the client's wall around each call against the workers' own seconds
    # (iterations and metrics) — what a group costs beyond the workers' work
    from clmf.parallel.dask_backend import DaskEngine
    real, beyond = DaskEngine.iteration, []

    def timed(self, *a, count=1, **k):
        """DaskEngine.iteration, its wall beyond the workers' seconds kept (groups)."""
        t = time.perf_counter()
        res = real(self, *a, count=count, **k)
        if res and count > 1:
            beyond.append((time.perf_counter() - t - sum(c + m for c, _s, m in res)) / count)
        return res
    DaskEngine.iteration = timed
    try:
        for r in range(args.rounds):
            for key in runs:
                if key == "inprocess":
                    m = clmf.ALS(device=devs, **kw).fit(R, show_progress=False)
                else:
                    os.environ["CLMF_DASK_WORKER_LOOP"] = "1" if key == "dask_loop" else "0"
                    m = clmf.dask.ALS(client=client, device=args.device, **kw).fit(
                        R, show_progress=False)
                secs = [h["seconds"] for h in m.history_][1:]
                runs[key] += secs
                for per in getattr(m, "fit_times_", {}).get("loop", [])[1:]:
                    parts.append({k: max(p[k] for p in per) for k in per[0]})
                rmse[key] = float(m.history_[-1].get("train_rmse", np.nan))
                print(f"round {r} {key}: median {np.median(secs) * 1e3:.2f} ms/it",
                      flush=True)
    finally:
        client.close()
        cluster.close()
    med = {k: float(np.median(v)) for k, v in runs.items()}
    ref = med.get("inprocess", np.nan)
    rec = {"data": args.data, "shape": list(R.shape), "nnz": int(R.nnz),
           "factors": args.factors, "workers": args.workers, "device": args.device,
           "s_per_it": med, "train_rmse": rmse,
           "overhead_ms": {k: 1e3 * (med[k] - ref) for k in med},
           "loop_beyond_workers_ms": 1e3 * float(np.median(beyond)) if beyond else None,
           "loop_parts_ms": ({k: 1e3 * float(np.median([p[k] for p in parts]))
                              for k in parts[0]} if parts else None),
           "staging": bool(args.staging), "clmf": __import__("clmf").__file__,
           "ratio": {k: med[k] / ref for k in med},
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    for k in med:
        print(f"{k:15s} {med[k] * 1e3:8.2f} ms/it  ×{rec['ratio'][k]:.2f}  "
              f"+{rec['overhead_ms'][k]:.2f} ms/it  rmse {rmse[k]:.5f}")
    if parts:
        print("workers' loop, median of the slowest worker's parts (ms/it): " + ", ".join(
            f"{k} {v:.2f}" for k, v in rec["loop_parts_ms"].items()))
    if beyond:
        print(f"workers' loop: {rec['loop_beyond_workers_ms']:.2f} ms/it of client wall beyond "
              "the workers' own time (groups after the first iteration)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rec, fh, indent=1)


if __name__ == "__main__":
    main()
