"""Ranking from the factors and seen items kept on the model's devices (issue 29): results
identical to NumPy brute force on every OpenCL device, the seen-items cache and its
invalidation, multi-device models, catalogs larger than a tile, pickling and refits."""
import copy
import pickle
import threading

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DEVICES, model_of

import clmf
from clmf.inference import resident
from clmf.inference import topk as T


def make_model(X, Y, device, **attrs):
    """An ALS holding the given factors (no fit)."""
    return model_of(X, Y, device, global_mean=0.5, **attrs)


def brute(X, Y, seen=None, N=10, cand=None, bu=None, bi=None, mu=0.0, row0=0):
    """NumPy top-N: score descending, then the lower item; seen rows (indexed from ``row0``)
    and non-candidates left out; -1 / -inf padding."""
    S = (X.astype(np.float64) @ Y.T.astype(np.float64))
    if bi is not None:
        S = S + bi[None, :]
    if seen is not None:
        rows = seen[row0:row0 + X.shape[0]].tocoo()
        S[rows.row, rows.col] = -np.inf
    if cand is not None:
        keep = np.zeros(Y.shape[0], bool)
        keep[cand] = True
        S[:, ~keep] = -np.inf
    k = min(N, Y.shape[0] if cand is None else len(cand))
    order = np.lexsort((np.broadcast_to(np.arange(Y.shape[0]), S.shape), -S), axis=-1)[:, :k]
    sc = np.take_along_axis(S, order, 1)
    ids = np.where(np.isfinite(sc), order, -1)
    if bu is not None:
        sc = sc + mu + bu[:, None]
    return ids, np.where(np.isfinite(sc), sc, -np.inf).astype(np.float32)


def problem(m=700, n=300, f=6, density=0.05, seed=0):
    """Small-integer factors (exact float32 scores, frequent ties) and a seen CSR."""
    rng = np.random.default_rng(seed)
    X = rng.integers(-3, 4, (m, f)).astype(np.float32)
    Y = rng.integers(-3, 4, (n, f)).astype(np.float32)
    R = sp.random(m, n, density=density, random_state=seed + 1, format="csr", dtype=np.float32)
    return X, Y, R


def check(got, want):
    """Ids and scores identical."""
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def check_close(got, want):
    """Float factors: scores equal to rounding (the device sums in another order), ids equal
    except where neighbouring scores are that close."""
    ids, sc = got
    want_ids, want_sc = want
    np.testing.assert_allclose(sc, want_sc, rtol=1e-5, atol=1e-6)
    close = np.zeros_like(ids, bool)
    close[:, 1:] |= np.isclose(want_sc[:, 1:], want_sc[:, :-1], rtol=1e-5)
    close[:, :-1] |= close[:, 1:]
    assert np.array_equal(ids[~close], want_ids[~close])


@pytest.mark.parametrize("biased", [False, True], ids=["plain", "biased"])
def test_public_calls_match_brute_force(cl_device, biased):
    X, Y, R = problem()
    rng = np.random.default_rng(5)
    kw = {}
    bu = bi = None
    if biased:
        bu = rng.integers(-2, 3, X.shape[0]).astype(np.float32)
        bi = rng.integers(-2, 3, Y.shape[0]).astype(np.float32)
        kw = {"user_biases_": bu, "item_biases_": bi}
    m = make_model(X, Y, cl_device, **kw)
    b = {"bu": bu, "bi": bi, "mu": 0.5} if biased else {}
    with T.inference_options(device=cl_device, min_work=0):
        check(m.recommend_all(10, user_items=R), brute(X, Y, R, **b))
        assert "resident" in m._topk_cache
        # a range of users: R indexed by id, then row-aligned
        check(m.recommend(np.arange(100, 400), R, N=10),
              brute(X[100:400], Y, R, row0=100, **({**b, "bu": bu[100:400]} if biased else b)))
        sub = R[100:400]
        check(m.recommend(np.arange(100, 400), sub, N=10),
              brute(X[100:400], Y, sub, **({**b, "bu": bu[100:400]} if biased else b)))
        # no filter, and candidates
        check(m.recommend(np.arange(700), N=10, filter_already_liked_items=False),
              brute(X, Y, None, **b))
        cand = np.setdiff1d(np.arange(300), np.arange(0, 300, 3))
        check(m.recommend_all(10, user_items=R, filter_items=np.arange(0, 300, 3)),
              brute(X, Y, R, cand=cand, **b))


