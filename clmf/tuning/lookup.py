"""Choosing a kernel configuration for a device, side and data set.

This module *reads* tuning databases and applies the fallback chain; it never tunes (that is
:mod:`clmf.autotune`, which writes the databases through :mod:`clmf.tuning.database`).

The databases are searched in the order of :func:`clmf.tuning.database.database_paths`
(``$CLMF_TUNING_DB``, the per-user database, the shipped tunings), and the first source that
answers a rung wins (so the user's own tunings win over the shipped ones at the same rung).

The fallback chain (``Choice.rule``), first hit wins:

``tuned``     the same device (platform, vendor, type, device name), f and storage, and a tuned
              data set of the same class (:func:`class_distance` ≤ :data:`CLASS_TOL`); the
              closest class first, and among equally close ones the newest run (shapes within
              :data:`SAME_SHAPE_TOL` count as one: a set's training split is the set);
``model``     the same device, an unseen (f, mode, data shape): the selection model
              (:mod:`clmf.tuning.model`) predicts each configuration's time relative to the best
              from the measurements of the device's tuning runs near the case (f, the sides'
              shapes, mode) and takes the fastest predicted that fits here;
``nearest``   the same device, the nearest tuned (f, data-set class, storage) — where the model
              has no measurements to go by;
``vendor``    the same device type and vendor (or platform) — another device of the architecture,
              records of the same platform and driver first;
``default``   the computed default: the configuration with the best mean relative time over the
              stored results of this device type (as CLBlast does);
``heuristic`` an unseen device: the paper's rule, ``batch+reg`` with tx = ty = the largest divisor
              of the tile edge that fits the device;
``baseline``  the safe ``batch`` configuration.

Modes (``mode=`` of :func:`choose`, the ``mode`` key of a record; a record without it is
``explicit``): ``explicit`` (ratings), ``implicit`` (confidence-weighted feedback, with the
Gram YᵀY per half-step) and ``biased`` (explicit with user/item biases: the kernels solve f + 1
unknowns over rows f + 2 wide). The weight term changes the best variant, so the chain looks for
tunings of the fit's mode first (the model weighs the other modes' runs less), then falls back to
explicit ones: tuned (mode) → model → nearest (mode) → tuned (explicit) → nearest (explicit) →
vendor (mode) → vendor (explicit) → default (mode) → default (explicit) → heuristic → baseline.
A choice taken from an explicit tuning for an implicit/biased fit says so in its reason and keeps
the tuning's solver: implicit feedback runs the same S1 and S3 kernels on the hermitian path (its
Gram YᵀY once per half-step), so an explicit tuning's hermitian choice transfers, and the fused CG
is chosen where a tuning measured it faster. Only with no tuning at all (heuristic, baseline) is an
implicit fit's solver the untuned default, the fused CG (:data:`MODE_DEFAULT_SOLVER`), unless the
caller asked for one.

A tuned configuration is adapted to the case before it is checked (:func:`_adapt`): its storage,
the default S3 work-group where its own does not fit, and fewer split-K slices (``ks``) for a
syrk/mma variant whose work-group exceeds the device's or a built kernel's limit at this f (the
syrk kernel tuned at f = 100 with 2 slices needs 306 work-items at f = 128, more than its
registers allow on an H100); the reason names what was changed.

Each rung returns the *pair* chosen by one tuning run (users side, items side) and keys it only on
what both sides know — (m, n, nnz) of the whole data set — so the two independent ``choose`` calls
of a fit agree (both sides share factor buffers: same storage and vector padding). Every candidate
is checked with :func:`clmf.engine.kernels.validate` on this device and f before it is returned,
and must not have failed here before: a configuration that fails to build, lacks a kernel or
exceeds a kernel's limits when the fit builds it is rejected with one warning and the lookup falls
through to the next candidate and rule; one that was never run on this device and driver (another
device's record, the computed default), unless a best record or an ok measurement of this device
and driver holds the same configuration in the fit's mode, is first probed in a child process,
since some runtimes abort the process on kernels they cannot compile (see
:mod:`clmf.tuning.fallback`).

Records are untrusted input (:func:`clmf.tuning.schema.check_record`): a line that is not JSON,
of a foreign schema, or whose fields fail the checks is reported (naming the file and line) and
skipped alone by :func:`clmf.tuning.database.read_database`; the rest of the file serves.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import warnings

from ..engine.config import KernelConfig, config_text
from ..engine.device import device_label
from ..errors import InvalidConfigError
from .database import database_paths
from .schema import (
    BASELINE,
    CLASS_TOL,
    MODE_DEFAULT_SOLVER,
    MODES,
    SAME_SHAPE_TOL,
    SIDES,
    Choice,
    TuningDatabaseWarning,
    device_identity,
    device_record,
    factor_width,
    kernel_factors,
    norm_text,
    record_mode,
    same_device,
)

log = logging.getLogger(__name__)


def dataset_class(R):
    """The data-set class of a users × items CSR: shape, nnz, nnz per row/column, skew.

    ``skew_rows``/``skew_cols`` are the coefficients of variation (std/mean) of the row/column
    lengths.
    """
    import numpy as np
    import scipy.sparse as sp
    R = sp.csr_matrix(R)
    m, n = R.shape
    rl = np.diff(R.indptr)
    cl = np.bincount(R.indices, minlength=n)

    def st(x):
        x = np.asarray(x, np.float64)
        mean = float(x.mean()) if x.size else 0.0
        return mean, int(x.max()) if x.size else 0, float(x.std() / mean) if mean > 0 else 0.0

    rm, rx, rs = st(rl)
    cm, cx, cs = st(cl)
    return {"m": int(m), "n": int(n), "nnz": int(R.nnz), "row_mean": round(rm, 4), "row_max": rx,
            "col_mean": round(cm, 4), "col_max": cx, "skew_rows": round(rs, 4),
            "skew_cols": round(cs, 4)}


def _class_from_stats(side, stats):
    """(m, n, nnz) of the whole data set from one side's statistics (as ``model.fit`` passes)."""
    if not stats:
        return None
    rows, cols, nnz = int(stats.get("rows", 0)), int(stats.get("cols", 0)), int(stats.get("nnz", 0))
    if side == "items":
        rows, cols = cols, rows
    return {"m": rows, "n": cols, "nnz": nnz}


