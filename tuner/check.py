"""Check a tuning by whole fits: the tuned configuration against the untuned default.

The tuner's speed-ups compare estimates taken minutes apart (the anchors are measured first, the
best last), which a shared or throttling machine skews. This check fits the model twice per
round — ``ALS(variant="auto")`` (what the tuning databases choose) and the untuned default (the
heuristic at the kernels' f, with the mode's default solver: what a fit with no tuning gets) —
alternating for ``--rounds`` rounds so both see the same machine conditions, and reports the
median wall seconds per iteration of each, their ratio, and the tuner's estimate of the tuned
pair (device time of the kernels, from the ``best`` record of the run the lookup named).

    python -m clmf.autotune.check ../shared/data/hetrec2011-lastfm-2k --log1p --feedback implicit \\
        --alpha 2 -f 64 --device Intel -o results/tuning/reports/check_intel_lastfm.md
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import numpy as np

__all__ = ["check", "main"]


def _untuned(info, f, storage, mode):
    from clmf import tuning
    from clmf.engine.kernels import validate
    from clmf.errors import InvalidConfigError
    cfg = tuning.heuristic(info, tuning.kernel_factors(f, mode), storage=storage)
    try:
        validate(cfg, tuning.kernel_factors(f, mode), info)
    except InvalidConfigError:
        cfg = tuning.BASELINE.replace(storage=storage)
    s = tuning.MODE_DEFAULT_SOLVER.get(mode)
    return cfg.replace(solver=s) if s else cfg


def _estimate(reason):
    """The tuner's estimated iteration seconds of the run a Choice's reason names."""
    from clmf import tuning
    m = re.search(r"run ([0-9a-f]{16})", reason or "")
    if not m:
        return None
    for _origin, path in tuning.database_paths():
        for r in tuning.read_database(path) or []:
            if r.get("kind") == "best" and r.get("run_id") == m.group(1):
                return r.get("iteration_seconds")
    return None


def check(R, factors, device="auto", mode="explicit", alpha=1.0, regularization=0.05,
          iterations=6, rounds=3, storage="float32"):
    """Rows (dicts) of the tuned-vs-untuned comparison, one per f."""
    import clmf
    from clmf.engine.device import device_info, select_device
    dev = select_device(device)
    info = device_info(dev)
    kw = dict(regularization=regularization, device=dev, random_state=0, storage=storage)
    if mode == "implicit":
        kw.update(feedback="implicit", alpha=alpha)
    elif mode == "biased":
        kw.update(biases=True)
    rows = []
    for f in factors:
        probe = clmf.ALS(f, iterations=1, **kw).fit(R, show_progress=False)
        tuned = (probe.config_["users"], probe.config_["items"])
        base = _untuned(info, f, storage, mode)
        variants = {"tuned": "auto", "untuned": (base, base)}
        secs = {k: [] for k in variants}
        for _ in range(rounds):
            for name, v in variants.items():
                m = clmf.ALS(f, iterations=iterations, variant=v, **kw).fit(R, show_progress=False)
                secs[name] += [h["seconds"] for h in m.history_]
        med = {k: float(np.median(v)) for k, v in secs.items()}
        rows.append({"f": f, "mode": mode, "tuned_rule": tuned[0].rule,
                     "tuned": [str(tuned[0].config), str(tuned[1].config)],
                     "untuned": str(base), "tuned_seconds": med["tuned"],
                     "untuned_seconds": med["untuned"],
                     "speedup": med["untuned"] / med["tuned"] if med["tuned"] > 0 else None,
                     "estimate_seconds": _estimate(tuned[0].reason),
                     "runs": {k: len(v) for k, v in secs.items()}})
    return info, rows


def markdown(info, rows, title, command):
    from clmf.engine.device import device_label
    from clmf.provenance import commit
    from clmf.tuning.database import now
    la = os.getloadavg()
    L = [f"# {title}", "",
         f"- device: {device_label(info)} ({info.type}), driver {info.driver}",
         f"- written {now()}, clmf commit {commit()}; host load average at the end "
         f"{la[0]:.1f} / {la[1]:.1f} / {la[2]:.1f}",
         f"- command: `{command}`",
         "- whole fits alternated (tuned, untuned) per round; wall seconds per iteration (median "
         "over every iteration of every round); the estimate is the tuner's device-time sum of "
         "the tuned pair's kernels, from its run's `best` record", "",
         "| f | mode | tuned (users / items) | rule | s/it tuned | untuned default | s/it untuned "
         "| untuned / tuned | tuner's estimate |",
         "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        est = r["estimate_seconds"]
        L.append(f"| {r['f']} | {r['mode']} | `{r['tuned'][0]}` / `{r['tuned'][1]}` | "
                 f"{r['tuned_rule']} | {r['tuned_seconds'] * 1e3:.2f} ms | `{r['untuned']}` | "
                 f"{r['untuned_seconds'] * 1e3:.2f} ms | ×{r['speedup']:.2f} | "
                 + (f"{est * 1e3:.2f} ms |" if est else "– |"))
    return "\n".join(L) + "\n"


def main(argv=None):
    from clmf.engine.device import device_label
    p = argparse.ArgumentParser(prog="python -m clmf.autotune.check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", default=None)
    p.add_argument("--preset", default=None)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--log1p", action="store_true")
    p.add_argument("--factors", "-f", default="10")
    p.add_argument("--device", "-d", default="auto")
    p.add_argument("--feedback", default="explicit", choices=["explicit", "implicit"])
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--biases", action="store_true")
    p.add_argument("--regularization", type=float, default=0.05)
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output", "-o", default=None, help="markdown file (a .json beside it)")
    a = p.parse_args(argv)
    from . import load_data
    R, name = load_data(a.data, a.preset, a.scale, log1p=a.log1p)
    mode = "implicit" if a.feedback == "implicit" else "biased" if a.biases else "explicit"
    factors = [int(x) for x in a.factors.split(",")]
    t0 = time.perf_counter()
    info, rows = check(R, factors, a.device, mode, a.alpha, a.regularization, a.iterations,
                       a.rounds)
    args = argv if argv is not None else sys.argv[1:]
    command = "python -m clmf.autotune.check " + " ".join(args)
    text = markdown(info, rows, f"Tuned vs untuned by whole fits: {name}", command)
    if a.output:
        os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
        with open(a.output, "w") as fh:
            fh.write(text)
        with open(os.path.splitext(a.output)[0] + ".json", "w") as fh:
            json.dump({"dataset": name, "device": device_label(info),
                       "driver": info.driver, "rows": rows}, fh, indent=1)
    print(text, end="")
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
