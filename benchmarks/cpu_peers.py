#!/usr/bin/env python3
"""clmf on CPU OpenCL runtimes against the CPU libraries (issue 16), whole fits included.

1. Implicit feedback against the `implicit` library's CPU ALS (conjugate gradient, its default):
   the same CSR, factors, λ (plain λI), alpha (confidence 1 + alpha·r), iterations and thread
   count (`implicit`'s num_threads = the CPUs OpenCL uses here); precision@10 of both on the same
   leave-k-out split, ranked by the same code; whole-fit wall time (set-up included; clmf after
   one warm-up fit in the process, so builds come from the cache) and s/it.
2. Where clmf's implicit iteration goes: per-stage seconds (Gram YᵀY, S1 hermitians, S2
   right-hand sides, S3 solves) from a profiled engine with the configuration the fit used.
3. Whole explicit fits, plain and biased, against LensKit (`BiasedMFScorer`; its plain ALS
   trainer on the raw ratings), same data, f, λ, iterations; set-up and builds included
   (LensKit: data set, trainer and epochs). Skipped with a note when lenskit is not installed.

    python benchmarks/cpu_peers.py results/bench/cpu-peers-pocl-intel \\
        --lastfm ../shared/data/hetrec2011-lastfm-2k/user_artists.dat

Writes OUT/cpu_peers.json and OUT/cpu_peers.md (device, driver, date, commit, command, load).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np


def log(msg):
    """Timestamped progress on stderr."""
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", file=sys.stderr,
          flush=True)


def top_n(X, Y, train_csr, users, k=10, block=2048):
    """Top-k unseen items of ``users`` by X·Yᵀ (ties by item index), ``block`` users at a time
    (the scores of every user at once do not fit in memory on large sets)."""
    out = []
    for b0 in range(0, len(users), block):
        ub = users[b0:b0 + block]
        S = X[ub] @ Y.T
        R = train_csr[ub]
        rr = np.repeat(np.arange(len(ub)), np.diff(R.indptr))
        S[rr, R.indices] = -np.inf
        top = np.argpartition(-S, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(S, top, 1), axis=1, kind="stable")
        out.append(np.take_along_axis(top, order, 1))
    return np.concatenate(out) if out else np.zeros((0, k), np.int64)


def implicit_data(name, path, seed, k_out):
    """(name, train CSR, test users, their held-out items) of an implicit data set."""
    import clmf.data
    from clmf.data import splits
    if name == "lastfm":
        data = clmf.data.load(path)
        data = clmf.data.Ratings(data.users, data.items, np.log1p(data.ratings).astype(np.float32),
                                data.timestamps, data.user_ids, data.item_ids)
    else:
        data, name = clmf.data.synthetic_from_spec(name, seed=seed)
    train, test = splits.leave_k_out(data, k=k_out, random_state=seed, min_train=k_out)
    R, T = train.to_csr(), test.to_csr()
    users = np.flatnonzero(np.diff(T.indptr) > 0)
    relevant = [T.indices[T.indptr[u]:T.indptr[u + 1]] for u in users]
    return name, R, users, relevant


def precision(X, Y, R, users, relevant):
    """precision@10 of the factors on the held-out items."""
    from clmf import metrics
    rec = top_n(np.asarray(X, np.float32), np.asarray(Y, np.float32), R, users)
    return float(metrics.precision_at_k(rec, relevant, 10))


def clmf_fit(R, device, warm=True, **kw):
    """A timed clmf fit (after a warm-up fit when ``warm``): (model, whole seconds)."""
    import clmf
    if warm:
        clmf.ALS(device=device, **kw).fit(R, show_progress=False)
    t = time.perf_counter()
    m = clmf.ALS(device=device, **kw).fit(R, show_progress=False)
    return m, time.perf_counter() - t


def stages(R, device, model, f, lam, alpha, iterations=3):
    """Per-iteration seconds of each stage of clmf's implicit iteration (profiled engine)."""
    from clmf.engine.core import Engine
    from clmf.reference import start_factors
    cfgs = (model.config_["users"].config, model.config_["items"].config)
    eng = Engine(device, R, f, cfgs, profile=True, implicit_alpha=alpha)
    try:
        X0, Y0 = start_factors(*R.shape, f, 0)
        eng.set_factors("users", X0)
        eng.set_factors("items", Y0)
        eng.iteration(lam, False)                     # first iteration not counted
        eng.queue.finish()
        eng.stage_times = {"s1": 0.0, "s2": 0.0, "s3": 0.0, "gram": 0.0}
        t = time.perf_counter()
        for _ in range(iterations):
            eng.iteration(lam, False)
        eng.queue.finish()
        wall = (time.perf_counter() - t) / iterations
        return {"wall_s": wall, **{k: v / iterations for k, v in eng.stage_times.items()}}
    finally:
        eng.release()


