"""The reduce mode of an engine (a multi-device fit whose fixed factor is partitioned): the
partial normal equations of every row of a side over the device's block of the fixed side, and the
solve of the device's own rows once they are summed over the devices.

Two forms. :func:`pipelined` (the in-process fit, :class:`clmf.parallel.MultiEngine`): the
systems cross the bus packed (:func:`clmf.engine.memory.packed_width`: the hermitian's lower
triangle and the right side, about half of f² + f floats), every device computes them in the same
row order, and each *segment* of rows (a piece of one device's block) is summed as its copies
land, then unpacked on the device that solves it with the regularisation and the Gram matrix
added, and solved, while the others still compute; only the last segment's sum is exposed. The
sums are made on the owner device (its own partials stay in its ring, each peer's copy is
uploaded into a ring of its own as it lands, and the unpack sums them) or by host threads (the
summed segment uploaded): :class:`clmf.parallel.reducer.Reducer`'s ``sums``. The Dask backend
runs the same pipeline in two phases, the packed systems summed between its tasks
(:func:`pipelined`'s ``partials``).
"""
from __future__ import annotations

import collections
import threading
import time

import numpy as np

from . import kernels as K
from .blocks import Publisher, other_side
from .launch import launch_batch, launch_gram, launch_solve, launch_split_batch
from .memory import packed_width

__all__ = ["pipelined", "buffers"]


