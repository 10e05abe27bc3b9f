#!/usr/bin/env python3
"""The GPU scaling runs of issue 14, each step bounded, results written as they come.

    python scripts/scale_runs.py OUTDIR [--which STEP[,STEP...]] [--fraction F] [--iterations N]

Steps (``--which``, default all, in this order):

* ``netflix4x``  — the 4×-Netflix shape (1.92M × 71K, 396M ratings) at f = 100 on one GPU
  (streamed if the memory plan says so); s/it.
* ``netflix``    — the Netflix shape at f = 10/50/100 on 1 GPU (the single-device engine) and
  on 2 GPUs (``clmf.parallel.MultiEngine``); speedup and scaling efficiency.
* ``hugewiki2``  — the Hugewiki shape (50M × 39,780, 3.1B ratings) × ``--fraction`` at f = 100
  on 2 GPUs.
* ``hugewiki1``  — the same on one GPU out of core (``max_device_memory`` capped so that only
  ``--ooc-share`` of the ratings fit: streamed).
* ``hugewiki1r`` — the same on one GPU, resident (when it fits).

Every step prints timestamped progress, writes ``OUTDIR/STEP.json`` after each measurement and
appends its rows to ``OUTDIR/summary.md`` (a timeout keeps what was measured). Per-iteration
time is split into compute (until the slowest device's kernels end), exchange (the tail after
that: the solved rows all-gathered) and, with profiling, the devices' busy times of kernels,
streamed rating copies and exchange copies. Device, driver, date and commit are recorded.
"""
import argparse
import datetime
import json
import os
import sys
import time
import traceback

import numpy as np

T0 = time.time()


def say(msg):
    """Timestamped progress line."""
    print(f"[{datetime.datetime.utcnow():%H:%M:%S} +{time.time() - T0:7.1f}s] {msg}", flush=True)


def provenance(devices):
    """Device, driver, date and commit."""
    from clmf.device import device_info
    from clmf.provenance import commit
    return {"date": datetime.datetime.utcnow().isoformat(timespec="seconds") + "Z",
            "commit": commit(),
            "devices": [{"name": i.name, "platform": i.platform, "driver": i.driver,
                         "global_mem": i.global_mem, "max_alloc": i.max_alloc}
                        for i in (device_info(d) for d in devices)]}


def configs_for(devices, layout, f):
    """Each device's tuned configuration pair (ALS's own lookup, solver auto)."""
    import clmf
    from clmf.device import device_info
    from clmf.model import _side_stats
    m, n = layout.shape
    stats = {"users": _side_stats(layout.users.counts(), n),
             "items": _side_stats(layout.items.counts(), m)}
    est = clmf.ALS(factors=f, regularization=0.05)
    out = []
    for d in devices:
        ch = est._resolve_configs(device_info(d), stats)
        out.append((ch["users"].config, ch["items"].config))
    return out


def sample_triples(layout, k=1_000_000, seed=0):
    """``k`` random training ratings as triples (RMSE check)."""
    rng = np.random.default_rng(seed)
    e = np.sort(rng.integers(0, layout.nnz, size=min(k, layout.nnz)))
    u = np.searchsorted(layout.users.indptr, e, side="right") - 1
    return u.astype(np.int32), np.asarray(layout.users.indices[e]), np.asarray(layout.users.data[e])