def newest_first(case):
    """Sort key among equally close tunings: the newest run first (it measured the current kernels;
    times relative to each run's own baseline are not comparable across runs), then the run's
    own ranking."""
    try:
        age = -datetime.datetime.fromisoformat(case.date).timestamp()
    except (TypeError, ValueError):
        age = math.inf                      # undated records last
    return (age, case.rel)


def shape_distance(a, b):
    """:func:`class_distance` for ranking tunings of one class: 0 for shapes within
    :data:`SAME_SHAPE_TOL` (or no shape to compare), so the newest run among them wins."""
    if a is None or b is None:
        return 0.0
    d = class_distance(a, b)
    return 0.0 if d <= SAME_SHAPE_TOL else d


def class_distance(a, b):
    """RMS of the log-ratios of m, n and nnz (0 = same shape; log 2 ≈ 0.69 = a factor 2 apart)."""
    if a is None or b is None:
        return math.inf
    d = [math.log(max(a[k], 1) / max(b[k], 1)) for k in ("m", "n", "nnz")]
    return math.sqrt(sum(x * x for x in d) / len(d))


# ----- the cases a database holds ----------------------------------------------------------------
@dataclasses.dataclass
class _Case:
    """The best (users, items) pair of one tuning run."""
    origin: str
    device: dict
    f: int
    storage: str
    dataset: dict
    configs: dict          # side -> KernelConfig
    rel: float             # iteration time relative to the run's baseline (lower is better)
    date: str
    run_id: str
    mode: str = "explicit"


_cases_memo: dict = {}


def record_cases(records, origin):
    """The runs of one database's records (memoized per records list: read_database returns the
    same list until the file changes, so a lookup does not re-parse every record)."""
    key = (origin, id(records))
    hit = _cases_memo.get(key)
    if hit is not None and hit[0] is records:
        return hit[1]
    out = _parse_cases(records, origin)
    if len(_cases_memo) > 32:
        _cases_memo.clear()
    _cases_memo[key] = (records, out)
    return out


