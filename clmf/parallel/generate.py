"""Synthetic ratings built directly as a :class:`~clmf.parallel.layout.Layout`, block by block in
threads, in bounded host memory: the Hugewiki and 4×-Netflix shapes (billions of ratings) in
minutes, for the scaling runs. No COO of the whole set is ever built.

The model is :func:`clmf.data.synthetic`'s (power-law users and items, low rank plus noise,
ratings 1..5), simplified for speed: each user's items are drawn by popularity with an alias
table and duplicates within a row are dropped (a heavy user ends a little below its drawn count),
so the number of ratings is close to, not exactly, the preset's.
"""
from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import time

import numpy as np

from .layout import Layout, SideLayout, transpose_csr

log = logging.getLogger(__name__)

__all__ = ["synthetic_layout", "LARGE_PRESETS"]

def _presets():
    """The shapes: :func:`clmf.data.list_presets` (hugewiki, netflix-4x, netflix, …)."""
    from ..data.generator import list_presets
    return list_presets()


# name: (users, items, ratings) — the synthetic presets (one table, in clmf.data.generator)
LARGE_PRESETS = _presets()

_BLOCK_NNZ = 1 << 24        # ratings per generated block (memory per thread ≈ 24 bytes each)


def _alias(p):
    """Walker alias table of ``p`` (the synthetic generator's own, so both draw alike)."""
    from ..data.generator import alias_table
    return alias_table(p)


def synthetic_layout(preset="hugewiki", fraction=1.0, *, seed=0, threads=None, rank=4,
                     user_exponent=0.6, item_exponent=0.5, progress=None, shape=None, nnz=None):
    """Both layouts of a synthetic ratings set of a preset's shape (scaled by ``fraction``:
    users and ratings scale, items stay — a fraction of Hugewiki is its first users).

    Parameters
    ----------
    preset : one of :data:`LARGE_PRESETS` ("hugewiki": 50,082,604 × 39,780, 3.1·10⁹ ratings;
        "netflix-4x": 1.92M × 71K, 396M; "netflix").
    fraction : share of the users and ratings (0 < fraction ≤ 1 ... any positive number).
    seed : int; threads : worker threads (default: all cores, at most 32).
    progress : optional callable(message) for timestamps (the scaling script prints them).
    shape, nnz : optional ``(users, items)`` and ratings overriding the preset's.

    Returns
    -------
    Layout
    """
    t0 = time.perf_counter()
    if preset not in LARGE_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(LARGE_PRESETS)}")
    if not (fraction > 0 and math.isfinite(fraction)):
        raise ValueError(f"fraction must be a positive number, not {fraction!r}")
    m0, n, z0 = LARGE_PRESETS[preset]
    if shape is not None:
        m0, n = (int(x) for x in shape)
    if nnz is not None:
        z0 = int(nnz)
    m = max(1, int(round(m0 * fraction)))
    total = max(m, int(round(z0 * fraction)))
    threads = int(threads or min(os.cpu_count() or 1, 32))
    say = progress or (lambda msg: log.info("%s", msg))
    root = np.random.SeedSequence(seed)
    s_struct, s_blocks = root.spawn(2)
    rng = np.random.default_rng(s_struct)
    # per-user counts: power law over a random order of users, ≥ 1, ≤ half the items
    w = np.arange(1, m + 1, dtype=np.float64) ** (-user_exponent)
    w = w[rng.permutation(m)]
    w /= w.sum()
    counts = 1 + np.floor(w * (total - m)).astype(np.int64)
    np.minimum(counts, max(1, n // 2), out=counts)
    del w
    pop = np.arange(1, n + 1, dtype=np.float64) ** (-item_exponent)
    pop = pop[rng.permutation(n)]
    pop = 0.95 * pop / pop.sum() + 0.05 / n
    q, alias = _alias(pop.copy())
    fscale = math.sqrt(0.7 / math.sqrt(rank))
    Q = (rng.standard_normal((n, rank), dtype=np.float32) * fscale).astype(np.float32)
    bi = (rng.standard_normal(n, dtype=np.float32) * 0.45).astype(np.float32)
    # blocks of users of about _BLOCK_NNZ drawn ratings
    cum = np.cumsum(counts)
    cuts = np.searchsorted(cum, np.arange(_BLOCK_NNZ, cum[-1], _BLOCK_NNZ), side="left") + 1
    bounds = np.unique(np.r_[0, cuts[cuts < m], m]).astype(np.int64)
    seeds = s_blocks.spawn(len(bounds) - 1)
    say(f"synthetic {preset} × {fraction:g}: {m:,} users × {n:,} items, ~{int(cum[-1]):,} "
        f"ratings in {len(bounds) - 1} blocks on {threads} threads")

    def block(k):
        u0, u1 = int(bounds[k]), int(bounds[k + 1])
        brng = np.random.default_rng(seeds[k])
        c = counts[u0:u1]
        rows = np.repeat(np.arange(u1 - u0, dtype=np.int64), c)
        x = brng.random(rows.size) * n
        j = x.astype(np.int64)
        np.minimum(j, n - 1, out=j)
        x -= j
        items = np.where(x < q[j], j, alias[j])
        del x, j
        keys = rows * n + items
        del rows, items
        keys.sort()
        keep = np.empty(keys.size, bool)
        keep[0] = True
        np.not_equal(keys[1:], keys[:-1], out=keep[1:])
        keys = keys[keep]
        del keep
        r = (keys // n).astype(np.int32)
        it = (keys - r.astype(np.int64) * n).astype(np.int32)
        del keys
        P = (brng.standard_normal((u1 - u0, rank), dtype=np.float32) * fscale)
        bu = brng.standard_normal(u1 - u0, dtype=np.float32) * 0.35
        val = np.empty(it.size, np.float32)
        step = 1 << 20
        for a in range(0, it.size, step):
            rr, ii = r[a:a + step], it[a:a + step]
            v = np.einsum("ij,ij->i", P[rr], Q[ii])
            v += bu[rr] + bi[ii] + np.float32(3.5)
            v += brng.standard_normal(v.size, dtype=np.float32) * np.float32(0.5)
            np.rint(v, out=v)
            np.clip(v, 1, 5, out=v)
            val[a:a + step] = v
        cnt = np.bincount(r, minlength=u1 - u0).astype(np.int64)
        return cnt, it, val

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(block, range(len(bounds) - 1)))
    say(f"blocks drawn ({time.perf_counter() - t0:.1f} s)")
    row_counts = np.concatenate([p[0] for p in parts])
    indptr = np.zeros(m + 1, np.int64)
    np.cumsum(row_counts, out=indptr[1:])
    nnz = int(indptr[-1])
    indices = np.empty(nnz, np.int32)
    data = np.empty(nnz, np.float32)
    offs = np.r_[0, np.cumsum([p[1].size for p in parts])].astype(np.int64)

    def place(k):
        a, b = int(offs[k]), int(offs[k + 1])
        indices[a:b] = parts[k][1]
        data[a:b] = parts[k][2]
        parts[k] = None          # free the block

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(place, range(len(parts))))
    users = SideLayout(indptr, indices, data)
    say(f"users CSR: {nnz:,} ratings ({time.perf_counter() - t0:.1f} s)")
    items = transpose_csr(users, n, threads)
    say(f"items CSR (transpose) done ({time.perf_counter() - t0:.1f} s)")
    return Layout((m, n), users, items)
