"""The embedded demo data set (:func:`default`; also ``DEFAULT_DATASET``, built lazily)."""

from __future__ import annotations

import logging
from typing import Any

from .generator import synthetic
from .ratings import Ratings
from .splits import random_holdout

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# the embedded default data set
# --------------------------------------------------------------------------------------
_DEFAULT_SPEC = {"preset": "movielens-100k", "seed": 42, "test_fraction": 0.1, "split_seed": 42}
_default_cache: dict[str, Ratings] = {}


def _default_ratings() -> Ratings:
    if "all" not in _default_cache:
        _default_cache["all"] = synthetic(_DEFAULT_SPEC["preset"], seed=_DEFAULT_SPEC["seed"])
    return _default_cache["all"]


def default(split: bool = True):
    """The embedded demo data set: ``synthetic("movielens-100k", seed=42)``.

    Parameters
    ----------
    split : bool, default True
        Return ``(train, test)`` from a seeded 10 % random holdout (seed 42) instead of the
        whole data set.

    Returns
    -------
    Ratings or (Ratings, Ratings)

    Examples
    --------
    >>> train, test = default()
    >>> len(train), len(test)
    (90000, 10000)
    """
    data = _default_ratings()
    if not split:
        return data
    return random_holdout(
        data, test_fraction=_DEFAULT_SPEC["test_fraction"], random_state=_DEFAULT_SPEC["split_seed"]
    )


def __getattr__(name: str) -> Any:
    # DEFAULT_DATASET is built on first access, not at import time.
    if name == "DEFAULT_DATASET":
        return _default_ratings()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