def test_implicit_model_matches_brute_force(cl_device):
    X, Y, R = problem(m=400, n=200)
    R.data[:] = 1.0
    m = clmf.ALS(factors=4, iterations=2, feedback="implicit", device=cl_device,
                 random_state=0).fit(R, show_progress=False)
    Xf, Yf = m.user_factors_, m.item_factors_
    with T.inference_options(device=cl_device, min_work=0):
        ids, sc = m.recommend_all(10, user_items=R)
        ids2, sc2 = m.recommend(np.arange(400), R, N=10)
    check_close((ids, sc), brute(Xf, Yf, R))
    check((ids2, sc2), (ids, sc))


def test_fit_keeps_the_factors_on_the_device(cl_device):
    X, Y, R = problem(m=300, n=150)
    R.data = np.ceil(R.data * 5)
    m = clmf.ALS(factors=4, iterations=2, device=cl_device, random_state=0).fit(
        R, show_progress=False)
    res = m._topk_cache["resident"][1]
    assert res.first.device.int_ptr == cl_device.int_ptr
    with T.inference_options(device=cl_device, min_work=0):
        m.recommend_all(5, user_items=R)
        assert m._topk_cache["resident"][1] is res          # no upload per call
        m.recommend(np.arange(300), R, N=5)
        assert m._topk_cache["resident"][1] is res
    m.fit(R[::-1], show_progress=False)                      # a refit: new factors, new upload
    assert m._topk_cache["resident"][1] is not res
    with T.inference_options(device=cl_device, min_work=0):
        check_close(m.recommend_all(5, user_items=R),
                    brute(m.user_factors_, m.item_factors_, R, 5))


@pytest.mark.parametrize("feedback,f", [("explicit", 8), ("implicit", 8), ("explicit", 10)])
def test_fit_hands_its_factor_buffers_to_the_ranker(cl_device, monkeypatch, feedback, f):
    """A one-device fit gives its factor buffers to the ranker instead of an upload: kept where
    the layouts agree (rows of f values), else copied on the device into the ranker's padded
    rows and freed; the rankings are brute force's either way."""
    from clmf.engine import factors as FA
    handed = []
    real = FA.hand_over

    def spy(eng):
        got = real(eng)
        handed.append(got)
        return got
    monkeypatch.setattr(FA, "hand_over", spy)
    padded = []
    real_pad = T.DeviceTopK._pad
    monkeypatch.setattr(T.DeviceTopK, "_pad", lambda self, M: padded.append(M.shape) or
                        real_pad(self, M))
    X, Y, R = problem(m=300, n=150)
    R.data = np.ceil(R.data * 5)
    m = clmf.ALS(factors=f, iterations=2, device=cl_device, random_state=0,
                 feedback=feedback).fit(R, show_progress=False)
    assert len(handed) == 1 and handed[0] is not None
    h = handed[0]
    res = m._topk_cache["resident"][1]
    assert all(x.taken for x in h.values())                 # kept, or freed: never left over
    kept = res.first.factors_buf is h["items"].buffer
    assert kept == (h["items"].ld == f == res.first.ldf and not res.first.config.yt)
    assert (res.first._queries[0] is h["users"].buffer) == (h["users"].ld == f == res.first.ldf)
    # no host padding (an upload) of the users, nor of the items but in the transposed layout
    assert padded == ([] if not res.first.config.yt else padded) and (300, f) not in padded
    with T.inference_options(device=cl_device, min_work=0):
        check_close(m.recommend_all(5, user_items=R),
                    brute(m.user_factors_, m.item_factors_, R, 5))


def test_early_stopped_fit_keeps_no_later_buffers(cl_device, monkeypatch):
    """With early stopping the kept factors may be an earlier iteration's: then the fit's
    buffers (the last iteration's) are not handed to the ranker."""
    from clmf.model import trainer
    calls = []
    monkeypatch.setattr(trainer, "_hand_over", lambda eng: calls.append(eng))
    X, Y, R = problem(m=300, n=150)
    R.data = np.ceil(R.data * 5)
    V = R.copy()
    V.data = 6 - V.data                  # worse as the fit gets better: iteration 0 is kept
    m = clmf.ALS(factors=4, iterations=6, device=cl_device, random_state=0)
    m.fit(R, validation=V, early_stopping_rounds=1, show_progress=False)
    assert m.best_iteration_ < len(m.history_) - 1 and not calls
    m.fit(R, validation=R, early_stopping_rounds=1, show_progress=False)
    assert m.best_iteration_ == len(m.history_) - 1 and len(calls) == 1


