"""Model behaviour every backend must show, as one mixin (in the manner of implicit's test mixin).

:class:`ModelBehaviour` holds the checks — fit (against the NumPy reference), input forms,
reproducibility, predict, rmse, recommend, similar items/users, fold-in, save/load and pickling,
not-fitted and bad input — written against the public estimator API only. A backend plugs in with
a ``tests/test_behaviour_<backend>.py`` that subclasses it (the class name must start with
``Test``) and defines one fixture, ``backend``, returning a :class:`Backend`:

* ``make(**params)``: a new, unfitted estimator with these ``clmf.ALS`` parameters;
* ``data(R)``: the fit input for a SciPy CSR ``R`` (default: ``R`` itself — a Dask backend gives
  its collection of the same ratings);
* ``rtol``: the tolerance against the single-device reference (a partitioned fit sums in another
  order: give it room, never more than needed);
* ``lacks``: names of checks the backend does not support yet (each is skipped, with the reason,
  never silently passed).

Single device (``tests/test_behaviour_device.py``), once per OpenCL device::

    class TestSingleDevice(ModelBehaviour):
        @pytest.fixture
        def backend(self, cl_device):
            return Backend(lambda **kw: clmf.ALS(device=cl_device, **kw))

Several devices (issue 14, ``ALS(device=[...])``)::

    class TestMultiDevice(ModelBehaviour):
        @pytest.fixture
        def backend(self):
            if len(DEVICES) < 2:
                pytest.skip("one OpenCL device (POCL_DEVICES='pthread pthread' gives two)")
            return Backend(lambda **kw: clmf.ALS(device=DEVICES[:2], **kw))

Dask (issue 15): the same, with ``make`` building its estimator on a test cluster and ``data``
turning the CSR into its input (e.g. a Dask DataFrame of (user, item, rating) triples).
"""
from __future__ import annotations

import dataclasses
import pickle
from typing import Callable

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import random_ratings, rel_err

import clmf
from clmf import reference as ref
from clmf.data import Ratings

__all__ = ["Backend", "ModelBehaviour"]

NOT_FITTED = (RuntimeError, ValueError, AttributeError)   # NotFittedError is the last two


def _same(R):
    """The fit input of a backend that takes SciPy matrices: the matrix itself."""
    return R


@dataclasses.dataclass
class Backend:
    """How the behaviour checks make and feed one backend's estimator."""
    make: Callable
    data: Callable = _same
    rtol: float = 1e-4
    lacks: frozenset = frozenset()

    def need(self, what):
        """Skip the calling check when the backend lacks ``what``."""
        if what in self.lacks:
            pytest.skip(f"this backend does not support {what} yet")


def _brute_top(X, Y, u, N, liked=()):
    """Top-N items of user u by dot product in float64 (ties by item index), liked ones out."""
    s = Y.astype(np.float64) @ X[u].astype(np.float64)
    order = [i for i in np.lexsort((np.arange(len(s)), -s)) if i not in set(liked)]
    return np.array(order[:N]), s[order[:N]]


def _cosine(F, q):
    F = F.astype(np.float64)
    norms = np.linalg.norm(F, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 0, F @ F[q] / (norms * max(norms[q], 1e-300)), 0.0)


def _midway_failure(how, monkeypatch):
    """``fit`` keyword arguments (a callback), or a patch of the fit loop, that make a fit fail
    at its second iteration: the callback raises (``RuntimeError`` or ``KeyboardInterrupt``), or
    the backend's second ``iteration`` does (a device or worker failure)."""
    from clmf.model import loop

    def callback(it, _elapsed, _metrics):
        if it == 1:
            raise (KeyboardInterrupt if how == "interrupt" else RuntimeError)("stopped midway")

    if how != "backend":
        return {"callback": callback}
    real_run = loop.run

    def run(steps, *args, **kw):
        engine, calls = steps.engine, []
        real = engine.iteration

        def iteration(*a, **k):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("the backend failed midway (injected)")
            return real(*a, **k)
        monkeypatch.setattr(engine, "iteration", iteration)
        return real_run(steps, *args, **kw)
    monkeypatch.setattr(loop, "run", run)
    return {}


