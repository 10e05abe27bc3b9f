"""Host-side layouts of the ratings: both sides as CSR (users: the ratings' CSR, items: its CSC),
int64 row pointers, int32 indices, float32 values — array-likes that may be numpy arrays or
memory maps (only the slices a device needs are read)."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os

import numpy as np
import scipy.sparse as sp

from ..engine.blocks import SideData

__all__ = ["SideLayout", "Layout", "transpose_csr"]


@dataclasses.dataclass
class SideLayout(SideData):
    """CSR of one side held on the host (row r's entries are
    ``indices/data[indptr[r]:indptr[r+1]]``; the arrays may be memory maps); the slicing the
    devices' row blocks need is :class:`SideData`'s (``counts``, ``entries``)."""


@dataclasses.dataclass
class Layout:
    """Both sides of a ratings matrix of ``shape`` (users × items)."""
    shape: tuple
    users: SideLayout
    items: SideLayout

    def __getitem__(self, side):
        return self.users if side == "users" else self.items

    @property
    def nnz(self):
        """Ratings."""
        return self.users.nnz

    @classmethod
    def from_csr(cls, R):
        """Both layouts of a canonical scipy CSR (sorted indices, no duplicates)."""
        R = sp.csr_matrix(R)
        users = SideLayout(R.indptr.astype(np.int64), R.indices.astype(np.int32, copy=False),
                           R.data.astype(np.float32, copy=False))
        items = transpose_csr(users, R.shape[1])
        return cls(tuple(R.shape), users, items)


def transpose_csr(side: SideLayout, n_cols, threads=None):
    """The CSR of the transpose (the other side), built by a counting sort over row blocks run in
    threads (each block writes its own disjoint positions); int64 throughout."""
    rows = side.rows
    nnz = side.nnz
    indptr = np.asarray(side.indptr, dtype=np.int64)
    threads = int(threads or min(os.cpu_count() or 1, 16))
    # blocks of ≤ 2^24 entries (bounded temporaries per thread), per-block column counts ≤ 1 GiB
    parts = max(1, min(max(threads * 2, -(-nnz // (1 << 24))) if nnz else 1,
                       (1 << 27) // max(1, n_cols)))
    bounds = np.searchsorted(indptr, np.linspace(0, nnz, parts + 1).astype(np.int64))
    bounds[0], bounds[-1] = 0, rows
    bounds = np.maximum.accumulate(bounds)

    def count(p):
        e0, e1 = indptr[bounds[p]], indptr[bounds[p + 1]]
        return np.bincount(np.asarray(side.indices[e0:e1]), minlength=n_cols).astype(np.int64)

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        per = list(pool.map(count, range(parts)))
    counts = np.zeros((parts, n_cols), np.int64)
    for p, c in enumerate(per):
        counts[p] = c
    del per
    col_ptr = np.zeros(n_cols + 1, np.int64)
    np.cumsum(counts.sum(axis=0), out=col_ptr[1:])
    # start of block p's entries within each column: col_ptr + counts of earlier blocks
    starts = np.cumsum(counts, axis=0) - counts + col_ptr[:-1][None, :]
    out_idx = np.empty(nnz, np.int32)
    out_val = np.empty(nnz, np.float32)

    def scatter(p):
        r0, r1 = int(bounds[p]), int(bounds[p + 1])
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        cols = np.asarray(side.indices[e0:e1])
        vals = np.asarray(side.data[e0:e1])
        rows_of = np.repeat(np.arange(r0, r1, dtype=np.int32), np.diff(indptr[r0:r1 + 1]))
        order = np.argsort(cols, kind="stable")        # rows ascending within a column
        c_sorted = cols[order]
        # position of each entry: its column's start for this block + rank within the column
        first = np.searchsorted(c_sorted, np.arange(n_cols), side="left")
        rank = np.arange(c_sorted.size, dtype=np.int64) - first[c_sorted]
        pos = starts[p][c_sorted] + rank
        out_idx[pos] = rows_of[order]
        out_val[pos] = vals[order]

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(scatter, range(parts)))
    return SideLayout(col_ptr, out_idx, out_val)
