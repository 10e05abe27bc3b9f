"""Train/test splits of rating data.

Every split takes a :class:`~clmf.data.Ratings` (or a scipy.sparse matrix, converted
with :meth:`Ratings.from_sparse`) and returns ``(train, test)``: two ``Ratings`` that
share the input's id maps and shape, are disjoint, and together hold every rating once.
Within each part the input order of ratings is kept.

``random_state`` accepts an int, a :class:`numpy.random.Generator`, a
:class:`numpy.random.SeedSequence` or ``None`` (fresh entropy), as
:func:`numpy.random.default_rng` does.
"""

from __future__ import annotations

import logging
import numbers
from typing import Any

import numpy as np
import scipy.sparse as sp

from ._ids import _as_id_array
from .ratings import Ratings

logger = logging.getLogger(__name__)

__all__ = ["random_holdout", "leave_k_out", "time_split", "RatingsKFold"]


def _as_ratings(data: Any) -> Ratings:
    if isinstance(data, Ratings):
        return data
    if sp.issparse(data):
        return Ratings.from_sparse(data)
    raise TypeError(
        f"expected a clmf.data.Ratings or a scipy.sparse matrix, got {type(data).__name__}"
    )


def _rng(random_state: Any) -> np.random.Generator:
    if isinstance(random_state, (bool, np.bool_)):
        raise TypeError("random_state must be an int, a numpy Generator, a SeedSequence or None")
    try:
        return np.random.default_rng(random_state)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            "random_state must be an int, a numpy Generator, a SeedSequence or None, "
            f"got {random_state!r}"
        ) from exc


def _check_fraction(test_fraction: Any) -> float:
    if isinstance(test_fraction, (bool, np.bool_)) or not isinstance(test_fraction, numbers.Real):
        raise ValueError(f"test_fraction must be a number in (0, 1), got {test_fraction!r}")
    f = float(test_fraction)
    if not 0.0 < f < 1.0:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction!r}")
    return f


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _split(data: Ratings, test_mask: np.ndarray, how: str) -> tuple[Ratings, Ratings]:
    train, test = data.subset(~test_mask), data.subset(test_mask)
    logger.info("%s: %d train / %d test ratings", how, len(train), len(test))
    return train, test


def _rank_within_user(users: np.ndarray, order_key: np.ndarray, n_users: int) -> np.ndarray:
    """Position of each rating in its user's list sorted by ``order_key`` (0 = first)."""
    order = np.lexsort((order_key, users))
    counts = np.bincount(users, minlength=n_users)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(users), dtype=np.int64)
    rank[order] = np.arange(len(users), dtype=np.int64) - np.repeat(starts, counts)
    return rank


def random_holdout(
    data: Ratings | sp.spmatrix, test_fraction: float = 0.1, random_state: Any = None
) -> tuple[Ratings, Ratings]:
    """Hold out a uniformly random fraction of all ratings.

    The test set gets exactly ``round(test_fraction * nnz)`` ratings, at least 1 and at
    most ``nnz - 1``.

    Parameters
    ----------
    data : Ratings or scipy.sparse matrix
        The ratings.
    test_fraction : float, default 0.1
        Fraction in (0, 1) of ratings to put in the test set.
    random_state : int, numpy.random.Generator or None
        Seed or generator; the same seed gives the same split.

    Returns
    -------
    (Ratings, Ratings)
        ``(train, test)``, disjoint, with the input's id maps and shape.

    Raises
    ------
    ValueError
        If ``test_fraction`` is not in (0, 1) or there are fewer than 2 ratings.

    Examples
    --------
    >>> from clmf.data import synthetic
    >>> train, test = random_holdout(synthetic(seed=0), 0.1, random_state=0)
    >>> len(train), len(test)
    (90000, 10000)
    """
    data = _as_ratings(data)
    f = _check_fraction(test_fraction)
    nnz = len(data)
    if nnz < 2:
        raise ValueError(f"cannot split {nnz} rating(s): need at least 2")
    n_test = min(max(int(round(f * nnz)), 1), nnz - 1)
    rng = _rng(random_state)
    test_mask = np.zeros(nnz, dtype=bool)
    test_mask[rng.permutation(nnz)[:n_test]] = True
    return _split(data, test_mask, f"random_holdout({f:g})")