def counted_preparations(monkeypatch):
    """A list that records each preparation of a seen-items matrix (its CSR)."""
    calls = []
    real = resident.seen_positions

    def counting(M, candidates, n):
        calls.append(M)
        return real(M, candidates, n)
    monkeypatch.setattr(resident, "seen_positions", counting)
    return calls


def fitted(R, device, **kw):
    """A small explicit ALS fitted on ``R`` (no bar)."""
    return clmf.ALS(factors=4, iterations=2, device=device, random_state=0, **kw).fit(
        R, show_progress=False)


def test_fit_prepares_the_training_seen_items(cl_device, monkeypatch):
    _, _, R = problem(m=300, n=150)
    R.data = np.ceil(R.data * 5)
    calls = counted_preparations(monkeypatch)
    with T.inference_options(device=cl_device, min_work=0):
        m = fitted(R, cl_device)
        assert len(calls) == 1                               # during the fit
        assert not any(t.name == "clmf-seen-items" for t in threading.enumerate())
        res = m._topk_cache["resident"][1]
        seen = res.seen
        assert seen is not None and all(p["seen"][0] is seen for p in res.parts)
        want = brute(m.user_factors_, m.item_factors_, R, 5)
        check_close(m.recommend_all(5, user_items=R), want)
        check_close(m.recommend(np.arange(300), R, N=5), want)
        assert len(calls) == 1 and res.seen is seen          # nothing prepared again
        # a different matrix (same content) is prepared on use
        check_close(m.recommend_all(5, user_items=R.copy()), want)
        assert len(calls) == 2

        # the fitted matrix changed in place after the fit: detected on the first call
        m = fitted(R, cl_device)
        assert len(calls) == 3
        top = brute(m.user_factors_, m.item_factors_, R, 5)[0]
        lo, hi = R.indptr[5], R.indptr[6]
        assert hi > lo
        R.indices[lo] = top[5, 0]
        R.indices[lo:hi].sort()
        got = m.recommend_all(5, user_items=R)
        check_close(got, brute(m.user_factors_, m.item_factors_, R, 5))
        assert top[5, 0] not in got[0][5]
        assert len(calls) == 4


def test_fit_skips_seen_items_that_do_not_upload(cl_device, monkeypatch):
    _, _, R = problem(m=300, n=150)
    R.data = np.ceil(R.data * 5)

    def refuse(self, *a, **kw):
        raise clmf.errors.DeviceMemoryError("too large")
    with T.inference_options(device=cl_device, min_work=0):
        with monkeypatch.context() as mp:
            mp.setattr(T.DeviceTopK, "upload_exclude", refuse)
            m = fitted(R, cl_device)
        res = m._topk_cache["resident"][1]
        assert res.seen is None and all(p["seen"] is None for p in res.parts)
        assert not getattr(m, "_topk_disabled", False)       # the device path is kept
        check_close(m.recommend_all(5, user_items=R),
                    brute(m.user_factors_, m.item_factors_, R, 5))
        assert res.seen is not None


def test_interrupted_fit_leaves_no_preparation(cl_device):
    _, _, R = problem(m=300, n=150)
    R.data = np.ceil(R.data * 5)
    with T.inference_options(device=cl_device, min_work=0):
        m = fitted(R, cl_device)
        X0 = m.user_factors_

        def stop(*_):
            raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            m.fit(R[::-1], show_progress=False, callback=stop)
        assert not any(t.name == "clmf-seen-items" for t in threading.enumerate())
        assert m.user_factors_ is X0                         # the fitted model as it was
        check_close(m.recommend_all(5, user_items=R), brute(X0, m.item_factors_, R, 5))


