"""Rating data, the public entry point: the :class:`Ratings` container, file loaders and a
synthetic generator (implemented in :mod:`clmf.data`).

Everything that enters :mod:`clmf` as rating data passes through :class:`Ratings`: it holds
0-based ``int32`` user and item indices, ``float32`` ratings, optional ``int64`` timestamps
and the *id maps* that turn an index back into the raw id found in the source
(``user_ids[index] == raw id``). Splits (:mod:`clmf.splits`) keep the id maps, so a model
trained on a split can always report raw ids.

Loaders
-------
:func:`load_movielens_100k`, :func:`load_movielens_100k_split`, :func:`load_movielens_csv`,
:func:`load_movielens_dat`, :func:`load_netflix`, :func:`load_triples` and the dispatcher
:func:`load`. All read text through one reader, pyarrow's CSV reader (:mod:`clmf.data._csv`:
fields typed by pyarrow, or lines split by it for ``::`` and whitespace separators), decode
UTF-8 and fall back to latin-1, accept LF, CRLF and CR line endings, transparently read
gzip-compressed files, keep timestamps where the format has them and raise
:class:`ValueError` naming the file and the 1-based line number of a malformed line.
:func:`load_titles` reads movie titles.

Synthetic data
--------------
:func:`synthetic` generates seeded low-rank-plus-noise ratings with power-law user activity
and item popularity, in the shapes of the data sets of the clMF paper (:func:`list_presets`).
:func:`default` returns the embedded demo data set (also available, lazily, as
``DEFAULT_DATASET``).
"""

from __future__ import annotations

from typing import Any

from .data.default import default
from .data.movielens import (
    load_movielens_100k,
    load_movielens_100k_split,
    load_movielens_csv,
    load_movielens_dat,
)
from .data.netflix import load_netflix
from .data.ratings import Ratings
from .data.synthetic import SyntheticFactors, list_presets, synthetic, synthetic_from_spec
from .data.triples import load, load_titles, load_triples

__all__ = [
    "Ratings",
    "SyntheticFactors",
    "load",
    "load_movielens_100k",
    "load_movielens_100k_split",
    "load_movielens_csv",
    "load_movielens_dat",
    "load_netflix",
    "load_triples",
    "load_titles",
    "synthetic",
    "synthetic_from_spec",
    "list_presets",
    "default",
    "DEFAULT_DATASET",  # noqa: F822 - built lazily by the module __getattr__
]


def __getattr__(name: str) -> Any:
    """``DEFAULT_DATASET``, built on first access (not at import time)."""
    if name == "DEFAULT_DATASET":
        from .data import default as _default
        return _default.DEFAULT_DATASET
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