def implicit_work(R, f, configs):
    """Useful fp32 operations (FLOP) and gathered bytes of one implicit iteration, both sides,
    by stage, for the configurations used: Gram 2·n_other·f², S2 2·nnz·f; the fused CG applies
    A (G·v: 2·rows·f², each entry a dot and an axpy: 4·f) cg_steps + 1 times, gathering the
    entry's factor row twice each time; the plain CG builds A (S1, nnz·f(f+1)) and applies it
    (2·rows·f² per step)."""
    nnz = int(R.nnz)
    out = {"gram": 0.0, "s1": 0.0, "s2": 0.0, "s3": 0.0, "gather_bytes": 0.0}
    for side, rows, other in (("users", R.shape[0], R.shape[1]),
                              ("items", R.shape[1], R.shape[0])):
        c = configs[side]
        apps = c.cg_steps + 1
        out["gram"] += 2.0 * other * f * f
        out["s2"] += 2.0 * nnz * f
        if c.solver == "fusedcg":
            out["s3"] += apps * (2.0 * rows * f * f + 4.0 * nnz * f)
            out["gather_bytes"] += apps * 2.0 * nnz * f * 4
        else:
            out["s1"] += nnz * f * (f + 1.0)
            out["s3"] += apps * 2.0 * rows * f * f
            out["gather_bytes"] += nnz * f * 4.0
    return out


def device_peaks(devices):
    """Measured fp32 FMA GFLOP/s and copy GB/s of each device (clmf.bench.peaks, quick)."""
    from clmf.bench.peaks import measure_peaks
    from clmf.engine.device import device_label
    out = {}
    for dev in devices:
        pk = measure_peaks(dev, quick=True)
        out[device_label(pk)] = pk
        log(f"peaks {pk['platform']}: {pk['peak_gflops']:.1f} GFLOP/s, "
            f"{pk['peak_gbps']:.1f} GB/s")
    return out


def run_implicit(a, devices, threads, rows):
    """Table 1 and 2 rows: clmf (each device) and `implicit` on each implicit data set."""
    import implicit
    from implicit.cpu.als import AlternatingLeastSquares
    for spec in a.implicit_data:
        name, R, users, relevant = implicit_data(spec, a.lastfm, a.seed, a.k_out)
        log(f"implicit {name}: {R.shape[0]} × {R.shape[1]}, {R.nnz} ratings")
        for rnd in range(a.rounds):
            for f in a.factors:
                base = dict(table="implicit", data=name, users=R.shape[0], items=R.shape[1],
                            nnz=int(R.nnz), f=f, regularization=a.regularization, alpha=a.alpha,
                            iterations=a.iterations, threads=threads, round=rnd)
                model = AlternatingLeastSquares(factors=f, regularization=a.regularization,
                                                alpha=a.alpha, iterations=a.iterations,
                                                num_threads=threads, use_cg=True,
                                                calculate_training_loss=False, random_state=a.seed,
                                                dtype=np.float32)
                secs = []
                t = time.perf_counter()
                model.fit(R, show_progress=False,
                          callback=lambda it, el, loss: secs.append(float(el)))
                whole = time.perf_counter() - t
                per = np.array(secs)           # implicit reports each iteration's own seconds
                rows.append(dict(base, system=f"implicit {implicit.__version__} (CG)",
                                 device="host CPU", whole_fit_s=whole,
                                 s_per_it=float(np.median(per[1:] if len(per) > 1 else per)),
                                 precision_at_10=precision(model.user_factors, model.item_factors,
                                                           R, users, relevant)))
                log(f"  f={f} implicit: whole {whole:.3f} s, "
                    f"p@10 {rows[-1]['precision_at_10']:.4f}")
                for dev in devices:
                    from clmf.engine.device import device_info, device_label
                    info = device_info(dev)
                    m, whole = clmf_fit(R, dev, factors=f, regularization=a.regularization,
                                        iterations=a.iterations, feedback="implicit", alpha=a.alpha,
                                        random_state=a.seed)
                    its = [h["seconds"] for h in m.history_]
                    row = dict(base, system="clmf", device=device_label(info),
                               driver=info.driver, whole_fit_s=whole, setup_s=m.timings_["setup"],
                               s_per_it=statistics.median(its[1:] or its),
                               first_iteration_s=its[0],
                               precision_at_10=precision(m.user_factors_, m.item_factors_, R, users,
                                                         relevant),
                               config={s: str(c.config) for s, c in m.config_.items()},
                               rule={s: c.rule for s, c in m.config_.items()})
                    if a.stages:
                        row["stages"] = stages(R, dev, m, f, a.regularization, a.alpha)
                        row["work"] = implicit_work(R, f, {s: c.config
                                                           for s, c in m.config_.items()})
                    rows.append(row)
                    log(f"  f={f} clmf {info.platform}: whole {whole:.3f} s, "
                        f"{row['s_per_it']:.4f} s/it, p@10 {row['precision_at_10']:.4f}, "
                        f"stages {row.get('stages')}")