def test_seen_items_prepared_once_and_invalidated(cl_device):
    X, Y, R = problem()
    m = make_model(X, Y, cl_device)
    with T.inference_options(device=cl_device, min_work=0):
        m.recommend_all(10, user_items=R)
        res = m._topk_cache["resident"][1]
        seen = res.seen
        m.recommend_all(10, user_items=R)
        m.recommend(np.arange(700), R, N=10)
        assert res.seen is seen                              # the same matrix: no new upload
        # a different matrix with the same content is prepared anew, results unchanged
        R2 = R.copy()
        check(m.recommend_all(10, user_items=R2), brute(X, Y, R2))
        assert res.seen is not seen
        # in place, nnz unchanged: an index rewritten (a top item of user 5 becomes seen)
        top = m.recommend_all(10, user_items=R2)[0]
        lo, hi = R2.indptr[5], R2.indptr[6]
        assert hi > lo
        R2.indices[lo] = top[5, 0]
        R2.indices[lo:hi].sort()
        got = m.recommend_all(10, user_items=R2)
        check(got, brute(X, Y, R2))
        assert top[5, 0] not in got[0][5]
        # in place, a new entry (SciPy reallocates: nnz and buffers change)
        item = int(got[0][7, 0])
        R2[7, item] = 1.0
        got = m.recommend_all(10, user_items=R2)
        check(got, brute(X, Y, R2))
        assert item not in got[0][7]
        # in place, entries removed (nnz changes, the buffers stay)
        R2.data[R2.indptr[9]:R2.indptr[10]] = 0
        R2.eliminate_zeros()
        check(m.recommend_all(10, user_items=R2), brute(X, Y, R2))
        # the range path sees the same rule
        R2.indices[R2.indptr[150]] = int(m.recommend(150, R2, N=1)[0][0])
        R2.indices[R2.indptr[150]:R2.indptr[151]].sort()
        check(m.recommend(np.arange(100, 400), R2, N=10),
              brute(X[100:400], Y, R2, row0=100))


def test_fingerprint_rule():
    _, _, R = problem()
    s = resident.SeenItems(R, R.shape[1])
    assert s.same(R, 0, None) and s.same_content(R)
    assert not s.same(R, 1, None) and not s.same(R, 0, np.arange(5))
    assert not s.same(R.copy(), 0, None)                     # another object
    R.indices[3] = (R.indices[3] + 1) % R.shape[1]           # content only
    assert s.same(R, 0, None) and not s.same_content(R)
    R.indptr[2] += 0                                         # untouched: still the same
    assert s.same(R, 0, None)
    with pytest.raises(ValueError, match="columns"):
        resident.SeenItems(R[:, :10], R.shape[1])
    assert resident.contiguous_range(np.arange(3, 9)) == (3, 9)
    assert resident.contiguous_range(np.array([3, 5])) is None
    assert resident.contiguous_range(np.array([], np.int64)) is None
    assert resident.split_rows(10, [2, 2, 1]) == [(0, 4), (4, 8), (8, 10)]


def test_wrong_rows_refused(cl_device):
    X, Y, R = problem()
    m = make_model(X, Y, cl_device)
    with T.inference_options(device=cl_device, min_work=0):
        with pytest.raises(ValueError, match="rows"):
            m.recommend(np.arange(600, 700), R[:650], N=5)
        with pytest.raises(ValueError, match="columns"):
            m.recommend_all(5, user_items=R[:, :100])


@pytest.mark.skipif(len(DEVICES) < 2, reason="needs two OpenCL devices")
def test_multi_device_model_splits_users():
    X, Y, R = problem()
    m = make_model(X, Y, list(DEVICES[:2]))
    with T.inference_options(min_work=0):
        check(m.recommend_all(10, user_items=R), brute(X, Y, R))
        check(m.recommend(np.arange(200, 600), R, N=10), brute(X[200:600], Y, R, row0=200))
        res = m._topk_cache["resident"][1]
        assert len(res.parts) == 2
        assert res.parts[0]["rows"][1] == res.parts[1]["rows"][0]


