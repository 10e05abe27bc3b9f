"""Passes over a fit's ratings on the host, split into chunks over a few threads (NumPy and
SciPy's sparse tools release the GIL inside ``bincount``, reductions, copies and format checks):
column counts, the ratings' range and sum, the CSR's canonical-format check.
Chunk results are combined in chunk order, so the results do not depend on the threads."""
from __future__ import annotations

import concurrent.futures
import functools
import os

import numpy as np
import scipy.sparse as sp

__all__ = ["count_columns", "value_range", "value_sum", "all_finite", "shifted_float32",
           "csr_is_canonical", "pairs_increasing", "has_duplicate_pairs", "CHUNK", "THREADS"]

CHUNK = 1 << 20                  # entries per chunk (also avoids whole-array temporaries)
THREADS = 8                      # at most this many threads
_PARALLEL_FROM = 4 * CHUNK       # fewer entries: one thread


@functools.lru_cache(maxsize=1)
def _pool():
    """The shared pool of the scans."""
    return concurrent.futures.ThreadPoolExecutor(_workers(), thread_name_prefix="clmf-scan")


def _workers():
    """Threads of the shared pool."""
    return max(1, min(THREADS, os.cpu_count() or 1))


def _chunks(n):
    """Bounds of the chunks of ``n`` entries."""
    return [(s, min(n, s + CHUNK)) for s in range(0, n, CHUNK)]


def _map(fn, n):
    """``fn(s, e)`` over the chunks of ``n`` entries, in chunk order (threads for many)."""
    bounds = _chunks(n)
    if n < _PARALLEL_FROM or (os.cpu_count() or 1) == 1:
        return [fn(s, e) for s, e in bounds]
    return list(_pool().map(lambda b: fn(*b), bounds))


def count_columns(indices, ncols):
    """Entries per column (int64, length ``ncols``) of a CSR's column ``indices``
    (``np.bincount`` per chunk: no int64 copy of the whole index array)."""
    out = np.zeros(ncols, np.int64)
    for part in _map(lambda s, e: np.bincount(indices[s:e], minlength=ncols), len(indices)):
        out += part
    return out


def value_range(values):
    """``(min, max)`` of a non-empty array (NaN if any value is NaN)."""
    parts = _map(lambda s, e: (values[s:e].min(), values[s:e].max()), len(values))
    lo = np.array([p[0] for p in parts])
    hi = np.array([p[1] for p in parts])
    return lo.min(), hi.max()


def value_sum(values):
    """Sum of an array in float64 (chunk sums added in order)."""
    parts = _map(lambda s, e: np.add.reduce(values[s:e], dtype=np.float64), len(values))
    return float(np.sum(np.array(parts, dtype=np.float64)))


def all_finite(a):
    """Whether every value of the array ``a`` is finite (chunks over the threads: no boolean
    copy of the whole array; a non-contiguous array in one pass)."""
    a = np.asarray(a)
    if not a.flags.c_contiguous:
        return bool(np.isfinite(a).all())
    flat = a.reshape(-1)
    return all(_map(lambda s, e: bool(np.isfinite(flat[s:e]).all()), flat.size))


def shifted_float32(values, shift):
    """``float32(float64(values) + shift)``, chunk by chunk over the threads (no float64 copy
    of the whole array): each value rounded once, as a float64 sum cast to float32 is."""
    out = np.empty(len(values), np.float32)

    def part(s, e):
        """One chunk."""
        np.add(values[s:e], np.float64(shift), out=out[s:e], dtype=np.float64,
               casting="same_kind")
    _map(part, len(values))
    return out


def csr_is_canonical(indptr, indices, data, ncols):
    """Whether a CSR's rows hold strictly increasing column indices (sorted, no duplicates) with
    non-decreasing row pointers: SciPy's ``has_canonical_format`` check on blocks of rows of
    about :data:`CHUNK` entries each (views, nothing copied but each block's row pointers)."""
    rows = len(indptr) - 1
    if rows <= 0:
        return True
    if indptr[0] != 0 or bool(np.any(indptr[1:] < indptr[:-1])):
        return False
    nnz = int(indptr[-1])
    cuts = np.searchsorted(indptr, np.arange(CHUNK, nnz, CHUNK), side="right")
    bounds = np.unique(np.concatenate(([0], np.clip(cuts - 1, 0, rows), [rows])))

    def block(r0, r1):
        a, b = int(indptr[r0]), int(indptr[r1])
        view = sp.csr_matrix((data[a:b], indices[a:b], indptr[r0:r1 + 1] - a),
                             shape=(r1 - r0, ncols), copy=False)
        return bool(view.has_canonical_format)

    pairs = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    if nnz < _PARALLEL_FROM or len(pairs) == 1 or (os.cpu_count() or 1) == 1:
        return all(block(a, b) for a, b in pairs)
    return all(_pool().map(lambda p: block(*p), pairs))


def pairs_increasing(a, b):
    """Whether the pairs ``(a[k], b[k])`` strictly increase (lexicographically), checked chunk
    by chunk over the threads (each chunk with its successor's first pair; once a chunk is out of
    order, the chunks not yet started are skipped)."""
    n = len(a)
    if n < 2:
        return True
    unordered = []

    def part(s, e):
        """Whether one chunk's pairs (and the next pair) increase."""
        if unordered:
            return False
        e = min(n, e + 1)
        da = np.diff(a[s:e].astype(np.int64))
        ok = not (np.any(da < 0) or np.any((da == 0) & (np.diff(b[s:e].astype(np.int64)) <= 0)))
        if not ok:
            unordered.append(s)
        return ok
    return all(_map(part, n - 1))


def has_duplicate_pairs(u, i, n_items):
    """Whether a (user, item) pair repeats, in O(N) without sorting the keys. Pairs already in
    strictly increasing (user, item) or (item, user) order have none (checked over the threads);
    otherwise two stable counting sorts (SciPy's COO → CSR by user with the duplicates kept — or
    the CSR read off directly when the users are already in order —, then CSR → CSC by item)
    put each item's users in ascending order, where a repeated pair shows as two equal
    neighbours."""
    n = len(u)
    if n < 2 or pairs_increasing(u, i) or pairs_increasing(i, u):
        return False
    shape = (int(u.max()) + 1, max(n_items, 1))
    ones = np.ones(n, np.int8)
    if not np.any(np.diff(u) < 0):     # grouped by user already: the CSR needs no scatter
        indptr = np.zeros(shape[0] + 1, np.int64)
        np.cumsum(np.bincount(u, minlength=shape[0]), out=indptr[1:])
        C = sp.csr_matrix((ones, i, indptr), shape=shape, copy=False)
    else:
        C = sp.coo_matrix((ones, (u, i)), shape=shape)
        C.has_canonical_format = True  # tocsr would sum duplicates (sorting every row) otherwise
        C = C.tocsr()
    T = C.tocsc()
    if T.nnz != n:                     # a SciPy that merged duplicates anyway: there were some
        return True
    same = T.indices[1:] == T.indices[:-1]
    bounds = T.indptr[1:-1]
    same[bounds[(bounds > 0) & (bounds < n)] - 1] = False   # across two items' lists
    return bool(same.any())
