"""GPU runs of issue 15: clmf.dask on a LocalCluster with one worker per GPU against the
in-process multi-device fit (clmf.parallel.MultiEngine) of the same data, at f = 100.

One or more presets per command, in turn (Netflix and 4 × Netflix together fit a 10-minute
command on 4 GPUs):

    python benchmarks/dask_gpu_runs.py OUTDIR --preset netflix netflix-4x --transport shm
    python benchmarks/dask_gpu_runs.py OUTDIR --preset hugewiki --fraction 0.05

Steps, each logged with a timestamp: the synthetic set of the preset's shape
(:func:`clmf.parallel.synthetic_layout`) written as parquet files under OUTDIR/data (user, item,
rating; 8M ratings per file), the in-process fit on every GPU (``timed_fit``: warm-up + timed
iterations), then ``clmf.dask.ALS(device="gpu")`` on a LocalCluster of one single-threaded
worker process per GPU reading that parquet (raw ids mapped on the workers): time to the first
iteration (from ``fit`` entry: parquet read, id maps, blocks built, kernels compiled, one
iteration), s/it (median of the iterations after the first) and the train RMSE; with
``--halfsteps`` also the path before the workers' own loop (a task per half-step). Writes
OUTDIR/dask-<preset>_<fraction>.json after each fit and appends a row per Dask fit to
OUTDIR/summary.md.

The GPU image has no dask: install the wheels listed in README "Scaling out with Dask" first.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys
import time

import numpy as np

T0 = time.time()


def say(msg):
    """Progress line with a timestamp (flushed: the command may be cut off)."""
    print(f"[{time.strftime('%H:%M:%S')} +{time.time() - T0:6.1f}s] {msg}", flush=True)


def write_parquet(layout, directory, rows_per_file=8 << 20):
    """The layout's ratings as parquet files of (user, item, rating), user-row blocks."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    directory.mkdir(parents=True, exist_ok=True)
    ip = np.asarray(layout.users.indptr)
    starts = np.searchsorted(ip, np.arange(0, layout.nnz, rows_per_file), side="right") - 1
    cuts = np.unique(np.append(starts, layout.users.rows))
    for k, (r0, r1) in enumerate(zip(cuts[:-1], cuts[1:])):
        e0, e1 = int(ip[r0]), int(ip[r1])
        u = np.repeat(np.arange(r0, r1, dtype=np.int32), np.diff(ip[r0:r1 + 1]))
        pq.write_table(pa.table({"user": u, "item": np.asarray(layout.users.indices[e0:e1]),
                                 "rating": np.asarray(layout.users.data[e0:e1])}),
                       directory / f"part-{k:05d}.parquet")
    return len(cuts) - 1


def dask_fit(args, pdir, workers, transport, label, loop=True):
    """``clmf.dask.ALS`` on a LocalCluster of one single-threaded worker process per device,
    blocks through shared memory (``transport`` "shm") or Dask's comms ("comms": the workers
    get ``CLMF_DASK_SHARED_MEMORY=0``), the workers running their own loop (``loop``: one task
    per group of iterations) or tasks per half-step (``CLMF_DASK_WORKER_LOOP=0``, the path
    before); returns its record."""
    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    import clmf.dask
    old = os.environ.get("CLMF_DASK_SHARED_MEMORY")
    os.environ["CLMF_DASK_SHARED_MEMORY"] = "0" if transport == "comms" else "1"
    try:
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               memory_limit=0, dashboard_address=None)
    finally:
        if old is None:
            os.environ.pop("CLMF_DASK_SHARED_MEMORY")
        else:
            os.environ["CLMF_DASK_SHARED_MEMORY"] = old
    client = Client(cluster)
    os.environ["CLMF_DASK_WORKER_LOOP"] = "1" if loop else "0"     # read by the client
    try:
        def cb(it, t, metrics):
            """Log each iteration."""
            say(f"{label}: iteration {it}: {metrics}")

        t = time.time()
        model = clmf.dask.ALS(client=client, factors=args.factors,
                              regularization=args.regularization, iterations=args.iterations + 1,
                              device=args.devices, random_state=0).fit(
            dd.read_parquet(str(pdir)), show_progress=False, callback=cb)
        fit_s = time.time() - t
        secs = [h["seconds"] for h in model.history_]
        rec = {"workers": workers, "fit_s": fit_s, "transport": model.transport_,
               "worker_loop": bool(loop),
               "time_to_first_iteration_s": model.time_to_first_iteration_,
               "set_up": model.fit_times_,
               "iter_s": secs, "s_per_it": float(np.median(secs[1:] or secs)),
               # the iterations after the first as the fit's wall saw them (metrics included)
               "wall_per_it_after_first": (fit_s - model.time_to_first_iteration_)
               / max(1, len(secs) - 1),
               "devices": model.device_, "train_rmse": model.history_[-1]["train_rmse"],
               "modes": {s: model.plan_[s].mode for s in ("users", "items")},
               "memory": model.memory_, "clmf": clmf.__file__}
        loop_parts = model.fit_times_.get("loop", [])[1:]      # (this branch on: the parts)
        if loop_parts:
            # per iteration after the first, the slowest worker's part; medians (s)
            rec["loop_parts"] = {k: float(np.median([max(p[k] for p in per)
                                                     for per in loop_parts]))
                                 for k in loop_parts[0][0]}
            say(f"{label}: workers' loop parts (median s/it) " + ", ".join(
                f"{k} {v:.4f}" for k, v in rec["loop_parts"].items()))
        for d, b in enumerate(model.fit_times_.get("board") or []):
            say(f"{label}: worker {d}'s board: staged {b['staged']}, published by "
                f"{b['publish']}" + "".join(f", {k} {v:.1f} GB/s"
                                           for k, v in b["copy_gbs"].items()))
        say(f"{label}: {rec['s_per_it']:.4f} s/it through {model.transport_}, first "
            f"iteration after {model.time_to_first_iteration_:.1f} s")
        return rec
    finally:
        os.environ.pop("CLMF_DASK_WORKER_LOOP", None)
        client.close()
        cluster.close()


