"""A Dask worker's blocks of a fit from the set-up's pieces of ratings (issue 28): the CSR of
its rows of each side (:class:`BlockSide`), merged from the pieces each partition's split sends
it (:func:`~clmf.parallel.dask_prepare.split`) piece by piece as they come
(:class:`RowMerger`, :class:`_Collector`), or sorted from them where they do not run by row
(:func:`_block`). The tasks that drive this are :mod:`clmf.parallel.dask_tasks`'."""
from __future__ import annotations

import concurrent.futures
import threading
import time

import numpy as np

from . import shared_blocks as shm
from .dask_prepare import gather, merge_threads, stable_order
from .layout import SideLayout
from .worker import SIDES

__all__ = ["BlockSide", "RowMerger"]

MERGE_SPAN_MIN = 1 << 18      # entries of a piece per merging thread, at least


class BlockSide(SideLayout):
    """One side's CSR holding only rows ``[r0, r1)`` (a worker's block), with the global row
    pointers so rows keep their global numbering (``entries`` of other rows is an error)."""

    def __init__(self, indptr, r0, r1, indices, data):
        """The block's rows and entries, the side's global row pointers."""
        super().__init__(indptr, indices, data)
        self.r0, self.r1 = int(r0), int(r1)
        self.base = int(indptr[r0])

    def entries(self, r0, r1):
        """``(indptr rebased to 0, indices, data)`` of rows ``[r0, r1)`` inside the block."""
        if not (self.r0 <= r0 <= r1 <= self.r1):
            raise ValueError(f"rows {r0}..{r1} are outside this worker's block "
                             f"{self.r0}..{self.r1}")
        ip = np.asarray(self.indptr[r0:r1 + 1], dtype=np.int64)
        e0, e1 = int(ip[0]) - self.base, int(ip[-1]) - self.base
        return ip - ip[0], self.indices[e0:e1], self.data[e0:e1]


def _block(pieces, key, indptr, r0, r1, merged=None, threads=1):
    """The CSR of rows ``[r0, r1)`` of one side from the triples sent to this worker (sorted by
    row, then column): pieces that each run by row (:func:`~clmf.parallel.dask_prepare.split`
    sorts them) are merged by writing each piece's rows after the earlier pieces' entries of
    the same rows (no sort; ``merged``: that merge's ``(columns, values)`` made already, as
    the pieces came, :class:`RowMerger`); other pieces are sorted by radix passes over the
    row, and rows whose columns are then out of order by passes over the column and the row
    (as files in no order give); duplicate entries are refused. ``threads``: the threads
    that check the columns' order."""
    k_rows = 0 if key == "users" else 1
    got = sum(len(p[k_rows]) for p in pieces)
    want = int(indptr[r1] - indptr[r0])
    if got != want:
        raise RuntimeError(f"{key} block {r0}..{r1} received {got} ratings, expected "
                           f"{want} (a partition changed between passes over the data?)")
    counts = np.diff(indptr[r0:r1 + 1])
    if merged is None:
        merged = _merge_rows(pieces, k_rows, counts, r0, key, threads)
    if merged is not None:
        cols, r = merged
    else:
        def cat(k, dt):
            """Field ``k`` of every piece, in order."""
            return np.concatenate([p[k] for p in pieces]) if pieces else np.zeros(0, dt)
        rel = cat(k_rows, np.int32) - np.int32(r0)
        cols, r = cat(1 - k_rows, np.int32), cat(2, np.float32)
        if not np.array_equal(np.bincount(rel, minlength=r1 - r0), counts):
            raise _other_rows(key, r0, r1)
        order = stable_order(rel, max(1, r1 - r0))       # by row, keeping the columns' order
        cols, r = gather(order, cols, r)
    if not _in_column_order(cols, indptr[r0 + 1:r1] - indptr[r0], threads):
        # by column, then by row
        rows = np.repeat(np.arange(r0, r1, dtype=np.int32), counts)
        order = stable_order(cols, int(cols.max()) + 1)
        order = order[stable_order(rows[order] - np.int32(r0), max(1, r1 - r0))]
        rows, cols, r = gather(order, rows, cols, r)
        dup = (rows[1:] == rows[:-1]) & (cols[1:] == cols[:-1])
        if dup.any():
            k = int(np.flatnonzero(dup)[0])
            raise ValueError(f"the ratings have {int(dup.sum())} duplicate (user, item) "
                             f"entries (first: {key[:-1]} index {int(rows[k])}, other "
                             f"index {int(cols[k])})")
    return BlockSide(indptr, r0, r1, np.ascontiguousarray(cols, dtype=np.int32),
                     np.ascontiguousarray(r, dtype=np.float32))


