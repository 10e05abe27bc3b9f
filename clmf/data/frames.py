"""Tables of raw-id ratings (a pandas DataFrame, a pyarrow Table or RecordBatch, or a mapping of
column name → values): the one place of the column rules that :class:`clmf.ALS`,
:class:`clmf.dask.ALS` and :meth:`clmf.data.Ratings.from_pandas` share.

A table holds one rating a row in three columns, named by ``columns=(user, item, rating)``
(default :data:`RATING_COLUMNS`); user and item columns hold raw ids of any type (integers or
text), the rating column numbers. A column that is not there raises
:class:`clmf.errors.MissingColumnError` (a ``KeyError`` and a ``ValueError``) listing the
columns found; missing values (NaN/None/NA) in an id column are an error naming the column.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import MissingColumnError

__all__ = ["RATING_COLUMNS", "is_frame", "is_dask_frame", "column_names", "check_columns",
           "column", "rating_columns"]

# the default column names of a table of ratings: raw user id, raw item id, rating
RATING_COLUMNS = ("user", "item", "rating")


def is_dask_frame(X: Any) -> bool:
    """Whether ``X`` is a dask DataFrame (partitions, computed lazily)."""
    return hasattr(X, "to_delayed") and hasattr(X, "npartitions")


def is_frame(X: Any) -> bool:
    """Whether ``X`` is an in-memory table of columns: a pandas DataFrame or a pyarrow Table or
    RecordBatch (not a dask DataFrame, which :mod:`clmf.dask` reads)."""
    if is_dask_frame(X):
        return False
    pandas_like = hasattr(X, "columns") and hasattr(X, "iloc")
    arrow_like = hasattr(X, "column_names") and hasattr(X, "column") and hasattr(X, "num_rows")
    return bool(pandas_like or arrow_like)


def column_names(X: Any) -> list:
    """The column names of a table (pandas, pyarrow) or the keys of a mapping."""
    if hasattr(X, "column_names"):
        return list(X.column_names)
    if hasattr(X, "columns"):
        return list(X.columns)
    return list(X.keys())


def rating_columns(columns: Sequence | None) -> tuple:
    """``columns`` as a ``(user, item, rating)`` triple of names (None: :data:`RATING_COLUMNS`)."""
    if columns is None:
        return RATING_COLUMNS
    if isinstance(columns, str) or len(columns) != 3:
        raise ValueError(f"columns must name 3 columns (user, item, rating), got {columns!r}")
    return tuple(columns)


def check_columns(X: Any, columns: Sequence, what: str = "the ratings") -> tuple:
    """``columns`` checked against the table ``X``: a :class:`MissingColumnError` names the ones
    that are not there and lists those that are."""
    names = column_names(X)
    missing = [c for c in columns if c not in names]
    if missing:
        raise MissingColumnError(
            f"{what} have no column(s) {missing}; found {names} (name the user, item and "
            "rating columns: columns=(user, item, rating) in clmf.ALS, user=/item=/rating= in "
            f"Ratings.from_pandas; the default is {RATING_COLUMNS})")
    return tuple(columns)


def column(X: Any, name: Any, what: str = "the ratings") -> np.ndarray:
    """One column of a table (pandas, pyarrow, or a mapping of sequences) as a NumPy array;
    a missing column raises :class:`MissingColumnError`, missing values a ``ValueError``."""
    check_columns(X, (name,), what)
    c = X.column(name) if hasattr(X, "column_names") else X[name]
    if hasattr(c, "null_count"):                         # pyarrow (Chunked)Array
        nulls = int(c.null_count)
        if not nulls:
            import pyarrow as pa
            if pa.types.is_dictionary(c.type):           # categorical ids: their values
                chunks = c.chunks if hasattr(c, "chunks") else [c]
                c = pa.chunked_array([k.dictionary_decode() for k in chunks],
                                     c.type.value_type)
            return c.to_numpy(zero_copy_only=False)
    elif hasattr(c, "isna"):                             # pandas Series
        nulls = int(c.isna().sum())
        if not nulls:
            if hasattr(c, "cat"):                        # categorical ids: their values
                c = c.astype(c.cat.categories.dtype)
            return c.to_numpy()
    else:
        return np.asarray(c)
    raise ValueError(f"column {name!r} of {what} has {nulls} missing value(s) (NaN/None/NA); "
                     "drop or fill them first")