def timed_fit(devices, layout, f, iterations, budget_s, single=False, max_device_memory=None,
              label=""):
    """Build the backend, run a warm-up iteration and up to ``iterations`` timed ones within
    ``budget_s``; returns a dict of times."""
    import scipy.sparse as sp
    from clmf import reference
    from clmf.engine import Engine
    from clmf.parallel import MultiEngine
    t0 = time.time()
    cfgs = configs_for(devices, layout, f)
    say(f"{label}: configs {[(str(a), str(b)) for a, b in cfgs]}")
    if single:
        R = sp.csr_matrix((layout.users.data, layout.users.indices, layout.users.indptr),
                          shape=layout.shape)
        eng = Engine(devices[0], R, f, cfgs[0], profile=True)
        kind = "Engine"
    else:
        eng = MultiEngine(devices, layout, f, cfgs, max_device_memory=max_device_memory,
                          profile=True)
        kind = "MultiEngine"
    t_build = time.time() - t0
    say(f"{label}: {kind} built in {t_build:.1f} s; memory {json.dumps(_mem(eng.memory))}")
    out = {"backend": kind, "build_s": t_build, "memory": _mem(eng.memory),
           "configs": [[str(a), str(b)] for a, b in cfgs]}
    if kind == "MultiEngine":
        out["plan"] = eng.plan.describe()
        out["device_plans"] = [p.describe() for p in eng.dplans]
    try:
        m, n = layout.shape
        X0, Y0 = reference.start_factors(m, n, f, 0)
        eng.set_factors("users", X0)
        eng.set_factors("items", Y0)
        del X0, Y0
        eng.finish()
        t = time.time()
        eng.iteration(0.05, True)
        eng.finish()
        out["warmup_s"] = time.time() - t
        say(f"{label}: warm-up iteration {out['warmup_s']:.3f} s")
        if kind == "MultiEngine":
            _reset_times(eng)
        else:
            eng.stage_times = {k: 0.0 for k in eng.stage_times}
        times = []
        start = time.time()
        for it in range(iterations):
            t = time.time()
            eng.iteration(0.05, True)
            eng.finish()
            times.append(time.time() - t)
            say(f"{label}: iteration {it + 1}: {times[-1]:.4f} s")
            if time.time() - start + times[-1] > budget_s:
                say(f"{label}: time budget reached")
                break
        out["iter_s"] = times
        out["s_per_it"] = float(np.median(times))
        if kind == "MultiEngine":
            out["split"] = eng.time_split()
        else:
            out["split"] = {"wall": float(np.mean(times)),
                            **{k: v / len(times) for k, v in eng.stage_times.items()}}
        u, i, r = sample_triples(layout)
        se, cnt = eng.squared_error("sample", u, i, r)
        out["train_rmse_sample"] = float(np.sqrt(se / cnt))
        say(f"{label}: {out['s_per_it']:.4f} s/it, split {out['split']}, "
            f"sample RMSE {out['train_rmse_sample']:.4f}")
    finally:
        eng.release()
    return out


def _reset_times(eng):
    for w in eng.workers:
        w.times = {"compute": 0.0, "exchange": 0.0, "stream": 0.0}
    eng.times = {"compute": 0.0, "exchange": 0.0, "iterations": 0, "wall": 0.0}


def _mem(mem):
    return {k: v for k, v in mem.items() if k in ("total", "streamed", "per_device")}


def ooc_cap(device, layout, f, share):
    """A ``max_device_memory`` holding the resident plan's factors and scratch but only
    ``share`` of its rating buffers (so the fit streams)."""
    from clmf.device import device_info
    from clmf.parallel import common_ldf, make_plan
    from clmf.parallel.backend import plan_fit
    cfgs = configs_for([device], layout, f)
    plan = make_plan(layout.users.counts(), layout.items.counts(), 1, f)
    dp = plan_fit([device_info(device)], layout, plan, f, common_ldf(cfgs, f), 4, cfgs)[0]
    data = sum(v for k, v in dp.bytes.items() if k.startswith("ratings_"))
    cap = int(dp.total - data + share * data)
    for _ in range(4):          # a smaller budget may shrink the scratch: check it streams
        dq = plan_fit([device_info(device)], layout, plan, f, common_ldf(cfgs, f), 4, cfgs,
                      max_device_memory=cap)[0]
        if dq.streamed:
            break
        cap = int(dq.total - (1 - share) * data)
    say(f"out of core: max_device_memory {cap / 2**30:.2f} GiB (resident plan "
        f"{dp.total / 2**30:.2f} GiB, ratings {data / 2**30:.2f} GiB)")
    return cap


