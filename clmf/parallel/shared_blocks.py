"""Factor blocks passed between the Dask workers of one host through shared memory (issue 28).

A Dask result travels through the scheduler's comms: pickled, sent over TCP, unpickled — for a
Netflix-shaped fit at f = 100 about 150 MB into every worker each half-step. Workers that share a
host (the common multi-GPU case) do not need that: the owner writes its solved rows into a POSIX
shared-memory segment it keeps for the whole fit, and the task's result is only a
:class:`SharedBlock` handle (a name, an offset, a shape and a dtype: a few hundred bytes), which
the other workers map and upload from directly.

Safety rests on three rules:

- **Proved before use.** A probe segment per worker (:func:`probe_create`, or the set-up's
  :func:`share_arrays`) and :func:`probe_check` run once per fit: every worker maps every
  other worker's probe segment and checks its token. A cluster spread over
  hosts (or containers with separate ``/dev/shm``) fails the check and the fit keeps Dask's
  comms. ``CLMF_DASK_SHARED_MEMORY=0`` turns the transport off.
- **Room checked before a segment is made.** A tmpfs that is too small would kill the writer
  with SIGBUS, so :class:`Segments` asks ``statvfs`` first and returns ``None`` (the caller then
  returns the array itself, through the comms) when the free space is under twice the request,
  and a new segment's pages are allocated at once (``posix_fallocate``: workers racing for the
  last room get ENOSPC there, and the comms, rather than SIGBUS).
- **Overwritten only after every reader is done.** A worker rewrites its segment of a side in
  the next solve of that side, which Dask runs only after every worker installed the blocks of
  the half-step between (each install finishes its uploads before it returns).

The set-up uses the same path for the ratings: each partition's pieces (the triples of each
worker's rows) are copied into a segment by the worker that split them (:func:`share_arrays`)
and read by their owner, which unlinks the segment once its blocks are built — where every
worker maps the others' probe (checked before the split), instead of 12 bytes a rating through
the comms.

Segments are files of ``/dev/shm`` mapped with :mod:`mmap` (not
:mod:`multiprocessing.shared_memory`, whose resource tracker, shared by a LocalCluster's worker
processes, mixes up owners and readers and prints KeyErrors). They are unmapped and unlinked by
their owner at :func:`clmf.parallel.dask_tasks.release`; the segments of a worker that died are
unlinked by the others' release (every segment's name starts with the fit's id:
:func:`unlink_fit`) and by the client's when it shares the host. Readers never unlink.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import logging
import mmap
import os
import secrets
import time

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["SharedBlock", "Segments", "Attached", "enabled", "probe_create", "probe_check",
           "resolve", "unlink_fit", "share_arrays", "segment_names", "unlink", "switched_off",
           "OFF_WORDS", "Board", "BoardExchange", "BlockHost", "board_create", "PeerLostError",
           "tail_parts", "publish_mode", "copy_rates", "pin_limit", "staging_specs"]

SHM_DIR = "/dev/shm"
ENV = "CLMF_DASK_SHARED_MEMORY"


OFF_WORDS = ("0", "false", "no", "off")     # what turns one of the Dask switches off


def switched_off(name):
    """Whether the environment variable ``name`` says "0", "false", "no" or "off" (unset:
    no)."""
    return os.environ.get(name, "").strip().lower() in OFF_WORDS


def enabled():
    """Whether the shared-memory transport may be tried (``CLMF_DASK_SHARED_MEMORY`` not "0",
    and a POSIX shared-memory directory present)."""
    if switched_off(ENV):
        return False
    return os.path.isdir(SHM_DIR)


@dataclasses.dataclass(frozen=True)
class SharedBlock:
    """A handle to an array in a shared-memory segment of a worker on the same host."""
    name: str
    offset: int
    shape: tuple
    dtype: str

    @property
    def nbytes(self):
        """Bytes of the array."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _free_bytes():
    """Free bytes of the shared-memory file system (0 when it cannot be asked)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _reserve(fd, size):
    """Allocate a new segment's pages now (``posix_fallocate``): a full shared-memory file
    system then fails here with ENOSPC (an :class:`OSError`, the block goes through Dask's
    comms) instead of killing the writer with SIGBUS later — several workers may have seen
    the same free space."""
    try:
        os.posix_fallocate(fd, 0, size)
    except AttributeError:          # pragma: no cover - not on this platform
        pass
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):     # a file system without it
            return
        raise


def _full(e):
    """Whether ``e`` says the shared-memory file system has no room."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.ENOMEM)


