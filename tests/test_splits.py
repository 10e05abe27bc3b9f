"""Tests of clmf.data.splits: invariants of every split on small generated data."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from clmf.data import Ratings, synthetic
from clmf.data.splits import RatingsKFold, leave_k_out, random_holdout, time_split


def keys(r: Ratings) -> np.ndarray:
    return r.users.astype(np.int64) * r.shape[1] + r.items


def assert_partition(data: Ratings, train: Ratings, test: Ratings) -> None:
    """Disjoint, union == whole, id maps and shape preserved, values carried along."""
    assert train.user_ids is data.user_ids and test.user_ids is data.user_ids
    assert train.item_ids is data.item_ids and test.item_ids is data.item_ids
    assert train.shape == test.shape == data.shape
    assert len(train) + len(test) == len(data)
    assert np.intersect1d(keys(train), keys(test)).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([keys(train), keys(test)])),
                                  np.sort(keys(data)))
    # each rating keeps its value (and timestamp): compare key -> value maps
    for part in (train, test):
        pos = np.searchsorted(np.sort(keys(data)), keys(part))
        order = np.argsort(keys(data))
        np.testing.assert_array_equal(data.ratings[order][pos], part.ratings)
        if data.timestamps is not None:
            np.testing.assert_array_equal(data.timestamps[order][pos], part.timestamps)


@pytest.fixture(scope="module")
def data() -> Ratings:
    return synthetic(shape=(60, 80), nnz=1500, seed=4, timestamps=True)


@pytest.fixture()
def tiny() -> Ratings:
    # user a: 5 ratings, user b: 2, user c: 1 (times chosen by hand)
    return Ratings.from_triples(
        ["a"] * 5 + ["b"] * 2 + ["c"],
        [1, 2, 3, 4, 5, 1, 2, 3],
        [1, 2, 3, 4, 5, 1, 2, 3],
        [50, 10, 40, 20, 30, 70, 60, 80],
    )


class TestRandomHoldout:
    def test_partition_and_size(self, data):
        train, test = random_holdout(data, 0.2, random_state=0)
        assert_partition(data, train, test)
        assert len(test) == round(0.2 * len(data))

    def test_reproducible(self, data):
        a = random_holdout(data, 0.1, random_state=7)[1]
        b = random_holdout(data, 0.1, random_state=np.random.default_rng(7))[1]
        c = random_holdout(data, 0.1, random_state=8)[1]
        np.testing.assert_array_equal(keys(a), keys(b))
        assert not np.array_equal(keys(a), keys(c))

    def test_sparse_input(self):
        X = sp.random(30, 20, density=0.3, format="csr", random_state=0)
        train, test = random_holdout(X, 0.25, random_state=1)
        assert train.shape == (30, 20)
        np.testing.assert_allclose((train.to_csr() + test.to_csr()).toarray(), X.toarray(),
                                   rtol=1e-6)

    @pytest.mark.parametrize("frac", [0, 1, -0.1, 1.5, float("nan"), "0.1", True, None])
    def test_bad_fraction(self, data, frac):
        with pytest.raises(ValueError, match="test_fraction"):
            random_holdout(data, frac)

    def test_too_small_and_wrong_type(self):
        with pytest.raises(ValueError, match="at least 2"):
            random_holdout(Ratings.from_triples([1], [1], [1.0]), 0.5)
        with pytest.raises(TypeError):
            random_holdout(np.ones((3, 3)), 0.5)
        with pytest.raises(TypeError):
            random_holdout(Ratings.from_triples([1, 2], [1, 1], [1.0, 2.0]), 0.5,
                           random_state="seed")

    def test_at_least_one_each_side(self):
        r = Ratings.from_triples([1, 2, 3], [1, 1, 1], [1.0, 2.0, 3.0])
        train, test = random_holdout(r, 0.01, random_state=0)
        assert len(test) == 1 and len(train) == 2


class TestLeaveKOut:
    @pytest.mark.parametrize("k, min_train", [(1, 1), (3, 1), (2, 0), (5, 10)])
    def test_per_user_counts(self, data, k, min_train):
        train, test = leave_k_out(data, k=k, random_state=0, min_train=min_train)
        assert_partition(data, train, test)
        c = np.bincount(data.users, minlength=data.shape[0])
        ct = np.bincount(test.users, minlength=data.shape[0])
        np.testing.assert_array_equal(ct, np.clip(c - min_train, 0, k))
        ctr = np.bincount(train.users, minlength=data.shape[0])
        assert np.all(ctr >= np.minimum(c, min_train))

    def test_hand_case(self, tiny):
        # a has 5 -> 2 in test; b has 2 -> 1 (keeps min_train=1); c has 1 -> stays in train
        train, test = leave_k_out(tiny, k=2, random_state=3)
        assert sorted(test.user_ids[test.users].tolist()) == ["a", "a", "b"]
        assert "c" in train.user_ids[train.users].tolist()

    def test_reproducible_and_random(self, data):
        a = leave_k_out(data, 2, random_state=1)[1]
        b = leave_k_out(data, 2, random_state=1)[1]
        c = leave_k_out(data, 2, random_state=2)[1]
        np.testing.assert_array_equal(keys(a), keys(b))
        assert not np.array_equal(keys(a), keys(c))

    @pytest.mark.parametrize("kw", [dict(k=0), dict(k=-1), dict(k=1.5), dict(min_train=-1)])
    def test_validation(self, data, kw):
        with pytest.raises(ValueError):
            leave_k_out(data, **kw)


class TestTimeSplit:
    def test_global_fraction(self, data):
        train, test = time_split(data, 0.2)
        assert_partition(data, train, test)
        assert len(test) == round(0.2 * len(data))
        assert train.timestamps.max() <= test.timestamps.min()

    def test_default_fraction_and_hand_case(self, tiny):
        train, test = time_split(tiny, 0.25)  # 2 of 8: times 80 and 70
        assert sorted(test.timestamps.tolist()) == [70, 80]
        train, test = time_split(tiny)  # 0.1 of 8 -> round(0.8) = 1
        assert test.timestamps.tolist() == [80]

    def test_cutoff(self, tiny):
        train, test = time_split(tiny, cutoff=50)
        assert sorted(test.timestamps.tolist()) == [50, 60, 70, 80]  # >= cutoff is test
        assert train.timestamps.max() < 50
        _, test2 = time_split(tiny, cutoff=np.datetime64(50, "s"))
        np.testing.assert_array_equal(test.timestamps, test2.timestamps)

    def test_per_user(self, tiny, data):
        train, test = time_split(tiny, 0.4, per_user=True)
        # a: round(2.0)=2 latest (50, 40); b: round(0.8)=1 latest (70); c: keeps its only one
        got = sorted(zip(test.user_ids[test.users].tolist(), test.timestamps.tolist()))
        assert got == [("a", 40), ("a", 50), ("b", 70)]
        train, test = time_split(data, 0.3, per_user=True)
        assert_partition(data, train, test)
        for u in range(data.shape[0]):
            tr, te = train.timestamps[train.users == u], test.timestamps[test.users == u]
            if te.size:
                assert tr.size >= 1 and tr.max() <= te.min()

    def test_ties_broken_reproducibly(self):
        r = Ratings.from_triples(np.arange(10), np.zeros(10), np.ones(10), np.zeros(10, int))
        a = time_split(r, 0.5)[1]
        assert a.users.tolist() == [5, 6, 7, 8, 9]  # by position without random_state
        b = time_split(r, 0.5, random_state=1)[1]
        c = time_split(r, 0.5, random_state=1)[1]
        np.testing.assert_array_equal(b.users, c.users)

    def test_errors(self, tiny):
        no_time = Ratings.from_triples([1, 2], [1, 1], [1.0, 2.0])
        with pytest.raises(ValueError, match="timestamps"):
            time_split(no_time, 0.5)
        with pytest.raises(ValueError, match="not both"):
            time_split(tiny, 0.5, cutoff=10)
        with pytest.raises(ValueError, match="per_user"):
            time_split(tiny, cutoff=10, per_user=True)
        with pytest.raises(ValueError, match="test_fraction"):
            time_split(tiny, 1.0)
        with pytest.raises(ValueError, match="cutoff"):
            time_split(tiny, cutoff="yesterday")


# ----- RatingsKFold: scikit-learn's cross-validation over ratings -------------------------------
@pytest.mark.parametrize("shuffle", [True, False])
def test_ratings_kfold_partitions_every_users_ratings(shuffle):
    data = synthetic(shape=(60, 40), nnz=900, seed=3)
    k = 4
    cv = RatingsKFold(k, shuffle=shuffle, random_state=0)
    folds = list(cv.split(data))
    assert len(folds) == cv.get_n_splits() == k
    hits = np.zeros(len(data), np.int64)
    per_user = []
    for train_mask, test_mask in folds:
        assert train_mask.dtype == bool and np.array_equal(train_mask, ~test_mask)
        assert_partition(data, data[train_mask], data[test_mask])
        hits += test_mask
        per_user.append(np.bincount(data.users[test_mask], minlength=data.shape[0]))
    assert (hits == 1).all()                              # each rating held out exactly once
    per_user = np.array(per_user)                         # folds × users: as even as can be
    assert (per_user.max(axis=0) - per_user.min(axis=0) <= 1).all()
    again = [t for _, t in RatingsKFold(k, shuffle=shuffle, random_state=0).split(data)]
    assert all(np.array_equal(a, b) for a, b in zip(again, (t for _, t in folds)))


def test_ratings_kfold_on_a_dataframe_and_bad_input():
    pd = pytest.importorskip("pandas")
    data = synthetic(shape=(30, 20), nnz=300, seed=4)
    df = data.to_pandas().rename(columns={"user": "who"})
    a = [t for _, t in RatingsKFold(3, random_state=2).split(data)]
    b = [t for _, t in RatingsKFold(3, random_state=2, columns=("who", "item", "rating"))
         .split(df)]
    assert isinstance(df, pd.DataFrame)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(TypeError, match="Ratings.from_sparse"):
        next(RatingsKFold(3).split(data.to_csr()))
    with pytest.raises(ValueError, match="n_splits must be >= 2"):
        RatingsKFold(1)
    with pytest.raises(ValueError, match="cannot split 2 rating"):
        next(RatingsKFold(3).split(data[np.arange(len(data)) < 2]))
    with pytest.raises(TypeError, match="boolean mask"):
        data[np.arange(5)]                                # positions: Ratings.subset
