"""Implicit feedback and biases: verified against the NumPy references of the same maths on every
device, and on real data against the explicit baseline (biases) and the `implicit` library."""
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import random_ratings, rel_err, shared_data

import clmf
from clmf import reference as ref

TOL = 1e-4
VARIANTS = ["batch:tx=4,ty=4", "batch+reg+local:tx=4,ty=4,nnz_batch=8",
            "batch+reg+local+vec4+tile:tx=2,ty=2,bx=8,by=8,tz=2,nnz_batch=6",
            "batch+local+tile:tx=2,ty=4,bx=6,by=6,nnz_batch=4,triangle=0,batch_rows=9",
            # the fused right-hand side: a separate sum (implicit), an extra staged column (biases)
            "batch+vec4+syrk:bx=4,ks=2,nnz_batch=5,batch_rows=9",
            # one work-item per row in S2 and per system in S3
            "batch+reg+local:tx=4,ty=4,nnz_batch=8,solve_wg=1",
            # ... and with the fused CG, in explicit float8 vectors (the last one ragged)
            "batch+reg+local:tx=4,ty=4,nnz_batch=8,solve_wg=1,solve_vec=8"]
# the fused CG's dimensions form (float4 slices, entry groups, more work-items than unknowns at
# small f; the Gram matrix of implicit feedback by the S1 flags' kernel)
DIMS_VARIANTS = ["batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=8,nnz_batch=3",
                 "batch+reg+vec4:solver=fusedcg,fused_dims=1,solve_wg=32,nnz_batch=2,tx=2,ty=2",
                 # two float4 slices per work-item at f = 17 (PCL_Q = 2), one work-item idle
                 "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=4,nnz_batch=2"]


def problem(f):
    R = random_ratings(61, 43, 0.25, seed=f, empty_rows=[2], empty_cols=[5]).tolil()
    R[7, :] = 3.0
    R[7, 5] = 0
    R = R.tocsr()
    R.eliminate_zeros()
    return R, ref.start_factors(61, 43, f, 1)


@pytest.mark.parametrize("solver", ["cholesky", "cg", "fusedcg"])
@pytest.mark.parametrize("f", [1, 5, 17])
@pytest.mark.parametrize("variant", VARIANTS)
def test_implicit_matches_reference(cl_device, variant, f, solver):
    R, init = problem(f)
    m = clmf.ALS(f, 0.1, 1, device=cl_device, variant=variant, feedback="implicit", alpha=2.0,
                 solver=solver).fit(R, init=init, show_progress=False)
    Xr, Yr = ref.als(R, f, 0.1, 1, weighted=False, init=init, implicit_alpha=2.0,
                     solver=solver, cg_steps=3)
    assert rel_err(m.user_factors_, Xr) <= TOL and rel_err(m.item_factors_, Yr) <= TOL
    assert np.all(m.user_factors_[2] == 0)          # no interactions, b = 0 → x = 0


@pytest.mark.parametrize("f", [1, 5, 17])
@pytest.mark.parametrize("variant", DIMS_VARIANTS)
def test_fused_dims_implicit_matches_reference(cl_device, variant, f):
    test_implicit_matches_reference(cl_device, variant, f, "fusedcg")


@pytest.mark.parametrize("f", [1, 5, 17])
@pytest.mark.parametrize("variant", DIMS_VARIANTS)
def test_fused_dims_biases_match_reference(cl_device, variant, f):
    test_biases_match_reference(cl_device, variant, f, "fusedcg")


@pytest.mark.parametrize("f", [1, 5, 17])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("solver", ["cholesky", "fusedcg"])
def test_biases_match_reference(cl_device, variant, f, solver):
    R, init = problem(f)
    m = clmf.ALS(f, 0.1, 2, device=cl_device, variant=variant, biases=True, solver=solver).fit(
        R, init=init, show_progress=False)
    X, Y, bu, bi, mu = ref.als_biased(R, f, 0.1, 2, init=init, solver=solver)
    for got, want in ((m.user_factors_, X), (m.item_factors_, Y), (m.user_biases_, bu),
                      (m.item_biases_, bi)):
        assert rel_err(got, want) <= 10 * TOL
    assert m.global_mean_ == pytest.approx(mu)
    assert m.user_biases_[2] == 0 and m.item_biases_[5] == 0
    p = m.predict([0, 2, 0], [1, 1, 5])
    assert p[0] == pytest.approx(float(X[0] @ Y[1] + mu + bu[0] + bi[1]), rel=1e-4)
    assert p[1] == pytest.approx(mu + bi[1], rel=1e-4)   # unseen user: μ + the item's bias
    assert p[2] == pytest.approx(mu + bu[0], rel=1e-4)
    # the device's train RMSE includes the biases (a quiet fit records the last iteration's, the
    # value a callback is shown: tests/test_model.py)
    assert m.history_[-1]["train_rmse"] == pytest.approx(m.rmse(R), rel=1e-4)


