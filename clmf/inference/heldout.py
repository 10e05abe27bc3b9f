"""A fit's validation precision on the device: for every held-out (user, item) pair, whether the
item is in the user's top ``K`` (training items left out), counted against the item's own score
instead of ranking every item (``cl_kernels/heldout.cl.j2``).

A held-out item ``h`` of user ``q`` is in the top ``K`` exactly when fewer than ``K`` unseen
items other than ``h`` rank above it (a higher score, or an equal one and a lower index: the
order of :meth:`clmf.ALS.recommend`). Each call packs the items on the device into blocks of
``BLOCK`` items, factor-major (one vector per factor of a block), in about descending norm (the
previous call's norms; as many blocks as its longest scan reached, with a margin: later ones
are scored from the rows of Y), each block with a bound on its items' scores (its largest norm,
with an allowance for float32 rounding). A work-item takes ``GROUP`` users and scans the blocks for
those that need them, ``TILE`` users per block at once; a pair stops as soon as ``K`` items rank
above ``h`` (a miss: most pairs, after a few dozen items), and a user stops where no later block
can reach its pairs left (``‖q‖·max bound < s_h``: a hit, after the items whose norm can reach
``s_h``), so the precision is the one a full ranking of the same float32 scores gives (any block
order does; a good one stops early). Scores within float32 rounding of each other (computed in
another order: the device top-k, the host's BLAS) may be ordered the other way by
:func:`clmf.evaluate`; nothing else differs.

On a single-device fit the kernels read the engine's factor buffers where they are; one wait
per call brings back one count per pair, the item norms (the next call's block order) and each
user's scan length (the next call's grouping of users that scan about as far).
"""
from __future__ import annotations

import functools
import logging

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["HeldoutCounter", "FitValidation"]

MAX_PAIRS = 4         # held-out pairs of one user scanned for at once (a chunk)
GROUP = 8             # chunks a work-item scans the items for, block by block
TILE = 4              # chunks scored at once per block (registers: TILE · VECS accumulators)
SEEN_BITS = 7         # a user's seen items in a hash set of 2**SEEN_BITS slots (≤ half full)
LANES, VECS = 16, 2   # a block of the packed copy: VECS float16 vectors per factor
BLOCK = LANES * VECS  # items per block
# work-items per work-group: one on a CPU, so that its threads share the unequal work-items
# out (with none given, PoCL makes e.g. 471 work-items one work-group: one thread); a warp else
LOCAL = {"CPU": 1}
LOCAL_OTHER = 32
# blocks packed: as far as the last call's longest scan went, a quarter more and at least 8 more
# (later blocks are scored from the rows of Y: exact, slower; the copy's writes are the cost)
PACK_AHEAD, PACK_MIN_AHEAD = 0.25, 8


@functools.lru_cache(maxsize=32)
def _source(f, ldq, ldy, storage):
    """OpenCL C source of the held-out program for f factors, row strides and storage."""
    from ..engine import kernels
    return kernels.render("heldout.cl.j2", f=f, ldq=ldq, ldy=ldy, storage=storage,
                          maxp=MAX_PAIRS, group=GROUP, tile=TILE, lanes=LANES, vecs=VECS,
                          seen_slots=2 ** SEEN_BITS, seen_bits=SEEN_BITS,
                          config_str=f"heldout f={f} ldq={ldq} ldy={ldy} {storage}")