def median_rows(rows):
    """One row per (data, f, system, device) of the implicit table: the median whole fit, s/it,
    set-up and first iteration over the rounds (the systems alternated within each round, so
    they share the machine's load), with every round's whole fit kept."""
    out, groups = [], {}
    for r in rows:
        if r["table"] != "implicit":
            out.append(r)
            continue
        groups.setdefault((r["data"], r["f"], r["system"], r["device"]), []).append(r)
    for rs in groups.values():
        m = dict(rs[0])
        for k in ("whole_fit_s", "s_per_it", "setup_s", "first_iteration_s"):
            vals = [x[k] for x in rs if x.get(k) is not None]
            if vals:
                m[k] = statistics.median(vals)
        m["rounds"] = len(rs)
        m["whole_fit_all"] = [x["whole_fit_s"] for x in rs]
        m.pop("round", None)
        out.append(m)
    return out


def run_explicit(a, devices, rows):
    """Table 3 rows: whole explicit fits (plain, biased) of clmf and LensKit."""
    from clmf.bench.peers import run_peer
    from clmf.bench.runner import load_problem
    from clmf.engine.device import device_info, device_label
    try:
        import lenskit  # noqa: F401
        have_lenskit = True
    except ImportError:
        have_lenskit = False
    for spec in a.explicit_data:
        problem = load_problem(spec, seed=a.seed)
        log(f"explicit {problem.name}: {problem.shape}, {problem.train.nnz} train ratings")
        for f in a.explicit_factors:
            base = dict(table="explicit", data=problem.name, users=problem.shape[0],
                        items=problem.shape[1], nnz=int(problem.train.nnz), f=f,
                        regularization=a.regularization_explicit, iterations=a.iterations)
            for biased in (False, True):
                kind = "biased" if biased else "plain"
                if have_lenskit:
                    peer = "lenskit-biased" if biased else "lenskit"
                    pr = run_peer(peer, problem, f, a.regularization_explicit, a.iterations,
                                  a.seed)
                    rows.append(dict(base, mode=kind, system=pr.system, device="host CPU",
                                     status=pr.status, whole_fit_s=pr.whole_s,
                                     s_per_it=float(np.median(pr.seconds[1:] or pr.seconds))
                                     if pr.ok else None,
                                     test_rmse=pr.test_rmse, note=pr.note))
                else:
                    rows.append(dict(base, mode=kind, system="lenskit", device="host CPU",
                                     status="skipped: lenskit is not installed"))
                log(f"  f={f} {kind} {rows[-1]['system']}: {rows[-1].get('whole_fit_s')}")
                for dev in devices:
                    info = device_info(dev)
                    m, whole = clmf_fit(problem.train, dev, factors=f,
                                        regularization=a.regularization_explicit,
                                        iterations=a.iterations, biases=biased,
                                        random_state=a.seed)
                    its = [h["seconds"] for h in m.history_]
                    rows.append(dict(base, mode=kind, system="clmf",
                                     device=device_label(info), driver=info.driver,
                                     status="ok", whole_fit_s=whole, setup_s=m.timings_["setup"],
                                     s_per_it=statistics.median(its[1:] or its),
                                     first_iteration_s=its[0], test_rmse=m.rmse(problem.test),
                                     config={s: str(c.config) for s, c in m.config_.items()}))
                    log(f"  f={f} {kind} clmf {info.platform}: whole {whole:.3f} s")


