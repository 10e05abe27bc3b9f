"""The tuning database schema: record keys shared by the library and the tuner (device keys,
modes, kernel widths), :data:`SCHEMA_VERSION`, the baseline configuration and :class:`Choice`."""
from __future__ import annotations

import dataclasses
import logging
import re

from ..engine.config import KernelConfig

log = logging.getLogger(__name__)

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
    """The normalised device key of a :class:`clmf.engine.device.DeviceInfo` (driver recorded, not
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
