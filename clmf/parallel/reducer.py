"""The host's side of the reduce mode's pipeline (:func:`clmf.engine.reduce.pipelined`).

Each device computes the packed partial systems of every row of a reduced side, in row order,
into its own host array. The rows are cut into *segments*, each inside one device's block (the
rows that device solves). Two places to sum them (``sums``, :data:`SUM_MODES`):

``"device"`` (the default): the owner keeps its own partials of a segment on the device and
    uploads each peer's copy as soon as it lands; its unpack sums them (own, then the peers in
    index order, whatever the landings' order); the host only hands each owner the copies of
    its segments as they land (:meth:`Port.take`: ``[(a, b, device)]``). Only the last
    segment's uploads wait for the last device.
``"host"``: when every device's copy of a segment has landed, host threads sum the devices'
    rows of it into the owner's array (in cache-sized jobs, the devices in index order); the
    owner takes its summed segments in order (:meth:`Port.take`: ``[(a, b)]``) and uploads them
    while the others still compute. Only the last segment's sum waits for the last device.

Both add the same numbers in the same order (the owner's own partials, then its peers' in
index order): the two modes give the same sums.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
import time

import numpy as np

from ..engine.memory import SEGMENT_BYTES, packed_width

__all__ = ["Reducer", "Port", "PartialsPort", "SummedPort", "segment_rows", "cut_segments",
           "SUM_MODES"]

SUM_MODES = ("device", "host")      # where the in-process reduce sums: the owner device, threads
SUM_BYTES = 1 << 20         # one host sum job's rows on one device, at most


def segment_rows(rows, devices, fs, batch_rows):
    """Rows per segment: at most :data:`SEGMENT_BYTES` of packed systems, at most a batch of
    any device (a segment is unpacked and solved in one launch), at least four segments per
    device's block on average (the last one's sum is exposed)."""
    per_row = 4 * packed_width(fs)
    return int(max(1, min(min(batch_rows), SEGMENT_BYTES // per_row,
                          -(-max(1, rows) // (4 * devices)))))


def cut_segments(bounds, seg):
    """``[(a, b, owner)]``: each device's block ``[bounds[d], bounds[d + 1])`` cut into pieces
    of ``seg`` rows, in row order (an empty block has none)."""
    out = []
    for d in range(len(bounds) - 1):
        for a in range(int(bounds[d]), int(bounds[d + 1]), seg):
            out.append((a, min(a + seg, int(bounds[d + 1])), d))
    return out


class Port:
    """Device ``d``'s view of a :class:`Reducer` (what :func:`clmf.engine.reduce.pipelined`
    calls)."""

    def __init__(self, reducer, d):
        self.reducer, self.d = reducer, d
        self.host, self.gram = reducer.host[d], reducer.gram[d]
        self.hosts = reducer.host                 # every device's (device sums: the peers')
        self.segments = reducer.segments
        self.device_sums = reducer.device_sums

    def landed(self, k):
        """This device's copy of segment ``k`` (None: its Gram matrix) is on the host (device
        sums: its own partials of a segment it owns are on the device, in its ring)."""
        self.reducer.landed(self.d, k)

    def take(self, block):
        """This device's next summed segments or, device sums, copies to upload (see
        :meth:`Reducer.take`)."""
        return self.reducer.take(self.d, block)

    def summed(self, at):
        """Device sums: every copy of this device's last segment was on the device at ``at``
        (``perf_counter``; its unpack sums them)."""
        self.reducer.device_summed(at)

    def gram_total(self):
        """The Gram matrix summed over the devices (waits for it)."""
        return self.reducer.gram_total()

    def fail(self, exc):
        """This device failed: wake every waiter."""
        self.reducer.fail(exc)


class PartialsPort:
    """The port of the reduce mode's first phase in two (:func:`clmf.engine.reduce.pipelined`
    with the Dask backend's tasks per half-step): the device's packed partial systems of every
    row into ``host`` (rows × packed width) and its Gram into ``gram``; nothing is summed or
    handed over here (the caller sums between the phases)."""

    device_sums = False          # the partial systems are summed between the phases

    def __init__(self, host, gram):
        """Write into ``host`` and ``gram``."""
        self.host, self.gram = host, gram
        self.segments = [(0, max(1, len(host)), 0)]

    def landed(self, k):
        """A copy landed: nothing waits for it in this phase."""

    def take(self, block):
        """Nothing is handed over in this phase."""
        return None

    def gram_total(self):
        """Not asked in this phase (nothing is solved)."""
        raise RuntimeError("the partials phase solves nothing")

    def fail(self, exc):
        """Nothing waits on this port."""


class SummedPort:
    """The port of the reduce mode's second phase in two: hands the device's rows ``[r0, r1)``
    over at once, as segments of :func:`segment_rows` rows, from ``host`` (their summed packed
    systems; indexed by global row, e.g. :class:`clmf.parallel.dask_tasks.Rows`) with the
    summed Gram ``gram``."""

    device_sums = False          # the partial systems are summed between the phases

    def __init__(self, host, gram, r0, r1, seg):
        """Hand over rows ``[r0, r1)`` of ``host`` in pieces of ``seg`` rows."""
        self.host, self.gram = host, gram
        self.segments = cut_segments([r0, r1], seg)
        self.given = False

    def landed(self, k):
        """No partials are computed in this phase."""

    def take(self, block):
        """Every segment at the first call, then None."""
        if self.given:
            return None
        self.given = True
        return [s[:2] for s in self.segments]

    def gram_total(self):
        """The summed Gram matrix."""
        return self.gram

    def fail(self, exc):
        """Nothing waits on this port."""


class Reducer:
    """The host arrays, segments and summing threads of one reduced side.

    ``alloc(d, shape)``: a float32 host array for device ``d`` (page-locked in its context on
    GPUs); ``sums``: where the segments are summed (:data:`SUM_MODES`). Per half-step:
    :meth:`start`, the devices' ports (:meth:`port`), :meth:`finish` (the seconds of its
    sums)."""

    def __init__(self, side, rows, bounds, fs, batch_rows, alloc, pool=None, sums=SUM_MODES[0]):
        if sums not in SUM_MODES:
            raise ValueError(f"sums must be one of {SUM_MODES}, not {sums!r}")
        self.side, self.rows, self.fs = side, int(rows), int(fs)
        self.device_sums = sums == "device"
        self.n = len(bounds) - 1
        self.w = packed_width(self.fs)
        self.seg = segment_rows(self.rows, self.n, self.fs, batch_rows)
        self.segments = cut_segments(bounds, self.seg)
        self.owned = [[k for k, s in enumerate(self.segments) if s[2] == d]
                      for d in range(self.n)]
        self.copies = [self.n * len(own) for own in self.owned]    # device sums: to hand over
        shapes = [(max(1, self.rows), self.w)] * self.n
        run = pool.map if pool is not None else map      # each device's array in its thread
        self.host = list(run(alloc, range(self.n), shapes))
        self.gram = [np.zeros((self.fs, self.fs), np.float32) for _ in range(self.n)]
        self.job_rows = max(1, SUM_BYTES // (4 * self.w))
        self.threads = concurrent.futures.ThreadPoolExecutor(
            max(1, min(32, os.cpu_count() or 1)), thread_name_prefix="clmf-reduce")
        self.cond = threading.Condition()
        self.start()

    def port(self, d):
        """Device ``d``'s :class:`Port`."""
        return Port(self, d)

    def start(self):
        """Forget the previous half-step (nothing landed, nothing summed)."""
        with self.cond:
            s = len(self.segments)
            self.count = [0] * s          # devices whose copy of the segment landed
            self.ready = [[] for _ in range(self.n)]   # device sums: copies not handed over
            self.given = [0] * self.n
            self.left = [0] * s           # its sum jobs not done
            self.summed = [False] * s
            self.next = [0] * self.n      # each owner's next segment to hand over
            self.grams, self.gram_sum = 0, None
            self.landings, self.error = 0, None
            self.t_landed = self.t_summed = None
            self.sum_s = 0.0

    def landed(self, d, k):
        """Device ``d``'s copy of segment ``k`` (None: its Gram) landed; the segment's sum jobs
        start with the last device's."""
        with self.cond:
            if k is None:
                self.grams += 1
                if self.grams == self.n:
                    self.gram_sum = np.sum(self.gram, axis=0, dtype=np.float32)
                    self.cond.notify_all()
                return
            self.count[k] += 1
            self.landings += 1
            if self.landings == self.n * len(self.segments):
                self.t_landed = time.perf_counter()
            if self.device_sums:
                a, b, o = self.segments[k]
                self.ready[o].append((a, b, d))
                self.cond.notify_all()
                return
            if self.count[k] < self.n:
                return
            a, b, _o = self.segments[k]
            cuts = list(range(a, b, self.job_rows))
            self.left[k] = len(cuts)
        for x in cuts:
            self.threads.submit(self._sum, k, x, min(x + self.job_rows, b))

    def _sum(self, k, x, y):
        """Rows ``[x, y)`` of segment ``k`` summed into its owner's array."""
        try:
            t = time.perf_counter()
            o = self.segments[k][2]
            dst = self.host[o][x:y]
            for e in range(self.n):
                if e != o:
                    np.add(dst, self.host[e][x:y], out=dst)
            done = time.perf_counter()
            with self.cond:
                self.sum_s += done - t
                self.left[k] -= 1
                if self.left[k] == 0:
                    self.summed[k] = True
                    self.t_summed = max(self.t_summed or done, done)
                    self.cond.notify_all()
        except BaseException as e:      # noqa: BLE001 - the devices' threads must not hang
            self.fail(e)

    def take(self, d, block):
        """``[(a, b)]``: device ``d``'s segments summed since its last call, in order (device
        sums: ``[(a, b, e)]``, the copies of device ``e`` of its segments landed since, in
        landing order); empty when none is ready and not ``block`` (with ``block`` waits for
        one); None once every one has been handed over."""
        if self.device_sums:
            return self._take_copies(d, block)
        with self.cond:
            while True:
                self._raise()
                own, i = self.owned[d], self.next[d]
                if i == len(own):
                    return None
                ready = []
                while i < len(own) and self.summed[own[i]]:
                    ready.append(self.segments[own[i]][:2])
                    i += 1
                self.next[d] = i
                if ready or not block:
                    return ready
                self.cond.wait(timeout=1.0)

    def _take_copies(self, d, block):
        """:meth:`take` with device sums."""
        with self.cond:
            while True:
                self._raise()
                if self.given[d] == self.copies[d]:
                    return None
                ready, self.ready[d] = self.ready[d], []
                self.given[d] += len(ready)
                if ready or not block:
                    return ready
                self.cond.wait(timeout=1.0)

    def device_summed(self, at):
        """Device sums: every copy of an owner's last segment was on the device at ``at``."""
        with self.cond:
            self.t_summed = max(self.t_summed or at, at)

    def gram_total(self):
        """Σ over the devices of their Gram matrices (waits until every one landed)."""
        with self.cond:
            while self.gram_sum is None:
                self._raise()
                self.cond.wait(timeout=1.0)
            return self.gram_sum

    def fail(self, exc):
        """A device or a sum failed: every waiter raises."""
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()

    def _raise(self):
        """Raise (the condition held) if a device or a sum failed."""
        if self.error is not None:
            raise RuntimeError(f"the reduce failed: {self.error}") from self.error

    def finish(self):
        """This half-step's seconds: ``sum`` (the host's sum jobs' time, all threads; 0 with
        device sums, made by the owners' unpack kernels, whose seconds count with the pack
        stage's) and ``wait`` (exposed: from the last device's last landed copy to the last
        segment summed on the host, or with device sums to the last copy of the last segment
        on its owner device, which the unpack both modes run then sums)."""
        with self.cond:
            wait = (max(0.0, self.t_summed - self.t_landed)
                    if self.t_landed is not None and self.t_summed is not None else 0.0)
            return {"sum": self.sum_s, "wait": wait}

    def close(self):
        """Stop the summing threads."""
        self.threads.shutdown(wait=True)