def _descending(keys):
    """Indices ordering non-negative float32 ``keys`` from largest to about smallest (by their
    top 16 bits: 7 bits of mantissa; NaN first), stable: a radix sort, ~0.2 ms for 20k keys."""
    top = (np.ascontiguousarray(keys, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.argsort(~top, kind="stable").astype(np.int32)


class HeldoutCounter:
    """Strict precision@``K`` of held-out items (``hits / (K · users with held-out items)``),
    for new factors at each call, on one OpenCL device.

    Built once per validation set: the pairs, the training items of their users and the output
    are uploaded here. Each call takes the factors as device buffers (an engine's, with their
    row strides and storage) or as host arrays (uploaded into buffers kept between calls).

    Parameters
    ----------
    test : canonical CSR (users × items) of held-out items (every stored entry is relevant)
    seen : canonical CSR of the same shape, items never recommended (the training matrix), or None
    K : list length
    device : pyopencl.Device
    """

    def __init__(self, test, seen, K, device):
        """Prepare and upload the pairs and the seen items."""
        import pyopencl as cl

        from ..engine.device import get_context, type_name
        self.cl = cl
        self.K = int(K)
        self.device = device
        self.ctx, self.queue = get_context(device)
        self.local = min(LOCAL.get(type_name(device), LOCAL_OTHER), device.max_work_group_size)
        self.shape = test.shape
        m, self.n = test.shape
        counts = np.diff(test.indptr)
        self.users = np.flatnonzero(counts > 0)
        user = np.repeat(np.arange(m, dtype=np.int64), counts)
        item = test.indices.astype(np.int64)
        if seen is not None:
            seen_ptr = seen.indptr.astype(np.int64)
            seen_idx = seen.indices.astype(np.int32)
            # a held-out item the user has seen is never recommended: never a hit (the keys of
            # canonical CSRs are sorted)
            key_seen = np.repeat(np.arange(m, dtype=np.int64), np.diff(seen.indptr)) * self.n
            key_seen += seen_idx
            key = user * self.n + item
            at = np.minimum(np.searchsorted(key_seen, key), max(0, key_seen.size - 1))
            keep = key_seen[at] != key if key_seen.size else np.ones(key.size, bool)
            user, item = user[keep], item[keep]
        else:
            seen_ptr, seen_idx = np.zeros(m + 1, np.int64), np.zeros(1, np.int32)
        self.pair_user, self.pair_item = user.astype(np.int32), item.astype(np.int32)
        self.npairs = int(self.pair_user.size)
        # chunks of at most MAX_PAIRS pairs of one user (the pairs are in user order)
        first = np.r_[True, self.pair_user[1:] != self.pair_user[:-1]] if self.npairs else \
            np.zeros(0, bool)
        start = np.maximum.accumulate(np.where(first, np.arange(self.npairs), 0))
        cut = first | ((np.arange(self.npairs) - start) % MAX_PAIRS == 0)
        bounds = np.r_[np.flatnonzero(cut), self.npairs].astype(np.int32)
        self.nchunks = int(bounds.size - 1)
        self._buf = {k: self._upload(a) for k, a in (
            ("chunk_user", self.pair_user[bounds[:-1]] if self.nchunks else np.zeros(1, np.int32)),
            ("chunk_start", bounds), ("pair_item", self.pair_item if self.npairs else
                                       np.zeros(1, np.int32)),
            ("seen_ptr", seen_ptr), ("seen_idx", seen_idx if seen_idx.size else
                                      np.zeros(1, np.int32)))}
        mf = cl.mem_flags
        n1 = max(1, self.n)
        self._buf["out"] = cl.Buffer(self.ctx, mf.WRITE_ONLY, size=4 * max(1, self.npairs))
        nb = max(1, -(-self.n // BLOCK))
        for k, size in (("norms", n1), ("bnd", nb), ("smax", nb), ("next", 1)):
            self._buf[k] = cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * size)
        self._buf["order"] = cl.Buffer(self.ctx, mf.READ_ONLY, size=4 * n1)
        self._packed = None            # (buffer, f) of the items' packed copy, by blocks
        self._order = None             # the items in about descending norm (the last call's)
        self._npack = None             # blocks to pack (None: all)
        self._buf["perm"] = cl.Buffer(self.ctx, mf.READ_ONLY, size=4 * max(1, self.nchunks))
        self._buf["steps"] = cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * max(1, self.nchunks))
        # the chunks by the blocks they scanned last time (longest first), so that a work-item's
        # chunks scan about as far; by user at first
        self._perm = np.arange(self.nchunks, dtype=np.int32)
        self._pending = []             # non-blocking uploads in flight (kept with their arrays)
        self._host_factors = {}        # side → (buffer, rows) of factors uploaded from the host

    def _upload(self, a):
        """A read-only device copy of ``a``."""
        mf = self.cl.mem_flags
        a = np.ascontiguousarray(a)
        return self.cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)

    def _factor_buffer(self, side, A):
        """``A`` (rows × f, float32) in a device buffer kept for ``side`` and rewritten."""
        A = np.ascontiguousarray(A, np.float32)
        hit = self._host_factors.get(side)
        if hit is None or hit[1] != A.shape:
            hit = self._host_factors[side] = (self.cl.Buffer(
                self.ctx, self.cl.mem_flags.READ_ONLY, size=max(4, A.nbytes)), A.shape)
        if A.size:
            self.cl.enqueue_copy(self.queue, hit[0], A)
        return hit[0]

    def precision(self, X=None, Y=None, *, buffers=None):
        """Strict precision@``K`` for user factors ``X`` and item factors ``Y``: host arrays, or
        ``buffers=(X_buffer, Y_buffer, f, ldq, ldy, storage)`` already on the device (written by
        commands on this device's queue)."""
        if self.users.size == 0:
            return float("nan")
        if buffers is None:
            f = int(Y.shape[1])
            buffers = (self._factor_buffer("users", X), self._factor_buffer("items", Y), f, f, f,
                       "float32")
        Xb, Yb, f, ldq, ldy, storage = buffers
        per_user = np.zeros(self.shape[0], np.int64)       # hits of each user
        if self.npairs:
            hit = self._counts(Xb, Yb, int(f), int(ldq), int(ldy), storage) < self.K
            per_user += np.bincount(self.pair_user[hit], minlength=self.shape[0])
        # as clmf.metrics.ranking_metrics computes it (the same rounding)
        return float(np.mean(per_user[self.users] / self.K))

    def _counts(self, Xb, Yb, f, ldq, ldy, storage):
        """Run the kernels: per pair, the unseen items ranked above its item (capped at K).

        The items are packed in blocks in the order of the previous call's norms (at the first
        call, of a pass in index order): any order gives the same counts, one close to
        descending norm lets a user stop early; as many blocks as the previous call's longest
        scan reached and a margin (all at the first call; the kernel scores later blocks from
        Y's rows). One wait per call: for the counts, the norms (the next call's order) and
        each chunk's scan length (the next call's grouping and packing extent)."""
        from ..engine import kernels
        cl, q, b = self.cl, self.queue, self._buf
        prog = kernels.build(self.ctx, _source(f, ldq, ldy, storage))
        n, nb = self.n, -(-self.n // BLOCK)
        npack = np.int32(nb if self._npack is None else min(nb, self._npack))
        if self._packed is None or self._packed[1] != f:
            self._packed = (cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE,
                                      size=4 * f * BLOCK * nb), f)
        S = self._packed[0]
        norms = np.empty(n, np.float32)

        def pack(blocks):
            """Pack the first ``blocks`` blocks of the items in ``self._order`` (uploaded first);
            the norms and bounds of all."""
            self._send(b["order"], self._order)
            self._launch(prog.kernels["pack_items"], nb, Yb, b["order"], np.int32(n), blocks,
                         S, b["norms"], b["bnd"])

        if self._order is None:               # no norms yet: those in index order, sorted
            self._order = np.arange(n, dtype=np.int32)
            pack(np.int32(0))
            cl.enqueue_copy(q, norms, b["norms"])
            self._order = _descending(norms)
        pack(npack)
        prog.kernels["suffix_max"](q, (1,), None, b["bnd"], np.int32(nb), b["smax"], b["next"])
        self._send(b["perm"], self._perm)
        # one work-item per group of chunks, each taking groups from the counter b["next"]
        self._launch(prog.kernels["heldout_count"], -(-self.nchunks // GROUP), Xb, Yb, S,
                     b["order"], b["bnd"], b["smax"], b["perm"], b["chunk_user"],
                     b["chunk_start"], b["pair_item"], b["seen_ptr"], b["seen_idx"],
                     np.int32(self.nchunks), np.int32(n), npack, np.int32(self.K), b["out"],
                     b["steps"], b["next"])
        out = np.empty(self.npairs, np.int32)
        steps = np.empty(self.nchunks, np.int32)
        # (a pyopencl event of a non-blocking copy waits when it is dropped: kept till the end)
        reads = [cl.enqueue_copy(q, norms, b["norms"], is_blocking=False),
                 cl.enqueue_copy(q, steps, b["steps"], is_blocking=False)]
        cl.enqueue_copy(q, out, b["out"])
        reads.clear()
        self._pending.clear()                 # (the queue is in order: all done)
        self._order = self._order[_descending(norms[self._order])]
        self._perm = self._perm[_descending(steps[self._perm].astype(np.float32))]
        longest = int(steps.max()) if steps.size else nb
        self._npack = longest + max(PACK_MIN_AHEAD, int(PACK_AHEAD * longest))
        return out

    def _launch(self, kernel, items, *args):
        """Enqueue ``kernel`` over ``items`` work-items (rounded up to whole work-groups)."""
        return kernel(self.queue, (-(-items // self.local) * self.local,), (self.local,), *args)

    def _send(self, buf, a):
        """Upload ``a`` into ``buf`` without waiting (kept alive until the next wait)."""
        self._pending.append((self.cl.enqueue_copy(self.queue, buf, a, is_blocking=False), a))


class FitValidation:
    """A fit's implicit-feedback validation metric (strict precision@``K`` of held-out items),
    built once per fit: counted by a :class:`HeldoutCounter` on ``device``, reading a single
    engine's factor buffers in place (same device) or the downloaded factors (several devices);
    ranked by a :class:`~clmf.inference.evaluation.RankingEvaluator` on the host where no device
    counts (none given, ``CLMF_INFERENCE=host``, or a device that fails: never breaks a fit)."""

    def __init__(self, validation, train, K, device=None):
        """Canonical held-out and seen CSRs of ``validation`` and ``train``; the counter."""
        from . import topk
        from .evaluation import _csr
        self.test, self.seen = _csr(validation, "validation"), _csr(train, "train")
        self.K = int(K)
        self.counter, self._ranker = None, None
        if device is not None and topk.device_path_enabled():
            try:
                self.counter = HeldoutCounter(self.test, self.seen, self.K, device)
            except Exception as e:
                self._fail(e)

    def _fail(self, e):
        """Log a device failure; the host ranks from now on."""
        log.warning("validation counts failed on the device (%s: %s); ranking on the host",
                    type(e).__name__, e)
        self.counter = None

    def precision(self, engine, f):
        """The metric of ``engine``'s current factors (``f`` factors per row)."""
        if self.counter is not None:
            try:
                dev = self.counter.device
                if (getattr(engine, "factors", None) is not None and hasattr(engine, "ldf")
                        and getattr(engine, "device", None) is not None
                        and engine.device.int_ptr == dev.int_ptr):
                    return self.counter.precision(buffers=(
                        engine.factors["users"], engine.factors["items"], f, engine.ldf,
                        engine.ldf, engine.storage))
                return self.counter.precision(engine.get_factors("users"),
                                              engine.get_factors("items"))
            except Exception as e:
                self._fail(e)
        if self._ranker is None:
            from .evaluation import RankingEvaluator
            self._ranker = RankingEvaluator(self.test, self.seen, self.K)
        return self._ranker.strict_precision(engine.get_factors("users"),
                                             engine.get_factors("items"))
