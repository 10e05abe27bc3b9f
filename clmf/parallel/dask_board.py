"""The Dask workers' own iteration loop on one host (issue 28): each worker's *board* of
shared-memory segments (:mod:`clmf.parallel.shared_blocks`), through which it publishes its
solved rows while its kernels run and takes the other workers' rows as they announce them —
as the in-process :class:`~clmf.parallel.worker.Exchange` does between threads — with the
page-locked staging of GPUs, the switches of the loop and what its tails are measured by.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import time

import numpy as np

from ..engine.upload import registers_host_pages, wrap_host

log = logging.getLogger(__name__)

__all__ = ["Board", "BoardExchange", "BlockHost", "board_create", "PeerLostError",
           "tail_parts", "publish_mode", "copy_rates", "pin_limit", "staging_specs",
           "copy_threads", "copy_rows", "copy_rows_async", "exchange_timeout", "ENV_LOOP"]

# "0" (or "false", "no", "off"): the Dask workers never run their own loop (tasks per half-step)
ENV_LOOP = "CLMF_DASK_WORKER_LOOP"

# Each worker of a fit whose workers share a host owns, besides its blocks, one *board*: a
# control segment (int64 words) and one row segment per side holding the rows it solves. The
# whole iteration then runs inside one task per worker (:func:`clmf.parallel.dask_tasks.iterate`):
# the engine publishes each batch of solved rows into the worker's row segment as soon as its
# device → host copy ends, and uploads the other workers' rows as their boards announce them —
# as the in-process :class:`~clmf.parallel.worker.Exchange` does between threads.
#
# A control segment holds ``_HEADER`` words (the owner's pid, its failure flag) and two banks,
# one per parity of the half-step number ``k`` (counted from 1 by every worker alike): a word
# ``k << 32 | count << 1 | done`` and ``_CAPACITY`` records ``(k, r0, r1)``. The owner writes a
# record, then the word (single aligned 8-byte stores); a reader trusts a record only when its
# ``k`` matches. Bank ``k % 2`` is rewritten at half-step ``k + 2`` only, which no worker starts
# before every other one finished half-step ``k + 1`` — and so its uploads of ``k``. Row
# segments are rewritten two half-steps later likewise.

_PID, _FAILED = 0, 1
_HEADER = 4
_CAPACITY = 4096              # records per half-step (more chunks: the rest as one record)
_BANK = 1 + 3 * _CAPACITY
PIN_LIMIT = 4 << 30           # largest page-locked mirror of a side's rows (default)
ENV_PIN_LIMIT = "CLMF_DASK_PIN_LIMIT"     # bytes: sets it (0: the peers' rows uploaded from
                                          # their segments, only a worker's own rows staged)
POLL_FIRST, POLL_LAST = 20e-6, 200e-6    # a waiting reader's first and longest sleep (s)
COPY_THREADS = 4              # most host threads of a worker fetching peers' rows (and publishing)
ENV_TIMEOUT = "CLMF_DASK_EXCHANGE_TIMEOUT"
ENV_COPY_THREADS = "CLMF_DASK_COPY_THREADS"
# how a worker's own solved rows reach its row segment where they are staged (publish_mode)
ENV_PUBLISH = "CLMF_DASK_PUBLISH"


def tail_parts(marks, kernels_end, end):
    """Where a half-step's tail went (seconds; ``marks``: :attr:`BoardExchange.marks`,
    ``kernels_end``: when this worker's kernels ended, ``end``: when the half-step returned):
    ``publish_tail``, its own last rows announced after its kernels ended; ``peers_tail``, the
    peers' last record read after its kernels ended; ``fetch_tail``, their last chunk copied
    in after that; ``upload_tail``, the half-step's end after that (the last uploads)."""
    seen = max(kernels_end, marks.get("seen", kernels_end))
    ready = max(seen, marks.get("ready", seen))
    return {"publish_tail": max(0.0, marks.get("published", kernels_end) - kernels_end),
            "peers_tail": seen - kernels_end, "fetch_tail": ready - seen,
            "upload_tail": max(0.0, end - ready)}


