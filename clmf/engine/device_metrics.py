"""Metrics of an engine's current factors computed on its device: the squared error on triples
(kept on the device between calls where the memory plan leaves room) and on the training ratings
read from the users' CSR already there."""
from __future__ import annotations

import numpy as np

from . import kernels as K

__all__ = ["squared_error", "cached_squared_error", "train_squared_error"]


def squared_error(eng, key, users, items, ratings, offset=0.0, chunk=1 << 22):
    """``(sum of squared errors, count)`` of the current factors on triples (global row
    numbers, held here). The triples stay on the device under ``key`` for the next call
    when they fit in what the memory plan left free; otherwise they pass through a bounded
    buffer."""
    cl = eng.cl
    q = eng.queue
    n = len(ratings)
    if n == 0:
        return 0.0, 0
    hit = eng.cached_squared_error(key, n, offset)
    if hit is not None:
        return hit, n
    ulo, ilo = eng.frange["users"][0], eng.frange["items"][0]

    def triples(a, z):
        u, i = np.asarray(users[a:a + z]), np.asarray(items[a:a + z])
        return (np.ascontiguousarray(u - ulo if ulo else u, np.int32),
                np.ascontiguousarray(i - ilo if ilo else i, np.int32),
                np.ascontiguousarray(ratings[a:a + z], np.float32))

    free = eng.dplan.budget - eng.dplan.total - sum(
        12 * c[0] for c in eng._metric_bufs.values() if c[0])
    if key is not None and 12 * n + 4 * (n // 128 + 1) <= free // 2:
        bufs = _metric_buffers(eng, n)
        for buf, host in zip(bufs, triples(0, n)):
            cl.enqueue_copy(q, buf, host)
        old = eng._metric_bufs.pop(key, None)
        if old is not None:
            for x in old[1]:
                x.release()
        eng._metric_bufs[key] = (n, bufs)
        return _sq_error(eng, bufs, n, offset), n
    size = min(chunk, n)
    bufs = _metric_buffers(eng, size)
    total = 0.0
    try:
        for a in range(0, n, size):
            z = min(size, n - a)
            for buf, host in zip(bufs, triples(a, z)):
                cl.enqueue_copy(q, buf, host)
            total += _sq_error(eng, bufs, z, offset)
    finally:
        for x in bufs:
            x.release()
    return total, n

def cached_squared_error(eng, key, n, offset=0.0):
    """The sum of squared errors on the ``n`` triples kept under ``key``, or None."""
    hit = eng._metric_bufs.get(key)
    if hit is None or hit[0] != n:
        return None
    return _sq_error(eng, hit[1], n, offset)

def _metrics_program(eng):
    """The metrics program of this fit's row layout."""
    return K.metrics_program(eng.ctx, eng.fs, eng.storage, eng.ldf, biased=eng.biased)

def _sq_error(eng, bufs, n, offset):
    """Run the metrics kernel on ``n`` triples in ``bufs``; the sum (float64 on the host)."""
    q = eng.queue
    g = max(1, -(-n // 128))
    _metrics_program(eng).kernels["sq_error"](
        q, (g * 128,), (128,), *bufs[:3], eng.factors["users"], eng.factors["items"],
        np.int64(n), np.float32(offset + eng.offset), bufs[3])
    part = np.empty(g, np.float32)
    eng.cl.enqueue_copy(q, part, bufs[3])
    return float(part.astype(np.float64).sum())

def _metric_buffers(eng, n):
    """Device buffers for ``n`` triples and their partial sums."""
    mf = eng.cl.mem_flags
    return [eng.cl.Buffer(eng.ctx, mf.READ_ONLY, size=4 * n) for _ in range(3)] + [
        eng.cl.Buffer(eng.ctx, mf.READ_WRITE, size=4 * (n // 128 + 1))]

def train_squared_error(eng):
    """``(sse, count)`` of the current factors on the training ratings: read from the users'
    CSR already on the device where it is resident and whole (nothing uploaded), else from
    their triples (:meth:`squared_error`)."""
    u = eng.side["users"]
    nnz, rows = u.nnz, u.rows
    if not (eng.dplan.sides["users"].resident and eng._whole_factor("users")
            and eng._whole_factor("items")):
        r = np.repeat(np.arange(rows, dtype=np.int32), np.diff(u.indptr))
        return eng.squared_error("train", r, u.indices, u.data)
    wg = 128
    groups = max(1, -(-nnz // wg))                 # a work-item per rating
    if "train_csr" not in eng._metric_bufs:
        eng._metric_bufs["train_csr"] = (0, [eng.cl.Buffer(
            eng.ctx, eng.cl.mem_flags.READ_WRITE, size=4 * groups)])
    bp = eng._metric_bufs["train_csr"][1][0]
    b = eng.buf["users"]
    _metrics_program(eng).kernels["sq_error_csr"](
        eng.queue, (groups * wg,), (wg,), b["indptr"], b["indices"], b["data"],
        eng.factors["users"], eng.factors["items"], np.int32(rows), np.int64(nnz),
        np.float32(eng.offset), bp)
    part = np.empty(groups, np.float32)
    eng.cl.enqueue_copy(eng.queue, part, bp)
    return float(part.astype(np.float64).sum()), nnz
