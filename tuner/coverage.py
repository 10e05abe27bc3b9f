"""The coverage table: what ``variant="auto"`` runs for each (device, mode, f, data shape) and how
far that is from the cell's measured best, with the leave-one-out check of the lookup's
generalization (the selection model of :mod:`clmf.tuning.model` and the rest of the chain).

Per cell (one device, one mode, one f, one data set):

1. where ``tune`` allows and no tuning run of the cell exists (a run the lookup's ``tuned`` rung
   would use: same device, f, storage, mode and data-set class), a short budgeted tuning run
   (:func:`tune_cell`) writes one;
2. three choices of the lookup: ``auto`` (every database), ``loo`` (leave-one-out: the records
   of every tuning run of this cell left out, so the pair comes from the other cells — the
   model's prediction for an unseen cell, or a lower rung) and ``tuned`` (the cell's own best
   records, when there are any);
3. each distinct pair timed by whole fits (``ALS(variant=(users, items))``, the pair run as
   given), round-robin over ``rounds`` so the pairs share the machine's conditions: the median
   s/it after the first iteration and the whole fit's wall time;
4. the row: each choice's rule, pair and s/it, the cell's measured best (the fastest of the
   distinct pairs timed) and the ratios auto / best and loo / best.

:func:`loo_check` counts the cells whose leave-one-out choice is within ``tol`` (15 %) of the
measured best: the issue's criterion is ≥ 90 % of the cells. :func:`markdown` writes the table.
``scripts/coverage.py`` is the command line; ``scripts/gpu_implicit.py`` measures the GPU cells.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import statistics
import time

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["Cell", "cell_runs", "runs_of", "choices", "loo_choices", "tune_cell", "time_pairs",
           "measure_cell", "loo_check", "markdown", "LOO_TOL", "fit_kwargs"]

LOO_TOL = 1.15          # a choice within 15 % of the cell's measured best
LOO_SHARE = 0.90        # ... in at least 90 % of the cells


@dataclasses.dataclass
class Cell:
    """One cell of the table: a device, a data set (users × items CSR), f and a mode."""
    device: object
    R: object
    dataset: str
    f: int
    mode: str = "explicit"
    alpha: float = 2.0
    storage: str = "float32"

    @property
    def info(self):
        """The device's :class:`clmf.engine.device.DeviceInfo`."""
        from clmf.engine.device import device_info
        return device_info(self.device)

    def stats(self):
        """Per side the statistics ``ALS.fit`` passes to the lookup (rows, cols, nnz, ...)."""
        from clmf.tuning import side_stats
        R = self.R
        m, n = R.shape
        return {"users": side_stats(np.diff(R.indptr), n),
                "items": side_stats(np.bincount(R.indices, minlength=n), m)}

    def key(self):
        """What identifies the cell in a results file."""
        from clmf.engine.device import device_label
        return {"device": device_label(self.info), "mode": self.mode, "f": int(self.f),
                "dataset": self.dataset, "storage": self.storage}


def fit_kwargs(mode, alpha=2.0):
    """The ``ALS`` keywords of a tuning mode (implicit: confidence 1 + alpha·r, as tuned)."""
    if mode == "implicit":
        return dict(feedback="implicit", alpha=float(alpha))
    return dict(biases=True) if mode == "biased" else {}


def cell_runs(cell, sources=None):
    """The run ids of every database's tuning runs of ``cell`` (:func:`runs_of` its device, f,
    mode, storage and data shape)."""
    from clmf import tuning
    R = cell.R
    ds = {"m": R.shape[0], "n": R.shape[1], "nnz": int(R.nnz)}
    return runs_of(tuning.device_record(cell.info), cell.f, cell.mode, cell.storage, ds, sources)


