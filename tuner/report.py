"""Tuning reports: a markdown summary per run, a Figure-13-style plot, and cross-device tables.

* :func:`write_run_report` — best configuration per side, its speed-up over what the user had
  (the incumbent the lookup chain chose before the run, re-timed side by side), then over the
  plain ``batch`` variant and the untuned default (the heuristic), runner-ups, what was rejected and why, and
  a plot of time over the (bx, by, tx, ty) space in the spirit of the clMF paper's Figure 13
  (one panel per tile edge bx×by, a tx × ty heat map of the best time relative to the best
  configuration). matplotlib is imported lazily (``pip install clmf[plot]``); without it the
  report says so and has no plot.
* :func:`summary_markdown` — one table over tuning databases: per data set, f and side, the best
  configuration found on each device, to show how differently they fall.

``python -m clmf.autotune.report results/tuning/*.jsonl.gz -o results/tuning/reports/summary.md``
"""
from __future__ import annotations

import logging
import math
import os
import pathlib
import re

log = logging.getLogger(__name__)

__all__ = ["write_run_report", "plot_space", "summary_markdown", "run_basename"]

SIDES = ("users", "items")


def _fmt_s(x):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if x >= 1:
        return f"{x:.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} µs"


def _slug(s):
    return re.sub(r"[^a-z0-9]+", "-", str(s).lower()).strip("-")


def _mode_label(d):
    """"" for explicit; "implicit α=2" / "biased" otherwise (records and summaries)."""
    mode = d.get("mode") or "explicit"
    if mode == "explicit":
        return ""
    if mode == "implicit" and d.get("alpha") is not None:
        return f"implicit α={d['alpha']:g}"
    return mode


def run_basename(summary):
    from clmf.tuning import device_slug
    mode = summary.get("mode") or "explicit"
    tag = "" if mode == "explicit" else "_" + _slug(mode + (
        f"-a{summary['alpha']:g}" if mode == "implicit" and summary.get("alpha") is not None else ""))
    return (f"{device_slug(summary['device'])}_{_slug(summary['dataset'])}_f{summary['f']}_"
            f"{summary['storage']}_{summary['strategy']}-{summary['space']}{tag}")


def _ok(results):
    return [r for r in results if r["status"] == "ok" and r.get("sides")]


def _cfg_str(d):
    from clmf.engine.config import KernelConfig
    return str(KernelConfig.from_dict(d))


