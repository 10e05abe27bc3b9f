"""scikit-learn's estimator protocol (tags, check_is_fitted, NotFittedError, score, clone, a
parameter search on a held-out split) and persistence through file objects."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import random_ratings

import clmf
from clmf.data import Ratings

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import NotFittedError as SkNotFitted  # noqa: E402
from sklearn.model_selection import ParameterGrid  # noqa: E402
from sklearn.utils import get_tags  # noqa: E402
from sklearn.utils.validation import check_is_fitted  # noqa: E402


def spec(dev):
    """A device string (clone deep-copies parameters; a pyopencl.Device cannot be copied)."""
    return f"{dev.platform.name.strip()} | {dev.name.strip()}"


def split(R, frac=0.2, seed=0):
    C = R.tocoo()
    mask = np.random.default_rng(seed).random(C.nnz) < frac
    part = lambda k: sp.csr_matrix((C.data[k], (C.row[k], C.col[k])), shape=R.shape)  # noqa
    return part(~mask), part(mask)


def test_unfitted_model_raises_sklearns_not_fitted_error():
    m = clmf.ALS(factors=4)
    with pytest.raises(SkNotFitted):
        check_is_fitted(m)
    with pytest.raises(clmf.NotFittedError, match="not fitted") as e:
        m.predict([0], [0])
    assert isinstance(e.value, (SkNotFitted, ValueError, AttributeError, clmf.ClmfError))
    assert issubclass(clmf.NotFittedError, SkNotFitted)
    assert issubclass(clmf.NotFittedError, ValueError)
    assert issubclass(clmf.NotFittedError, AttributeError)
    assert not hasattr(m, "shape_")              # an AttributeError, as scikit-learn's
    for call in (lambda: m.score(random_ratings(3, 3)), lambda: m.recommend(0),
                 lambda: m.save(io.BytesIO())):
        with pytest.raises(SkNotFitted):
            call()
    tags = get_tags(m)
    assert tags.requires_fit and tags.input_tags.sparse and not tags.target_tags.required


def test_fitted_model_scores_and_clones(cl_device):
    R = random_ratings(60, 40, density=0.3, seed=1)
    train, test = split(R)
    m = clmf.ALS(factors=4, regularization=0.1, iterations=4, random_state=0,
                 device=spec(cl_device)).fit(train, None, show_progress=False)   # y is ignored
    check_is_fitted(m)
    assert m.score(test) == pytest.approx(-m.rmse(test))
    c = clone(m)
    assert c.get_params() == m.get_params() and not hasattr(c, "user_factors_")
    with pytest.raises(ValueError, match="empty test set"):
        m.rmse(sp.csr_matrix(R.shape, dtype=np.float32))


def test_implicit_score_is_precision_at_10(cl_device):
    R = random_ratings(80, 50, density=0.2, seed=2)
    train, test = split(R, seed=3)
    m = clmf.ALS(factors=6, regularization=0.1, iterations=4, feedback="implicit", alpha=2.0,
                 random_state=0, device=cl_device).fit(train, show_progress=False)
    got = m.score(test, user_items=train)
    users = np.unique(test.tocoo().row)
    ids, _ = m.recommend(users, train, N=10)
    hits = sum(len(set(ids[j].tolist()) & set(test[u].indices.tolist()))
               for j, u in enumerate(users))
    assert got == pytest.approx(hits / (10 * users.size))
    # without user_items the training items compete (and mostly win)
    assert m.score(test) != got
    assert m.score(test, user_items=train, k=5) != got


def test_parameter_search_on_a_held_out_split(cl_device):
    """The README recipe: ParameterGrid + clone + score on a held-out split."""
    R = random_ratings(70, 50, density=0.3, seed=4)
    train, valid = split(R, seed=5)
    base = clmf.ALS(iterations=4, random_state=0, device=spec(cl_device))
    results = []
    for params in ParameterGrid({"factors": [2, 6], "regularization": [0.05, 5.0]}):
        model = clone(base).set_params(**params).fit(train, show_progress=False)
        results.append((model.score(valid), params))
    best_score, best = max(results, key=lambda t: t[0])
    assert best_score == max(s for s, _ in results)
    assert best["regularization"] == 0.05        # λ = 5 underfits these ratings badly


def test_save_and_load_through_file_objects(cl_device, tmp_path):
    R = random_ratings(30, 20, density=0.3, seed=6)
    m = clmf.ALS(factors=3, iterations=2, random_state=0, device=cl_device).fit(
        R, show_progress=False)
    buf = io.BytesIO()
    assert m.save(buf) is buf
    buf.seek(0)
    a = clmf.load(buf)
    buf.seek(0)
    b = clmf.ALS.load(buf)
    path = tmp_path / "m.npz"
    with open(path, "wb") as fh:
        m.save(fh)
    with open(path, "rb") as fh:
        c = clmf.ALS.load(fh)
    for x in (a, b, c):
        np.testing.assert_array_equal(x.user_factors_, m.user_factors_)
        np.testing.assert_array_equal(x.item_factors_, m.item_factors_)
        assert x.get_params() == {**m.get_params(), "device": x.device}
    with pytest.raises(ValueError, match="not a clmf model file"):
        clmf.load(io.BytesIO(b"not a model"))
    with pytest.raises(FileNotFoundError):
        clmf.ALS.load(tmp_path / "missing.npz")


def test_implicit_score_in_blocks_of_users(cl_device, monkeypatch):
    """The implicit score ranks on the device, or on the host a block of users at a time
    (memory): any block size, and the device, give the same score."""
    from clmf.inference import host
    from clmf.inference.topk import inference_options
    R = random_ratings(80, 50, density=0.2, seed=2)
    train, test = split(R, seed=3)
    m = clmf.ALS(factors=6, regularization=0.1, iterations=2, feedback="implicit", alpha=2.0,
                 random_state=0, device=cl_device).fit(train, show_progress=False)
    with inference_options(device=cl_device, min_work=0):
        on_device = m.score(test, user_items=train)
    with inference_options(enabled=False):
        whole = m.score(test, user_items=train)
        monkeypatch.setattr(host, "_CHUNK_BYTES", 4 * 50 * 3)            # 3 users a block
        assert m.score(test, user_items=train) == whole
    assert whole == on_device


# ----- cross-validation over ratings (issue 34, item 6) ---------------------------------------
def _search_warnings(record):
    """The scikit-learn warnings of failed or non-finite scores among ``record``."""
    return [w for w in record if "Scoring failed" in str(w.message)
            or "non-finite" in str(w.message) or "fits failed" in str(w.message)]


def test_grid_search_over_ratings_with_ratings_kfold(cl_device):
    """GridSearchCV with RatingsKFold on a Ratings: finite scores, equal to fitting and scoring
    each fold by hand, and the better λ chosen; no warnings."""
    from sklearn.model_selection import GridSearchCV
    r = Ratings.from_sparse(random_ratings(70, 50, density=0.3, seed=4))
    base = clmf.ALS(factors=4, iterations=3, random_state=0, device=spec(cl_device))
    cv = clmf.data.splits.RatingsKFold(3, random_state=0)
    grid = {"regularization": [0.05, 5.0]}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        search = GridSearchCV(base, grid, cv=cv).fit(r)
    assert not _search_warnings(record)
    scores = search.cv_results_["mean_test_score"]
    assert np.isfinite(scores).all() and search.best_params_ == {"regularization": 0.05}
    by_hand = [clone(base).set_params(regularization=0.05).fit(r[tr], show_progress=False)
               .score(r[te]) for tr, te in cv.split(r)]
    assert scores[0] == pytest.approx(np.mean(by_hand), rel=1e-12)


def test_cross_val_score_on_ratings_and_a_dataframe(cl_device):
    pd = pytest.importorskip("pandas")
    from sklearn.model_selection import cross_val_score
    r = Ratings.from_sparse(random_ratings(60, 40, density=0.3, seed=8))
    base = clmf.ALS(factors=3, iterations=2, random_state=0, device=spec(cl_device))
    cv = clmf.data.splits.RatingsKFold(3, random_state=1)
    a = cross_val_score(base, r, cv=cv)
    b = cross_val_score(base, r.to_pandas(), cv=cv)       # rows of raw ids, the same folds
    assert isinstance(r.to_pandas(), pd.DataFrame) and np.isfinite(a).all()
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_what_cannot_work_is_one_clear_error(cl_device):
    from sklearn.model_selection import GridSearchCV, cross_val_score
    R = random_ratings(40, 30, density=0.3, seed=9)
    C = R.tocoo()
    base = clmf.ALS(factors=3, iterations=2, random_state=0, device=spec(cl_device))
    grid = {"regularization": [0.1, 1.0]}
    # a matrix or a tuple with RatingsKFold: scikit-learn would hand the model rows or arrays
    for X, fix in ((R, "Ratings.from_sparse"), ((C.row, C.col, C.data), "Ratings.from_triples")):
        with pytest.raises(TypeError, match=fix):
            GridSearchCV(base, grid, cv=clmf.data.splits.RatingsKFold(3)).fit(X)
        with pytest.raises(TypeError, match=fix):
            cross_val_score(base, X, cv=clmf.data.splits.RatingsKFold(3))
    # a Ratings with cv=<int>: KFold would pick ratings by its users' count
    with pytest.raises(TypeError, match="RatingsKFold"):
        GridSearchCV(base, grid, cv=3).fit(Ratings.from_sparse(R))
    # a matrix or a tuple with cv=<int>: every fold's fit refuses it, so scikit-learn raises
    # one ValueError quoting the fix instead of NaN scores and warnings
    for X in (R, (C.row, C.col, C.data)):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match=r"rows \(whole users.*RatingsKFold"):
                GridSearchCV(base, grid, cv=3).fit(X)
            with pytest.raises(ValueError, match=r"rows \(whole users.*RatingsKFold"):
                cross_val_score(base, X, cv=3)
        assert not [w for w in record if "non-finite" in str(w.message)
                    or "Scoring failed" in str(w.message)]
    with pytest.raises(ValueError, match=r"rows \(whole users.*RatingsKFold"):
        GridSearchCV(base, grid, cv=3, error_score="raise").fit(R)


def test_a_users_own_scorer_may_split_a_matrix_by_users(cl_device):
    """A scoring function of the user's (e.g. folding in held-out users) is not refused: only
    scikit-learn's own scorers cannot score rows of other users."""
    from sklearn.model_selection import cross_val_score
    R = random_ratings(30, 20, density=0.4, seed=3)
    base = clmf.ALS(factors=2, iterations=1, random_state=0, device=spec(cl_device))
    scores = cross_val_score(base, R, cv=2, scoring=lambda est, X, y=None: float(X.shape[0]))
    assert list(scores) == [15.0, 15.0]