def _parse_cases(records, origin):
    """Every complete run (both sides' best records) of ``records`` as a :class:`_Case`."""
    best = {}
    for r in records:
        if r.get("kind") != "best" or r.get("side") not in SIDES:
            continue
        try:
            cfg = KernelConfig.from_dict(r["config"])
            key = r["run_id"]
            entry = best.setdefault(key, {"r": r, "cfg": {}})
            if r.get("date", "") >= entry["r"].get("date", ""):
                entry["r"] = r
            entry["cfg"][r["side"]] = cfg
        except (KeyError, TypeError, ValueError, InvalidConfigError) as e:
            log.debug("skipping tuning record %s: %s", r.get("run_id"), e)
    out = []
    for run_id, e in best.items():
        if set(e["cfg"]) != set(SIDES):
            continue
        r = e["r"]
        mode = record_mode(r)
        if mode is None:             # a mode this clmf does not know
            continue
        try:
            ds = {k: int(r["dataset"][k]) for k in ("m", "n", "nnz")}
            rel = float(r.get("iteration_rel_baseline") or 1.0)
            out.append(_Case(origin, r["device"], int(r["f"]), r.get("storage", "float32"), ds,
                             e["cfg"], rel, r.get("date", ""), run_id, mode))
        except (KeyError, TypeError, ValueError):
            continue
    return out


class _Sources(list):
    """[(origin, path, best records)] of the databases in search order, with the runs whose
    records are left out (``exclude_runs``: the computed default drops their measurements too)."""

    exclude_runs: frozenset = frozenset()


def record_sources(exclude_paths=(), exclude_runs=(), paths=None):
    """:class:`_Sources` of every usable database (``paths``: these database files instead of
    :func:`~clmf.tuning.database.database_paths`' search order), from the persistent index,
    leaving out the files of ``exclude_paths`` and the records of the runs in ``exclude_runs``."""
    import os

    from .index import best_records
    skip = {os.path.abspath(p) for p in exclude_paths}
    runs = frozenset(exclude_runs)
    out = _Sources()
    out.exclude_runs = runs
    where = database_paths() if paths is None else [("given", p) for p in paths]
    for origin, p in where:
        if os.path.abspath(p) in skip:
            continue
        recs = best_records(p)
        if recs and runs:
            recs = [r for r in recs if r.get("run_id") not in runs]
        if recs is not None:             # (a database of measurements only feeds the default)
            out.append((origin, p, recs))
    return out


def _fewer_slices(c):
    """``c`` with half, a quarter, ... of its split-K slices (syrk/mma: a smaller S1 work-group
    for the same tiles and sums), most slices first."""
    out, ks = [], c.ks
    while (c.syrk or c.mma) and ks > 1:
        ks //= 2
        out.append(c.replace(ks=ks))
    return out


def _valid(c, kf, info):
    """Whether configuration ``c`` validates for systems of ``kf`` unknowns on this device
    (:func:`clmf.engine.kernels.validate`: what the tuner prunes before building)."""
    from ..engine.kernels import validate
    try:
        return validate(c, kf, info)
    except InvalidConfigError:
        return False


def _adapt(c, info, kf, storage, check=None):
    """``c`` adapted to this device and f (the kernels' f), or None: its storage set; where it
    does not validate, the default S3 work-group; where it does not validate or ``check`` refuses
    it (a rejection: e.g. a built syrk kernel whose registers allow fewer work-items than its
    work-group), fewer split-K slices (:func:`_fewer_slices`: the work-group a tuning at a smaller
    f chose can exceed a kernel's limit at a larger f, and halving the slices keeps the tiles)."""
    from ..engine.kernels import mma_supported
    if c.mma and not mma_supported(info):
        return None           # tensor-core records never apply elsewhere (not even emulated)
    if c.storage != storage:
        c = c.replace(storage=storage)

    def valid(x):
        return _valid(x, kf, info)
    first = next((x for x in [c] + ([c.replace(solve_wg=0)] if c.solve_wg else []) if valid(x)),
                 None)
    if first is not None and (check is None or check(first)):
        return first
    base = first or c
    for x in _fewer_slices(base) + (_fewer_slices(base.replace(solve_wg=0))
                                    if first is None and base.solve_wg else []):
        if valid(x) and (check is None or check(x)):
            return x
    return None


def _fits(cfgs, info, f, storage, mode="explicit", check=None):
    """The pair adapted to this f and storage (:func:`_adapt`, at the kernels' f of the mode:
    each side validates on the device and ``check(config)`` accepts it — not rejected, probed:
    see :mod:`clmf.tuning.fallback`) with one factor padding, else None."""
    kf, width = kernel_factors(f, mode), factor_width(f, mode)
    out = _per_side(lambda side: _adapt(cfgs[side], info, kf, storage, check),
                    concurrent=check is not None and cfgs["users"] != cfgs["items"])
    if any(c is None for c in out.values()):
        return None
    if out["users"].ldf(width) != out["items"].ldf(width):
        return None
    return out


