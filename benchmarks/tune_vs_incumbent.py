"""Default ``clmf tune`` runs against what a fresh install had (issue 20), with a table.

For every device × data set × mode it runs what ``clmf tune DATA -f F --device D [--biases |
--feedback implicit --alpha A] --budget B`` runs (the CLI's defaults: budgeted strategy, the
``default`` space, a checked sample), each in a fresh per-user database (``XDG_DATA_HOME`` in a
temporary directory), so "what you had" is what ``ALS(variant="auto")`` chose from the shipped
tunings alone. The tuner re-times its winner and that incumbent side by side on the whole data at
the end of each run; the table lists both (before / after) and the written record's choice.

    python benchmarks/tune_vs_incumbent.py --out results/tuning/reports \\
        --devices "Portable Computing Language,Intel(R) OpenCL" --budget 40 \\
        --data ../shared/data/ml-latest-small synthetic:3000x3600x500000

Writes ``<out>/vs_incumbent.md`` (the table), ``<out>/vs_incumbent.json`` (the summaries, without
the per-candidate results) and one markdown report per run under ``<out>/vs_incumbent/``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys
import tempfile
import time

MODES = ("explicit", "biased", "implicit")


def _cmd(data, f, dev, mode, alpha, budget):
    extra = {"explicit": "", "biased": " --biases",
             "implicit": f" --feedback implicit --alpha {alpha:g}"}[mode]
    return f'clmf tune {data} -f {f} --device "{dev}"{extra} --budget {budget:g}'


def _ms(x):
    return f"{x * 1e3:.2f} ms" if x is not None else "–"


def run(args):
    """Run every tuning; returns the rows of the table."""
    from clmf import autotune
    from clmf.autotune.report import write_run_report
    from clmf.cli import _tune_outcome
    out = pathlib.Path(args.out)
    (out / "vs_incumbent").mkdir(parents=True, exist_ok=True)
    rows = []
    for dev in args.devices.split(","):
        for data in args.data:
            R, name = autotune.load_data(data)
            for mode in args.modes.split(","):
                with tempfile.TemporaryDirectory() as home:
                    os.environ["XDG_DATA_HOME"] = home          # a fresh per-user database
                    t0 = time.perf_counter()
                    s = autotune.tune(R, factors=[args.f], device=dev, budget=args.budget,
                                   dataset=name, mode=mode, alpha=args.alpha, progress=False,
                                   state_dir=pathlib.Path(home) / "state", seed=args.seed)[0]
                    wall = time.perf_counter() - t0
                rep = write_run_report(s, out / "vs_incumbent", plot=False)
                line = _tune_outcome(s) if s.get("best") else "no configuration ran correctly"
                print(f"{dev} | {name} | {mode}: {line} ({wall:.0f} s)", flush=True)
                s.pop("results", None)
                rows.append({"device": s["device"], "device_label": dev, "dataset": name,
                             "mode": mode, "command": _cmd(data, args.f, dev, mode, args.alpha,
                                                           args.budget),
                             "wall_seconds": wall, "report": str(rep.relative_to(out)),
                             "summary": s})
    return rows


def markdown(rows, args, started):
    """The table: before (incumbent) and after (tuned) per device, data set and mode."""
    from clmf.engine.device import device_label
    from clmf.provenance import commit
    from clmf.tuning.database import now
    la = os.getloadavg()
    total = sum(r["wall_seconds"] for r in rows)
    L = ["# `clmf tune` against what you had (issue 20)", "",
         f"- written {now()} (started {started}), clmf commit {commit()}; f = {args.f}, "
         f"budget {args.budget:g} s of measurement per run (the CLI's defaults otherwise: "
         "budgeted strategy, `default` space, checked sample), implicit alpha "
         f"{args.alpha:g}; {len(rows)} runs in {total / 60:.1f} min on this 2-core host "
         f"(load average at the end {la[0]:.1f} / {la[1]:.1f} / {la[2]:.1f})",
         "- each run starts from a fresh per-user database: *before* is what "
         "`ALS(variant=\"auto\")` ran with the shipped tunings alone (the lookup's rule and "
         "configuration); *after* is what it runs after the tuning (the written record). Both "
         "were re-timed side by side at the end of the run (3 rounds round-robin, medians of "
         "the kernels' device time per iteration, on the whole data unless marked)",
         f"- command: `python benchmarks/tune_vs_incumbent.py {' '.join(sys.argv[1:])}`; per run "
         "the equivalent `clmf tune` command is listed in the JSON", ""]
    devs = []
    for r in rows:
        d = r["summary"]["device"]
        lab = f"{device_label(d)}, driver {d['driver']}"
        if lab not in devs:
            devs.append(lab)
    L += ["Devices: " + "; ".join(devs), ""]
    L += ["| device | data set | mode | before: rule, configuration | before s/it | after s/it "
          "| after / before | record keeps | evaluated | run |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, fin = r["summary"], r["summary"].get("final")
        inc = s.get("incumbent") or {}
        cfgs = inc.get("configs") or {}
        icfg = cfgs.get("users", "?") + ("" if cfgs.get("items") == cfgs.get("users")
                                         else f"` / `{cfgs.get('items')}")
        b = s.get("best") or {}
        if fin:
            bt, at = fin["incumbent"]["iteration_seconds"], fin[b["chosen"]]["iteration_seconds"]
            whole = "" if all(fin["whole_side"].values()) else " (large sample)"
            keeps = ("tuned `" + b["configs"]["users"]
                     + ("" if b["configs"]["items"] == b["configs"]["users"]
                        else f"` / `{b['configs']['items']}") + "`") \
                if b.get("chosen") == "tuned" else "what you had"
            cells = [_ms(bt) + whole, _ms(at), f"{at / bt:.3f}", keeps]
        else:
            cells = ["–", _ms(b.get("iteration_seconds")), "–", "tuned (no incumbent ran)"]
        L.append(f"| {s['device']['platform']} | {r['dataset']} | {r['mode']} | "
                 f"{inc.get('rule', '?')}, `{icfg}` | " + " | ".join(cells)
                 + f" | {s.get('evaluated')} | [report]({r['report']}) "
                 f"({r['wall_seconds']:.0f} s) |")
    ok = [r for r in rows if r["summary"].get("final")]
    worse = [r for r in ok if r["summary"]["final"][r["summary"]["best"]["chosen"]][
        "iteration_seconds"] > r["summary"]["final"]["incumbent"]["iteration_seconds"]]
    L += ["", f"after ≤ before in {len(ok) - len(worse)} of {len(ok)} runs with an incumbent "
          "(by construction: the record keeps the faster of the two side-by-side times)."]
    return "\n".join(L) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory of the table and the reports")
    p.add_argument("--devices", default="Portable Computing Language,Intel(R) OpenCL",
                   help="comma-separated device specifications")
    p.add_argument("--data", nargs="+", default=["../shared/data/ml-latest-small",
                                                 "synthetic:3000x3600x500000"])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("-f", type=int, default=50)
    p.add_argument("--budget", type=float, default=40.0)
    p.add_argument("--alpha", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from clmf.tuning.database import now
    started = now()
    rows = run(args)
    out = pathlib.Path(args.out)
    (out / "vs_incumbent.md").write_text(markdown(rows, args, started))
    with open(out / "vs_incumbent.json", "w") as fh:
        json.dump({"args": vars(args), "rows": rows}, fh, indent=1, default=str)
    print(f"wrote {out / 'vs_incumbent.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
