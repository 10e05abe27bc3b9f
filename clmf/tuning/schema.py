"""The tuning database schema: record keys shared by the library and the tuner (device keys,
modes, kernel widths), :data:`SCHEMA_VERSION`, the baseline configuration and :class:`Choice`."""
from __future__ import annotations

import dataclasses
import logging
import math
import re

from ..engine.config import KernelConfig
from ..errors import InvalidConfigError
from .spec import factor_width, fit_mode, kernel_factors  # noqa: F401  (their home: .spec)

log = logging.getLogger(__name__)

BASELINE = KernelConfig()
SCHEMA_VERSION = 1
CLASS_TOL = 0.35          # RMS of log-ratios of (m, n, nnz): ≈ within a factor 1.4 on average
# shapes this close are one shape (a data set and its training split minus a small held-out part):
# among their tunings the newest run wins, as among tunings of exactly one shape
SAME_SHAPE_TOL = 0.01     # ≈ 1 % apart
ENV_DB = "CLMF_TUNING_DB"
ENV_NO_SHIPPED = "CLMF_TUNING_NO_SHIPPED"
SIDES = ("users", "items")
MODES = ("explicit", "implicit", "biased")
# the solver a fit of this mode uses when no tuning answers (the heuristic and baseline rules, and
# a caller's variant that names no solver); a tuning's own solver is kept, in every mode
MODE_DEFAULT_SOLVER = {"implicit": "fusedcg"}


def record_mode(r):
    """The mode of a database record (records written before modes existed are explicit)."""
    m = r.get("mode") or "explicit"
    return m if m in MODES else None


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
def norm_text(s):
    """``s`` as text with its white space collapsed (device names as recorded)."""
    return re.sub(r"\s+", " ", str(s).strip())


def device_record(info):
    """The normalised device key of a :class:`clmf.engine.device.DeviceInfo` (driver recorded, not
    matched)."""
    return {"platform": norm_text(info.platform), "vendor": norm_text(info.vendor),
            "type": info.type, "device": norm_text(info.name), "driver": norm_text(info.driver)}


def device_slug(key):
    """File-name slug of a device key: ``intel-r-opencl-amd-epyc``."""
    s = f"{key['platform']} {key['device']}".lower()
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-")


def device_identity(key):
    """A device key's platform, vendor, type and name, normalised and lower-cased (the driver
    left out): what two records of one device share."""
    return tuple(norm_text((key or {}).get(k, "")).lower() for k in _DEVICE_KEYS)


def same_device(a, b):
    """Whether two device keys name the same device (platform, vendor, type and name; the driver
    is not matched)."""
    return device_identity(a) == device_identity(b)


# ----- checking one record: records are untrusted input -------------------------------------------
# A tuning database may come from anywhere ($CLMF_TUNING_DB, the per-user database, a file a user
# was given). Before the lookup uses a record, check_record checks every field the lookup reads —
# types, ranges, enumerations, the kernel configuration field by field — and says what is wrong;
# read_database skips such a record alone, with a warning naming the file and line.
KINDS = ("measurement", "best", "run")
MAX_FACTORS = 1 << 20             # far above any f a device can hold
_MAX_TEXT = 512                   # device names, run ids, dates
_DEVICE_KEYS = ("platform", "vendor", "type", "device")


class RecordError(ValueError):
    """A tuning record that may not be used (the message says why)."""


def _show(v):
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _text(r, k, required=True):
    if k not in r and not required:
        return
    v = r.get(k)
    if type(v) is not str or len(v) > _MAX_TEXT:
        raise RecordError(f"{k} must be a string of at most {_MAX_TEXT} characters, not {_show(v)}")


def _int(v, what, lo, hi):
    if type(v) is not int or not lo <= v <= hi:
        raise RecordError(f"{what} must be an integer in [{lo}, {hi}], not {_show(v)}")
    return v