def runs_of(dev, f, mode, storage, ds, sources=None):
    """The run ids of every database's tuning runs of one cell — device key ``dev``, ``f``,
    ``mode``, ``storage``, data set ``ds`` ({m, n, nnz}) — in ``sources``
    (:func:`clmf.tuning.lookup.record_sources`' list, default every database): the runs the
    lookup's ``tuned`` rung could answer it from (same device, f, storage and mode, data-set
    class within :data:`clmf.tuning.CLASS_TOL`), and the runs with measurements of the cell but
    no best records (a run cut short), which the selection model would read as the case
    itself. The leave-one-out leaves all of them out."""
    from clmf import tuning
    from clmf.tuning import lookup
    from clmf.tuning.index import model_records
    from clmf.tuning.schema import record_mode, same_device
    out = set()
    for origin, p, recs in (lookup.record_sources() if sources is None else sources):
        for c in lookup.record_cases(recs, origin):
            if (c.mode == mode and c.f == f and c.storage == storage
                    and same_device(c.device, dev)
                    and tuning.class_distance(c.dataset, ds) <= tuning.CLASS_TOL):
                out.add(c.run_id)
        # (the sources list best records; the model reads the measurements of the file)
        measured = recs if not isinstance(p, (str, os.PathLike)) or not os.path.isfile(p) \
            else (model_records(p) or [])
        for r in measured:
            if (r.get("kind") == "measurement" and r.get("run_id") not in out
                    and r.get("f") == f and record_mode(r) == mode
                    and r.get("storage", "float32") == storage
                    and isinstance(r.get("dataset"), dict)
                    and same_device(r.get("device") or {}, dev)
                    and tuning.class_distance(_mnz(r["dataset"]), ds) <= tuning.CLASS_TOL):
                out.add(r["run_id"])
    return sorted(out)


def _mnz(d):
    """A record's data set as ``{m, n, nnz}`` (None when it lacks them)."""
    try:
        return {"m": int(d["m"]), "n": int(d["n"]), "nnz": int(d["nnz"])}
    except (KeyError, TypeError, ValueError):
        return None


def choices(cell, exclude_runs=(), tries=6):
    """``{side: Choice}`` of ``variant="auto"`` for the cell, leaving out ``exclude_runs``, as a
    fit would run it (:func:`loo_choices`, each pick built on the cell's device)."""
    return loo_choices(cell.info, cell.f, cell.stats(), cell.mode, exclude_runs,
                       lambda cfg: _build(cell, cfg), cell.storage, tries)


def loo_choices(info, f, stats, mode, exclude_runs, build, storage="float32", tries=6,
                paths=None):
    """``{side: Choice}`` of ``variant="auto"`` on device ``info`` for f, the sides' ``stats``
    and ``mode``, leaving out the runs ``exclude_runs`` (the leave-one-out's one home: the
    on-device check and :mod:`clmf.autotune.loo` both ask here), as a fit would run it: a pick
    that ``build(config)`` refuses (InvalidConfigError: a built kernel's work-group limit below
    the configuration's, which validation before building cannot know) is rejected and the
    lookup asked again (:class:`clmf.model.trainer` does the same). ``paths``: read only these
    database files."""
    from clmf import tuning
    from clmf.errors import InvalidConfigError
    from clmf.tuning import fallback
    for _ in range(tries):
        picks = tuning.incumbent(info, f, stats, storage, None, mode,
                                 exclude_runs=exclude_runs, paths=paths)
        bad = None
        for ch in picks.values():
            try:
                build(ch.config)
            except InvalidConfigError as e:
                bad = (ch, e)
                break
        if bad is None:
            return picks
        ch, e = bad
        fallback.reject(info, ch.config, f, mode, f"the {ch.rule} rule", e)
    return picks


def _build(cell, cfg):
    """Build ``cfg``'s ALS program for the cell on its device (the program cache keeps it for
    the timed fits); raises InvalidConfigError where the device refuses it."""
    import pyopencl as cl

    from clmf.engine.kernels import als_program
    from clmf.tuning.spec import kernel_factors
    ctx = _contexts.get(id(cell.device))
    if ctx is None:
        ctx = _contexts[id(cell.device)] = cl.Context([cell.device])
    als_program(ctx, cell.device, cfg, kernel_factors(cell.f, cell.mode), cell.info,
                implicit=cell.mode == "implicit", biased=cell.mode == "biased")


_contexts: dict = {}