@pytest.mark.skipif(len(DEVICES) < 2, reason="needs two OpenCL devices")
def test_multi_device_streams_batches():
    """Several devices hand over their batches as they finish: recommend_all places them by
    user, iter_recommend_all keeps user order, a consumer that stops early stops the devices'
    threads, and each device's split of the call is reported."""
    X, Y, R = problem()
    m = make_model(X, Y, list(DEVICES[:2]))
    want = brute(X, Y, R)
    with T.inference_options(min_work=0):
        check(m.recommend_all(10, user_items=R, batch_size=64), want)
        got = list(m.iter_recommend_all(10, user_items=R, batch_size=64))
        assert len(got) >= 4                             # two batches per device at least
        assert np.array_equal(np.concatenate([u for u, _i, _s in got]), np.arange(700))
        check((np.concatenate([i for _u, i, _s in got]), np.concatenate([s for *_, s in got])),
              want)
        res = m._topk_cache["resident"][1]
        split = res.split_summary()
        assert [d["users"] for d in split["devices"]] == [list(p["rows"]) for p in res.parts]
        for d in split["devices"]:
            assert d["rows"] == d["users"][1] - d["users"][0] and d["batches"] >= 2
            assert 0 <= d["thread_start_s"] <= d["thread_end_s"] and d["kernel_s"] > 0
        assert 1 <= split["devices_overlap"] <= 2 + 1e-9
        before = threading.active_count()
        gen = m.iter_recommend_all(10, user_items=R, batch_size=64)
        next(gen)
        gen.close()                                      # both devices' threads end
        assert threading.active_count() == before
        check(m.recommend(np.arange(100, 650), R, N=10), brute(X[100:650], Y, R, row0=100))


@pytest.mark.skipif(len(DEVICES) < 2, reason="needs two OpenCL devices")
def test_multi_device_batched_recommend_of_any_ids():
    """A batched recommend of ids that are not a range splits its rows over the devices
    (enough rows for each), the seen items of each row left out."""
    import time
    X, Y, R = problem(m=3000, n=300)
    m = make_model(X, Y, list(DEVICES[:2]))
    ids = np.random.default_rng(5).permutation(3000)[:2600]
    with T.inference_options(min_work=0):
        m.recommend(ids[:10], R[ids[:10]], N=10)               # builds the resident ranker
        t0 = time.perf_counter()
        got = m.recommend(ids, R[ids], N=10)
    check(got, brute(X[ids], Y, R[ids]))
    traces = [p["dtk"].last_trace for p in m._topk_cache["resident"][1].parts]
    assert all(tr.t0 >= t0 for tr in traces)
    assert sum(tr.rows for tr in traces) == 2600 and min(tr.rows for tr in traces) >= 1024


def test_merged_streams_order_and_failure():
    """The threads' merge: user order when ordered, every item either way, a failure raised."""
    def stream(i, n, fail=False):
        for j in range(n):
            yield i, j
        if fail:
            raise RuntimeError(f"device {i} failed")

    makers = [lambda i=i: stream(i, 5) for i in range(3)]
    recs = [{} for _ in makers]
    assert list(resident._merge_streams(makers, recs, True)) == [
        (i, j) for i in range(3) for j in range(5)]
    assert all(r["start"] <= r["end"] for r in recs)
    assert sorted(resident._merge_streams(makers, recs, False)) == [
        (i, j) for i in range(3) for j in range(5)]
    bad = makers[:2] + [lambda: stream(2, 3, fail=True)]
    with pytest.raises(RuntimeError, match="device 2 failed"):
        list(resident._merge_streams(bad, recs, False))


def test_catalog_larger_than_a_tile(cl_device):
    """The million-item path at a small scale: many tiles per split, several splits merged,
    a few queries; with and without candidates and seen items."""
    rng = np.random.default_rng(3)
    n, m = 30_000, 12                      # one group of queries: the items are split
    X = rng.integers(-4, 5, (m, 8)).astype(np.float32)
    Y = rng.integers(-4, 5, (n, 8)).astype(np.float32)
    R = sp.random(m, n, density=0.01, random_state=4, format="csr", dtype=np.float32)
    model = make_model(X, Y, cl_device)
    with T.inference_options(device=cl_device, min_work=0):
        got = model.recommend_all(10, user_items=R)
        dtk = model._topk_cache["resident"][1].first
        S, _ = dtk._splits(m, n, dtk.config)
        assert n > 4 * dtk.config.tn and S > 1
        check(got, brute(X, Y, R))
        cand = np.sort(rng.choice(n, 20_000, replace=False))
        drop = np.setdiff1d(np.arange(n), cand)
        check(model.recommend(np.arange(m), R, N=10, filter_items=drop),
              brute(X, Y, R, cand=cand))