def _number(v, what, positive=True, required=True):
    if v is None and not required:
        return
    if type(v) not in (int, float) or not math.isfinite(v) or (positive and v <= 0):
        raise RecordError(f"{what} must be a finite {'positive ' if positive else ''}number, "
                          f"not {_show(v)}")


def _device(d):
    if not isinstance(d, dict):
        raise RecordError(f"device must be an object with {list(_DEVICE_KEYS)}, not {_show(d)}")
    for k in _DEVICE_KEYS:
        v = d.get(k)
        if type(v) is not str or len(v) > _MAX_TEXT:
            raise RecordError(f"device.{k} must be a string, not {_show(v)}")


def _dataset(d, required):
    if d is None and not required:
        return
    if not isinstance(d, dict):
        raise RecordError(f"dataset must be an object with m, n, nnz, not {_show(d)}")
    for k in ("m", "n", "nnz"):
        _int(d.get(k), f"dataset.{k}", 0, 1 << 62)


_checked: dict = {}            # configurations already checked (a database repeats them often)


def _config(d):
    """The checked KernelConfig of a record's ``config`` (memoized by its items)."""
    try:
        # typed: True and 1 (or 4 and 4.0) are equal keys but not equally valid values
        key = (tuple(sorted((k, type(v), v) for k, v in d.items())) if isinstance(d, dict)
               else None)
        hit = _checked.get(key) if key is not None else None
    except TypeError:                  # unhashable values: checked (and refused) below
        key = hit = None
    if hit is not None:
        return hit
    try:
        cfg = KernelConfig.from_dict(d)
    except (InvalidConfigError, TypeError) as e:
        raise RecordError(f"config: {e}") from None
    if key is not None and len(_checked) < 4096:
        _checked[key] = cfg
    return cfg


def check_record(r):
    """Raise :class:`RecordError` naming the first problem of the record ``r`` (a parsed JSON
    line); return the record's kind. Only the kinds the lookup reads (``best``, ``measurement``)
    are checked field by field; a ``run`` record or an unknown kind is checked for its kind's
    type only (the lookup ignores them)."""
    if not isinstance(r, dict):
        raise RecordError("not a JSON object")
    kind = r.get("kind")
    if type(kind) is not str or len(kind) > 64:
        raise RecordError(f"kind must be a string, not {_show(kind)}")
    if kind not in ("best", "measurement"):
        return kind
    mode = r.get("mode")
    if mode is not None and (type(mode) is not str or len(mode) > 64):
        raise RecordError(f"mode must be a string, not {_show(mode)}")
    if mode is not None and mode not in MODES:
        return kind          # a mode of a newer clmf: the lookup leaves it out (record_mode)
    side = r.get("side")
    if side not in SIDES + ("both",):
        raise RecordError(f"side must be 'users', 'items' or 'both', not {_show(side)}")
    _device(r.get("device"))
    f = _int(r.get("f"), "f", 1, MAX_FACTORS)
    storage = r.get("storage", "float32")
    if storage not in ("float32", "float16"):
        raise RecordError(f"storage must be 'float32' or 'float16', not {_show(storage)}")
    _text(r, "run_id")
    _text(r, "date", required=False)
    cfg = _config(r.get("config"))
    if cfg.solver != "cholesky" and cfg.cg_steps > max(f + 1, KernelConfig.cg_steps):
        raise RecordError(f"config: cg_steps={cfg.cg_steps} exceeds f={f}")
    if kind == "best":
        if side == "both":
            raise RecordError("a best record names one side")
        _dataset(r.get("dataset"), required=True)
        _number(r.get("iteration_rel_baseline"), "iteration_rel_baseline", required=False)
    else:
        status = r.get("status")
        if type(status) is not str or len(status) > 64:
            raise RecordError(f"status must be a string, not {_show(status)}")
        if status == "ok":
            _number(r.get("seconds"), "seconds")
    return kind
