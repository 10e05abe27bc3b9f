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
    assert isinstance(enc, pd.RangeIndex)
    np.testing.assert_array_equal(enc.get_indexer(vals), dense.get_indexer(vals))
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
