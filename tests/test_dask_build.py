"""A Dask worker's set-up after its splits (issue 28): the merge of its pieces over threads
(:class:`RowMerger` cut at row boundaries gives the one-thread merge's arrays, a row's entries
in piece order; the threads a worker merges with, :func:`merge_threads`) and its start factors
(laid out ahead, uploaded through pinned staging: the drawn factors, bit for bit)."""
from __future__ import annotations

import numpy as np
import pytest

from clmf.parallel import dask_blocks as B
from clmf.parallel import dask_prepare as P


def _pieces(rng, r0, rows, sizes, k_rows=1):
    """Pieces sorted by row (field ``k_rows``) of rows ``[r0, r0 + rows)`` with ``sizes``
    entries: long runs of a few rows (a row over several threads' equal spans), rows split
    across pieces, empty pieces where a size is 0."""
    out = []
    for n in sizes:
        hot = rng.integers(r0, r0 + rows, 3)                 # a few rows with many entries
        r = np.where(rng.random(n) < 0.5, rng.choice(hot, n), rng.integers(r0, r0 + rows, n))
        r = np.sort(r).astype(np.int32)
        cols = rng.integers(0, 1 << 20, n).astype(np.int32)
        vals = rng.random(n, dtype=np.float32)
        out.append((r, cols, vals) if k_rows == 0 else (cols, r, vals))
    return out


def _merged(pieces, r0, rows, k_rows, threads):
    """``(columns, values)`` of the pieces merged by a :class:`RowMerger` of ``threads``."""
    counts = sum(np.bincount(p[k_rows] - r0, minlength=rows) for p in pieces)
    m = B.RowMerger(counts, r0, k_rows, "items", threads)
    for p in pieces:
        assert m.add(p)
    return m.result()


@pytest.mark.parametrize("k_rows", [0, 1], ids=["users", "items"])
@pytest.mark.parametrize("threads", [2, 3, 7])
def test_threaded_merge_is_the_one_thread_merge(k_rows, threads, monkeypatch):
    """Pieces cut over threads at row boundaries (rows spanning the equal cuts, a piece of one
    row, empty pieces, rows in several pieces) give the one-thread arrays, which are the
    entries stably sorted by row (each row's in piece order)."""
    monkeypatch.setattr(B, "MERGE_SPAN_MIN", 8)
    rng = np.random.default_rng(threads + 10 * k_rows)
    r0, rows = 1_000, 300
    pieces = _pieces(rng, r0, rows, [5_000, 0, 1, 4_000, 0, 3_000], k_rows)
    pieces.append(tuple(np.full(700, x[0], x.dtype) if j == k_rows else np.resize(x, 700)
                        for j, x in enumerate(pieces[0])))               # a piece of one row
    one = _merged(pieces, r0, rows, k_rows, 1)
    many = _merged(pieces, r0, rows, k_rows, threads)
    for a, b in zip(one, many):
        np.testing.assert_array_equal(a, b)
    rows_all = np.concatenate([p[k_rows] for p in pieces])
    order = np.argsort(rows_all, kind="stable")
    np.testing.assert_array_equal(one[0], np.concatenate([p[1 - k_rows] for p in pieces])[order])
    np.testing.assert_array_equal(one[1], np.concatenate([p[2] for p in pieces])[order])


@pytest.mark.parametrize("threads", [1, 4])
def test_whole_rows_go_in_one_slice_and_gaps_by_places(threads, monkeypatch):
    """Pieces of whole rows of a row-sorted file (the slice path) and of rows interleaved
    with the other pieces' (the scatter path) both land where the one-thread merge puts
    them."""
    monkeypatch.setattr(B, "MERGE_SPAN_MIN", 4)
    rng = np.random.default_rng(5)
    r = np.sort(rng.integers(0, 50, 2_000)).astype(np.int32)
    cut = int(np.searchsorted(r, 25))
    data = (r, rng.integers(0, 99, 2_000).astype(np.int32), rng.random(2_000, np.float32))
    pieces = [tuple(x[:cut] for x in data), tuple(x[cut:] for x in data)]   # whole rows
    pieces += _pieces(rng, 0, 50, [900, 1_300], 0)                          # interleaved
    got = _merged(pieces, 0, 50, 0, threads)
    order = np.argsort(np.concatenate([p[0] for p in pieces]), kind="stable")
    np.testing.assert_array_equal(got[0], np.concatenate([p[1] for p in pieces])[order])