def _per_side(fn, concurrent=False):
    """``{side: fn(side)}``; with ``concurrent`` the sides run in two threads (each may probe a
    configuration in a child process: the sides' probes overlap instead of adding up on a first
    fit; the caller's context variables, e.g. the probes' progress switch, go along)."""
    if not concurrent:
        return {side: fn(side) for side in SIDES}
    import concurrent.futures
    import contextvars
    with concurrent.futures.ThreadPoolExecutor(len(SIDES)) as ex:
        futs = {side: ex.submit(contextvars.copy_context().run, fn, side) for side in SIDES}
        return {side: fu.result() for side, fu in futs.items()}


def _adapted_note(orig, pair):
    """What :func:`_adapt` changed in a record's pair beyond the storage (for the reason)."""
    notes = []
    for side in SIDES:
        o, c = orig[side], pair[side]
        if c.ks != o.ks:
            notes.append(f"{side}: ks {o.ks}→{c.ks}")
        if c.solve_wg != o.solve_wg:
            notes.append(f"{side}: solve_wg {o.solve_wg}→{c.solve_wg}")
    return f" (adapted to this f and device: {', '.join(notes)})" if notes else ""


def _lookup(info, f, storage, ds, mode="explicit", finalize=None, sources=None):
    """(rule, pair, reason, mode of the tuning used) or None from the databases (``sources``:
    :func:`record_sources`' list, default all; see the module docstring for the order of the rungs and
    modes). ``finalize(config, record_mode)`` is the configuration the fit will run for a
    candidate (solver overrides applied): candidates whose final configuration cannot run here
    are skipped (:func:`clmf.tuning.fallback.usable`)."""
    from . import fallback
    dev = device_record(info)
    finalize = finalize or (lambda c, cm: c)
    sources = record_sources() if sources is None else sources
    if not sources:
        return None
    per_source = [(origin, p, record_cases(recs, origin)) for origin, p, recs in sources]

    def fmt(c):
        d = c.dataset
        return (f"{device_label(c.device)}, f={c.f}, {c.storage}, "
                f"data set {d['m']}×{d['n']} nnz={d['nnz']} ({c.origin} database, run {c.run_id})")

    verified = []              # [{(configuration key, mode)} that ran here], built on demand

    def usable(cfg, source, record_device):
        # a configuration that ran on this device and driver — the record's own, or the same
        # configuration in this mode in a best record or ok measurement of this device and
        # driver — needs no probe
        if not fallback.ran_here(info, record_device):
            if not verified:
                verified.append(_verified_here(info, sources))
            if (cfg.key(), mode) in verified[0]:
                record_device = dev
        return fallback.usable(info, cfg, f, mode, source, record_device)

    def check(c, cm):
        return lambda cfg: usable(finalize(cfg, cm), fmt(c), c.device)

    def note(cm):
        return "" if cm == mode else f" (from an {cm}-mode tuning: no {mode}-mode tuning fits here)"

    def tuned(cm):
        # same device, f, storage, same data-set class
        for origin, p, cases in per_source:
            cand = [c for c in cases if c.mode == cm and same_device(c.device, dev) and c.f == f
                    and c.storage == storage
                    and (ds is None or class_distance(c.dataset, ds) <= CLASS_TOL)]
            for c in sorted(cand, key=lambda c: (shape_distance(c.dataset, ds),
                                                 newest_first(c))):
                pair = _fits(c.configs, info, f, storage, mode, check(c, cm))
                if pair:
                    return ("tuned", pair, f"tuned on this device for {fmt(c)}{note(cm)}"
                            + _adapted_note(c.configs, pair), cm)
        return None

    def nearest(cm):
        # same device, nearest f / data-set class / storage
        for origin, p, cases in per_source:
            cand = [c for c in cases if c.mode == cm and same_device(c.device, dev)]
            def key(c):
                return (abs(math.log(c.f / f)), c.storage != storage,
                        class_distance(c.dataset, ds) if ds else 0, newest_first(c))
            for c in sorted(cand, key=key):
                pair = _fits(c.configs, info, f, storage, mode, check(c, cm))
                if pair:
                    return ("nearest", pair, f"nearest tuning on this device: {fmt(c)}{note(cm)}"
                            + _adapted_note(c.configs, pair), cm)
        return None

    def vendor(cm):
        # same type and vendor (or platform), another device
        for origin, p, cases in per_source:
            cand = [c for c in cases if c.mode == cm and c.device.get("type") == dev["type"]
                    and (norm_text(c.device.get("vendor", "")).lower() == dev["vendor"].lower()
                         or norm_text(c.device.get("platform", "")).lower() == dev["platform"].lower())]
            def key(c):
                # the same platform, then the same driver first: a runtime build compiles what it
                # was tuned with (PyPI's PoCL aborts on kernels Debian's PoCL builds)
                return (norm_text(c.device.get("platform", "")).lower() != dev["platform"].lower(),
                        norm_text(c.device.get("driver", "")).lower() != dev["driver"].lower(),
                        abs(math.log(c.f / f)), c.storage != storage,
                        class_distance(c.dataset, ds) if ds else 0, newest_first(c))
            for c in sorted(cand, key=key):
                pair = _fits(c.configs, info, f, storage, mode, check(c, cm))
                if pair:
                    return ("vendor", pair, "tuned on a device of the same vendor/architecture: "
                            f"{fmt(c)}{note(cm)}" + _adapted_note(c.configs, pair), cm)
        return None

    def default(cm):
        # the computed default over the stored measurements of this device type
        from .index import measurement_records
        runs = getattr(sources, "exclude_runs", frozenset())
        meas = [(o, [m for m in (measurement_records(p) or ()) if m.get("run_id") not in runs])
                for o, p, r in sources]
        cfg, why = _computed_default(info, f, storage, [(o, r) for o, r in meas if r], cm, mode,
                                     lambda c: usable(finalize(c, cm), "the computed default",
                                                      None))
        if cfg is not None:
            return "default", {s: cfg for s in SIDES}, why + note(cm), cm
        return None

    def model(cm):
        # the selection model over this device's tuning runs of every mode (clmf.tuning.model)
        if cm != mode or ds is None:
            return None
        return _predict(info, f, storage, ds, mode, sources, finalize, usable)

    other = () if mode == "explicit" else ("explicit",)
    steps = [(tuned, mode), (model, mode), (nearest, mode)]
    steps += [(fn, cm) for cm in other for fn in (tuned, nearest)]
    steps += [(fn, cm) for fn in (vendor, default) for cm in (mode,) + other]
    for fn, cm in steps:
        hit = fn(cm)
        if hit is not None:
            return hit
    return None


