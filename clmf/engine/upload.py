"""Host arrays into device buffers: read in place on CPU runtimes (zero-copy), and on other
devices copied through pinned (page-locked) staging buffers in chunks, the host's copy of one
chunk into a staging buffer overlapping the device's DMA transfer of the previous one.

``COPY_HOST_PTR`` from ordinary (pageable) memory makes a GPU driver stage the data itself,
usually one synchronous chunk at a time; a buffer allocated with ``ALLOC_HOST_PTR`` and mapped is
pinned memory on such drivers (NVIDIA's OpenCL guide), which the DMA engine reads at the bus's
speed, so the host's copies (split over a few threads) and the transfers overlap.
"""
from __future__ import annotations

import atexit
import collections
import concurrent.futures
import ctypes
import logging
import mmap
import os
import threading

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["Uploader", "STAGE_BYTES", "STAGES", "PINNED", "HOST_ALIGN", "KEEP_STAGING",
           "release_staging", "zero_copy",
           "needs_aligned_host", "host_align", "aligned_copy", "aligned_empty", "common_skew",
           "widened"]

STAGE_BYTES = 32 << 20        # bytes of one pinned staging buffer
STAGES = 3                    # staging buffers in flight
_SMALL = 1 << 20              # arrays below this size are written directly
_COPY_THREADS = 4             # host threads copying a chunk into a staging buffer
PINNED = True                 # False: copy from the host arrays as they are (COPY_HOST_PTR /
                              # blocking writes from pageable memory; for comparisons)
HOST_ALIGN = 128              # bytes: where a host array must start for Intel's CPU runtime to
                              # read it in place (USE_HOST_PTR; its CL_DEVICE_MEM_BASE_ADDR_ALIGN,
                              # 1024 bits: 16- and 64-byte starts are copied, 128 and up are not,
                              # whatever the size); 0 turns the aligned copies off
WRAP_BELOW = True             # False: misaligned arrays are copied, never wrapped from the
                              # boundary below them (Uploader.entry_buffers; for comparisons)
KEEP_STAGING = True           # the staging buffers outlive their uploader, STAGES per context
                              # (pinned memory takes ~10 ms per buffer to allocate and map: a
                              # fit's uploads and the next fit's reuse them); False: each
                              # uploader frees its own (for comparisons)
_KEPT_CONTEXTS = 4            # contexts whose staging buffers are kept (the latest used)


def zero_copy(info):
    """Whether the device reads host arrays in place (CPU runtimes; not the Oclgrind simulator,
    whose checks count host memory it did not copy as uninitialised)."""
    return info.type == "CPU" and "oclgrind" not in info.platform.lower()


def pins_host(info):
    """Whether an engine pins its host buffers (page-locked staging, streamed chunks, exchanged
    rows) unless told: on GPUs, where page-locked memory copies at the bus's speed."""
    return info.type == "GPU"


def registers_host_pages(info):
    """Whether copies naming a host array run by DMA once a ``USE_HOST_PTR`` buffer wraps the
    array (the driver registers its pages): NVIDIA's GPUs (52 GB/s from pageable memory so
    wrapped, against 10–12 without, ``benchmarks/host_pin_contexts.py``). Decided by the
    platform's name, never by the device's."""
    from .device import platform_short
    return info.type == "GPU" and platform_short(info.platform) == "nvidia"


def wrap_host(ctx, array):
    """A ``USE_HOST_PTR`` buffer of ``ctx`` over the host ``array`` (where
    :func:`registers_host_pages`, copies naming the array then run by DMA); the caller
    releases it before ``array`` is freed."""
    import pyopencl as cl
    return cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=array)


def needs_aligned_host(info):
    """Whether the device's runtime reads ``USE_HOST_PTR`` host arrays in place only when they
    are aligned, copying them itself otherwise: Intel's CPU runtime (45–100 ms per 100 MB for
    NumPy's large arrays, which start 16 bytes past a page; 0.01 ms 128-byte aligned). Decided by
    the platform's name, never by the device's (PoCL's device names hold the host CPU's)."""
    return (info.type == "CPU" and "intel" in info.platform.lower()
            and "oclgrind" not in info.platform.lower())


def host_align(info):
    """Where host arrays must start for the device's runtime to read them in place: the bytes
    :data:`HOST_ALIGN` where :func:`needs_aligned_host`, else 0 (any start)."""
    return HOST_ALIGN if needs_aligned_host(info) else 0


