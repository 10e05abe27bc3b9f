"""Where a device query spent its time: :class:`QueryTrace`, filled by
:meth:`clmf.inference.topk.DeviceTopK.iter_query` batch by batch (host enqueue / wait / finish
seconds, device kernel and copy seconds, each batch's device interval on the host clock), and
:func:`union_seconds` to lay several devices' intervals side by side."""
from __future__ import annotations

import math
import time

__all__ = ["QueryTrace", "union_seconds"]


class QueryTrace:
    """Where one :meth:`~clmf.inference.topk.DeviceTopK.iter_query` spent its time: host
    seconds enqueueing, waiting for the device and turning lists into results, and each batch's
    device interval (profiling events, moved onto the host's ``time.perf_counter`` clock by the
    first kernel's queued stamp, so the batches of several devices can be laid side by side)."""

    def __init__(self):
        """An empty trace started now."""
        self.t0 = time.perf_counter()
        self.t1 = None
        self.rows = 0
        self.enqueue_s = self.wait_s = self.finish_s = 0.0
        self.kernel_s = self.copy_s = 0.0
        self.intervals = []                # (start, end) of each batch on the device, host clock
        self._offset = None                # host clock − device clock, seconds

    def batch(self, nb, enqueued, events, copies):
        """Record a finished batch of ``nb`` rows: its kernel ``events`` and copy events (all
        complete), ``enqueued`` the host time just after its first kernel was enqueued."""
        def prof(e):
            """An event's (queued, start, end) in seconds of the device clock."""
            p = e.profile
            return p.queued * 1e-9, p.start * 1e-9, p.end * 1e-9
        ks = [prof(e) for e in events]
        cs = [prof(e) for e in copies]
        if self._offset is None:
            self._offset = enqueued - ks[0][0]
        self.rows += nb
        self.kernel_s += sum(e - s for _q, s, e in ks)
        self.copy_s += sum(e - s for _q, s, e in cs)
        self.intervals.append((ks[0][1] + self._offset, max(e for _q, _s, e in ks + cs)
                               + self._offset))

    def close(self):
        """Mark the end of the query."""
        self.t1 = time.perf_counter()

    def summary(self, origin=None):
        """A dict of the trace: rows, batches, wall, host (enqueue, wait, finish) and device
        (kernel, copy, busy: the union of the batches' intervals, idle: the gaps between the
        first start and the last end) seconds; ``first_start``/``last_end`` relative to
        ``origin`` (default: the query's start)."""
        origin = self.t0 if origin is None else origin
        t1 = time.perf_counter() if self.t1 is None else self.t1
        busy = union_seconds(self.intervals)
        span = (self.intervals[-1][1] - self.intervals[0][0]) if self.intervals else 0.0
        out = {"rows": self.rows, "batches": len(self.intervals), "wall_s": t1 - self.t0,
               "enqueue_s": self.enqueue_s, "wait_s": self.wait_s, "finish_s": self.finish_s,
               "kernel_s": self.kernel_s, "copy_s": self.copy_s, "device_busy_s": busy,
               "device_idle_s": max(0.0, span - busy)}
        if self.intervals:
            out["first_start_s"] = self.intervals[0][0] - origin
            out["last_end_s"] = max(e for _s, e in self.intervals) - origin
        return out


def union_seconds(intervals):
    """Total length of the union of ``(start, end)`` intervals."""
    tot, end = 0.0, -math.inf
    for s, e in sorted(intervals):
        if e > end:
            tot += e - max(s, end)
            end = e
    return tot
