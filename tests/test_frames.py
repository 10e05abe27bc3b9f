"""Tables of raw ids in and out of the in-process estimator (issue 34, item 3): ``fit``,
``predict``, ``rmse``, ``score``, ``recommend`` and ``recommend_raw`` take pandas DataFrames and
pyarrow Tables of raw ids (the column rules of :mod:`clmf.data.frames`, shared with
``clmf.dask.ALS`` and ``Ratings.from_pandas``) and give raw ids back; every answer is checked
against the same model used through 0-based indices."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DEVICES

import clmf
from clmf.data import Ratings
from clmf.errors import MissingColumnError

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")

KW = dict(factors=4, iterations=3, regularization=0.1, random_state=0)


def _frame(seed=0, n=1500, users=120, items=60):
    """Random string-id ratings without duplicate pairs, in columns who/what/stars."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"who": [f"u{k}" for k in rng.integers(0, users, n)],
                       "what": [f"m{k}" for k in rng.integers(0, items, n)],
                       "stars": rng.integers(1, 6, n).astype(np.float32)})
    return df.drop_duplicates(["who", "what"]).reset_index(drop=True)


COLS = ("who", "what", "stars")


@pytest.fixture(scope="module")
def data():
    df = _frame()
    train = df.iloc[:1000].reset_index(drop=True)
    unseen = pd.DataFrame({"who": ["u-new", train.who[0]], "what": [train.what[0], "m-new"],
                           "stars": np.array([2.0, 5.0], np.float32)})   # ids not in training
    return train, pd.concat([df.iloc[1000:], unseen], ignore_index=True)


@pytest.fixture(scope="module")
def fitted(data):
    """The same explicit fit from a DataFrame and from the Ratings it stands for (PoCL or the
    first device)."""
    train, _ = data
    if not DEVICES:
        pytest.skip("no OpenCL device")
    dev = DEVICES[0]
    spec = f"{dev.platform.name.strip()} | {dev.name.strip()}"
    from_df = clmf.ALS(device=spec, **KW).fit(train, columns=COLS, show_progress=False)
    r = Ratings.from_pandas(train, *COLS)
    from_r = clmf.ALS(device=spec, **KW).fit(r, show_progress=False)
    return from_df, from_r, r


def _codes(model, df):
    """The model's indices of a frame's raw ids (-1: unknown)."""
    return (model.user_index(df.who.to_numpy(), missing="ignore"),
            model.item_index(df.what.to_numpy(), missing="ignore"))


def test_fit_from_a_dataframe_or_arrow_table_equals_fit_from_ratings(fitted, data):
    m, ref, r = fitted
    np.testing.assert_array_equal(m.user_ids_, r.user_ids)
    np.testing.assert_array_equal(m.item_ids_, r.item_ids)
    np.testing.assert_array_equal(m.user_factors_, ref.user_factors_)
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
    train, _ = data
    table = pa.Table.from_pandas(train)
    for X in (table, table.to_batches()[0]):
        a = clmf.ALS(device=m.device, **KW).fit(X, columns=COLS, show_progress=False)
        np.testing.assert_array_equal(a.user_factors_, m.user_factors_)
    # the default column names, as clmf.dask.ALS and Ratings.from_pandas
    renamed = train.rename(columns=dict(zip(COLS, ("user", "item", "rating"))))
    b = clmf.ALS(device=m.device, **KW).fit(renamed, show_progress=False)
    np.testing.assert_array_equal(b.item_factors_, m.item_factors_)


def test_predict_raw_ids_pairs_and_tables(fitted, data):
    m, _, _ = fitted
    _, test = data
    u, i = _codes(m, test)
    known = (u >= 0) & (i >= 0)
    assert known.any() and not known.all()          # some test ids are not in training
    want = m.predict(u[known], i[known])
    np.testing.assert_array_equal(m.predict(test.who[known], test.what[known]), want)
    np.testing.assert_array_equal(m.predict(test[known], columns=COLS), want)
    np.testing.assert_array_equal(m.predict(pa.Table.from_pandas(test[known]), columns=COLS),
                                  want)
    # ids the model does not know predict the global mean, as an unrated user does
    assert m.predict(["nobody", test.who[0]], [test.what[0], "nothing"]).tolist() == \
        [pytest.approx(m.global_mean_)] * 2
    # integer raw ids need raw_ids=True (integers are indices otherwise)
    ints = clmf.ALS(device=m.device, **KW).fit(
        pd.DataFrame({"user": [10, 20, 20], "item": [7, 7, 8], "rating": [1.0, 2.0, 3.0]}),
        show_progress=False)
    np.testing.assert_array_equal(ints.predict([20], [8], raw_ids=True), ints.predict([1], [1]))