def tune_cell(cell, db, budget=60.0, state_dir=None, space="default", sample="auto", seed=0):
    """A budgeted tuning run of the cell into the database ``db`` (its summary)."""
    from . import tune
    kw = dict(factors=[cell.f], device=cell.device, strategy="budgeted", budget=float(budget),
              space=space, db=db, dataset=cell.dataset, storage=cell.storage, seed=seed,
              state_dir=state_dir, progress=False, mode=cell.mode, alpha=cell.alpha,
              sample=sample)
    return tune(cell.R, **kw)[0]


def _pair_key(pair):
    return (pair["users"].key(), pair["items"].key())


def time_pairs(cell, pairs, iterations=4, rounds=2, confidence=None, seed=0):
    """``{name: timing}`` of each pair of ``pairs`` (name → {side: KernelConfig}) by whole fits,
    round-robin ``rounds`` times; pairs with the same configurations are fitted once. A timing
    holds ``s_per_it`` (the median over rounds of each fit's median s/it after the first
    iteration), ``whole_s`` (median whole-fit wall time), ``fits`` and ``status`` (``ok`` or the
    error that stopped it)."""
    import clmf
    distinct = {}
    for name, pair in pairs.items():
        distinct.setdefault(_pair_key(pair), (pair, []))[1].append(name)
    kw = fit_kwargs(cell.mode, cell.alpha)
    if confidence and cell.mode == "implicit":
        kw["confidence"] = confidence
    res = {k: {"its": [], "whole": [], "status": "ok"} for k in distinct}
    for _ in range(max(1, int(rounds))):
        for k, (pair, _names) in distinct.items():
            if res[k]["status"] != "ok":
                continue
            try:
                m = clmf.ALS(cell.f, iterations=max(2, int(iterations)), device=cell.device,
                             variant=(pair["users"], pair["items"]), random_state=seed, **kw)
                m.fit(cell.R, show_progress=False)
            except clmf.ClmfError as e:
                res[k]["status"] = f"{type(e).__name__}: {e}"[:300]
                continue
            secs = [h["seconds"] for h in m.history_]
            res[k]["its"].append(statistics.median(secs[1:]))
            res[k]["whole"].append(m.timings_["fit"])
    out = {}
    for k, (pair, names) in distinct.items():
        r = res[k]
        t = {"status": r["status"], "fits": len(r["its"]),
             "s_per_it": statistics.median(r["its"]) if r["its"] else None,
             "whole_s": statistics.median(r["whole"]) if r["whole"] else None}
        for n in names:
            out[n] = t
    return out


def _pair_text(pair):
    u, i = str(pair["users"]), str(pair["items"])
    return u if u == i else f"{u} | {i}"


def measure_cell(cell, tune="missing", db=None, budget=60.0, iterations=4, rounds=2,
                 state_dir=None, space="default", sample="auto"):
    """One row of the table (see the module docstring); ``tune``: "missing" (tune a cell that
    has no tuning run, into ``db``) or "never"."""
    t0 = time.perf_counter()
    row = dict(cell.key())
    R = cell.R
    row.update(m=int(R.shape[0]), n=int(R.shape[1]), nnz=int(R.nnz))
    runs = cell_runs(cell)
    row["tuned_here"] = False
    if not runs and tune == "missing":
        if db is None:
            raise ValueError("tuning a cell needs a database (db=)")
        s = tune_cell(cell, db, budget, state_dir, space, sample)
        row["tuned_here"] = True
        row["tune_seconds"] = round(time.perf_counter() - t0, 3)
        row["tune_run"] = s.get("run_id")
        runs = cell_runs(cell)
    row["cell_runs"] = runs
    picks = {"auto": choices(cell)}
    if runs:
        picks["loo"] = choices(cell, exclude_runs=runs)
    pairs = {name: {s: ch.config for s, ch in c.items()} for name, c in picks.items()}
    for name, c in picks.items():
        row[f"{name}_rule"] = c["users"].rule if c["users"].rule == c["items"].rule else \
            f"{c['users'].rule}/{c['items'].rule}"
        row[f"{name}_config"] = _pair_text(pairs[name])
        row[f"{name}_reason"] = c["users"].reason[:300]
    times = time_pairs(cell, pairs, iterations, rounds)
    ok = [t["s_per_it"] for t in times.values() if t["s_per_it"]]
    best = min(ok) if ok else None
    row["best_s_per_it"] = best
    for name in picks:
        t = times[name]
        row[f"{name}_s_per_it"] = t["s_per_it"]
        row[f"{name}_whole_s"] = t["whole_s"]
        row[f"{name}_status"] = t["status"]
        row[f"{name}_ratio"] = (t["s_per_it"] / best) if (t["s_per_it"] and best) else None
    row["best_of"] = sorted(n for n in picks if best and times[n]["s_per_it"] == best)
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


