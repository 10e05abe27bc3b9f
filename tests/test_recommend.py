"""Inference on the host: recommend, similar items/users, fold-in, raw ids — against brute force."""
import importlib.util

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DEVICES, device_id, random_ratings, rel_err

import clmf
from clmf import reference as ref
from clmf.data import Ratings
from clmf.inference.topk import inference_options


def pytest_generate_tests(metafunc):
    """Every test runs on the host path and through the device top-k on each OpenCL device
    (threshold 0); tests of a device fit rank on that fit's device."""
    if "inference_path" in metafunc.fixturenames and "cl_device" not in metafunc.fixturenames:
        metafunc.parametrize("inference_path", ["host"] + DEVICES, indirect=True,
                             ids=["host"] + [f"topk-{device_id(d)}" for d in DEVICES])


@pytest.fixture(autouse=True)
def inference_path(request):
    """Route inference to the host or force the device path (``min_work=0``)."""
    p = getattr(request, "param", None)
    if p is None and "cl_device" in request.fixturenames:
        p = request.getfixturevalue("cl_device")
    if p is None or isinstance(p, str):
        with inference_options(enabled=False):
            yield "host"
    else:
        with inference_options(device=p, min_work=0, enabled=True):
            yield p


def make_model(X, Y, R=None, lam=0.1, weighted=True, user_ids=None, item_ids=None):
    """An ALS with factors set directly (no fit, no device)."""
    m = clmf.ALS(factors=X.shape[1], regularization=lam, weighted_regularization=weighted)
    m.user_factors_ = np.asarray(X, np.float32)
    m.item_factors_ = np.asarray(Y, np.float32)
    if R is None:
        m.user_counts_ = np.ones(X.shape[0], np.int64)
        m.item_counts_ = np.ones(Y.shape[0], np.int64)
        m.global_mean_ = 3.0
    else:
        m.user_counts_ = np.diff(R.indptr).astype(np.int64)
        m.item_counts_ = np.bincount(R.indices, minlength=R.shape[1]).astype(np.int64)
        m.global_mean_ = float(R.data.mean())
    m.user_ids_, m.item_ids_ = user_ids, item_ids
    return m