_groups_memo: dict = {}


def _model_groups(sources, dev):
    """``(groups, refuted)``: the selection model's groups (:func:`clmf.tuning.model.groups_of`)
    of ``dev`` in every database of ``sources`` and the configurations it found wrong per mode
    (:func:`clmf.tuning.model.refuted`) (memoized per measurement lists and excluded runs)."""
    from . import model as M
    from .index import model_records
    lists = [model_records(p) or [] for _o, p, _r in sources]
    runs = getattr(sources, "exclude_runs", frozenset())
    key = (tuple(id(x) for x in lists), runs,
           device_identity(dev))
    hit = _groups_memo.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], lists)):
        return hit[1]
    groups = []
    for recs in lists:
        groups += M.groups_of(recs, dev, runs)
    out = (M.newest(groups), M.refuted([r for recs in lists for r in recs], dev, runs))
    if len(_groups_memo) > 16:
        _groups_memo.clear()
    _groups_memo[key] = (lists, out)
    return out


def _predict(info, f, storage, ds, mode, sources, finalize, usable, tries=8):
    """The ``model`` rung: (rule, pair, reason, mode) of the configurations the selection model
    (:mod:`clmf.tuning.model`) predicts fastest for this device, f, mode and data shape, each
    adapted and validated like a record's (:func:`_adapt`), one factor padding for both sides;
    None when the model has no groups near the case or none of its candidates fits."""
    from . import fallback
    from . import model as M
    dev = device_record(info)
    groups, wrong = _model_groups(sources, dev)
    if not groups:
        return None
    kf, width = kernel_factors(f, mode), factor_width(f, mode)
    feats = {"users": M.features(ds["m"], ds["n"], ds["nnz"]),
             "items": M.features(ds["n"], ds["m"], ds["nnz"])}
    ranked, near = {}, {}
    for side in SIDES:
        ranked[side], near[side] = M.rank(groups, f, mode, side, feats[side], storage,
                                          M.fill_rows(info.compute_units), wrong,
                                          lambda c, kf: _valid(c, kf, info))
        if not ranked[side]:
            return None
    refused = set()            # configurations the check refused (rejected here, failed probe)

    def not_rejected(cfg):     # (cheap: no probe) a rejected syrk/mma is adapted (fewer slices)
        return fallback.rejection(info, finalize(cfg, mode), f, mode) is None

    def best_per_ldf(side):
        # the best-scored configuration of each leading dimension that validates here; one
        # adapted to fit (fewer split-K slices, another S3 work-group) is another configuration
        # than the one measured: it scores by its own evidence, else the prior (a syrk measured
        # with 2 slices at f = 100 ran 1.3-1.65x slower with 1 at f = 128 than the cell's best)
        own = {key: score for score, key, _c, _sup, _w in ranked[side]}
        out = {}
        for score, key, c, sup, where in ranked[side]:
            a = _adapt(c, info, kf, storage, not_rejected)
            if a is None:
                continue
            if a.replace(storage=c.storage) != c:
                score = own.get(M.case_key(a.replace(storage=c.storage), mode, info.type, kf),
                                M.PRIOR)
                where = None
            a = finalize(a, mode)
            if a in refused:
                continue
            ldf = a.ldf(width)
            if ldf not in out or score < out[ldf][0]:
                out[ldf] = (score, a, c, sup, where)
        return out

    for _ in range(tries):
        per = {side: best_per_ldf(side) for side in SIDES}
        common = set(per["users"]) & set(per["items"])
        if not common:
            return None
        ldf = min(common, key=lambda w: (per["users"][w][0] + per["items"][w][0], w))
        pick = {side: per[side][ldf] for side in SIDES}
        bad = [p[1] for p in pick.values()
               if not usable(p[1], "the selection model", p[4])]
        if bad:
            refused.update(bad)
            continue
        pair = {side: pick[side][1] for side in SIDES}
        n = len({g.run_id for _d2, g in near["users"] + near["items"]})
        why = (f"predicted by the selection model from {n} tuning run(s) on this device "
               f"(nearest: {M.describe(near['users'], 1)}); predicted "
               + ", ".join(f"{side} {math.exp(pick[side][0]):.2f}× its neighbours' best"
                           for side in SIDES))
        notes = [f"{side}: ks {pick[side][2].ks}→{pair[side].ks}" for side in SIDES
                 if pick[side][2].ks != pair[side].ks]
        if notes:
            why += f" (adapted to this f and device: {', '.join(notes)})"
        return "model", pair, why, mode
    return None


