"""The Dask backend's set-up pieces that run without a cluster (issue 28): the radix ordering,
the split of a partition by owning worker, a worker's block built from its pieces in any order
(duplicates refused) and the id encoder of consecutive integer ids."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from clmf.parallel import dask_prepare as P
from clmf.parallel import dask_tasks as T
from clmf.parallel.dask_backend import _encoder


@pytest.mark.parametrize("span", [1, 200, 60_000, 3_000_000])
def test_stable_order_is_numpys_stable_argsort(span):
    rng = np.random.default_rng(span)
    keys = rng.integers(0, span, 50_000).astype(np.int64)
    np.testing.assert_array_equal(T.stable_order(keys, span), np.argsort(keys, kind="stable"))


def _triples(rng, m=300, n=120, nnz=4_000):
    """Distinct (user, item, rating) triples, shuffled."""
    keys = rng.choice(m * n, nnz, replace=False)
    return ((keys // n).astype(np.int32), (keys % n).astype(np.int32),
            rng.uniform(1, 5, nnz).astype(np.float32), (m, n))


def test_split_gives_each_worker_its_triples_by_row_ties_in_partition_order():
    rng = np.random.default_rng(0)
    u, i, r, (m, n) = _triples(rng)
    u[:5] = -1                                   # unknown ids are dropped
    bu, bi = np.array([0, 100, 250, m]), np.array([0, 60, 60, n])     # (an empty block)
    out = T.split((u, i, r), bu, bi)
    assert len(out) == 2 * 3
    keep = u >= 0
    for k, (key, bounds) in enumerate(((u, bu), (i, bi))):
        for d in range(len(bounds) - 1):
            sel = np.flatnonzero(keep & (key >= bounds[d]) & (key < bounds[d + 1]))
            sel = sel[np.argsort(key[sel], kind="stable")]     # by row, ties as they came
            got = out[(0 if k == 0 else 3) + d]
            for a, b in zip(got, (u[sel], i[sel], r[sel])):
                np.testing.assert_array_equal(a, b)
    # already in row order (a user-sorted partition): the users' pieces are slices of it
    order = np.lexsort((i, u))
    su, si, sr = u[order], i[order], r[order]
    got = T.split((su, si, sr), bu, bi)
    for d in range(3):
        sel = (su >= max(0, bu[d])) & (su < bu[d + 1])
        np.testing.assert_array_equal(got[d][0], su[sel])
        np.testing.assert_array_equal(got[d][2], sr[sel])


@pytest.mark.parametrize("threads", [False, True], ids=["gathers", "threaded-gathers"])
@pytest.mark.parametrize("order", ["shuffled", "by user", "by item"])
@pytest.mark.parametrize("key", ["users", "items"])
def test_block_is_the_csr_of_its_rows_whatever_the_pieces_order(order, key, threads,
                                                                 monkeypatch):
    if threads:
        monkeypatch.setattr(P, "GATHER_THREADS_FROM", 0)
    rng = np.random.default_rng(1)
    u, i, r, (m, n) = _triples(rng)
    if order != "shuffled":
        perm = np.lexsort((i, u)) if order == "by user" else np.lexsort((u, i))
        u, i, r = u[perm], i[perm], r[perm]
    R = sp.csr_matrix((r, (u, i)), shape=(m, n)) if key == "users" else \
        sp.csr_matrix((r, (i, u)), shape=(n, m))
    R.sort_indices()
    r0, r1 = 40, R.shape[0] - 30
    rows = u if key == "users" else i
    sel = (rows >= r0) & (rows < r1)
    cuts = [0, sel.sum() // 3, sel.sum()]
    ut, it, rt = u[sel], i[sel], r[sel]
    pieces = [(ut[a:b], it[a:b], rt[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    B = T._block(pieces, key, R.indptr.astype(np.int64), r0, r1)
    ip, idx, val = B.entries(r0, r1)
    np.testing.assert_array_equal(ip, R.indptr[r0:r1 + 1] - R.indptr[r0])
    np.testing.assert_array_equal(idx, R.indices[R.indptr[r0]:R.indptr[r1]])
    np.testing.assert_array_equal(val, R.data[R.indptr[r0]:R.indptr[r1]])


def test_block_refuses_duplicates_and_missing_ratings():
    u = np.array([0, 1, 0, 1], np.int32)
    i = np.array([2, 0, 2, 1], np.int32)
    r = np.ones(4, np.float32)
    indptr = np.array([0, 2, 4], np.int64)
    with pytest.raises(ValueError, match="1 duplicate .*user index 0, other index 2"):
        T._block([(u, i, r)], "users", indptr, 0, 2)
    with pytest.raises(RuntimeError, match="received 3 ratings, expected 4"):
        T._block([(u[:3], i[:3], r[:3])], "users", indptr, 0, 2)
    # as many ratings as counted, but of other rows (out of order: sorted by the counts)
    with pytest.raises(RuntimeError, match="other rows than counted"):
        T._block([(u[[1, 0, 0, 0]], i, r)], "users", indptr, 0, 2)


def test_encoder_maps_consecutive_integer_ids_by_a_subtraction():
    vals = np.array([12, 10, 15, 11, 99, 9], np.int64)
    dense = pd.Index(np.arange(10, 16))
    enc = _encoder(dense)
    assert isinstance(enc, P.IdRange) and len(enc) == 6
    np.testing.assert_array_equal(enc.codes(vals), dense.get_indexer(vals))
    for other in (pd.Index(["a", "b"]), pd.Index([1.0, 2.0]), pd.Index([1, 2, 4 << 40])):
        assert _encoder(other) is other
    assert isinstance(_encoder(pd.Index([1, 2, 4])), P.IdTable)     # gaps: an array lookup
    # the workers' encoding: the subtraction gives what get_indexer gives, whatever the dtype
    for dt in (np.int32, np.int64, np.uint32, np.uint64):
        v = np.array([12, 10, 15, 11, 99, 9, 0, 16], dt)
        np.testing.assert_array_equal(P._codes(enc, v), dense.get_indexer(v))
    np.testing.assert_array_equal(P._codes(enc, np.array([-3, 10], np.int64)), [-1, 0])
    np.testing.assert_array_equal(P._codes(enc, np.array([10.0, 10.5])), [0, -1])
    np.testing.assert_array_equal(P._codes(enc, np.array(["10", "a"], object)), [-1, -1])


@pytest.mark.parametrize("threads", [False, True], ids=["gathers", "threaded-gathers"])
def test_pieces_through_shared_memory_are_the_split_and_their_reader_unlinks_them(threads,
                                                                                  monkeypatch):
    """On one host the split's pieces go to their owners through shared-memory segments
    (handles instead of 12 bytes a rating through the comms): the same triples, every segment
    unlinked once read (or by the fit's release, probes included)."""
    import os

    from clmf.parallel import shared_blocks as shm
    if threads:
        monkeypatch.setattr(P, "GATHER_THREADS_FROM", 0)
    rng = np.random.default_rng(3)
    u, i, r, (m, n) = _triples(rng)
    bu, bi = np.array([0, m // 2, m]), np.array([0, n // 3, n])
    prefix = T.setup_prefix("clmf-testsetup0")

    def names():
        return sorted(x for x in os.listdir(shm.SHM_DIR) if x.startswith(prefix))
    probes = [T.setup_probe(prefix) for _ in range(2)]
    assert T.setup_check(*probes) and not T.setup_check(probes[0], None)
    by_user = np.lexsort((i, u))                     # the users' side: slices, not gathers
    triples = [np.concatenate([x, x[by_user]]) for x in (u, i, r)]
    triples[0][:len(u)] = np.sort(u)                  # (its users in order: slices)
    triples[0][len(u):] += m                          # distinct ratings, rows past m
    bu = np.array([0, m // 2, m, 2 * m])
    shared = T.split(tuple(triples), bu, bi, prefix=prefix, shared=True)
    plain = T.split(tuple(triples), bu, bi)
    assert all(isinstance(b, shm.SharedBlock) for t in shared for b in t)
    assert len(names()) == 2 + len(plain)            # the probes and one segment a piece
    att = shm.Attached()
    for got, want in zip(shm.resolve(shared, att), plain):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
    att.close()
    shm.unlink(shm.segment_names(shared))           # what the owner does once its blocks are built
    assert len(names()) == 2
    assert T.release("clmf-testsetup0") is False and names() == []


@pytest.mark.parametrize("ids", ["dense", "offset", "gaps", "wide", "negative", "uint64-high",
                                 "strings"])
def test_one_pass_ids_and_counts_match_unique_and_value_counts(ids):
    """The fit's first pass (:func:`~clmf.parallel.dask_prepare.scan` per partition, merged in a
    tree): the distinct ids, sorted, with their counts — a bincount for integers of a modest
    span, hashing otherwise — equal pandas' unique and value counts, whatever the ids; the
    encoder then maps them as the index does."""
    from clmf.parallel.dask_backend import _sorted_index
    rng = np.random.default_rng(7)
    base = rng.integers(0, 500, 6_000)
    vals = {"dense": base.astype(np.int32), "offset": (base + 10_000).astype(np.int64),
            "gaps": (base * 7 + 3).astype(np.int64), "wide": base * (1 << 40),
            "negative": (base - 250).astype(np.int16),
            "uint64-high": base.astype(np.uint64) + np.uint64(2**64 - 1000),
            "strings": np.array([f"u{x}" for x in base], object)}[ids]
    r = rng.uniform(1, 5, len(vals)).astype(np.float32)
    frames = [pd.DataFrame({"user": v, "item": v[::-1], "rating": w})
              for v, w in zip(np.array_split(vals, 5), np.array_split(r, 5))]
    scans = [P.scan(f, ("user", "item", "rating")) for f in frames]
    got = P.merge_scans(P.merge_scans(*scans[:2]), P.merge_scans(*scans[2:]))
    assert (got[0][0] == "bins") == (ids in ("dense", "offset", "gaps", "negative",
                                             "uint64-high"))
    index, counts = _sorted_index(P.ids_and_counts(got[0])[0], "user",
                                  P.ids_and_counts(got[0])[1])
    want = pd.Series(vals).value_counts().sort_index()
    np.testing.assert_array_equal(index, want.index)
    assert index.dtype == pd.Index(vals).dtype
    np.testing.assert_array_equal(counts, want.to_numpy())
    assert got[2] == pytest.approx(float(r.astype(np.float64).sum()), rel=1e-12)
    assert (got[3], got[5]) == (r.min(), r.max()) and got[4] == 0
    enc = _encoder(index)
    probe = np.concatenate([vals[:50], vals[:3] if ids == "strings" else
                            np.array([1], vals.dtype)])
    np.testing.assert_array_equal(P._codes(enc, probe), index.get_indexer(probe))


def test_dense_uint64_ids_above_the_int64_range_are_encoded():
    """Consecutive uint64 ids past 2**63 (hashed ids) are found, not an OverflowError."""
    index = pd.Index(np.arange(5, dtype=np.uint64) + np.uint64(2**63 + 10))
    vals = np.array([2**63 + 12, 3, 2**63 + 10, 2**64 - 1], np.uint64)
    np.testing.assert_array_equal(P._codes(_encoder(index), vals), [2, -1, 0, -1])
    dense = pd.RangeIndex(10, 20)           # a RangeIndex probed with such ids
    np.testing.assert_array_equal(P._codes(dense, vals), [-1, -1, -1, -1])


def test_block_merges_pieces_that_each_run_by_row():
    """Pieces sorted by row (what the split sends) interleaving rows, their columns out of
    order across pieces: the block is the CSR of its rows; a piece with other rows than
    counted is refused."""
    rng = np.random.default_rng(5)
    u, i, r, (m, n) = _triples(rng, nnz=6_000)
    R = sp.csr_matrix((r, (i, u)), shape=(n, m))
    R.sort_indices()
    parts = np.array_split(rng.permutation(len(u)), 4)     # partitions in no order
    pieces = []
    r0, r1 = 10, n - 5
    for p in parts:
        sel = p[(i[p] >= r0) & (i[p] < r1)]
        sel = sel[np.argsort(i[sel], kind="stable")]
        pieces.append((u[sel], i[sel], r[sel]))
    indptr = R.indptr.astype(np.int64)
    B = T._block(pieces, "items", indptr, r0, r1)
    ip, idx, val = B.entries(r0, r1)
    np.testing.assert_array_equal(ip, R.indptr[r0:r1 + 1] - R.indptr[r0])
    np.testing.assert_array_equal(idx, R.indices[R.indptr[r0]:R.indptr[r1]])
    np.testing.assert_array_equal(val, R.data[R.indptr[r0]:R.indptr[r1]])
    bad = [(p[0], np.where(p[1] == r0, r0 + 1, p[1]), p[2]) for p in pieces]
    with pytest.raises(RuntimeError, match="other rows than counted"):
        T._block(bad, "items", indptr, r0, r1)


def _parquet_dir(tmp_path, files=3, rows=50, **extra):
    """``files`` parquet files of (user, item, rating) triples in a folder (plus ``extra``
    columns), and the frame they hold."""
    rng = np.random.default_rng(1)
    df = pd.DataFrame({"user": rng.integers(0, 40, files * rows).astype(np.int64),
                       "item": rng.integers(7, 30, files * rows).astype(np.int32),
                       "rating": rng.uniform(1, 5, files * rows).astype(np.float32), **extra})
    folder = tmp_path / "ratings"
    folder.mkdir(parents=True)
    for k in range(files):
        df.iloc[k * rows:(k + 1) * rows].to_parquet(folder / f"part-{k * 5}.parquet")
    (folder / "_SUCCESS").write_text("")           # not a parquet file: skipped, as dask does
    return folder, df


def test_parquet_files_the_workers_read_themselves(tmp_path):
    dd = pytest.importorskip("dask.dataframe")
    from clmf.parallel.dask_backend import _parquet_files
    folder, df = _parquet_dir(tmp_path)
    cols = ("user", "item", "rating")
    names, _opts = _parquet_files(str(folder), cols, 2)
    assert [p.rsplit("/", 1)[1] for p in names] == [f"part-{k}.parquet" for k in (0, 5, 10)]
    assert _parquet_files(dd.read_parquet(str(folder)), cols, 3)[0] == names
    # anything that changes the rows (or fewer files than workers) goes through dask
    assert _parquet_files(dd.read_parquet(str(folder), filters=[("user", ">", 3)]), cols,
                          2) is None
    assert _parquet_files(dd.read_parquet(str(folder)).repartition(npartitions=2), cols,
                          2) is None
    assert _parquet_files(str(folder), cols, 4) is None
    assert _parquet_files(str(folder / "part-*.parquet"), cols, 2) is None
    assert _parquet_files(str(folder), ("user", "item", "stars"), 2) is None
    texts, _ = _parquet_dir(tmp_path / "t", user_name=["a"] * 150)
    assert _parquet_files(str(texts), ("user_name", "item", "rating"), 2) is None
    # what the workers read: the columns of each file, scanned as the pandas frame would be
    got = [P.read_parquet_file(p, cols) for p in names]
    assert all(hasattr(t, "column_names") for t in got)
    whole = P.merge_scans(*[P.scan(t, cols) for t in got])
    ref = P.scan(df, cols)
    for a, b in zip(whole[:2], ref[:2]):
        np.testing.assert_array_equal(P.ids_and_counts(a)[0], P.ids_and_counts(b)[0])
        np.testing.assert_array_equal(P.ids_and_counts(a)[1], P.ids_and_counts(b)[1])
    assert whole[2] == pytest.approx(ref[2]) and whole[3:] == ref[3:]
    enc = P.encode(got[0], cols, None, None)
    np.testing.assert_array_equal(enc[0], df["user"].to_numpy()[:50])
    np.testing.assert_array_equal(enc[2], df["rating"].to_numpy()[:50])


def test_parquet_file_with_missing_ids_reads_as_pandas_refused_later(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    pd.DataFrame({"user": [1.0, None], "item": [2, 3], "rating": [4.0, 5.0]}).to_parquet(
        folder / "a.parquet")
    got = P.read_parquet_file(str(folder / "a.parquet"), ("user", "item", "rating"))
    assert isinstance(got, pd.DataFrame) and got["user"].isna().sum() == 1


def test_a_fresh_worker_reads_scans_and_encodes_parquet_without_dask_dataframe_or_pandas(tmp_path):
    import subprocess
    import sys
    folder, _df = _parquet_dir(tmp_path)
    code = ("import sys; from clmf.parallel import dask_prepare as P; "
            f"t = P.read_parquet_file({str(folder / 'part-5.parquet')!r}, "
            "('user', 'item', 'rating')); P.scan(t, ('user', 'item', 'rating')); "
            "P.encode(t, ('user', 'item', 'rating'), P.IdRange(0, 40), P.IdRange(7, 30)); "
            "print(sorted(m for m in ('pandas', 'dask.dataframe') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_arrow_columns_of_several_chunks_read_from_their_buffers():
    pa = pytest.importorskip("pyarrow")
    vals = np.arange(30, dtype=np.int64) * 7 - 50
    col = pa.chunked_array([pa.array(vals[:10]), pa.array(vals[10:10]),
                            pa.array(vals[5:30]).slice(5)], pa.int64())  # (empty, an offset)
    table = pa.table({"user": col, "rating": col.cast(pa.float32()),
                      "when": pa.chunked_array([pa.array([1] * 30).cast(pa.bool_())])})
    np.testing.assert_array_equal(P._values(table, "user"), vals)
    np.testing.assert_array_equal(P._values(table, "rating", np.float64),
                                  vals.astype(np.float32))
    assert P._values(table, "when").dtype == bool          # other types: pyarrow's to_numpy


def _collected(pieces_by_part, static, order, d=0, shared_prefix=None):
    """Worker ``d``'s :class:`~clmf.parallel.dask_tasks._Collector` fed the partitions'
    ``(users piece, items piece)`` in ``order`` (through shared memory with a prefix), then
    its blocks built: ``(Layout, collector times)``."""
    from clmf.parallel import shared_blocks as shm
    col = T._Collector(d, static, len(pieces_by_part))
    for p in order:
        up, ip = pieces_by_part[p]
        if shared_prefix is not None:
            up, ip = (shm.share_arrays(shared_prefix, [(len(x), x.dtype) for x in t],
                                       lambda v, t=t: [np.copyto(a, b) for a, b in zip(v, t)])
                      for t in (up, ip))
        col.put(p, up, ip)
    layout, _start, times = T._blocks("clmf-test-collect", d, static, col)
    return layout, times


@pytest.mark.parametrize("shared", [False, True], ids=["arrays", "shared-memory"])
@pytest.mark.parametrize("order", ["in order", "reversed"])
def test_pieces_merged_as_they_come_give_the_block_of_all_pieces(order, shared):
    """A worker merges each partition's pieces as its split ends (:class:`_Collector`, in
    partition order whatever order they come in): the same CSR blocks as built from every
    piece at once, the merge timed, shared segments unlinked once mapped."""
    import os

    from clmf.parallel import shared_blocks as shm
    rng = np.random.default_rng(11)
    u, i, r, (m, n) = _triples(rng, nnz=6_000)
    bu, bi = np.array([0, 120, m]), np.array([0, 50, n])
    parts = np.array_split(rng.permutation(len(u)), 5)
    by_part = [P.split((u[p], i[p], r[p]), bu, bi) for p in parts]
    static = {"shape": (m, n), "user_counts": np.bincount(u, minlength=m),
              "item_counts": np.bincount(i, minlength=n),
              "bounds": {"users": bu, "items": bi}, "start": None,
              "devices": [("cpu", 0), ("cpu", 1)]}
    prefix = "clmf-test-collect-set-up" if shared else None
    for d in range(2):
        pieces = [(t[d], t[2 + d]) for t in by_part]
        seq = range(5) if order == "in order" else range(4, -1, -1)
        layout, times = _collected(pieces, static, seq, d, prefix)
        assert times["merge_users"] >= 0 and times["merge_items"] >= 0
        for key, k, b in (("users", 0, bu), ("items", 1, bi)):
            R = (sp.csr_matrix((r, (u, i)), shape=(m, n)) if key == "users"
                 else sp.csr_matrix((r, (i, u)), shape=(n, m)))
            R.sort_indices()
            want = T._block([pc[k] for pc in pieces], key, R.indptr.astype(np.int64),
                            b[d], b[d + 1])
            for a, w in zip(layout[key].entries(b[d], b[d + 1]),
                            want.entries(b[d], b[d + 1])):
                np.testing.assert_array_equal(a, w)
            ip, idx, _ = layout[key].entries(b[d], b[d + 1])
            np.testing.assert_array_equal(idx, R.indices[R.indptr[b[d]]:R.indptr[b[d + 1]]])
    if shared:
        assert not [x for x in os.listdir(shm.SHM_DIR) if x.startswith(prefix)]


def test_collector_falls_back_and_reports_pieces_of_other_rows():
    """A piece that does not run by row turns the merge of its side off (the block is still
    right); pieces of other rows than counted are reported as :func:`_block` reports them;
    a collector closed before its pieces came stops waiting."""
    rng = np.random.default_rng(12)
    u, i, r, (m, n) = _triples(rng, nnz=3_000)
    bu, bi = np.array([0, m]), np.array([0, n])
    parts = np.array_split(np.arange(len(u)), 3)
    static = {"shape": (m, n), "user_counts": np.bincount(u, minlength=m),
              "item_counts": np.bincount(i, minlength=n),
              "bounds": {"users": bu, "items": bi}, "start": None, "devices": [("cpu", 0)]}
    pieces = [tuple(P.split((u[p], i[p], r[p]), bu, bi)) for p in parts]
    shuffled = list(pieces)
    perm = rng.permutation(len(parts[1]))                # partition 1's users out of row order
    shuffled[1] = (tuple(x[perm] for x in pieces[1][0]), pieces[1][1])
    layout, _ = _collected(shuffled, static, range(3))
    R = sp.csr_matrix((r, (u, i)), shape=(m, n))
    R.sort_indices()
    np.testing.assert_array_equal(layout.users.entries(0, m)[1], R.indices)
    bad = list(pieces)
    iu, ii, ir = pieces[2][1]                            # item 0's ratings moved to item 1
    bad[2] = (pieces[2][0], (iu, np.maximum(ii, 1), ir))
    with pytest.raises(RuntimeError, match="other rows than counted"):
        _collected(bad, static, range(3))
    col = T._Collector(0, static, 3)
    col.put(0, *pieces[0])
    col.close()                                          # pieces 1 and 2 never come
    with pytest.raises(Exception):                       # noqa: B017 - cancelled
        col.result()
    T.take("clmf-test-late", 0, static, 3, 0, *pieces[0])     # a collector made, waiting
    assert "clmf-test-late" in T._MERGING
    T.release("clmf-test-late")                          # stops it; pieces that come late:
    assert "clmf-test-late" not in T._MERGING            # an error, not a collector for ever
    with pytest.raises(RuntimeError, match="clmf-test-late was released"):
        T.take("clmf-test-late", 0, static, 3, 1, *pieces[1])
