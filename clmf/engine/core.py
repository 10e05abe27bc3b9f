"""The one device engine: a device's buffers and the S1 → S2 → S3 orchestration over batches
of rows, for a one-device fit and for each device of a multi-device one.

An :class:`Engine` owns, for one fit on one device, the CSR of the rows it solves of both sides
(the users' CSR and the items' CSR, i.e. the CSC of the ratings) — resident, or streamed from
host memory in double-buffered chunks when the memory plan says so —, the factor rows it holds,
and per-side scratch for a batch of hermitians (O(batch · f²), never O(m · f²)). Factors stay on
the device across iterations. A one-device fit is the case where the device's share
(:class:`clmf.engine.blocks.Share`) is every row: nothing is exchanged, the ratings are read in
place (CPU runtimes) or uploaded through pinned staging buffers, the items' CSR is transposed
on the device. Several devices (:class:`clmf.parallel.MultiEngine`, the Dask backend) each run
an engine on their share, with an exchange object moving the solved rows (or partial normal
equations) between them.

Long rows (a Netflix item has up to 233K ratings, 5.7K on average) of a resident side are cut
into pieces summed by separate S1 work-groups, so that no work-group runs alone at the end of a
launch: see :func:`split_rows` and :func:`launch_split_batch`; the threshold is the
configuration's ``split`` (:func:`clmf.engine.memory.plan_split`).
"""
from __future__ import annotations

import logging
import time

import numpy as np
import scipy.sparse as sp

from ..data.scan import count_columns
from ..errors import SingularSystemError
from ..interrupts import deferred_interrupts, drain
from ..tuning.spec import row_width, unknowns
from . import blocks as BL
from . import device_metrics as DM
from . import kernels as K
from . import programs as P
from . import reduce as RD
from . import rotate as RT
from . import upload as U
from .blocks import SIDES, Batch, Publisher, Share, SideData, fill, head_split, other_side
from .device import device_info, get_context, thread_safe
from .factors import half_rows, host_factor_rows, padded_base, padded_factors, unpadded_factors
from .launch import (
    gram_buffers,
    launch_batch,
    launch_gram,
    launch_solve,
    launch_split_batch,
    split_rows,
    timed_gram,
)
from .memory import SplitPlan, choose_batch_rows, launch_rows, plan_device, plan_fit, plan_split
from .transpose import device_transpose

log = logging.getLogger(__name__)

__all__ = ["Engine", "SideData", "Share", "padded_factors", "host_factor_rows",
           "unpadded_factors", "choose_batch_rows", "plan_fit", "split_rows",
           "launch_batch", "launch_gram", "launch_solve", "launch_split_batch"]

_INT_MAX = np.iinfo(np.int32).max


# CPU devices with at most this many ratings transpose on the host (scipy's counting sort): there
# the device transpose runs on the same cores, and the first fit after an install also compiles
# its program (2-core development machine, shared: 1M ratings 5–8 ms on the host against 8 ms
# for the device transpose warm and 0.2–1.0 s with its compile; at 4M a wash warm, 35–50 ms;
# at 10M the host 95–105 ms against 140–155: results/bench/transpose-cpu/)
HOST_TRANSPOSE_MAX_NNZ = 1 << 22
# CPU runtimes: the factor buffers wrap adopted start factors in place (Engine.set_factors);
# False copies them into the engine's own buffers as before (for comparisons)
ADOPT_FACTORS = True


def host_transpose(info, nnz):
    """Whether the items' CSR is built on the host: the Oclgrind simulator (it flags the device
    transpose's output as uninitialised) and CPU devices up to ``HOST_TRANSPOSE_MAX_NNZ``."""
    if "oclgrind" in info.platform.lower():
        return True
    return info.type == "CPU" and nnz <= HOST_TRANSPOSE_MAX_NNZ


