#!/usr/bin/env python3
"""The coverage table of ``variant="auto"`` and the leave-one-out check of the selection model
(issue 27): device × mode × f × data shape → auto's s/it, the rule that chose, the cell's
measured best, the ratio, and the same for the lookup's choice with the cell's own tunings left
out (see :mod:`clmf.autotune.coverage`).

Small, on this CPU (what CI runs, a few minutes; ``--isolated``: only the tunings this run
makes, in OUT/tuning.jsonl)::

    python scripts/coverage.py OUT --devices Portable,Intel --data synthetic:2000x1000x40000 \\
        --factors 8,16,32 --modes explicit,implicit --budget 4 --iterations 3 --isolated

Full size (the shipped tunings plus what the run tunes where a cell has none)::

    python scripts/coverage.py OUT --devices gpu --data netflix,movielens-10m \\
        --factors 16,32,64,100,128,200,256 --modes explicit,biased,implicit --budget 40 \\
        --max-seconds 540

Resumable: rows already in OUT/coverage.jsonl (or in ``--resume DIR``'s) are kept and their
cells skipped; ``--max-seconds`` stops before a cell that would start after it. Writes
OUT/coverage.jsonl (one row per cell, as it comes), OUT/coverage.md and OUT/meta.json (devices,
drivers, date, commit, command); the tuning runs' journals go to OUT/tune-state (ignored by git).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import shutil
import sys
import time


def log(msg):
    """Progress on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse(argv=None):
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("out", help="output directory")
    p.add_argument("--devices", default="auto", help="comma-separated clmf device specs")
    p.add_argument("--data", default="synthetic:2000x1000x40000",
                   help="comma-separated data sets: synthetic:UxIxN, a preset[@scale], a path")
    p.add_argument("--factors", default="8,16,32")
    p.add_argument("--modes", default="explicit,implicit,biased")
    p.add_argument("--alpha", type=float, default=2.0, help="implicit feedback's alpha")
    p.add_argument("--tune", default="missing", choices=["missing", "never"],
                   help="tune cells that have no tuning run (default) or never")
    p.add_argument("--budget", type=float, default=30.0, help="seconds per tuning run")
    p.add_argument("--space", default="default", choices=["default", "bounded", "full"])
    p.add_argument("--sample", default="auto", help="tuning sample: auto, full or a fraction")
    p.add_argument("--iterations", type=int, default=4, help="iterations of each timed fit")
    p.add_argument("--rounds", type=int, default=2, help="round-robin fits of each pair")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="start no cell after this many seconds")
    p.add_argument("--db", default=None,
                   help="the tuning database runs write to (default OUT/tuning.jsonl); the "
                        "lookup reads it first")
    p.add_argument("--db-dir", default=None,
                   help="instead of --db, one database per device: DIR/<device slug>.jsonl.gz "
                        "(e.g. results/tuning, the raw files the shipped ones are distilled "
                        "from)")
    p.add_argument("--resume", default=None,
                   help="a directory of an earlier run (its rows and tuning database) to go on "
                        "from")
    p.add_argument("--isolated", action="store_true",
                   help="no shipped or per-user tunings: only the run's own database")
    return p.parse_args(argv)


def load(spec, seed=0):
    """(users × items CSR, name) of a data-set spec (clmf.autotune.load_data's forms)."""
    from clmf import autotune
    s = spec.strip()
    if "@" in s and not s.startswith("synthetic:"):
        preset, _, sc = s.partition("@")
        return autotune.load_data(preset=preset, scale=float(sc), seed=seed)
    from clmf import data
    if s in data.list_presets():
        return autotune.load_data(preset=s, seed=seed)
    return autotune.load_data(s, seed=seed)


def meta(devices, command):
    """Where and when: devices and drivers, date, clmf commit, the command."""
    from clmf.engine.device import device_info, device_label
    from clmf.tuning.database import clmf_commit, now
    infos = [device_info(d) for d in devices]
    return {"devices": [device_label(i) for i in infos],
            "drivers": [i.driver for i in infos], "date": now(), "commit": clmf_commit(),
            "command": command, "load_average": os.getloadavg()}


def main(argv=None):
    """Run the cells not yet in OUT, then write the table."""
    a = parse(argv)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    db = pathlib.Path(a.db) if a.db else out / "tuning.jsonl"
    rows_path = out / "coverage.jsonl"
    if a.resume:
        src = pathlib.Path(a.resume)
        for name, dst in (("coverage.jsonl", rows_path), ("tuning.jsonl", db)):
            if (src / name).is_file() and not dst.is_file():
                shutil.copyfile(src / name, dst)
    if a.isolated:
        os.environ["CLMF_TUNING_NO_SHIPPED"] = "1"
        os.environ["XDG_DATA_HOME"] = str(out / "no-user-db")     # no per-user database
    logging.basicConfig(level=logging.WARNING)
    import warnings

    from clmf.autotune import coverage as C
    from clmf.engine.device import device_info, select_device
    from clmf.tuning import device_record, device_slug
    warnings.simplefilter("ignore")
    t_start = time.perf_counter()
    devices = [select_device(d.strip()) for d in a.devices.split(",") if d.strip()]
    dbs = {id(d): (pathlib.Path(a.db_dir) / f"{device_slug(device_record(device_info(d)))}.jsonl.gz"
                   if a.db_dir else db) for d in devices}
    os.environ["CLMF_TUNING_DB"] = os.pathsep.join(sorted({str(p) for p in dbs.values()}))
    command = "python scripts/coverage.py " + " ".join(sys.argv[1:] if argv is None else argv)
    (out / "meta.json").write_text(json.dumps(meta(devices, command), indent=1) + "\n")
    rows = C.read_rows(rows_path)
    factors = [int(x) for x in a.factors.split(",")]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    sample = a.sample if a.sample in ("auto", "full") else float(a.sample)
    stopped = False
    for spec in (s for s in a.data.split(",") if s.strip()):
        R, name = load(spec)
        log(f"data {name}: {R.shape[0]} × {R.shape[1]}, {R.nnz} ratings")
        for dev in devices:
            for mode in modes:
                for f in factors:
                    cell = C.Cell(dev, R, name, f, mode, a.alpha)
                    if C.done(rows, cell):
                        continue
                    if a.max_seconds and time.perf_counter() - t_start > a.max_seconds:
                        stopped = True
                        break
                    log(f"cell {cell.key()}")
                    row = C.measure_cell(cell, a.tune, dbs[id(dev)], a.budget, a.iterations,
                                         a.rounds,
                                         state_dir=out / "tune-state", space=a.space,
                                         sample=sample)
                    C.append_row(rows_path, row)
                    rows.append(row)
                    log(f"  auto {row.get('auto_s_per_it')} ({row.get('auto_rule')}), "
                        f"loo {row.get('loo_s_per_it')} ({row.get('loo_rule')}), "
                        f"best {row.get('best_s_per_it')}")
    m = json.loads((out / "meta.json").read_text())
    header = (f"Devices: {', '.join(m['devices'])} (drivers {', '.join(m['drivers'])}); "
              f"{m['date']}; commit {m['commit']}.\n\nCommand: `{command}`"
              + ("\n\n(stopped at --max-seconds: cells left)" if stopped else ""))
    (out / "coverage.md").write_text(C.markdown(rows, "Coverage of variant=\"auto\"", header))
    check = C.loo_check(rows)
    log(f"leave-one-out: {check['within']} / {check['cells']} within 15 % "
        f"({'met' if check['ok'] else 'not met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