def _in_column_order(cols, starts, threads=1):
    """Whether the columns ``cols`` increase within each row (``starts``: where each row but
    the first starts, in order), checked in spans of entries by ``threads`` threads."""
    n = len(cols)
    k = max(1, min(int(threads), n // MERGE_SPAN_MIN))
    cuts = [n * j // k for j in range(k + 1)]

    def span(j):
        """Whether every step into entries ``cuts[j] + 1 .. cuts[j + 1]`` (the last span's:
        to the end) goes up or starts a row."""
        a, b = cuts[j], min(n, cuts[j + 1] + 1)
        down = np.flatnonzero(cols[a + 1:b] <= cols[a:b - 1]) + (a + 1)
        if len(down) > len(starts):
            return False
        at = np.minimum(np.searchsorted(starts, down), max(0, len(starts) - 1))
        return bool(np.array_equal(starts[at], down)) if len(down) else True
    if k == 1:
        return span(0)
    with concurrent.futures.ThreadPoolExecutor(k, thread_name_prefix="clmf-check") as pool:
        return all(pool.map(span, range(k)))


def _other_rows(key, r0, r1):
    """The error of a block whose pieces hold other rows than the counts said."""
    return RuntimeError(f"{key} block {r0}..{r1} received other rows than counted (a "
                        "partition changed between passes over the data?)")


def _merge_rows(pieces, k_rows, counts, r0, key, threads=1):
    """``(columns, values)`` of rows ``r0, r0 + 1, ...`` (``counts`` entries each) by row, each
    row's entries in piece order, from pieces that each run by row (field ``k_rows``): every
    piece's entries written after the earlier pieces' entries of the same rows (a scatter that
    runs forward, no sort, over ``threads`` threads); None when a piece does not run by row
    (:class:`RowMerger`)."""
    merger = RowMerger(counts, r0, k_rows, key, threads)
    for p in pieces:
        if not merger.add(p):
            return None
    return merger.result()


class RowMerger:
    """One side's block of rows ``[r0, r0 + len(counts))`` merged piece by piece, in piece
    order, from pieces that each run by row (field ``k_rows`` of each triple): each piece's
    entries are written after the earlier pieces' entries of the same rows as it comes (a
    forward scatter into arrays of the block's final size, no sort), so a worker merges its
    pieces while the other splits still run (:class:`_Collector`). A large piece is cut at row
    boundaries into spans merged by ``threads`` threads at once (the rows of one span are no
    other span's: the same places as in one thread; NumPy releases the GIL in the ops used)."""

    def __init__(self, counts, r0, k_rows, key, threads=1):
        """A block whose row ``r0 + j`` holds ``counts[j]`` entries."""
        self.counts = np.asarray(counts, np.int64)
        self.r0, self.k_rows, self.key = int(r0), int(k_rows), key
        self.threads = max(1, int(threads))
        span = len(self.counts)
        n = int(self.counts.sum())
        self.cols, self.vals = np.empty(n, np.int32), np.empty(n, np.float32)
        self.at = np.zeros(span, np.int64)               # where each row's next entry goes
        np.cumsum(self.counts[:-1], out=self.at[1:])
        self.end = self.at + self.counts                 # where each row's entries end

    def add(self, piece):
        """Merge ``piece`` after the earlier ones; False (nothing written) when it does not
        run by row. A piece with more entries of a row than counted is refused (an error that
        may come after part of it was written: the merge is then of no use)."""
        rows = piece[self.k_rows]
        n = len(rows)
        if not n:
            return True
        if rows[0] < self.r0 or rows[-1] >= self.r0 + len(self.counts):
            return False
        k = max(1, min(self.threads, n // MERGE_SPAN_MIN))
        if k == 1:
            if not _by_row(rows):
                return False
            self._add_span(piece, 0, n)
            return True
        with concurrent.futures.ThreadPoolExecutor(k, thread_name_prefix="clmf-merge") as pool:
            cuts = [n * j // k for j in range(k + 1)]    # equal spans of entries, checked
            if not all(pool.map(lambda j: _by_row(rows[cuts[j]:cuts[j + 1] + 1]), range(k))):
                return False
            # ... then cut where a row starts: each span holds whole rows
            cuts = sorted({0, n, *(int(np.searchsorted(rows, rows[c])) for c in cuts[1:-1])})
            list(pool.map(lambda j: self._add_span(piece, cuts[j], cuts[j + 1]),
                          range(len(cuts) - 1)))
        return True

    def _add_span(self, piece, e0, e1):
        """Merge entries ``[e0, e1)`` of ``piece`` (whole rows, by row) after the earlier
        pieces' entries of their rows."""
        rows = piece[self.k_rows][e0:e1]
        a, b = int(rows[0]) - self.r0, int(rows[-1]) - self.r0 + 1
        # each row's first entry in the span, and its count (no bincount: it holds the GIL)
        first = np.searchsorted(rows, np.arange(self.r0 + a, self.r0 + b + 1, dtype=rows.dtype))
        c = np.diff(first)
        at = self.at[a:b]
        if bool(np.any(at + c > self.end[a:b])):
            raise _other_rows(self.key, self.r0, self.r0 + len(self.counts))
        cols, vals = piece[1 - self.k_rows][e0:e1], piece[2][e0:e1]
        if np.array_equal((at + c)[:-1], at[1:]):
            # its rows' places follow one another (e.g. whole rows of a file sorted by them):
            # one slice
            d0 = int(at[0])
            self.cols[d0:d0 + len(rows)] = cols
            self.vals[d0:d0 + len(rows)] = vals
        else:
            dest = _places(at, first, c, len(rows))
            self.cols[dest] = cols
            self.vals[dest] = vals
        at += c                          # (the span's rows: no other thread's)

    def result(self):
        """``(columns, values)`` once every piece was added (fewer entries of a row than
        counted are refused)."""
        if not np.array_equal(self.at, self.end):
            raise _other_rows(self.key, self.r0, self.r0 + len(self.counts))
        return self.cols, self.vals


def _by_row(rows):
    """Whether ``rows`` never decrease."""
    return bool(np.all(rows[1:] >= rows[:-1]))


def _places(at, first, c, n):
    """Where each of ``n`` entries sorted by row goes: row ``j``'s ``c[j]`` entries (from
    entry ``first[j]``) to ``at[j]`` on, one after another — a running sum of steps of one,
    jumping at each row's first entry (no ``np.repeat``: it holds the GIL)."""
    rows = np.flatnonzero(c)
    starts, to = first[rows], at[rows]
    steps = np.ones(n, np.int64)
    steps[starts[0]] = to[0]
    steps[starts[1:]] = to[1:] - (to[:-1] + c[rows[:-1]] - 1)
    return np.cumsum(steps, out=steps)


class _Collector:
    """A worker's pieces of its blocks, merged side by side in threads of their own as they
    come (:class:`RowMerger`), each side's pieces in partition order (the order that gives a
    row's entries in the order of the data); a piece that does not run by row, or whose rows
    differ from the counts, turns the merge of its side off: :func:`_block` then builds that
    side from every piece as before (and reports the error). Pieces in shared memory are
    mapped as they come and their segments unlinked at once (the mapping keeps the memory
    until :meth:`close`)."""

    def __init__(self, d, static, n_parts):
        """The merges of worker ``d``'s blocks of a fit (``static``: see
        :func:`~clmf.parallel.dask_tasks.blocks`) from ``n_parts`` partitions' pieces, started
        (in daemon threads: a set-up abandoned before its pieces came never holds the worker's
        exit)."""
        self.n_parts = int(n_parts)
        self.threads = merge_threads(static.get("owners"))     # (in a task: its worker's)
        self.indptr = {}
        self.pieces = {s: [None] * self.n_parts for s in SIDES}
        self.attached = {s: shm.Attached() for s in SIDES}
        self.cond = threading.Condition()
        self.cancelled = False
        self.times = {}
        for s, rows, counts in (("users", static["shape"][0], static["user_counts"]),
                                ("items", static["shape"][1], static["item_counts"])):
            self.indptr[s] = np.zeros(rows + 1, np.int64)
            np.cumsum(counts, out=self.indptr[s][1:])
        self.bounds = {s: tuple(int(x) for x in static["bounds"][s][d:d + 2]) for s in SIDES}
        self.futs = {s: concurrent.futures.Future() for s in SIDES}
        for s in SIDES:
            threading.Thread(target=self._run, args=(s,), daemon=True,
                             name=f"clmf-merge-{s}").start()

    def _run(self, side):
        """:meth:`_merge` of ``side`` into its future."""
        try:
            self.futs[side].set_result(self._merge(side))
        except BaseException as e:   # noqa: BLE001 - the blocks' thread reports it
            self.futs[side].set_exception(e)

    def put(self, p, user_piece, item_piece):
        """Partition ``p``'s pieces arrived."""
        with self.cond:
            self.pieces["users"][p] = ("new", user_piece)
            self.pieces["items"][p] = ("new", item_piece)
            self.cond.notify_all()

    def _next(self, side, p):
        """Piece ``p`` of ``side`` once it arrived, mapped where it is in shared memory."""
        with self.cond:
            while self.pieces[side][p] is None and not self.cancelled:
                self.cond.wait()
            if self.cancelled:
                raise concurrent.futures.CancelledError(f"the {side} blocks' merge")
            _tag, piece = self.pieces[side][p]
        names = shm.segment_names(piece)
        piece = shm.resolve(piece, self.attached[side])
        shm.unlink(names)
        self.pieces[side][p] = ("mapped", piece)
        return piece

    def _merge(self, side):
        """``(pieces, (columns, values) or None)`` of ``side``: every piece merged as it came
        (None: the merge turned off, :func:`_block` builds the side from the pieces)."""
        k_rows = 0 if side == "users" else 1
        r0, r1 = self.bounds[side]
        merger = RowMerger(np.diff(self.indptr[side][r0:r1 + 1]), r0, k_rows, side,
                           self.threads)
        pieces, seconds = [], 0.0
        for p in range(self.n_parts):
            pieces.append(self._next(side, p))
            if merger is None:
                continue
            t = time.perf_counter()
            try:
                if not merger.add(pieces[-1]):
                    merger = None
            except RuntimeError:     # other rows than counted: _block says so
                merger = None
            seconds += time.perf_counter() - t
        self.times[f"merge_{side}"] = seconds
        try:
            return pieces, None if merger is None else merger.result()
        except RuntimeError:
            return pieces, None

    def result(self):
        """``{side: (pieces, merged or None)}`` once every piece is merged."""
        return {s: fu.result() for s, fu in self.futs.items()}

    def close(self):
        """Stop waiting for pieces and unmap them (the blocks are built, or the fit went)."""
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()
        for s, fu in self.futs.items():
            try:
                fu.result()
            except BaseException:    # noqa: BLE001 - cancelled, or reported by the blocks
                pass
            self.attached[s].close()
        for side in SIDES:           # segments of pieces never mapped (a failed set-up)
            shm.unlink(shm.segment_names([x[1] for x in self.pieces[side]
                                          if x is not None and x[0] == "new"]))
