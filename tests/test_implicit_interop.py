"""Interoperability with the implicit library (0.7): its evaluation functions score a clmf model,
``recommend(items=...)`` follows its semantics, and with ``confidence="alpha*r"`` clmf fits the
model implicit's ALS fits.

What must match for the same-model test: the same ratings matrix (stored counts r ≥ 1), factors,
regularization λ with the plain λI term (implicit's; clmf's implicit-feedback default
``weighted_regularization=None`` → False), alpha with implicit's confidence c = α·r, the same
start factors (users are solved first, so only the item start matters for exact solves), exact
solves on both sides (implicit ``use_cg=False``, clmf ``solver="cholesky"``) and the same number
of iterations."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import rel_err, shared_data

import clmf
from clmf import reference

implicit = pytest.importorskip("implicit")
from implicit.cpu.als import AlternatingLeastSquares  # noqa: E402
from implicit.evaluation import ranking_metrics_at_k  # noqa: E402


def counts(m=80, n=60, density=0.12, seed=0):
    """Play counts 1..9 with every user and item present."""
    rng = np.random.default_rng(seed)
    mask = rng.random((m, n)) < density
    mask[np.arange(m), rng.integers(0, n, m)] = True
    mask[rng.integers(0, m, n), np.arange(n)] = True
    r, c = np.nonzero(mask)
    return sp.csr_matrix((rng.integers(1, 10, r.size).astype(np.float32), (r, c)), shape=(m, n))


def start(m, n, f, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.random((m, f), dtype=np.float32) * 0.1, rng.random((n, f), dtype=np.float32) * 0.1)


def implicit_fit(R, f, lam, alpha, iterations, X0, Y0, dtype=np.float32):
    model = AlternatingLeastSquares(factors=f, regularization=lam, alpha=alpha, use_cg=False,
                                    iterations=iterations, dtype=dtype, random_state=0,
                                    calculate_training_loss=False, num_threads=1)
    model.user_factors = np.array(X0, dtype=dtype)
    model.item_factors = np.array(Y0, dtype=dtype)
    model.fit(sp.csr_matrix(R), show_progress=False)
    return model


def test_same_model_as_implicit_reference_path_float64():
    """The model definition: clmf's reference ALS on r − 1/α (what confidence="alpha*r" feeds
    the kernels) equals implicit's float64 fit."""
    R, f, lam, alpha, it = counts(), 6, 0.5, 2.0, 3
    X0, Y0 = start(*R.shape, f)
    imp = implicit_fit(R, f, lam, alpha, it, X0, Y0, np.float64)
    Rs = sp.csr_matrix(R, dtype=np.float64, copy=True)
    Rs.data -= 1.0 / alpha
    X, Y = reference.als(Rs, f, lam, it, weighted=False, init=(X0, Y0), implicit_alpha=alpha)
    assert rel_err(X, imp.user_factors) < 1e-8
    assert rel_err(Y, imp.item_factors) < 1e-8


def test_same_model_as_implicit_on_the_device(cl_device):
    R, f, lam, alpha, it = counts(), 8, 0.5, 2.0, 3
    X0, Y0 = start(*R.shape, f)
    imp = implicit_fit(R, f, lam, alpha, it, X0, Y0)
    model = clmf.ALS(factors=f, regularization=lam, iterations=it, feedback="implicit",
                     alpha=alpha, confidence="alpha*r", solver="cholesky",
                     device=cl_device).fit(R, init=(X0, Y0), show_progress=False)
    assert rel_err(model.user_factors_, imp.user_factors) < 1e-4
    assert rel_err(model.item_factors_, imp.item_factors) < 1e-4
    # the default confidence (1 + α·r) is another model with the same alpha
    other = clmf.ALS(factors=f, regularization=lam, iterations=it, feedback="implicit",
                     alpha=alpha, solver="cholesky", device=cl_device).fit(
        R, init=(X0, Y0), show_progress=False)
    assert rel_err(other.item_factors_, imp.item_factors) > 1e-2