def loo_check(rows, tol=LOO_TOL, share=LOO_SHARE):
    """``{"cells", "within", "share", "ok", "tol"}`` of the leave-one-out choices: the cells with
    a ``loo`` timing, and how many are within ``tol`` of their measured best (``ok``: at least
    ``share`` of them)."""
    cells = [r for r in rows if r.get("loo_ratio") is not None]
    within = sum(1 for r in cells if r["loo_ratio"] <= tol)
    frac = within / len(cells) if cells else float("nan")
    return {"cells": len(cells), "within": within, "share": frac, "tol": tol,
            "ok": bool(cells) and frac >= share}


def _fmt(x, spec=".4g"):
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown(rows, title="Coverage", header=""):
    """The table of ``rows`` (one per cell) and the leave-one-out check, as markdown."""
    lines = [f"# {title}", ""]
    if header:
        lines += [header, ""]
    lines += ["| device | mode | f | data set | auto s/it | rule | best s/it | auto / best | "
              "leave-one-out s/it | its rule | loo / best | tuned here |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["device"], r["dataset"], r["mode"], r["f"])):
        lines.append(
            f"| {r['device'].replace('|', '/')} | {r['mode']} | {r['f']} | {r['dataset']} | "
            f"{_fmt(r.get('auto_s_per_it'))} | {r.get('auto_rule', '—')} | "
            f"{_fmt(r.get('best_s_per_it'))} | {_fmt(r.get('auto_ratio'), '.2f')} | "
            f"{_fmt(r.get('loo_s_per_it'))} | {r.get('loo_rule', '—')} | "
            f"{_fmt(r.get('loo_ratio'), '.2f')} | {'yes' if r.get('tuned_here') else 'no'} |")
    c = loo_check(rows)
    lines += ["", f"Leave-one-out: {c['within']} of {c['cells']} cells within "
                  f"{(c['tol'] - 1) * 100:.0f} % of their measured best "
                  f"({_fmt(c['share'] * 100 if c['cells'] else None, '.0f')} %; "
                  f"criterion ≥ {LOO_SHARE * 100:.0f} %: {'met' if c['ok'] else 'not met'})."]
    auto = [r for r in rows if r.get("auto_ratio") is not None]
    if auto:
        w = sum(1 for r in auto if r["auto_ratio"] <= LOO_TOL)
        lines.append(f"auto: {w} of {len(auto)} cells within {(LOO_TOL - 1) * 100:.0f} % of "
                     "their measured best.")
    lines += ["", "Times are whole fits' median s/it after the first iteration, each pair "
                  "timed round-robin with the others of its cell; `best` is the fastest pair "
                  "timed in the cell; the leave-one-out choice is the lookup's with every "
                  "tuning run of the cell left out."]
    return "\n".join(lines) + "\n"


def read_rows(path):
    """The rows of a results file (JSON Lines), [] when missing; a torn last line is skipped."""
    p = pathlib.Path(path)
    if not p.is_file():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def append_row(path, row):
    """Append one row to a results file (flushed: a killed run keeps what it finished)."""
    p = pathlib.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as fh:
        fh.write(json.dumps(row, sort_keys=True) + "\n")
        fh.flush()


def done(rows, cell):
    """Whether ``rows`` already hold ``cell``."""
    k = cell.key()
    return any(all(r.get(x) == v for x, v in k.items()) for r in rows)
