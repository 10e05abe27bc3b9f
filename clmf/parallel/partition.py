"""Row blocks balanced by work, and the plan saying which device owns which rows of each side.

Blocks are contiguous row ranges of a side (users: rows of the CSR, items: rows of the CSC),
cut where the prefix sum of the per-row cost crosses equal shares. The cost of a row in a
half-step is ``n_r·f²`` (S1, the hermitian) ``+ f³/3`` (S3, the solve), so the weight of a row is
``n_r + f/3``: ratings dominate (balance by ratings, not by row count) but a block of many
near-empty rows is not free. All arithmetic is int64/float64 (Hugewiki has 3.1·10⁹ ratings).

Fixed factor per side — replicate or reduce
-------------------------------------------
When a side is solved, every device needs the *other* side's factors ("the fixed factor").

* ``"replicate"`` (model parallel): each device holds the whole fixed factor; after a half-step
  the solved blocks are all-gathered through host memory. Bytes moved into each device per
  iteration ≈ ``(m + n)·ldf·4·(N−1)/N``.
* ``"reduce"`` (data parallel, cuMF's choice for Hugewiki): the fixed factor stays partitioned
  with the device's rows; each device computes partial normal equations ``Σ y yᵀ`` and ``Σ r y``
  of *every* row of the solved side over its own block of the fixed side; the partials are summed
  through host memory and each device solves its own rows. Bytes per device per half-step ≈
  ``2·rows_solved·(f² + f)·4``, independent of the fixed side's size.

The rule (:func:`choose_modes`): solving side S with fixed side O, reduce when O's factor does not
fit on a device next to the rest, or when the partial normal equations of S are smaller than
what replicating O costs per iteration, ``rows_S·(f² + f) < rows_O·ldf`` — i.e. when the fixed
side has more than about ``f`` times as many rows as the solved side. Netflix (480K × 18K,
f = 100): replicate both (the item partials would be 18K·10⁴ floats against 480K·100 of X: 4×
more). Hugewiki (50M × 40K, f = 100): replicate Y for the users' half-step, reduce for the
items' half-step (X is 20 GB; the item partials are 1.6 GB).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..engine.memory import chunk_rows

__all__ = ["balanced_blocks", "row_weights", "SidePlan", "Plan", "make_plan", "choose_modes",
           "chunk_rows"]

SIDES = ("users", "items")


def row_weights(counts, f):
    """Work per row of a half-step: ratings plus the solve's ``f/3`` (float64)."""
    return np.asarray(counts, dtype=np.float64) + max(1.0, f / 3.0)


def balanced_blocks(counts, parts, f=0, shares=None):
    """Bounds (int64, ``parts + 1`` values) of contiguous row blocks of about equal work.

    Parameters
    ----------
    counts : 1-D array of per-row rating counts (any integer dtype; int64 sums).
    parts : number of blocks (devices).
    f : factors (the per-row solve term, see :func:`row_weights`); 0 balances ratings only.
    shares : optional relative speeds of the devices (block d gets ``shares[d]/Σshares`` of the
        work).

    Returns
    -------
    ndarray int64 — block ``d`` is rows ``[b[d], b[d+1])``; a block may be empty when there are
    fewer rows than parts.
    """
    counts = np.asarray(counts)
    parts = int(parts)
    if parts < 1:
        raise ValueError(f"parts must be ≥ 1, not {parts}")
    rows = counts.size
    w = row_weights(counts, f) if f else counts.astype(np.float64)
    cum = np.empty(rows + 1, np.float64)
    cum[0] = 0.0
    np.cumsum(w, out=cum[1:])
    if shares is None:
        shares = np.ones(parts)
    shares = np.asarray(shares, np.float64)
    if shares.shape != (parts,) or not np.all(shares > 0):
        raise ValueError(f"shares must be {parts} positive numbers, not {shares!r}")
    targets = cum[-1] * np.cumsum(shares)[:-1] / shares.sum()
    right = np.searchsorted(cum, targets, side="left").astype(np.int64)
    # the cut nearer to the target: before or after the row that crosses it
    left = np.maximum(right - 1, 0)
    right = np.minimum(right, rows)
    pick = np.where(np.abs(cum[left] - targets) <= np.abs(cum[right] - targets), left, right)
    bounds = np.empty(parts + 1, np.int64)
    bounds[0], bounds[-1] = 0, rows
    bounds[1:-1] = np.maximum.accumulate(pick) if pick.size else pick
    return bounds


def choose_modes(shape, f, ldf, devices, fits_replicated=(True, True)):
    """Per solved side, ``"replicate"`` or ``"reduce"`` for the fixed factor (the module's rule).

    ``fits_replicated[k]``: whether the fixed factor of side k (users: Y, items: X) fits on every
    device; a factor that does not fit is always reduced. One device always replicates (nothing
    to exchange)."""
    m, n = (int(x) for x in shape)
    modes = {}
    for k, (side, rows_s, rows_o) in enumerate((("users", m, n), ("items", n, m))):
        if devices == 1:
            modes[side] = "replicate"
            continue
        if not fits_replicated[k]:
            modes[side] = "reduce"
            continue
        partial_cost = rows_s * (f * f + f)
        replicate_cost = rows_o * ldf
        modes[side] = "reduce" if partial_cost < replicate_cost else "replicate"
    # both sides reduced would leave no device holding either factor whole: not useful
    if modes["users"] == "reduce" and modes["items"] == "reduce":
        modes["users" if m >= n else "items"] = "replicate"
    return modes


@dataclasses.dataclass
class SidePlan:
    """How one side is split: device ``d`` solves rows ``[bounds[d], bounds[d+1])``; ``mode``
    says whether the fixed (other) factor is replicated or the normal equations reduced."""
    side: str
    bounds: np.ndarray
    mode: str = "replicate"

    def block(self, d):
        """Rows ``(start, stop)`` of device ``d``."""
        return int(self.bounds[d]), int(self.bounds[d + 1])

    def owner(self, row):
        """The device solving ``row``."""
        return int(np.searchsorted(self.bounds, row, side="right") - 1)


@dataclasses.dataclass
class Plan:
    """Which device owns which rows of each side (see the module docstring for the modes)."""
    shape: tuple
    nnz: int
    devices: int
    sides: dict          # side -> SidePlan

    def __getitem__(self, side):
        return self.sides[side]

    def describe(self):
        """One line per side: mode and rows per device."""
        out = []
        for s in SIDES:
            sp_ = self.sides[s]
            rows = np.diff(sp_.bounds).tolist()
            out.append(f"{s}: {sp_.mode}, rows per device {rows}")
        return "; ".join(out)


def make_plan(user_counts, item_counts, devices, f, ldf=None, shares=None, modes=None):
    """The :class:`Plan` of a fit on ``devices`` devices from per-row counts of both sides."""
    user_counts = np.asarray(user_counts)
    item_counts = np.asarray(item_counts)
    shape = (user_counts.size, item_counts.size)
    nnz = int(user_counts.sum(dtype=np.int64))
    if int(item_counts.sum(dtype=np.int64)) != nnz:
        raise ValueError("user and item counts disagree on the number of ratings")
    if modes is None:
        modes = choose_modes(shape, f, ldf or f, devices)
    sides = {}
    for s, counts in (("users", user_counts), ("items", item_counts)):
        sides[s] = SidePlan(s, balanced_blocks(counts, devices, f, shares), modes[s])
    return Plan(shape, nnz, int(devices), sides)