def test_fold_in_uses_the_models_confidence():
    R, f, lam, alpha = counts(seed=3), 5, 0.3, 3.0
    rng = np.random.default_rng(0)
    Y = rng.standard_normal((R.shape[1], f)).astype(np.float32)
    for conf in ("1+alpha*r", "alpha*r"):
        m = clmf.ALS(factors=f, regularization=lam, feedback="implicit", alpha=alpha,
                     confidence=conf)
        m.item_factors_ = Y
        m.user_factors_ = np.zeros((R.shape[0], f), np.float32)
        m.user_counts_ = np.diff(R.indptr)
        m.item_counts_ = np.bincount(R.indices, minlength=R.shape[1])
        m.global_mean_ = 0.0
        Rs = sp.csr_matrix(R, dtype=np.float64, copy=True)
        if conf == "alpha*r":
            Rs.data -= 1.0 / alpha
        want = reference.half_step(Rs[[4]], Y.astype(np.float64), lam, False,
                                   implicit_alpha=alpha)[0]
        np.testing.assert_allclose(m.recalculate_user(4, R[[4]]), want, rtol=1e-4, atol=1e-5)


def test_confidence_is_validated():
    R = counts()
    with pytest.raises(ValueError, match="confidence"):
        clmf.ALS(feedback="implicit", confidence="alpha*r+1").fit(R)
    with pytest.raises(ValueError, match="alpha > 0"):
        clmf.ALS(feedback="implicit", confidence="alpha*r", alpha=0.0).fit(R)


def test_implicit_ranking_metrics_score_a_clmf_model(cl_device):
    R = counts(120, 90, density=0.15, seed=4).tocoo()
    rng = np.random.default_rng(0)
    test_mask = rng.random(R.nnz) < 0.2
    train = sp.csr_matrix((R.data[~test_mask], (R.row[~test_mask], R.col[~test_mask])),
                          shape=R.shape)
    test = sp.csr_matrix((R.data[test_mask], (R.row[test_mask], R.col[test_mask])),
                         shape=R.shape)
    model = clmf.ALS(factors=8, regularization=0.1, iterations=5, feedback="implicit",
                     alpha=2.0, random_state=0, device=cl_device).fit(train, show_progress=False)
    ids, _ = model.recommend(np.arange(5), train[:5], N=10)
    assert ids.dtype == np.int32
    got = ranking_metrics_at_k(model, train, test, K=10, show_progress=False)
    assert set(got) >= {"precision", "map", "ndcg", "auc"}
    # implicit's precision@10 over the same recommendations, counted here
    users = np.unique(test.tocoo().row)
    rec, _ = model.recommend(users, train[users], N=10)
    rel = [test[u].indices for u in users]
    denom = [min(10, len(r)) for r in rel]
    hits = [len(set(rec[j].tolist()) & set(rel[j].tolist())) for j in range(users.size)]
    assert got["precision"] == pytest.approx(sum(hits) / sum(denom), rel=1e-6)
    assert 0 < got["precision"] <= 1


def _split(seed=4, m=120, n=90):
    """(train, test) CSR: a fifth of the entries of :func:`counts` held out."""
    R = counts(m, n, density=0.15, seed=seed).tocoo()
    rng = np.random.default_rng(0)
    test_mask = rng.random(R.nnz) < 0.2
    pick = lambda mask: sp.csr_matrix((R.data[mask], (R.row[mask], R.col[mask])),  # noqa: E731
                                      shape=R.shape)
    return pick(~test_mask), pick(test_mask)


