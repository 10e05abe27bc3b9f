#!/usr/bin/env python3
"""Tune one device on the standard cases and write its database and reports (results/tuning/).

Cases: MovieLens 100K (``ua.base``) and a synthetic Netflix-shaped set at ``--netflix-scale``
(0.05 ≈ 5M ratings on CPUs; 1.0 = the full 480,189 × 17,770 shape with 99M ratings on a GPU), at
each f of ``--factors``, with the budgeted strategy over the ``--space`` (``--budgets`` seconds
of measurement per f). Optionally (``--compare``) first the budgeted-vs-exhaustive comparison on
the bounded space (scripts/tune_compare.py) for MovieLens 100K at the first f. The database is
``<out>/<device-slug>.jsonl.gz`` (gzip: one member per append, packed into one after each f);
reports go to ``<out>/reports/``, with ``summary.md`` over every database in ``<out>``.

    python scripts/tune_all.py --device Intel --ml100k ../shared/data/ml-100k --out results/tuning
"""
import argparse
import os
import pathlib
import subprocess
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto")
    p.add_argument("--ml100k", default="../shared/data/ml-100k")
    p.add_argument("--netflix-scale", type=float, default=0.05)
    p.add_argument("--factors", default="10,50,100")
    p.add_argument("--budgets", default="10:35,50:45,100:60",
                   help="f:seconds pairs (other f: the last one)")
    p.add_argument("--space", default="full", choices=["bounded", "full"])
    p.add_argument("--out", default="results/tuning")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--skip", default="",
                   help="comma-separated dataset:f cases to skip, e.g. ml-100k:10")
    p.add_argument("--sample-time", type=float, default=0.03)
    p.add_argument("--fresh", action="store_true", help="do not resume interrupted runs")
    p.add_argument("--only", default="",
                   help="comma-separated dataset:f cases to run (default all)")
    a = p.parse_args()

    from clmf import autotune
    from clmf.autotune.report import summary_markdown
    from clmf.engine.device import device_info, device_label, select_device
    from clmf.tuning import device_record, device_slug
    dev = select_device(a.device)
    info = device_info(dev)
    slug = device_slug(device_record(info))
    out = pathlib.Path(a.out)
    (out / "reports").mkdir(parents=True, exist_ok=True)
    db = out / f"{slug}.jsonl.gz"
    factors = [int(x) for x in a.factors.split(",")]
    budgets = dict((int(k), float(v)) for k, v in (x.split(":") for x in a.budgets.split(",")))
    skip = set(filter(None, a.skip.split(",")))
    print(f"device: {info}\ndatabase: {db}", flush=True)
    t_all = time.perf_counter()
    if a.compare and os.path.exists(a.ml100k):
        cmd = [sys.executable, str(pathlib.Path(__file__).with_name("tune_compare.py")),
               "--device", device_label(info), "--data", a.ml100k, "-f",
               str(factors[0]), "--db", str(db), "--out", str(out / "reports")]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        skip.add(f"ml-100k:{factors[0]}")
    sets = []
    if os.path.exists(a.ml100k):
        sets.append(lambda: autotune.load_data(a.ml100k))
    else:
        print(f"no MovieLens 100K at {a.ml100k}: skipped", flush=True)
    sets.append(lambda: autotune.load_data(preset="netflix", scale=a.netflix_scale))
    for load in sets:
        t0 = time.perf_counter()
        R, name = load()
        print(f"data {name}: {R.shape[0]} × {R.shape[1]}, {R.nnz} ratings "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        for f in factors:
            if f"{name}:{f}" in skip or (a.only and f"{name}:{f}" not in a.only.split(",")):
                continue
            b = budgets.get(f, list(budgets.values())[-1])
            t0 = time.perf_counter()
            s = autotune.tune(R, factors=[f], device=dev, strategy="budgeted", budget=b,
                           space=a.space, db=db, report_dir=out / "reports", dataset=name,
                           progress=False, sample_time=a.sample_time, resume=not a.fresh)[0]
            best = s["best"]
            print(f"{name} f={f}: {s['evaluated']} configurations, {s['spent_seconds']:.0f} s "
                  f"measured, {time.perf_counter() - t0:.0f} s wall; best "
                  f"{best['iteration_seconds']:.4g} s/it, "
                  f"×{best['speedup_vs_baseline'] or 0:.2f} vs batch, "
                  f"×{best['speedup_vs_default'] or 0:.2f} vs default: users "
                  f"{best['configs']['users']} | items {best['configs']['items']}", flush=True)
        del R
    (out / "reports" / "summary.md").write_text(summary_markdown(sorted(out.glob("*.jsonl.gz"))))
    print(f"total {time.perf_counter() - t_all:.0f} s; summary {out / 'reports' / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