def test_biased_recommend_and_persistence(cl_device, tmp_path):
    R, init = problem(6)
    m = clmf.ALS(6, 0.1, 3, device=cl_device, biases=True).fit(R, init=init, show_progress=False)
    ids, scores = m.recommend(0, R, N=5)
    brute = m.predict(np.zeros(43, int), np.arange(43)).astype(np.float64)
    brute[R[0].indices] = -np.inf
    order = np.argsort(-brute, kind="stable")[:5]
    assert list(ids) == list(order)
    assert np.allclose(scores, brute[order], rtol=1e-5)
    m.save(tmp_path / "b.npz")
    m2 = clmf.load(tmp_path / "b.npz")
    assert np.array_equal(m2.item_biases_, m.item_biases_)
    assert np.allclose(m2.predict([0, 1], [3, 4]), m.predict([0, 1], [3, 4]))


def test_implicit_rejects_negative_and_bad_params():
    R = random_ratings(10, 8, 0.4, seed=1)
    R.data[0] = -1.0
    with pytest.raises(ValueError, match="non-negative"):
        clmf.ALS(2, iterations=1, feedback="implicit").fit(R, show_progress=False)
    with pytest.raises(ValueError, match="alpha"):
        clmf.ALS(2, iterations=1, feedback="implicit", alpha=-1).fit(abs(R), show_progress=False)
    with pytest.raises(ValueError, match="explicit"):
        clmf.ALS(2, iterations=1, feedback="implicit", biases=True).fit(abs(R), show_progress=False)
    with pytest.raises(ValueError, match="feedback"):
        clmf.ALS(2, iterations=1, feedback="both").fit(abs(R), show_progress=False)


def test_implicit_early_stopping_on_precision(cl_device):
    from clmf.data import splits
    data = clmf.data.synthetic("movielens-100k", scale=0.3, seed=3)
    train, val = splits.leave_k_out(data, k=2, random_state=0, min_train=2)
    seen = []
    m = clmf.ALS(24, 0.001, 25, feedback="implicit", alpha=5.0, device=cl_device, random_state=0)
    m.fit(train, validation=val, early_stopping_rounds=2, show_progress=False,
          callback=lambda it, el, mt: seen.append(mt["validation_precision@10"]))
    best = int(np.argmax(seen))
    assert m.best_iteration_ == best and len(seen) <= best + 3


def test_implicit_validation_ranks_on_the_device_once_set_up(cl_device, monkeypatch):
    """Validation precision@10 is counted on the device (clmf.inference.heldout: neither the
    host ranking nor a top-k is called while the fit iterates), and equals ``score``."""
    from clmf.data import splits
    from clmf.inference import host, topk
    data = clmf.data.synthetic("movielens-100k", scale=0.1, seed=3)
    train, val = splits.leave_k_out(data, k=2, random_state=0, min_train=2)
    made, excl = [], []
    real_init, real_excl = topk.DeviceTopK.__init__, topk.DeviceTopK.set_exclude

    def init(self, *a, **kw):
        made.append(1)
        real_init(self, *a, **kw)

    def set_exclude(self, *a, **kw):
        excl.append(1)
        return real_excl(self, *a, **kw)

    def no_host(*a, **kw):
        raise AssertionError("validation ranked on the host")

    monkeypatch.setattr(topk.DeviceTopK, "__init__", init)
    monkeypatch.setattr(topk.DeviceTopK, "set_exclude", set_exclude)
    monkeypatch.setattr(host, "host_rank", no_host)
    seen = []
    with topk.inference_options(device=cl_device, min_work=0):
        # (the fit keeps a ranker for recommend once it is done: none while it iterates)
        during = []
        m = clmf.ALS(12, 0.01, 4, feedback="implicit", alpha=5.0, device=cl_device,
                     random_state=0).fit(train, validation=val, show_progress=False,
                                         callback=lambda it, el, mt: (
                                             seen.append(mt), during.append(len(made) + len(excl))))
        assert during == [0, 0, 0, 0]
        score = m.score(val, user_items=train)
    assert len(seen) == 4 and all("validation_precision@10" in mt for mt in seen)
    assert seen[-1]["validation_precision@10"] == pytest.approx(score, rel=1e-12)
    assert m.history_[-1]["validation_precision@10"] == seen[-1]["validation_precision@10"]