@pytest.mark.parametrize("K", [10, 3])
@pytest.mark.parametrize("where", ["device", "host"])
def test_evaluate_equals_ranking_metrics_at_k(cl_device, where, K):
    """clmf.evaluate gives implicit's precision (÷ min(K, |R|)), MAP, nDCG and AUC of the same
    model to 1e-6, ranked on the device or on the host, with the strict precision apart; K = 3
    leaves users with more held-out items than K; an implicit (alpha*r) and a biased model."""
    from clmf.inference.topk import inference_options
    train, test = _split()
    implicit_model = clmf.ALS(factors=8, regularization=0.1, iterations=5, feedback="implicit",
                              alpha=2.0, confidence="alpha*r", random_state=0, device=cl_device)
    biased_model = clmf.ALS(factors=6, regularization=0.1, iterations=3, biases=True,
                            random_state=0, device=cl_device)
    opts = (dict(device=cl_device, min_work=0) if where == "device" else dict(enabled=False))
    for model in (implicit_model, biased_model):
        model.fit(train, show_progress=False)
        with inference_options(**opts):
            theirs = ranking_metrics_at_k(model, train, test, K=K, show_progress=False)
            ours = clmf.evaluate(model, train, test, K=K)
            strict = model.score(test, user_items=train, k=K) if model is implicit_model else None
        assert set(ours) == {"precision", "map", "ndcg", "auc", "strict_precision"}
        for key in ("precision", "map", "ndcg", "auc"):
            assert ours[key] == pytest.approx(theirs[key], abs=1e-6, rel=0), key
        users = np.flatnonzero(np.diff(test.indptr))
        rec, _ = model.recommend(users, train[users], N=K)
        want = clmf.metrics.precision_at_k(rec, [test[u].indices for u in users], K)
        assert ours["strict_precision"] == pytest.approx(want, rel=1e-12)
        assert ours["strict_precision"] < ours["precision"]
        if strict is not None:
            assert strict == pytest.approx(ours["strict_precision"], rel=1e-12)


def test_evaluate_checks_its_input():
    train, test = _split()
    model = clmf.ALS(factors=4, iterations=2, feedback="implicit", random_state=0)
    with pytest.raises(clmf.NotFittedError):
        clmf.evaluate(model, train, test)
    model.fit(train, show_progress=False)
    with pytest.raises(ValueError, match="shape"):
        clmf.evaluate(model, train, test[:, :50])
    with pytest.raises(TypeError, match="scipy.sparse"):
        clmf.evaluate(model, train, test.toarray())
    with pytest.raises(ValueError, match="k must be an integer"):
        clmf.evaluate(model, train, test, K=0)


