"""The selection model's leave-one-out, offline: from the raw tuning records alone, no device.

For every cell with measurements — one device, f, mode, storage and data-set class (the runs
:func:`clmf.autotune.coverage.runs_of` names, the ones the on-device check leaves out) — the
lookup is asked what ``variant="auto"`` would run with all the cell's runs left out
(:func:`clmf.autotune.coverage.loo_choices`, the on-device check's own function), on the
device as its tuning runs recorded it (their ``device_info``), without probing, and with a pick
the device refused to build at the cell's f and mode (a measurement of status ``invalid`` in
any run) rejected, as the on-device check rejects a pick that fails to build. The pick's time
is then read from the cell's own measurements:

* per side, the newest run of the cell that timed the pick's configuration (or an equal one:
  the same :func:`clmf.tuning.model.case_key`) gives its time, relative to the best of the
  side in the cell's newest run (what ``auto`` runs there) through the configurations both
  runs timed (kernels change between runs: an older run's times are compared with the newest
  run's only through such anchors, :func:`bridged_times`, never with the older run's own best,
  which newer kernels may beat);
* the pair's ratio weighs the sides by their best times (an iteration is the two half-steps);
* a cell whose pick was never timed there on a side is ``unmeasured``: not counted as a hit
  nor as a miss; the list of them is what a device must time;
* a cell whose pick failed the tuner's reference check there on a side (a measurement of
  status ``wrong`` at the cell's device, f and mode: its error after one iteration beyond
  ``verify_tolerance``) is ``wrong``: a miss whatever its time — ``auto`` would run a
  configuration the tuner refused for its accuracy (H100 explicit f = 32 and 64: the ``mma``
  form in tf32, 0.0049 and 0.0054 > 0.001).

Tuning measurements estimate a half-step from a sample of rows, so a ratio here is close to,
not equal to, the on-device check's whole-fit ratio; ``--compare`` puts the latter beside it.

``python -m clmf.autotune.loo results/tuning/*.jsonl.gz [--device H100] [--compare
results/bench/gpu-implicit/run-39g/*/coverage.jsonl] [--json OUT.jsonl] [--markdown OUT.md]``
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import sys

log = logging.getLogger(__name__)

__all__ = ["LooCell", "cells_of", "device_infos", "refusals", "verified_wrong", "pick_ratio",
           "bridged_times",
           "offline_loo", "summary", "markdown", "main", "chosen_configs", "same_kernels_key"]

def _dev_key(d):
    """The device of a record as a hashable key (platform, vendor, type, name; no driver)."""
    from clmf.tuning.schema import device_identity
    return device_identity(d)


@dataclasses.dataclass
class LooCell:
    """One cell of the offline leave-one-out: a device, f, mode, storage and data set."""
    device: dict             # the device key of its records (driver included)
    f: int
    mode: str
    storage: str
    dataset: dict            # {m, n, nnz} of the cell's newest run
    runs: list               # the cell's runs (every one is left out), newest first

    def stats(self):
        """Per side the statistics a fit passes to the lookup (rows, cols, nnz)."""
        m, n, nnz = (self.dataset[k] for k in ("m", "n", "nnz"))
        return {"users": {"rows": m, "cols": n, "nnz": nnz},
                "items": {"rows": n, "cols": m, "nnz": nnz}}


def _records(paths):
    """Every record of the database files ``paths`` (:func:`clmf.tuning.read_database`)."""
    from clmf.tuning.database import read_database
    out = []
    for p in paths:
        out += read_database(p) or []
    return out


def device_infos(records):
    """``{device key: DeviceInfo}`` of every device whose runs recorded one (the newest run's:
    older ones lack some fields, e.g. NVIDIA's compute capability)."""
    from clmf.engine.device import DeviceInfo
    names = {f.name for f in dataclasses.fields(DeviceInfo)}
    newest = {}
    for r in records:
        d = r.get("device_info")
        if r.get("kind") != "run" or not isinstance(d, dict):
            continue
        k = _dev_key(r.get("device"))
        if k not in newest or str(r.get("date", "")) >= newest[k][0]:
            newest[k] = (str(r.get("date", "")), d)
    out = {}
    for k, (_date, d) in newest.items():
        d = {x: v for x, v in d.items() if x in names}
        for x in ("max_work_item_sizes", "compute_capability"):
            if x in d:
                d[x] = tuple(d[x])
        try:
            out[k] = DeviceInfo(**d)
        except TypeError as e:
            log.warning("device %s: its run records' device_info is incomplete (%s)", k, e)
    return out


def _ok_measurements(records):
    """The ok measurements of ``records`` with a usable configuration, time, mode and data set:
    ``[(record, config key, KernelConfig)]``."""
    from clmf.tuning import model as M
    from clmf.tuning.schema import record_mode
    out = []
    for r in records:
        if M.group_key(r) is None or record_mode(r) is None:
            continue
        c = M._config(r.get("config"))
        ds = r.get("dataset")
        if c is None or not isinstance(ds, dict) or not all(k in ds for k in ("m", "n", "nnz")):
            continue
        out.append((r, c[0], c[1]))
    return out


def cells_of(records, sources):
    """The :class:`LooCell` s of the ok measurements in ``records``: runs of one device, f, mode
    and storage whose data sets are of one class (within :data:`clmf.tuning.CLASS_TOL` of the
    cell's newest run), each with every run :func:`clmf.autotune.coverage.runs_of` finds in
    ``sources`` for it."""
    from clmf import tuning
    from clmf.tuning.schema import record_mode

    from .coverage import runs_of
    runs = {}
    for r, _key, _c in _ok_measurements(records):
        ds = {k: int(r["dataset"][k]) for k in ("m", "n", "nnz")}
        cur = runs.setdefault(r["run_id"], (r, ds, str(r.get("date", ""))))
        if str(r.get("date", "")) > cur[2]:
            runs[r["run_id"]] = (cur[0], cur[1], str(r.get("date", "")))
    cells = []
    for run_id, (r, ds, date) in sorted(runs.items(), key=lambda t: (t[1][2], t[0]),
                                        reverse=True):
        key = (_dev_key(r["device"]), int(r["f"]), record_mode(r), r.get("storage", "float32"))
        for c in cells:
            if c[0] == key and tuning.class_distance(c[1].dataset, ds) <= tuning.CLASS_TOL:
                c[1].runs.append(run_id)
                break
        else:
            cells.append((key, LooCell(r["device"], key[1], key[2], key[3], ds, [run_id])))
    out = []
    for _key, c in cells:
        extra = runs_of(c.device, c.f, c.mode, c.storage, c.dataset, sources)
        c.runs += sorted(set(extra) - set(c.runs))
        out.append(c)
    return sorted(out, key=lambda c: (c.device.get("device", ""), c.dataset["nnz"], c.mode, c.f))


def _measurements_of(records, status):
    """``(device key, f, mode), (config key, KernelConfig), record`` of each measurement of
    ``status`` whose device, f, mode and configuration parse."""
    from clmf.tuning import model as M
    from clmf.tuning.schema import record_mode
    for r in records:
        if r.get("kind") != "measurement" or r.get("status") != status:
            continue
        c = M._config(r.get("config"))
        try:
            key = (_dev_key(r.get("device")), int(r["f"]), record_mode(r))
        except (KeyError, TypeError, ValueError):
            continue
        if c is not None:
            yield key, c, r


def refusals(records):
    """``{(device key, f, mode): {config key}}`` of the configurations a device refused to run
    (measurements of status ``invalid``: a built kernel's limits below the configuration's)."""
    out = {}
    for key, c, _r in _measurements_of(records, "invalid"):
        out.setdefault(key, set()).add(c[0])
    return out


def verified_wrong(records):
    """``{(device key, f, mode): [(KernelConfig, relative error)]}`` of the configurations a
    tuning run found wrong (measurements of status ``wrong``: the reference check's error after
    one iteration beyond the tolerance)."""
    out = {}
    for key, c, r in _measurements_of(records, "wrong"):
        out.setdefault(key, []).append((c[1], r.get("verify_rel_err")))
    return out


def _run_times(raw, key):
    """``{key: seconds}`` of one run's side (``raw``: {config key: (seconds, KernelConfig)}),
    equal configurations (the same ``key``) at their fastest."""
    times = {}
    for _k, (t, c) in raw.items():
        kc = key(c)
        times[kc] = min(t, times.get(kc, t))
    return times


def bridged_times(runs, side, measured, key):
    """``(base run, {run: {key: seconds}})`` of the runs ``runs`` (newest first) on ``side``,
    every run's times in the units of the base run — the newest that measured the side: a run
    is scaled by the median ratio of the configurations it shares with the runs already
    scaled (the anchors a newer run re-times), and a run sharing none is left out. Each run's
    sampled estimates are compared among themselves only through such anchors, so a
    configuration an older run timed is set against the cell's newest best, not that older
    run's best (kernels change between runs: an older run may never have measured what
    beats it now)."""
    from clmf.tuning import model as M
    per = [(run, _run_times(measured[(run, side)], key)) for run in runs
           if measured.get((run, side))]
    if not per:
        return None, {}
    out = {per[0][0]: per[0][1]}
    left = per[1:]
    while left:
        rest = []
        for run, times in left:
            scale = M.anchor_scale([t0 / times[k] for other in out.values()
                                    for k, t0 in other.items() if k in times])
            if scale is None:
                rest.append((run, times))
                continue
            out[run] = {k: t * scale for k, t in times.items()}
        if len(rest) == len(left):
            log.debug("runs %s share no configuration with %s on %s: left out",
                      [r for r, _ in rest], per[0][0], side)
            break
        left = rest
    return per[0][0], out


def pick_ratio(cell, pick, measured, chosen=None, key=None):
    """``(ratio, {side: (relative time, run)})`` of the pair ``pick`` ({side: KernelConfig}) in
    ``cell`` from ``measured`` ({(run, side): {config key: (seconds, KernelConfig)}}): per side
    the newest run of the cell that timed it — or an equal configuration, the same ``key``
    (default :func:`clmf.tuning.model.config_key`; the offline check passes
    :func:`clmf.tuning.model.case_key`, the model's own) — with its time in the units of the
    cell's newest run (:func:`bridged_times`), relative to the newest run's reference for the
    side: the time of the configuration it chose (``chosen``: {(run, side): config key}, its
    best record's, which the tuner re-timed on the whole data side by side with what ``auto``
    ran before, and what ``auto`` runs in the cell), else its fastest estimate; the pair's
    ratio weighs the sides by those references. ``ratio`` is None when a side's pick was never
    timed in the cell (the sides then name None for it)."""
    from clmf.tuning import model as M
    key = key or M.config_key
    chosen = chosen or {}
    per, num, den = {}, 0.0, 0.0
    for side, cfg in pick.items():
        want = key(cfg)
        per[side] = None
        base, times = bridged_times(cell.runs, side, measured, key)
        if base is None:
            continue
        ch = measured[(base, side)].get(chosen.get((base, side)))
        ref = times[base][key(ch[1])] if ch else min(times[base].values())
        for run in cell.runs:
            if want in times.get(run, ()):
                per[side] = (times[run][want] / ref, run)
                num += times[run][want]
                den += ref
                break
    if any(v is None for v in per.values()):
        return None, per
    return num / den, per


def chosen_configs(records):
    """``{(run, side): config key}`` of the configurations the runs chose (their best
    records)."""
    from clmf.tuning import model as M
    out = {}
    for r in records:
        if r.get("kind") == "best" and r.get("side") in ("users", "items"):
            c = M._config(r.get("config"))
            if c is not None:
                out[(str(r.get("run_id")), r["side"])] = c[0]
    return out


def same_kernels_key(f, mode, device_type):
    """The key under which two configurations run the same kernels in a cell of ``f`` and
    ``mode`` on a device of ``device_type``: :func:`clmf.tuning.model.case_key` of the
    configuration as its kernels are built at the cell's unknowns — the S3 work-group resolved
    (``solve_wg=0`` is the default's size there: at f = 32 a syrk with ``solve_wg=32`` is the
    one without it) and the fused CG dimensions form's geometry resolved (``dims_q`` is a
    least number of slices, ``dims_p=0`` as many work-items as fit: the kernel reads only the
    slices and work-items per entry they come to, :meth:`KernelConfig.fcg_geometry`, and with
    ``dims_shfl`` no ``dims_p`` at all; at f = 100 ``dims_q=2,dims_p=0`` is ``dims_q=2``)."""
    from clmf.tuning import model as M
    from clmf.tuning.spec import kernel_factors
    kf = kernel_factors(f, mode)

    def key(c):
        return M.case_key(c, mode, device_type, kf)
    return key


@contextlib.contextmanager
def _no_probes():
    """No configuration probed in a child process (there is no device here to probe on)."""
    from clmf.tuning.fallback import PROBE_ENV
    saved = os.environ.get(PROBE_ENV)
    os.environ[PROBE_ENV] = "off"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(PROBE_ENV, None)
        else:
            os.environ[PROBE_ENV] = saved


def offline_loo(paths, device=None, tol=None):
    """The rows of the offline leave-one-out (see the module docstring) over the database files
    ``paths``, of the devices whose name or platform contains ``device`` (all by default)."""
    from clmf.engine.device import device_label
    from clmf.errors import InvalidConfigError
    from clmf.tuning import lookup
    from clmf.tuning import model as M

    from .coverage import LOO_TOL, _pair_text, loo_choices
    tol = LOO_TOL if tol is None else tol
    paths = [pathlib.Path(p) for p in paths]
    records = _records(paths)
    sources = lookup.record_sources(paths=paths)
    infos = device_infos(records)
    refused = refusals(records)
    wrong = verified_wrong(records)
    chosen = chosen_configs(records)
    measured = {}
    for r, key, c in _ok_measurements(records):
        times = measured.setdefault((r["run_id"], r["side"]), {})
        t = float(r["seconds"])
        if key not in times or t < times[key][0]:
            times[key] = (t, c)
    want = (device or "").lower()
    rows = []
    with _no_probes():
        for cell in cells_of(records, sources):
            dk = _dev_key(cell.device)
            info = infos.get(dk)
            if info is None or want not in f"{info.platform} {info.name}".lower():
                continue

            def build(cfg, cell=cell, dk=dk):
                if M.config_key(cfg) in refused.get((dk, cell.f, cell.mode), ()):
                    raise InvalidConfigError(f"{cfg} was refused by this device at f={cell.f} "
                                             f"({cell.mode}) in a tuning run", "recorded")
            picks = loo_choices(info, cell.f, cell.stats(), cell.mode, cell.runs, build,
                                cell.storage, paths=paths)
            pair = {s: ch.config for s, ch in picks.items()}
            key = same_kernels_key(cell.f, cell.mode, info.type)
            ratio, per = pick_ratio(cell, pair, measured, chosen, key)
            bad = {k: e for k, e in ((key(c), e) for c, e in
                                     wrong.get((dk, cell.f, cell.mode), ()))}
            wrong_sides = {s: bad[key(c)] for s, c in pair.items() if key(c) in bad}
            rules = {ch.rule for ch in picks.values()}
            rows.append({
                "device": device_label(info), "f": cell.f, "mode": cell.mode,
                "storage": cell.storage, **cell.dataset, "runs": cell.runs,
                "rule": "/".join(sorted(rules)), "pick": _pair_text(pair),
                "pick_config": {s: c.to_dict() for s, c in pair.items()},
                "ratio": ratio,
                "sides": {s: (None if v is None else {"rel": v[0], "run": v[1]})
                          for s, v in per.items()},
                "wrong": wrong_sides,
                "verdict": ("wrong" if wrong_sides else "unmeasured" if ratio is None
                            else "hit" if ratio <= tol else "miss"),
                "reason": picks["users"].reason[:300]})
    return rows


def summary(rows):
    """``{device: {"cells", "measured", "hits", "unmeasured", "wrong", "share"}}`` of ``rows``
    (a ``wrong`` pick counts as a measured miss)."""
    out = {}
    for r in rows:
        s = out.setdefault(r["device"], {"cells": 0, "measured": 0, "hits": 0, "unmeasured": 0,
                                         "wrong": 0})
        s["cells"] += 1
        if r["verdict"] == "unmeasured":
            s["unmeasured"] += 1
        else:
            s["measured"] += 1
            s["hits"] += r["verdict"] == "hit"
            s["wrong"] += r["verdict"] == "wrong"
    for s in out.values():
        s["share"] = s["hits"] / s["measured"] if s["measured"] else float("nan")
    return out


def _compare_rows(paths):
    """The on-device coverage rows of ``paths`` (``coverage.jsonl`` files) with a leave-one-out
    ratio."""
    from .coverage import read_rows
    out = []
    for p in paths:
        out += [r for r in read_rows(p) if r.get("loo_ratio") is not None]
    return out


def _device_row(row, device_rows):
    """The on-device row of the same device, f, mode and data-set class as ``row``, or None."""
    from clmf import tuning
    for d in device_rows:
        if (d.get("device") == row["device"] and d.get("f") == row["f"]
                and d.get("mode") == row["mode"]
                and tuning.class_distance({k: d.get(k, 0) for k in ("m", "n", "nnz")},
                                          {k: row[k] for k in ("m", "n", "nnz")})
                <= tuning.CLASS_TOL):
            return d
    return None


def markdown(rows, device_rows=(), title="Offline leave-one-out of the selection model"):
    """The rows and the per-device counts as markdown (``device_rows``: on-device coverage rows
    put beside the cells they measured)."""
    from .coverage import LOO_SHARE, LOO_TOL
    lines = [f"# {title}", "",
             "| device | data set | mode | f | rule | pick | offline ratio | verdict | "
             "on-device loo / best | on-device pick |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = _device_row(r, device_rows)
        same = "" if d is None else ("same" if d.get("loo_config") == r["pick"]
                                     else d.get("loo_config", ""))
        lines.append(
            f"| {r['device'].replace('|', '/')} | {r['m']}×{r['n']} nnz={r['nnz']} | "
            f"{r['mode']} | {r['f']} | {r['rule']} | `{r['pick'].replace('|', '/')}` | "
            + ("—" if r["ratio"] is None else f"{r['ratio']:.2f}") + f" | {r['verdict']} | "
            + ("—" if d is None else f"{d['loo_ratio']:.2f}") + f" | {same.replace('|', '/')} |")
    lines.append("")
    for dev, s in summary(rows).items():
        lines.append(f"- {dev}: {s['hits']} of {s['measured']} measured cells within "
                     f"{(LOO_TOL - 1) * 100:.0f} % ({s['share'] * 100:.0f} %; criterion "
                     f"≥ {LOO_SHARE * 100:.0f} %), {s['unmeasured']} unmeasured"
                     + (f", {s['wrong']} of the misses a pick the tuner found wrong there"
                        if s["wrong"] else ""))
    return "\n".join(lines) + "\n"


def main(argv=None):
    """The command line: print the table (and write the rows / markdown where asked)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", help="raw tuning databases (results/tuning/*.jsonl.gz)")
    p.add_argument("--device", default=None, help="only devices whose name contains this")
    p.add_argument("--compare", nargs="*", default=(),
                   help="on-device coverage.jsonl files to put beside the cells")
    p.add_argument("--json", default=None, help="write the rows here (JSON Lines)")
    p.add_argument("--markdown", default=None, help="write the table here")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import warnings
    warnings.simplefilter("ignore")
    rows = offline_loo(a.paths, a.device)
    text = markdown(rows, _compare_rows(a.compare))
    if a.json:
        pathlib.Path(a.json).write_text("".join(json.dumps(r, sort_keys=True) + "\n"
                                                for r in rows))
    if a.markdown:
        pathlib.Path(a.markdown).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