@pytest.mark.parametrize("where", ["device", "host"])
def test_validation_reranks_only_users_it_cannot_certify(cl_device, where, monkeypatch):
    """The evaluator's strict precision over changing factors equals a full ranking's each
    time, while ranking fewer users than all once it has lists to certify misses with, and
    those among fewer items than all (item norms spread over two orders of magnitude)."""
    from clmf.inference import evaluation
    from clmf.inference.evaluation import RankingEvaluator
    from clmf.inference.topk import inference_options
    monkeypatch.setattr(evaluation, "MIN_GROUP", 4)
    rng = np.random.default_rng(5)
    m, n, f = 150, 400, 8
    X = rng.standard_normal((m, f)).astype(np.float32)
    Y = (rng.standard_normal((n, f)) * np.exp(rng.uniform(-2.5, 2.5, (n, 1)))).astype(np.float32)
    seen = sp.random(m, n, density=0.05, random_state=1, format="csr")
    test = sp.random(m, n, density=0.01, random_state=2, format="csr")
    test = test - test.multiply(seen.astype(bool))        # held-out items are unseen
    test.eliminate_zeros()
    device = cl_device if where == "device" else None
    with inference_options(min_work=0):
        ev = RankingEvaluator(test, seen, 10, device=device)
        ranked, share = [], []
        for step in range(5):
            Xs = X + 0.05 * step * rng.standard_normal(X.shape).astype(np.float32)
            Ys = Y + 0.05 * step * Y * rng.standard_normal(Y.shape).astype(np.float32)
            got = ev.strict_precision(Xs, Ys)
            full = RankingEvaluator(test, seen, 10, device=device)
            assert got == full.strict_precision(Xs, Ys)
            assert full.ranked == ev.users.size and full.ranked_work == 1.0
            ranked.append(ev.ranked)
            share.append(ev.ranked_work / max(ev.ranked / ev.users.size, 1e-9))
    assert ranked[0] == ev.users.size and min(ranked[1:]) < ev.users.size / 2, ranked
    assert min(share[1:]) < 0.5, share          # the items a ranked user needs: under half


def test_biases_improve_movielens_rmse():
    from clmf import data
    d = shared_data("ml-100k")
    train, test = data.load_movielens_100k_split(d)
    plain = clmf.ALS(10, 0.15, 10, random_state=0).fit(train, show_progress=False).rmse(test)
    biased = clmf.ALS(10, 0.15, 10, random_state=0, biases=True).fit(
        train, show_progress=False).rmse(test)
    assert biased < plain <= 0.95


def test_lastfm_matches_implicit_library():
    implicit_als = pytest.importorskip("implicit.cpu.als")
    from clmf import metrics
    from clmf.data import splits
    path = shared_data("hetrec2011-lastfm-2k/user_artists.dat")
    data = clmf.data.load(path)
    data = clmf.data.Ratings(data.users, data.items, np.log1p(data.ratings).astype(np.float32),
                            data.timestamps, data.user_ids, data.item_ids)
    train, test = splits.leave_k_out(data, k=2, random_state=0, min_train=2)
    R, T = train.to_csr(), test.to_csr()
    users = np.flatnonzero(np.diff(T.indptr) > 0)
    relevant = [T.indices[T.indptr[u]:T.indptr[u + 1]] for u in users]

    def scores(X, Y):
        S = X[users] @ Y.T
        Ru = R[users]
        S[np.repeat(np.arange(len(users)), np.diff(Ru.indptr)), Ru.indices] = -np.inf
        top = np.argsort(-S, axis=1, kind="stable")[:, :10]
        return metrics.precision_at_k(top, relevant, 10), metrics.ndcg_at_k(top, relevant, 10)

    kw = dict(factors=32, regularization=0.05, alpha=2.0, iterations=10)
    # implicit ≥ 0.5 uses confidence C = alpha·data (not 1 + alpha·r): give it data = r + 1/alpha
    # so both fit the same model, c = 1 + alpha·r, at the same alpha
    Ri = R.copy()
    Ri.data = Ri.data + 1.0 / kw["alpha"]
    ours, theirs = [], []
    for seed in range(3):      # seed-to-seed spread is about ±2%: compare means over seeds
        m = clmf.ALS(kw["factors"], kw["regularization"], kw["iterations"], feedback="implicit",
                     alpha=kw["alpha"], random_state=seed).fit(R, show_progress=False)
        im = implicit_als.AlternatingLeastSquares(random_state=seed, calculate_training_loss=False,
                                                  **kw)
        im.fit(Ri, show_progress=False)
        ours.append(scores(m.user_factors_, m.item_factors_))
        theirs.append(scores(im.user_factors, im.item_factors))
    (p_c, n_c), (p_i, n_i) = np.mean(ours, axis=0), np.mean(theirs, axis=0)
    assert p_c >= 0.98 * p_i and n_c >= 0.98 * n_i, (ours, theirs)


