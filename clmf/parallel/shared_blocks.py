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

import dataclasses
import errno
import logging
import mmap
import os
import secrets

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["SharedBlock", "Segments", "Attached", "enabled", "probe_create", "probe_check",
           "resolve", "unlink_fit", "share_arrays", "segment_names", "unlink", "switched_off",
           "OFF_WORDS"]

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