class PeerLostError(RuntimeError):
    """Another worker of the fit died, failed or was told to stop while this one waited for
    its rows."""


def pin_limit():
    """The largest page-locked mirror of a side's rows in bytes: ``CLMF_DASK_PIN_LIMIT``, else
    :data:`PIN_LIMIT` (an unreadable value is an error naming it)."""
    raw = os.environ.get(ENV_PIN_LIMIT, "").strip()
    if not raw:
        return PIN_LIMIT
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{ENV_PIN_LIMIT} must be a number of bytes, not {raw!r}") from None


PUBLISH_MODES = ("copy", "device", "dma", "register")
PUBLISH = "dma"                  # the default where the driver is not known to register
                                 # wrapped pages: 4 × H100, 4 × Netflix, Dask 0.1445 s/it
                                 # against 0.1533 by "copy" (results/bench/dask-h100x4-44)
PUBLISH_REGISTERED = "register"  # where it is (NVIDIA): Netflix 0.0358 s/it against 0.0449 by
                                 # "dma", in-process 0.0314 (results/bench/x4-46/g)


def publish_mode(info=None):
    """:data:`ENV_PUBLISH`, how a worker's solved rows reach its row segment and the peers'
    rows its device, where they would pass through page-locked staging (GPUs): "copy" (a host
    copy out of its page-locked mirror), "device" (a second device → host copy into the
    segment), "dma" (the device copies into a buffer wrapping the segment, which a driver that
    registers the pages fills by DMA) or "register" (no page-locked staging: every worker's
    row segment wrapped by such a buffer in the device's context, so that the device's own
    copies to and from the segments run by DMA, the peers' rows uploaded from where they lie:
    no host copies at all); anything else is an error naming it. Unset: "register" where the
    device's driver registers wrapped pages (``info``:
    :func:`clmf.engine.upload.registers_host_pages`), else :data:`PUBLISH`."""
    default = (PUBLISH_REGISTERED if info is not None and registers_host_pages(info)
               else PUBLISH)
    mode = os.environ.get(ENV_PUBLISH, "").strip().lower() or default
    if mode not in PUBLISH_MODES:
        raise ValueError(f"{ENV_PUBLISH} must be one of {', '.join(PUBLISH_MODES)}, not "
                         f"{mode!r}")
    return mode


def exchange_timeout():
    """Seconds a worker waits for a peer's rows without any news before giving up
    (``CLMF_DASK_EXCHANGE_TIMEOUT``, default 900)."""
    try:
        return float(os.environ.get(ENV_TIMEOUT, "900"))
    except ValueError:
        return 900.0


class BlockHost:
    """One side's rows as ``host[a:b]`` in global numbering, each block in its owner's row
    segment (what :class:`~clmf.engine.Engine` reads and writes through an exchange's
    ``host``; a slice never crosses two blocks). With a page-locked ``mirror`` of every row,
    a slice is the mirror's: the device's copies then run from page-locked memory, another
    worker's rows copied into it first by :meth:`fetch` (host threads of ``pool``, while the
    kernels run: :meth:`BoardExchange.take` hands a chunk out once its copy is done)."""

    def __init__(self, bounds, arrays, mirror=None, own=None, pool=None):
        """``arrays[d]`` holds rows ``[bounds[d], bounds[d + 1])``; ``own``: this worker's
        index (its rows are the mirror's own, never copied in)."""
        self.bounds = np.asarray(bounds, dtype=np.int64)
        self.arrays = list(arrays)
        self.mirror, self.own, self.pool = mirror, own, pool

    def block(self, d):
        """Worker ``d``'s rows ``(r0, r1)``."""
        return int(self.bounds[d]), int(self.bounds[d + 1])

    def _locate(self, a, b):
        """``(worker, its array's rows)`` of global rows ``[a, b)`` inside one block."""
        d = int(np.searchsorted(self.bounds, a, side="right")) - 1
        r0 = int(self.bounds[d])
        if d < 0 or b > int(self.bounds[d + 1]):
            raise IndexError(f"rows {a}..{b} cross the workers' blocks")
        return d, self.arrays[d][a - r0:b - r0]

    def __getitem__(self, key):
        """The rows of a slice inside one worker's block (the mirror's, where there is one)."""
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("BlockHost takes a contiguous slice of global rows")
        _d, rows = self._locate(key.start, key.stop)
        return rows if self.mirror is None else self.mirror[key.start:key.stop]

    def fetch(self, a, b):
        """Start copying another worker's rows ``[a, b)`` from its segment into the mirror:
        the copies' futures (none without a mirror: the rows are read where they lie; none
        without a ``pool``: copied here and now)."""
        d, rows = self._locate(a, b)
        if self.mirror is None or d == self.own:
            return []
        if self.pool is None:
            np.copyto(self.mirror[a:b], rows)
            return []
        return copy_rows_async(self.pool, self.mirror[a:b], rows)


