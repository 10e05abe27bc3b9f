"""Ranking on the host in NumPy: exact top-N per row, ties by the lower index (the reference the
device top-k is checked against, and its fallback for small calls)."""
from __future__ import annotations

import numpy as np

from .conventions import LIKED_SCORE

__all__ = ["host_rank"]

_CHUNK_BYTES = 64 << 20      # bound on a (users × candidates) score block


def _top_n(S, N):
    """Best-first positions and scores per row of ``S`` (``-inf`` marks excluded entries).

    Returns ``(pos, scores)`` of shape ``(rows, min(N, columns))``; ties are broken by ascending
    position; rows with fewer than N finite scores are padded with position -1 and score -inf.
    """
    b, C = S.shape
    k = min(N, C)
    if k == 0 or b == 0:
        return np.zeros((b, 0), np.int64), np.zeros((b, 0), S.dtype)
    if k < C:
        part = np.argpartition(-S, k - 1, axis=1)[:, :k]
        top = np.take_along_axis(S, part, 1)
        thr = top.min(axis=1)
        # rows where an entry outside the partition ties with the k-th score (or where
        # excluded entries reach the top k) need an exact, tie-aware order
        exact = np.flatnonzero(np.count_nonzero(S >= thr[:, None], axis=1) > k)
    else:
        part = np.broadcast_to(np.arange(C), (b, C)).copy()
        top = S.copy()
        exact = np.zeros(0, np.int64)
    order = np.lexsort((part, -top), axis=-1)
    pos = np.take_along_axis(part, order, 1).astype(np.int64)
    scores = np.take_along_axis(top, order, 1)
    for r in exact:
        o = np.argsort(-S[r], kind="stable")[:k]
        pos[r] = o
        scores[r] = S[r, o]
    bad = ~np.isfinite(scores) & (scores < 0)
    pos[bad] = -1
    scores[bad] = -np.inf
    return pos, scores


def host_rank(Q, F, cand, rows, N, self_ids=None, liked_last=False):
    """Rank candidates ``cand`` of ``F`` for the queries ``Q`` by ``Q·F[cand]ᵀ`` on the host.

    ``rows`` (CSR aligned with ``Q``) marks entries to exclude (``liked_last``: to rank last with
    :data:`LIKED_SCORE`); ``self_ids`` are forced to the top with score 1 (self-similarity).
    """
    n = F.shape[0]
    Fc = F if cand is None else F[cand]
    C = Fc.shape[0]
    if cand is not None:
        posmap = np.full(n, -1, np.int64)
        posmap[cand] = np.arange(C)
    b = Q.shape[0]
    k = min(N, C)
    pos_out = np.full((b, k), -1, np.int64)
    sc_out = np.full((b, k), -np.inf, np.float32)
    chunk = max(1, _CHUNK_BYTES // max(1, 4 * C))
    FcT = np.ascontiguousarray(Fc.T, dtype=np.float32)
    for r0 in range(0, b, chunk):
        r1 = min(b, r0 + chunk)
        S = np.asarray(Q[r0:r1], np.float32) @ FcT
        if rows is not None:
            sub = rows[r0:r1]
            rr = np.repeat(np.arange(r1 - r0), np.diff(sub.indptr))
            cc = sub.indices.astype(np.int64)
            if cand is not None:
                cc = posmap[cc]
                rr, cc = rr[cc >= 0], cc[cc >= 0]
            S[rr, cc] = LIKED_SCORE if liked_last else -np.inf
        forced = None
        if self_ids is not None:
            sid = self_ids[r0:r1]
            sp_ = sid if cand is None else posmap[sid]
            forced = np.flatnonzero(sp_ >= 0)
            forced = (forced, sp_[forced])
            S[forced] = np.inf
        pos, sc = _top_n(S, k)
        if forced is not None:
            sc[np.isposinf(sc)] = 1.0
        if cand is not None:
            pos = np.where(pos >= 0, cand[np.maximum(pos, 0)], -1)
        pos_out[r0:r1] = pos
        sc_out[r0:r1] = sc
    return pos_out, sc_out