class Engine:
    """All device state of one fit on one device and the half-step orchestration.

    Parameters
    ----------
    device : pyopencl.Device
    R : scipy.sparse.csr_matrix (users × items), canonical (sorted, no duplicates), or any object
        with ``shape``, ``users`` and ``items`` :class:`SideData` (a
        :class:`clmf.parallel.Layout`)
    f : factors
    configs : (users_config, items_config) KernelConfig pair
    item_counts : optional ratings per item (``np.bincount(R.indices)``, when already known)
    share : this device's :class:`~clmf.engine.blocks.Share` of a multi-device fit (None: every
        row, planned here with ``max_device_memory`` and ``force_stream``)
    context : a context holding ``device`` (default clmf's memoized one)
    pinned : stream rating chunks through page-locked host buffers filled by host threads
        (default on GPUs, where DMA from pinned memory is several times faster)
    """

    def __init__(self, device, R, f, configs, profile=False, implicit_alpha=None, biased=False,
                 offset=0.0, item_counts=None, *, share=None, context=None, pinned=None,
                 max_device_memory=None, force_stream=()):
        import pyopencl as cl
        self.cl = cl
        self.device = device
        self.info = device_info(device)
        self._released = False                       # see __del__
        self.rotation = None         # an implicit fit's basis (clmf.engine.rotate.Rotation)
        if context is None and share is None:
            self.ctx, self.queue = get_context(device)
        else:
            self.ctx = context if context is not None else get_context(device)[0]
            self.queue = cl.CommandQueue(
                self.ctx, device, properties=cl.command_queue_properties.PROFILING_ENABLE)
        # in-order queues: compute (S1 → S2 → S3), stream (rating chunks host → device), out
        # (solved rows device → host) and into (other devices' rows host → device)
        self.q = {"compute": self.queue}
        for k in ("stream", "out", "into"):
            self.q[k] = cl.CommandQueue(self.ctx, device,
                                        properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.f = int(f)                              # latent factors
        self.implicit = implicit_alpha is not None
        self.alpha = float(implicit_alpha or 0.0)
        self.biased = bool(biased)
        if self.implicit and self.biased:
            raise ValueError("biases are for explicit feedback")
        self.offset = float(offset)                  # global mean with biases
        self.fs = unknowns(self.f, self.biased)      # unknowns per system
        self.configs = {"users": configs[0], "items": configs[1]}
        width = row_width(self.f, self.biased)       # [factors | 1 | bias] with biases
        if configs[0].storage != configs[1].storage or (
                share is None and configs[0].ldf(width) != configs[1].ldf(width)):
            # the two sides share factor buffers: same storage and leading dimension
            raise ValueError("both sides must use the same storage dtype and vector padding")
        self.ldf = configs[0].ldf(width) if share is None else int(share.ldf)
        self.storage = configs[0].storage
        self.np_store = np.float16 if self.storage == "float16" else np.float32
        self.itemsize = np.dtype(self.np_store).itemsize
        self.profile = profile
        self.pinned = U.pins_host(self.info) if pinned is None else bool(pinned)
        self.times = {"compute": 0.0, "exchange": 0.0}
        self.stage_times = {"s1": 0.0, "s2": 0.0, "s3": 0.0, "combine": 0.0}
        self._staging = []          # (buffer, mapped arrays) to unmap at release
        self._pending = []          # events of non-blocking copies still held (see keep)
        self._metric_bufs = {}      # key -> (n, buffers) of triples kept on the device
        self._fill_pool = [None]
        self._factor_hosts = {}     # host arrays the factor buffers wrap
        self._half_stage = {}       # queue -> staging buffer of a float16 exchange
        self._hold = [np.zeros(1, np.int32), np.zeros(1, np.float32)]
        self._ok, self._st = np.array([_INT_MAX], np.int32), None
        self.buf = {s: {} for s in SIDES}
        self.factors = {}
        self.entry_offset = {s: 0 for s in SIDES}    # see _upload_side
        t_host = time.perf_counter()
        if share is None:
            share = self._whole(R, item_counts, max_device_memory, force_stream)
        else:
            self.shape = tuple(R.shape)
            self.side = dict(share.sources)
        self.index, self.share, self.dplan = share.index, share, share.plan
        self.frange = dict(share.frange)
        self.memory = {**{k: int(v) for k, v in self.dplan.bytes.items()},
                       "total": self.dplan.total}
        if self.dplan.streamed:
            self.memory["streamed"] = [self.dplan.streamed]
        self.batch_rows = {s: self.dplan.sides[s].batch_rows for s in SIDES}
        self.splits = {s: self.dplan.sides[s].split or SplitPlan(0, self.batch_rows[s])
                       for s in SIDES}
        t0 = time.perf_counter()
        # the programs are built (or loaded from the cache) in threads while the ratings are
        # uploaded and transposed (the OpenCL compilers release the GIL)
        self._on_device = self._transposes_on_device()
        builds = P.Builds(self, layout=self._on_device)
        try:
            times = self._upload_ratings()
            t1 = time.perf_counter()
            self.programs, build_s = builds.result()
        except BaseException:
            with deferred_interrupts():      # Ctrl-C here too: the copies and the transpose end
                builds.abandon()
                self._release_buffers()
            raise
        t2 = time.perf_counter()
        self.vars = {s: K.als_variables(self.configs[s], self.fs, self.info, self.implicit,
                                        self.biased, ldf=self.ldf) for s in SIDES}
        # seconds of the set-up: the host's CSR arrays and column pointers, building (or
        # loading) the programs (in a thread; ``build_wait``: what the set-up waited for them
        # after the uploads), uploading the ratings and transposing the users' on the device
        self.setup_times = {"engine_host": t0 - t_host, "build": build_s,
                            "build_wait": t2 - t1, **times,
                            "upload_transpose": times["upload"] + times["transpose"]}
        t3 = time.perf_counter()
        self._allocate()
        self.setup_times["buffers"] = time.perf_counter() - t3
        log.debug("engine %d on %s: %s", self.index, self.info.name, self.dplan.describe())

    # ----- set-up --------------------------------------------------------------------------
    def _whole(self, R, item_counts, max_device_memory, force_stream):
        """The share of a one-device fit (every row of both sides), planned here."""
        info, fs = self.info, self.fs
        if hasattr(R, "users") and hasattr(R, "items"):
            self.side = {"users": R.users, "items": R.items}
            counts = {s: self.side[s].counts() for s in SIDES}
        else:
            m, n = R.shape
            if item_counts is None:
                item_counts = count_columns(R.indices, n)
            col_ptr = np.zeros(n + 1, np.int64)
            np.cumsum(item_counts, out=col_ptr[1:])
            # the items' CSR (the ratings' CSC) is built on the device from the users' (or on
            # the host where that pays: host_transpose)
            self.side = {"users": SideData.from_csr(R), "items": SideData(col_ptr, None, None)}
            counts = {"users": np.diff(self.side["users"].indptr), "items": item_counts}
        self.shape = tuple(R.shape)
        rows = {s: self.side[s].rows for s in SIDES}
        nnz = self.side["users"].nnz
        # long rows cut into pieces (per side: threshold, rows per launch, pieces' scratch)
        splits = {s: plan_split(self.configs[s], fs, rows[s], nnz,
                                int(counts[s].max()) if rows[s] else 0, info) for s in SIDES}
        # every device buffer planned from the shapes, and checked, before any is created (and
        # before the users' CSR is prepared on the host and transposed on the device)
        plan = plan_device(info.name, info.global_mem, info.max_alloc, f=fs, ldf=self.ldf,
                           itemsize=self.itemsize,
                           blocks={s: (self.side[s].indptr, 0, rows[s]) for s in SIDES},
                           factor_rows=rows, batch_rows={s: splits[s].batch_rows for s in SIDES},
                           implicit=self.implicit, splits=splits, skew=U.host_align(info),
                           max_device_memory=max_device_memory, force_stream=force_stream)
        whole = {s: (0, rows[s]) for s in SIDES}
        return Share(0, whole, dict(whole), plan, self.ldf, self.side)

    def _transposes_on_device(self):
        """Whether the items' CSR of a one-device fit is transposed on the device (both sides
        resident, not on the host: :func:`host_transpose`)."""
        res = [self.dplan.sides[s].resident for s in SIDES]
        return (self.side["items"].indices is None and all(res)
                and not host_transpose(self.info, self.side["users"].nnz))

    def _upload_ratings(self):
        """The resident sides' CSR to the device once (a CPU device reads the host arrays in
        place, a GPU gets them through pinned staging buffers), the items' CSR of a one-device
        fit transposed from the users' there (or on the host: :func:`host_transpose`); the
        buffer sets of streamed sides; returns the seconds of the ``upload`` and the
        ``transpose``."""
        res = {s: self.dplan.sides[s].resident for s in SIDES}
        lazy = self.side["items"].indices is None
        on_device = self._on_device
        t_host = 0.0
        if lazy and not on_device:
            t_host = time.perf_counter()
            u = self.side["users"]
            C = sp.csr_matrix((u.data, u.indices, u.indptr), shape=self.shape).tocsc()
            self.side["items"] = SideData(self.side["items"].indptr,
                                          C.indices.astype(np.int32, copy=False),
                                          C.data.astype(np.float32, copy=False))
            t_host = time.perf_counter() - t_host
        t0 = time.perf_counter()
        # Intel's CPU runtime reads only aligned host arrays in place: misaligned ones are
        # wrapped from the boundary below them (the device's row pointers shifted to match) or,
        # where the indices and values start differently, copied into aligned arrays by the
        # uploader's threads; either is held with the ratings
        up = U.Uploader(self.ctx, self.queue, U.zero_copy(self.info),
                        align=U.host_align(self.info))
        self._resident_indptr = {}
        try:
            for s in SIDES:
                if not res[s]:
                    self._stream_sets(s)
                elif s == "items" and on_device:
                    self.buf[s]["indptr"] = up.buffer(self.side[s].indptr)
                    self._resident_indptr[s] = self.side[s].indptr
                else:
                    self._upload_side(s, up, *self.side[s].entries(*self.dplan.sides[s].chunks[0]))
        finally:
            up.finish()
            self._hold += up.held
        log.debug("ratings on %s: %d bytes copied to the device, %d into aligned host copies, %d "
                  "wrapped from below (entry offsets %s)", self.info.name, up.bytes,
                  up.aligned_bytes, up.skewed_bytes, self.entry_offset)
        t1 = time.perf_counter()
        if on_device:
            bu, bi = self.buf["users"], self.buf["items"]
            bi["indices"], bi["data"] = device_transpose(
                self.ctx, self.queue, self.info, self.side["users"].indptr, bu["indptr"],
                bu["indices"], bu["data"], self.shape[1], bi["indptr"])
        return {"upload": t1 - t0, "transpose": time.perf_counter() - t1 + t_host}

    def _upload_side(self, side, up, indptr, indices, data):
        """A resident side's CSR into its device buffers; its row pointers shifted by the entry
        offset at which the uploader placed the indices and values
        (:meth:`Uploader.entry_buffers`), kept in :attr:`entry_offset` for the pieces' row
        pointers of split rows."""
        b = self.buf[side]
        (b["indices"], b["data"]), k = up.entry_buffers((indices, data), self._hold[:2])
        self.entry_offset[side] = k
        self._resident_indptr[side] = indptr
        if k:
            indptr = indptr + k
        self._hold.append(indptr)
        b["indptr"] = up.buffer(indptr)

    def _stream_sets(self, side):
        """The two buffer sets a streamed side's chunks take turns in (with pinned staging
        arrays where :attr:`pinned`)."""
        cl, mf, m = self.cl, self.cl.mem_flags, self.dplan.sides[side]
        sets = []
        for _ in range(m.buffers):
            bset = {"indptr": cl.Buffer(self.ctx, mf.READ_ONLY, size=8 * (m.chunk_rows + 1)),
                    "indices": cl.Buffer(self.ctx, mf.READ_ONLY, size=4 * m.chunk_nnz),
                    "data": cl.Buffer(self.ctx, mf.READ_ONLY, size=4 * m.chunk_nnz),
                    "event": None, "chunk": None}
            if self.pinned:
                bset["stage"] = {"indptr": self.pinned_array((m.chunk_rows + 1,), np.int64),
                                 "indices": self.pinned_array((m.chunk_nnz,), np.int32),
                                 "data": self.pinned_array((m.chunk_nnz,), np.float32)}
                bset["staged"] = None
            sets.append(bset)
        self.buf[side]["sets"] = sets

    def _allocate(self):
        """Scratch, the implicit Gram's virtual rows, the long rows' pieces, factors, status."""
        cl, mf, fs = self.cl, self.cl.mem_flags, self.fs
        for s in SIDES:
            b, bs = self.buf[s], self.batch_rows[s]
            b.update(A=cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * fs * bs),
                     B=cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * bs),
                     G=cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * fs))
            if self.implicit:
                # G = (other)ᵀ(other) once per half-step (launch.gram_buffers)
                lo, hi = self.frange[other_side(s)]
                b["gram"] = gram_buffers(cl, self.ctx, self.info, fs, hi - lo, bs)
            if f"scratch2_{s}" in self.dplan.bytes:      # the reduce mode's second pair
                b.update(A2=cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * fs * bs),
                         B2=cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * bs))
            b.update(RD.buffers(self, s))                  # the pipelined reduce's, if planned
            if s in self.share.reduced:
                r0, r1 = self.share.blocks[s]
                ip = np.asarray((self.share.whole or self.side)[s].indptr[r0:r1 + 1], np.int64)
                b["counts"] = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                                        hostbuf=ip - ip[0])
        self.launches = {s: self._plan_launches(s) for s in SIDES}
        self.factors = {s: cl.Buffer(self.ctx, mf.READ_WRITE,
                                     size=max(1, hi - lo) * self.ldf * self.itemsize)
                        for s, (lo, hi) in self.frange.items()}
        self.status = cl.Buffer(self.ctx, mf.READ_WRITE, size=4)
        self.reset_status()
        if P.WARM_LAUNCHES and thread_safe(self.device):
            # a runtime may allocate a buffer's memory at its first use: at set-up, not in the
            # first iteration (not on Oclgrind, where it gains nothing and its fill of a first
            # word leaves the factors reported as uninitialised)
            word = np.zeros(1, np.float32)
            for b in self.buf.values():
                for key in ("A", "B", "A2", "B2", "Av", "Bp", "G", "P", "P2", "S", "T"):
                    if key in b:
                        cl.enqueue_fill_buffer(self.queue, b[key], word, 0, 4)

    def _plan_launches(self, side):
        """The launches of a resident side's half-step, ``(row0, n, v0, nv)`` (``nv`` > 0:
        split), with the pieces' row pointers and scratch on the device when the side is split;
        None for a streamed side (its batches follow its chunks)."""
        m = self.dplan.sides[side]
        if not m.resident:
            return None
        sp_, bs = self.splits[side], self.batch_rows[side]
        rows = m.r1 - m.r0
        if not sp_.active:
            bs = launch_rows(self.configs[side], bs, rows, published=not self._whole_factor(side))
            return [(r0, min(bs, rows - r0), 0, 0) for r0 in range(0, rows, bs)]
        cl, mf, fs = self.cl, self.cl.mem_flags, self.fs
        indptr = self._resident_indptr[side]
        vindptr, vstart, launches = split_rows(indptr, sp_.threshold, bs, sp_.virtual_rows,
                                               sp_.slots)
        vindptr += self.entry_offset[side]      # entry offsets into the side's buffers
        cut = int(np.count_nonzero(np.diff(indptr) > sp_.threshold))
        log.debug("%s: %d row(s) over %d entries cut into %d pieces in all; %d of %d launches "
                  "split", side, cut, sp_.threshold, len(vindptr) - 1,
                  sum(1 for x in launches if x[3]), len(launches))
        self.buf[side].update(
            vindptr=cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=vindptr),
            vstart=cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=vstart),
            Av=cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * fs * sp_.virtual_rows),
            Bp=cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * sp_.virtual_rows))
        return launches

    def pinned_array(self, shape, dtype):
        """A zeroed page-locked host array in this device's context (unmapped and freed by
        :meth:`release`)."""
        buf, arr = U.pinned_array(self.ctx, self.q["stream"], shape, dtype)
        self._staging.append((buf, arr))
        return arr

    def adopt_staging(self, pairs):
        """Take ``(buffer, mapped array)`` pairs made in this context: freed by :meth:`release`."""
        self._staging.extend(pairs)

    def _upload_chunk(self, side, bset, chunk, wait_for=None):
        """Copy rows ``chunk`` of a streamed ``side`` (rebased row pointers, entries) into a
        buffer set (through its pinned staging arrays when it has them); the last copy's
        event."""
        cl = self.cl
        ip, idx, val = self.side[side].entries(*chunk)
        q = self.q["stream"]
        stage = bset.get("stage")
        n = len(idx)
        bset["chunk"] = chunk
        if stage is not None:
            if bset["staged"] is not None:
                bset["staged"].wait()          # the staging arrays' previous copy is done
            for key, a in (("indptr", ip), ("indices", idx), ("data", val)):
                fill(self._fill_pool, stage[key], a)
            ip, idx, val = stage["indptr"][:len(ip)], stage["indices"][:n], stage["data"][:n]
        else:
            idx = np.ascontiguousarray(idx, np.int32)
            val = np.ascontiguousarray(val, np.float32)
        ev = self.keep(cl.enqueue_copy(q, bset["indptr"], ip, is_blocking=False,
                                       wait_for=wait_for))
        if n:
            self.keep(cl.enqueue_copy(q, bset["indices"], idx, is_blocking=False))
            ev = self.keep(cl.enqueue_copy(q, bset["data"], val, is_blocking=False))
        if stage is not None:
            bset["staged"] = ev
        return ev

    # ----- copies in flight ------------------------------------------------------------------
    def _status_host(self):
        """The host word the flag is read into: page-locked where the engine pins (a pageable
        one costs a staged copy in the driver), made at the first read."""
        if not self.pinned:
            return np.empty(1, np.int32)
        if self._st is None:
            self._st = self.pinned_array((1,), np.int32)
        return self._st

    def reset_status(self):
        """Enqueue the singular-row flag's reset (a fill: no host memory, which a driver may
        copy through a staging buffer while holding its lock): at set-up and after each
        half-step's read of the flag, off the next half-step's first launch."""
        self.cl.enqueue_fill_buffer(self.queue, self.status, self._ok, 0, 4)

    def keep(self, ev):
        """Hold a non-blocking copy's event until the copy has completed, and return it: pyopencl's
        ``NannyEvent`` waits for its copy when released, *holding the GIL*, so a dropped one makes
        the copy blocking and stops every other thread (the other devices' fits) until it ends."""
        if ev is not None:
            self._pending.append(ev)
        return ev

    def prune(self):
        """Release the held copy events that have completed (releasing those cannot wait)."""
        done = self.cl.command_execution_status.COMPLETE
        self._pending = [e for e in self._pending if e.command_execution_status != done]

    # ----- factors -------------------------------------------------------------------------
    def _whole_factor(self, side):
        """Whether this device holds every row of ``side``'s factor."""
        return self.frange[side] == (0, self.side_rows(side))

    def side_rows(self, side):
        """Rows of ``side`` in the whole fit."""
        return self.shape[0] if side == "users" else self.shape[1]

    def set_factors(self, side, M, biases=None, adopt=False):
        """Upload the factors (and biases) of ``side`` into its device buffer (the rows held).

        ``adopt``: ``M`` is the engine's to keep and overwrite (start factors that no one else
        holds). On a device that reads host memory in place, the factor buffer then wraps the
        rows in the device's layout without a copy where ``M`` is the ``[:rows, :f]`` view of
        such rows (:func:`host_factor_rows`, aligned as the runtime needs); else ``M`` is
        copied."""
        rows = self.side_rows(side)
        M = np.asarray(M, dtype=np.float32)
        self._unrotate()
        if M.shape != (rows, self.f):
            raise ValueError(f"{side} factors must have shape {(rows, self.f)}, not {M.shape}")
        whole = self._whole_factor(side)
        if adopt and whole and ADOPT_FACTORS and biases is None and self.np_store == np.float32:
            host = padded_base(M, rows, self.f, self.ldf)
            if host is not None and self._wrappable(host):
                mf = self.cl.mem_flags
                buf = self.cl.Buffer(self.ctx, mf.READ_WRITE | mf.USE_HOST_PTR, hostbuf=host)
                self.factors[side].release()
                self.factors[side] = buf
                self._factor_hosts[side] = host         # the buffer's memory: kept with it
                return
        if self.ldf == self.f and not self.biased and self.np_store == np.float32:
            host = np.ascontiguousarray(M)          # the device's layout already: no copy
        else:
            host = padded_factors(side, M, rows, self.f, self.ldf, self.np_store, self.biased,
                                  biases)
        if not whole:
            self.write_rows(side, host, 0, rows, blocking=True)
            return
        up = U.Uploader(self.ctx, self.queue, U.zero_copy(self.info))
        try:
            up.write(self.factors[side], host)
        finally:
            up.finish()

    def _wrappable(self, host):
        """Whether the device reads ``host`` (a writable, C-contiguous array) in place: a CPU
        runtime, and the start its runtime needs for that (:func:`upload.needs_aligned_host`)."""
        align = U.host_align(self.info)
        return (U.zero_copy(self.info) and host.size > 0 and host.flags.c_contiguous
                and host.flags.writeable and (align <= 1 or host.ctypes.data % align == 0))

    def get_factors(self, side, with_biases=False):
        """A side's factors (and biases) copied from its device buffer (every row held)."""
        rows = self.side_rows(side)
        if not self._whole_factor(side):
            raise ValueError(f"device {self.index} holds {side} rows {self.frange[side]} only")
        self._unrotate()
        host = np.empty((max(1, rows), self.ldf), dtype=self.np_store)
        up = U.Uploader(self.ctx, self.queue, U.zero_copy(self.info))   # (pinned stages)
        try:
            up.read(self.factors[side], host)
        finally:
            up.finish()
        return unpadded_factors(host, rows, self.f, self.biased, with_biases)

    def write_rows(self, side, host, r0, r1, blocking=True, queue="into"):
        """Upload rows ``[r0, r1)`` (global numbering) of the padded host array ``host`` into this
        device's buffer of ``side``'s factor (the part it holds)."""
        self._unrotate()
        lo, hi = self.frange[side]
        a, b = max(r0, lo), min(r1, hi)
        if a >= b:
            return None
        if getattr(host, "dtype", self.np_store) != self.np_store:   # a float16 exchange
            return half_rows(self, queue, side, host, a, b, blocking)
        return self.cl.enqueue_copy(self.q[queue], self.factors[side], host[a:b],
                                    dst_offset=(a - lo) * self.ldf * self.itemsize,
                                    is_blocking=blocking)

    def read_rows(self, side, host, r0, r1, blocking=True, wait_for=None):
        """Download rows ``[r0, r1)`` of ``side``'s factor (held here) into ``host[r0:r1]``."""
        self._unrotate()
        lo, hi = self.frange[side]
        if not (lo <= r0 <= r1 <= hi):
            raise ValueError(f"rows {r0}..{r1} of {side} are not held on device {self.index}")
        if r1 == r0:
            return None
        if getattr(host, "dtype", self.np_store) != self.np_store:
            return half_rows(self, "out", side, host, r0, r1, blocking, wait_for)
        return self.cl.enqueue_copy(self.q["out"], host[r0:r1], self.factors[side],
                                    src_offset=(r0 - lo) * self.ldf * self.itemsize,
                                    is_blocking=blocking, wait_for=wait_for)

    # ----- one half-step -------------------------------------------------------------------
    def iteration(self, regularization, weighted):
        """One ALS iteration of a one-device fit: users, then items."""
        self.half_step("users", regularization, weighted)
        self.half_step("items", regularization, weighted)

    def half_step(self, side, regularization, weighted, exchange=None):
        """Solve this device's rows of ``side`` given the other side's factors (they stay on
        the device). With an ``exchange`` whose ``needed`` is set, publish them to
        ``exchange.host`` batch by batch and upload the other devices' rows as they are
        published."""
        for _ in self.half_step_steps(side, regularization, weighted, exchange):
            pass

    def half_step_steps(self, side, regularization, weighted, exchange=None):
        """:meth:`half_step` as a generator: it yields False after each launch and True once
        every command of the half-step is enqueued, then waits for them (and receives the
        other devices' rows) when resumed: a multi-device fit interleaves its devices'
        launches from one thread and finishes each in its own."""
        try:
            yield from self._half_step(side, regularization, weighted, exchange)
        except BaseException as e:
            if exchange is not None:
                exchange.fail(e)
            raise

    def _half_step(self, side, regularization, weighted, exchange):
        t0 = time.perf_counter()
        other = other_side(side)
        b, v, cfg = self.buf[side], self.vars[side], self.configs[side]
        kern = self.programs[side].kernels
        q, fs = self.queue, self.fs
        lo = self.frange[side][0]
        if not self._whole_factor(other):
            raise ValueError(f"the {side} half-step reduces partial normal equations here: "
                             "use clmf.engine.reduce.pipelined()")
        gram, head, stream_events = None, 0, []
        batches = self._batches(side, stream_events)
        if self.implicit:      # G = (other side)ᵀ(other side), once per half-step
            timed_gram(self, side, kern, cfg)
            if RT.applies(self, side, cfg, exchange):       # in G's eigenbasis: Λ for G
                self.rotation = self.rotation or RT.Rotation(self)
                head = self.rotation.head_rows(self.frange[side][1] - lo)
                if head:       # solved while the host takes the eigendecomposition
                    self.rotation.start(side)
                    batches = head_split(batches, head)
                else:
                    gram = 2 if self.rotation.rotate(side) else None
        publisher = (Publisher(exchange, self.index)
                     if exchange is not None and exchange.needed else None)
        # a resident side's solved rows are read back once all its kernels are enqueued: the
        # driver may hold a copy's enqueue call for milliseconds while other devices' threads
        # enqueue (NVIDIA, four devices), and the device must not wait for the next kernel
        events, copy_events, later = [], [], self.dplan.sides[side].resident
        publish = []                   # a resident side's read-backs, enqueued after the loop
        for batch in batches:
            bset, r0, row0, n = batch.bset, batch.r0, batch.row0, batch.rows
            if batch.nv:
                e1, e2, ec, e3 = launch_split_batch(
                    kern, q, cfg, v, fs, bset["indptr"], b["vindptr"], b["vstart"],
                    bset["indices"], bset["data"], self.factors[other], b["A"], b["B"], b["Av"],
                    b["Bp"], b["G"], self.factors[side], self.status, row0, n, batch.v0,
                    batch.nv, r0 - lo, regularization, weighted, self.implicit, self.alpha,
                    self.offset, wait_for=batch.wait)
            else:
                ec = None
                e1, e2, e3 = launch_batch(
                    kern, q, cfg, v, fs, bset["indptr"], bset["indices"], bset["data"],
                    self.factors[other], b["A"], b["B"], b["G"], self.factors[side],
                    self.status, row0, n, r0 - lo, regularization, weighted, self.implicit,
                    self.alpha, self.offset, wait_for=batch.wait, gram=gram)
            batch.done = e3 or ec or e2 or e1
            events.append((e1, e2, e3, ec))
            if batch.head:             # the head rows enqueued: rotate, Λ for the others
                gram = 2 if self.rotation.complete() else None
            if publisher is not None:
                item = (batch.done, r0 + row0, n)
                if later:
                    publish.append(item)
                else:
                    BL.publish_rows(self, side, exchange, publisher, copy_events, item)
            yield False
        for p in publish:
            BL.publish_rows(self, side, exchange, publisher, copy_events, p)
        yield True
        self._finish_half_step(side, regularization, publisher, exchange, t0, events,
                               stream_events, copy_events)

    def _unrotate(self):
        """Factors in the original basis again (after half-steps in a Gram eigenbasis)."""
        if self.rotation is not None:
            self.rotation.undo()

    def _batches(self, side, stream_events):
        """The launches of this device's rows of ``side`` as :class:`Batch`: a resident side's
        planned launches (:meth:`_plan_launches`), a streamed side's chunk by chunk. A
        streamed chunk is uploaded into the buffer sets in turn (its events appended to
        ``stream_events``), only after the commands of the set's previous chunk ran: the
        caller sets ``batch.done`` to its batch's last event, so the copy of chunk c+1 is
        enqueued while chunk c's kernels run (double buffer)."""
        m = self.dplan.sides[side]
        if m.resident:
            bset = self.buf[side]
            for row0, n, v0, nv in self.launches[side]:
                yield Batch(bset, m.r0, row0, n, None, v0, nv)
            return
        sets = self.buf[side]["sets"]
        bs = m.batch_rows
        for c, (r0, r1) in enumerate(m.chunks):
            bset = sets[c % len(sets)]
            prev = bset["event"]
            up = self._upload_chunk(side, bset, (r0, r1), wait_for=[prev] if prev else None)
            wait = [up]
            stream_events.append(up)
            last = None
            for row0 in range(0, r1 - r0, bs):
                batch = Batch(bset, r0, row0, min(bs, r1 - r0 - row0), wait)
                yield batch
                wait = None
                last = batch.done
            bset["event"] = last

    def _finish_half_step(self, side, regularization, publisher, exchange, t0, events,
                          stream_events, copy_events):
        """Receive the other devices' rows while this device's kernels run, wait for all,
        account the times and report a singular system."""
        cl, st = self.cl, self._status_host()
        if publisher is None:
            cl.enqueue_copy(self.queue, st, self.status)   # blocking: also ends the half-step
            t_done = t_end = time.perf_counter()
        else:
            publisher.watch(self.keep(cl.enqueue_copy(self.queue, st, self.status,
                                                      is_blocking=False)))
            publisher.close()
            self._receive(side, exchange)      # uploads overlap this device's kernels
            publisher.join()
            self.q["into"].finish()
            t_end = time.perf_counter()
            t_done = publisher.done_at or t_end
        self.reset_status()                    # for the next half-step, after the read
        self.times["compute"] += t_done - t0
        self.times["exchange"] += max(0.0, t_end - t_done)
        self.prune()
        if self.profile:
            self._account(events, stream_events, copy_events)
        if st[0] != _INT_MAX:
            raise SingularSystemError(
                f"the normal equations of {side[:-1]} row {int(st[0])} are not positive "
                f"definite (regularization={regularization}); increase regularization")

    def _account(self, events, stream_events=(), copy_events=()):
        """Add the profiled events' device seconds: per stage, kernels, copies."""
        BL.account(self.times, self.stage_times, events, stream_events, copy_events)

    def _receive(self, side, exchange):
        """Upload the other devices' rows of ``side`` as they are published."""
        seen = 0
        while True:
            new, seen, done = exchange.take(self.index, seen)
            for r0, r1 in BL.coalesce(new):
                self.keep(self.write_rows(side, exchange.host, r0, r1, blocking=False))
            if done:
                return

    def finish(self):
        """Wait for every command enqueued so far."""
        for q in self.q.values():
            q.finish()

    # ----- metrics on the device (:mod:`clmf.engine.device_metrics`) -------------------------
    def squared_error(self, key, users, items, ratings, offset=0.0):
        """``(sum of squared errors, count)`` on triples (:func:`device_metrics.squared_error`)."""
        return DM.squared_error(self, key, users, items, ratings, offset)

    def cached_squared_error(self, key, n, offset=0.0):
        """The sum of squared errors on the ``n`` triples kept under ``key``, or None."""
        return DM.cached_squared_error(self, key, n, offset)

    def train_squared_error(self):
        """``(sse, count)`` on the training ratings (:func:`device_metrics.train_squared_error`)."""
        return DM.train_squared_error(self)

    # ----- freeing ---------------------------------------------------------------------------
    def _release_buffers(self):
        """Release the ratings' buffers created so far (a set-up that failed), once the
        commands queued on them have ended."""
        self.drain()
        self._free()

    def drain(self):
        """Wait for every queue (Ctrl-C held back): no kernel or copy still uses a buffer or a
        host array the engine wraps once this returns; a failed wait is only logged."""
        try:
            drain(*getattr(self, "q", {}).values())
        except Exception as e:  # noqa: BLE001 - freeing must go on after a failed command
            log.warning("waiting for %s before freeing its buffers failed: %s",
                        getattr(getattr(self, "info", None), "name", "the device"), e)

    def release(self):
        """Free the device buffers, once every command queued on them has ended (also after
        Ctrl-C: the kernels of an interrupted half-step finish first); again, nothing."""
        if getattr(self, "_released", True):
            return
        with deferred_interrupts():
            self.drain()
            self._pending = []      # every queue has drained: releasing them cannot wait
            self._free()
            self._released = True

    def _free(self):
        """Release every buffer (the queues are drained; the fill threads end first, they
        write into the mapped staging arrays)."""
        holder = self.cl.MemoryObjectHolder
        if self._fill_pool[0] is not None:
            self._fill_pool[0].shutdown()
            self._fill_pool[0] = None
        for _n, bufs in self._metric_bufs.values():
            for x in bufs:
                x.release()
        for buf, arr in self._staging:
            mapping = getattr(arr, "base", None)
            if hasattr(mapping, "release"):
                mapping.release(self.q["stream"])     # unmap before freeing
            buf.release()
        for b in self.buf.values():
            for bset in [b, *b.get("sets", [])]:
                for val in bset.values():
                    if isinstance(val, holder):
                        val.release()
        for buf in [*self.factors.values(), *self._half_stage.values()]:
            buf.release()
        if isinstance(getattr(self, "status", None), holder):
            self.status.release()
        if self.rotation is not None:
            self.rotation.release()
            self.rotation = None
        self._metric_bufs, self._staging, self.buf, self.factors = {}, [], {}, {}
        self._st = None
        self._half_stage = {}
        self._factor_hosts = {}

    def __del__(self):
        """An engine dropped unreleased (an error or Ctrl-C before :meth:`release`) waits for
        its queues before its buffers and the host arrays they wrap are freed with it."""
        if not getattr(self, "_released", True):
            try:
                self.drain()
            except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing to wait for
                pass
