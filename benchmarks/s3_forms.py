#!/usr/bin/env python3
"""Per-stage seconds of clmf's iteration for several configurations, side by side.

Every configuration gets a profiled engine on the same data and device; the engines then run
``--rounds`` rounds, each one iteration of every configuration in turn (alternating, so that the
load of a shared machine falls on all of them alike), and the per-stage medians are reported with
their ratio to the first configuration. A configuration is ``USERS[/ITEMS]`` in the variant
grammar (one string: both sides). ``--mode`` (default ``implicit``) also times explicit and biased
iterations (the data's raw ratings; biased: the global mean as the offset).

    python -P benchmarks/s3_forms.py results/bench/s3-forms --data synthetic:100000x20000x5000000 \\
        --device intel --factors 64 \\
        --config "batch+reg+vec8:ty=2,solve_wg=16,solver=fusedcg" \\
                 "batch+reg+vec8:ty=2,solve_wg=1,solve_rows=16,solver=fusedcg"

Writes OUT/s3_forms.json and OUT/s3_forms.md (device, driver, date, commit, command, load).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np


def log(msg):
    """Timestamped progress on stderr."""
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", file=sys.stderr,
          flush=True)


def load(spec, seed, mode="implicit"):
    """The CSR of a data set spec (``synthetic:UxIxN``, or a file/directory clmf.data reads),
    with implicit-feedback values in implicit mode (log1p of the counts for a file)."""
    import clmf.data
    got = clmf.data.synthetic_from_spec(spec, seed=seed)
    if got is not None:
        data, name = got
    else:
        p = pathlib.Path(spec)
        data, name = clmf.data.load(str(p / "ratings.csv" if p.is_dir() else p)), p.stem
    if got is None and mode == "implicit":
        data = clmf.data.Ratings(data.users, data.items, np.log1p(data.ratings).astype(np.float32),
                                data.timestamps, data.user_ids, data.item_ids)
    return data.to_csr(), name


def main(argv=None):
    """Run the comparison and write the tables."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--data", default="synthetic:100000x20000x5000000")
    p.add_argument("--device", default="intel")
    p.add_argument("--factors", type=int, default=64)
    p.add_argument("--config", nargs="+", required=True)
    p.add_argument("--regularization", type=float, default=0.05)
    p.add_argument("--alpha", type=float, default=2.0)
    p.add_argument("--mode", choices=["implicit", "explicit", "biased"], default="implicit")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from clmf.engine.config import KernelConfig
    from clmf.engine.core import Engine
    from clmf.engine.device import device_info, device_label, select_device
    from clmf.reference import start_factors
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    R, name = load(a.data, a.seed, a.mode)
    implicit, biased = a.mode == "implicit", a.mode == "biased"
    dev = select_device(a.device)
    info = device_info(dev)
    log(f"{name}: {R.shape} {R.nnz} ratings on {device_label(info)}")
    X0, Y0 = start_factors(*R.shape, a.factors, a.seed)
    engines = []
    for text in a.config:
        u, _, i = text.partition("/")
        cfgs = (KernelConfig.parse(u), KernelConfig.parse(i or u))
        eng = Engine(dev, R, a.factors, cfgs, profile=True,
                     implicit_alpha=a.alpha if implicit else None, biased=biased,
                     offset=float(R.data.mean()) if biased else 0.0)
        eng.set_factors("users", X0)
        eng.set_factors("items", Y0)
        eng.iteration(a.regularization, False)            # builds, first touch: not counted
        eng.queue.finish()
        engines.append((text, eng, []))
    for r in range(a.rounds):
        for text, eng, got in engines:
            eng.set_factors("users", X0)
            eng.set_factors("items", Y0)
            eng.queue.finish()
            eng.stage_times = {k: 0.0 for k in eng.stage_times}
            t = time.perf_counter()
            eng.iteration(a.regularization, False)
            eng.queue.finish()
            got.append(dict(eng.stage_times, wall_s=time.perf_counter() - t))
        log(f"round {r}: " + ", ".join(f"{g[-1]['wall_s']:.3f}" for _, _, g in engines))
    rows = []
    for text, eng, got in engines:
        med = {k: statistics.median(g[k] for g in got) for k in got[0]}
        X = eng.get_factors("users") if hasattr(eng, "get_factors") else None
        rows.append(dict(config=text, **med,
                         users_norm=float(np.linalg.norm(X)) if X is not None else None))
        eng.release()
    base = rows[0]
    for row in rows:
        row["wall_ratio"] = base["wall_s"] / row["wall_s"]
        row["s3_ratio"] = base["s3"] / row["s3"] if row["s3"] else None
    meta = dict(data=name, shape=list(R.shape), nnz=int(R.nnz), f=a.factors,
                device=device_label(info), driver=info.driver,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                commit=os.environ.get("CLMF_COMMIT", "unknown"),
                command="python -P benchmarks/s3_forms.py " + " ".join(
                    f'"{x}"' if any(c in x for c in " ,+/") else x for x in sys.argv[1:]),
                load_start=load0, load_end=os.getloadavg()[0], rounds=a.rounds,
                regularization=a.regularization, alpha=a.alpha, mode=a.mode)
    (out / "s3_forms.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [f"# {a.mode.capitalize()} iteration by stage, configurations side by side — "
             f"{meta['date']}", "",
             f"- data: {name} {R.shape[0]} × {R.shape[1]}, {R.nnz} ratings, f = {a.factors}",
             f"- device: {meta['device']}, driver {info.driver}",
             f"- commit: {meta['commit']}; load (1 min) {load0:.2f} / {meta['load_end']:.2f}",
             f"- command: `{meta['command']}`",
             f"- medians of {a.rounds} alternating rounds, s per iteration; ratios: the first "
             "configuration's seconds ÷ this one's", "",
             "| configuration (users / items) | wall | S1 | S2 | S3 | gram | S3 ratio "
             "| wall ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| `{row['config']}` | {row['wall_s']:.3f} | {row['s1']:.3f} | "
                     f"{row['s2']:.3f} | {row['s3']:.3f} | {row.get('gram', 0.0):.3f} | "
                     f"{row['s3_ratio'] or 0:.2f} | {row['wall_ratio']:.2f} |")
    (out / "s3_forms.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
