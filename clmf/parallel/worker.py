"""The per-device worker: one device's row blocks of both sides, its factor buffers, its own
tuned configurations, and the half-step over its blocks (resident or streamed), with the solved
rows exchanged through host memory while it computes.

A worker owns four in-order queues on its device: ``compute`` (S1 → S2 → S3), ``stream`` (rating
chunks host → device), ``out`` (its solved rows device → host, each batch as soon as its S3 is
done) and ``into`` (rows solved by other devices host → device, each chunk as soon as its owner
published it). Transfers therefore overlap the kernels. The kernels are the single-device
engine's (:func:`clmf.engine.launch_batch`); a chunk's row pointers are rebased to its first
entry and S3 writes factor row ``xoff + row`` of the buffer (``xoff`` the chunk's first row
in the buffer's numbering), so no offset the kernels see exceeds one chunk's size.

Long rows are not split across work-groups here (a configuration's ``split`` is ignored): the
single-device engine's pieces (:func:`clmf.engine.core.split_rows`) are built once for resident
row pointers, while a worker's chunks are rebased and may be streamed; every launch here is the
unsplit :func:`clmf.engine.core.launch_batch`, whose scratch the multi-device plan counts.
"""
from __future__ import annotations

import dataclasses
import logging
import queue as _queue
import threading
import time

import numpy as np

from ..engine import kernels as K
from ..engine.core import launch_batch, launch_gram, launch_solve
from ..errors import InvalidConfigError, SingularSystemError
from ..interrupts import deferred_interrupts, drain
from ..tuning.spec import unknowns

log = logging.getLogger(__name__)

__all__ = ["DeviceWorker", "Exchange"]

SIDES = ("users", "items")
_INT_MAX = np.iinfo(np.int32).max


def other_side(side):
    """The side that is fixed while ``side`` is solved."""
    return "items" if side == "users" else "users"


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