def test_rmse_and_score_of_tables_match_indices(fitted, data):
    m, _, _ = fitted
    _, test = data
    u, i = _codes(m, test)
    err = m._predict_codes(u, i).astype(np.float64) - test.stars.to_numpy()
    want = float(np.sqrt(np.mean(err ** 2)))
    known = (u >= 0) & (i >= 0)
    p = m.predict(u[known], i[known]).astype(np.float64)       # the indices' own predictions
    unknown_se = np.sum((m.global_mean_ - test.stars.to_numpy()[~known]) ** 2)
    assert want == pytest.approx(
        np.sqrt((np.sum((p - test.stars.to_numpy()[known]) ** 2) + unknown_se) / len(test)))
    assert m.rmse(test, columns=COLS) == pytest.approx(want, rel=1e-12)
    assert m.rmse(pa.Table.from_pandas(test), columns=COLS) == pytest.approx(want, rel=1e-12)
    assert m.score(test, columns=COLS) == pytest.approx(-want, rel=1e-12)


def test_validation_table_with_unseen_ids(fitted, data):
    m, _, _ = fitted
    train, test = data
    v = clmf.ALS(device=m.device, **KW).fit(train, columns=COLS, validation=test,
                                            show_progress=False)
    assert v.history_[-1]["validation_rmse"] == pytest.approx(m.rmse(test, columns=COLS),
                                                              rel=1e-5)
    with pytest.raises(ValueError, match="not in the training data; with biases=True"):
        clmf.ALS(device=m.device, biases=True, **KW).fit(train, columns=COLS, validation=test)


def test_implicit_score_of_a_table(data):
    train, test = data
    m = clmf.ALS(feedback="implicit", **KW).fit(train, columns=COLS, show_progress=False)
    u, i = _codes(m, test)
    known = (u >= 0) & (i >= 0)
    V = sp.csr_matrix((test.stars.to_numpy()[known], (u[known], i[known])), shape=m.shape_)
    R = sp.csr_matrix((train.stars.to_numpy(), _codes(m, train)), shape=m.shape_)
    want = m.score(V, user_items=R)
    assert m.score(test, user_items=train, columns=COLS) == pytest.approx(want, rel=1e-12)


def test_recommend_with_a_table_and_batched_raw_ids(fitted, data):
    m, _, r = fitted
    train, _ = data
    R = r.to_csr()
    users = np.array([0, 5, 17])
    want_ids, want_sc = m.recommend(users, R, N=4)
    got_ids, got_sc = m.recommend(users, train.rename(columns=dict(
        zip(COLS, ("user", "item", "rating")))), N=4)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_sc, want_sc)
    raw_users = m.user_ids_[users]
    for seen in (train, pa.Table.from_pandas(train), r):
        out = m.recommend_raw(list(raw_users), seen, N=4, columns=COLS)
        assert list(out.columns) == ["user", "item", "score", "rank"]
        assert out.user.tolist() == np.repeat(raw_users, 4).tolist()
        assert out.item.tolist() == m.item_ids_[want_ids].ravel().tolist()
        np.testing.assert_array_equal(out.score.to_numpy(), want_sc.ravel())
        assert out["rank"].tolist() == [1, 2, 3, 4] * 3
    one_ids, one_sc = m.recommend_raw(raw_users[1], train, N=4, columns=COLS)
    assert one_ids.tolist() == m.item_ids_[want_ids[1]].tolist()
    with pytest.raises(KeyError, match="nobody"):
        m.recommend_raw(["nobody"], train, columns=COLS)
    with pytest.raises(TypeError, match="recommend_raw"):
        m.recommend(["u1"], R)


def test_bad_tables_are_clear_errors(fitted, data):
    m, _, _ = fitted
    train, test = data
    with pytest.raises(MissingColumnError, match=r"no column\(s\) \['rating'\]") as e:
        clmf.ALS(**KW).fit(train.rename(columns={"stars": "r"}), columns=("who", "what",
                                                                        "rating"))
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    assert "found ['who', 'what', 'r']" in str(e.value)
    with pytest.raises(ValueError, match="missing value"):
        clmf.ALS(**KW).fit(train.assign(who=train.who.where(train.index != 3)), columns=COLS)
    with pytest.raises(ValueError, match="1 duplicate rating"):
        clmf.ALS(**KW).fit(pd.concat([train, train.iloc[:1]]), columns=COLS)
    with pytest.raises(ValueError, match="columns must name 3"):
        m.rmse(test, columns=("who", "what"))
    with pytest.raises(ValueError, match="NaN/inf"):
        m.rmse(test.assign(stars=np.inf), columns=COLS)
    matrix_model = clmf.ALS(device=m.device, **KW).fit(sp.csr_matrix(np.eye(3)),
                                                       show_progress=False)
    with pytest.raises(ValueError, match="no raw user ids"):
        matrix_model.predict(["a"], ["b"])
    with pytest.raises(TypeError, match="one table"):
        m.predict([0, 1])
