"""The devices of a multi-device fit: each runs the one device engine
(:class:`clmf.engine.Engine`) on its share of the partition plan (:func:`device_engine`), with
the solved rows exchanged through host memory while it computes (:class:`Exchange`).

An engine owns four in-order queues on its device: ``compute`` (S1 → S2 → S3), ``stream``
(rating chunks host → device), ``out`` (its solved rows device → host, each batch as soon as its
S3 is done) and ``into`` (rows solved by other devices host → device, each chunk as soon as its
owner published it). Transfers therefore overlap the kernels. A chunk's row pointers are rebased
to its first entry and S3 writes factor row ``xoff + row`` of the buffer (``xoff`` the chunk's
first row in the buffer's numbering), so no offset the kernels see exceeds one chunk's size.
"""
from __future__ import annotations

import threading

from ..engine.blocks import SIDES, Share, other_side
from ..engine.core import Engine

__all__ = ["Exchange", "device_engine", "device_share", "SIDES", "other_side"]


def device_share(d, layout, plan, dplan, ldf, sources=None):
    """Device ``d``'s :class:`~clmf.engine.blocks.Share` of a fit of ``layout`` partitioned by
    ``plan`` (a :class:`clmf.parallel.partition.Plan`): the rows it solves, the factor rows it
    holds (all of a side the other side's half-step replicates, else its block), its memory
    plan ``dplan`` and the partial layouts ``sources`` of its reduced sides."""
    n = plan.devices
    blocks = {s: tuple(int(x) for x in plan[s].block(d)) for s in SIDES}
    frange = {s: ((0, layout[s].rows) if plan[other_side(s)].mode == "replicate" or n == 1
                  else blocks[s]) for s in SIDES}
    reduced = frozenset(s for s in SIDES if plan[s].mode == "reduce" and n > 1)
    src = {s: (sources or {}).get(s, layout[s]) for s in SIDES}
    return Share(d, blocks, frange, dplan, int(ldf), src, reduced,
                 {s: layout[s] for s in SIDES})


def device_engine(d, device, layout, plan, dplan, f, ldf, configs, implicit_alpha=None,
                  biased=False, offset=0.0, context=None, profile=False, sources=None,
                  pinned=None):
    """The :class:`clmf.engine.Engine` of device ``d`` of a multi-device fit (``configs``: side →
    KernelConfig; see :func:`device_share`)."""
    return Engine(device, layout, f, (configs["users"], configs["items"]), profile=profile,
                  implicit_alpha=implicit_alpha, biased=biased, offset=offset,
                  share=device_share(d, layout, plan, dplan, ldf, sources), context=context,
                  pinned=pinned)


class Exchange:
    """Chunks of one side's solved rows published to a host array during one half-step.

    Workers call :meth:`publish` for each chunk of rows they solved once it is in ``host`` and
    :meth:`finish` at the end; :meth:`take` hands a worker the chunks of the other devices it has
    not uploaded yet (blocking until there are some or every other device has finished)."""

    def __init__(self, side, host, devices, needed=True):
        self.side = side
        self.host = host
        self.devices = devices
        self.needed = needed
        self.cond = threading.Condition()
        self.chunks = []          # (device, r0, r1), in publication order
        self.finished = set()
        self.error = None

    def publish(self, device, r0, r1):
        """Rows ``[r0, r1)`` solved by ``device`` are in ``host``."""
        with self.cond:
            self.chunks.append((device, int(r0), int(r1)))
            self.cond.notify_all()

    def finish(self, device):
        """``device`` has published all its rows."""
        with self.cond:
            self.finished.add(device)
            self.cond.notify_all()

    def fail(self, exc):
        """A worker failed: wake every waiter."""
        with self.cond:
            self.error = exc
            self.cond.notify_all()

    def take(self, device, seen):
        """New chunks of other devices after position ``seen`` → ``(chunks, seen, all_done)``."""
        with self.cond:
            while True:
                if self.error is not None:
                    raise RuntimeError(f"another device failed: {self.error}") from self.error
                new = [c for c in self.chunks[seen:] if c[0] != device]
                seen_now = len(self.chunks)
                done = len(self.finished | {device}) >= self.devices
                if new or done:
                    return new, seen_now, done and not new
                self.cond.wait(timeout=1.0)