class DeviceWorker:
    """One device's share of a fit (see the module docstring).

    Parameters
    ----------
    index : position of the device in the fit.
    device : pyopencl.Device; ``context``: an optional shared context holding it.
    layout : :class:`clmf.parallel.layout.Layout` (host arrays of both sides).
    plan : :class:`clmf.parallel.partition.Plan`; ``dplan``: this device's
        :class:`clmf.parallel.memory.DevicePlan`.
    f : factors; ``ldf``: the fit's common row width; ``configs``: side → KernelConfig.
    implicit_alpha, biased, offset : the mode, as :class:`clmf.engine.Engine`.
    pinned : stream rating chunks through page-locked host buffers (``ALLOC_HOST_PTR``,
        mapped; filled by host threads while the previous chunk's copy and kernels run); default
        on GPUs, where DMA from pinned memory is several times faster than from pageable memory.
    sources : optional side → SideLayout of the rows this device computes on for a side whose
        normal equations are reduced: every row of the side, restricted to the entries of the
        fixed side's block held here, indices rebased to that block (:func:`partial_layout`).
    """

    def __init__(self, index, device, layout, plan, dplan, f, ldf, configs, implicit_alpha=None,
                 biased=False, offset=0.0, context=None, profile=False, sources=None,
                 pinned=None):
        import pyopencl as cl

        from ..engine.device import device_info, get_context
        self.cl = cl
        self.index = index
        self.device = device
        self.info = device_info(device)
        self.ctx = context if context is not None else get_context(device)[0]
        props = cl.command_queue_properties.PROFILING_ENABLE if profile else 0
        self.q = {k: cl.CommandQueue(self.ctx, device, properties=props)
                  for k in ("compute", "stream", "out", "into")}
        self._released = False      # see __del__
        self.layout = layout
        self.sources = {s: (sources or {}).get(s, layout[s]) for s in SIDES}
        self.plan = plan
        self.dplan = dplan
        self.f = f
        self.implicit = implicit_alpha is not None
        self.alpha = float(implicit_alpha or 0.0)
        self.biased = bool(biased)
        self.offset = float(offset)
        self.fs = unknowns(f, biased)
        self.ldf = int(ldf)
        self.configs = dict(configs)
        self.storage = self.configs["users"].storage
        self.np_store = np.float16 if self.storage == "float16" else np.float32
        self.itemsize = np.dtype(self.np_store).itemsize
        self.profile = profile
        self.times = {"compute": 0.0, "exchange": 0.0}
        self.pinned = (self.info.type == "GPU") if pinned is None else bool(pinned)
        self._staging = []          # (buffer, mapped arrays) to unmap at release
        self._metric_bufs = {}      # key -> (n, buffers) of triples kept on the device
        self._fill_pool = None
        self._build()

    # ----- set-up --------------------------------------------------------------------------
    def factor_rows(self, side):
        """Rows ``(lo, hi)`` of ``side``'s factor held here: all of them when the other side's
        half-step replicates it, else this device's block."""
        if self.plan[other_side(side)].mode == "replicate" or self.plan.devices == 1:
            return 0, self.layout[side].rows
        return self.plan[side].block(self.index)

    def _build(self):
        cl = self.cl
        mf = cl.mem_flags
        fs = self.fs
        self.programs = {}
        for s in SIDES:
            try:
                self.programs[s] = K.als_program(self.ctx, self.device, self.configs[s], fs,
                                                 self.info, self.implicit, self.biased,
                                                 ldf=self.ldf)
            except InvalidConfigError as e:
                e.side = s                   # which side's configuration failed (fit falls back)
                e.device_index = self.index  # and on which device of the fit
                raise
        self.vars = {s: K.als_variables(self.configs[s], fs, self.info, self.implicit,
                                        self.biased, ldf=self.ldf) for s in SIDES}
        self.factors = {}
        self.frange = {}
        for s in SIDES:
            lo, hi = self.factor_rows(s)
            self.frange[s] = (lo, hi)
            self.factors[s] = cl.Buffer(self.ctx, mf.READ_WRITE,
                                        size=max(1, hi - lo) * self.ldf * self.itemsize)
        self.status = cl.Buffer(self.ctx, mf.READ_WRITE, size=4)
        self.buf = {}
        for s in SIDES:
            m = self.dplan.sides[s]
            bs = m.batch_rows
            b = {"A": cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * fs * bs),
                 "B": cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * bs),
                 "G": cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * fs)}
            sets = []
            for _ in range(m.buffers):
                sets.append({"indptr": cl.Buffer(self.ctx, mf.READ_ONLY,
                                                 size=8 * (m.chunk_rows + 1)),
                             "indices": cl.Buffer(self.ctx, mf.READ_ONLY, size=4 * m.chunk_nnz),
                             "data": cl.Buffer(self.ctx, mf.READ_ONLY, size=4 * m.chunk_nnz),
                             "event": None, "chunk": None})
            b["sets"] = sets
            if not m.resident and self.pinned:
                for bset in sets:
                    bset["stage"] = {
                        "indptr": self._pinned(m.chunk_rows + 1, np.int64),
                        "indices": self._pinned(m.chunk_nnz, np.int32),
                        "data": self._pinned(m.chunk_nnz, np.float32)}
                    bset["staged"] = None
            if self.implicit:
                o = other_side(s)
                lo, hi = self.frange[o]
                n_other = hi - lo
                k = int(max(1, min(64, bs, n_other)))
                gptr = np.linspace(0, n_other, k + 1).astype(np.int64)
                b.update(gram_k=k,
                         g_indptr=cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                                            hostbuf=gptr),
                         g_indices=cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                                             hostbuf=np.arange(max(1, n_other), dtype=np.int32)),
                         g_data=cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                                          hostbuf=np.ones(max(1, n_other), np.float32)))
            if self.plan[s].mode == "reduce" and self.plan.devices > 1:
                r0, r1 = self.plan[s].block(self.index)
                ip = np.asarray(self.layout[s].indptr[r0:r1 + 1], np.int64)
                b["counts"] = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                                        hostbuf=ip - ip[0])
            self.buf[s] = b
            if m.resident:
                self._upload_chunk(s, sets[0], m.chunks[0], blocking=True)
        log.debug("worker %d on %s: %s", self.index, self.info.name, self.dplan.describe())

    def _pinned(self, count, dtype):
        """A page-locked host array of ``count`` items (a mapped ALLOC_HOST_PTR buffer)."""
        return self.pinned_array((max(1, count),), dtype)

    def pinned_array(self, shape, dtype):
        """A zeroed page-locked host array in this device's context (unmapped and freed by
        :meth:`release`)."""
        cl = self.cl
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR,
                        size=max(1, nbytes))
        arr, _ev = cl.enqueue_map_buffer(self.q["stream"], buf,
                                         cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                         tuple(shape), dtype, is_blocking=True)
        arr[...] = 0
        self._staging.append((buf, arr))
        return arr

    def _fill(self, dst, src):
        """``dst[:len(src)] = src`` in host threads (NumPy releases the GIL)."""
        import concurrent.futures
        n = len(src)
        parts = max(1, min(4, n // (1 << 22)))
        if parts == 1:
            np.copyto(dst[:n], src, casting="unsafe")
            return
        if self._fill_pool is None:
            self._fill_pool = concurrent.futures.ThreadPoolExecutor(4)
        cuts = np.linspace(0, n, parts + 1).astype(np.int64)
        list(self._fill_pool.map(lambda k: np.copyto(dst[cuts[k]:cuts[k + 1]],
                                                     src[cuts[k]:cuts[k + 1]], casting="unsafe"),
                                 range(parts)))

    def _upload_chunk(self, side, bset, chunk, blocking=False, wait_for=None):
        """Copy rows ``chunk`` of ``side`` (rebased row pointers, entries) into a buffer set
        (through its pinned staging arrays when it has them)."""
        cl = self.cl
        r0, r1 = chunk
        ip, idx, val = self.sources[side].entries(r0, r1)
        q = self.q["stream"]
        stage = bset.get("stage")
        if stage is not None:
            if bset["staged"] is not None:
                bset["staged"].wait()          # the staging arrays' previous copy is done
            self._fill(stage["indptr"], ip)
            self._fill(stage["indices"], idx)
            self._fill(stage["data"], val)
            n = len(idx)
            evs = [cl.enqueue_copy(q, bset["indptr"], stage["indptr"][:len(ip)],
                                   is_blocking=False, wait_for=wait_for)]
            if n:
                evs.append(cl.enqueue_copy(q, bset["indices"], stage["indices"][:n],
                                           is_blocking=False))
                evs.append(cl.enqueue_copy(q, bset["data"], stage["data"][:n],
                                           is_blocking=False))
            bset["staged"] = evs[-1]
            bset["chunk"] = chunk
            return evs[-1]
        evs = [cl.enqueue_copy(q, bset["indptr"], ip, is_blocking=False, wait_for=wait_for)]
        if len(idx):
            evs.append(cl.enqueue_copy(q, bset["indices"], np.ascontiguousarray(idx, np.int32),
                                       is_blocking=False))
            evs.append(cl.enqueue_copy(q, bset["data"], np.ascontiguousarray(val, np.float32),
                                       is_blocking=False))
        bset["chunk"] = chunk
        if blocking:
            q.finish()
            return None
        return evs[-1]

    # ----- factors -------------------------------------------------------------------------
    def write_rows(self, side, host, r0, r1, blocking=True, queue="into"):
        """Upload rows ``[r0, r1)`` (global numbering) of the padded host array ``host`` into this
        device's buffer of ``side``'s factor (the part it holds)."""
        lo, hi = self.frange[side]
        a, b = max(r0, lo), min(r1, hi)
        if a >= b:
            return None
        return self.cl.enqueue_copy(self.q[queue], self.factors[side], host[a:b],
                                    dst_offset=(a - lo) * self.ldf * self.itemsize,
                                    is_blocking=blocking)

    def read_rows(self, side, host, r0, r1, blocking=True, wait_for=None):
        """Download rows ``[r0, r1)`` of ``side``'s factor (held here) into ``host[r0:r1]``."""
        lo, hi = self.frange[side]
        if not (lo <= r0 <= r1 <= hi):
            raise ValueError(f"rows {r0}..{r1} of {side} are not held on device {self.index}")
        if r1 == r0:
            return None
        return self.cl.enqueue_copy(self.q["out"], host[r0:r1], self.factors[side],
                                    src_offset=(r0 - lo) * self.ldf * self.itemsize,
                                    is_blocking=blocking, wait_for=wait_for)

    # ----- one half-step -------------------------------------------------------------------
    def half_step(self, side, regularization, weighted, exchange):
        """Solve this device's rows of ``side``; publish them to ``exchange.host`` batch by batch
        and upload the other devices' rows as they are published (when ``exchange.needed``)."""
        try:
            self._half_step(side, regularization, weighted, exchange)
        except BaseException as e:
            exchange.fail(e)
            raise

    def _half_step(self, side, regularization, weighted, exchange):
        cl = self.cl
        t0 = time.perf_counter()
        other = other_side(side)
        b, v, cfg = self.buf[side], self.vars[side], self.configs[side]
        kern = self.programs[side].kernels
        q = self.q["compute"]
        fs = self.fs
        lo, _hi = self.frange[side]
        if self.frange[other] != (0, self.layout[other].rows):
            raise ValueError(f"the {side} half-step reduces partial normal equations here: "
                             "use partials() and solve_reduced()")
        cl.enqueue_copy(q, self.status, np.array([_INT_MAX], np.int32))
        if self.implicit:
            launch_gram(kern, q, cfg, fs, b["gram_k"], b["g_indptr"], b["g_indices"],
                        b["g_data"], self.factors[other], b["A"], b["B"], b["G"])
        publisher = _Publisher(exchange, self.index) if exchange.needed else None
        kernel_events, stream_events, copy_events = [], [], []
        for batch in self._batches(side, stream_events):
            bset, r0, row0, n = batch.bset, batch.r0, batch.row0, batch.rows
            evs = launch_batch(
                kern, q, cfg, v, fs, bset["indptr"], bset["indices"], bset["data"],
                self.factors[other], b["A"], b["B"], b["G"], self.factors[side],
                self.status, row0, n, r0 - lo, regularization, weighted, self.implicit,
                self.alpha, self.offset, wait_for=batch.wait)
            batch.done = evs[2]
            kernel_events.extend(e for e in evs if e is not None)
            if publisher is not None:
                g0 = r0 + row0
                ev = self.read_rows(side, exchange.host, g0, g0 + n, blocking=False,
                                    wait_for=[evs[2]])
                copy_events.append(ev)
                publisher.put(ev, g0, g0 + n)
        self._finish_half_step(side, regularization, publisher, exchange, t0,
                               kernel_events, stream_events, copy_events)

    def _batches(self, side, stream_events):
        """The batches of this device's rows of ``side``, chunk by chunk, as :class:`_Batch`
        (buffer set, chunk start ``r0``, ``row0`` within the chunk, ``rows``, ``wait``: the
        upload the batch's first kernel waits for). A streamed chunk is uploaded into the buffer
        sets in turn (its events appended to ``stream_events``), only after the commands of the
        set's previous chunk ran: the caller sets ``batch.done`` to its batch's last event, so
        the copy of chunk c+1 is enqueued while chunk c's kernels run (double buffer)."""
        m = self.dplan.sides[side]
        sets = self.buf[side]["sets"]
        bs = m.batch_rows
        for c, (r0, r1) in enumerate(m.chunks):
            bset = sets[c % len(sets)]
            wait = None
            if not m.resident:
                prev = bset["event"]
                up = self._upload_chunk(side, bset, (r0, r1),
                                        wait_for=[prev] if prev else None)
                wait = [up]
                stream_events.append(up)
            last = None
            for row0 in range(0, r1 - r0, bs):
                batch = _Batch(bset, r0, row0, min(bs, r1 - r0 - row0), wait)
                yield batch
                wait = None
                last = batch.done
            bset["event"] = last

    def _finish_half_step(self, side, regularization, publisher, exchange, t0, kernel_events,
                          stream_events, copy_events):
        """Receive the other devices' rows while this device's kernels run, wait for all,
        account the times and report a singular system."""
        cl = self.cl
        q = self.q["compute"]
        st = np.empty(1, np.int32)
        st_ev = cl.enqueue_copy(q, st, self.status, is_blocking=False)
        done_at = []
        watcher = threading.Thread(
            target=lambda: (st_ev.wait(), done_at.append(time.perf_counter())), daemon=True)
        watcher.start()
        if publisher is not None:
            publisher.close()
            self._receive(side, exchange)      # uploads overlap this device's kernels
            publisher.join()
        watcher.join()
        self.q["into"].finish()
        t_end = time.perf_counter()
        t_done = done_at[0] if done_at else t_end
        self.times["compute"] += t_done - t0
        self.times["exchange"] += max(0.0, t_end - t_done)
        if self.profile:
            def busy(evs):
                return sum((e.profile.end - e.profile.start) * 1e-9 for e in evs if e is not None)
            self.times["kernels"] = self.times.get("kernels", 0.0) + busy(kernel_events)
            self.times["stream_copies"] = self.times.get("stream_copies", 0.0) + busy(stream_events)
            self.times["exchange_copies"] = (self.times.get("exchange_copies", 0.0)
                                             + busy(copy_events))
        if st[0] != _INT_MAX:
            raise SingularSystemError(
                f"the normal equations of {side[:-1]} row {int(st[0])} are not positive "
                f"definite (regularization={regularization}); increase regularization")

    # ----- the reduce mode: partial normal equations -----------------------------------------
    def partials(self, side, host_A, host_B, host_G):
        """Partial normal equations of every row of ``side`` over this device's block of the
        fixed side, into ``host_A`` (rows × f × f), ``host_B`` (rows × f) and, with implicit
        feedback, ``host_G`` (f × f, the block's Gram matrix); nothing regularised."""
        cl = self.cl
        t0 = time.perf_counter()
        other = other_side(side)
        b, v, cfg = self.buf[side], self.vars[side], self.configs[side]
        kern = self.programs[side].kernels
        q = self.q["compute"]
        fs = self.fs
        kernel_events, stream_events = [], []
        if self.implicit:
            kernel_events.append(launch_gram(kern, q, cfg, fs, b["gram_k"], b["g_indptr"],
                                             b["g_indices"], b["g_data"], self.factors[other],
                                             b["A"], b["B"], b["G"]))
            cl.enqueue_copy(q, host_G, b["G"], is_blocking=False)
        for batch in self._batches(side, stream_events):
            bset, n = batch.bset, batch.rows
            evs = launch_batch(
                kern, q, cfg, v, fs, bset["indptr"], bset["indices"], bset["data"],
                self.factors[other], b["A"], b["B"], b["G"], None, None, batch.row0, n, 0, 0.0,
                False, self.implicit, self.alpha, self.offset, wait_for=batch.wait,
                solve=False, gram=False)
            kernel_events.extend(e for e in evs if e is not None)
            g0 = batch.r0 + batch.row0
            # the scratch is reused by the next batch: copied on the same (in-order) queue
            cl.enqueue_copy(q, host_A[g0:g0 + n], b["A"], is_blocking=False)
            batch.done = cl.enqueue_copy(q, host_B[g0:g0 + n], b["B"], is_blocking=False)
        q.finish()
        self.times["compute"] += time.perf_counter() - t0
        if self.profile:
            self.times["kernels"] = self.times.get("kernels", 0.0) + sum(
                (e.profile.end - e.profile.start) * 1e-9 for e in kernel_events)

    def solve_reduced(self, side, host_A, host_B, regularization, weighted, exchange):
        """Solve this device's rows of ``side`` from the reduced systems in ``host_A``/``host_B``
        (regularised, Gram added) and exchange them as :meth:`half_step` does."""
        try:
            self._solve_reduced(side, host_A, host_B, regularization, weighted, exchange)
        except BaseException as e:
            exchange.fail(e)
            raise

    def _solve_reduced(self, side, host_A, host_B, regularization, weighted, exchange):
        cl = self.cl
        t0 = time.perf_counter()
        b, cfg = self.buf[side], self.configs[side]
        kern = self.programs[side].kernels
        q = self.q["compute"]
        fs = self.fs
        lo, _hi = self.frange[side]
        r0, r1 = self.plan[side].block(self.index)
        bs = self.dplan.sides[side].batch_rows
        cl.enqueue_copy(q, self.status, np.array([_INT_MAX], np.int32))
        publisher = _Publisher(exchange, self.index) if exchange.needed else None
        kernel_events, copy_events = [], []
        for row0 in range(0, r1 - r0, bs):
            n = min(bs, r1 - r0 - row0)
            g0 = r0 + row0
            cl.enqueue_copy(q, b["A"], host_A[g0:g0 + n], is_blocking=False)
            cl.enqueue_copy(q, b["B"], host_B[g0:g0 + n], is_blocking=False)
            e3 = launch_solve(kern, q, cfg, fs, b["counts"], b["A"], b["B"], self.factors[side],
                              self.status, row0, n, r0 - lo, regularization, weighted)
            kernel_events.append(e3)
            if publisher is not None:
                ev = self.read_rows(side, exchange.host, g0, g0 + n, blocking=False,
                                    wait_for=[e3])
                copy_events.append(ev)
                publisher.put(ev, g0, g0 + n)
        self._finish_half_step(side, regularization, publisher, exchange, t0, kernel_events, [],
                               copy_events)

    def _receive(self, side, exchange):
        """Upload the other devices' rows of ``side`` as they are published."""
        seen = 0
        while True:
            new, seen, done = exchange.take(self.index, seen)
            for _dev, r0, r1 in new:
                self.write_rows(side, exchange.host, r0, r1, blocking=False)
            if done:
                return

    # ----- metrics -------------------------------------------------------------------------
    def squared_error(self, users, items, ratings, offset, key=None, chunk=1 << 22):
        """Sum of squared errors on triples (global row numbers; rows must be held here).
        With a ``key`` the triples stay on the device for the next call when they fit in what
        the memory plan left free; otherwise they pass through a bounded buffer."""
        cl = self.cl
        q = self.q["compute"]
        n = len(ratings)
        if n == 0:
            return 0.0
        ulo, ilo = self.frange["users"][0], self.frange["items"][0]

        def triples(a, z):
            return (np.ascontiguousarray(np.asarray(users[a:a + z]) - ulo, np.int32),
                    np.ascontiguousarray(np.asarray(items[a:a + z]) - ilo, np.int32),
                    np.ascontiguousarray(ratings[a:a + z], np.float32))

        free = self.dplan.budget - self.dplan.total - sum(
            12 * c[0] for c in self._metric_bufs.values())
        if key is not None and 12 * n + 4 * (n // 128 + 1) <= free // 2:
            bufs = self._metric_buffers(n)
            for buf, host in zip(bufs, triples(0, n)):
                cl.enqueue_copy(q, buf, host)
            old = self._metric_bufs.pop(key, None)
            if old is not None:
                for x in old[1]:
                    x.release()
            self._metric_bufs[key] = (n, bufs)
            return self._sq_error(bufs, n, offset)
        size = min(chunk, n)
        bufs = self._metric_buffers(size)
        total = 0.0
        try:
            for a in range(0, n, size):
                z = min(size, n - a)
                for buf, host in zip(bufs, triples(a, z)):
                    cl.enqueue_copy(q, buf, host)
                total += self._sq_error(bufs, z, offset)
        finally:
            for x in bufs:
                x.release()
        return total

    def cached_squared_error(self, key, n, offset):
        """The sum of squared errors on the ``n`` triples kept under ``key``, or None."""
        hit = self._metric_bufs.get(key)
        if hit is None or hit[0] != n:
            return None
        return self._sq_error(hit[1], n, offset)

    def _sq_error(self, bufs, n, offset):
        """Run the metrics kernel on ``n`` triples in ``bufs``; the sum (float64 on the host)."""
        prog = K.metrics_program(self.ctx, self.fs, self.storage, self.ldf, biased=self.biased)
        q = self.q["compute"]
        g = max(1, -(-n // 128))
        prog.kernels["sq_error"](q, (g * 128,), (128,), *bufs[:3], self.factors["users"],
                                 self.factors["items"], np.int64(n),
                                 np.float32(offset + self.offset), bufs[3])
        part = np.empty(g, np.float32)
        self.cl.enqueue_copy(q, part, bufs[3])
        return float(part.astype(np.float64).sum())

    def _metric_buffers(self, n):
        """Device buffers for ``n`` triples and their partial sums."""
        mf = self.cl.mem_flags
        return [self.cl.Buffer(self.ctx, mf.READ_ONLY, size=4 * n) for _ in range(3)] + [
            self.cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * (n // 128 + 1))]

    def finish(self):
        """Wait for every queue of this device."""
        for q in self.q.values():
            q.finish()

    def _drain(self):
        """Wait for every queue (Ctrl-C held back); a failed wait is only logged."""
        try:
            drain(*getattr(self, "q", {}).values())
        except Exception as e:  # noqa: BLE001 - freeing must go on after a failed command
            log.warning("waiting for device %s before freeing its buffers failed: %s",
                        getattr(self, "index", "?"), e)

    def __del__(self):
        """A worker dropped unreleased (an error or Ctrl-C in its set-up or before
        :meth:`release`) waits for its queues before its buffers are freed with it."""
        if not getattr(self, "_released", True):
            try:
                self._drain()
            except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing to wait for
                pass

    def release(self):
        """Free the device buffers, once every command queued on them has ended (Ctrl-C held
        back meanwhile); again, nothing."""
        if getattr(self, "_released", True):
            return
        with deferred_interrupts():
            self._drain()
            self._free()
            self._released = True

    def _free(self):
        """Release every buffer (the queues are drained; the fill threads end first, they
        write into the mapped staging arrays)."""
        if self._fill_pool is not None:
            self._fill_pool.shutdown()
            self._fill_pool = None
        for _n, bufs in self._metric_bufs.values():
            for x in bufs:
                x.release()
        self._metric_bufs = {}
        for buf, arr in self._staging:
            mapping = getattr(arr, "base", None)
            if hasattr(mapping, "release"):
                mapping.release(self.q["stream"])     # unmap before freeing
            buf.release()
        self._staging = []
        for s in list(self.buf):
            b = self.buf[s]
            for key, val in list(b.items()):
                if isinstance(val, self.cl.MemoryObjectHolder):
                    val.release()
            for bset in b["sets"]:
                for key in ("indptr", "indices", "data"):
                    bset[key].release()
        for buf in self.factors.values():
            buf.release()
        self.status.release()
        self.buf = {}
        self.factors = {}


@dataclasses.dataclass
class _Batch:
    """One batch of :meth:`DeviceWorker._batches`; the caller sets ``done``."""

    bset: dict
    r0: int
    row0: int
    rows: int
    wait: list | None
    done: object = None


class _Publisher:
    """A thread that waits for a worker's device → host copies in order and publishes each."""

    def __init__(self, exchange, index):
        self.exchange = exchange
        self.index = index
        self.items = _queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def put(self, event, r0, r1):
        """Publish rows ``[r0, r1)`` once ``event`` completes."""
        self.items.put((event, r0, r1))

    def close(self):
        """No more chunks."""
        self.items.put(None)

    def join(self):
        """Wait until every chunk was published."""
        self.thread.join()

    def _run(self):
        try:
            while True:
                item = self.items.get()
                if item is None:
                    self.exchange.finish(self.index)
                    return
                event, r0, r1 = item
                if event is not None:
                    event.wait()
                self.exchange.publish(self.index, r0, r1)
        except BaseException as e:        # the waiting workers must not hang
            self.exchange.fail(e)
