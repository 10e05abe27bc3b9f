"""Rating data: the :class:`Ratings` container, file loaders, train/test splits
(:mod:`clmf.data.splits`) and a synthetic generator — the one public home of clmf's data API.

Everything that enters :mod:`clmf` as rating data passes through :class:`Ratings`: it holds
0-based ``int32`` user and item indices, ``float32`` ratings, optional ``int64`` timestamps
and the *id maps* that turn an index back into the raw id found in the source
(``user_ids[index] == raw id``). Splits (:mod:`clmf.data.splits`) keep the id maps, so a model
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

Layout
------
One module per format family (:mod:`~clmf.data.movielens`, :mod:`~clmf.data.netflix`,
:mod:`~clmf.data.triples`), the container (:mod:`~clmf.data.ratings`), input validation
(:mod:`~clmf.data.validation`), the splits (:mod:`~clmf.data.splits`), the generator
(:mod:`~clmf.data.generator`) and the embedded demo set (:mod:`~clmf.data.demo`).

The same API was ``clmf.datasets`` and the splits ``clmf.splits`` until issue 32 made this the
one home; those modules are gone. ``clmf.datasets`` and ``clmf.splits`` as attributes of
:mod:`clmf` still return :mod:`clmf.data` and :mod:`clmf.data.splits` with a
:class:`FutureWarning`, but ``import clmf.datasets`` and ``from clmf.splits import ...`` fail:
import :mod:`clmf.data`.
"""

from __future__ import annotations

from typing import Any

from . import splits  # noqa: F401  (clmf.data.splits, an attribute from the start)
from .demo import default
from .generator import SyntheticFactors, list_presets, synthetic, synthetic_from_spec
from .movielens import (
    load_movielens_100k,
    load_movielens_100k_split,
    load_movielens_csv,
    load_movielens_dat,
)
from .netflix import load_netflix
from .ratings import Ratings
from .triples import load, load_titles, load_triples

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
        from . import demo
        return demo.DEFAULT_DATASET
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
