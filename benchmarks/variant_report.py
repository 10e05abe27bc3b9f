#!/usr/bin/env python3
"""Markdown table and a Figure-9-style plot (time per ALS iteration of each S1 variant, per data
set and f) from the CSV files written by benchmarks/variant_times.py.

    python benchmarks/variant_report.py results/variants/nvidia-h100.csv
"""
import csv
import os
import sys
from collections import OrderedDict


def load(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def label(variant):
    """Row label: the variant name, plus the solver when it is not Cholesky."""
    name = variant.split(":")[0]
    for part in variant.partition(":")[2].split(","):
        if part.strip().startswith("solver=") and part.strip() != "solver=cholesky":
            name += f" [{part.strip()[7:]}]"
    return name


def report(path):
    rows = load(path)
    base = os.path.splitext(path)[0]
    ok = [r for r in rows if r["status"] == "ok"]
    latest = OrderedDict()
    for r in ok:
        latest[(r["dataset"], int(r["f"]), r["variant"])] = r
    dev = (f"{rows[0]['device']} ({rows[0]['platform']}, driver {rows[0]['driver']})"
           if rows else "?")
    commits = sorted({r["commit"][:10] for r in rows})
    dates = sorted({r["date"][:10] for r in rows})
    lines = [f"# S1 variants: seconds per ALS iteration on {dev}", "",
             "Produced by `benchmarks/variant_times.py` then "
             f"`benchmarks/variant_report.py {path}`; "
             f"date {', '.join(dates)}, commit {', '.join(commits)}. Median of the timed "
             "iterations after one warm-up; S1/S2/S3 are device times from OpenCL profiling "
             "events. Every variant was verified against the NumPy reference on the same device "
             "first.", ""]
    for ds in OrderedDict((k[0], 0) for k in latest):
        fs = sorted({k[1] for k in latest if k[0] == ds})
        nnz = next(r for k, r in latest.items() if k[0] == ds)["nnz"]
        lines += [f"## {ds} ({nnz} ratings)", "",
                  "| variant | " + " | ".join(f"f={f} s/it (S1 / S2 / S3)" for f in fs) + " |",
                  "|---|" + "---|" * len(fs)]
        names = list(OrderedDict((label(k[2]), 0) for k in latest if k[0] == ds))
        for name in names:
            cells = []
            for f in fs:
                hit = [r for k, r in latest.items()
                       if k[0] == ds and k[1] == f and label(k[2]) == name]
                if hit:
                    r = hit[0]
                    cells.append(f"{float(r['seconds_per_iteration']):.4f} "
                                 f"({float(r['s1_seconds']):.4f} / "
                                 f"{float(r['s2_seconds']):.4f} / {float(r['s3_seconds']):.4f})")
                else:
                    cells.append("—")
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
        lines.append("")
        params = sorted({k[2] for k in latest if k[0] == ds})
        lines.append("Parameters: " + "; ".join(f"`{p}`" for p in params))
        lines.append("")
    bad = sorted({f"`{r['variant']}` f={r['f']}: {r['status']}" for r in rows
                  if r["status"] != "ok"})
    if bad:
        lines += ["Not timed: " + "; ".join(bad), ""]
    with open(base + ".md", "w") as fh:
        fh.write("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    sets = list(OrderedDict((k[0], 0) for k in latest))
    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4.5), squeeze=False)
    for ax, ds in zip(axes[0], sets):
        fs = sorted({k[1] for k in latest if k[0] == ds})
        names = list(OrderedDict((label(k[2]), 0) for k in latest if k[0] == ds))
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            ys = []
            for f in fs:
                hit = [r for k, r in latest.items()
                       if k[0] == ds and k[1] == f and label(k[2]) == name]
                ys.append(float(hit[0]["seconds_per_iteration"]) if hit else float("nan"))
            ax.bar([j + i * width for j in range(len(fs))], ys, width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(fs))])
        ax.set_xticklabels([f"f={f}" for f in fs])
        ax.set_yscale("log")
        ax.set_ylabel("seconds per ALS iteration (log)")
        ax.set_title(ds)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"S1 code variants on {dev}", fontsize=9)
    fig.tight_layout()
    fig.savefig(base + ".png", dpi=110)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        report(p)