_verified_memo: dict = {}


def _verified_here(info, sources):
    """``{(configuration key, mode)}`` of every configuration the databases of ``sources``
    (:func:`record_sources`) record as built and run on this device and driver: their best records and
    their measurements of status ok. Memoized per record lists (the index hands out the same
    lists until a database file changes), excluded runs and device: each fit's lookup read and
    parsed every record again (0.66 s of a later fit's set-up on PoCL, 2,716 records)."""
    from .index import measurement_records
    lists = [(recs, measurement_records(p) or ()) for _o, p, recs in sources]
    key = (tuple((id(b), id(m)) for b, m in lists),
           getattr(sources, "exclude_runs", frozenset()),
           tuple(" ".join(str(x).split()).lower()
                 for x in (info.platform, info.vendor, info.type, info.name, info.driver)))
    hit = _verified_memo.get(key)
    if hit is not None and all(a is b and c is d for (a, c), (b, d) in zip(hit[0], lists)):
        return hit[1]
    out = _verified_in(info, lists)
    if len(_verified_memo) > 16:
        _verified_memo.clear()
    _verified_memo[key] = (lists, out)
    return out


def preload(infos):
    """Read every database's indexes (best records, measurements, the selection model's) into
    this process's memo, building them where the cache is empty, and the configurations that
    ran on each device of ``infos``: the part of a first lookup that does not depend on the
    fit (:meth:`clmf.ALS.warm_up` runs it ahead of a fit)."""
    from .index import measurement_records, model_records
    sources = record_sources()
    for _origin, path, _recs in sources:
        model_records(path)
        measurement_records(path)
    for info in infos:
        _verified_here(info, sources)


