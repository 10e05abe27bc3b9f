#!/usr/bin/env python3
"""Budgeted vs exhaustive search on the bounded space (the autotuner issue's benchmark).

For one device, data set and f: the exhaustive strategy measures every configuration of the
``bounded`` space; then the budgeted strategy gets a quarter of the exhaustive's measurement time
(less a margin, ``--fraction``). Each runs in its own process with the OpenCL program caches
off (pyopencl's and PoCL's), so both pay the same cold builds, and each writes to its own
database (so neither skips what the other rejected); both are then appended to ``--db``.

The gap is judged on the exhaustive run's own measurements: the iteration time of the pair the
budgeted run picked, as the exhaustive run measured it, against the exhaustive best (same run,
same conditions); the budgeted run's own figure is reported too.

    python scripts/tune_compare.py --device Intel --data ../shared/data/ml-100k -f 10 \\
        --db results/tuning/intel-r-opencl-amd-epyc.jsonl --out results/tuning/reports
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time


def one(a):
    """Run one strategy (in this process) and print its summary as JSON on the last line."""
    from clmf import autotune
    R, name = autotune.load_data(a.data, a.preset, a.scale)
    t0 = time.perf_counter()
    s = autotune.tune(R, factors=[a.factors], device=a.device, strategy=a.one, budget=a.budget,
                   space="bounded", db=a.db, dataset=name, state_dir=a.state, progress=False,
                   resume=False, report_dir=a.report)
    s = s[0]
    s["wall_seconds"] = time.perf_counter() - t0
    s["space_size"] = None
    from clmf.autotune.space import make_space
    from clmf.engine.device import device_info, select_device
    info = device_info(select_device(a.device))
    s["space_size"] = len(make_space("bounded", a.factors, info).enumerate(info))
    print("JSON:" + json.dumps(s, default=str))
    return 0


def head_to_head(a):
    """Time two (users, items) pairs round-robin under the same conditions; print JSON."""
    import numpy as np

    from clmf import autotune, tuning
    from clmf.autotune.measure import Measurer, calibrate_samples
    from clmf.engine.config import KernelConfig
    from clmf.engine.device import device_info, select_device
    pairs = json.loads(a.pairs)
    R, _ = autotune.load_data(a.data, a.preset, a.scale)
    dev = select_device(a.device)
    info = device_info(dev)
    samples = calibrate_samples(dev, R, a.factors, tuning.heuristic(info, a.factors))
    m = Measurer(dev, R, a.factors, samples)
    cfgs = [{s: KernelConfig.parse(p[s]) for s in ("users", "items")} for p in pairs]
    times = [[] for _ in pairs]
    for side in ("users", "items"):        # warm-up: build and JIT every kernel first
        for c in cfgs:
            m.time_side(c[side], side, 1, 0.0)
    for _ in range(a.rounds):
        for i, c in enumerate(cfgs):
            times[i].append(sum(m.time_side(c[s], s, m.repeats, m.min_time)["seconds"]
                                for s in ("users", "items")))
    print("JSON:" + json.dumps({"rounds": times, "median": [float(np.median(t)) for t in times]}))
    return 0


def exhaustive_from_db(a, dev):
    """The summary of the latest exhaustive bounded run of this case in ``--db`` (with its
    process wall time from the earlier comparison's JSON), to compare a new budgeted run against
    it without repeating it."""
    from clmf.engine.config import KernelConfig
    from clmf.tuning import read_database
    recs = read_database(a.db, strict=True)
    def same(r):
        return (r.get("device") == dev and r.get("f") == a.factors
                and r.get("strategy") == "exhaustive" and r.get("space") == "bounded")
    bests = [r for r in recs if r.get("kind") == "best" and same(r)]
    if not bests:
        raise SystemExit("no exhaustive bounded run of this case in --db")
    run_id = max(bests, key=lambda r: r["date"])["run_id"]
    bests = {r["side"]: r for r in bests if r["run_id"] == run_id}
    pri = {"low": 0, "full": 1, "final": 2}
    res, stat = {}, {}
    for r in recs:
        if r.get("kind") != "measurement" or r.get("run_id") != run_id:
            continue
        k = json.dumps(r["config"], sort_keys=True)
        e = res.setdefault(k, {"config": r["config"], "status": r["status"], "sides": {}, "p": {}})
        if r["status"] != "ok":
            e["status"] = r["status"]
            continue
        p = pri.get(r.get("fidelity", "full"), 1)
        if p >= e["p"].get(r["side"], -1):
            e["p"][r["side"]] = p
            e["sides"][r["side"]] = {"seconds": r["seconds"]}
    for e in res.values():
        stat[e["status"]] = stat.get(e["status"], 0) + 1
    old = json.loads(pathlib.Path(a.reuse_exhaustive).read_text())["exhaustive"]
    b = bests["users"]
    return {"dataset": b["dataset"]["name"], "space_size": None, "evaluated": b["evaluated"],
            "spent_seconds": b["spent_seconds"], "statuses": stat, "results": list(res.values()),
            "process_wall_seconds": old["process_wall_seconds"], "run_id": run_id,
            "best": {"iteration_seconds": b["iteration_seconds"],
                     "configs": {s: str(KernelConfig.from_dict(bests[s]["config"]))
                                 for s in ("users", "items")}}}


def run_child(args, strategy, budget, db, state, report, pairs=None):
    env = dict(os.environ, PYOPENCL_NO_CACHE="1", POCL_KERNEL_CACHE="0")
    cmd = [sys.executable, __file__, "--one", strategy, "--device", args.device, "-f",
           str(args.factors), "--db", str(db), "--state", str(state), "--report", str(report)]
    if args.data:
        cmd += ["--data", args.data]
    else:
        cmd += ["--preset", args.preset, "--scale", str(args.scale)]
    if budget is not None:
        cmd += ["--budget", f"{budget:.3f}"]
    if pairs is not None:
        cmd += ["--pairs", json.dumps(pairs), "--rounds", str(args.rounds)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-5000:])
        raise SystemExit(f"{strategy} run failed ({p.returncode})")
    line = [x for x in p.stdout.splitlines() if x.startswith("JSON:")][-1]
    s = json.loads(line[5:])
    s["process_wall_seconds"] = wall
    return s


def pair_time(summary, configs):
    """Iteration seconds of a (users, items) pair of configuration strings in a run's results."""
    from clmf.engine.config import KernelConfig
    by = {str(KernelConfig.from_dict(r["config"])): r for r in summary["results"]
          if r["status"] == "ok"}
    try:
        return sum(by[configs[s]]["sides"][s]["seconds"] for s in ("users", "items"))
    except KeyError:
        return None


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto")
    p.add_argument("--data", default=None)
    p.add_argument("--preset", default=None)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("-f", "--factors", type=int, default=10)
    p.add_argument("--db", default=None, help="append both runs' records here")
    p.add_argument("--out", default="results/tuning/reports", help="report directory")
    p.add_argument("--fraction", type=float, default=0.22,
                   help="budget as a fraction of the exhaustive run's measurement time")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--state", default=None, help=argparse.SUPPRESS)
    p.add_argument("--report", default=None, help=argparse.SUPPRESS)
    p.add_argument("--pairs", default=None, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=5, help="head-to-head rounds")
    p.add_argument("--reuse-exhaustive", default=None, metavar="COMPARE_JSON",
                   help="take the exhaustive run from --db (the latest of this case) and its wall "
                        "time from this earlier comparison JSON instead of running it again")
    a = p.parse_args()
    if a.one == "h2h":
        return head_to_head(a)
    if a.one:
        return one(a)

    from clmf.engine.device import device_info, device_label, select_device
    from clmf.tuning import device_record, device_slug
    from clmf.tuning.database import Database, clmf_commit, now
    info = device_info(select_device(a.device))
    slug = device_slug(device_record(info))
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        if a.reuse_exhaustive:
            ex = exhaustive_from_db(a, device_record(info))
            (tmp / "ex.jsonl").write_text("")
        else:
            ex = run_child(a, "exhaustive", None, tmp / "ex.jsonl", tmp / "st-ex", out)
        budget = a.fraction * ex["spent_seconds"]
        bu = run_child(a, "budgeted", budget, tmp / "bu.jsonl", tmp / "st-bu", out)
        if a.db:
            db = Database(a.db)
            for f in ("ex.jsonl", "bu.jsonl"):
                db.append([json.loads(x) for x in (tmp / f).read_text().splitlines() if x.strip()])
    ex_best = ex["best"]["iteration_seconds"]
    bu_pick = bu["best"]["configs"]
    h2h = None
    if bu_pick != ex["best"]["configs"]:
        with tempfile.TemporaryDirectory() as tmp:
            h2h = run_child(a, "h2h", None, pathlib.Path(tmp) / "x.jsonl", tmp, tmp,
                            pairs=[ex["best"]["configs"], bu_pick])
        h2h["gap"] = h2h["median"][1] / h2h["median"][0] - 1
    bu_in_ex = pair_time(ex, bu_pick)
    gap = bu_in_ex / ex_best - 1 if bu_in_ex else None
    ratio = bu["spent_seconds"] / ex["spent_seconds"]
    wall_ratio = bu["process_wall_seconds"] / ex["process_wall_seconds"]
    if ex.get("space_size") is None:
        from clmf.autotune.space import make_space
        ex["space_size"] = len(make_space("bounded", a.factors, info).enumerate(info))
    res = {"date": now(), "commit": clmf_commit(), "device": device_record(info),
           "exhaustive_reused": bool(a.reuse_exhaustive),
           "dataset": ex["dataset"], "f": a.factors, "space_size": ex["space_size"],
           "exhaustive": {"evaluated": ex["evaluated"], "spent_seconds": ex["spent_seconds"],
                          "process_wall_seconds": ex["process_wall_seconds"],
                          "best": ex["best"]["configs"], "iteration_seconds": ex_best,
                          "statuses": ex["statuses"]},
           "budgeted": {"budget": budget, "evaluated": bu["evaluated"],
                        "spent_seconds": bu["spent_seconds"],
                        "process_wall_seconds": bu["process_wall_seconds"],
                        "best": bu_pick, "iteration_seconds_own": bu["best"]["iteration_seconds"],
                        "iteration_seconds_in_exhaustive": bu_in_ex, "statuses": bu["statuses"]},
           "load_average": os.getloadavg(), "gap_vs_exhaustive_best": gap, "time_ratio": ratio,
           "wall_ratio": wall_ratio,
           "head_to_head": h2h,
           "within_5_percent": gap is not None and gap <= 0.05,
           "within_5_percent_head_to_head": (h2h["gap"] <= 0.05) if h2h else (gap is not None
                                                                            and gap <= 0.05),
           "within_quarter_time": ratio <= 0.25}
    base = f"compare_{slug}_{ex['dataset']}_f{a.factors}"
    (out / f"{base}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    d = res["device"]
    L = [f"# Budgeted vs exhaustive: {device_label(d)} — {ex['dataset']}, "
         f"f = {a.factors}",
         "",
         f"Bounded space: **{ex['space_size']} configurations** (after pruning; plus the baseline "
         "and the untuned default, measured first by both). Cold OpenCL program caches for both "
         "runs (PYOPENCL_NO_CACHE=1, POCL_KERNEL_CACHE=0), separate processes and databases. "
         f"Driver {d['driver']}; commit {res['commit']}; {res['date']}; host load average at the "
         f"end {res['load_average'][0]:.1f} (1 min) / {res['load_average'][2]:.1f} (15 min) on "
         f"{os.cpu_count()} CPUs (the machine was shared with other jobs)."
         + (f" The exhaustive run is the earlier one of this case (run {ex['run_id']}), reused; "
            "only the budgeted run and the head-to-head are new." if a.reuse_exhaustive else ""),
         "",
         "| | exhaustive | budgeted |", "|---|---|---|",
         f"| configurations evaluated | {ex['evaluated']} | {bu['evaluated']} |",
         f"| measurement time (s) | {ex['spent_seconds']:.1f} | {bu['spent_seconds']:.1f} "
         f"(budget {budget:.1f}) |",
         f"| process wall time (s) | {ex['process_wall_seconds']:.1f} | "
         f"{bu['process_wall_seconds']:.1f} |",
         f"| best users | `{ex['best']['configs']['users']}` | `{bu_pick['users']}` |",
         f"| best items | `{ex['best']['configs']['items']}` | `{bu_pick['items']}` |",
         f"| iteration time, own run (ms) | {ex_best * 1e3:.3f} | "
         f"{bu['best']['iteration_seconds'] * 1e3:.3f} |",
         f"| iteration time as the exhaustive run measured it (ms) | {ex_best * 1e3:.3f} | "
         + (f"{bu_in_ex * 1e3:.3f}" if bu_in_ex else "–") + " |",
         "",
         f"Budgeted pick vs exhaustive best: **{'+' if gap is not None and gap >= 0 else ''}"
         + (f"{gap * 100:.1f}%" if gap is not None else "n/a") + f"** "
         f"({'within' if res['within_5_percent'] else 'NOT within'} 5%), in "
         f"**{ratio * 100:.0f}%** of the exhaustive measurement time "
         f"({wall_ratio * 100:.0f}% of its process wall time; "
         f"{'≤' if res['within_quarter_time'] else '>'} 25%).", ""]
    if h2h:
        L += [f"Head-to-head (a third process times both pairs round-robin, {a.rounds} rounds, "
              f"so they share the machine's conditions): exhaustive best "
              f"{h2h['median'][0] * 1e3:.3f} ms, budgeted pick {h2h['median'][1] * 1e3:.3f} ms "
              f"per iteration (medians) → **{h2h['gap'] * 100:+.1f}%** "
              f"({'within' if h2h['gap'] <= 0.05 else 'NOT within'} 5%). Rounds (ms): exhaustive "
              + ", ".join(f"{x * 1e3:.3f}" for x in h2h["rounds"][0]) + "; budgeted "
              + ", ".join(f"{x * 1e3:.3f}" for x in h2h["rounds"][1]) + ".", ""]
    elif bu_pick == ex["best"]["configs"]:
        L += ["The budgeted run picked exactly the exhaustive run's best pair.", ""]
    (out / f"{base}.md").write_text("\n".join(L))
    print("\n".join(L))
    return 0


if __name__ == "__main__":
    sys.exit(main())