def test_pipelined_batches_and_early_stop(cl_device):
    X, Y, R = problem()
    dtk = T.DeviceTopK(Y, cl_device).set_queries(X).set_exclude(R)
    whole = dtk.query_rows(0, 700, 10, exclude="resident")
    parts = list(dtk.iter_query(None, 10, None, "resident", rows=(0, 700), batch_rows=64))
    assert len(parts) > 2
    check((np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])), whole)
    gen = dtk.iter_query(None, 10, None, "resident", rows=(0, 700), batch_rows=64)
    next(gen)
    gen.close()                                       # two batches were in flight
    check(dtk.query_rows(0, 700, 10, exclude="resident"), whole)
    # the exclusion's rows may start elsewhere than the queries'
    dtk.set_exclude_arrays(R.indptr[100:401], R.indices)
    got = list(dtk.iter_query(None, 10, None, "resident", rows=(100, 400), exclude_row0=0))
    check(got[0][1:], brute(X[100:400], Y, R, row0=100))


def test_default_batches_are_whole_waves(cl_device):
    """The default batch cap is rounded to whole waves of the device's work-groups (a launch
    of 65,536 queries filled 512 of an H100's 528 groups: 1M queries took 16 waves, not 15)."""
    X, Y, R = problem(m=2600)
    dtk = T.DeviceTopK(Y, cl_device).set_queries(X).set_exclude(R)
    wave = dtk._target_groups() * dtk.config.tm
    nq = X.shape[0]
    assert dtk._wave_rows(int(1.4 * wave), 100 * wave, dtk.config) == wave
    assert dtk._wave_rows(int(1.6 * wave), 100 * wave, dtk.config) == 2 * wave
    assert dtk._wave_rows(wave // 3, 100 * wave, dtk.config) == wave
    assert dtk._wave_rows(5 * wave, 3 * wave, dtk.config) == 3 * wave
    whole = dtk.query_rows(0, nq, 10, exclude="resident")
    cap = max(1, nq // 3)
    parts = list(dtk.iter_query(None, 10, None, "resident", rows=(0, nq), max_batch=cap))
    sizes = [p[1].shape[0] for p in parts]
    want = dtk._wave_rows(cap, nq, dtk.config)
    assert len(sizes) > 1 and sizes[:-1] == [want] * (len(sizes) - 1) and sum(sizes) == nq
    check((np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])), whole)


def test_pickle_clone_and_lost_device(cl_device):
    X, Y, R = problem()
    m = make_model(X, Y, cl_device)
    with T.inference_options(device=cl_device, min_work=0):
        want = m.recommend_all(10, user_items=R)
        for other in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
            assert "_topk_cache" not in other.__dict__
            check(other.recommend_all(10, user_items=R), want)       # uploads once
            assert "resident" in other._topk_cache
    # a model whose device cannot be found ranks on the host
    m.device = "no such device"
    m.clear_device_cache()
    check(m.recommend_all(10, user_items=R), want)
    assert "resident" not in m.__dict__.get("_topk_cache", {})


def test_threads_with_different_seen_items(cl_device):
    """Two threads ranking with different user_items on one model: each query holds the seen
    items it was given, whatever the other uploads meanwhile."""
    import concurrent.futures
    X, Y, R = problem()
    R2 = sp.random(700, 300, density=0.2, random_state=9, format="csr", dtype=np.float32)
    m = make_model(X, Y, cl_device)
    want = {0: brute(X, Y, R), 1: brute(X, Y, R2)}
    with T.inference_options(device=cl_device, min_work=0):
        m.recommend_all(10, user_items=R)

        def call(i):
            with T.inference_options(device=cl_device, min_work=0):
                return i, m.recommend_all(10, user_items=(R, R2)[i], batch_size=64)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for i, got in pool.map(call, [0, 1, 0, 1, 1, 0]):
                check(got, want[i])


def test_gpu_geometry_pipelined(cl_device):
    """A GPU-style geometry (staged item tiles, yt=0: the GPUs' path) through the pipelined
    batches, with an uploaded exclusion handle and with per-batch uploads."""
    X, Y, R = problem(m=500, n=2000, density=0.02)
    cfg = T.TopKConfig(wx=8, wy=8, rm=2, rnv=2, v=4, tk=8)
    dtk = T.DeviceTopK(Y, cl_device, config=cfg).set_queries(X)
    ex = dtk.upload_exclude(R.indptr, R.indices)
    want = brute(X, Y, R)
    parts = list(dtk.iter_query(None, 10, None, ex, rows=(0, 500), batch_rows=128))
    assert len(parts) == 4
    check((np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])), want)
    parts = list(dtk.iter_query(X, 10, None, R, batch_rows=128))
    check((np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])), want)