def _verified_in(info, lists):
    """:func:`_verified_here` of ``lists``, pairs (best records, measurements), unmemoized."""
    from . import fallback
    out, seen = set(), set()
    for recs, meas in lists:
        for r in [*recs, *meas]:
            kind = r.get("kind")
            if (kind not in ("best", "measurement") or (kind == "measurement"
                                                        and r.get("status") != "ok")
                    or not fallback.ran_here(info, r.get("device"))):
                continue
            try:
                # (a configuration measured in several runs is parsed once)
                text = (json.dumps(r["config"], sort_keys=True), record_mode(r))
                if text not in seen:
                    seen.add(text)
                    out.add((KernelConfig.from_dict(r["config"]).key(), text[1]))
            except (KeyError, TypeError, ValueError, InvalidConfigError):
                continue
    return out


def _computed_default(info, f, storage, sources, record_mode_=None, mode="explicit", check=None):
    """CLBlast's rule: over every stored tuning of this device type (of ``record_mode_``, default
    ``mode``), the configuration with the best mean time relative to each group's best (groups:
    run × side), among those measured in at least half of the groups; nearest f first. Validated
    at the kernels' f of the fit's ``mode``."""
    from ..engine.kernels import validate
    record_mode_ = record_mode_ or mode
    groups = {}
    for origin, recs in sources:
        for r in recs:
            if r.get("kind") != "measurement" or r.get("status") != "ok" or r.get("side") not in SIDES:
                continue
            if record_mode(r) != record_mode_:
                continue
            if (r.get("device") or {}).get("type") != info.type:
                continue
            try:
                g = groups.setdefault((int(r["f"]), r["run_id"], r["side"]), {})
                k = config_text(r["config"])
                t = float(r["seconds"])
            except (KeyError, TypeError, ValueError):
                continue
            if t > 0 and (k not in g or t < g[k]):
                g[k] = t
    if not groups:
        return None, None
    fs = sorted({k[0] for k in groups}, key=lambda x: (abs(math.log(x / f)), x))
    for fv in fs:
        sel = [g for k, g in groups.items() if k[0] == fv and g]
        scores = {}
        for g in sel:
            best = min(g.values())
            for k, t in g.items():
                scores.setdefault(k, []).append(t / best)
        need = max(1, math.ceil(len(sel) / 2))
        ranked = sorted((sum(v) / len(v), k) for k, v in scores.items() if len(v) >= need)
        for mean_rel, k in ranked:
            try:
                cfg = KernelConfig.from_dict(json.loads(k))
                if cfg.storage != storage:
                    cfg = cfg.replace(storage=storage)
                validate(cfg, kernel_factors(f, mode), info)
            except (InvalidConfigError, TypeError, ValueError):
                continue
            if check is not None and not check(cfg):
                continue
            return cfg, (f"computed default for {info.type} devices: best mean relative time "
                         f"{mean_rel:.3f}× over {len(sel)} stored tunings at f={fv}")
    return None, None


# ----- the heuristic for unseen devices ----------------------------------------------------------
def _pow2_le(x):
    p = 1
    while p * 2 <= x:
        p *= 2
    return p


def _largest_divisor_le(n, cap):
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


