"""The benchmark's outputs: the CSV of every row, the Markdown report (tables, ratios, targets) and,
when matplotlib imports, the plots."""
from __future__ import annotations

import csv
import logging
import math
import os
import shlex
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


FIELDS = [
    "date", "commit", "host", "dataset", "users", "items", "nnz_train", "nnz_test", "f",
    "regularization", "iterations", "system", "kind", "platform", "device", "driver", "variant",
    "config_rule", "status", "seconds_per_iteration", "first_iteration_s", "whole_fit_s", "setup_s",
    "setup_share", "s1_s", "s2_s", "s3_s",
    "test_rmse", "rmse_vs_reference", "useful_gflop", "gflops", "frac_peak_flops",
    "effective_gb", "gbps", "frac_peak_bw",
    "s1_gflops", "s1_frac_peak_flops", "s1_gbps", "s1_frac_peak_bw",
    "s2_gflops", "s2_frac_peak_flops", "s2_gbps", "s2_frac_peak_bw",
    "s3_gflops", "s3_frac_peak_flops", "s3_gbps", "s3_frac_peak_bw",
    "device_memory_bytes", "peak_gflops", "peak_gbps", "raw_seconds", "note",
]


def _fmt(x, nd=4):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    if isinstance(x, float):
        if abs(x) < 1e-3 or abs(x) >= 1e5:
            return f"{x:.{nd}g}"
        return f"{x:.{nd}f}".rstrip("0").rstrip(".")
    return str(x)


def _write_csv(path, rows):
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else
                            "" if isinstance(v, float) else v) for k, v in r.items()})
    os.replace(tmp, path)


# ----- report ------------------------------------------------------------------------------------
def _pct(x):
    return "" if x is None or x == "" or not math.isfinite(x) else f"{100 * x:.1f}%"


def _sys_label(r):
    if r["kind"] == "clmf":
        plat = r.get("platform", "")
        short = "PoCL" if "Portable" in plat else "Intel" if "Intel" in plat else \
            "NVIDIA" if "NVIDIA" in plat else plat
        v = r.get("variant", "")
        return f"clmf {short} `{v}`" if v else f"clmf {short}"
    return r["system"]


# Targets of the performance issue (s / iteration), checked where the data match.
GPU_TARGETS = {10: 0.02, 50: 0.06, 100: 0.12}


