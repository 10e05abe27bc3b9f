"""The memory plan of one device: what is resident, what is streamed, in bytes — before any
device work.

:func:`plan_device` is a pure function of shapes, configurations and the device's limits (global
memory, largest single allocation — a quarter of memory on NVIDIA), so it can be tested and
printed without a device. A side whose rating block does not fit is streamed in chunks of rows
(double-buffered: two chunk buffers, the upload of chunk k+1 overlapping the kernels of chunk k);
the factor buffers stay resident. Only when even one chunk (the longest row) cannot fit next to
the factors and the scratch does it raise :class:`clmf.DeviceMemoryError`, naming the bytes
needed and what to change.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import DeviceMemoryError
from .partition import chunk_rows

__all__ = ["DevicePlan", "SideMemory", "plan_device", "device_budget", "scratch_rows"]

_SCRATCH_CAP = 512 << 20        # per-side hermitian scratch, as the single-device engine
_MAX_BATCH_ROWS = 1 << 16
_MAX_CHUNK_ROWS = 1 << 20       # rows per streamed chunk (its indptr buffer)
_ENTRY = 8                      # bytes per rating on the device: int32 index + float32 value
_USABLE = 0.9                   # of global memory, leaving the runtime its share


def device_budget(global_mem, max_alloc, max_device_memory=None):
    """``(budget, max_alloc)`` in bytes: 90 % of global memory, or the user's cap (read by
    :func:`clmf.data.validation.check_memory_cap`: an int is bytes, a float in (0, 1] a
    fraction of global memory)."""
    from ..data.validation import check_memory_cap
    budget = int(_USABLE * global_mem)
    if max_device_memory is not None:
        budget = min(budget, check_memory_cap(max_device_memory, global_mem))
    return budget, int(min(max_alloc, budget))


def scratch_rows(f, rows, batch_rows, cap):
    """Rows per launch given the config's ``batch_rows`` and a byte cap on the scratch."""
    per_row = 4 * (f * f + f)
    fit = max(1, int(cap) // per_row)
    want = batch_rows or _MAX_BATCH_ROWS
    return int(max(1, min(want, fit, max(rows, 1))))


@dataclasses.dataclass
class SideMemory:
    """One solved side on one device: rows ``[r0, r1)``, chunks of rows, resident or streamed."""
    side: str
    r0: int
    r1: int
    nnz: int
    batch_rows: int
    resident: bool
    chunks: list                  # [(row_start, row_end)] global rows
    chunk_nnz: int                # capacity of a chunk buffer (entries)
    chunk_rows: int               # capacity of a chunk's indptr (rows)

    @property
    def buffers(self):
        """Chunk buffer sets on the device: 1 resident, 2 streamed (double-buffered)."""
        return 1 if self.resident else 2

    def data_bytes(self):
        """Bytes of the rating buffers on the device."""
        return self.buffers * (self.chunk_nnz * _ENTRY + (self.chunk_rows + 1) * 8)


@dataclasses.dataclass
class DevicePlan:
    """The memory plan of one device (bytes per component in ``bytes``)."""
    device: str
    budget: int
    max_alloc: int
    sides: dict                   # side -> SideMemory
    bytes: dict

    @property
    def total(self):
        """Bytes allocated on the device."""
        return int(sum(self.bytes.values()))

    @property
    def streamed(self):
        """Sides streamed from host memory."""
        return [s for s, m in self.sides.items() if not m.resident]

    def describe(self):
        """A one-line summary."""
        parts = [f"{self.device}: {self.total / 2**20:.0f} of {self.budget / 2**20:.0f} MiB"]
        for s, m in self.sides.items():
            how = "resident" if m.resident else f"streamed in {len(m.chunks)} chunks"
            parts.append(f"{s} rows {m.r0}..{m.r1} ({m.nnz} ratings) {how}")
        return "; ".join(parts)


def _mib(x):
    """Bytes for a message: exact below 1 MiB, else MiB/GiB."""
    x = int(x)
    if x < 1 << 20:
        return f"{x:,} bytes"
    if x < 1 << 30:
        return f"{x / 2**20:,.1f} MiB"
    return f"{x / 2**30:,.2f} GiB"


def plan_device(name, global_mem, max_alloc, *, f, ldf, itemsize, blocks, factor_rows,
                batch_rows=None, implicit=False, other_rows=None,
                max_device_memory=None, force_stream=()):
    """Plan one device's memory.

    Parameters
    ----------
    name : the device's name (messages).
    global_mem, max_alloc : the device's global memory and largest single allocation (bytes).
    f : unknowns per system (factors, + 1 with biases); ldf, itemsize : factor row layout.
    blocks : side -> ``(indptr, r0, r1)``: the solved rows of each side on this device and the
        int64 indptr they index (global offsets; only ``indptr[r0..r1]`` is read).
    factor_rows : side -> rows of that side's factor held on the device (whole or a block).
    batch_rows : side -> the configuration's rows per launch (None: fit the scratch cap).
    implicit : the Gram matrix buffers of implicit feedback.
    other_rows : side -> rows of the fixed factor read by the Gram (implicit), default the
        factor rows of the other side.
    max_device_memory : the user's cap (bytes, or fraction ≤ 1 of global memory).
    force_stream : sides to stream even when they fit (tests).

    Returns
    -------
    DevicePlan

    Raises
    ------
    DeviceMemoryError when the factors, the scratch and one chunk of the longest row cannot fit.
    """
    budget, alloc = device_budget(global_mem, max_alloc, max_device_memory)
    full, _ = device_budget(global_mem, max_alloc)
    # the scratch the uncapped device would use (a cap streams ratings first); smaller scratch
    # (more launches) only when even streaming does not fit
    per_row = 4 * (f * f + f)
    caps = [min(_SCRATCH_CAP, max(per_row, full // 8), alloc)]
    caps += [c for c in (budget // 8, budget // 32, per_row) if c < caps[-1]]
    for k, scratch_cap in enumerate(caps):
        try:
            return _plan(name, budget, alloc, scratch_cap, f=f, ldf=ldf, itemsize=itemsize,
                         blocks=blocks, factor_rows=factor_rows, batch_rows=batch_rows,
                         implicit=implicit, other_rows=other_rows, force_stream=force_stream)
        except DeviceMemoryError:
            if k == len(caps) - 1:
                raise


def _plan(name, budget, alloc, scratch_cap, *, f, ldf, itemsize, blocks, factor_rows,
          batch_rows, implicit, other_rows, force_stream):
    """:func:`plan_device` at one scratch size."""
    batch_rows = batch_rows or {}
    fixed = {}
    for s, rows in factor_rows.items():
        fixed[f"factors_{s}"] = max(1, int(rows)) * ldf * itemsize
        if fixed[f"factors_{s}"] > alloc:
            raise DeviceMemoryError(
                f"the {s} factors need {_mib(fixed[f'factors_{s}'])} in one buffer, more than "
                f"{name}'s largest allocation ({_mib(alloc)}); use more devices (the reduce mode "
                "keeps only a block of a huge factor per device), fewer factors or a larger "
                "max_device_memory")
    rows_per = {}
    for s, (indptr, r0, r1) in blocks.items():
        br = scratch_rows(f, r1 - r0, batch_rows.get(s), scratch_cap)
        rows_per[s] = br
        fixed[f"scratch_{s}"] = br * 4 * (f * f + f) + 4 * f * f
        if implicit:
            o = (other_rows or {}).get(s)
            if o is None:
                o = factor_rows["items" if s == "users" else "users"]
            fixed[f"gram_{s}"] = 65 * 8 + int(o) * 8
    fixed["status"] = 16
    sides = {}
    lengths = {}
    for s, (indptr, r0, r1) in blocks.items():
        ip = np.asarray(indptr[r0:r1 + 1], dtype=np.int64)
        nnz = int(ip[-1] - ip[0]) if ip.size else 0
        longest = int(np.max(np.diff(ip))) if ip.size > 1 else 0
        lengths[s] = (ip, nnz, longest)
        sides[s] = SideMemory(s, int(r0), int(r1), nnz, rows_per[s], True, [(int(r0), int(r1))],
                              max(1, nnz), max(1, r1 - r0))
    # stream the largest sides until the rest fits; each streamed side needs at least two
    # chunk buffers of its longest row
    def resident_bytes(s):
        r0, r1 = sides[s].r0, sides[s].r1
        return lengths[s][1] * _ENTRY + (r1 - r0 + 1) * 8

    def min_stream(s):
        return 2 * (max(lengths[s][2], 1) * _ENTRY + 2 * 8)

    streamed = [s for s in blocks if s in force_stream]
    streamed += [s for s in blocks if s not in streamed
                 and max(lengths[s][1] * 4, (sides[s].r1 - sides[s].r0 + 1) * 8) > alloc]
    order = sorted(blocks, key=lambda s: -lengths[s][1])
    while True:
        need = sum(fixed.values()) + sum(min_stream(s) if s in streamed else resident_bytes(s)
                                         for s in blocks)
        if need <= budget:
            break
        rest = [s for s in order if s not in streamed]
        if not rest:
            longest = {s: lengths[s][2] for s in blocks}
            raise DeviceMemoryError(
                f"{name}: the fit needs at least {_mib(need)} on this device, the budget is "
                f"{_mib(budget)}: factors and scratch {_mib(sum(fixed.values()))}, two chunks "
                f"of the longest rows ({longest} ratings) streamed; raise max_device_memory "
                "(or use a device with more memory), fewer factors or more devices")
        streamed.append(rest[0])
    room = budget - sum(fixed.values()) - sum(resident_bytes(s) for s in blocks
                                              if s not in streamed)
    weight = sum(max(lengths[s][1], 1) for s in streamed)
    spare = room - sum(min_stream(s) for s in streamed)
    for s in streamed:
        ip, nnz, longest = lengths[s]
        r0, r1 = sides[s].r0, sides[s].r1
        share = min_stream(s) + spare * max(nnz, 1) // max(weight, 1)
        # two buffer sets, each of entries (8 bytes) and row pointers (8 bytes per row)
        cap_nnz = min(max(share // 2 // (_ENTRY + 8), longest, 1), alloc // 4)
        if s in force_stream:
            cap_nnz = min(cap_nnz, max(longest, 1, -(-nnz // 3)))   # tests: several chunks
        cap_rows = min(_MAX_CHUNK_ROWS, alloc // 8 - 1, max(1, r1 - r0), max(1, cap_nnz))
        chunks = chunk_rows(ip - ip[0], 0, r1 - r0, cap_nnz, cap_rows)
        chunks = [(a + r0, b + r0) for a, b in chunks]
        c_nnz = max(int(ip[b - r0] - ip[a - r0]) for a, b in chunks) if chunks else 1
        c_rows = max(b - a for a, b in chunks) if chunks else 1
        sides[s] = SideMemory(s, r0, r1, nnz, rows_per[s], False, chunks, max(1, c_nnz),
                              max(1, c_rows))
    data = {f"ratings_{s}": m.data_bytes() for s, m in sides.items()}
    plan = DevicePlan(name, budget, alloc, sides, {**fixed, **data})
    if plan.total > budget:
        raise DeviceMemoryError(
            f"{name}: the plan needs {_mib(plan.total)}, the budget is {_mib(budget)} "
            f"({plan.bytes}); raise max_device_memory, use fewer factors or more devices")
    return plan