def heuristic(info, f, side_stats=None, storage="float32"):
    """The rule for unseen devices (the clMF paper's): ``batch+reg`` with tx = ty = the largest
    divisor of the tile edge (f) such that tx·ty fits the device's work-group limit (and 256) and
    each work-item keeps at most 64 register accumulators; if none fits, the thread-batching
    baseline sized to the device (work-items per row: the largest power of two ≤ min(f(f+1)/2,
    work-group limit, 256))."""
    from ..engine.kernels import validate
    cap = int(math.isqrt(max(1, min(info.max_work_group_size, 256))))
    t = _largest_divisor_le(f, cap)
    if t > 1 and (f // t) ** 2 <= 64:
        cfg = KernelConfig(reg=True, tx=t, ty=t, storage=storage)
        try:
            validate(cfg, f, info)
            return cfg
        except InvalidConfigError:
            pass
    pairs = f * (f + 1) // 2
    wg = max(1, _pow2_le(min(pairs, info.max_work_group_size, 256)))
    tx = _pow2_le(max(1, int(wg ** 0.5)))
    return KernelConfig(tx=tx, ty=wg // tx, storage=storage)


# ----- the public entry point --------------------------------------------------------------------
def choose(info, f, side, side_stats=None, storage="float32", solver=None, mode="explicit",
           sources=None):
    """Pick the configuration of one side (see the module docstring for the fallback chain).

    Parameters
    ----------
    info : :class:`clmf.engine.device.DeviceInfo`
    f : factors
    side : "users" or "items"
    side_stats : dict with ``rows``, ``cols``, ``nnz`` (and ``mean``, ``max``) of this side, as
        :meth:`clmf.ALS.fit` passes; ``None`` matches any data-set class
    storage : "float32" or "float16"
    solver : None (the tuned choice) or "cholesky"/"cg"/"fusedcg" to force one
    mode : "explicit", "implicit" or "biased" (see :func:`fit_mode`): tunings of this mode are
        preferred; an implicit fit that no tuning answers gets :data:`MODE_DEFAULT_SOLVER`
    sources : the databases to search (:func:`record_sources`' list; default: all of them)

    Returns
    -------
    :class:`Choice` — ``rule`` is one of tuned, model, nearest, vendor, default, heuristic,
    baseline
    """
    from ..engine.kernels import validate
    if mode not in MODES:
        raise ValueError(f"unknown tuning mode {mode!r}; choose from {MODES}")
    storage = storage or "float32"
    kf = kernel_factors(f, mode)
    ds = _class_from_stats(side, side_stats)
    from . import fallback

    def finalize(c, cm):      # the configuration the fit runs for a candidate of record mode cm
        return c if solver is None else c.replace(solver=solver)

    hit = None
    try:
        hit = _lookup(info, f, storage, ds, mode, finalize, sources)
    except Exception as e:   # a database must never break a fit
        log.warning("tuning lookup failed (%s: %s); using the untuned default", type(e).__name__, e)
        warnings.warn(f"tuning lookup failed ({type(e).__name__}: {e}); using the untuned default",
                      TuningDatabaseWarning, stacklevel=2)
    if hit is not None:
        rule, pair, reason, _used_mode = hit
        choice = Choice(pair[side], rule, reason)
    else:
        # no tuning at all: the paper's rule, with the mode's untuned solver (MODE_DEFAULT_SOLVER)
        dflt = MODE_DEFAULT_SOLVER.get(mode) if solver is None else solver
        note = (f"; solver={dflt} (the {mode} default: no tuning chose one)"
                if solver is None and dflt else "")
        cfg = heuristic(info, kf, side_stats, storage)
        cfg = cfg.replace(solver=dflt) if dflt else cfg
        choice = Choice(cfg, "heuristic", f"no tuning record for {device_label(info)}; "
                                          "the paper's rule for unseen devices" + note)
        try:
            validate(cfg, kf, info)
            why = fallback.rejection(info, cfg, f, mode)
            if why is not None:
                raise InvalidConfigError(why, "rejected")
        except InvalidConfigError as e:
            base = BASELINE.replace(storage=storage)
            choice = Choice(base.replace(solver=dflt) if dflt else base, "baseline",
                            f"the heuristic's configuration does not fit ({e}); safe baseline"
                            + note)
    if solver is not None and solver != choice.config.solver:
        choice = Choice(choice.config.replace(solver=solver), choice.rule,
                        choice.reason + f"; solver={solver} requested")
    return choice


def incumbent(info, f, side_stats, storage="float32", solver=None, mode="explicit",
              exclude_paths=(), exclude_runs=(), paths=None):
    """What ``ALS(variant="auto")`` would choose for this device, f, data and mode, leaving out
    the database files ``exclude_paths`` and the records of the runs ``exclude_runs`` (a tuning
    run's own records): ``{side: Choice}`` (``paths``: read only these database files).

    ``side_stats`` maps each side to its statistics as :meth:`clmf.ALS.fit` passes them (``rows``,
    ``cols``, ``nnz`` of that side); the tuner asks this before it searches, to measure what the
    user already had.
    """
    sources = record_sources(exclude_paths, exclude_runs, paths)
    return {side: choose(info, f, side, (side_stats or {}).get(side), storage, solver, mode,
                         sources=sources) for side in SIDES}
