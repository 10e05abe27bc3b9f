"""Time to the first iteration of ``clmf.dask.ALS`` against the in-process fit on the same
devices (issue 28), with the set-up's stages per worker.

A LocalCluster of one single-threaded worker process per device (``--fresh``: a new one for
every Dask fit, as ``benchmarks/dask_gpu_runs.py`` makes); the data a synthetic set of a preset's
shape (:func:`clmf.parallel.synthetic_layout`) written as parquet files (user, item, rating; in a
temporary folder) that the Dask fit reads (``dd.read_parquet``: raw ids mapped on the workers);
the in-process fit ``clmf.ALS(device=[...])`` takes the same ratings as a scipy CSR, its programs
loaded afresh from the on-disk caches each time. Round 0 warms both; the later rounds alternate
the two fits. Per fit: the seconds from ``fit`` entry to the end of the first iteration, the
set-up's stages (``fit_times_`` / ``timings_``) and every worker's own stages. Writes
OUT/setup.json and OUT/README.md (a table with device, driver, date, commit and the command)
after every round.

CPU (PoCL ``pthread`` devices, a tiny size; about a minute)::

    POCL_DEVICES="pthread pthread" python benchmarks/dask_setup.py OUT --devices Portable \\
        --preset netflix --fraction 0.002 --factors 16 --rounds 2 --fresh

GPUs (one worker per GPU; the Netflix shape on 4 H100s in about 4 minutes)::

    python benchmarks/dask_setup.py $OUT/dask-setup --devices gpu --preset netflix --rounds 3 \\
        --fresh
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import shlex
import sys
import time

import numpy as np

T0 = time.time()


def say(msg):
    """A progress line with a timestamp (flushed: the command may be cut off)."""
    print(f"[{time.strftime('%H:%M:%S')} +{time.time() - T0:6.1f}s] {msg}", flush=True)


def select(kind):
    """The devices: ``gpu``/``cpu`` (every device of that type) or a platform name's part."""
    import pyopencl as cl

    from clmf.parallel import select_devices
    if kind in ("gpu", "cpu"):
        return select_devices(f"{kind}:all")
    return [d for p in cl.get_platforms() if kind.lower() in p.name.lower()
            for d in p.get_devices()]


def inprocess_fit(R, devs, kw):
    """The in-process fit: ``(time to the end of the first iteration, its set-up stages)``; its
    programs are loaded afresh (from the on-disk cache, as a new worker process does)."""
    import clmf
    from clmf.engine import kernels
    with kernels._plock:
        kernels._programs.clear()
    m = clmf.ALS(device=devs, iterations=1, **kw).fit(R, show_progress=False)
    t = m.timings_
    keys = ("validation", "tuning", "plan", "engine", "start_factors", "factors_upload",
            "setup", "build", "build_wait", "upload", "transpose", "buffers")
    return t["setup"] + m.history_[0]["seconds"], {k: t[k] for k in keys if k in t}


def dask_fit(client, pdir, device, kw):
    """The Dask fit from parquet: ``(time to the first iteration's end, fit_times_)``, the
    latter with ``tasks``: per kind of task (its key's prefix) and action (``compute``, or
    ``transfer``: its inputs fetched from other workers) ``[kind, action, count, summed
    seconds, first start, last end]`` from ``fit`` entry (Dask's task stream)."""
    import dask.dataframe as dd
    import distributed
    from dask_timeline import task_summary  # benchmarks/: one copy

    import clmf.dask
    with distributed.get_task_stream(client) as ts:
        t0 = time.time()
        m = clmf.dask.ALS(client=client, device=device, iterations=1, **kw).fit(
            dd.read_parquet(str(pdir)), show_progress=False)
    tasks = task_summary(ts.data, t0)
    stages = dict(m.fit_times_)
    stages["tasks"] = sorted(([k[0], k[1], *v] for k, v in tasks.items()), key=lambda r: r[4])
    return m.time_to_first_iteration_, stages