def leave_k_out(
    data: Ratings | sp.spmatrix, k: int = 1, random_state: Any = None, min_train: int = 1
) -> tuple[Ratings, Ratings]:
    """Per user, move ``k`` random ratings to the test set.

    A user keeps at least ``min_train`` ratings in train: users with ``<= min_train``
    ratings keep all of them in train, and a user with ``c`` ratings gives
    ``min(k, c - min_train)`` to test. Users with at least ``k + min_train`` ratings give
    exactly ``k``.

    Parameters
    ----------
    data : Ratings or scipy.sparse matrix
        The ratings.
    k : int, default 1
        Test ratings per user, >= 1.
    random_state : int, numpy.random.Generator or None
        Seed or generator; the same seed gives the same split.
    min_train : int, default 1
        Ratings each user keeps in train, >= 0.

    Returns
    -------
    (Ratings, Ratings)
        ``(train, test)``, disjoint, with the input's id maps and shape.

    Raises
    ------
    ValueError
        If ``k < 1`` or ``min_train < 0``.

    Examples
    --------
    >>> import numpy as np
    >>> from clmf.data import synthetic
    >>> train, test = leave_k_out(synthetic(seed=0), k=2, random_state=0)
    >>> int(np.bincount(test.users).max())
    2
    """
    data = _as_ratings(data)
    k = _check_int(k, "k", 1)
    min_train = _check_int(min_train, "min_train", 0)
    rng = _rng(random_state)
    n_users = data.shape[0]
    users = np.asarray(data.users)
    counts = np.bincount(users, minlength=n_users)
    n_test_user = np.clip(counts - min_train, 0, k)
    rank = _rank_within_user(users, rng.random(len(data)), n_users)
    test_mask = rank < n_test_user[users]
    return _split(data, test_mask, f"leave_k_out(k={k}, min_train={min_train})")