def run_preset(args, preset, gpus, out):
    """One preset: data, the in-process fit, the Dask fit(s); its record written to
    OUTDIR/dask-<preset>_<fraction>.json and a row per Dask fit appended to OUTDIR/summary.md."""
    from clmf.engine.device import device_info
    from clmf.parallel import synthetic_layout
    from clmf.parallel.scaling import timed_fit
    from clmf.provenance import commit
    label = f"{preset}@{args.fraction:g}"
    rec = {"preset": preset, "fraction": args.fraction, "factors": args.factors,
           "regularization": args.regularization, "gpus": [device_info(d).name for d in gpus],
           "commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
    say(f"{label}: generating on the host ({len(gpus)} devices)")
    layout = synthetic_layout(preset, args.fraction, seed=0)
    rec["shape"], rec["nnz"] = list(layout.shape), int(layout.nnz)
    say(f"{label}: {layout.shape[0]} x {layout.shape[1]}, {layout.nnz} ratings")
    pdir = (pathlib.Path(args.data_dir) if args.data_dir else out / "data") / label
    if not pdir.exists():
        files = write_parquet(layout, pdir)
        say(f"{label}: {files} parquet files in {pdir}")
    if not args.skip_inprocess:
        r = timed_fit(gpus, layout, args.factors, iterations=args.iterations,
                      budget_s=args.budget, single=False, regularization=args.regularization,
                      say=say, label=f"{label} in-process")
        rec["inprocess"] = {k: r[k] for k in ("backend", "build_s", "warmup_s", "iter_s",
                                              "s_per_it", "split", "plan", "train_rmse_sample")
                            if k in r}
    del layout
    transports = ["shm", "comms"] if args.transport == "both" else [args.transport]
    runs = [(tr, True) for tr in transports] + ([("shm", False)] if args.halfsteps else [])
    ip = rec.get("inprocess", {}).get("s_per_it")
    name = f"dask-{preset}_{args.fraction:g}.json"          # no '@': the device tool skips it
    for tr, loop in runs:
        key = "dask" if (tr, loop) == runs[0] else f"dask_{tr}" + ("" if loop else "_halfsteps")
        rec[key] = dask_fit(args, pdir, len(gpus), tr,
                            f"{label} dask ({tr}{'' if loop else ', half-step tasks'})", loop)
        if ip:
            rec[f"{key}_over_inprocess"] = rec[key]["s_per_it"] / ip
        (out / name).write_text(json.dumps(rec, indent=1, default=str))
        summary = out / "summary.md"
        if not summary.exists():
            summary.write_text("| set | ratings | f | GPUs | in-process s/it | dask transport | "
                               "dask s/it | dask / in-process | dask time to 1st it (s) |\n"
                               "|---|---|---|---|---|---|---|---|---|\n")
        d = rec[key]
        ratio = d["s_per_it"] / ip if ip else float("nan")
        how = d["transport"] + ("" if loop else " (half-step tasks)")
        with summary.open("a") as fh:
            fh.write(f"| {label} | {rec['nnz']:,} | {args.factors} | {len(gpus)} | "
                     f"{ip if ip is None else f'{ip:.4f}'} | {how} | "
                     f"{d['s_per_it']:.4f} | {ratio:.3f} | "
                     f"{d['time_to_first_iteration_s']:.1f} |\n")
    (out / name).write_text(json.dumps(rec, indent=1, default=str))
    say(f"{label}: written to {out / name}")


def main(argv=None):
    """Run the presets in turn; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--preset", default=["netflix"], nargs="+",
                    choices=["netflix", "hugewiki", "netflix-4x"],
                    help="one or more presets, run in turn (a CPU smoke test: --devices cpu "
                    "--fraction 0.002)")
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--factors", type=int, default=100)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--regularization", type=float, default=0.05)
    ap.add_argument("--budget", type=float, default=120.0, help="seconds for the timed "
                    "in-process iterations")
    ap.add_argument("--skip-inprocess", action="store_true")
    ap.add_argument("--data-dir", default=None, help="folder for the parquet files (default "
                    "OUTDIR/data)")
    ap.add_argument("--transport", default="both", choices=["shm", "comms", "both"],
                    help="how the Dask workers pass blocks (both: shared memory, then comms)")
    ap.add_argument("--halfsteps", action="store_true", help="also the Dask fit with a task "
                    "per half-step (CLMF_DASK_WORKER_LOOP=0: the path before the workers' "
                    "own loop) through shared memory")
    ap.add_argument("--devices", default="gpu", choices=["gpu", "cpu"],
                    help="device type, one worker per device (cpu: a smoke test)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for name in ("distributed", "tornado"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from clmf.parallel import select_devices
    out = pathlib.Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    gpus = select_devices(f"{args.devices}:all")
    for preset in args.preset:
        run_preset(args, preset, gpus, out)


if __name__ == "__main__":
    main()
