#!/usr/bin/env python3
"""Scale-out runs of issue 28: the in-process fit on the first 1, 2, 4, … GPUs of one host.

    python benchmarks/scaleout.py OUTDIR --preset netflix [--fraction 1] [--gpus 1,2,4]
        [--factors 100] [--iterations 4] [--budget 40] [--tag new] [--cache DIR]
        [--shape USERSxITEMSxRATINGS] [--modes USERS,ITEMS] [--solver cg] [--devices cpu]
        [--reduce-sum host,device]

For each device count: :func:`clmf.parallel.scaling.timed_fit` (build, one warm-up iteration,
then up to ``--iterations`` timed ones within ``--budget`` seconds): build and warm-up seconds,
median s/it, the split of an iteration (compute, exchange, the devices' busy times), the memory
plan and a sampled train RMSE; speedup and efficiency against the same run's one-GPU s/it.
Rows are appended to ``OUTDIR/scaleout.jsonl`` and ``OUTDIR/summary.md`` as they come (a
timeout keeps what was measured), with device, driver, date and commit.

``--tag`` names the code under test: run the same command with ``PYTHONPATH`` pointing at
another build of clmf (e.g. the commit before a change, unpacked from its wheel) and another
tag to compare two versions side by side on one machine. ``--cache DIR`` keeps the generated
layout as ``.npy`` files (memory-mapped on the next run: both versions read the same ratings
without generating them twice). ``--shape`` overrides the preset's shape and ratings (before
``--fraction``), ``--modes`` the partition rule's replicate / reduce choice (e.g.
``replicate,reduce``: the items' partial systems reduced), for small runs on CPU devices.
``--reduce-sum`` runs each count of several devices once per way of summing the reduce mode's
partial systems (``host``: host threads; ``device``: on the owner devices, the default), one
after the other (side by side in one command; the one-device run once).
The summary's reduce column (the reduce mode's split, seconds per iteration): the host's sums
(threads' seconds, overlapped; 0 with device sums, made by the unpack kernels), the devices'
copies of the reduced systems, the exposed wait; its backend column names the sums.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import traceback

import numpy as np

T0 = time.time()


def say(msg):
    """Timestamped progress line (flushed: the command may be cut off)."""
    print(f"[{time.strftime('%H:%M:%S')} +{time.time() - T0:6.1f}s] {msg}", flush=True)


def load_layout(preset, fraction, cache, shape=None):
    """The preset's layout (``shape``: ``(users, items, ratings)`` instead of the preset's):
    from ``cache`` (memory-mapped ``.npy``) when there, else generated (and saved there when
    ``cache`` is given)."""
    from clmf.parallel import synthetic_layout
    from clmf.parallel.layout import Layout, SideLayout
    name = preset if shape is None else "x".join(str(x) for x in shape)
    d = pathlib.Path(cache) / f"{name}@{fraction:g}" if cache else None
    names = [f"{s}-{a}.npy" for s in ("users", "items") for a in ("indptr", "indices", "data")]
    if d is not None and all((d / n).exists() for n in names) and (d / "shape.json").exists():
        arr = {n: np.load(d / n, mmap_mode="r") for n in names}
        shape = tuple(json.loads((d / "shape.json").read_text()))
        say(f"{preset}@{fraction:g}: layout read from {d}")
        return Layout(shape, *[SideLayout(arr[f"{s}-indptr.npy"], arr[f"{s}-indices.npy"],
                                          arr[f"{s}-data.npy"]) for s in ("users", "items")])
    layout = synthetic_layout(preset, fraction, seed=0, progress=say,
                              shape=None if shape is None else shape[:2],
                              nnz=None if shape is None else shape[2])
    if d is not None:
        d.mkdir(parents=True, exist_ok=True)
        for s in ("users", "items"):
            side = layout[s]
            for a in ("indptr", "indices", "data"):
                np.save(d / f"{s}-{a}.npy", np.asarray(getattr(side, a)))
        (d / "shape.json").write_text(json.dumps(list(layout.shape)))
        say(f"{preset}@{fraction:g}: layout saved in {d}")
    return layout


def fit_with_fallback(devs, layout, args, label, reduce_sum=None):
    """:func:`timed_fit` with the lookup's configurations; one that a device's kernel limits
    refuse is rejected (:func:`clmf.tuning.fallback.reject`, as a fit does) and the lookup asked
    again (at most 6 times)."""
    from clmf.engine.device import device_info
    from clmf.errors import InvalidConfigError
    from clmf.parallel.scaling import configs_for, timed_fit
    from clmf.tuning import fallback
    for _attempt in range(6):
        cfgs = configs_for(devs, layout, args.factors, solver=args.solver,
                           regularization=args.regularization)
        try:
            return timed_fit(devs, layout, args.factors, iterations=args.iterations,
                             budget_s=args.budget, regularization=args.regularization, say=say,
                             label=label, configs=cfgs,
                             modes=args.modes if len(devs) > 1 else None,
                             **({} if reduce_sum is None else {"reduce_sum": reduce_sum}))
        except InvalidConfigError as e:
            k = int(getattr(e, "device_index", 0) or 0)
            side = getattr(e, "side", None)
            bad = ([cfgs[k][0 if side == "users" else 1]] if side in ("users", "items")
                   else list(dict.fromkeys(cfgs[k])))
            for cfg in bad:
                fallback.reject(device_info(devs[k]), cfg, args.factors, "explicit",
                                "the scale-out benchmark's lookup", e)
            say(f"{label}: {bad} refused on device {k} ({e}); looking up again")
    raise RuntimeError(f"{label}: no configuration of the lookup runs")


def _reduce_cell(split):
    """The reduce mode's split of an iteration for the summary: host sums / device copies /
    exposed wait (``reduce_*``; an older clmf: its one ``reduce`` figure; none: blank)."""
    if "reduce_sum" in split:
        return " / ".join(f"{split.get(k, float('nan')):.4f}"
                          for k in ("reduce_sum", "reduce_copies", "reduce_wait"))
    return f"{split['reduce']:.4f} (host)" if split.get("reduce") else ""


def main(argv=None):
    """Run the device counts of one preset; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--preset", default="netflix", choices=["netflix", "netflix-4x", "hugewiki"])
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--gpus", default="1,2,4", help="device counts, comma-separated")
    ap.add_argument("--devices", default="gpu", help="device type to take them from (cpu: a "
                    "smoke test with PoCL devices)")
    ap.add_argument("--factors", type=int, default=100)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--budget", type=float, default=40.0, help="seconds of timed iterations "
                    "per device count")
    ap.add_argument("--regularization", type=float, default=0.05)
    ap.add_argument("--tag", default="new", help="name of the code under test")
    ap.add_argument("--cache", default=None, help="folder for the generated layout")
    ap.add_argument("--shape", default=None, help="USERSxITEMSxRATINGS instead of the preset's")
    ap.add_argument("--solver", default="auto", help="the lookup's solver (cg or cholesky: a "
                    "reduced side on a device whose tuned solver is the fused CG)")
    ap.add_argument("--modes", default=None, help="USERS,ITEMS: replicate or reduce each (default: "
                    "the partition rule's)")
    ap.add_argument("--packed-batch-mb", type=int, default=None,
                    help="the pipelined reduce's batch of packed systems, MiB (default: "
                    "clmf.engine.memory.PACKED_BATCH_BYTES)")
    ap.add_argument("--reduce-sum", default=None,
                    help="where the reduce mode sums, comma-separated to run each: host, device "
                    "(default: the library's)")
    args = ap.parse_args(argv)
    sums = [None]                   # the library's default (an older clmf: no such option)
    if args.reduce_sum:
        from clmf.parallel.reducer import SUM_MODES
        sums = args.reduce_sum.split(",")
        if not set(sums) <= set(SUM_MODES):
            ap.error(f"--reduce-sum takes {' / '.join(SUM_MODES)}, comma-separated")
    if args.packed_batch_mb:
        from clmf.engine import memory
        memory.PACKED_BATCH_BYTES = args.packed_batch_mb << 20
    if args.shape:
        args.shape = tuple(int(x) for x in args.shape.lower().split("x"))
        if len(args.shape) != 3:
            ap.error("--shape takes USERSxITEMSxRATINGS")
    if args.modes:
        pair = args.modes.split(",")
        if len(pair) != 2 or not set(pair) <= {"replicate", "reduce"}:
            ap.error("--modes takes two of replicate / reduce: USERS,ITEMS")
        args.modes = dict(zip(("users", "items"), pair))
    import clmf
    from clmf.engine.device import device_info
    from clmf.parallel import select_devices
    from clmf.provenance import commit
    out = pathlib.Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    devs = select_devices(f"{args.devices}:all")
    counts = [int(c) for c in args.gpus.split(",") if int(c) <= len(devs)]
    info = device_info(devs[0])
    label = (f"{args.preset}@{args.fraction:g}" if args.shape is None
             else f"{'x'.join(map(str, args.shape))}@{args.fraction:g}")
    layout = load_layout(args.preset, args.fraction, args.cache, args.shape)
    say(f"{label}: {layout.shape[0]} x {layout.shape[1]}, {layout.nnz} ratings; "
        f"{len(devs)} devices, counts {counts}; clmf {clmf.__version__} from "
        f"{os.path.dirname(clmf.__file__)} (tag {args.tag})")
    summary = out / "summary.md"
    if not summary.exists():
        summary.write_text("| tag | set | ratings | f | GPUs | s/it | speedup | efficiency | "
                           "warm-up s | build s | compute s | exchange s | kernels s | "
                           "reduce sum / copies / wait s | backend |\n"
                           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    base = None
    runs = [(k, m) for k in counts for m in (sums[:1] if k == 1 else sums)]
    for k, mode in runs:
        rec = {"tag": args.tag, "reduce_sum": mode if k > 1 else None, "set": label,
               "nnz": int(layout.nnz),
               "shape": list(layout.shape), "f": args.factors, "devices": k,
               "device": f"{info.platform} | {info.name}", "driver": info.driver,
               "commit": commit(), "clmf_path": os.path.dirname(clmf.__file__),
               "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
        try:
            what = f" {mode} sums" if mode and k > 1 else ""
            r = fit_with_fallback(devs[:k], layout, args,
                                  f"{label} [{args.tag}] {k} device(s){what}",
                                  reduce_sum=mode if k > 1 else None)
        except Exception as e:        # noqa: BLE001 - record it, go on with the next count
            rec["error"] = f"{type(e).__name__}: {e}"
            say(f"{label} {k} device(s): FAILED {rec['error']}")
            traceback.print_exc()
            with (out / "scaleout.jsonl").open("a") as fh:
                fh.write(json.dumps(rec, default=str) + "\n")
            continue
        rec.update(r)
        s = r["s_per_it"]
        base = base if base is not None else (s if k == 1 else None)
        backend = r["backend"] + (f" ({mode} sums)" if mode and k > 1 else "")
        rec["speedup"] = base / s if base else None
        rec["efficiency"] = base / s / k if base else None
        with (out / "scaleout.jsonl").open("a") as fh:
            fh.write(json.dumps(rec, default=str) + "\n")
        sp = r.get("split", {})
        kern = sp.get("kernels", sum(v for key, v in sp.items()
                                     if key in ("s1", "s2", "s3", "gram", "combine")))
        with summary.open("a") as fh:
            fh.write(f"| {args.tag} | {label} | {layout.nnz:,} | {args.factors} | {k} | {s:.4f} | "
                     + (f"{rec['speedup']:.2f}× | {rec['efficiency']:.0%} | " if base
                        else "| | ")
                     + f"{r.get('warmup_s', float('nan')):.2f} | {r['build_s']:.1f} | "
                     f"{sp.get('compute', float('nan')):.4f} | "
                     f"{sp.get('exchange', float('nan')):.4f} | {kern:.4f} | "
                     f"{_reduce_cell(sp)} | {backend} |\n")
    say(f"{label} [{args.tag}]: written to {out}")


if __name__ == "__main__":
    main()