COPY_PART = 1 << 20           # bytes a host thread copies at least (smaller: one part)


def _parts(src):
    """Row cuts of ``src`` into up to four parts of :data:`COPY_PART` bytes or more."""
    parts = min(4, max(1, src.nbytes // COPY_PART), len(src))
    return np.linspace(0, len(src), parts + 1).astype(np.int64)


def copy_rows_async(pool, dst, src):
    """Start ``dst[...] = src`` in host threads of ``pool`` (a
    :class:`concurrent.futures.Executor`), up to four parts: the futures of the parts."""
    cuts = _parts(src)
    return [pool.submit(np.copyto, dst[a:b], src[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


def copy_rows(pool, dst, src):
    """``dst[...] = src``: the first of up to four parts of 1 MB or more in this thread, the
    others in host threads of ``pool`` (a :class:`concurrent.futures.Executor` or None: all
    here)."""
    cuts = _parts(src)
    if pool is None or len(cuts) <= 2:
        np.copyto(dst, src)
        return
    futs = [pool.submit(np.copyto, dst[a:b], src[a:b]) for a, b in zip(cuts[1:-1], cuts[2:])]
    np.copyto(dst[:cuts[1]], src[:cuts[1]])
    for fu in futs:
        fu.result()


def copy_rates(staging, nbytes=16 << 20, repeats=3):
    """Host copy rates in GB/s (best of ``repeats`` copies of ``nbytes``): ``pinned_to_pageable``
    (out of a page-locked array made by ``staging(shape, dtype)``, as a worker publishes its
    staged rows), ``pageable_to_pinned`` (into it, as the peers' rows are fetched) and
    ``pageable`` (between ordinary arrays) — a page-locked allocation that the CPU reads
    slowly (write-combined) shows here."""
    pinned = staging((nbytes // 4,), np.float32)
    a, b = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
    out = {}
    for key, dst, src in (("pinned_to_pageable", b, pinned), ("pageable_to_pinned", pinned, a),
                          ("pageable", b, a)):
        np.copyto(dst, src)                           # (pages touched)
        best = np.inf
        for _ in range(repeats):
            t = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - t)
        out[key] = nbytes / max(best, 1e-9) / 1e9
    return out


def copy_threads(workers):
    """Host threads each of ``workers`` workers on this host copies rows with: its share of
    the cores it may run on, 1 to :data:`COPY_THREADS` (``CLMF_DASK_COPY_THREADS`` in the
    workers' environment sets it)."""
    try:
        return max(1, int(os.environ[ENV_COPY_THREADS]))
    except (KeyError, ValueError):
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(COPY_THREADS, cores // max(1, int(workers))))


def board_create(segments, bounds, d, ldf, dtype):
    """Make this worker's control and row segments: ``{"control": SharedBlock, side:
    SharedBlock}`` (``bounds``: side → row bounds of the workers), or None without room."""
    out = {}
    got = segments.array("control", (_HEADER + 2 * _BANK,), np.int64)
    if got is None:
        return None
    ctl, out["control"] = got
    ctl[:] = 0
    ctl[_PID] = os.getpid()
    for side, b in bounds.items():
        got = segments.array(f"rows-{side}", (max(1, int(b[d + 1] - b[d])), int(ldf)), dtype)
        if got is None:
            return None
        out[side] = got[1]
    return out


def staging_specs(bounds, d, ldf, dtype):
    """``(shape, dtype, mirror)`` of each page-locked array that :class:`Board` asks its
    ``staging`` for, side by side, on worker ``d`` (``bounds``: side → the workers' row
    bounds): a mirror of every row of a side (``mirror`` True), or this worker's rows alone
    where the mirror would exceed :func:`pin_limit`."""
    out, dtype = [], np.dtype(dtype)
    for b in bounds.values():
        shape = (int(b[-1]), int(ldf))
        mirror = int(np.prod(shape)) * dtype.itemsize <= pin_limit()
        out.append((shape if mirror else (int(b[d + 1] - b[d]), int(ldf)), dtype, mirror))
    return out


class Board:
    """This worker's view of every board of a fit: its own control words, the peers' (to read)
    and each side's :class:`BlockHost`; :meth:`exchange` makes a half-step's exchange."""

    def __init__(self, attached, d, handles, bounds, abort=None, staging=None, reader=None,
                 context=None):
        """Map the boards ``handles`` (one per worker, as :func:`board_create` returned them);
        ``abort()`` (optional) tells whether the fit was called off (asked every second of
        waiting); ``staging(shape, dtype)`` (optional, GPUs) makes page-locked arrays: each
        side's rows get a page-locked mirror (only this worker's rows where every row would
        exceed :func:`pin_limit` bytes), into which its device copies its solved rows (truly
        asynchronous, where a copy into pageable memory would hold the launches up; the
        exchange copies them on into the row segment before announcing them) and from which
        it uploads the other workers' rows (copied in from their segments by host threads).
        ``reader(side, dst, r0, r1)`` (optional, with ``staging``): reads this worker's rows
        ``[r0, r1)`` of ``side`` from its device into ``dst`` (blocking): each solved chunk is
        then published by a second device → host copy straight into the row segment instead
        of a host copy out of the page-locked array (:data:`ENV_PUBLISH`). ``context`` (an
        OpenCL context; not with ``staging``): every row segment is wrapped by a
        ``USE_HOST_PTR`` buffer of it, which a driver that registers the pages (NVIDIA) then
        copies to and from by DMA, also when a copy names the array (the "register" mode)."""
        self.d, self.n = int(d), len(handles)
        self.controls = [attached.array(h["control"]) for h in handles]
        self.segment = {}             # side -> this worker's row segment
        self.host = {}                # side -> BlockHost the engine reads and writes
        threads = copy_threads(self.n) if staging is not None else 1
        pool = concurrent.futures.ThreadPoolExecutor
        # with cores to spare, the peers' rows copied in by one pool (several chunks at once,
        # while the driving thread hands the copied ones to the device), this worker's own
        # rows out by the publishing thread and another pool (never queued behind the
        # fetches: the peers wait for them); else both in the thread asking, as they come
        self.pool = pool(threads, thread_name_prefix="clmf-fetch") if threads > 1 else None
        self.publish_pool = (pool(threads - 1, thread_name_prefix="clmf-publish")
                             if threads > 1 else None)
        self.mirrored, self.wraps = [], []
        for s, b in bounds.items():
            arrays = [attached.array(h[s])[:int(b[e + 1] - b[e])] for e, h in enumerate(handles)]
            seg = self.segment[s] = arrays[self.d]
            mirror = None
            if staging is not None:
                (shape, dt, whole), = staging_specs({s: b}, self.d, seg.shape[1], seg.dtype)
                if whole:
                    mirror = staging(shape, dt)
                    self.mirrored.append(s)
                else:
                    arrays[self.d] = staging(shape, dt)
            self.host[s] = BlockHost(b, arrays, mirror, self.d, self.pool)
            if context is not None and staging is None:
                self.wraps += [wrap_host(context, a) for a in arrays if a.nbytes]
        self.staged = staging is not None
        self.reader = reader if self.staged else None
        self.abort = abort
        self.k = 0
        self.times = dict.fromkeys(("take", "publish_copy"), 0.0)   # seconds, summed

    def close(self):
        """Stop the copying threads (and free what the reader holds on the segments, and the
        segments' wrapping buffers: the caller has waited for the device's copies)."""
        if hasattr(self.reader, "close"):
            self.reader.close()
        for buf in self.wraps:
            buf.release()
        self.wraps = []
        for pool in (self.pool, self.publish_pool):
            if pool is not None:
                pool.shutdown(wait=True)

    def exchange(self, side):
        """The exchange of the next half-step (of ``side``)."""
        self.k += 1
        return BoardExchange(self, side, self.k)

    # the owner's writes -------------------------------------------------------------------
    def _bank(self, ctl, k):
        """The bank of half-step ``k`` in control array ``ctl``."""
        o = _HEADER + (k % 2) * _BANK
        return ctl[o:o + _BANK]

    def announce(self, k, count, done, record=None):
        """Write record ``count - 1`` (when given) then the word of half-step ``k``."""
        bank = self._bank(self.controls[self.d], k)
        if record is not None:           # the record's k last: a reader trusts it then
            j = 1 + 3 * (count - 1)
            bank[j + 1:j + 3] = record
            bank[j] = k
        bank[0] = (k << 32) | (count << 1) | int(done)

    def fail(self):
        """Tell the peers this worker's half-step failed."""
        self.controls[self.d][_FAILED] = 1

    # the readers' side ---------------------------------------------------------------------
    def read(self, e, k, seen):
        """Worker ``e``'s records of half-step ``k`` after ``seen``: ``(records, count,
        done)`` (only those already complete)."""
        bank = self._bank(self.controls[e], k)
        word = int(bank[0])
        if word >> 32 != k:
            return [], seen, False
        count, done = (word >> 1) & 0x7FFFFFFF, bool(word & 1)
        out = []
        for j in range(seen, count):
            kk, r0, r1 = (int(x) for x in bank[1 + 3 * j:4 + 3 * j])
            if kk != k:                     # written, its word seen first: read it next time
                return out, j, False
            out.append((e, r0, r1))
        return out, count, done

    def check_failed(self):
        """Raise :class:`PeerLostError` when a peer flagged its half-step failed (cheap: read
        at every poll)."""
        for e in range(self.n):
            if e != self.d and self.controls[e][_FAILED]:
                raise PeerLostError(f"worker {e} of the fit failed its half-step")

    def check_peers(self):
        """Raise :class:`PeerLostError` when a peer failed or its process is gone, or the fit
        was called off."""
        self.check_failed()
        for e in range(self.n):
            if e == self.d:
                continue
            pid = int(self.controls[e][_PID])
            if pid != os.getpid():
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    raise PeerLostError(f"worker {e} of the fit (pid {pid}) died") from None
                except PermissionError:
                    pass
        if self.abort is not None and self.abort():
            raise PeerLostError("the fit was called off")


class BoardExchange:
    """One half-step's exchange through the boards (the interface of
    :class:`clmf.parallel.worker.Exchange`: ``needed``, ``host``, ``publish``, ``finish``,
    ``take``, ``fail``)."""

    needed = True

    def __init__(self, board, side, k):
        """Half-step ``k`` of ``side``."""
        self.board, self.side, self.k = board, side, k
        self.host = board.host[side]
        self.count = 0
        self.pending = None           # rows past the records' capacity: one record at the end
        self.seen = {e: 0 for e in range(board.n) if e != board.d}
        self.done = set()
        self.copying = []             # (chunk, futures of its copy into the mirror)
        # when (perf_counter) this worker's last rows were announced ("published"), the peers'
        # last record was read ("seen") and their last chunk handed to the device ("ready"):
        # where the half-step's tail after this worker's kernels goes (tail_parts)
        self.marks = {}

    def publish(self, device, r0, r1):
        """Rows ``[r0, r1)`` of this worker are in its row segment (or in its staging array:
        then copied on first)."""
        if self.board.staged:
            t = time.perf_counter()
            b0 = self.host.block(self.board.d)[0]
            dst = self.board.segment[self.side][r0 - b0:r1 - b0]
            if self.board.reader is not None:
                self.board.reader(self.side, dst, r0, r1)
            else:
                copy_rows(self.board.publish_pool, dst, self.host[r0:r1])
            self.board.times["publish_copy"] += time.perf_counter() - t
        if self.count < _CAPACITY - 1:
            self.count += 1
            self.board.announce(self.k, self.count, False, (r0, r1))
        else:                         # announced at finish as the span of the rest
            lo, hi = self.pending or (r0, r1)
            self.pending = (min(lo, r0), max(hi, r1))

    def finish(self, device):
        """Every row of this worker is published."""
        if self.pending is not None:
            self.count += 1
            self.board.announce(self.k, self.count, True, self.pending)
        else:
            self.board.announce(self.k, self.count, True)
        self.marks["published"] = time.perf_counter()

    def fail(self, exc):
        """This worker failed: its peers stop waiting."""
        self.board.fail()

    def take(self, device, seen):
        """The peers' new chunks ``(chunks, seen, all_done)`` (``seen`` is kept here), waiting
        for some (a dead or failed peer raises :class:`PeerLostError`; no news for
        :func:`exchange_timeout` seconds raises too). With a mirror, a chunk's copy into it
        starts as soon as its record is read and the chunk is handed out once the copy is
        done: several chunks copy at once, and the device uploads each as it lands."""
        t_in = time.perf_counter()
        try:
            return self._take(seen)
        finally:
            self.board.times["take"] += time.perf_counter() - t_in

    def _take(self, seen):
        """:meth:`take`'s loop."""
        sleep, t_news = POLL_FIRST, time.monotonic()
        t_check = t_news
        limit = exchange_timeout()
        while True:
            self.board.check_failed()
            ready = []
            for e in self.seen:
                if e in self.done:
                    continue
                got, self.seen[e], fin = self.board.read(e, self.k, self.seen[e])
                if got:
                    self.marks["seen"] = time.perf_counter()
                for chunk in got:
                    futs = self.host.fetch(chunk[1], chunk[2])
                    if futs:
                        self.copying.append((chunk, futs))
                    else:
                        ready.append(chunk)
                if fin:
                    self.done.add(e)
            if self.copying:
                still = []
                for chunk, futs in self.copying:
                    if all(fu.done() for fu in futs):
                        for fu in futs:
                            fu.result()           # a failed copy raises here
                        ready.append(chunk)
                    else:
                        still.append((chunk, futs))
                self.copying = still
            finished = len(self.done) == len(self.seen) and not self.copying
            if ready:
                self.marks["ready"] = time.perf_counter()
            if ready or finished:
                return ready, seen, finished and not ready
            now = time.monotonic()
            if now - t_check > 1.0:
                self.board.check_peers()
                t_check = now
                if now - t_news > limit:
                    raise PeerLostError(f"no rows from the other workers for {limit:.0f} s "
                                        f"(half-step {self.k}, {self.side}; "
                                        f"{ENV_TIMEOUT} sets the limit)")
            if self.copying:              # until the oldest chunk is copied in, or a poll
                concurrent.futures.wait(self.copying[0][1], timeout=sleep)
            else:
                time.sleep(sleep)
            sleep = min(2 * sleep, POLL_LAST)