def _d(text):
    """A device name inside a markdown table cell."""
    return str(text).replace("|", "\\|")


def _f(x, nd=4):
    return "" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def render(doc):
    """The markdown report."""
    rows = doc["rows"]
    L = [f"# clmf on CPU runtimes vs CPU libraries — {doc['date']}\n",
         f"- commit: {doc['commit']}  \n- host: {doc['host']}, {doc['cpu_count']} CPUs  ",
         f"- command: `{doc['command']}`  ",
         f"- load average (1 min) at start / end: {doc['load'][0]:.2f} / {doc['load'][1]:.2f} "
         "(other work on this shared machine slows every figure)  ",
         "- whole fit: wall seconds of `fit` from the CSR in memory to factors on the host, "
         "set-up included (clmf after a warm-up fit in the process: kernels from the cache)\n"]
    imp = [r for r in rows if r["table"] == "implicit"]
    if imp:
        L += ["## Implicit feedback: clmf vs `implicit`\n",
              "| data | f | system | device | whole fit s | s/it | set-up s | p@10 | "
              "`implicit` ÷ clmf (whole fit) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in imp:
            ref = next((x for x in imp if x["data"] == r["data"] and x["f"] == r["f"]
                        and x["system"].startswith("implicit")), None)
            ratio = (ref["whole_fit_s"] / r["whole_fit_s"]) if ref and r["system"] == "clmf" \
                else None
            L.append(f"| {r['data']} | {r['f']} | {r['system']} | {_d(r['device'])} | "
                     f"{_f(r['whole_fit_s'], 3)} | {_f(r['s_per_it'])} | "
                     f"{_f(r.get('setup_s'), 3)} | {_f(r['precision_at_10'])} | "
                     f"{_f(ratio, 2)} |")
        r0 = imp[0]
        L.append(f"\nλ = {r0['regularization']} (λI), alpha = {r0['alpha']}, "
                 f"{r0['iterations']} iterations, {r0['threads']} threads for `implicit`; "
                 f"medians over {r0.get('rounds', 1)} round(s), the systems alternated within "
                 "each; above 1 in the last column, clmf is faster.\n")
        st = [r for r in imp if r.get("stages")]
        if st:
            L += ["### Where clmf's implicit iteration goes (profiled, s per iteration)\n",
                  "| data | f | device | configuration (users / items) | wall | Gram YᵀY | S1 | "
                  "S2 | S3 |", "|---|---|---|---|---|---|---|---|---|"]
            for r in st:
                s = r["stages"]
                cfg = r["config"]
                L.append(f"| {r['data']} | {r['f']} | {_d(r['device'])} | {cfg['users']} / "
                         f"{cfg['items']} | {_f(s['wall_s'])} | {_f(s['gram'])} | "
                         f"{_f(s['s1'])} | {_f(s['s2'])} | {_f(s['s3'])} |")
            L.append("")
            peaks = doc.get("peaks") or {}
            wk = [r for r in st if r.get("work")]
            if wk:
                L += ["Useful work of those iterations against the device's measured peak "
                      "(`benchmarks/cpu_peers.py` `implicit_work`: Gram 2·n·f², S2 2·nnz·f, fused "
                      "CG (cg_steps + 1)·(2·rows·f² + 4·nnz·f) per side, each entry's factor row "
                      "gathered twice per application; peaks from `clmf.bench.peaks`, quick):\n",
                      "| data | f | device | GFLOP / it | GFLOP/s (iteration) | S3 GFLOP/s | "
                      "peak GFLOP/s | % of peak | S3 gathers GB/s | copy GB/s |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
                for r in wk:
                    s, w = r["stages"], r["work"]
                    flop = w["gram"] + w["s1"] + w["s2"] + w["s3"]
                    pk = peaks.get(r["device"], {})
                    rate = flop / s["wall_s"] * 1e-9 if s["wall_s"] else None
                    s3 = w["s3"] / s["s3"] * 1e-9 if s["s3"] else None
                    gb = w["gather_bytes"] / s["s3"] * 1e-9 if s["s3"] else None
                    pct = 100 * rate / pk["peak_gflops"] if rate and pk.get("peak_gflops") else None
                    L.append(f"| {r['data']} | {r['f']} | {_d(r['device'])} | {_f(flop * 1e-9, 2)}"
                             f" | {_f(rate, 1)} | {_f(s3, 1)} | {_f(pk.get('peak_gflops'), 1)} | "
                             f"{_f(pct, 1)} | {_f(gb, 1)} | {_f(pk.get('peak_gbps'), 1)} |")
                L.append("")
    exp = [r for r in rows if r["table"] == "explicit"]
    if exp:
        L += ["## Whole explicit fits: clmf vs LensKit\n",
              "| data | f | mode | system | device | whole fit s | s/it | set-up s | test RMSE | "
              "LensKit ÷ clmf (whole fit) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in exp:
            ref = next((x for x in exp if x["data"] == r["data"] and x["f"] == r["f"]
                        and x["mode"] == r["mode"] and x["system"].startswith("lenskit")
                        and x.get("whole_fit_s")), None)
            ratio = (ref["whole_fit_s"] / r["whole_fit_s"]) if ref and r["system"] == "clmf" \
                and r.get("whole_fit_s") else None
            status = "" if r.get("status", "ok") == "ok" else f" ({r['status']})"
            L.append(f"| {r['data']} | {r['f']} | {r['mode']} | {r['system']}{status} | "
                     f"{_d(r['device'])} | {_f(r.get('whole_fit_s'), 3)} | "
                     f"{_f(r.get('s_per_it'))} | "
                     f"{_f(r.get('setup_s'), 3)} | {_f(r.get('test_rmse'))} | {_f(ratio, 2)} |")
        L.append("")
    return "\n".join(L) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--lastfm", default="../shared/data/hetrec2011-lastfm-2k/user_artists.dat")
    p.add_argument("--implicit-data", nargs="*",
                   default=["lastfm", "synthetic:20000x6000x280000"])
    p.add_argument("--explicit-data", nargs="*", default=["synthetic:6040x3706x1000209"])
    p.add_argument("--factors", type=int, nargs="*", default=[64])
    p.add_argument("--explicit-factors", type=int, nargs="*", default=[50])
    p.add_argument("--regularization", type=float, default=0.05)
    p.add_argument("--regularization-explicit", type=float, default=0.1)
    p.add_argument("--alpha", type=float, default=2.0)
    p.add_argument("--iterations", type=int, default=15)
    p.add_argument("--k-out", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--devices", nargs="*", default=["portable", "intel"])
    p.add_argument("--stages", action="store_true", help="profile clmf's implicit stages")
    p.add_argument("--rounds", type=int, default=1,
                   help="implicit table: fits of every system per round, medians over rounds")
    p.add_argument("--skip", nargs="*", default=[], choices=("implicit", "explicit"))
    a = p.parse_args()
    from clmf.engine.device import device_info, device_label, select_device
    from clmf.provenance import commit
    devices = [select_device(d) for d in a.devices]
    threads = max(device_info(d).compute_units for d in devices)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": commit(), "host": platform.node(), "cpu_count": os.cpu_count(),
           "command": "python benchmarks/cpu_peers.py " + " ".join(sys.argv[1:]),
           "devices": [{"device": device_label(device_info(d)),
                        "driver": device_info(d).driver} for d in devices], "rows": []}
    if "implicit" not in a.skip:
        run_implicit(a, devices, threads, doc["rows"])
        doc["rows"] = median_rows(doc["rows"])
        if a.stages:
            doc["peaks"] = device_peaks(devices)
    if "explicit" not in a.skip:
        run_explicit(a, devices, doc["rows"])
    doc["load"] = [load0, os.getloadavg()[0]]
    (out / "cpu_peers.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "cpu_peers.md").write_text(render(doc))
    print(render(doc))


if __name__ == "__main__":
    main()