def buffers(eng, side):
    """The pipelined reduce's device buffers of ``side`` where its memory plan has them (else
    none): two batch buffers of packed systems taken in turn (``P``, ``P2``: a batch's
    systems packed for the copy to the host), a ring of ``ring`` rows of summed packed
    systems of the device's own rows (``S``) and, with device sums, one such ring for each of
    its ``peers`` (``T``: the other devices' copies of its rows, in index order, uploaded as
    they land, summed with ``S`` by the unpack)."""
    size = eng.dplan.bytes.get(f"packed_{side}")
    if size is None:
        return {}
    cl, mf = eng.cl, eng.cl.mem_flags
    row = 4 * packed_width(eng.fs)
    sums = eng.dplan.bytes[f"sums_{side}"]
    out = {"P": cl.Buffer(eng.ctx, mf.READ_WRITE, size=size // 2),
           "P2": cl.Buffer(eng.ctx, mf.READ_WRITE, size=size // 2),
           "S": cl.Buffer(eng.ctx, mf.READ_WRITE, size=sums), "ring": sums // row}
    staging = eng.dplan.bytes.get(f"staging_{side}")
    if staging is not None:
        out.update(T=cl.Buffer(eng.ctx, mf.READ_WRITE, size=staging), peers=staging // sums)
    return out


def pipelined(eng, side, port, regularization, weighted, exchange, partials=True):
    """The reduce mode's half-step of ``side`` on ``eng`` in a pipeline with the other devices
    through ``port`` (the host's side, :class:`clmf.parallel.reducer.Reducer`'s port: ``host``
    (rows × packed width, this device's partial systems), ``gram`` (f × f), ``segments``
    (``[(a, b, owner)]`` in row order), ``landed(k)`` (``None``: the Gram),
    ``take(block)``, ``gram_total()``, ``fail(e)``, ``device_sums``; with device sums also
    ``d`` (this device), ``hosts`` (every device's ``host``) and ``summed(at, seconds)``).
    Solved rows are exchanged as
    :meth:`Engine.half_step` does. In two phases (the Dask backend's tasks per half-step, the
    sums made between them): a port whose ``take`` hands over nothing computes the partial
    systems only; ``partials=False`` then solves the summed ones a port hands over."""
    try:
        _Pipeline(eng, side, port, regularization, weighted, exchange).run(partials)
    except BaseException as e:
        port.fail(e)
        exchange.fail(e)
        raise


class _Pipeline:
    """One device's pipelined reduce half-step (:func:`pipelined`).

    Partials: batch k's S1 and S2 into the scratch pair, packed into ``P``/``P2`` in turn (the
    pack of batch k + 2 waits for the copies of batch k), copied to ``port.host`` cut at the
    segments' ends (``out`` queue); each segment is reported landed once its last copy ended.
    With device sums the rows of a segment this device owns that fit the ring's first pass
    are copied from ``P`` into the ring ``S`` instead (compute queue) and reported at once.
    Solves: the device's rows, summed, are unpacked (the regularisation and the Gram matrix
    added) and solved on the compute queue after the partials (in order on the queue), in
    launches of up to a batch: enqueued once a batch of them is summed, and each time a
    segment is summed once this device's partials have all landed. Host sums: the summed
    segments, handed over in order by ``port.take``, are uploaded into the ring (``stream``
    queue) as they come. Device sums: ``port.take`` hands over the copies of this device's
    segments as they land, and each is uploaded (``stream`` queue: copies only, never held
    behind kernels) into the ring of its device in ``T`` (an own copy of a segment past the
    ring's first pass into ``S``); a segment is summed once every device's copy of it is on
    the device, by the unpack (own, then the peers in index order: the host sums' order). A
    copy whose ring slots still hold rows not unpacked waits (``pending``) until they are.
    Own rows ``[un, up)`` (relative to the block) are summed and not yet unpacked."""

    def __init__(self, eng, side, port, regularization, weighted, exchange):
        self.eng, self.side, self.port = eng, side, port
        self.lam, self.weighted, self.exchange = regularization, weighted, exchange
        self.cl = eng.cl
        self.b = eng.buf[side]
        self.kern = eng.programs[side].kernels
        self.rk = K.reduce_program(eng.ctx, eng.info).kernels
        self.w = packed_width(eng.fs)
        self.r0, self.r1 = eng.share.blocks[side]
        self.ring = self.b["ring"]
        self.un = self.up = 0
        self.last_upload = self.last_unpack = self.gram_up = None
        self.landing = collections.deque()       # (segment or None, its last copy's event)
        self.gram_pending = False                # this device's Gram not reported landed
        self.events, self.stream_events, self.copy_events = [], [], []
        self.bus, self.packs = [], []            # the reduce's copies; pack/unpack kernels
        self.publisher = None
        self.device_sums = bool(port.device_sums)
        self.npeers = 0
        if self.device_sums:
            self.me, n = port.d, len(port.hosts)
            if self.b.get("peers") != n - 1:
                raise RuntimeError(f"the {side}' memory plan has no ring for the {n - 1} "
                                   "peers' copies (plan_fit(..., device_sums=True))")
            self.npeers = n - 1
            self.segs = [(a, e) for a, e, o in port.segments if o == self.me]
            self.left = {a: n for a, _e in self.segs}   # copies of a segment not yet uploaded
            self.next = 0                        # own segments summed so far
            self.own = {}                        # own segment's first row -> its ring copy
            self.pending = []                    # copies waiting for their ring slots
            self.last_stream = None              # the last upload enqueued

    def run(self, partials=True):
        """Partials (unless not ``partials``), landings, uploads, sums and solves of the
        half-step; then wait for all."""
        eng = self.eng
        t0 = time.perf_counter()
        if self.exchange.needed:
            self.publisher = Publisher(self.exchange, eng.index)
        if partials:
            self._partials()
        self._land(block=True)
        self._flush()
        while (got := self.port.take(block=True)) is not None:
            self._receive(got)
            self._flush()
        if self.device_sums and (self.pending or self.un < self.r1 - self.r0):
            raise RuntimeError(f"the {self.side}' reduce ended with rows not summed")
        watcher = self._watch() if self.device_sums else None
        try:
            eng._finish_half_step(self.side, self.lam, self.publisher, self.exchange, t0,
                                  self.events, self.stream_events, self.copy_events)
        finally:
            if watcher is not None:
                watcher.join()
        if eng.profile:
            self._account()

    def _direct(self, k):
        """Whether segment ``k``'s rows stay on this device (device sums, own, inside the
        ring's first pass: its slots are free until they are unpacked)."""
        a, b, o = self.port.segments[k]
        return self.device_sums and o == self.me and b - self.r0 <= self.ring

    def _partials(self):
        """Enqueue the Gram (implicit) and every batch's partial systems, packed and copied to
        the host (or, own rows with device sums, into the ring); report the landed segments
        as the copies end."""
        eng, cl, b, port = self.eng, self.cl, self.b, self.port
        q, out, fs = eng.queue, eng.q["out"], eng.fs
        cfg, v = eng.configs[self.side], eng.vars[self.side]
        Y = eng.factors[other_side(self.side)]
        if eng.implicit:
            e = launch_gram(self.kern, q, cfg, fs, b["gram"], Y, b["A"], b["B"],
                            b["G"])
            self.events.append((e, None, None, None))
            ev = eng.keep(cl.enqueue_copy(out, port.gram, b["G"], is_blocking=False,
                                          wait_for=[e]))
            self.bus.append(ev)
            self.landing.append((None, ev))
            self.gram_pending = True
        segs, k, row = port.segments, 0, 4 * self.w
        readers = [None, None]                   # the copies reading P / P2 last
        for j, batch in enumerate(eng._batches(self.side, self.stream_events)):
            n, g0 = batch.rows, batch.r0 + batch.row0
            P = b["P2"] if j % 2 else b["P"]
            if batch.nv:        # long rows cut into pieces, summed by the combine
                e1, e2, ec, _ = launch_split_batch(
                    self.kern, q, cfg, v, fs, batch.bset["indptr"], b["vindptr"], b["vstart"],
                    batch.bset["indices"], batch.bset["data"], Y, b["A"], b["B"], b["Av"],
                    b["Bp"], b["G"], None, None, batch.row0, n, batch.v0, batch.nv, 0, 0.0,
                    False, False, eng.alpha, eng.offset, wait_for=batch.wait, solve=False)
            else:
                (e1, e2, _), ec = launch_batch(
                    self.kern, q, cfg, v, fs, batch.bset["indptr"], batch.bset["indices"],
                    batch.bset["data"], Y, b["A"], b["B"], b["G"], None, None, batch.row0, n,
                    0, 0.0, False, eng.implicit, eng.alpha, eng.offset, wait_for=batch.wait,
                    solve=False, gram=False), None
            batch.done = ec or e2 or e1
            self.events.append((e1, e2, None, ec))
            ep = self.rk["pack_systems"](q, *K.reduce_launch(eng.info, n), b["A"], b["B"], P,
                                         np.int32(n), np.int32(fs), wait_for=readers[j % 2])
            self.packs.append(ep)
            g, reads = g0, []
            while g < g0 + n:
                while segs[k][1] <= g:
                    k += 1
                c = min(g0 + n, segs[k][1])
                if self._direct(k):              # into the ring's slots (first pass)
                    ev = eng.keep(cl.enqueue_copy(q, b["S"], P, src_offset=(g - g0) * row,
                                                  dst_offset=(g - self.r0) * row,
                                                  byte_count=(c - g) * row, wait_for=[ep]))
                    if c == segs[k][1]:
                        self.own[segs[k][0]] = ev
                        port.landed(k)
                else:
                    ev = eng.keep(cl.enqueue_copy(out, port.host[g:c], P,
                                                  src_offset=(g - g0) * row,
                                                  is_blocking=False, wait_for=[ep]))
                    if c == segs[k][1]:
                        self.landing.append((k, ev))
                self.bus.append(ev)
                reads.append(ev)
                g = c
            readers[j % 2] = reads
            q.flush()
            out.flush()
            self._land(block=False)

    def _land(self, block):
        """Report the segments whose copies have ended (all of them with ``block``), then
        take in what is ready of this device's rows (summed segments, or copies to add)."""
        done = self.cl.command_execution_status.COMPLETE
        while self.landing and (block or
                                self.landing[0][1].command_execution_status == done):
            k, ev = self.landing.popleft()
            ev.wait()
            self.port.landed(k)
            self.gram_pending = self.gram_pending and k is not None
            if block:
                self._receive(self.port.take(block=False) or [])
        if self.gram_pending:
            return       # a flush waits for the summed Gram: not before this device's landed
        self._receive(self.port.take(block=False) or [])
        if self.up - self.un >= self.eng.batch_rows[self.side]:
            self._flush()

    def _receive(self, got):
        """What ``port.take`` handed over: summed segments to upload, or (device sums) copies
        to upload."""
        if self.device_sums:
            self._stage(got)
        else:
            self._upload(got)

    def _upload(self, segments):
        """Upload summed segments ``[(a, b)]`` (global rows, in order) into the ring."""
        for a, e in segments:
            self.last_upload = self._to_ring(self.b["S"], 0, self.port.host, a - self.r0,
                                             e - self.r0)
            self.up = e - self.r0
        if segments:
            self.eng.q["stream"].flush()

    def _to_ring(self, buf, base, host, x, end):
        """Upload the block's rows ``[x, end)`` of ``host`` (indexed by global row) into their
        slots of the ring starting at row ``base`` of ``buf``, once the rows there before are
        unpacked; the last copy's event."""
        eng, cl, ring = self.eng, self.cl, self.ring
        if end - self.un > ring:
            self._flush()                       # the ring's rows to overwrite are unpacked
        wait = [self.last_unpack] if end > ring and self.last_unpack is not None else None
        ev = None
        while x < end:
            pos = x % ring
            m = min(end - x, ring - pos)
            ev = eng.keep(cl.enqueue_copy(
                eng.q["stream"], buf, host[self.r0 + x:self.r0 + x + m],
                dst_offset=(base + pos) * 4 * self.w, is_blocking=False, wait_for=wait))
            self.bus.append(ev)
            x += m
        return ev

    def _stage(self, copies):
        """Device sums: upload copies ``[(a, b, e)]`` (segment rows, global; device ``e``'s
        copy) as they come, each once its ring slots are free (their rows unpacked, or to be
        unpacked now: the rows ``ring`` before summed)."""
        self.pending.extend(copies)
        while self.pending:
            rest = []
            for a, e_, src in self.pending:
                if e_ - self.r0 - self.ring > self.up:
                    rest.append((a, e_, src))
                else:
                    self._place(a, e_, src)
            if len(rest) == len(self.pending):
                break
            self.pending = rest
        if copies:
            self.eng.q["stream"].flush()

    def _place(self, a, e_, src):
        """Device sums: device ``src``'s copy of segment ``[a, e_)`` into its ring (none to
        upload for an own copy already there); the summed segments' rows ready to unpack."""
        x, end = a - self.r0, e_ - self.r0
        if src != self.me:
            self.last_stream = self._to_ring(self.b["T"], (src - (src > self.me)) * self.ring,
                                             self.port.hosts[src], x, end)
        elif end <= self.ring:
            self.own.pop(a)                     # copied on the compute queue, before unpacks
        else:
            self.last_stream = self._to_ring(self.b["S"], 0, self.port.host, x, end)
        self.left[a] -= 1
        while self.next < len(self.segs) and self.left[self.segs[self.next][0]] == 0:
            self.up = self.segs[self.next][1] - self.r0
            self.last_upload = self.last_stream     # the stream queue is in order
            self.next += 1

    def _watch(self):
        """Device sums: a thread reporting to the port when this device's last segment's
        copies are all on the device (the last upload ended: its sum is the unpack's, which
        both sum modes run); None without segments."""
        last, port = self.last_upload, self.port
        if last is None:
            return None

        def watch():
            try:
                last.wait()
            except Exception:  # noqa: BLE001 - the half-step's own wait reports the failure
                return
            port.summed(time.perf_counter())
        t = threading.Thread(target=watch, daemon=True, name="clmf-reduce-watch")
        t.start()
        return t

    def _flush(self):
        """Unpack and solve the summed rows (launches of up to a batch, none across the
        ring's end) and publish them."""
        if self.un >= self.up:
            return
        eng, b, cl = self.eng, self.b, self.cl
        q, fs, ring = eng.queue, eng.fs, self.ring
        if eng.implicit and self.gram_up is None:
            self.gram_up = eng.keep(cl.enqueue_copy(eng.q["stream"], b["G"],
                                                    self.port.gram_total(), is_blocking=False))
            self.bus.append(self.gram_up)
        lo = eng.frange[self.side][0]
        wait = [e for e in (self.last_upload, self.gram_up) if e is not None]
        while self.un < self.up:
            pos = self.un % ring
            n = min(eng.batch_rows[self.side], self.up - self.un, ring - pos)
            eu = self.rk["unpack_systems"](
                q, *K.reduce_launch(eng.info, n), b["S"], np.int64(pos), np.int32(n),
                b.get("T", b["S"]), np.int32(self.npeers), np.int64(ring * self.w), b["counts"],
                np.int32(self.un), np.float32(self.lam), np.int32(1 if self.weighted else 0),
                b["G"], np.int32(1 if eng.implicit else 0), b["A"], b["B"], np.int32(fs),
                wait_for=wait or None)
            self.packs.append(eu)
            self.last_unpack = eu
            e3 = launch_solve(self.kern, q, eng.configs[self.side], fs, b["counts"], b["A"],
                              b["B"], eng.factors[self.side], eng.status, self.un, n,
                              self.r0 - lo, self.lam, self.weighted)
            self.events.append((None, None, e3, None))
            if self.publisher is not None:
                g = self.r0 + self.un
                ev = eng.read_rows(self.side, self.exchange.host, g, g + n, blocking=False,
                                   wait_for=[e3])
                self.copy_events.append(ev)
                self.publisher.put(ev, g, g + n)
            self.un += n
        q.flush()

    def _account(self):
        """Add the device seconds of the reduce's copies and of the pack / unpack kernels."""
        eng = self.eng

        def busy(evs):
            return sum((e.profile.end - e.profile.start) * 1e-9 for e in evs)
        t = busy(self.packs)
        eng.stage_times["pack"] = eng.stage_times.get("pack", 0.0) + t
        eng.times["kernels"] = eng.times.get("kernels", 0.0) + t
        eng.times["reduce_copies"] = eng.times.get("reduce_copies", 0.0) + busy(self.bus)