def time_split(
    data: Ratings,
    test_fraction: float | None = None,
    *,
    cutoff: int | np.integer | np.datetime64 | None = None,
    per_user: bool = False,
    min_train: int = 1,
    random_state: Any = None,
) -> tuple[Ratings, Ratings]:
    """Split by time: the latest ratings go to the test set.

    Three modes:

    * ``cutoff=t``: ratings with ``timestamp >= t`` are test, earlier ones train.
    * global fraction (default, ``test_fraction=0.1``): the latest
      ``round(test_fraction * nnz)`` ratings overall are test, so every train timestamp is
      ``<=`` every test timestamp.
    * ``per_user=True``: each user's latest ``round(test_fraction * c)`` ratings (half up;
      ``c`` the user's count, keeping at least ``min_train`` in train) are test.

    Ties in time are broken by input position, or randomly when ``random_state`` is given.

    Parameters
    ----------
    data : Ratings
        Ratings with timestamps.
    test_fraction : float, optional
        Fraction in (0, 1); 0.1 when neither it nor ``cutoff`` is given.
    cutoff : int or numpy.datetime64, optional
        Unix time (seconds) of the global cut; not combinable with ``test_fraction`` or
        ``per_user``.
    per_user : bool, default False
        Cut each user's history instead of the global timeline.
    min_train : int, default 1
        With ``per_user``, ratings each user keeps in train.
    random_state : int, numpy.random.Generator or None
        Only used to break ties in time randomly.

    Returns
    -------
    (Ratings, Ratings)
        ``(train, test)``, disjoint, with the input's id maps and shape.

    Raises
    ------
    ValueError
        If the ratings have no timestamps, or on invalid / conflicting arguments.

    Examples
    --------
    >>> from clmf.data import Ratings
    >>> r = Ratings.from_triples([1, 1, 2, 2], [1, 2, 1, 2], [5., 4., 3., 2.], [10, 40, 20, 30])
    >>> train, test = time_split(r, cutoff=30)
    >>> test.timestamps.tolist()
    [40, 30]
    """
    data = _as_ratings(data)
    if data.timestamps is None:
        raise ValueError("time_split needs ratings with timestamps; these have none")
    if cutoff is not None:
        if test_fraction is not None:
            raise ValueError("give either test_fraction or cutoff, not both")
        if per_user:
            raise ValueError("cutoff is a global time cut; it cannot be combined with per_user")
        if isinstance(cutoff, np.datetime64):
            cutoff = int(cutoff.astype("datetime64[s]").astype(np.int64))
        if isinstance(cutoff, (bool, np.bool_)) or not isinstance(cutoff, numbers.Real):
            raise ValueError(f"cutoff must be a unix timestamp, got {cutoff!r}")
        test_mask = np.asarray(data.timestamps) >= cutoff
        return _split(data, test_mask, f"time_split(cutoff={cutoff})")
    f = _check_fraction(0.1 if test_fraction is None else test_fraction)
    ts = np.asarray(data.timestamps)
    nnz = len(data)
    tie = None if random_state is None else _rng(random_state).random(nnz)
    if per_user:
        min_train = _check_int(min_train, "min_train", 0)
        n_users = data.shape[0]
        users = np.asarray(data.users)
        counts = np.bincount(users, minlength=n_users)
        n_test_user = np.minimum(np.floor(f * counts + 0.5).astype(np.int64),
                                 np.maximum(counts - min_train, 0))
        # rank from the end: sort by (user, -time, -tie-or-position)
        neg_tie = -(tie if tie is not None else np.arange(nnz, dtype=np.float64))
        order = np.lexsort((neg_tie, -ts, users))
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rank_from_end = np.empty(nnz, dtype=np.int64)
        rank_from_end[order] = np.arange(nnz, dtype=np.int64) - np.repeat(starts, counts)
        test_mask = rank_from_end < n_test_user[users]
        return _split(data, test_mask, f"time_split({f:g}, per_user=True)")
    if nnz < 2:
        raise ValueError(f"cannot split {nnz} rating(s): need at least 2")
    n_test = min(max(int(round(f * nnz)), 1), nnz - 1)
    order = np.lexsort((tie, ts)) if tie is not None else np.argsort(ts, kind="stable")
    test_mask = np.zeros(nnz, dtype=bool)
    test_mask[order[nnz - n_test:]] = True
    return _split(data, test_mask, f"time_split({f:g})")