def _aligned_empty(nbytes, align, small_pages=True):
    """Uninitialised bytes (a uint8 array) starting at a multiple of ``align``: with
    ``small_pages``, fresh anonymous pages without NumPy's huge-page advice for a large array (a
    huge-page fault may stall for memory compaction: 10 to 250 ms per 100 MB here, against 30 to
    50 ms for small pages faulted by two threads), else NumPy's memory."""
    if (small_pages and nbytes >= _SMALL and align <= mmap.PAGESIZE
            and hasattr(mmap, "MAP_PRIVATE")):
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return np.frombuffer(pages, np.uint8)          # the array keeps the mapping alive
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes]


def aligned_empty(shape, dtype=np.float32, align=mmap.PAGESIZE, small_pages=True):
    """An uninitialised C-contiguous array of ``shape`` and ``dtype`` starting at a multiple of
    ``align`` bytes: host memory any CPU runtime can wrap in place. ``small_pages``: a large
    one in fresh small pages (a copy's destination, :func:`aligned_copy`), else in NumPy's
    memory (huge pages where NumPy advises them: arrays that kernels gather from at random)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64))
    n = max(size * dtype.itemsize, dtype.itemsize)
    raw = _aligned_empty(n, max(1, int(align)), small_pages)
    return raw.view(dtype)[:size].reshape(shape)


def aligned_copy(a, align=HOST_ALIGN, copy=None):
    """A C-contiguous copy of ``a`` (same dtype, shape and values) whose data starts at a
    multiple of ``align`` bytes; ``copy(dst, src)`` copies flat uint8 arrays (default
    ``np.copyto``; the :class:`Uploader` splits it over its threads, which then also share the
    page faults of the new memory, the larger part of the cost)."""
    a = np.asarray(a)
    out = aligned_empty(a.shape, a.dtype, align)   # an empty array keeps an aligned start too
    src = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    (copy or np.copyto)(out.reshape(-1).view(np.uint8), src)
    return out


def common_skew(arrays, align):
    """The bytes ``s`` past a multiple of ``align`` at which every one of ``arrays`` starts,
    when they all do at the same ``s`` and ``s`` is a whole number of their (common) item size;
    else None. Non-contiguous or empty arrays have none."""
    sizes = {a.dtype.itemsize for a in arrays}
    if (not 1 < align <= mmap.PAGESIZE or len(sizes) != 1
            or not all(a.size and a.flags.c_contiguous for a in arrays)):
        return None
    skews = {a.ctypes.data % align for a in arrays}
    if len(skews) != 1:
        return None
    s = skews.pop()
    return s if s % sizes.pop() == 0 else None


def widened(a, skew):
    """A flat uint8 array over the ``skew`` bytes before ``a``'s data and its data (no copy; the
    caller keeps ``a`` alive). Those bytes lie in the page that holds ``a``'s start when ``a``
    starts ``skew`` bytes past a multiple of a power of two up to the page size, so they are
    mapped; the device never reads them."""
    raw = (ctypes.c_uint8 * (a.nbytes + skew)).from_address(a.ctypes.data - skew)
    return np.frombuffer(raw, np.uint8)


def pinned_array(ctx, queue, shape, dtype):
    """``(buffer, array)``: a zeroed page-locked host array of ``shape`` (a mapped
    ``ALLOC_HOST_PTR`` buffer of ``ctx``, mapped on ``queue``; a row at least in each axis);
    the caller unmaps (the array's ``base``) and frees the buffer."""
    import pyopencl as cl
    shape = tuple(max(1, int(x)) for x in shape)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR,
                    size=int(np.prod(shape)) * np.dtype(dtype).itemsize)
    arr, _ev = cl.enqueue_map_buffer(queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                     shape, dtype, is_blocking=True)
    arr[...] = 0
    return buf, arr


class _StagingCache:
    """Mapped pinned staging buffers kept between uploaders: per (context, size), at most
    :data:`STAGES` free ones, for the :data:`_KEPT_CONTEXTS` contexts used last (an older
    context's are freed); a process's own only (a forked child never frees its parent's)."""

    def __init__(self):
        """Nothing kept yet."""
        self._lock = threading.Lock()
        self._free = {}               # (pid, context int_ptr, bytes) → [(buffer, host, queue)]

    def take(self, ctx, nbytes):
        """A kept ``(buffer, mapped uint8 array, queue it was mapped on)`` or None."""
        key = (os.getpid(), ctx.int_ptr, nbytes)
        with self._lock:
            got = self._free.get(key)
            if got:
                self._free[key] = self._free.pop(key)      # latest used last
                return got.pop()
        return None

    def give(self, ctx, nbytes, entry):
        """Keep a free staging buffer (all its copies ended), or free it when enough are."""
        key = (os.getpid(), ctx.int_ptr, nbytes)
        drop = []
        with self._lock:
            kept = self._free.pop(key, [])
            (kept if KEEP_STAGING and len(kept) < STAGES else drop).append(entry)
            self._free[key] = kept
            while len(self._free) > _KEPT_CONTEXTS:
                drop.extend(self._free.pop(next(iter(self._free))))
        for e in drop:
            _free_stage(*e)

    def clear(self):
        """Free every kept buffer (this process's)."""
        with self._lock:
            entries = [e for k, v in self._free.items() if k[0] == os.getpid() for e in v]
            self._free = {}
        for e in entries:
            _free_stage(*e)