def plot_space(summary, path):
    """Figure-13-style plot of the run's measured times; returns the path or None."""
    from clmf.engine.device import device_label
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import LogNorm
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'clmf[plot]'): no plot")
        return None
    from clmf.engine.config import KernelConfig
    res = _ok(summary["results"])
    if not res:
        return None
    f = summary.get("kernel_f") or summary["f"]
    panels = {}
    for r in res:
        c = KernelConfig.from_dict(r["config"])
        bx, by = c.tile_edges(f)
        panels.setdefault((bx, by), []).append((c, r))
    keys = sorted(panels, key=lambda k: (k != (f, f), k))
    txs = sorted({c.tx for v in panels.values() for c, _ in v})
    tys = sorted({c.ty for v in panels.values() for c, _ in v})
    fig, axes = plt.subplots(len(SIDES), len(keys), squeeze=False,
                             figsize=(max(6.5, 2.6 * len(keys) + 1.2), 2.5 * len(SIDES) + 1.0))
    best = {s: min(r["sides"][s]["seconds"] for r in res) for s in SIDES}
    vmax = max(max(r["sides"][s]["seconds"] / best[s] for r in res) for s in SIDES)
    norm = LogNorm(vmin=1.0, vmax=max(vmax, 1.01))
    im = None
    for i, side in enumerate(SIDES):
        for j, key in enumerate(keys):
            ax = axes[i][j]
            import numpy as np
            grid = np.full((len(tys), len(txs)), np.nan)
            for c, r in panels[key]:
                v = r["sides"][side]["seconds"] / best[side]
                a, b = tys.index(c.ty), txs.index(c.tx)
                if not (grid[a, b] <= v):
                    grid[a, b] = v
            im = ax.imshow(grid, origin="lower", cmap="viridis_r", norm=norm, aspect="auto")
            for a in range(len(tys)):
                for b in range(len(txs)):
                    if np.isfinite(grid[a, b]):
                        ax.text(b, a, f"{grid[a, b]:.2g}", ha="center", va="center", fontsize=6,
                                color="w" if grid[a, b] > math.sqrt(vmax) else "k")
            ax.set_xticks(range(len(txs)), [str(t) for t in txs], fontsize=7)
            ax.set_yticks(range(len(tys)), [str(t) for t in tys], fontsize=7)
            name = "untiled (bx=by=f)" if key == (f, f) else f"bx={key[0]}, by={key[1]}"
            ax.set_title(f"{side}: {name}", fontsize=8)
            if i == len(SIDES) - 1:
                ax.set_xlabel("tx", fontsize=8)
            if j == 0:
                ax.set_ylabel("ty", fontsize=8)
    d = summary["device"]
    ml = _mode_label(summary)
    fig.suptitle(f"{device_label(d)} — {summary['dataset']}, f={summary['f']}"
                 + (f", {ml}" if ml else "") + "\n"
                 "half-step time relative to the side's best (min over the other parameters)",
                 fontsize=9)
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="time / best")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_run_report(summary, out_dir, plot=True):
    """Write ``<out_dir>/<run>.md`` (and ``.png``); returns the markdown path."""
    from clmf.engine.device import device_label
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = run_basename(summary)
    md = out / f"{base}.md"
    png = out / f"{base}.png"
    d, info, ds = summary["device"], summary.get("device_info", {}), summary["dataset_class"]
    ml = _mode_label(summary)
    L = [f"# Tuning: {device_label(d)} — {summary['dataset']}, f = {summary['f']}, "
         f"{summary['storage']}" + (f", {ml}" if ml else ""), ""]
    if ml:
        L.append(f"- mode: {ml} — candidates validated against the NumPy reference of this mode "
                 "and timed in it" + (" (each half-step includes the Gram matrix YᵀY, stage "
                                      "`gram`, timed at the whole data's size, never scaled)"
                                      if summary.get("mode") == "implicit" else
                                      " (f + 1 unknowns per system: factors and the row's bias)"))
    L.append(f"- device: {device_label(d)} ({d['type']}, vendor {d['vendor']}, "
             f"{info.get('compute_units', '?')} compute units, local memory "
             f"{info.get('local_mem', 0) // 1024} KiB, work-group ≤ {info.get('max_work_group_size', '?')}), "
             f"driver {d['driver']}")
    L.append(f"- data set: {summary['dataset']}: {ds['m']} users × {ds['n']} items, {ds['nnz']} "
             f"ratings; per user mean {ds['row_mean']:.1f} / max {ds['row_max']}, per item mean "
             f"{ds['col_mean']:.1f} / max {ds['col_max']}; skew (CV) users {ds['skew_rows']:.2f}, "
             f"items {ds['skew_cols']:.2f}")
    sm = summary.get("samples") or {}
    if sm:
        L.append("- timing sample (stratified by row length, all columns kept): " + "; ".join(
            f"{s} {sm[s]['rows']} of {sm[s]['full_rows']} rows ({sm[s]['nnz']} of "
            f"{sm[s]['full_nnz']} ratings)" for s in SIDES if s in sm)
            + "; times are scaled to the whole data (S1/S2 by ratings, S3 by rows)")
    cal = summary.get("calibration") or {}
    L += _calibration_lines(cal)
    L.append(f"- strategy {summary['strategy']} over the `{summary['space']}` space; "
             f"{summary['evaluated']} configurations evaluated in {summary['spent_seconds']:.1f} s"
             + (f" (budget {summary['budget']:.0f} s)" if summary.get("budget") else "")
             + "; outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items())))
    from clmf.tuning.database import clmf_commit, now
    la = summary.get("load_average")
    L.append(f"- run {summary['run_id']}, written {now()}, clmf commit {clmf_commit()}"
             + (f"; host load average at the end {la[0]:.1f} / {la[1]:.1f} / {la[2]:.1f} "
                f"(1/5/15 min)" if la else ""))
    L.append("")
    b = summary.get("best")
    if b is None:
        L.append("**No configuration ran correctly.**")
    else:
        L.append("## Best")
        L.append("")
        gram = any("gram" in b["sides"][s]["stages_estimated"] for s in SIDES)
        L.append("| side | configuration | half-step (est.) | S1 | S2 | S3 |"
                 + (" Gram |" if gram else ""))
        L.append("|---|---|---|---|---|---|" + ("---|" if gram else ""))
        for s in SIDES:
            st = b["sides"][s]["stages_estimated"]
            L.append(f"| {s} | `{b['configs'][s]}` | {_fmt_s(b['sides'][s]['seconds'])} | "
                     f"{_fmt_s(st['s1'])} | {_fmt_s(st['s2'])} | {_fmt_s(st['s3'])} |"
                     + (f" {_fmt_s(st.get('gram'))} |" if gram else ""))
        L.append("")
        ver = b.get("verified") or {}
        if ver:
            L.append("Checked afterwards (the best of each side re-timed on "
                     + ("the whole side" if all(v["whole_side"] for v in ver.values())
                        else "the calibration check's reference") + "): " + "; ".join(
                         f"{s} {_fmt_s(v['measured_seconds'])} against the estimate "
                         f"{_fmt_s(v['estimate_seconds'])} (×{v['ratio']:.2f}"
                         + ("" if abs(v["ratio"] - 1) <= v.get("tolerance", 0.2) else
                            ", **outside the tolerance**: the sample flatters this configuration")
                         + ")" for s, v in ver.items()) + ".")
            L.append("")
        a = summary.get("anchors", {})
        base, dflt = a.get("baseline", {}), a.get("default", {})
        L += _versus_incumbent(summary)
        L.append(f"Whole iteration (both half-steps, estimated for the whole data from the "
                 f"sample): **{_fmt_s(b['iteration_seconds'])}**; speed-up "
                 f"**×{b['speedup_vs_baseline']:.2f}** vs the plain batch variant "
                 f"`{base.get('config')}` ({_fmt_s(base.get('iteration_seconds'))}) and "
                 f"×{b['speedup_vs_default']:.2f} vs the paper's heuristic "
                 f"`{dflt.get('config')}` ({_fmt_s(dflt.get('iteration_seconds'))})."
                 if b.get("speedup_vs_baseline") and b.get("speedup_vs_default") else
                 f"Whole iteration: {_fmt_s(b['iteration_seconds'])}.")
        L.append("")
        L.append("## Runner-ups")
        L.append("")
        res = _ok(summary["results"])
        for s in SIDES:
            L.append(f"{s} side (half-step, estimated; relative to the best):")
            L.append("")
            L.append("| rank | configuration | time | × best | runs |")
            L.append("|---|---|---|---|---|")
            rk = sorted(res, key=lambda r: r["sides"][s]["seconds"])
            b0 = rk[0]["sides"][s]["seconds"]
            for i, r in enumerate(rk[:6], 1):
                L.append(f"| {i} | `{_cfg_str(r['config'])}` | {_fmt_s(r['sides'][s]['seconds'])} "
                         f"| {r['sides'][s]['seconds'] / b0:.3f} | {r['sides'][s]['runs']} |")
            L.append("")
    bad = {}
    for r in summary["results"]:
        if r["status"] != "ok":
            bad.setdefault((r["status"], r["reason"]), []).append(r)
    if bad:
        L.append("## Rejected")
        L.append("")
        L.append("| status | reason | count | example |")
        L.append("|---|---|---|---|")
        for (st, reason), rs in sorted(bad.items()):
            L.append(f"| {st} | {reason} | {len(rs)} | `{_cfg_str(rs[0]['config'])}` |")
        L.append("")
    if plot and b is not None:
        p = plot_space(summary, png)
        if p:
            L.append(f"![time over (bx, by, tx, ty)]({png.name})")
            L.append("")
            L.append("Each panel: one tile edge bx×by; cells: tx (x) × ty (y), the best time of that "
                     "(bx, by, tx, ty) over the other parameters, relative to the side's best.")
        else:
            L.append("(no plot: matplotlib is not installed — `pip install 'clmf[plot]'`)")
    md.write_text("\n".join(L) + "\n")
    return md


def _versus_incumbent(summary):
    """Markdown lines: the chosen pair against what the user had (the incumbent), side by side."""
    inc, fin, b = summary.get("incumbent"), summary.get("final"), summary["best"]
    if not inc:
        return []
    cfg = inc["configs"]["users"] + ("" if inc["configs"]["items"] == inc["configs"]["users"]
                                     else f"` / `{inc['configs']['items']}")
    if not fin:
        return [f"What you had (rule `{inc['rule']}`: `{cfg}`) did not run correctly here; "
                "the search's best is recorded.", ""]
    t, i = fin[b["chosen"]]["iteration_seconds"], fin["incumbent"]["iteration_seconds"]
    where = "the whole data" if all(fin["whole_side"].values()) else \
        "the sample check's larger sample (" + ", ".join(
            f"{s} {fin['rows'][s]} rows" for s in SIDES) + ")"
    L = [f"**×{i / t:.2f} vs what you had**: {_fmt_s(t)} per iteration against "
         f"{_fmt_s(i)} for rule `{inc['rule']}`, `{cfg}` ({inc['reason']}); both re-timed side "
         f"by side on {where}, {fin['rounds']} rounds round-robin, medians."]
    if b.get("beats_incumbent"):
        L.append("The search's winner is faster than what you had: it is recorded.")
    elif fin.get("same_configuration"):
        L.append("The search's winner is what you had: it is recorded again.")
    else:
        s = fin["tuned"]
        L.append(f"The search found nothing faster (its winner `{s['configs']['users']}` / "
                 f"`{s['configs']['items']}` took {_fmt_s(s['iteration_seconds'])}): the record "
                 "written keeps what you had (`chosen: incumbent`), so `variant=\"auto\"` "
                 "goes on choosing it.")
    return L + [""]


def _calibration_lines(cal):
    """Markdown bullet lines of the sample calibration check (see clmf.autotune.measure.check_samples)."""
    if not cal:
        return []
    if cal.get("sample") == "full":
        return ["- sample: `full` — whole half-steps timed (no sampling, no scaling)"]
    sides = cal.get("sides")
    if not sides:
        return [f"- sample: `{cal.get('sample', 'auto')}`, not checked"]
    out = []
    for s in SIDES:
        c = sides.get(s)
        if not c:
            continue
        for x in [c, *c.get("forms", ())]:     # the probe, then one per other kernel form
            if not x.get("checked"):
                out.append(f"- sample check, {s}: {x.get('note', 'not checked')}")
                continue
            ref, steps = x["reference"], x["steps"]
            what = "the whole side" if ref.get("whole_side") else \
                f"a larger sample ({ref['rows']} rows, estimate)"
            tried = " → ".join(f"{y['rows']} rows ×{y['ratio']:.2f}" for y in steps)
            out.append(
                f"- sample check, {s} (probe `{x['probe']}`, tolerance {x['tolerance']:.0%}): "
                f"{what} {_fmt_s(ref['estimate_seconds'])}; sample estimates / reference: "
                f"{tried}" + ("; grown" if x.get("grown") else "; kept"))
    return out


# ----- cross-device summary ----------------------------------------------------------------------
def summary_markdown(paths, title="Tuned configurations"):
    """A markdown table of the best configuration per (data set, f, side) and device, from the
    ``best`` records of the given databases (the best-relative-to-baseline run per cell)."""
    from clmf.tuning import read_database
    cells, devices = {}, []
    for p in paths:
        recs = read_database(p) or []
        for r in recs:
            if r.get("kind") != "best":
                continue
            dev = f"{r['device']['platform']} &#124; {r['device']['device']}"
            if dev not in devices:
                devices.append(dev)
            ml = _mode_label(r)
            name = r["dataset"].get("name", "?") + (f" ({ml})" if ml else "")
            k = (name, r["f"], r.get("storage", "float32"), r["side"])
            cur = cells.setdefault(k, {}).get(dev)
            rel = r.get("iteration_rel_baseline") or 1.0
            if cur is None or rel < (cur.get("iteration_rel_baseline") or 1.0):
                cells[k][dev] = r
    L = [f"# {title}", "",
         "Best configuration per data set, f and side on each device, with its estimated time "
         "(whole data, one half-step) and the iteration's speed-up over the baseline `batch` / the "
         "untuned default. Produced by `python -m clmf.autotune.report` from the tuning databases.", ""]
    L.append("| data set | f | side | " + " | ".join(devices) + " |")
    L.append("|---|---|---|" + "---|" * len(devices))
    for k in sorted(cells, key=lambda k: (k[0], k[1], k[2], k[3] != "users")):
        row = [k[0], str(k[1]) + ("" if k[2] == "float32" else f" ({k[2]})"), k[3]]
        for dev in devices:
            r = cells[k].get(dev)
            if r is None:
                row.append("–")
            else:
                sb, sd = r.get("speedup_vs_baseline"), r.get("speedup_vs_default")
                row.append(f"`{r['variant']}` {_fmt_s(r['seconds'])}"
                           + (f" (×{sb:.2f} / ×{sd:.2f})" if sb and sd else ""))
        L.append("| " + " | ".join(row) + " |")
    return "\n".join(L) + "\n"


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python -m clmf.autotune.report", description=summary_markdown.__doc__)
    p.add_argument("databases", nargs="+")
    p.add_argument("-o", "--output", default=None)
    a = p.parse_args(argv)
    text = summary_markdown(a.databases)
    if a.output:
        os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
        with open(a.output, "w") as fh:
            fh.write(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
