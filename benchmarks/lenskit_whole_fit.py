#!/usr/bin/env python3
"""Whole explicit fits of clmf (PoCL, Intel) against LensKit, each in a fresh process (issue 16).

Plain (``lenskit``: LensKit's explicit ALS trainer on the raw ratings from clmf's start factors)
and biased (``lenskit-biased``: ``BiasedMFScorer`` as shipped, clmf ``biases=True``), same train
split, f, λ and iterations, 2 threads each (LensKit: ``LK_NUM_THREADS`` / torch threads; the
OpenCL CPU runtimes use the machine's 2 cores). Every measurement is one fresh process; the
systems alternate within each repetition (the order rotates), so load changes on a shared host
hit all of them alike. Timed: from the CSR in memory (libraries imported beforehand) to factors on
the host, set-up and kernel builds included (clmf: context, tuning lookup, builds — from the
on-disk cache after an untimed warm-up process, or with ``--cold`` from an empty clmf cache and
PoCL's kernel cache off (a cache Intel's runtime may keep is not cleared); LensKit:
data set, trainer, epochs). Test RMSE by one rule (``clmf.bench.peers.rmse_of``).

    PYTHONPATH=/tmp/site-wt-lenskit OCL_ICD_VENDORS=/work/main/.icd /tmp/venv-lk/bin/python \\
        benchmarks/lenskit_whole_fit.py results/bench/lenskit-whole-fit-cpu/after \\
        --data synthetic:6040x3706x1000209 ../shared/data/ml-latest-small -f 50 100 --reps 3

Writes OUT/lenskit_whole_fit.json and OUT/lenskit_whole_fit.md (devices, drivers, date, commit,
command, load average at start and end, clmf's configurations and per-phase timings).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

THREADS = "2"


def log(msg):
    """Timestamped progress on stderr."""
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", file=sys.stderr,
          flush=True)


def load(spec, seed):
    """A clmf.bench Problem: a directory/file of ratings (10 % random holdout) or a bench spec."""
    from clmf import data
    from clmf.bench.peers import Problem
    from clmf.bench.runner import _train_test_csr, load_problem
    from clmf.data import splits
    p = pathlib.Path(spec)
    if p.exists():
        f = p / "ratings.csv" if p.is_dir() else p
        tr, te = splits.random_holdout(data.load(str(f)), test_fraction=0.1,
                                       random_state=seed)
        return Problem(p.name if p.is_dir() else p.stem, *_train_test_csr(tr, te))
    return load_problem(spec, seed=seed)


def child(job):
    """One measurement in this (fresh) process; returns its result dict."""
    import numpy as np
    problem = load(job["data"], job["seed"])
    f, lam, its, seed = job["f"], job["lam"], job["iterations"], job["seed"]
    biased = job["mode"] == "biased"
    out = dict(job, users=problem.shape[0], items=problem.shape[1], nnz=int(problem.train.nnz))
    if job["system"] == "lenskit":
        import lenskit.als  # noqa: F401  imported before timing, as clmf is
        import torch
        torch.set_num_threads(int(THREADS))
        from clmf.bench.peers import run_peer
        pr = run_peer("lenskit-biased" if biased else "lenskit", problem, f, lam, its, seed)
        out.update(status=pr.status, whole_s=pr.whole_s, test_rmse=pr.test_rmse, note=pr.note,
                   s_per_it=float(np.median(pr.seconds[1:])) if pr.ok else None,
                   torch_threads=torch.get_num_threads())
        return out
    import pyopencl  # noqa: F401

    import clmf
    from clmf.engine.device import device_info, device_label, select_device
    info = device_info(select_device(job["device"]))
    t = time.perf_counter()
    m = clmf.ALS(factors=f, regularization=lam, iterations=its, biases=biased, random_state=seed,
                 device=job["device"]).fit(problem.train, show_progress=False)
    whole = time.perf_counter() - t
    sec = [h["seconds"] for h in m.history_]
    out.update(status="ok", whole_s=whole, test_rmse=float(m.rmse(problem.test)),
               s_per_it=statistics.median(sec[1:]), first_iteration_s=sec[0],
               device_name=device_label(info), driver=info.driver,
               timings={k: float(v) for k, v in m.timings_.items()
                        if isinstance(v, (int, float))},
               config={s: {"config": str(c.config), "rule": c.rule, "reason": c.reason}
                       for s, c in m.config_.items()})
    return out


def spawn(job, env):
    """Run ``job`` in a fresh interpreter; its result dict (status failed: ... on error)."""
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], env=env,
                       capture_output=True, text=True)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode or not lines:
        return dict(job, status=f"failed: rc {r.returncode}: {r.stderr.strip()[-400:]}")
    return json.loads(lines[-1])


def median(rows, key):
    """Median of ``key`` over ok rows, None when none."""
    v = [r[key] for r in rows if r.get("status") == "ok" and r.get(key) is not None]
    return statistics.median(v) if v else None


def summarise(runs):
    """One row per (data, f, mode, system/device): medians and LensKit ÷ clmf."""
    out = []
    keys = sorted({(r["data"], r["f"], r["mode"]) for r in runs}, key=lambda k: (k[0], k[1],
                                                                                 k[2] != "plain"))
    for d, f, mode in keys:
        case = [r for r in runs if (r["data"], r["f"], r["mode"]) == (d, f, mode)]
        lk = [r for r in case if r["system"] == "lenskit"]
        lk_s = median(lk, "whole_s")
        for dev in sorted({r["device"] for r in case if r["system"] == "clmf"}):
            for cold in (False, True):
                c = [r for r in case if r["system"] == "clmf" and r["device"] == dev
                     and bool(r.get("cold")) == cold]
                if not c:
                    continue
                cs = median(c, "whole_s")
                last = c[-1]
                out.append(dict(data=d, f=f, mode=mode, device=last.get("device_name", dev),
                                cold=cold, n=len(c), clmf_s=cs, lenskit_s=lk_s,
                                ratio=lk_s / cs if lk_s and cs else None,
                                clmf_rmse=median(c, "test_rmse"), lenskit_rmse=median(lk,
                                                                                     "test_rmse"),
                                clmf_s_per_it=median(c, "s_per_it"),
                                lenskit_s_per_it=median(lk, "s_per_it"),
                                setup_s=median([{"status": "ok", "x": r["timings"].get("setup")}
                                                for r in c if r.get("timings")], "x"),
                                config=last.get("config"), all_clmf=[r.get("whole_s") for r in c],
                                all_lenskit=[r.get("whole_s") for r in lk]))
    return out


def _f(x, nd=3):
    return "" if x is None else f"{x:.{nd}f}"


def render(doc):
    """The markdown table."""
    L = [f"# Whole explicit fits: clmf vs LensKit — {doc['date']}\n",
         f"- commit: {doc['commit']}; host {doc['host']}, {doc['cpu_count']} CPUs (shared)  ",
         f"- command: `{doc['command']}`  ",
         f"- LensKit {doc.get('lenskit')}, torch {doc.get('torch')}, {THREADS} threads; devices: "
         + "; ".join(f"{d['device']} ({d['driver']})" for d in doc["devices"]) + "  ",
         f"- load average (1/5/15 min) at start {doc['load'][0]}, end {doc['load'][1]}  ",
         f"- λ = {doc['lam']}, {doc['iterations']} iterations, seed {doc['seed']}; medians of "
         f"{doc['reps']} fresh processes per cell, systems alternated; whole fit = CSR in memory "
         "→ factors, set-up and builds included (clmf builds from the disk cache unless *cold*: "
         "an empty cache, i.e. the first fit after an install)\n",
         "| data | f | mode | device | clmf whole fit s | LensKit whole fit s | LensKit ÷ clmf | "
         "clmf s/it | LensKit s/it | clmf set-up s | test RMSE clmf | test RMSE LensKit | "
         "clmf configuration (users / items, rule) |", "|---|---|---|---|---|---|---|---|---|---|"
         "---|---|---|"]
    for r in doc["summary"]:
        cfg = r.get("config") or {}
        c = " / ".join(f"`{cfg[s]['config']}`" for s in ("users", "items") if s in cfg)
        rule = cfg.get("users", {}).get("rule", "")
        dev = r["device"].replace("|", "\\|") + (" (cold)" if r["cold"] else "")
        L.append(f"| {pathlib.Path(r['data']).name} | {r['f']} | {r['mode']} | {dev} | "
                 f"{_f(r['clmf_s'])} | "
                 f"{_f(r['lenskit_s'])} | {_f(r['ratio'], 2)} | {_f(r['clmf_s_per_it'], 4)} | "
                 f"{_f(r['lenskit_s_per_it'], 4)} | {_f(r['setup_s'])} | "
                 f"{_f(r['clmf_rmse'], 4)} | {_f(r['lenskit_rmse'], 4)} | {c} ({rule}) |")
    return "\n".join(L) + "\n"


def main():
    """Parse arguments, run every case in fresh processes, write the json and md."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--data", nargs="+",
                   default=["synthetic:6040x3706x1000209", "../shared/data/ml-latest-small"])
    p.add_argument("-f", "--factors", type=int, nargs="+", default=[50, 100])
    p.add_argument("--modes", nargs="+", default=["plain", "biased"], choices=["plain", "biased"])
    p.add_argument("--devices", nargs="+", default=["portable", "intel"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cold", type=int, default=0, help="extra clmf fits per cell, empty cache")
    p.add_argument("--lam", type=float, default=0.1)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-lenskit", action="store_true")
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child)), default=str))
        return
    from clmf.engine.device import device_info, device_label, select_device
    env = dict(os.environ, LK_NUM_THREADS=THREADS, LK_NUM_BACKEND_THREADS=THREADS,
               OMP_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS, OPENBLAS_NUM_THREADS=THREADS)
    vers = {}
    try:
        import lenskit
        import torch
        vers = {"lenskit": lenskit.__version__, "torch": torch.__version__}
    except ImportError:
        a.no_lenskit = True
    devs = [device_info(select_device(d)) for d in a.devices]
    rev = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                         text=True, cwd=pathlib.Path(__file__).parent).stdout.strip()
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": rev, "host": platform.node(), "cpu_count": os.cpu_count(),
           "command": "python benchmarks/lenskit_whole_fit.py " + " ".join(sys.argv[1:]),
           "devices": [{"device": device_label(i), "driver": i.driver} for i in devs],
           "lam": a.lam, "iterations": a.iterations, "seed": a.seed, "reps": a.reps, **vers,
           "load": [os.getloadavg()], "runs": []}
    runs = doc["runs"]
    for data in a.data:
        for f in a.factors:
            for mode in a.modes:
                base = dict(data=data, f=f, mode=mode, lam=a.lam, iterations=a.iterations,
                            seed=a.seed)
                systems = [dict(system="clmf", device=d) for d in a.devices]
                if not a.no_lenskit:
                    systems.append(dict(system="lenskit", device="host"))
                for s in systems[:len(a.devices)]:      # untimed warm-up: fills the build cache
                    spawn(dict(base, **s), env)
                for rep in range(a.reps):
                    k = rep % len(systems)
                    for s in systems[k:] + systems[:k]:
                        r = spawn(dict(base, **s, rep=rep), env)
                        runs.append(r)
                        log(f"{data} f={f} {mode} {s['system']} {s['device']}: "
                            f"{r.get('whole_s') or r['status']}")
                for d in (a.devices if a.cold else []):
                    for i in range(a.cold):
                        with tempfile.TemporaryDirectory() as tmp:
                            r = spawn(dict(base, system="clmf", device=d, cold=True, rep=i),
                                      dict(env, CLMF_CACHE_DIR=tmp, POCL_CACHE_DIR=tmp,
                                           POCL_KERNEL_CACHE="0"))
                        runs.append(r)
                        log(f"{data} f={f} {mode} clmf {d} cold: {r.get('whole_s') or r['status']}")
    doc["load"].append(os.getloadavg())
    doc["summary"] = summarise(runs)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lenskit_whole_fit.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "lenskit_whole_fit.md").write_text(render(doc))
    print(render(doc))


if __name__ == "__main__":
    main()