def _free_stage(buf, host, queue):
    """Unmap and free one staging buffer (a failure only logged: freeing goes on)."""
    try:
        host.base.release(queue)
        buf.release()
    except Exception as e:  # noqa: BLE001 - e.g. at exit, the runtime already gone
        log.debug("freeing a staging buffer failed (%s)", e)


_staging_cache = _StagingCache()
atexit.register(_staging_cache.clear)


def release_staging():
    """Free the pinned staging buffers kept for later uploads (:data:`KEEP_STAGING`)."""
    _staging_cache.clear()


class Uploader:
    """Creates read-only device buffers holding host arrays (one per :meth:`buffer` call).

    ``in_place=True`` (CPU runtimes) wraps each C-contiguous array with ``USE_HOST_PTR`` (no
    copy; the caller keeps the arrays alive as long as the buffers); with ``align`` (bytes;
    Intel's CPU runtime, :func:`needs_aligned_host`) an array not starting at a multiple of it is
    wrapped from the boundary below it (:meth:`entry_buffers`, a CSR's indices and values
    starting alike) or else first copied, by this uploader's threads, into an aligned one; both
    kinds are kept in :attr:`held` (the caller keeps those alive too). Else each array is copied
    through ``stages`` pinned staging buffers of ``stage_bytes`` (non-blocking copies on the
    in-order ``queue``). :meth:`read` fills host arrays from device buffers the same way back.
    :meth:`finish` waits for every copy and keeps the staging buffers for the next uploader.
    """

    def __init__(self, ctx, queue, in_place, stage_bytes=None, stages=None, threads=None,
                 align=0):
        import pyopencl as cl
        self.cl, self.ctx, self.queue = cl, ctx, queue
        self.in_place = bool(in_place)
        self.stage_bytes = max(4096, int(stage_bytes or STAGE_BYTES)) // 64 * 64
        self.n_stages = max(1, int(stages or STAGES))
        self.threads = max(1, min(_COPY_THREADS, os.cpu_count() or 1) if threads is None
                           else int(threads))
        self._stages = []             # (buffer, mapped uint8 array, event of its last copy)
        self._next = 0
        self._pool = None
        self.bytes = 0                # bytes uploaded (not counting zero-copy wraps)
        self.align = int(align or 0)  # in place: host arrays start at multiples of this
        self.held = []                # aligned copies and arrays wrapped from below, in place
        self.aligned_bytes = 0        # bytes of those copies
        self.skewed_bytes = 0         # bytes wrapped in place from below their start

    def _staging(self):
        """The next staging buffer (allocated and mapped on first use), waiting for its last
        copy to the device to end."""
        cl = self.cl
        k = self._next % self.n_stages
        self._next += 1
        if k == len(self._stages):
            kept = _staging_cache.take(self.ctx, self.stage_bytes)
            if kept is not None:
                buf, host, mapped_on = kept
            else:
                mf = cl.mem_flags
                buf = cl.Buffer(self.ctx, mf.READ_ONLY | mf.ALLOC_HOST_PTR,
                                size=self.stage_bytes)
                host, ev = cl.enqueue_map_buffer(self.queue, buf, cl.map_flags.WRITE, 0,
                                                 (self.stage_bytes,), np.uint8)
                ev.wait()
                mapped_on = self.queue
            self._stages.append([buf, host, None, mapped_on])
        st = self._stages[k]
        if st[2] is not None:
            st[2].wait()
            st[2] = None
        return st

    def _copy(self, dst, src):
        """``dst[:] = src`` (uint8 arrays), split over the copy threads for large chunks (NumPy
        releases the GIL while copying)."""
        n = src.size
        if self.threads == 1 or n < (4 << 20):
            np.copyto(dst, src)
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.threads)
        step = (-(-n // self.threads) + 63) // 64 * 64
        list(self._pool.map(lambda s: np.copyto(dst[s:s + step], src[s:s + step]),
                            range(0, n, step)))

    def buffer(self, a, empty=None):
        """A read-only device buffer holding ``a`` (``empty``, a one-element array, stands for
        an empty ``a``: OpenCL has no empty buffers)."""
        cl = self.cl
        mf = cl.mem_flags
        a = a if a.size else empty
        if self.in_place:
            # zero-copy: the caller keeps the host arrays alive as long as the buffers
            if not a.flags.c_contiguous:
                return cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
            if self.align > 1 and a.ctypes.data % self.align:
                # else the runtime copies it itself (45–100 ms per 100 MB), on this thread
                a = aligned_copy(a, self.align, self._copy)
                self.held.append(a)
                self.aligned_bytes += a.nbytes
            return cl.Buffer(self.ctx, mf.READ_ONLY | mf.USE_HOST_PTR, hostbuf=a)
        a = np.ascontiguousarray(a)
        if a.nbytes < _SMALL or not PINNED:
            self.bytes += a.nbytes
            return cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
        dst = cl.Buffer(self.ctx, mf.READ_ONLY, size=a.nbytes)
        self.write(dst, a)
        return dst

    def entry_buffers(self, arrays, empties):
        """Read-only device buffers holding ``arrays`` (a CSR's indices and values, ``empties``
        standing for empty ones), and the entry offset ``k`` at which each array's first element
        lies in its buffer: the device's row pointers are the host's plus ``k``.

        ``k`` is 0 but where the runtime reads only aligned host arrays in place (``align``) and
        every array starts the same whole number of elements past an alignment boundary, as
        NumPy's large arrays do (16 bytes past a page): then each is wrapped in place from the
        boundary just below its start, and neither the runtime nor this uploader copies it.
        Otherwise each goes through :meth:`buffer` (aligned copies where needed)."""
        cl = self.cl
        skew = common_skew(arrays, self.align) if self.in_place and WRAP_BELOW else None
        if not skew:
            return [self.buffer(a, e) for a, e in zip(arrays, empties)], 0
        self.held.extend(arrays)            # the wrapped memory belongs to them
        flags = cl.mem_flags.READ_ONLY | cl.mem_flags.USE_HOST_PTR
        bufs = [cl.Buffer(self.ctx, flags, hostbuf=widened(a, skew)) for a in arrays]
        self.skewed_bytes += sum(a.nbytes for a in arrays)
        return bufs, skew // arrays[0].dtype.itemsize

    def write(self, dst, a):
        """Copy the host array ``a`` to the start of the device buffer ``dst`` (through the
        staging buffers; directly for small arrays or on CPU runtimes). Call :meth:`finish`
        before ``a`` changes."""
        cl = self.cl
        a = np.ascontiguousarray(a)
        self.bytes += a.nbytes
        if self._direct(a.nbytes):
            cl.enqueue_copy(self.queue, dst, a)
            return
        src = a.reshape(-1).view(np.uint8)
        for off in range(0, src.size, self.stage_bytes):
            n = min(self.stage_bytes, src.size - off)
            st = self._staging()
            self._copy(st[1][:n], src[off:off + n])
            st[2] = cl.enqueue_copy(self.queue, dst, st[1][:n], dst_offset=off,
                                    is_blocking=False)

    def _direct(self, nbytes):
        """Whether ``nbytes`` go straight between host and device, not through the staging
        buffers: on CPU runtimes, for small arrays, or with :data:`PINNED` off."""
        return self.in_place or nbytes < _SMALL or not PINNED

    def read(self, src, out):
        """Fill the host array ``out`` (C-contiguous) from the start of the device buffer
        ``src``: directly for small arrays or on CPU runtimes, else through the staging
        buffers — each chunk's transfer into one (page-locked: at the bus's speed) overlapping
        the copy of the one before out into ``out`` by this uploader's threads (which also
        share the page faults of fresh memory). Blocking."""
        cl = self.cl
        dst = out.reshape(-1).view(np.uint8)
        if self._direct(dst.size):
            cl.enqueue_copy(self.queue, out, src)
            return out
        inflight = collections.deque()    # (stage, offset, bytes): transfers enqueued
        for off in range(0, dst.size, self.stage_bytes):
            if len(inflight) == self.n_stages:
                self._read_out(dst, *inflight.popleft())    # frees the stage used next
            st = self._staging()
            n = min(self.stage_bytes, dst.size - off)
            st[2] = cl.enqueue_copy(self.queue, st[1][:n], src, src_offset=off,
                                    is_blocking=False)
            inflight.append((st, off, n))
        while inflight:
            self._read_out(dst, *inflight.popleft())
        return out

    def _read_out(self, dst, st, off, n):
        """Wait for a chunk's transfer into the stage ``st``, then copy it out to ``dst``."""
        st[2].wait()
        st[2] = None
        self._copy(dst[off:off + n], st[1][:n])

    def finish(self):
        """Wait for every copy, then keep the staging buffers for later uploaders (or unmap
        and free them, :data:`KEEP_STAGING`)."""
        for buf, host, ev, mapped_on in self._stages:
            if ev is not None:
                ev.wait()
            _staging_cache.give(self.ctx, self.stage_bytes, (buf, host, mapped_on))
        self._stages = []
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self.queue.finish()