def render_markdown(rows, meta, infos, peaks, argv=None, elapsed=None, load=None):
    L = []
    from ..engine.device import device_label
    devs = "; ".join(f"{device_label(i)} (driver {i.driver})" for i in infos)
    L.append(f"# clmf bench — {devs}\n")
    L.append(f"- date: {meta['date']}  \n- commit: {meta['commit']}  \n- host: {meta['host']}  ")
    if argv is not None:
        L.append(f"- command: `clmf bench {' '.join(shlex.quote(a) for a in argv)}`  ")
    if elapsed is not None:
        L.append(f"- run took {elapsed:.0f} s  ")
    if load is not None:
        L.append(f"- host load average (1 min) at start / end: {load[0]:.2f} / {load[1]:.2f} on "
                 f"{os.cpu_count()} CPUs (other work on the machine slows the CPU figures)  ")
    L.append("- s/it: median over the iterations after the first; GFLOP/s count useful work only "
             "(2·nnz·f(f+1) + 4·nnz·f + (m+n)f³/3 per iteration); GB/s: minimal traffic of a fused "
             "iteration (CSR once, one gather per rating, factors written); % of the *measured* "
             "peak of the device it ran on (CPU peers: the host CPU's peak as measured through "
             "OpenCL). Ratios are clmf ÷ peer in s/it: below 1, clmf is faster. Whole fit: from "
             "the host CSR to factors on the host (validation, tuning lookup, program builds, "
             "upload, iterations); set-up %: its share before the first iteration.\n")
    L.append("## Measured device limits\n")
    L.append("| device | when | FMA GFLOP/s (best width) | per width | copy GB/s (kernel) |")
    L.append("|---|---|---|---|---|")
    for r in rows:
        if r["kind"] == "peak" and r["system"] == "peak-fma":
            cp = next((x for x in rows if x["kind"] == "peak" and x["system"] == "peak-copy"
                       and x["device"] == r["device"] and x["platform"] == r["platform"]
                       and x.get("config_rule") == r.get("config_rule")), {})
            L.append(f"| {r['platform']} \\| {r['device']} | {r.get('config_rule', '')} | "
                     f"{r['gflops']:.1f} ({r['variant']}) | {r['note']} | "
                     f"{_fmt(cp.get('gbps'), 4)} ({cp.get('variant', '')}) |")
        elif r["kind"] == "peak" and r["system"] == "peak":
            L.append(f"| {r['platform']} \\| {r['device']} | | {r['status']} | | |")
    for info in infos:
        pk = peaks.get(id(info))
        if pk:
            L.append(f"| {info.platform} \\| {info.name} | **used** (best of the runs) | "
                     f"**{pk['peak_gflops']:.1f}** | | **{pk['peak_gbps']:.1f}** |")
    L.append("")
    groups = {}
    for r in rows:
        if r["kind"] in ("clmf", "peer"):
            groups.setdefault((r["dataset"], r["f"]), []).append(r)
        elif r["kind"] == "data":
            L.append(f"- data set `{r['dataset']}`: {r['status']}")
    for (ds, f), g in groups.items():
        r0 = g[0]
        L.append(f"## {ds}, f = {f}\n")
        L.append(f"{r0['users']} × {r0['items']}, {r0['nnz_train']} train / "
                 f"{r0['nnz_test']} test ratings, λ = {r0['regularization']} (weighted), "
                 f"{r0['iterations']} iterations.\n")
        L.append("| system | status | s/it | 1st it | whole fit s | set-up % | S1 s | S2 s | "
                 "S3 s | test RMSE | vs ref | GFLOP/s | % peak | GB/s | % BW | S1 % peak | "
                 "memory MiB |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in g:
            mem = r.get("device_memory_bytes")
            L.append("| " + " | ".join([
                _sys_label(r), r["status"], _fmt(r.get("seconds_per_iteration")),
                _fmt(r.get("first_iteration_s")), _fmt(r.get("whole_fit_s")),
                _pct(r.get("setup_share")) if r.get("setup_share") not in (None, "") else "",
                _fmt(r.get("s1_s")), _fmt(r.get("s2_s")),
                _fmt(r.get("s3_s")), _fmt(r.get("test_rmse")),
                (_pct(r.get("rmse_vs_reference"))
                 if r.get("rmse_vs_reference") not in (None, "") else ""),
                _fmt(r.get("gflops"), 3), _pct(r.get("frac_peak_flops")), _fmt(r.get("gbps"), 3),
                _pct(r.get("frac_peak_bw")), _pct(r.get("s1_frac_peak_flops")),
                f"{mem / 2**20:.1f}" if isinstance(mem, int) and mem else ""]) + " |")
        notes = [f"{r['system']}: {r['note']}" for r in g if r.get("note") and r["kind"] == "peer"]
        if notes:
            L.append("\n" + "  \n".join(notes))
        peers_ok = [r for r in g if r["kind"] == "peer" and r["status"] == "ok"]
        clmfs = [r for r in g if r["kind"] == "clmf" and r["status"] == "ok"]
        if clmfs and peers_ok:
            L.append("\n**Ratios clmf ÷ peer (s/it)**\n")
            L.append("| clmf | " + " | ".join(p["system"] for p in peers_ok) + " |")
            L.append("|---|" + "---|" * len(peers_ok))
            for c in clmfs:
                L.append(f"| {_sys_label(c)} | " + " | ".join(
                    f"{c['seconds_per_iteration'] / p['seconds_per_iteration']:.3f}"
                    for p in peers_ok) + " |")
        for c in clmfs:
            st = {k: c.get(f"{k}_s") or 0.0 for k in ("s1", "s2", "s3")}
            tot = sum(st.values())
            if tot <= 0:
                continue
            k = max(st, key=st.get)
            share = st[k] / c["seconds_per_iteration"]
            dev_total = tot / c["seconds_per_iteration"]
            what = {"s1": "hermitians", "s2": "right-hand sides", "s3": "solves"}[k]
            L.append(f"\n- bottleneck of {_sys_label(c)}: {k.upper()} ({what}) {share:.0%} of the "
                     f"iteration at {_pct(c.get(f'{k}_frac_peak_flops'))} of FMA peak / "
                     f"{_pct(c.get(f'{k}_frac_peak_bw'))} of copy bandwidth; kernels "
                     f"{dev_total:.0%} of the wall time (the rest: launches, host waits)")
        # targets
        lk = next((p for p in peers_ok if p["system"] == "lenskit"), None)
        for c in clmfs:
            if lk is not None and f >= 50:
                ratio = c["seconds_per_iteration"] / lk["seconds_per_iteration"]
                verdict = "met" if ratio <= 0.5 else f"missed by {ratio / 0.5:.2f}×"
                L.append(f"- target ≥ 2× faster than LensKit ({_sys_label(c)}): "
                         f"{1 / ratio:.2f}× → {verdict}")
            if "GPU" in c.get("platform", "") or "NVIDIA" in c.get("platform", ""):
                if ds == "netflix" and f in GPU_TARGETS:
                    tgt = GPU_TARGETS[f]
                    s = c["seconds_per_iteration"]
                    verdict = "met" if s <= tgt else f"missed by {s / tgt:.1f}×"
                    L.append(f"- target ≤ {tgt} s/it on the full Netflix shape ({_sys_label(c)}): "
                             f"{s:.3f} s → {verdict}")
        L.append("")
    return "\n".join(L) + "\n"


def make_plots(rows, out, name):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = {}
    ok = [r for r in rows if r["kind"] in ("clmf", "peer") and r["status"] == "ok"
          and isinstance(r.get("seconds_per_iteration"), float)]
    dsets = list(dict.fromkeys(r["dataset"] for r in ok))
    if ok:
        fig, axes = plt.subplots(1, len(dsets), figsize=(5.5 * len(dsets), 4.2), squeeze=False)
        for ax, ds in zip(axes[0], dsets):
            systems = {}
            for r in ok:
                if r["dataset"] == ds:
                    systems.setdefault(_sys_label(r).replace("`", ""), []).append(
                        (r["f"], r["seconds_per_iteration"]))
            for lab, pts in systems.items():
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        linestyle="-" if lab.startswith("clmf") else "--", label=lab[:48])
            ax.set_yscale("log")
            ax.set_xlabel("f")
            ax.set_ylabel("s / iteration")
            ax.set_title(ds)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        p = out / f"{name}-time-vs-f.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths["time-vs-f"] = p
    cl_rows = [r for r in ok if r["kind"] == "clmf" and r.get("frac_peak_flops") not in (None, "")]
    if cl_rows:
        labels = [f"{r['dataset']} f={r['f']}\n{_sys_label(r).replace('`', '')[:40]}"
                  for r in cl_rows]
        keys = [("s1_frac_peak_flops", "S1 of FMA peak"), ("s3_frac_peak_flops", "S3 of FMA peak"),
                ("frac_peak_flops", "iteration of FMA peak"), ("s2_frac_peak_bw", "S2 of copy BW"),
                ("frac_peak_bw", "iteration of copy BW")]
        fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cl_rows) + 2), 4.8))
        x = np.arange(len(cl_rows))
        wdt = 0.8 / len(keys)
        for j, (k, lab) in enumerate(keys):
            vals = [float(r.get(k) or 0.0) for r in cl_rows]
            ax.bar(x + (j - len(keys) / 2 + 0.5) * wdt, vals, wdt, label=lab)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=6, rotation=60, ha="right")
        ax.set_ylabel("fraction of measured peak")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        p = out / f"{name}-peak-fraction.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths["peak-fraction"] = p
    return paths


# ----- command line ------------------------------------------------------------------------------