class _Mapped:
    """One segment file of ``/dev/shm`` mapped in this process."""

    def __init__(self, name, size=None):
        """Map segment ``name``: made (``size`` bytes, exclusive) or, without ``size``, opened."""
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if size is not None else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if size is not None:
                os.ftruncate(fd, size)
                _reserve(fd, size)
            self.size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, self.size)
        except BaseException:
            os.close(fd)
            if size is not None:
                os.unlink(path)
            raise
        os.close(fd)
        self.name, self.path = name, path

    def close(self):
        """Unmap (views still exported keep the mapping until they go)."""
        try:
            self.map.close()
        except BufferError:
            pass

    def unlink(self):
        """Remove the segment's name (the memory goes with the last mapping)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Segments:
    """The segments a worker owns for one fit, one per tag (e.g. "solve-users"), reused while
    large enough."""

    def __init__(self, prefix):
        """Segments named ``prefix-tag-random``."""
        self.prefix = prefix
        self.owned = {}

    def array(self, tag, shape, dtype):
        """``(ndarray, SharedBlock)`` backed by this worker's segment ``tag`` (grown if needed),
        or ``None`` when the shared-memory file system lacks room for it (twice its size free)."""
        dtype = np.dtype(dtype)
        nbytes = max(1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        seg = self.owned.get(tag)
        if seg is None or seg.size < nbytes:
            grow = nbytes - (seg.size if seg is not None else 0)
            if _free_bytes() < 2 * grow:
                log.info("shared memory: %d bytes asked for %s, %d free in %s; the block goes "
                         "through Dask's comms", nbytes, tag, _free_bytes(), SHM_DIR)
                return None
            self._drop(tag)
            try:
                seg = _Mapped(f"{self.prefix}-{tag}-{secrets.token_hex(4)}", nbytes)
            except OSError as e:
                if not _full(e):
                    raise
                log.info("shared memory full (%s): the block goes through Dask's comms", e)
                return None
            self.owned[tag] = seg
        arr = np.ndarray(shape, dtype, buffer=seg.map)
        return arr, SharedBlock(seg.name, 0, tuple(int(s) for s in shape), dtype.str)

    def _drop(self, tag):
        """Close and unlink the segment ``tag`` (if any)."""
        seg = self.owned.pop(tag, None)
        if seg is not None:
            seg.close()
            seg.unlink()

    def close(self):
        """Close and unlink every segment."""
        for tag in list(self.owned):
            self._drop(tag)


class Attached:
    """Segments of other workers mapped by this one (each mapped once, untracked)."""

    def __init__(self):
        """No segment mapped yet."""
        self.maps = {}

    def array(self, block):
        """The array a :class:`SharedBlock` names (a view of the mapped segment)."""
        seg = self.maps.get(block.name)
        if seg is None or seg.size < block.offset + block.nbytes:
            if os.sep in block.name or block.name.startswith("."):
                raise ValueError(f"not a segment name: {block.name!r}")
            seg = _Mapped(block.name)
            self.maps[block.name] = seg
        if seg.size < block.offset + block.nbytes:
            raise ValueError(f"segment {block.name} holds {seg.size} bytes, the block needs "
                             f"{block.offset + block.nbytes}")
        return np.ndarray(block.shape, np.dtype(block.dtype), buffer=seg.map,
                          offset=block.offset)

    def close(self):
        """Unmap every segment (their owners unlink them)."""
        for seg in self.maps.values():
            seg.close()
        self.maps.clear()


def resolve(x, attached):
    """``x`` with every :class:`SharedBlock` (also inside tuples and lists) replaced by its
    array."""
    if isinstance(x, SharedBlock):
        return attached.array(x)
    if isinstance(x, tuple):
        return tuple(resolve(v, attached) for v in x)
    if isinstance(x, list):
        return [resolve(v, attached) for v in x]
    return x


def probe_create(segments):
    """Make this worker's probe segment: ``(SharedBlock, token)`` or None when shared memory
    cannot be used here."""
    if not enabled():
        return None
    try:
        got = segments.array("probe", (16,), np.uint8)
    except OSError as e:
        log.info("shared memory unavailable (%s): blocks go through Dask's comms", e)
        return None
    if got is None:
        return None
    arr, block = got
    token = secrets.token_bytes(16)
    arr[:] = np.frombuffer(token, np.uint8)
    return block, token


def probe_check(attached, probes):
    """Whether every probe ``(SharedBlock, token)`` (None: a worker without shared memory) maps
    here with its token."""
    for p in probes:
        if p is None:
            return False
        block, token = p
        try:
            ok = attached.array(block).tobytes() == token
        except (OSError, ValueError) as e:
            log.info("shared memory segment %s of another worker not visible here (%s): "
                     "blocks go through Dask's comms", block.name, e)
            return False
        if not ok:
            return False
    return True


# ----- the set-up's pieces of ratings: from the splitting worker to the owner ------------------
def share_arrays(prefix, specs, fill):
    """Arrays of ``specs`` (``(shape, dtype)`` each) in one new segment named
    ``prefix-<random>``, written by ``fill(arrays)`` (the segment is kept after this process
    unmaps it, until its reader unlinks it): a tuple of :class:`SharedBlock`, one per array —
    or None (nothing made: the caller's arrays then travel through Dask's comms) without room
    for it."""
    specs = [((int(shape),) if np.ndim(shape) == 0 else tuple(int(x) for x in shape),
              np.dtype(dt)) for shape, dt in specs]
    offsets, total = [], 0
    for shape, dt in specs:
        offsets.append(total)
        total += -(-int(np.prod(shape, dtype=np.int64)) * dt.itemsize // 64) * 64
    if _free_bytes() < 2 * total:
        return None
    try:
        seg = _Mapped(f"{prefix}-{secrets.token_hex(8)}", max(1, total))
    except OSError as e:
        if not _full(e):
            raise
        log.info("shared memory full (%s): the arrays go through Dask's comms", e)
        return None
    try:
        fill([np.ndarray(shape, dt, buffer=seg.map, offset=off)
              for (shape, dt), off in zip(specs, offsets)])
    except BaseException:
        seg.close()
        seg.unlink()
        raise
    seg.close()
    return tuple(SharedBlock(seg.name, off, shape, dt.str)
                 for (shape, dt), off in zip(specs, offsets))


def segment_names(x):
    """The segment names of every :class:`SharedBlock` in ``x`` (tuples and lists too)."""
    if isinstance(x, SharedBlock):
        return {x.name}
    if isinstance(x, (tuple, list)):
        return set().union(*(segment_names(v) for v in x)) if x else set()
    return set()


def unlink(names):
    """Unlink the segments ``names`` of this host (those already gone are skipped)."""
    for name in names:
        if os.sep in name or name.startswith("."):
            raise ValueError(f"not a segment name: {name!r}")
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass


def unlink_fit(fit_id):
    """Unlink every segment of fit ``fit_id`` left in this host's shared memory (those of a
    worker that died with the fit); returns how many."""
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(f"{fit_id}-")]
    except OSError:
        return 0
    gone = 0
    for n in names:
        try:
            os.unlink(os.path.join(SHM_DIR, n))
            gone += 1
        except OSError:
            pass
    if gone:
        log.info("fit %s: %d shared-memory segment(s) of a lost worker unlinked", fit_id, gone)
    return gone


# ----- the workers' own iteration loop: rows published while they are solved ---------------------
#
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
# how a worker's own solved rows reach its row segment where they are staged: "copy" (default: a
# host copy out of the page-locked staging array) or "device" (a second device → host copy
# straight into the segment, in the publishing thread: no CPU read of page-locked memory)
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


def publish_mode():
    """:data:`ENV_PUBLISH` ("copy" or "device"; anything else is an error naming it)."""
    mode = os.environ.get(ENV_PUBLISH, "copy").strip().lower() or "copy"
    if mode not in ("copy", "device"):
        raise ValueError(f'{ENV_PUBLISH} must be "copy" or "device", not {mode!r}')
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

    def __init__(self, attached, d, handles, bounds, abort=None, staging=None, reader=None):
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
        of a host copy out of the page-locked array (:data:`ENV_PUBLISH`)."""
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
        self.mirrored = []
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
        self.staged = staging is not None
        self.reader = reader if self.staged else None
        self.abort = abort
        self.k = 0
        self.times = dict.fromkeys(("take", "publish_copy"), 0.0)   # seconds, summed

    def close(self):
        """Stop the copying threads."""
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
