"""Choosing a kernel configuration for a device, side and data set.

This module *reads* tuning databases and applies the fallback chain; it never tunes (that is
``tuner/``, which writes the databases through :mod:`tuner.database`).

Databases are JSON Lines files (one record per line, each with ``schema_version``). They are
searched in this order, and the first source that answers a rung wins (so the user's own
tunings win over the shipped ones at the same rung):

1. ``$CLMF_TUNING_DB`` — a file or a directory of ``*.jsonl`` files (several joined with ``:``);
2. the per-user database, ``platformdirs.user_data_dir("clmf")/tuning.jsonl`` (``clmf tune``
   writes there by default);
3. the shipped tunings, ``results/tuning/*.jsonl`` of the source tree, installed as the package
   ``clmf_tuning_data`` (found with :mod:`importlib.resources`, so an installed wheel has them);
   ``CLMF_TUNING_NO_SHIPPED=1`` leaves them out.

The fallback chain (``Choice.rule``), first hit wins:

``tuned``     the same device (platform, vendor, type, device name), f and storage, and a tuned
              data set of the same class (:func:`class_distance` ≤ :data:`CLASS_TOL`); the
              closest class first, and among equally close ones the newest run;
``nearest``   the same device, the nearest tuned (f, data-set class, storage);
``vendor``    the same device type and vendor (or platform) — another device of the architecture;
``default``   the computed default: the configuration with the best mean relative time over the
              stored results of this device type (as CLBlast does);
``heuristic`` an unseen device: the paper's rule, ``batch+reg`` with tx = ty = the largest divisor
              of the tile edge that fits the device;
``baseline``  the safe ``batch`` configuration.

Modes (``mode=`` of :func:`choose`, the ``mode`` key of a record; a record without it is
``explicit``): ``explicit`` (ratings), ``implicit`` (confidence-weighted feedback, with the
Gram YᵀY per half-step) and ``biased`` (explicit with user/item biases: the kernels solve f + 1
unknowns over rows f + 2 wide). The weight term changes the best variant, so the chain looks for
tunings of the fit's mode first, then falls back to explicit ones, rung by rung:
tuned (mode) → nearest (mode) → tuned (explicit) → nearest (explicit) → vendor (mode) → vendor
(explicit) → default (mode) → default (explicit) → heuristic → baseline. A choice taken from an
explicit tuning for an implicit/biased fit says so in its reason; for an implicit fit with no
implicit tuning the solver is the implicit default, the fused CG (:data:`MODE_DEFAULT_SOLVER`),
unless the caller asked for one.

Each rung returns the *pair* chosen by one tuning run (users side, items side) and keys it only on
what both sides know — (m, n, nnz) of the whole data set — so the two independent ``choose`` calls
of a fit agree (both sides share factor buffers: same storage and vector padding). Every candidate
is checked with :func:`clmf.kernels.validate` on this device and f before it is returned.

Records are untrusted input (:mod:`clmf.tuning_schema`): a line that is not JSON, of a foreign
schema, or whose fields fail the checks is reported (``logging`` and ``warnings.warn``, naming the
file and line) and skipped alone; the rest of the file serves. The file is never modified. Parsed files are cached by (mtime, size), so a lookup costs a
``stat`` per file.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
import pathlib
import re
import threading
import warnings

from .config import KernelConfig
from .errors import InvalidConfigError

log = logging.getLogger(__name__)

__all__ = ["Choice", "choose", "heuristic", "BASELINE", "SCHEMA_VERSION", "CLASS_TOL", "MODES",
           "MODE_DEFAULT_SOLVER", "fit_mode", "record_mode", "kernel_factors", "factor_width",
           "TuningDatabaseWarning", "dataset_class", "class_distance", "device_record",
           "device_slug", "database_paths", "user_db_path", "shipped_paths", "read_database"]

BASELINE = KernelConfig()
SCHEMA_VERSION = 1
CLASS_TOL = 0.35          # RMS of log-ratios of (m, n, nnz): ≈ within a factor 1.4 on average
ENV_DB = "CLMF_TUNING_DB"
ENV_NO_SHIPPED = "CLMF_TUNING_NO_SHIPPED"
SIDES = ("users", "items")
MODES = ("explicit", "implicit", "biased")
# the solver a fit of this mode uses when nothing tuned for the mode says otherwise
MODE_DEFAULT_SOLVER = {"implicit": "fusedcg"}


def fit_mode(feedback="explicit", biases=False):
    """The tuning mode of a fit: ``implicit``, ``biased`` or ``explicit``."""
    if feedback == "implicit":
        return "implicit"
    return "biased" if biases else "explicit"


def record_mode(r):
    """The mode of a database record (records written before modes existed are explicit)."""
    m = r.get("mode") or "explicit"
    return m if m in MODES else None


def kernel_factors(f, mode="explicit"):
    """Unknowns per system the kernels are built for: f, or f + 1 with biases."""
    return f + 1 if mode == "biased" else f


def factor_width(f, mode="explicit"):
    """Width of a factor row on the device: f, or f + 2 ([factors | 1 | bias]) with biases."""
    return f + 2 if mode == "biased" else f


class TuningDatabaseWarning(UserWarning):
    """A tuning database file could not be used (corrupted, foreign schema, unreadable)."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """A configuration with the rule that chose it and the reason."""
    config: KernelConfig
    rule: str
    reason: str

    def __str__(self):
        return f"{self.config} (rule: {self.rule}; {self.reason})"


# ----- keys shared with the tuner ----------------------------------------------------------------
def _norm(s):
    return re.sub(r"\s+", " ", str(s).strip())


def device_record(info):
    """The normalised device key of a :class:`clmf.device.DeviceInfo` (driver recorded, not
    matched)."""
    return {"platform": _norm(info.platform), "vendor": _norm(info.vendor), "type": info.type,
            "device": _norm(info.name), "driver": _norm(info.driver)}


def device_slug(key):
    """File-name slug of a device key: ``intel-r-opencl-amd-epyc``."""
    s = f"{key['platform']} {key['device']}".lower()
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-")


def _same_device(a, b):
    return all(_norm(a.get(k, "")).lower() == _norm(b.get(k, "")).lower()
               for k in ("platform", "vendor", "type", "device"))


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


def _newest_first(case):
    """Sort key among equally close tunings: the newest run first (it measured the current kernels;
    times relative to each run's own baseline are not comparable across runs), then the run's
    own ranking."""
    try:
        age = -datetime.datetime.fromisoformat(case.date).timestamp()
    except (TypeError, ValueError):
        age = math.inf                      # undated records last
    return (age, case.rel)


def class_distance(a, b):
    """RMS of the log-ratios of m, n and nnz (0 = same shape; log 2 ≈ 0.69 = a factor 2 apart)."""
    if a is None or b is None:
        return math.inf
    d = [math.log(max(a[k], 1) / max(b[k], 1)) for k in ("m", "n", "nnz")]
    return math.sqrt(sum(x * x for x in d) / len(d))


# ----- where the databases are -------------------------------------------------------------------
def user_db_path():
    """The per-user database ``clmf tune`` writes by default."""
    import platformdirs
    return pathlib.Path(platformdirs.user_data_dir("clmf")) / "tuning.jsonl"


def _jsonl_in(p):
    p = pathlib.Path(p)
    if p.is_dir():
        return sorted(x for x in p.glob("*.jsonl") if x.is_file())
    return [p]


def shipped_paths():
    """The tuning files shipped with clmf (``results/tuning/*.jsonl``)."""
    if os.environ.get(ENV_NO_SHIPPED, "").strip() not in ("", "0"):
        return []
    out = []
    try:
        import importlib.resources as res
        root = res.files("clmf_tuning_data")
        for e in sorted(root.iterdir(), key=lambda e: e.name):
            if e.name.endswith(".jsonl") and e.is_file():
                out.append(pathlib.Path(str(e)))
    except (ImportError, ModuleNotFoundError, OSError, TypeError):
        pass
    if not out:      # a source checkout: results/tuning next to the clmf package
        here = pathlib.Path(__file__).resolve().parent.parent / "results" / "tuning"
        if here.is_dir():
            out = sorted(here.glob("*.jsonl"))
    return out


def database_paths():
    """[(origin, path)] in search order: $CLMF_TUNING_DB, the per-user database, the shipped
    files. Missing paths are left out."""
    out = []
    env = os.environ.get(ENV_DB, "")
    for part in filter(None, (x.strip() for x in env.split(os.pathsep))):
        out += [("env", p) for p in _jsonl_in(part)]
    try:
        out.append(("user", user_db_path()))
    except Exception as e:  # pragma: no cover - platformdirs missing/broken
        log.debug("no per-user tuning database: %s", e)
    out += [("shipped", p) for p in shipped_paths()]
    seen, uniq = set(), []
    for origin, p in out:
        key = os.path.abspath(p)
        if key not in seen and os.path.isfile(p):
            seen.add(key)
            uniq.append((origin, pathlib.Path(p)))
    return uniq


# ----- reading (cached by mtime) -----------------------------------------------------------------
_cache: dict = {}
_warned: set = set()
_clock = threading.Lock()


def _warn(path, stamp, msg, whole=True):
    key = (str(path), stamp, whole)
    if key in _warned:
        return
    _warned.add(key)
    if whole:
        full = f"tuning database {path} is not used: {msg} (the file is left untouched; clmf " \
               "falls back to the next source and the untuned defaults)"
    else:
        full = f"tuning database {path}: {msg}"
    log.warning(full)
    warnings.warn(full, TuningDatabaseWarning, stacklevel=4)


def _parse_lines(fh, path):
    """(records, skipped, fatal) of an open JSON Lines file: ``skipped`` lists (line, reason,
    torn) of the records left out one by one (``torn``: the last line, cut short by a writer that
    died); ``fatal`` is the first problem that makes the file foreign to a writer (not JSON, not
    an object, another schema) on a line other than a torn tail."""
    from .tuning_schema import RecordError, check_record
    recs, skipped, fatal = [], [], None
    for lineno, raw in enumerate(fh, 1):
        line = raw.strip()
        if not line:
            continue
        torn = not raw.endswith(b"\n")
        try:
            r = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            why = f"not valid JSON ({str(e)[:80]})"
            skipped.append((lineno, why, torn))
            if not torn and fatal is None:
                fatal = f"line {lineno} is {why}"
            continue
        if not isinstance(r, dict):
            skipped.append((lineno, "not a JSON object", torn))
            if not torn and fatal is None:
                fatal = f"line {lineno} is not a JSON object"
            continue
        v = r.get("schema_version")
        if v != SCHEMA_VERSION or type(v) is not int:
            why = f"schema_version {v!r}; this clmf reads schema_version {SCHEMA_VERSION}"
            skipped.append((lineno, why, torn))
            if fatal is None:
                fatal = f"line {lineno} has {why}"
            continue
        try:
            check_record(r)
        except RecordError as e:
            skipped.append((lineno, f"record skipped: {e}", torn))
            continue
        recs.append(r)
    return recs, skipped, fatal


def read_database(path, strict=False):
    """The usable records of one JSON Lines database, or ``None`` (with a warning) when the file
    cannot be read.

    Records are untrusted input: a line that is not JSON, of another schema, or whose fields fail
    :func:`clmf.tuning_schema.check_record` is skipped alone, with one warning per file naming
    the file and the lines; the other records serve. ``strict=True`` (the tuner, before it
    appends) raises ``ValueError`` for a file it must not write to — a line that is not JSON or
    of another schema, anywhere but a torn last line (which :meth:`tuner.database.Database.append`
    repairs) — and otherwise returns the usable records too."""
    path = pathlib.Path(path)
    try:
        st = path.stat()
    except OSError:
        return []
    stamp = (st.st_mtime_ns, st.st_size)
    with _clock:
        hit = _cache.get(str(path))
    if hit is None or hit[0] != stamp:
        recs, skipped, fatal, err = None, [], None, None
        try:
            with open(path, "rb") as fh:
                recs, skipped, fatal = _parse_lines(fh, path)
        except OSError as e:
            err = f"cannot read it ({e})"
        hit = (stamp, recs, err, skipped, fatal)
        with _clock:
            _cache[str(path)] = hit
    _, recs, err, skipped, fatal = hit
    if err is not None:
        if strict:
            raise ValueError(f"tuning database {path}: {err}")
        _warn(path, stamp, err)
        return None
    if strict and fatal is not None:
        raise ValueError(f"tuning database {path}: {fatal}; clmf does not append to it")
    if skipped:
        first = "; ".join(f"line {n}: {why}" + (" (a torn last line)" if torn else "")
                          for n, why, torn in skipped[:5])
        more = f" (and {len(skipped) - 5} more)" if len(skipped) > 5 else ""
        _warn(path, stamp, f"{len(skipped)} record(s) skipped, {len(recs)} used — {first}{more}",
              whole=False)
    return recs


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


def _cases(records, origin):
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


def _sources():
    out = []
    for origin, p in database_paths():
        recs = read_database(p)
        if recs:
            out.append((origin, p, recs))
    return out


def _fits(cfgs, info, f, storage, mode="explicit"):
    """The pair adapted to this f and storage if it validates on the device (at the kernels' f of
    the mode), else None."""
    from .kernels import validate
    kf, width = kernel_factors(f, mode), factor_width(f, mode)
    f = kf
    out = {}
    for side in SIDES:
        c = cfgs[side]
        if c.storage != storage:
            c = c.replace(storage=storage)
        try:
            validate(c, f, info)
        except InvalidConfigError:
            if not c.solve_wg:
                return None
            c = c.replace(solve_wg=0)
            try:
                validate(c, f, info)
            except InvalidConfigError:
                return None
        out[side] = c
    if out["users"].ldf(width) != out["items"].ldf(width):
        return None
    return out


def _lookup(info, f, storage, ds, mode="explicit"):
    """(rule, pair, reason, mode of the tuning used) or None from the databases (see the module
    docstring for the order of the rungs and modes)."""
    dev = device_record(info)
    sources = _sources()
    if not sources:
        return None
    per_source = [(origin, p, _cases(recs, origin)) for origin, p, recs in sources]

    def fmt(c):
        d = c.dataset
        return (f"{c.device['platform']} | {c.device['device']}, f={c.f}, {c.storage}, "
                f"data set {d['m']}×{d['n']} nnz={d['nnz']} ({c.origin} database, run {c.run_id})")

    def note(cm):
        return "" if cm == mode else f" (from an {cm}-mode tuning: no {mode}-mode tuning fits here)"

    def tuned(cm):
        # same device, f, storage, same data-set class
        for origin, p, cases in per_source:
            cand = [c for c in cases if c.mode == cm and _same_device(c.device, dev) and c.f == f
                    and c.storage == storage
                    and (ds is None or class_distance(c.dataset, ds) <= CLASS_TOL)]
            for c in sorted(cand, key=lambda c: (class_distance(c.dataset, ds) if ds else 0,
                                                 _newest_first(c))):
                pair = _fits(c.configs, info, f, storage, mode)
                if pair:
                    return "tuned", pair, f"tuned on this device for {fmt(c)}{note(cm)}", cm
        return None

    def nearest(cm):
        # same device, nearest f / data-set class / storage
        for origin, p, cases in per_source:
            cand = [c for c in cases if c.mode == cm and _same_device(c.device, dev)]
            key = lambda c: (abs(math.log(c.f / f)), c.storage != storage,
                             class_distance(c.dataset, ds) if ds else 0, _newest_first(c))
            for c in sorted(cand, key=key):
                pair = _fits(c.configs, info, f, storage, mode)
                if pair:
                    return "nearest", pair, f"nearest tuning on this device: {fmt(c)}{note(cm)}", cm
        return None

    def vendor(cm):
        # same type and vendor (or platform), another device
        for origin, p, cases in per_source:
            cand = [c for c in cases if c.mode == cm and c.device.get("type") == dev["type"]
                    and (_norm(c.device.get("vendor", "")).lower() == dev["vendor"].lower()
                         or _norm(c.device.get("platform", "")).lower() == dev["platform"].lower())]
            key = lambda c: (_norm(c.device.get("platform", "")).lower() != dev["platform"].lower(),
                             abs(math.log(c.f / f)), c.storage != storage,
                             class_distance(c.dataset, ds) if ds else 0, _newest_first(c))
            for c in sorted(cand, key=key):
                pair = _fits(c.configs, info, f, storage, mode)
                if pair:
                    return ("vendor", pair, "tuned on a device of the same vendor/architecture: "
                            f"{fmt(c)}{note(cm)}", cm)
        return None

    def default(cm):
        # the computed default over the stored measurements of this device type
        cfg, why = _computed_default(info, f, storage, [(o, r) for o, p, r in sources], cm, mode)
        if cfg is not None:
            return "default", {s: cfg for s in SIDES}, why + note(cm), cm
        return None

    modes = (mode,) if mode == "explicit" else (mode, "explicit")
    for rung in ((tuned, nearest), (vendor,), (default,)):
        for cm in modes:
            for fn in rung:
                hit = fn(cm)
                if hit is not None:
                    return hit
    return None


def _computed_default(info, f, storage, sources, record_mode_=None, mode="explicit"):
    """CLBlast's rule: over every stored tuning of this device type (of ``record_mode_``, default
    ``mode``), the configuration with the best mean time relative to each group's best (groups:
    run × side), among those measured in at least half of the groups; nearest f first. Validated
    at the kernels' f of the fit's ``mode``."""
    from .kernels import validate
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
                k = json.dumps(r["config"], sort_keys=True)
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
    from .kernels import validate
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
def choose(info, f, side, side_stats=None, storage="float32", solver=None, mode="explicit"):
    """Pick the configuration of one side (see the module docstring for the fallback chain).

    Parameters
    ----------
    info : :class:`clmf.device.DeviceInfo`
    f : factors
    side : "users" or "items"
    side_stats : dict with ``rows``, ``cols``, ``nnz`` (and ``mean``, ``max``) of this side, as
        :meth:`clmf.ALS.fit` passes; ``None`` matches any data-set class
    storage : "float32" or "float16"
    solver : None (the tuned choice) or "cholesky"/"cg"/"fusedcg" to force one
    mode : "explicit", "implicit" or "biased" (see :func:`fit_mode`): tunings of this mode are
        preferred; an implicit fit with no implicit tuning gets :data:`MODE_DEFAULT_SOLVER`

    Returns
    -------
    :class:`Choice` — ``rule`` is one of tuned, nearest, vendor, default, heuristic, baseline
    """
    from .kernels import validate
    if mode not in MODES:
        raise ValueError(f"unknown tuning mode {mode!r}; choose from {MODES}")
    storage = storage or "float32"
    kf = kernel_factors(f, mode)
    ds = _class_from_stats(side, side_stats)
    hit = None
    try:
        hit = _lookup(info, f, storage, ds, mode)
    except Exception as e:   # a database must never break a fit
        log.warning("tuning lookup failed (%s: %s); using the untuned default", type(e).__name__, e)
        warnings.warn(f"tuning lookup failed ({type(e).__name__}: {e}); using the untuned default",
                      TuningDatabaseWarning, stacklevel=2)
    used_mode = None
    if hit is not None:
        rule, pair, reason, used_mode = hit
        choice = Choice(pair[side], rule, reason)
    else:
        cfg = heuristic(info, kf, side_stats, storage)
        choice = Choice(cfg, "heuristic", f"no tuning record for {info.platform} | {info.name}; "
                                          "the paper's rule for unseen devices")
        try:
            validate(cfg, kf, info)
        except InvalidConfigError as e:
            choice = Choice(BASELINE.replace(storage=storage), "baseline",
                            f"the heuristic's configuration does not fit ({e}); safe baseline")
    if solver is None and used_mode != mode and mode in MODE_DEFAULT_SOLVER:
        dflt = MODE_DEFAULT_SOLVER[mode]
        if dflt != choice.config.solver:
            choice = Choice(choice.config.replace(solver=dflt), choice.rule,
                            choice.reason + f"; solver={dflt} (the {mode} default: no {mode} "
                                            "tuning chose one)")
    if solver is not None and solver != choice.config.solver:
        choice = Choice(choice.config.replace(solver=solver), choice.rule,
                        choice.reason + f"; solver={solver} requested")
    return choice
