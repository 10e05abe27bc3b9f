"""What the engine needs to know of a device's share of a fit, and the small machinery of its
half-steps: the batches it launches, the thread that publishes solved rows to an exchange.

A one-device fit is the share that owns every row of both sides (:meth:`Share.whole`); a
multi-device fit (:mod:`clmf.parallel`) gives each device's :class:`clmf.engine.Engine` the
share its partition plan assigns. The engine knows nothing of the other devices: an exchange
object (``needed``, ``host``, ``publish``, ``finish``, ``take``, ``fail``) moves the rows.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import queue as _queue
import threading
import time

import numpy as np
import scipy.sparse as sp

__all__ = ["SideData", "Share", "Batch", "Publisher", "SIDES", "other_side", "fill"]

SIDES = ("users", "items")


def other_side(side):
    """The side that is fixed while ``side`` is solved."""
    return "items" if side == "users" else "users"


@dataclasses.dataclass
class SideData:
    """CSR of one side (rows to solve) with the other side's factors as columns; ``indices`` and
    ``data`` are None where they exist only on the device (the items' side, transposed there)."""
    indptr: np.ndarray   # int64
    indices: np.ndarray  # int32 or None
    data: np.ndarray     # float32 or None

    @classmethod
    def from_csr(cls, R):
        """The side of a CSR (no copy of arrays already int32 indices / float32 data)."""
        R = sp.csr_matrix(R)
        return cls(R.indptr.astype(np.int64, copy=False), R.indices.astype(np.int32, copy=False),
                   R.data.astype(np.float32, copy=False))

    def counts(self):
        """Entries per row (int64)."""
        return np.diff(np.asarray(self.indptr, dtype=np.int64))

    def entries(self, r0, r1):
        """``(indptr rebased to 0, indices, data)`` of rows ``[r0, r1)`` (views of the entries;
        the row pointers themselves where they start at 0)."""
        ip = np.asarray(self.indptr[r0:r1 + 1], dtype=np.int64)
        e0, e1 = int(ip[0]), int(ip[-1])
        return (ip if e0 == 0 else ip - e0), self.indices[e0:e1], self.data[e0:e1]

    @property
    def rows(self):
        """Rows of this side."""
        return len(self.indptr) - 1

    @property
    def nnz(self):
        """Entries of this side."""
        return int(self.indptr[-1])

    def nbytes(self):
        """Bytes of the side on the device (int32 indices and float32 values per entry)."""
        if self.indices is None:
            return self.indptr.nbytes + 8 * self.nnz
        return self.indptr.nbytes + self.indices.nbytes + self.data.nbytes


@dataclasses.dataclass
class Share:
    """One device's part of a fit: ``index`` its position, ``blocks[side] = (r0, r1)`` the rows
    it solves, ``frange[side] = (lo, hi)`` the factor rows it holds, ``plan`` its
    :class:`~clmf.engine.memory.DevicePlan`, ``ldf`` the fit's common row width, ``sources[side]``
    the host CSR of the rows it computes on (the layout's side, or for a side whose normal
    equations are reduced every row restricted to this device's block of the fixed side),
    ``reduced`` the sides whose partial normal equations are summed over the devices and
    ``whole[side]`` the layout's side (its row counts regularise and solve a reduced side's
    rows; default ``sources``)."""
    index: int
    blocks: dict
    frange: dict
    plan: object
    ldf: int
    sources: dict
    reduced: frozenset = frozenset()
    whole: dict | None = None


@dataclasses.dataclass
class Batch:
    """One launch of a half-step: its buffer set, the chunk's first row ``r0``, ``row0`` within
    the chunk, ``rows``, ``wait`` (the upload its first kernel waits for), the pieces ``v0``,
    ``nv`` of a split launch (``nv`` 0: unsplit), ``head``: the last launch before a rotation
    (:func:`head_split`); the caller sets ``done``."""

    bset: dict
    r0: int
    row0: int
    rows: int
    wait: list | None
    v0: int = 0
    nv: int = 0
    done: object = None
    head: bool = False


def head_split(batches, rows):
    """``batches`` with their first ``rows`` rows as launches of their own, the last of them
    marked ``head`` (a rotated half-step's rows solved before its rotation: see
    :mod:`clmf.engine.rotate`). A split launch (``nv``) is not cut: the head then ends with it."""
    left = rows
    for b in batches:
        if left <= 0:
            yield b
        elif b.nv or b.rows <= left:
            left -= b.rows
            b.head = left <= 0
            yield b
        else:
            yield Batch(b.bset, b.r0, b.row0, left, b.wait, head=True)
            tail = Batch(b.bset, b.r0, b.row0 + left, b.rows - left, None)
            yield tail
            b.done = tail.done         # read by the generator of ``batches`` (its chunk's end)
            left = 0


class Publisher:
    """A thread that waits for a device's device → host copies in order and publishes each;
    started at its first use (a thread's start waits for the interpreter's lock, which the
    other devices' threads hold while they launch: not before this device's kernels)."""

    def __init__(self, exchange, index):
        self.exchange = exchange
        self.index = index
        self.items = _queue.Queue()
        self.thread = None
        self.done_at = None          # when the event given to watch() had completed

    def _start(self):
        """The thread, started once."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()

    def put(self, event, r0, r1):
        """Publish rows ``[r0, r1)`` once ``event`` completes."""
        self._start()
        self.items.put((event, r0, r1))

    def watch(self, event):
        """After the rows put so far, wait for ``event`` too and note when it had completed
        (:attr:`done_at`)."""
        self._start()
        self.items.put((event, None, None))

    def close(self):
        """No more chunks."""
        self._start()
        self.items.put(None)

    def join(self):
        """Wait until every chunk was published."""
        if self.thread is not None:
            self.thread.join()

    def _run(self):
        """Wait for each copy in turn and publish its rows; a failure wakes every waiter."""
        try:
            while True:
                item = self.items.get()
                if item is None:
                    self.exchange.finish(self.index)
                    return
                event, r0, r1 = item
                if event is not None:
                    event.wait()
                if r0 is None:
                    self.done_at = time.perf_counter()
                else:
                    self.exchange.publish(self.index, r0, r1)
        except BaseException as e:        # the waiting workers must not hang
            self.exchange.fail(e)


def coalesce(chunks):
    """Published ``(device, r0, r1)`` chunks as row ranges, adjacent ones of the same device
    joined (one copy each: every enqueue call costs the uploading thread tens of
    microseconds; a range never spans two devices' blocks, which a Dask worker's host rows
    keep apart)."""
    out = []
    for d, r0, r1 in sorted(chunks, key=lambda c: (c[0], c[1])):
        if out and out[-1][0] == d and out[-1][2] == r0:
            out[-1][2] = r1
        else:
            out.append([d, r0, r1])
    return [(r0, r1) for _d, r0, r1 in out]


def account(times, stage_times, events, stream_events=(), copy_events=()):
    """Add profiled events' device seconds to an engine's ``times`` and ``stage_times``: each
    launch's ``(s1, s2, s3, combine)`` events per stage and as ``kernels``; the streamed and
    exchanged copies' busy time."""
    def busy(evs):
        """Seconds the events ran."""
        return sum((e.profile.end - e.profile.start) * 1e-9 for e in evs if e is not None)
    for e1, e2, e3, ec in events:
        for key, e in (("s1", e1), ("s2", e2), ("s3", e3), ("combine", ec)):
            if e is not None:
                t = (e.profile.end - e.profile.start) * 1e-9
                stage_times[key] = stage_times.get(key, 0.0) + t
                times["kernels"] = times.get("kernels", 0.0) + t
    for key, evs in (("stream_copies", stream_events), ("exchange_copies", copy_events)):
        if evs:
            times[key] = times.get(key, 0.0) + busy(evs)


def publish_rows(engine, side, exchange, publisher, copy_events, item):
    """Have ``engine`` read its solved rows ``item = (event, first row, count)`` of ``side``
    into ``exchange.host`` once ``event`` ends, and hand the copy to ``publisher`` (its event
    also appended to ``copy_events``)."""
    done, g0, n = item
    ev = engine.read_rows(side, exchange.host, g0, g0 + n, blocking=False, wait_for=[done])
    copy_events.append(ev)
    publisher.put(ev, g0, g0 + n)


def fill(pool, dst, src):
    """``dst[:len(src)] = src`` in up to four host threads of ``pool`` (a one-element list
    holding the executor, created on first need; NumPy releases the GIL)."""
    n = len(src)
    parts = max(1, min(4, n // (1 << 22)))
    if parts == 1:
        np.copyto(dst[:n], src, casting="unsafe")
        return
    if pool[0] is None:
        pool[0] = concurrent.futures.ThreadPoolExecutor(4)
    cuts = np.linspace(0, n, parts + 1).astype(np.int64)
    list(pool[0].map(lambda k: np.copyto(dst[cuts[k]:cuts[k + 1]], src[cuts[k]:cuts[k + 1]],
                                         casting="unsafe"), range(parts)))