def _fitted_state(m):
    """The fitted attributes of ``m``: each object, and a deep copy of its value."""
    import copy
    out = {}
    for k, v in vars(m).items():
        if k.endswith("_") and not k.startswith("_"):
            try:
                out[k] = (v, copy.deepcopy(v))
            except TypeError:                       # an object that cannot be copied
                out[k] = (v, None)
    return out


def _assert_same_state(m, before):
    """``m`` holds exactly the fitted attributes of ``before``: the same objects, unmodified."""
    now = {k: v for k, v in vars(m).items() if k.endswith("_") and not k.startswith("_")}
    assert set(now) == set(before)
    for k, (obj, copied) in before.items():
        assert now[k] is obj, k
        if isinstance(obj, np.ndarray):
            np.testing.assert_array_equal(obj, copied, err_msg=k)
        elif isinstance(obj, (list, dict, float, int, str)):
            assert obj == copied, k


class ModelBehaviour:
    """The checks; subclasses provide the ``backend`` fixture (see the module docstring)."""

    R = random_ratings(40, 30, 0.3, seed=1, empty_rows=[5], empty_cols=[7])
    F = 4

    def fit(self, backend, R=None, **params):
        """A fitted estimator of ``backend`` on ``R`` (default: the class's ratings)."""
        R = self.R if R is None else R
        kw = dict(factors=self.F, iterations=2, random_state=0)
        kw.update(params)
        init = kw.pop("init", None)
        return backend.make(**kw).fit(backend.data(R), show_progress=False, init=init)

    @pytest.fixture
    def fitted(self, backend):
        """A fit with the exact (Cholesky) solver, as the reference solves."""
        return self.fit(backend, solver="cholesky", regularization=0.1, iterations=3)

    # ----- fit ---------------------------------------------------------------------------------
    def test_fit_returns_self_and_fitted_attributes(self, backend):
        m = backend.make(factors=self.F, iterations=2, random_state=0)
        assert m.fit(backend.data(self.R), show_progress=False) is m
        assert m.user_factors_.shape == (40, self.F) and m.user_factors_.dtype == np.float32
        assert m.item_factors_.shape == (30, self.F) and m.item_factors_.dtype == np.float32
        assert m.global_mean_ == pytest.approx(self.R.data.mean(), rel=1e-6)
        assert set(m.config_) == {"users", "items"}
        assert m.config_["users"].rule in ("heuristic", "explicit", "tuned", "nearest", "vendor",
                                           "default", "baseline")
        assert len(m.history_) == 2

    def test_fit_matches_the_reference(self, backend):
        X0, Y0 = ref.start_factors(40, 30, self.F, 0)
        m = self.fit(backend, init=(X0, Y0), solver="cholesky", regularization=0.1)
        Xr, Yr = ref.als(self.R, self.F, 0.1, 2, init=(X0, Y0))
        assert rel_err(m.user_factors_, Xr) <= backend.rtol
        assert rel_err(m.item_factors_, Yr) <= backend.rtol
        # rows and columns without ratings keep zero factors
        assert np.all(m.user_factors_[5] == 0) and np.all(m.item_factors_[7] == 0)

    @pytest.mark.parametrize("form", ["csc", "coo", "tuple", "ratings"])
    def test_input_forms_agree(self, backend, form):
        backend.need("input forms")
        C = self.R.tocoo()
        X = {"csc": self.R.tocsc(), "coo": C, "tuple": (C.row, C.col, C.data),
             "ratings": Ratings.from_sparse(self.R)}[form]
        init = ref.start_factors(40, 30, 3, 0)
        a = backend.make(factors=3, iterations=1).fit(backend.data(self.R), init=init,
                                                      show_progress=False)
        b = backend.make(factors=3, iterations=1).fit(X, init=init, show_progress=False)
        assert rel_err(a.user_factors_, b.user_factors_) < 1e-6

    def test_random_state_reproducible(self, backend):
        a, b = self.fit(backend, random_state=5), self.fit(backend, random_state=5)
        assert np.array_equal(a.user_factors_, b.user_factors_)
        assert np.array_equal(a.item_factors_, b.item_factors_)

    # ----- predict and rmse --------------------------------------------------------------------
    def test_predict_and_rmse(self, backend, fitted):
        m = fitted
        p = m.predict([5, 0, 1], [0, 7, 1])      # user 5 and item 7 had no ratings
        assert p[0] == pytest.approx(m.global_mean_) and p[1] == pytest.approx(m.global_mean_)
        assert p[2] == pytest.approx(float(m.user_factors_[1] @ m.item_factors_[1]), rel=1e-5)
        V = random_ratings(40, 30, 0.1, seed=9).tocoo()
        pred = m.predict(V.row, V.col)
        assert m.rmse(V.tocsr()) == pytest.approx(np.sqrt(np.mean((pred - V.data) ** 2)),
                                                  rel=1e-5)
        with pytest.raises(IndexError):
            m.predict([40], [0])
        with pytest.raises(ValueError):
            m.predict([-1], [0])

    # ----- recommend and similar ---------------------------------------------------------------
    def test_recommend_matches_brute_force(self, backend, fitted):
        m, X, Y = fitted, fitted.user_factors_, fitted.item_factors_
        users = np.array([0, 3, 39])
        ids, scores = m.recommend(users, self.R, N=6)
        for row, u in enumerate(users):
            bid, bsc = _brute_top(X, Y, u, 6, self.R[u].indices)
            np.testing.assert_array_equal(ids[row], bid)
            np.testing.assert_allclose(scores[row], bsc, rtol=1e-5, atol=1e-6)
            one = m.recommend(int(u), self.R, N=6)                    # single == batched row
            np.testing.assert_array_equal(one[0], ids[row])
        # filter_already_liked_items=False: nothing is filtered, user_items may be None
        bid, _ = _brute_top(X, Y, 3, 30)
        np.testing.assert_array_equal(
            m.recommend(3, None, N=30, filter_already_liked_items=False)[0], bid)

    def test_recommend_refuses_bad_user_items(self, backend, fitted):
        with pytest.raises(ValueError, match="3 columns but the model has 30 items"):
            fitted.recommend(0, sp.csr_matrix(np.ones((40, 3))))
        with pytest.raises(ValueError, match="columns"):
            fitted.recommend(0, sp.csr_matrix(np.ones((1, 31))))
        with pytest.raises(IndexError, match="out of range"):
            fitted.recommend(40, self.R)

    def test_similar_items_and_users(self, backend, fitted):
        for F, similar in ((fitted.item_factors_, fitted.similar_items),
                           (fitted.user_factors_, fitted.similar_users)):
            for q in (0, 2):
                ids, sims = similar(q, N=5)
                assert ids[0] == q and sims[0] == 1.0                  # itself first
                cos = _cosine(F, q)
                np.testing.assert_allclose(sims[1:], cos[ids[1:]], atol=1e-5)
                assert sims[1] >= np.sort(np.delete(cos, q))[-1] - 1e-5

    # ----- fold-in -----------------------------------------------------------------------------
    def test_fold_in_reproduces_the_last_half_step(self, backend, fitted):
        """The last half-step of a fit solves the items against the final users: the host fold-in
        reproduces it (same λ, same weighting)."""
        backend.need("fold-in")
        m = fitted
        RT = self.R.T.tocsr()
        assert rel_err(m.recalculate_item(np.arange(30), RT), m.item_factors_) < 1e-4
        before = m.item_factors_.copy()
        m.partial_fit_items(np.arange(30), RT)               # the training rows: unchanged
        assert rel_err(m.item_factors_, before) < 1e-4
        # a new user grows the model and is recommended for like the others
        row = random_ratings(1, 30, 0.5, seed=11)
        m.partial_fit_users([40], row)
        assert m.user_factors_.shape == (41, self.F)
        ids, _ = m.recommend(40, row, N=5)
        np.testing.assert_array_equal(ids, _brute_top(m.user_factors_, m.item_factors_, 40, 5,
                                                      row.indices)[0])

    # ----- persistence -------------------------------------------------------------------------
    def test_save_load_and_pickle(self, backend, fitted, tmp_path):
        backend.need("save")
        m = fitted
        m.save(tmp_path / "model.npz")
        for m2 in (clmf.load(tmp_path / "model.npz"), pickle.loads(pickle.dumps(m))):
            np.testing.assert_array_equal(m2.user_factors_, m.user_factors_)
            np.testing.assert_array_equal(m2.item_factors_, m.item_factors_)
            np.testing.assert_array_equal(m2.predict([0, 1], [2, 3]), m.predict([0, 1], [2, 3]))
            a, b = m.recommend([0, 1], self.R, N=5), m2.recommend([0, 1], self.R, N=5)
            np.testing.assert_array_equal(a[0], b[0])

    # ----- a fit is all-or-nothing -------------------------------------------------------------
    @pytest.mark.parametrize("how", ["callback", "interrupt", "backend"])
    def test_failed_refit_keeps_the_model(self, backend, how, monkeypatch):
        m = self.fit(backend, solver="cholesky", regularization=0.1)
        before = _fitted_state(m)
        predicted = m.predict([0, 1, 2], [3, 4, 5])
        fail = _midway_failure(how, monkeypatch)
        other = random_ratings(35, 25, 0.3, seed=9)        # another shape: nothing may leak
        with pytest.raises((RuntimeError, KeyboardInterrupt), match="midway"):
            m.fit(backend.data(other), show_progress=False, **fail)
        _assert_same_state(m, before)
        np.testing.assert_array_equal(m.predict([0, 1, 2], [3, 4, 5]), predicted)
        assert m.recommend(0, self.R, N=3)[0].shape == (3,)

    @pytest.mark.parametrize("how", ["callback", "backend"])
    def test_failed_first_fit_leaves_it_unfitted(self, backend, how, monkeypatch):
        m = backend.make(factors=self.F, iterations=3, random_state=0)
        fail = _midway_failure(how, monkeypatch)
        with pytest.raises(RuntimeError, match="midway"):
            m.fit(backend.data(self.R), show_progress=False, **fail)
        assert [k for k in vars(m) if k.endswith("_") and not k.startswith("_")] == []
        with pytest.raises(NOT_FITTED, match="not fitted"):
            m.predict([0], [0])

    # ----- errors ------------------------------------------------------------------------------
    def test_not_fitted(self, backend):
        m = backend.make(factors=self.F)
        with pytest.raises(clmf.NotFittedError, match="not fitted"):
            m.predict([0], [0])
        with pytest.raises(clmf.NotFittedError, match="not fitted"):
            m.recommend(0)

    @pytest.mark.parametrize("X, exc, msg", [
        ("dense", TypeError, "dense"),
        (sp.csr_matrix((5, 4)), ValueError, "empty"),
        (sp.csr_matrix(np.array([[np.nan, 1.0], [2.0, 3.0]])), ValueError, "NaN"),
        ((np.array([0, -1]), np.array([0, 1]), np.array([1.0, 2.0])), ValueError, "negative"),
    ])
    def test_bad_ratings(self, backend, X, exc, msg):
        backend.need("bad input")
        if isinstance(X, str):
            X = self.R.toarray()
        with pytest.raises(exc, match=msg):
            backend.make(factors=2, iterations=1).fit(X, show_progress=False)

    @pytest.mark.parametrize("params, msg", [(dict(factors=0), "factors"),
                                             (dict(regularization=-0.1), "regularization"),
                                             (dict(iterations=0), "iterations")])
    def test_bad_params(self, backend, params, msg):
        with pytest.raises(ValueError, match=msg):
            backend.make(**params).fit(backend.data(self.R), show_progress=False)