def test_items_semantics_match_implicit():
    """recommend(items=...) as implicit's: liked items kept and ranked last, N capped at the
    number of items, nothing padded."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((6, 4)).astype(np.float32)
    Y = rng.standard_normal((15, 4)).astype(np.float32)
    R = sp.csr_matrix((np.ones(12, np.float32), (np.repeat(np.arange(6), 2),
                                                 rng.integers(0, 15, 12))), shape=(6, 15))
    R.sum_duplicates()
    imp = AlternatingLeastSquares(factors=4)
    imp.user_factors, imp.item_factors = X, Y
    ours = clmf.ALS(factors=4)
    ours.user_factors_, ours.item_factors_ = X, Y
    ours.user_counts_, ours.item_counts_ = np.diff(R.indptr), np.bincount(R.indices, minlength=15)
    ours.global_mean_ = 0.0
    items = sorted(set(R.indices.tolist()) | {0, 3, 9})
    for N in (3, len(items), 40):
        for u in range(6):
            a_ids, a_sc = imp.recommend(u, R[u], N=N, items=items)
            b_ids, b_sc = ours.recommend(u, R[u], N=N, items=items)
            assert len(b_ids) == len(a_ids) == min(N, len(items))
            liked = set(R[u].indices.tolist())
            np.testing.assert_allclose(b_sc, a_sc, rtol=1e-5, atol=1e-6)  # -FLT_MAX: liked
            # the same ranking; equal scores (the liked ones) may come in another order
            fin = a_sc > np.finfo(np.float32).min
            np.testing.assert_array_equal(b_ids[fin], a_ids[fin])
            assert set(b_ids[~fin].tolist()) == set(a_ids[~fin].tolist()) <= liked
        a_ids, _ = imp.recommend(np.arange(6), R, N=N, items=items)
        b_ids, _ = ours.recommend(np.arange(6), R, N=N, items=items)
        assert b_ids.shape == a_ids.shape and (b_ids >= 0).all()


def test_default_start_ranks_as_implicit_on_movielens():
    """The issue's parameters (ML-100K ua split, counts = ratings, confidence alpha*r, f = 64,
    λ = 0.05, α = 2, 15 iterations, seeds 0–2): clmf's default start in implicit mode (implicit's
    own, so both start from the same factors) gives a mean precision@10 within 1% of implicit's;
    the uniform start U[0, 1)/√f gave about 3% less. ~5 s: three fits of each at f = 64."""
    from clmf import data
    train, test = data.load_movielens_100k_split(shared_data("ml-100k"), split="ua")
    R, T = train.to_csr(), test.to_csr()
    ours, theirs = [], []
    for seed in range(3):
        m = clmf.ALS(64, 0.05, 15, feedback="implicit", alpha=2.0, confidence="alpha*r",
                     random_state=seed).fit(R, show_progress=False)
        ours.append(clmf.evaluate(m, R, T, K=10)["precision"])
        im = AlternatingLeastSquares(factors=64, regularization=0.05, alpha=2.0, iterations=15,
                                     random_state=seed, calculate_training_loss=False)
        im.fit(R, show_progress=False)
        theirs.append(ranking_metrics_at_k(im, R, T, K=10, show_progress=False)["precision"])
    assert abs(np.mean(ours) / np.mean(theirs) - 1) < 0.01, (ours, theirs)


def test_start_rules(cl_device):
    """fit's default start is the mode's rule drawn with random_state; a rule can be named; an
    unknown one is refused before any device work."""
    R = counts()
    f, kw = 5, dict(regularization=0.1, iterations=2, random_state=3, device=cl_device)
    for feedback, rule in (("implicit", "implicit"), ("explicit", "uniform")):
        default = clmf.ALS(f, feedback=feedback, **kw).fit(R, show_progress=False)
        named = clmf.ALS(f, feedback=feedback, **kw).fit(R, init=rule, show_progress=False)
        given = clmf.ALS(f, feedback=feedback, **kw).fit(
            R, init=reference.start_factors(*R.shape, f, 3, init=rule), show_progress=False)
        assert reference.default_init(feedback) == rule
        np.testing.assert_array_equal(default.item_factors_, named.item_factors_)
        np.testing.assert_array_equal(default.item_factors_, given.item_factors_)
    # "implicit" is implicit's own start, value for value, for the same seed
    im = AlternatingLeastSquares(factors=f, iterations=0, random_state=3)
    im.fit(R, show_progress=False)
    X0, Y0 = reference.start_factors(*R.shape, f, 3, init="implicit")
    np.testing.assert_array_equal(X0, im.user_factors)
    np.testing.assert_array_equal(Y0, im.item_factors)
    with pytest.raises(ValueError, match="init must be one of"):
        clmf.ALS(f, **kw).fit(R, init="gaussian", show_progress=False)


@pytest.mark.parametrize("rule", ["uniform", "implicit"])
@pytest.mark.parametrize("shape", [(1001, 8), (999, 7), (1000, 7), (4, 3)])
def test_start_drawn_over_threads_is_one_draw(rule, shape, monkeypatch):
    """A large start drawn by several threads (each from its point of the generator's stream)
    holds the numbers of one draw, and leaves the generator where one draw does — also for a
    generator given half way through its float32 pairs, and for other bit generators."""
    from clmf import reference as ref
    rows, f = shape

    def draw(parallel, rng):
        monkeypatch.setattr(ref, "_DRAW_PARALLEL_FROM", 0 if parallel else 1 << 60)
        monkeypatch.setattr(ref, "_DRAW_THREADS", 3)
        monkeypatch.setattr("os.cpu_count", lambda: 4)
        out = ref.initial_factors(rows, f, rng, init=rule)
        return out, rng.random(5, dtype=np.float32), rng.random(3)

    for make in (lambda: np.random.default_rng(11),
                 lambda: np.random.Generator(np.random.MT19937(11))):
        one, threads = draw(False, make()), draw(True, make())
        for a, b in zip(one, threads):
            np.testing.assert_array_equal(a, b)
    half = np.random.default_rng(12)
    half.random(1, dtype=np.float32)          # a float32 pair half used
    other = np.random.default_rng(12)
    other.random(1, dtype=np.float32)
    for a, b in zip(draw(False, half), draw(True, other)):
        np.testing.assert_array_equal(a, b)