def test_threaded_merge_refuses_pieces_out_of_row_order_and_other_rows(monkeypatch):
    """A piece whose only step back lies where two threads' equal spans meet is refused
    (False, nothing merged); one with more entries of a row than counted is an error."""
    monkeypatch.setattr(B, "MERGE_SPAN_MIN", 4)
    r = np.repeat(np.arange(8, dtype=np.int32), 4)             # 32 entries, by row
    r[16], r[15] = r[15], r[16] + 1                            # a step back at entry 16
    piece = (r, np.arange(32, dtype=np.int32), np.ones(32, np.float32))
    counts = np.bincount(r, minlength=8)
    m = B.RowMerger(counts, 0, 0, "users", threads=2)
    assert not m.add(piece)
    assert np.array_equal(m.at, np.concatenate(([0], np.cumsum(counts)[:-1])))
    good = np.repeat(np.arange(8, dtype=np.int32), 4)
    m = B.RowMerger(np.full(8, 3), 0, 0, "users", threads=2)  # 3 counted, 4 come
    with pytest.raises(RuntimeError, match="other rows than counted"):
        m.add((good, np.arange(32, dtype=np.int32), np.ones(32, np.float32)))


def test_merge_threads_share_the_hosts_cores_among_its_workers(monkeypatch):
    """Half a worker's share of its host's cores (the two sides merge at once), at most
    :data:`MERGE_THREADS_MAX`; the variable sets it; one outside a worker."""
    monkeypatch.delenv(P.ENV_MERGE_THREADS, raising=False)
    monkeypatch.delenv(P.ENV_SPLIT_THREADS, raising=False)
    assert P.merge_threads(None) == 1                          # not in a Dask worker
    monkeypatch.setattr(P, "_address", lambda: "tcp://10.0.0.1:4001")
    owners = [f"tcp://10.0.0.1:{4001 + k}" for k in range(4)] + ["tcp://10.0.0.2:4001"]
    for cores, merge, split in ((64, 8, 4), (16, 2, 4), (2, 1, 1), (200, 8, 4)):
        monkeypatch.setattr(P.os, "sched_getaffinity", lambda _pid, c=cores: range(c))
        assert (P.merge_threads(owners), P.split_threads(owners)) == (merge, split)
    monkeypatch.setenv(P.ENV_MERGE_THREADS, "3")
    assert P.merge_threads(owners) == 3


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "pinned-staging"])
@pytest.mark.parametrize("biased", [False, True], ids=["plain", "biased"])
def test_start_factors_laid_out_ahead_and_uploaded_are_the_drawn_ones(one_device, staged,
                                                                      biased, monkeypatch):
    """The start factors drawn over threads (as a worker's warm-up draws them) are the
    one-thread draw's; laid out ahead (:func:`padded_start`) and uploaded through several
    staging chunks (:func:`upload_start`), the device holds the padded rows the pageable
    write held (every row of a side, or a part of one)."""
    import concurrent.futures
    from types import SimpleNamespace

    import pyopencl as cl

    from clmf import reference as ref
    from clmf.engine import upload as U
    from clmf.engine.device import device_info, get_context
    from clmf.engine.factors import padded_factors
    from clmf.parallel import dask_start as S
    m, n, f, ldf = 3_000, 700, 5, 8
    monkeypatch.setattr(ref, "_DRAW_THREADS", 3)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    monkeypatch.setattr(ref, "_DRAW_PARALLEL_FROM", 1 << 60)
    one = ref.start_factors(m, n, f, 7)
    monkeypatch.setattr(ref, "_DRAW_PARALLEL_FROM", 0)
    start = ref.start_factors(m, n, f, 7)
    for a, b in zip(one, start):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setattr(U, "_SMALL", 0)
    monkeypatch.setattr(U, "STAGE_BYTES", 4096)                 # many chunks
    monkeypatch.setattr(U, "zero_copy", lambda info: not staged)
    warm = concurrent.futures.Future()
    warm.set_result((start, {}))
    setup = {"f": f, "ldf": ldf, "store": np.float32, "biased": biased}
    hosts, seconds = S.padded_start(warm, setup)
    assert seconds >= 0
    ctx, q = get_context(one_device)
    frange = {"users": (0, m), "items": (200, 450)}            # every user, a part of the items
    bufs = {s: cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=4 * ldf * (hi - lo))
            for s, (lo, hi) in frange.items()}
    w = SimpleNamespace(ctx=ctx, queue=q, info=device_info(one_device), frange=frange,
                        factors=bufs)
    S.upload_start(w, hosts)
    for side, M in zip(("users", "items"), one):
        lo, hi = frange[side]
        got = np.empty((hi - lo, ldf), np.float32)
        cl.enqueue_copy(q, got, bufs[side])
        want = padded_factors(side, M, len(M), f, ldf, np.float32, biased)[lo:hi]
        np.testing.assert_array_equal(got, want)
    warm = concurrent.futures.Future()
    warm.set_result((None, {}))
    assert S.padded_start(warm, setup) == (None, 0.0)          # the fit does not draw them


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_column_order_check_over_threads_is_the_one_pass_check(threads, monkeypatch):
    """:func:`_in_column_order` in spans of entries (a step down where spans meet, inside a
    row or at a row's start; empty rows, one row, no entries) says what one pass says."""
    monkeypatch.setattr(B, "MERGE_SPAN_MIN", 4)
    rng = np.random.default_rng(threads)

    def one_pass(cols, counts):
        """The check as one array of row starts."""
        starts = np.cumsum(counts)[:-1]
        brk = np.zeros(len(cols), bool)
        brk[starts[starts < len(cols)]] = True
        return bool(np.all((cols[1:] > cols[:-1]) | brk[1:]))
    for trial in range(60):
        counts = rng.integers(0, 6, rng.integers(1, 30))
        counts[rng.random(len(counts)) < 0.2] = 0                  # empty rows
        cols = np.concatenate([np.sort(rng.choice(50, c, replace=False)) for c in counts]
                              ).astype(np.int32)
        if trial % 3 and len(cols) > 1:                            # a step down somewhere
            k = int(rng.integers(1, len(cols)))
            cols[k] = cols[k - 1] - trial % 2
        starts = np.cumsum(counts)[:-1]
        assert B._in_column_order(cols, starts, threads) == one_pass(cols, counts)


@pytest.mark.parametrize("slots", [1, 3])
def test_scan_leaves_the_pool_where_the_host_has_cores(slots, monkeypatch):
    """A partition's scan runs out of the worker's pool (``distributed.secede``: the worker
    reads its next partition meanwhile) where the splits would (slots > 1), in the worker's
    thread otherwise; the result is the same."""
    import distributed
    import pandas as pd
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"user": rng.integers(0, 50, 400),
                       "item": rng.integers(7, 90, 400),
                       "rating": rng.random(400).astype(np.float32)})
    want = P.scan(df, ("user", "item", "rating"), 0.5)
    seceded = []
    monkeypatch.setattr(P, "split_threads", lambda owners: slots)
    monkeypatch.setattr(distributed, "secede", lambda: seceded.append(1))
    monkeypatch.setattr(P, "_SPLIT_SLOTS", [])
    got = P.scan(df, ("user", "item", "rating"), 0.5, owners=("tcp://h:1", "tcp://h:2"))
    assert len(seceded) == (1 if slots > 1 else 0)
    for a, b in zip(got, want):
        if isinstance(a, tuple):
            assert all(np.array_equal(x, y) for x, y in zip(a, b))
        else:
            assert a == b