def int_factors(m, n, f=3, seed=0):
    """Small-integer factors: float32 dot products are exact, and ties are frequent."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-2, 3, (m, f)).astype(np.float32),
            rng.integers(-2, 3, (n, f)).astype(np.float32))


def brute_recommend(X, Y, u, N, liked=(), filter_items=None, items=None):
    """Brute force; with ``items`` the liked candidates are kept and ranked last (implicit's
    semantics) with score -FLT_MAX, ties by item index."""
    cand = range(Y.shape[0]) if items is None else sorted(set(int(i) for i in items))
    liked = set(int(i) for i in liked)
    drop = set(int(i) for i in (filter_items or ())) | (liked if items is None else set())
    low = float(np.finfo(np.float32).min)
    scored = [(-low if i in liked else -float(np.dot(X[u].astype(np.float64), Y[i])), i)
              for i in cand if i not in drop]
    scored.sort()
    top = scored[:N]
    return np.array([i for _, i in top], np.int32), np.array([-s for s, _ in top], np.float32)


@pytest.fixture(scope="module")
def tie_problem():
    X, Y = int_factors(12, 20)
    R = random_ratings(12, 20, 0.25, seed=4)
    return X, Y, R


@pytest.mark.parametrize("N", [1, 4, 18, 20, 25])
@pytest.mark.parametrize("case", ["plain", "liked", "filter", "items", "all"])
def test_recommend_matches_brute_force_with_ties(tie_problem, N, case):
    X, Y, R = tie_problem
    m = make_model(X, Y, R)
    filt = [0, 3, 7] if case in ("filter", "all") else None
    items = [19, 2, 3, 5, 8, 13, 11, 17, 0] if case in ("items", "all") else None
    use_liked = case in ("liked", "all")
    for u in range(X.shape[0]):
        ids, scores = m.recommend(u, R, N=N, filter_already_liked_items=use_liked,
                                  filter_items=filt, items=items)
        liked = R[u].indices if use_liked else ()
        bid, bsc = brute_recommend(X, Y, u, N, liked, filt, items)
        assert ids.dtype == np.int32 and scores.dtype == np.float32
        np.testing.assert_array_equal(ids, bid)
        np.testing.assert_array_equal(scores, bsc)


def test_ties_broken_by_item_index():
    X = np.ones((1, 2), np.float32)
    Y = np.ones((30, 2), np.float32)
    Y[[25, 3]] = 2.0          # two best, tied
    m = make_model(X, Y)
    ids, scores = m.recommend(0, N=5, filter_already_liked_items=False)
    assert ids.tolist() == [3, 25, 0, 1, 2]
    assert scores.tolist() == [4, 4, 2, 2, 2]


def test_batched_equals_single_and_padding(tie_problem):
    X, Y, R = tie_problem
    m = make_model(X, Y, R)
    users = np.array([5, 0, 11, 5])
    ids, scores = m.recommend(users, R, N=6)
    assert ids.shape == scores.shape == (4, 6)
    for row, u in enumerate(users):
        i1, s1 = m.recommend(int(u), R, N=6)
        np.testing.assert_array_equal(ids[row], i1)
        np.testing.assert_array_equal(scores[row], s1)
    # fewer candidates than N: single call is shorter, batched rows are padded with -1 / -inf
    filt = np.setdiff1d(np.arange(20), [1, 2, 3, 4, 5])
    bi, bs = m.recommend(users, R, N=6, filter_items=filt)
    assert bi.shape == (4, 5)
    for row, u in enumerate(users):
        i1, s1 = m.recommend(int(u), R, N=6, filter_items=filt)
        k = len(i1)
        assert k == len({1, 2, 3, 4, 5} - set(R[int(u)].indices))
        np.testing.assert_array_equal(bi[row, :k], i1)
        assert np.all(bi[row, k:] == -1) and np.all(np.isneginf(bs[row, k:]))
    # items=: implicit's semantics, liked items kept and ranked last, never padded
    items = [1, 2, 3]
    bi, bs = m.recommend(users, R, N=5, items=items)
    assert bi.shape == (4, 3) and (bi >= 0).all()
    for row, u in enumerate(users):
        i1, s1 = m.recommend(int(u), R, N=5, items=items)
        np.testing.assert_array_equal(bi[row], i1)
        liked = set(R[int(u)].indices) & set(items)
        assert set(i1[len(i1) - len(liked):].tolist()) == liked
        assert np.all(s1[len(i1) - len(liked):] == np.finfo(np.float32).min)


def test_user_items_row_aligned_or_indexed(tie_problem):
    X, Y, R = tie_problem
    m = make_model(X, Y, R)
    users = np.array([3, 7])
    a = m.recommend(users, R, N=5)                 # full matrix, indexed by userid
    b = m.recommend(users, R[users], N=5)          # one row per user
    np.testing.assert_array_equal(a[0], b[0])
    s1 = m.recommend(7, R[[7]], N=5)               # a single row for a single user
    np.testing.assert_array_equal(s1[0], a[0][1])
    c = m.recommend(users, Ratings.from_sparse(R), N=5)   # a Ratings works like its CSR
    np.testing.assert_array_equal(a[0], c[0])
    # without user_items nothing can be filtered: an error while filtering, as implicit's
    for call in (lambda: m.recommend(3, None, N=20), lambda: m.recommend(users, N=20),
                 lambda: m.recommend_all(20)):
        with pytest.raises(ValueError, match="filter_already_liked_items=True needs user_items"):
            call()
    nofilter = m.recommend(3, None, N=20, filter_already_liked_items=False)[0]
    assert sorted(nofilter.tolist()) == list(range(20))
    assert m.recommend_all(20, filter_already_liked_items=False)[0].shape == (R.shape[0], 20)
    # a matrix with another number of item columns is refused, as implicit refuses wider ones
    for bad in (sp.csr_matrix(R[:, :10]), sp.csr_matrix((R.shape[0], 3)),
                sp.hstack([R, R]).tocsr()):
        with pytest.raises(ValueError, match=f"{bad.shape[1]} columns but the model has 20 items"):
            m.recommend(3, bad, N=20)
        with pytest.raises(ValueError, match="columns"):
            m.recommend(3, bad[3], N=20, recalculate_user=True)


def test_recommend_continuous_scores_are_predictions():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((50, 8)).astype(np.float32)
    Y = rng.standard_normal((300, 8)).astype(np.float32)
    R = random_ratings(50, 300, 0.1, seed=2)
    m = make_model(X, Y, R)
    ids, scores = m.recommend(np.arange(50), R, N=10)
    full = X.astype(np.float64) @ Y.T.astype(np.float64)
    for u in range(50):
        np.testing.assert_allclose(scores[u], full[u, ids[u]], rtol=1e-5, atol=1e-5)
        assert np.all(np.diff(scores[u]) <= 0)
        assert not set(ids[u]) & set(R[u].indices)
        rest = np.setdiff1d(np.arange(300), np.concatenate([ids[u], R[u].indices]))
        assert full[u, rest].max() <= scores[u][-1] + 1e-5


def test_recalculate_user_solves_the_normal_equations():
    rng = np.random.default_rng(3)
    Y = rng.standard_normal((40, 5)).astype(np.float32)
    X = rng.standard_normal((6, 5)).astype(np.float32)
    R = random_ratings(6, 40, 0.3, seed=5)
    for weighted in (True, False):
        m = make_model(X, Y, R, lam=0.3, weighted=weighted)
        got = m.recalculate_user(np.arange(6), R)
        for u in range(6):
            idx, r = R[u].indices, R[u].data.astype(np.float64)
            Yi = Y[idx].astype(np.float64)
            A = Yi.T @ Yi + 0.3 * (len(idx) if weighted else 1) * np.eye(5)
            np.testing.assert_allclose(got[u], np.linalg.solve(A, Yi.T @ r), rtol=1e-4, atol=1e-5)
        one = m.recalculate_user(2, R[[2]])
        assert one.shape == (5,) and one.dtype == np.float32
        np.testing.assert_allclose(one, got[2], rtol=1e-6)
    # an empty row gives zeros; recommend with recalculate_user ranks by the solved factors
    assert not m.recalculate_user(0, sp.csr_matrix((1, 40))).any()
    x = m.recalculate_user(1, R[[1]])
    ids, scores = m.recommend(99, R[[1]], N=7, recalculate_user=True)   # a user the model lacks
    bid, _ = brute_recommend(x[None, :], Y, 0, 7, R[1].indices)
    np.testing.assert_array_equal(ids, bid)
    np.testing.assert_allclose(scores, Y[ids] @ x, rtol=1e-5, atol=1e-6)


def brute_similar(F, q, N, filt=(), items=None):
    norms = np.linalg.norm(F.astype(np.float64), axis=1)
    cand = range(F.shape[0]) if items is None else sorted(set(items))
    out = []
    for i in cand:
        if i in set(filt):
            continue
        if i == q:
            s = 1.0
        elif norms[i] == 0 or norms[q] == 0:
            s = 0.0
        else:
            s = float(F[q].astype(np.float64) @ F[i] / (norms[q] * norms[i]))
        out.append((-(np.inf if i == q else s), i, s))
    out.sort()
    return [i for _, i, _ in out[:N]], [s for _, _, s in out[:N]]


def test_similar_items_and_users_brute_force():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((25, 6)).astype(np.float32)
    Y = rng.standard_normal((40, 6)).astype(np.float32)
    Y[9] = 0.0                               # an item without ratings
    Y[12] = 3 * Y[4]                         # parallel to item 4: similarity 1 as well
    m = make_model(X, Y)
    for q in (0, 4, 9, 12, 39):
        for kw in ({}, {"filter_items": [1, 2, 4]}, {"items": [0, 4, 9, 12, 20, 30, 39]}):
            ids, sims = m.similar_items(q, N=6, **kw)
            bid, bs = brute_similar(Y, q, 6, kw.get("filter_items", ()), kw.get("items"))
            # items 4 and 12 tie exactly only in exact arithmetic: compare scores, and ids
            # through their true similarities
            np.testing.assert_allclose(sims, bs, atol=1e-5)
            true = {i: s for i, s in zip(*brute_similar(Y, q, 40))}
            np.testing.assert_allclose([true[i] for i in ids.tolist()], sims, atol=1e-5)
            assert ids[0] == bid[0] and len(set(ids.tolist())) == len(ids)
    ids, sims = m.similar_items(12, N=2)
    assert ids.tolist() == [12, 4] and sims[0] == 1.0        # itself first, even against a tie
    b_ids, b_sims = m.similar_items([0, 9, 12], N=4)
    assert b_ids.shape == (3, 4)
    for row, q in enumerate([0, 9, 12]):
        np.testing.assert_array_equal(b_ids[row], m.similar_items(q, N=4)[0])
    u_ids, u_sims = m.similar_users(3, N=5, filter_users=[7])
    bid, bs = brute_similar(X, 3, 5, (7,))
    assert u_ids.tolist() == bid
    np.testing.assert_allclose(u_sims, bs, atol=1e-5)
    assert m.similar_users([1, 2], N=3, users=[1, 2, 5])[0].shape == (2, 3)
    # the query item filtered away is simply absent
    assert 0 not in m.similar_items(0, N=5, filter_items=[0])[0]


def test_similar_items_recalculated_from_item_users():
    rng = np.random.default_rng(8)
    X = rng.standard_normal((30, 4)).astype(np.float32)
    Y = rng.standard_normal((15, 4)).astype(np.float32)
    R = random_ratings(30, 15, 0.4, seed=9)
    m = make_model(X, Y, R)
    RT = R.T.tocsr()
    y = m.recalculate_item(3, RT[[3]])
    ids, sims = m.similar_items(3, N=15, recalculate_item=True, item_users=RT)
    Yn = Y / np.linalg.norm(Y, axis=1)[:, None]
    expect = Yn @ (y / np.linalg.norm(y))
    np.testing.assert_allclose(sims, expect[ids], atol=1e-5)
    assert np.all(np.diff(sims) <= 1e-7)


def test_partial_fit_users_existing_new_and_gap():
    rng = np.random.default_rng(11)
    X = rng.standard_normal((10, 4)).astype(np.float32)
    Y = rng.standard_normal((20, 4)).astype(np.float32)
    R = random_ratings(10, 20, 0.3, seed=12)
    m = make_model(X, Y, R, lam=0.2)
    rows = random_ratings(2, 20, 0.4, seed=13)
    expect = m.recalculate_user([3, 12], rows)
    assert m.partial_fit_users([3, 12], rows) is m
    assert m.user_factors_.shape == (13, 4) and m.user_counts_.shape == (13,)
    np.testing.assert_allclose(m.user_factors_[[3, 12]], expect)
    np.testing.assert_array_equal(m.user_factors_[[0, 1, 2, 4]], X[[0, 1, 2, 4]])   # untouched
    assert not m.user_factors_[10:12].any() and m.user_counts_[10:12].tolist() == [0, 0]
    assert m.user_counts_[12] == rows[1].nnz and m.user_counts_[3] == rows[0].nnz
    assert m.predict([10], [0])[0] == pytest.approx(m.global_mean_)       # the gap: no ratings
    np.testing.assert_allclose(m.predict([12], [5])[0], expect[1] @ Y[5], rtol=1e-5)
    ids, _ = m.recommend(12, rows[[1]], N=3)
    assert not set(ids) & set(rows[1].indices)
    # items the same way
    cols = random_ratings(1, 13, 0.5, seed=14)
    y = m.recalculate_item(20, cols)
    m.partial_fit_items([20], cols)
    assert m.item_factors_.shape == (21, 4)
    np.testing.assert_allclose(m.item_factors_[20], y)
    with pytest.raises(ValueError, match="unique"):
        m.partial_fit_users([1, 1], random_ratings(2, 21, 0.5))


# the fold-in of a device fit reproducing its last half-step: tests/behaviour.py


def biased_model(X, Y, bu, bi, mu, lam=0.1, weighted=True, R=None):
    m = make_model(X, Y, R, lam=lam, weighted=weighted)
    m.biases = True
    m.user_biases_ = np.asarray(bu, np.float32)
    m.item_biases_ = np.asarray(bi, np.float32)
    m.global_mean_ = float(mu)
    return m


def augmented_solve(rows, F, b_other, mu, lam, weighted):
    """Row-by-row normal equations of the biased half-step, written out independently of
    clmf.reference.half_step: [x, b] = (Σ ŷŷᵀ + λ·(n or 1)·I)⁻¹ Σ (r − μ − b_i) ŷ, ŷ = [y, 1]."""
    rows = sp.csr_matrix(rows)
    f = F.shape[1]
    X, b = np.zeros((rows.shape[0], f)), np.zeros(rows.shape[0])
    for u in range(rows.shape[0]):
        idx, r = rows[u].indices, rows[u].data.astype(np.float64)
        if idx.size == 0:
            continue
        Fa = np.hstack([F[idx].astype(np.float64), np.ones((idx.size, 1))])
        A = Fa.T @ Fa + lam * (idx.size if weighted else 1) * np.eye(f + 1)
        z = np.linalg.solve(A, Fa.T @ (r - mu - np.asarray(b_other, np.float64)[idx]))
        X[u], b[u] = z[:f], z[f]
    return X, b


@pytest.mark.parametrize("weighted", [True, False])
def test_biased_fold_in_is_the_reference_half_step(weighted):
    """Fold-in with biases solves the fit's augmented system: the users' fold-in against the
    factors and biases after k reference iterations is iteration k+1's users half-step of
    reference.als_biased, and the items' fold-in against iteration k's users is its items
    half-step (so an existing row's own ratings reproduce its fitted factors and bias)."""
    R = random_ratings(50, 35, 0.25, seed=31, empty_rows=[4], empty_cols=[6])
    f, lam = 5, 0.1
    init = ref.start_factors(50, 35, f, 2)
    X2, Y2, bu2, bi2, mu = ref.als_biased(R, f, lam, 2, weighted=weighted, init=init)
    X3, _, bu3, _, _ = ref.als_biased(R, f, lam, 3, weighted=weighted, init=init)
    assert rel_err(X3, X2) > 1e-3 and rel_err(bu3, bu2) > 1e-3   # not a fixed point yet
    m = biased_model(X2, Y2, bu2, bi2, mu, lam, weighted, R)
    x, b = m.recalculate_user(np.arange(50), R, return_biases=True)
    assert x.dtype == np.float32 and b.dtype == np.float32 and b.shape == (50,)
    assert rel_err(x, X3) < 1e-5 and rel_err(b, bu3) < 1e-5
    xe, be = augmented_solve(R, Y2, bi2, mu, lam, weighted)
    assert rel_err(x, xe) < 1e-5 and rel_err(b, be) < 1e-5
    assert not x[4].any() and b[4] == 0                          # no ratings: [0 | 0]
    # without biases in the system (or with the unbiased targets) the answer differs
    assert rel_err(m.recalculate_user(np.arange(50), R), ref.half_step(R, Y2, lam, weighted)) > 1e-2
    x1, b1 = m.recalculate_user(7, R[[7]], return_biases=True)
    assert x1.shape == (f,) and np.allclose(x1, x[7]) and b1 == pytest.approx(b[7])
    # partial_fit_users stores factors and biases of the next users half-step
    m.partial_fit_users(np.arange(50), R)
    assert rel_err(m.user_factors_, X3) < 1e-5 and rel_err(m.user_biases_, bu3) < 1e-5
    # items: fold-in against iteration 2's users reproduces iteration 2's item half-step
    m = biased_model(X2, Y2 + 1.0, bu2, bi2 + 1.0, mu, lam, weighted, R)   # stale items
    RT = R.T.tocsr()
    y, c = m.recalculate_item(np.arange(35), RT, return_biases=True)
    assert rel_err(y, Y2) < 1e-5 and rel_err(c, bi2) < 1e-5
    m.partial_fit_items(np.arange(35), RT)
    assert rel_err(m.item_factors_, Y2) < 1e-5 and rel_err(m.item_biases_, bi2) < 1e-5
    assert m.item_biases_[6] == 0


def test_biased_fold_in_grows_recommends_and_persists(tmp_path):
    rng = np.random.default_rng(41)
    X = rng.standard_normal((10, 4)).astype(np.float32)
    Y = rng.standard_normal((25, 4)).astype(np.float32)
    bu = rng.standard_normal(10).astype(np.float32)
    bi = (2 * rng.standard_normal(25)).astype(np.float32)        # biases that move the ranking
    R = random_ratings(10, 25, 0.3, seed=42)
    m = biased_model(X, Y, bu, bi, 3.4, lam=0.15, R=R)
    rows = random_ratings(2, 25, 0.4, seed=43)
    xe, be = augmented_solve(rows, Y, bi, 3.4, 0.15, True)
    m.partial_fit_users([3, 12], rows)
    assert m.user_factors_.shape == (13, 4) and m.user_biases_.shape == (13,)
    np.testing.assert_allclose(m.user_factors_[[3, 12]], xe, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.user_biases_[[3, 12]], be, rtol=1e-5, atol=1e-6)
    assert m.user_biases_[12] != 0
    np.testing.assert_array_equal(m.user_biases_[[0, 1, 2, 4]], bu[[0, 1, 2, 4]])   # untouched
    assert not m.user_biases_[10:12].any() and not m.user_factors_[10:12].any()      # the gap
    # predictions and recommendations include the new user's bias (and the items' biases)
    full = 3.4 + be[1] + bi + Y.astype(np.float64) @ xe[1]
    np.testing.assert_allclose(m.predict(np.full(25, 12), np.arange(25)), full, rtol=1e-5)
    assert m.predict([10], [3])[0] == pytest.approx(3.4 + bi[3], rel=1e-6)
    ids, scores = m.recommend(12, rows[[1]], N=6)
    brute = full.copy()
    brute[rows[1].indices] = -np.inf
    order = np.argsort(-brute, kind="stable")[:6]
    assert ids.tolist() == order.tolist()
    np.testing.assert_allclose(scores, full[order], rtol=1e-5)
    # recalculate_user=True in recommend scores with the solved bias, not 0
    ids2, scores2 = m.recommend(99, rows[[1]], N=6, recalculate_user=True)
    assert ids2.tolist() == ids.tolist()
    np.testing.assert_allclose(scores2, scores, rtol=1e-5)
    # items grow the same way; a new item's bias enters the ranking
    cols = random_ratings(1, 13, 0.6, seed=44)
    ye, ce = augmented_solve(cols, m.user_factors_, m.user_biases_, 3.4, 0.15, True)
    m.partial_fit_items([26], cols)
    assert m.item_factors_.shape == (27, 4) and m.item_biases_.shape == (27,)
    np.testing.assert_allclose(m.item_factors_[26], ye[0], rtol=1e-5, atol=1e-6)
    assert m.item_biases_[26] == pytest.approx(ce[0], rel=1e-5)
    assert m.item_biases_[25] == 0 and not m.item_factors_[25].any()
    allp = m.predict(np.full(27, 12), np.arange(27)).astype(np.float64)
    ids, scores = m.recommend(12, N=27, filter_already_liked_items=False)
    assert ids.tolist() == np.argsort(-allp, kind="stable").tolist()
    np.testing.assert_allclose(scores, allp[ids], rtol=1e-5, atol=1e-5)
    # save/load keeps the folded-in factors and biases
    m.save(tmp_path / "folded.npz")
    m2 = clmf.load(tmp_path / "folded.npz")
    np.testing.assert_array_equal(m2.user_biases_, m.user_biases_)
    np.testing.assert_array_equal(m2.item_biases_, m.item_biases_)
    np.testing.assert_array_equal(m2.user_factors_, m.user_factors_)
    np.testing.assert_array_equal(m2.predict([12, 3, 11], [26, 0, 25]), m.predict([12, 3, 11], [26, 0, 25]))
    a, b = (x.recommend(np.array([12, 3]), N=5, filter_already_liked_items=False) for x in (m, m2))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    # an unbiased model's return_biases gives zeros
    plain = make_model(X, Y, R, lam=0.15)
    z = plain.recalculate_user([0, 1], R, return_biases=True)[1]
    assert z.dtype == np.float32 and not z.any()


def test_biased_fold_in_agrees_with_a_device_fit(cl_device):
    """On the device: the fit's last half-step (items) is reproduced by the items' fold-in, and
    the users' fold-in equals the users half-step of one more iteration of the same fit."""
    R = random_ratings(60, 40, 0.2, seed=22, empty_rows=[5])
    init = ref.start_factors(60, 40, 4, 3)
    kw = dict(factors=4, regularization=0.1, device=cl_device, biases=True, solver="cholesky")
    m = clmf.ALS(iterations=3, **kw).fit(R, init=init, show_progress=False)
    m4 = clmf.ALS(iterations=4, **kw).fit(R, init=init, show_progress=False)
    y, c = m.recalculate_item(np.arange(40), R.T.tocsr(), return_biases=True)
    assert rel_err(y, m.item_factors_) < 1e-4 and rel_err(c, m.item_biases_) < 1e-4
    assert rel_err(m4.user_biases_, m.user_biases_) > 1e-3      # the extra half-step moves them
    m.partial_fit_users(np.arange(60), R)
    assert rel_err(m.user_factors_, m4.user_factors_) < 1e-4
    assert rel_err(m.user_biases_, m4.user_biases_) < 1e-4
    assert m.user_biases_[5] == 0
    p = m.predict([0, 1], [2, 3])
    expect = (m.global_mean_ + m.user_biases_[[0, 1]] + m.item_biases_[[2, 3]]
              + np.einsum("ij,ij->i", m.user_factors_[[0, 1]], m.item_factors_[[2, 3]]))
    np.testing.assert_allclose(p, expect, rtol=1e-5)


def test_raw_ids():
    r = Ratings.from_triples(["bob", "ann", "bob", "cy", "ann"], [10, 20, 30, 10, 40],
                             [5.0, 3.0, 4.0, 2.0, 1.0])
    X, Y = int_factors(3, 4, seed=5)
    m = make_model(X, Y, r.to_csr(), user_ids=r.user_ids, item_ids=r.item_ids)
    assert m.user_index("bob") == 1 and m.user_index(["cy", "ann"]).tolist() == [2, 0]
    assert m.item_index("30") == 2                    # text for a numeric map (a command line)
    assert m.user_index("zed", missing="ignore") == -1
    with pytest.raises(KeyError, match="zed"):
        m.user_index("zed")
    ids, scores = m.recommend_raw("bob", r, N=4)
    idx, sc = m.recommend(1, r.to_csr(), N=4)
    assert ids.tolist() == r.item_ids[idx].tolist() and np.array_equal(scores, sc)
    assert set(ids.tolist()) == {20, 40}
    # a training set with other id maps is matched by raw id
    other = Ratings.from_triples(["bob"], [20], [1.0])
    assert 20 not in m.recommend_raw("bob", other, N=4)[0].tolist()
    assert m.recommend_raw("bob", None, N=2, items=[20, 40, 999],
                           filter_already_liked_items=False)[0].size == 2
    with pytest.raises(ValueError, match="needs train"):
        m.recommend_raw("bob", N=2)
    if importlib.util.find_spec("pandas"):        # a batch of raw users: one table
        batch = m.recommend_raw(["bob", "ann"], r, N=4)
        assert batch[batch.user == "bob"].item.tolist() == ids.tolist()
        assert batch["rank"].tolist() == [1, 2] + [1, 2]     # ann and bob have 2 unseen items
    # growing a model with id maps needs raw ids
    row = sp.csr_matrix(([4.0], ([0], [1])), shape=(1, 4))
    with pytest.raises(ValueError, match="raw_ids"):
        m.partial_fit_users([3], row)
    m.partial_fit_users([3], row, raw_ids=["dee"])
    assert m.user_index("dee") == 3 and m.recommend_raw("dee", N=1, filter_already_liked_items=False)[0].size == 1
    with pytest.raises(ValueError, match="new and unique"):
        m.partial_fit_users([4], row, raw_ids=["bob"])
    plain = make_model(X, Y)
    with pytest.raises(ValueError, match="no raw user ids"):
        plain.user_index(1)


def test_errors():
    with pytest.raises(clmf.NotFittedError, match="not fitted"):
        clmf.ALS().recommend(0)
    X, Y = int_factors(4, 6)
    m = make_model(X, Y)
    R = random_ratings(4, 6, 0.5)
    with pytest.raises(IndexError, match="out of range"):
        m.recommend(4, R)
    with pytest.raises(ValueError, match="negative"):
        m.recommend(-1)
    with pytest.raises(TypeError, match="integer"):
        m.recommend(1.5)
    with pytest.raises(TypeError, match="scipy.sparse"):
        m.recommend(0, R.toarray())
    with pytest.raises(ValueError, match="rows"):
        m.recommend([0, 3], R[:2][[0, 1, 1]])
    with pytest.raises(ValueError, match="columns"):
        m.recommend(0, sp.csr_matrix((4, 7)))
    with pytest.raises(ValueError, match="needs user_items"):
        m.recommend(0, recalculate_user=True)
    with pytest.raises(IndexError):
        m.recommend(0, items=[6])
    with pytest.raises(IndexError):
        m.similar_items(6)
    with pytest.raises(ValueError, match="N must"):
        m.recommend(0, N=-1)
    assert m.recommend(0, R, N=0)[0].size == 0
    with pytest.raises(ValueError, match="needs user_items"):      # implicit's rule
        m.recommend(0)
    bad = sp.csr_matrix(([np.nan], ([0], [1])), shape=(1, 6))
    with pytest.raises(ValueError, match="NaN"):
        m.recalculate_user(0, bad)
    m.regularization = 0.0
    with pytest.raises(clmf.SingularSystemError):
        m.recalculate_user(0, sp.csr_matrix(([1.0], ([0], [1])), shape=(1, 6)))