class RatingsKFold:
    """K-fold cross-validation over ratings, for scikit-learn's ``GridSearchCV``,
    ``cross_val_score`` and ``cross_validate``.

    Each of ``n_splits`` folds holds out about 1/k of every user's ratings (stratified by user:
    a user's ratings are dealt round-robin to the folds, from a random starting fold, in a
    random order with ``shuffle``), so a user with at least ``n_splits`` ratings is in every
    training part and the held-out ratings of a fold are scored by a model that knows their
    users. ``split`` yields boolean masks over the ratings.

    The samples scikit-learn splits must be the ratings: pass a :class:`clmf.data.Ratings`
    (``Ratings.from_sparse(X)`` for a matrix, ``Ratings.from_triples(u, i, r)`` for triples;
    a ``Ratings`` indexed by a fold's mask keeps the id maps and shape) or a table of raw ids
    (pandas DataFrame: its rows are ratings; ``columns`` names the user column as
    :meth:`clmf.ALS.fit` does). A scipy.sparse matrix or a tuple cannot work — scikit-learn
    selects rows of a matrix (whole users) and elements of a tuple — and is refused with a
    ``TypeError`` saying what to pass. Without this splitter (``cv=3`` on a matrix or a tuple)
    :meth:`clmf.ALS.fit` refuses every fold, so ``GridSearchCV`` / ``cross_val_score`` raise
    one ``ValueError`` naming this class instead of NaN scores.

    Parameters
    ----------
    n_splits : int, default 5
        Number of folds (≥ 2).
    shuffle : bool, default True
        Deal each user's ratings to the folds in a random order (else in input order).
    random_state : None, int, numpy Generator or SeedSequence
        Seeds the order and the starting folds (with ``shuffle``, and the starting folds
        without).
    columns : the ``(user, item, rating)`` column names of a table (default
        ``("user", "item", "rating")``).

    Examples
    --------
    >>> from sklearn.model_selection import GridSearchCV               # doctest: +SKIP
    >>> search = GridSearchCV(clmf.ALS(iterations=10), {"regularization": [0.05, 0.1]},
    ...                       cv=clmf.data.splits.RatingsKFold(3, random_state=0))  # doctest: +SKIP
    >>> search.fit(clmf.data.Ratings.from_sparse(train))          # doctest: +SKIP
    >>> search.best_params_                                            # doctest: +SKIP
    """

    def __init__(self, n_splits=5, *, shuffle=True, random_state=None, columns=None):
        """Keep the parameters (checked here)."""
        self.n_splits = _check_int(n_splits, "n_splits", 2)
        self.shuffle = bool(shuffle)
        self.random_state = random_state
        self.columns = columns

    def __repr__(self):
        """``RatingsKFold(n_splits=..., shuffle=..., random_state=...)``."""
        return (f"RatingsKFold(n_splits={self.n_splits}, shuffle={self.shuffle}, "
                f"random_state={self.random_state!r})")

    def get_n_splits(self, X=None, y=None, groups=None):
        """The number of folds (scikit-learn's splitter protocol)."""
        return self.n_splits

    def _users(self, X):
        """The user of every rating of ``X`` (a Ratings or a table), as dense codes."""
        from . import frames
        from ._ids import factorize
        if isinstance(X, Ratings):
            return np.asarray(X.users), X.shape[0]
        if frames.is_frame(X):
            ucol = frames.rating_columns(self.columns)[0]
            uniques, codes = factorize(_as_id_array(frames.column(X, ucol), "user ids"))
            return codes, len(uniques)
        what = ("a scipy.sparse matrix" if sp.issparse(X) else
                "a tuple" if isinstance(X, tuple) else type(X).__name__)
        raise TypeError(
            f"RatingsKFold splits ratings, but scikit-learn hands an estimator rows of {what} "
            "(a matrix's rows are whole users; a tuple's elements are its arrays), never a "
            "subset of ratings: pass the ratings as clmf.data.Ratings "
            "(Ratings.from_sparse(X) for a matrix, Ratings.from_triples(users, items, ratings) "
            "for triples) or as a DataFrame of raw ids, e.g. "
            "GridSearchCV(clmf.ALS(), grid, cv=RatingsKFold(3)).fit(Ratings.from_sparse(X))")

    def split(self, X, y=None, groups=None):
        """Yield ``(train_mask, test_mask)`` boolean masks over the ratings of ``X``, one pair
        a fold (the test masks partition the ratings)."""
        users, n_users = self._users(X)
        n = len(users)
        if n < self.n_splits:
            raise ValueError(f"cannot split {n} rating(s) into n_splits={self.n_splits} folds")
        rng = _rng(self.random_state)
        key = rng.random(n) if self.shuffle else np.arange(n)
        start = rng.integers(0, self.n_splits, n_users)
        fold = (_rank_within_user(users, key, n_users) + start[users]) % self.n_splits
        for k in range(self.n_splits):
            test = fold == k
            yield ~test, test
