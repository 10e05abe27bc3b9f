"""Train/test splits of rating data.

Every split takes a :class:`~clmf.datasets.Ratings` (or a scipy.sparse matrix, converted
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

from .ratings import Ratings

logger = logging.getLogger(__name__)

__all__ = ["random_holdout", "leave_k_out", "time_split"]


def _as_ratings(data: Any) -> Ratings:
    if isinstance(data, Ratings):
        return data
    if sp.issparse(data):
        return Ratings.from_sparse(data)
    raise TypeError(
        f"expected a clmf.datasets.Ratings or a scipy.sparse matrix, got {type(data).__name__}"
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
    >>> from clmf.datasets import synthetic
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
    >>> from clmf.datasets import synthetic
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
    >>> from clmf.datasets import Ratings
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