class Recorder:
    """Writes OUTDIR/STEP.json after each measurement and rows of OUTDIR/summary.md."""

    def __init__(self, outdir, step, meta):
        self.path = os.path.join(outdir, f"{step}.json")
        self.md = os.path.join(outdir, "summary.md")
        self.doc = {"step": step, "command": " ".join(sys.argv), **meta, "runs": []}
        self.step = step
        self.flush()

    def add(self, run):
        self.doc["runs"].append(run)
        self.flush()
        sp = run.get("split", {})
        with open(self.md, "a") as fh:
            fh.write(f"| {self.step} | {run.get('label')} | {run.get('devices')} | "
                     f"{run.get('f')} | {run.get('nnz', 0):,} | "
                     f"{run.get('s_per_it', float('nan')):.4f} | "
                     f"{run.get('speedup', '')} | {sp.get('compute', sp.get('s1', ''))} | "
                     f"{sp.get('exchange', '')} | {sp.get('stream_copies', '')} | "
                     f"{run.get('error', '')} |\n")

    def flush(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(self.doc, fh, indent=1, default=str)
        os.replace(tmp, self.path)


def guarded(rec, label, fn, **meta):
    """Run one measurement; record its result or its error."""
    try:
        res = fn()
    except Exception as e:          # recorded, and the next measurement runs
        say(f"{label}: FAILED {type(e).__name__}: {e}")
        res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    res.update(label=label, **meta)
    rec.add(res)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--which", default="netflix4x,netflix,hugewiki2,hugewiki1")
    ap.add_argument("--fraction", type=float, default=0.25,
                    help="share of Hugewiki's users and ratings (1 = 3.1B ratings)")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=120.0,
                    help="seconds of timed iterations per measurement")
    ap.add_argument("--factors", default="10,50,100", help="f values of the netflix step")
    ap.add_argument("--ooc-share", type=float, default=0.25,
                    help="hugewiki1: share of the ratings the capped memory holds")
    ap.add_argument("--devices", default="gpu:all")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="share of the Netflix shapes' users and ratings (small test runs)")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    import logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from clmf.parallel import select_devices
    from clmf.parallel.generate import synthetic_layout
    devices = select_devices([s for s in a.devices.split(",") if s]
                             if "," in a.devices else a.devices)
    say(f"devices: {[d.name for d in devices]}")
    meta = provenance(devices)
    md = os.path.join(a.outdir, "summary.md")
    if not os.path.exists(md):
        with open(md, "w") as fh:
            fh.write(f"# scale runs {meta['date']} commit {meta['commit']}\n\n"
                     f"devices: {[d['name'] + ' ' + d['driver'] for d in meta['devices']]}\n\n"
                     "| step | run | devices | f | ratings | s/it | speedup | compute s | "
                     "exchange s | stream copies s | error |\n|---|---|---|---|---|---|---|---|"
                     "---|---|---|\n")
    steps = [s.strip() for s in a.which.split(",") if s.strip()]
    for step in steps:
        say(f"== step {step}")
        rec = Recorder(a.outdir, step, meta)
        if step == "netflix4x":
            L = synthetic_layout("netflix-4x", a.scale, threads=a.threads, progress=say)
            guarded(rec, "netflix-4x f=100 1 GPU", lambda: timed_fit(
                devices[:1], L, 100, a.iterations, a.budget_s, label="netflix4x"),
                devices=1, f=100, nnz=L.nnz, shape=L.shape)
            del L
        elif step == "netflix":
            L = synthetic_layout("netflix", a.scale, threads=a.threads, progress=say)
            for f in (int(x) for x in a.factors.split(",")):
                one = guarded(rec, f"netflix f={f} 1 GPU (Engine)", lambda: timed_fit(
                    devices[:1], L, f, a.iterations, a.budget_s, single=True,
                    label=f"netflix f={f} x1"), devices=1, f=f, nnz=L.nnz)
                if len(devices) >= 2:
                    two = guarded(rec, f"netflix f={f} 2 GPUs", lambda: timed_fit(
                        devices[:2], L, f, a.iterations, a.budget_s, label=f"netflix f={f} x2"),
                        devices=2, f=f, nnz=L.nnz)
                    if "s_per_it" in one and "s_per_it" in two:
                        sp_ = one["s_per_it"] / two["s_per_it"]
                        two["speedup"] = round(sp_, 3)
                        two["efficiency"] = round(sp_ / 2, 3)
                        rec.flush()
                        say(f"netflix f={f}: speedup {sp_:.2f}× (efficiency {sp_ / 2:.0%})")
            del L
        elif step in ("hugewiki2", "hugewiki1", "hugewiki1r"):
            L = synthetic_layout("hugewiki", a.fraction, threads=a.threads, progress=say)
            nd = 2 if step == "hugewiki2" else 1
            cap = None
            if step == "hugewiki1":
                cap = ooc_cap(devices[0], L, 100, a.ooc_share)
            if nd > len(devices):
                say(f"{step}: needs {nd} devices, have {len(devices)}")
            else:
                guarded(rec, f"hugewiki x{a.fraction:g} f=100 {nd} GPU" + (" ooc" if cap else ""),
                        lambda: timed_fit(devices[:nd], L, 100, a.iterations, a.budget_s,
                                          max_device_memory=cap, label=step),
                        devices=nd, f=100, nnz=L.nnz, shape=L.shape, fraction=a.fraction,
                        max_device_memory=cap)
            del L
        else:
            say(f"unknown step {step}")
    say("done")


if __name__ == "__main__":
    main()