def table(rec):
    """The README of a record: what ran where, and the medians per stage."""
    rows = rec["rounds"][1:] or rec["rounds"]
    ip = float(np.median([r["inprocess_s"] for r in rows]))
    dk = float(np.median([r["dask_s"] for r in rows]))
    lines = [f"# clmf.dask time to the first iteration against in-process ({rec['label']})", "",
             f"{len(rec['devices'])} × {rec['devices'][0]} (driver {rec['driver']}), "
             f"{rec['date']}, commit {rec['commit']}, f = {rec['factors']}, "
             f"{rec['shape'][0]:,} × {rec['shape'][1]:,}, {rec['nnz']:,} ratings; one "
             "single-threaded Dask worker process per device (LocalCluster), the in-process "
             "fit `clmf.ALS(device=[...])` on the same devices (its programs loaded afresh "
             "from the on-disk cache each time); "
             + ("a new cluster for every Dask fit (its workers import clmf and load their "
                "programs within the fit); " if rec["fresh"] else "one cluster; ")
             + "round 0 warms both (not in the medians), then the two alternate."
             + (f" {rec['note']}" if rec.get("note") else ""), "",
             "    " + rec["command"], "",
             "| round | in-process (s) | dask (s) | dask ÷ in-process |", "|---|---|---|---|"]
    for k, r in enumerate(rec["rounds"]):
        lines.append(f"| {k}{' (warm-up)' if k == 0 and len(rec['rounds']) > 1 else ''} | "
                     f"{r['inprocess_s']:.3f} | {r['dask_s']:.3f} | "
                     f"{r['dask_s'] / r['inprocess_s']:.2f} |")
    lines += [f"| median | {ip:.3f} | {dk:.3f} | {dk / ip:.2f} |", "",
              "Dask set-up stages of the last round (client side, s):", ""]
    last = rec["rounds"][-1]["dask_stages"]
    flat = {k: v for k, v in last.items() if isinstance(v, (int, float))}
    for group in ("prepare", "engine", "probe"):
        flat.update({f"{group}.{k}": v for k, v in last.get(group, {}).items()
                     if isinstance(v, (int, float))})
    for d, times in last.get("probe", {}).items():
        flat.update({f"probe (worker {d}).{k}": v for k, v in times.items()})
    lines += ["| stage | s |", "|---|---|"] + [f"| {k} | {v:.3f} |" for k, v in flat.items()]
    lines += ["", "Each worker's own stages in the last round (s):", ""]
    ws = last.get("workers", [])
    keys = sorted({k for w in ws for k in w})
    lines += ["| stage | " + " | ".join(f"worker {d}" for d in range(len(ws))) + " |",
              "|---|" + "---|" * len(ws)]
    lines += [f"| {k} | " + " | ".join(f"{w.get(k, 0.0):.3f}" for w in ws) + " |"
              for k in keys]
    if last.get("tasks"):
        lines += ["", "The last round's Dask tasks by kind (Dask's task stream; seconds from `fit` "
                  "entry; `transfer`: inputs fetched from other workers):", "",
                  "| task | action | n | summed s | first start | last end |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {k} | {a} | {n} | {tot:.3f} | {first:.3f} | {end:.3f} |"
                  for k, a, n, tot, first, end in last["tasks"]]
    lines += ["", "In-process set-up stages of the last round (s):", "", "| stage | s |",
              "|---|---|"] + [f"| {k} | {v:.3f} |"
                              for k, v in rec["rounds"][-1]["inprocess_stages"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None):
    """Run the comparison; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--devices", default="gpu", help="gpu, cpu or a platform name's part "
                    "(e.g. Portable with POCL_DEVICES='pthread pthread')")
    ap.add_argument("--workers", type=int, default=None, help="devices used (default: all)")
    ap.add_argument("--preset", default="netflix")
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--factors", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the first a warm-up")
    ap.add_argument("--fresh", action="store_true", help="a new LocalCluster for every Dask "
                    "fit (the workers import clmf, open their devices and load the programs "
                    "within the fit, as in benchmarks/dask_gpu_runs.py); else one cluster "
                    "warmed by round 0")
    ap.add_argument("--note", default="", help="a sentence for the README (e.g. which code "
                    "ran, when it is not the checkout's)")
    ap.add_argument("--data-dir", default=None, help="folder for the parquet files (default: a "
                    "temporary folder, removed at the end; never OUTDIR, whose files come back "
                    "from a device run)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import shutil

    import distributed
    import scipy.sparse as sp

    import clmf
    from clmf.engine.device import device_info
    from clmf.parallel import synthetic_layout
    from clmf.provenance import commit
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dask_gpu_runs import write_parquet
    out = pathlib.Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    devs = select(args.devices)[:args.workers]
    if len(devs) < (args.workers or 1):
        raise SystemExit(f"{len(devs)} device(s) of {args.devices!r}")
    infos = [device_info(d) for d in devs]
    label = f"{args.preset}@{args.fraction:g}, {len(devs)} devices"
    say(f"{label}: generating")
    layout = synthetic_layout(args.preset, args.fraction, seed=0)
    u = layout.users
    R = sp.csr_matrix((np.asarray(u.data), np.asarray(u.indices), np.asarray(u.indptr)),
                      shape=layout.shape)
    import tempfile
    own_data = None if args.data_dir else tempfile.mkdtemp(prefix="clmf-dask-setup-")
    pdir = pathlib.Path(args.data_dir or own_data) / f"{args.preset}_{args.fraction:g}"
    if not pdir.exists():
        say(f"{label}: {write_parquet(layout, pdir)} parquet files in {pdir}")
    rec = {"label": label, "preset": args.preset, "fraction": args.fraction,
           "shape": list(layout.shape), "nnz": int(layout.nnz), "factors": args.factors,
           "devices": [i.name for i in infos], "platform": infos[0].platform,
           "driver": infos[0].driver, "commit": commit(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": shlex.join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
           "env": {k: os.environ[k] for k in ("POCL_DEVICES",) if k in os.environ},
           "fresh": bool(args.fresh), "note": args.note,
           "clmf": os.path.dirname(clmf.__file__), "rounds": []}
    del layout
    kw = dict(factors=args.factors, regularization=0.05, random_state=0)
    # the workers take the k-th device of the type (gpu/cpu) or of the named platform
    spec = args.devices if args.devices in ("gpu", "cpu") else devs[0].platform.name.strip()
    def start():
        """A LocalCluster of one single-threaded worker process per device, and its client."""
        cluster = distributed.LocalCluster(n_workers=len(devs), threads_per_worker=1,
                                           processes=True, memory_limit=0,
                                           dashboard_address=None, silence_logs=logging.ERROR)
        return cluster, distributed.Client(cluster)

    cluster, client = (None, None) if args.fresh else start()
    try:
        for r in range(args.rounds):
            row = {}
            order = ("inprocess", "dask") if r % 2 == 0 else ("dask", "inprocess")
            for key in order:
                if key == "inprocess":
                    row["inprocess_s"], row["inprocess_stages"] = inprocess_fit(R, devs, kw)
                elif args.fresh:           # new worker processes: nothing imported or built
                    cl_, c_ = start()
                    try:
                        row["dask_s"], row["dask_stages"] = dask_fit(c_, pdir, spec, kw)
                    finally:
                        c_.close()
                        cl_.close()
                else:
                    row["dask_s"], row["dask_stages"] = dask_fit(client, pdir, spec, kw)
                say(f"round {r} {key}: {row[key + '_s']:.3f} s to the first iteration")
            rec["rounds"].append(row)
            say(f"round {r}: dask ÷ in-process {row['dask_s'] / row['inprocess_s']:.2f}")
            (out / "setup.json").write_text(json.dumps(rec, indent=1, default=str))
            (out / "README.md").write_text(table(rec))
    finally:
        if client is not None:
            client.close()
            cluster.close()
        if own_data:
            shutil.rmtree(own_data, ignore_errors=True)
    print(table(rec))


if __name__ == "__main__":
    main()