# ----- a caller's variant in implicit mode: used as given, or refused with the reason (issue 27) --
def test_implicit_variant_solver_is_honoured(cl_device):
    """``solver=cg`` named by the variant runs the CG on the built hermitians (it used to be
    switched to the fused CG silently); the factors are the reference CG's."""
    R, init = problem(9)
    v = "batch+vec4+syrk:bx=4,ks=2,nnz_batch=5,solver=cg"
    m = clmf.ALS(9, 0.1, 1, device=cl_device, variant=v, feedback="implicit", alpha=2.0).fit(
        R, init=init, show_progress=False)
    for side in ("users", "items"):
        ch = m.config_[side]
        assert ch.rule == "explicit" and ch.config == clmf.KernelConfig.parse(v), ch
        assert ch.reason == "variant given by the caller"
    Xr, Yr = ref.als(R, 9, 0.1, 1, weighted=False, init=init, implicit_alpha=2.0, solver="cg",
                     cg_steps=3)
    assert rel_err(m.user_factors_, Xr) <= 10 * TOL and rel_err(m.item_factors_, Yr) <= 10 * TOL


def test_implicit_variant_without_solver_says_what_filled_it(cl_device):
    """A variant that names no solver gets the solver parameter, else the implicit default, and
    the Choice's reason says which."""
    R, init = problem(4)
    m = clmf.ALS(4, 0.1, 1, device=cl_device, variant="batch:tx=4,ty=4", feedback="implicit").fit(
        R, init=init, show_progress=False)
    ch = m.config_["users"]
    assert ch.config.solver == "fusedcg" and "the implicit default" in ch.reason
    m = clmf.ALS(4, 0.1, 1, device=cl_device, variant="batch:tx=4,ty=4", feedback="implicit",
                 solver="cholesky").fit(R, init=init, show_progress=False)
    ch = m.config_["items"]
    assert ch.config.solver == "cholesky" and "the solver parameter" in ch.reason


@pytest.mark.parametrize("kw,match", [
    (dict(variant="batch:tx=4,ty=4,solver=cg", solver="cholesky"), "names solver=cg"),
    (dict(variant=clmf.KernelConfig.parse("batch:tx=4,ty=4,solver=fusedcg"), solver="cg"),
     "names solver=fusedcg"),
    (dict(variant="batch:tx=4,ty=4,storage=float16", storage="float32"), "names storage=float16"),
])
def test_variant_contradicting_parameters_is_refused(kw, match):
    """A variant that contradicts solver=/storage= is refused before any device work (the
    reason says which), never changed."""
    R, _init = problem(4)
    with pytest.raises(clmf.InvalidConfigError, match=match) as e:
        clmf.ALS(4, 0.1, 1, feedback="implicit", **kw).fit(R, show_progress=False)
    assert e.value.reason == "conflict"


def test_implicit_variant_beyond_the_device_is_refused_not_adapted(cl_device):
    """A given syrk whose work-group exceeds the device's limit at this f is refused with the
    typed reason; the lookup adapts a tuned one (fewer slices), a given one never."""
    from clmf.engine.device import device_info
    info = device_info(cl_device)
    f = 64
    nth = 9 * 10 // 2                           # (f + 1) / 8 → 9 micro-tile rows
    ks = 1
    while nth * ks <= info.max_work_group_size:
        ks *= 2
    R, _init = problem(f)
    v = f"batch+vec4+syrk:bx=8,ks={ks},nnz_batch=16,solver=cg"
    with pytest.raises(clmf.InvalidConfigError) as e:
        clmf.ALS(f, 0.1, 1, device=cl_device, variant=v, feedback="implicit").fit(
            R, show_progress=False)
    assert e.value.reason == "work_group_size", e.value
