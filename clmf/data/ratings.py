"""Rating data: the :class:`Ratings` container, file loaders and a synthetic generator.

Everything that enters :mod:`clmf` as rating data passes through :class:`Ratings`: it holds
0-based ``int32`` user and item indices, ``float32`` ratings, optional ``int64`` timestamps
and the *id maps* that turn an index back into the raw id found in the source
(``user_ids[index] == raw id``). Splits (:mod:`clmf.splits`) keep the id maps, so a model
trained on a split can always report raw ids.

Loaders
-------
:func:`load_movielens_100k`, :func:`load_movielens_100k_split`, :func:`load_movielens_csv`,
:func:`load_movielens_dat`, :func:`load_netflix`, :func:`load_triples` and the dispatcher
:func:`load`. All decode UTF-8 and fall back to latin-1, accept LF and CRLF line endings,
transparently read gzip-compressed files, keep timestamps where the format has them and
raise :class:`ValueError` naming the file and the 1-based line number of a malformed line.
:func:`load_titles` reads movie titles.

Synthetic data
--------------
:func:`synthetic` generates seeded low-rank-plus-noise ratings with power-law user activity
and item popularity, in the shapes of the data sets of the clMF paper (:func:`list_presets`).
:func:`default` returns the embedded demo data set (also available, lazily, as
``DEFAULT_DATASET``).
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import gzip
import io
import logging
import math
import os
import re
import time
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import scipy.sparse as sp

logger = logging.getLogger(__name__)

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

_DUPLICATE_POLICIES = ("error", "mean", "last", "sum")


# --------------------------------------------------------------------------------------
# helpers for ids
# --------------------------------------------------------------------------------------
def _as_id_array(raw: Any, what: str) -> np.ndarray:
    """Convert raw ids to a 1-D numpy array usable as an id map (ints, floats or str)."""
    arr = np.asarray(raw)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind == "O":
        # Mixed / python objects: strings if any element is a string, else try numbers.
        if any(isinstance(x, (str, bytes)) for x in arr[: min(len(arr), 1000)]) or len(arr) == 0:
            arr = arr.astype(str)
        else:
            try:
                arr = np.asarray(arr.tolist())
            except (TypeError, ValueError) as exc:  # pragma: no cover - exotic objects
                raise ValueError(f"{what}: ids must be integers or strings") from exc
            if arr.dtype.kind == "O":
                arr = arr.astype(str)
    if arr.dtype.kind == "S":
        arr = arr.astype(str)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int64)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            raise ValueError(
                f"{what}: {int(bad.sum())} id(s) are NaN/inf (first at position "
                f"{int(np.flatnonzero(bad)[0])})"
            )
    if arr.dtype.kind not in "iufU":
        raise ValueError(f"{what}: unsupported id dtype {arr.dtype}")
    return arr


def _factorize(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map raw ids to contiguous indices sorted by raw id.

    Returns ``(uniques, codes)`` with ``uniques[codes] == raw``. Integer ids with a compact
    range take an O(n) table path; everything else uses :func:`numpy.unique`.
    """
    if raw.dtype.kind in "iu" and len(raw) > 0:
        lo = int(raw.min())
        hi = int(raw.max())
        span = hi - lo + 1
        if span <= 4 * len(raw) + 4096:
            shifted = (raw - lo).astype(np.intp, copy=False)
            present = np.zeros(span, dtype=bool)
            present[shifted] = True
            uniques_off = np.flatnonzero(present)
            table = np.full(span, -1, dtype=np.int64)
            table[uniques_off] = np.arange(len(uniques_off), dtype=np.int64)
            codes = table[shifted]
            uniques = (uniques_off + lo).astype(raw.dtype if raw.dtype.itemsize >= 4 else np.int64)
            return uniques, codes
    uniques, codes = np.unique(raw, return_inverse=True)
    return uniques, codes.reshape(-1)


def _compatible(map_kind: str, query_kind: str) -> bool:
    numeric = "iuf"
    if map_kind in numeric and query_kind in numeric:
        return True
    return map_kind == query_kind == "U"


def _lookup(
    id_map: np.ndarray,
    sorter: np.ndarray | None,
    raw: Any,
    missing: str,
    what: str,
) -> Any:
    """Vectorised raw id -> index lookup in ``id_map`` (sorted through ``sorter``)."""
    if missing not in ("raise", "ignore"):
        raise ValueError(f"missing must be 'raise' or 'ignore', got {missing!r}")
    q = np.asarray(raw)
    scalar = q.ndim == 0
    q = np.atleast_1d(q).reshape(-1)
    if q.dtype.kind == "O":
        try:
            q = _as_id_array(q, what)
        except ValueError:
            q = q.astype(str)
    if q.dtype.kind == "S":
        q = q.astype(str)
    out = np.full(len(q), -1, dtype=np.int64)
    if len(q) and len(id_map) and _compatible(id_map.dtype.kind, q.dtype.kind):
        sorted_map = id_map if sorter is None else id_map[sorter]
        pos = np.searchsorted(sorted_map, q)
        pos_c = np.minimum(pos, len(sorted_map) - 1)
        found = sorted_map[pos_c] == q
        idx = pos_c if sorter is None else sorter[pos_c]
        out[found] = idx[found]
    bad = out < 0
    if missing == "raise" and bad.any():
        unknown = np.unique(q[bad])
        shown = ", ".join(repr(x.item() if hasattr(x, "item") else x) for x in unknown[:10])
        more = f" (and {len(unknown) - 10} more)" if len(unknown) > 10 else ""
        raise KeyError(f"{len(unknown)} unknown {what} id(s): {shown}{more}")
    if scalar:
        return int(out[0])
    return out


def _readonly(arr: np.ndarray) -> np.ndarray:
    """A read-only view of ``arr`` (the caller's array keeps its own flags)."""
    if not arr.flags.writeable:
        return arr
    view = arr.view()
    view.flags.writeable = False
    return view


# --------------------------------------------------------------------------------------
# Ratings
# --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Ratings:
    """Explicit rating data with the id maps kept.

    The arrays are stored as read-only views: a ``Ratings`` is immutable, and the splits
    of one data set share its id maps safely.

    Parameters
    ----------
    users : array_like of int
        0-based user index of each rating, ``0 <= users < len(user_ids)``. Stored as
        ``int32``.
    items : array_like of int
        0-based item index of each rating, ``0 <= items < len(item_ids)``. Stored as
        ``int32``.
    ratings : array_like of float
        The rating values, finite. Stored as ``float32``.
    timestamps : array_like of int, optional
        Unix timestamps (seconds) of the ratings, stored as ``int64``; ``None`` when the
        source has none.
    user_ids : array_like
        Raw id of every user index (``user_ids[index] == raw id``), unique.
    item_ids : array_like
        Raw id of every item index, unique.

    Attributes
    ----------
    shape : tuple of int
        ``(n_users, n_items) == (len(user_ids), len(item_ids))``.

    Examples
    --------
    >>> r = Ratings.from_triples(["ann", "bob", "ann"], [10, 10, 20], [4.0, 3.0, 5.0])
    >>> r.shape, len(r)
    ((2, 2), 3)
    >>> r.user_ids[r.users].tolist()
    ['ann', 'bob', 'ann']
    >>> r.to_csr().toarray()
    array([[4., 5.],
           [3., 0.]], dtype=float32)
    """

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray | None
    user_ids: np.ndarray
    item_ids: np.ndarray
    shape: tuple[int, int] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        user_ids = _as_id_array(self.user_ids, "user_ids")
        item_ids = _as_id_array(self.item_ids, "item_ids")
        for ids, what in ((user_ids, "user_ids"), (item_ids, "item_ids")):
            srt = np.sort(ids)
            if srt.size > 1 and bool(np.any(srt[1:] == srt[:-1])):
                raise ValueError(f"{what} must be unique")
        n_users, n_items = len(user_ids), len(item_ids)
        users = np.asarray(self.users)
        items = np.asarray(self.items)
        ratings = np.asarray(self.ratings)
        arrays = {"users": users, "items": items, "ratings": ratings}
        if self.timestamps is not None:
            arrays["timestamps"] = np.asarray(self.timestamps)
        for name, arr in arrays.items():
            if arr.ndim != 1:
                raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
        lengths = {name: len(arr) for name, arr in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"users, items, ratings (and timestamps) differ in length: {lengths}")
        for name, arr, bound in (("users", users, n_users), ("items", items, n_items)):
            if arr.dtype.kind not in "iu":
                if arr.size and not (arr.dtype.kind == "f" and np.all(arr == np.round(arr))):
                    raise ValueError(f"{name} must hold integer indices, got dtype {arr.dtype}")
            if arr.size:
                lo, hi = arr.min(), arr.max()
                if lo < 0 or hi >= bound:
                    raise ValueError(
                        f"{name} indices must lie in [0, {bound}), found range [{lo}, {hi}]"
                    )
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                ratings32 = ratings.astype(np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"ratings must be numeric, got dtype {ratings.dtype}") from exc
        _check_finite(ratings32, "ratings")
        ts = None
        if self.timestamps is not None:
            ts = arrays["timestamps"]
            if ts.dtype.kind == "M":
                ts = ts.astype("datetime64[s]").astype(np.int64)
            elif ts.dtype.kind == "f":
                if ts.size and not np.all(np.isfinite(ts)):
                    raise ValueError("timestamps must be finite")
                ts = ts.astype(np.int64)
            elif ts.dtype.kind not in "iu":
                raise ValueError(f"timestamps must be integers, got dtype {ts.dtype}")
            ts = ts.astype(np.int64, copy=False)
        self._set(
            users.astype(np.int32, copy=False),
            items.astype(np.int32, copy=False),
            ratings32,
            ts,
            user_ids,
            item_ids,
        )

    # -- construction without validation (internal, for code that keeps the invariants)
    def _set(self, users, items, ratings, timestamps, user_ids, item_ids) -> None:
        object.__setattr__(self, "users", _readonly(users))
        object.__setattr__(self, "items", _readonly(items))
        object.__setattr__(self, "ratings", _readonly(ratings))
        object.__setattr__(self, "timestamps", None if timestamps is None else _readonly(timestamps))
        object.__setattr__(self, "user_ids", _readonly(user_ids))
        object.__setattr__(self, "item_ids", _readonly(item_ids))
        object.__setattr__(self, "shape", (int(len(user_ids)), int(len(item_ids))))

    @classmethod
    def _new(cls, users, items, ratings, timestamps, user_ids, item_ids) -> "Ratings":
        """Build without validation; arrays must already have the right dtypes and ranges."""
        obj = object.__new__(cls)
        obj._set(users, items, ratings, timestamps, user_ids, item_ids)
        return obj

    # -- basic protocol -------------------------------------------------------------------
    def __len__(self) -> int:
        return int(len(self.ratings))

    @property
    def nnz(self) -> int:
        """Number of ratings.

        Returns
        -------
        int
            ``len(self)``.

        Examples
        --------
        >>> Ratings.from_triples([1, 2], [1, 1], [3.0, 4.0]).nnz
        2
        """
        return len(self)

    @property
    def n_users(self) -> int:
        """Number of users in the id map (``shape[0]``), rated or not.

        Returns
        -------
        int

        Examples
        --------
        >>> Ratings.from_triples([1, 2], [1, 1], [3.0, 4.0]).n_users
        2
        """
        return self.shape[0]

    @property
    def n_items(self) -> int:
        """Number of items in the id map (``shape[1]``), rated or not.

        Returns
        -------
        int

        Examples
        --------
        >>> Ratings.from_triples([1, 2], [1, 1], [3.0, 4.0]).n_items
        1
        """
        return self.shape[1]

    @property
    def density(self) -> float:
        """Fraction of the ``n_users x n_items`` matrix that is rated.

        Returns
        -------
        float

        Examples
        --------
        >>> Ratings.from_triples([1, 2], [1, 1], [3.0, 4.0]).density
        1.0
        """
        cells = self.shape[0] * self.shape[1]
        return float(len(self) / cells) if cells else 0.0

    def __repr__(self) -> str:
        ts = "with timestamps" if self.timestamps is not None else "no timestamps"
        if len(self):
            rng = f"ratings {float(self.ratings.min()):g}..{float(self.ratings.max()):g}"
        else:
            rng = "empty"
        return (
            f"Ratings({self.shape[0]:,} users x {self.shape[1]:,} items, {len(self):,} ratings, "
            f"{rng}, {ts})"
        )

    # -- conversion -----------------------------------------------------------------------
    def to_csr(self) -> sp.csr_matrix:
        """The ratings as a ``float32`` CSR matrix of shape :attr:`shape`.

        Returns
        -------
        scipy.sparse.csr_matrix
            Rows are users, columns items; column indices sorted within rows.

        Raises
        ------
        ValueError
            If a (user, item) pair occurs more than once: duplicates are never summed
            silently. Aggregate them with ``Ratings.from_triples(..., duplicates=...)``.

        Examples
        --------
        >>> r = Ratings.from_triples([1, 1, 2], [5, 6, 5], [1.0, 2.0, 3.0])
        >>> r.to_csr().toarray()
        array([[1., 2.],
               [3., 0.]], dtype=float32)
        """
        m = sp.csr_matrix(
            (self.ratings, (self.users, self.items)), shape=self.shape, dtype=np.float32
        )
        if m.nnz != len(self):
            # coo -> csr summed duplicates; rebuild the exact count of redundant entries.
            n_dup = len(self) - m.nnz
            raise ValueError(
                f"{n_dup} duplicate (user, item) rating(s) found; refusing to sum them. "
                "Aggregate with Ratings.from_triples(..., duplicates='mean'|'last'|'sum')."
            )
        m.has_sorted_indices = True
        return m

    def to_coo(self) -> sp.coo_matrix:
        """The ratings as a ``float32`` COO matrix (row-major order), duplicates rejected.

        Returns
        -------
        scipy.sparse.coo_matrix

        Raises
        ------
        ValueError
            On duplicate (user, item) pairs, as :meth:`to_csr`.

        Examples
        --------
        >>> r = Ratings.from_triples([1, 2], [1, 1], [3.0, 4.0])
        >>> r.to_coo().row.tolist()
        [0, 1]
        """
        return self.to_csr().tocoo()

    def to_pandas(self, raw_ids: bool = True):
        """A :class:`pandas.DataFrame` with columns ``user, item, rating[, timestamp]``.

        Parameters
        ----------
        raw_ids : bool, default True
            Report raw ids (True) or 0-based indices (False) in the ``user``/``item`` columns.

        Returns
        -------
        pandas.DataFrame

        Raises
        ------
        ImportError
            If pandas is not installed.

        Examples
        --------
        >>> df = Ratings.from_triples([7], [9], [4.0]).to_pandas()  # doctest: +SKIP
        >>> df.columns.tolist()  # doctest: +SKIP
        ['user', 'item', 'rating']
        """
        pd = _import_pandas("Ratings.to_pandas()")
        data: dict[str, np.ndarray] = {
            "user": self.user_ids[self.users] if raw_ids else np.asarray(self.users),
            "item": self.item_ids[self.items] if raw_ids else np.asarray(self.items),
            "rating": np.asarray(self.ratings),
        }
        if self.timestamps is not None:
            data["timestamp"] = np.asarray(self.timestamps)
        return pd.DataFrame(data)

    def subset(self, mask_or_index: Any) -> "Ratings":
        """The ratings selected by a boolean mask or an index array, same id maps and shape.

        Parameters
        ----------
        mask_or_index : array_like of bool or int
            A boolean mask of length ``nnz`` or integer positions into the ratings.

        Returns
        -------
        Ratings
            Shares ``user_ids``/``item_ids`` (and therefore :attr:`shape`) with ``self``.

        Examples
        --------
        >>> r = Ratings.from_triples([1, 2, 3], [1, 1, 1], [1.0, 2.0, 3.0])
        >>> s = r.subset(r.ratings > 1)
        >>> len(s), s.shape == r.shape
        (2, True)
        """
        sel = np.asarray(mask_or_index)
        if sel.dtype == bool:
            if sel.shape != (len(self),):
                raise ValueError(
                    f"boolean mask must have shape ({len(self)},), got {sel.shape}"
                )
        else:
            if sel.size == 0:
                sel = sel.astype(np.intp)
            if sel.ndim != 1 or sel.dtype.kind not in "iu":
                raise ValueError("subset() takes a boolean mask or a 1-D integer index array")
            if sel.size and (sel.min() < -len(self) or sel.max() >= len(self)):
                raise IndexError(f"index out of range for {len(self)} ratings")
        return Ratings._new(
            self.users[sel],
            self.items[sel],
            self.ratings[sel],
            None if self.timestamps is None else self.timestamps[sel],
            self.user_ids,
            self.item_ids,
        )

    # -- id lookup ------------------------------------------------------------------------
    def _sorter(self, which: str) -> np.ndarray | None:
        key = f"_sorter_{which}"
        cached = self.__dict__.get(key, False)
        if cached is not False:
            return cached
        ids = self.user_ids if which == "user" else self.item_ids
        sorter = None
        if len(ids) > 1 and not np.all(ids[1:] > ids[:-1]):
            sorter = np.argsort(ids, kind="stable")
        object.__setattr__(self, key, sorter)
        return sorter

    def user_index(self, raw_ids: Any, missing: str = "raise"):
        """Indices of raw user ids (vectorised).

        Parameters
        ----------
        raw_ids : scalar or array_like
            Raw user ids.
        missing : {"raise", "ignore"}, default "raise"
            Unknown ids raise :class:`KeyError` naming them, or give ``-1`` with "ignore".

        Returns
        -------
        int or numpy.ndarray of int64
            A scalar for a scalar input.

        Examples
        --------
        >>> r = Ratings.from_triples(["b", "a"], [1, 1], [1.0, 2.0])
        >>> r.user_index(["a", "b"]).tolist(), r.user_index("zz", missing="ignore")
        ([0, 1], -1)
        """
        return _lookup(self.user_ids, self._sorter("user"), raw_ids, missing, "user")

    def item_index(self, raw_ids: Any, missing: str = "raise"):
        """Indices of raw item ids (vectorised); see :meth:`user_index`.

        Parameters
        ----------
        raw_ids : scalar or array_like
            Raw item ids.
        missing : {"raise", "ignore"}, default "raise"
            Unknown ids raise :class:`KeyError`, or give ``-1`` with "ignore".

        Returns
        -------
        int or numpy.ndarray of int64

        Examples
        --------
        >>> r = Ratings.from_triples([1, 1], [30, 10], [1.0, 2.0])
        >>> r.item_index([10, 30]).tolist()
        [0, 1]
        """
        return _lookup(self.item_ids, self._sorter("item"), raw_ids, missing, "item")

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def from_triples(
        cls,
        raw_users: Any,
        raw_items: Any,
        ratings: Any,
        timestamps: Any = None,
        *,
        duplicates: str = "error",
        user_ids: Any = None,
        item_ids: Any = None,
    ) -> "Ratings":
        """Build from (user, item, rating[, timestamp]) triples with arbitrary raw ids.

        Raw ids (ints or strings) are mapped to contiguous indices in sorted raw-id order,
        unless explicit id maps are given (to index new data against existing maps).

        Parameters
        ----------
        raw_users, raw_items : array_like
            Raw ids, one per rating.
        ratings : array_like of float
            Rating values; NaN/inf are rejected.
        timestamps : array_like of int, optional
            Unix timestamps (or ``datetime64``), one per rating.
        duplicates : {"error", "mean", "last", "sum"}, default "error"
            What to do with repeated (user, item) pairs: raise, or aggregate. ``"last"``
            keeps the last occurrence in input order (and its timestamp); ``"mean"`` and
            ``"sum"`` keep the latest timestamp of the group. Aggregated output is sorted by
            (user, item); otherwise input order is kept.
        user_ids, item_ids : array_like, optional
            Fixed id maps to use instead of the sorted unique raw ids; raw ids not in them
            raise :class:`KeyError`.

        Returns
        -------
        Ratings

        Raises
        ------
        ValueError
            On unequal lengths, empty input, non-finite ratings (naming the count and the
            first position) or duplicates with ``duplicates="error"`` (naming the count).
        KeyError
            On raw ids missing from given ``user_ids``/``item_ids``.

        Examples
        --------
        >>> r = Ratings.from_triples([3, 1, 3], ["x", "y", "x"], [1.0, 2.0, 5.0],
        ...                          duplicates="mean")
        >>> r.user_ids.tolist(), r.item_ids.tolist(), r.ratings.tolist()
        ([1, 3], ['x', 'y'], [2.0, 3.0])
        """
        if duplicates not in _DUPLICATE_POLICIES:
            raise ValueError(f"duplicates must be one of {_DUPLICATE_POLICIES}, got {duplicates!r}")
        ru = _as_id_array(raw_users, "raw_users")
        ri = _as_id_array(raw_items, "raw_items")
        r = np.asarray(ratings)
        if r.ndim != 1:
            raise ValueError(f"ratings must be one-dimensional, got shape {r.shape}")
        lengths = {"raw_users": len(ru), "raw_items": len(ri), "ratings": len(r)}
        ts = None
        if timestamps is not None:
            ts = np.asarray(timestamps)
            if ts.ndim != 1:
                raise ValueError(f"timestamps must be one-dimensional, got shape {ts.shape}")
            lengths["timestamps"] = len(ts)
        if len(set(lengths.values())) != 1:
            raise ValueError(f"inputs differ in length: {lengths}")
        if len(r) == 0:
            raise ValueError("no ratings given (empty input)")
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                r32 = r.astype(np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"ratings must be numeric, got dtype {r.dtype}") from exc
        _check_finite(r32, "ratings")
        if ts is not None:
            if ts.dtype.kind == "M":
                ts = ts.astype("datetime64[s]").astype(np.int64)
            elif ts.dtype.kind == "f":
                _check_finite(ts, "timestamps")
                ts = ts.astype(np.int64)
            elif ts.dtype.kind not in "iu":
                raise ValueError(f"timestamps must be integers or datetime64, got {ts.dtype}")
            ts = ts.astype(np.int64, copy=False)

        if user_ids is None:
            umap, ucodes = _factorize(ru)
        else:
            umap = _as_id_array(user_ids, "user_ids")
            ucodes = _lookup(umap, _sorter_of(umap), ru, "raise", "user")
        if item_ids is None:
            imap, icodes = _factorize(ri)
        else:
            imap = _as_id_array(item_ids, "item_ids")
            icodes = _lookup(imap, _sorter_of(imap), ri, "raise", "item")
        u = ucodes.astype(np.int32)
        i = icodes.astype(np.int32)
        u, i, r32, ts = _handle_duplicates(u, i, r32, ts, len(imap), duplicates)
        if user_ids is not None or item_ids is not None:
            return cls(u, i, r32, ts, umap, imap)  # validate the given maps
        return cls._new(u, i, r32, ts, umap, imap)

    @classmethod
    def from_pandas(
        cls,
        df: Any,
        user: str = "user",
        item: str = "item",
        rating: str = "rating",
        timestamp: str | None = None,
        **kw: Any,
    ) -> "Ratings":
        """Build from a :class:`pandas.DataFrame` (or any mapping of columns).

        Parameters
        ----------
        df : pandas.DataFrame or mapping
            Holds the columns.
        user, item, rating : str
            Column names of raw user ids, raw item ids and ratings.
        timestamp : str, optional
            Column of timestamps (integers or datetimes).
        **kw
            Passed to :meth:`from_triples` (``duplicates=``, ``user_ids=``, ``item_ids=``).

        Returns
        -------
        Ratings

        Raises
        ------
        KeyError
            If a named column is missing (the message lists the available columns).

        Examples
        --------
        >>> Ratings.from_pandas({"user": [1, 2], "item": [5, 5], "rating": [3.0, 4.0]}).shape
        (2, 1)
        """
        cols = list(getattr(df, "columns", None) if hasattr(df, "columns") else df.keys())

        def col(name: str) -> np.ndarray:
            if name not in cols:
                raise KeyError(f"column {name!r} not found; available columns: {cols}")
            c = df[name]
            return c.to_numpy() if hasattr(c, "to_numpy") else np.asarray(c)

        ts = col(timestamp) if timestamp is not None else None
        return cls.from_triples(col(user), col(item), col(rating), ts, **kw)

    @classmethod
    def from_sparse(cls, X: Any) -> "Ratings":
        """Build from a scipy.sparse matrix (rows users, columns items), identity id maps.

        Every stored entry (explicit zeros included) is a rating; duplicate entries of a
        COO matrix are summed, following scipy's own semantics.

        Parameters
        ----------
        X : scipy.sparse matrix or array
            Shape ``(n_users, n_items)``.

        Returns
        -------
        Ratings
            ``user_ids == arange(n_users)``, ``item_ids == arange(n_items)``, row-major order.

        Examples
        --------
        >>> import scipy.sparse as sp
        >>> r = Ratings.from_sparse(sp.csr_matrix([[0, 4.0], [1.0, 0]]))
        >>> r.shape, r.items.tolist()
        ((2, 2), [1, 0])
        """
        if not sp.issparse(X):
            raise TypeError(f"from_sparse() needs a scipy.sparse matrix, got {type(X).__name__}")
        csr = sp.csr_matrix(X)
        csr.sum_duplicates()
        m, n = csr.shape
        if m > np.iinfo(np.int32).max or n > np.iinfo(np.int32).max:
            raise ValueError(f"matrix shape {csr.shape} exceeds int32 indices")
        users = np.repeat(np.arange(m, dtype=np.int32), np.diff(csr.indptr))
        items = csr.indices.astype(np.int32)
        with np.errstate(over="ignore", invalid="ignore"):
            data = csr.data.astype(np.float32)
        _check_finite(data, "sparse matrix data")
        return cls._new(
            users, items, data, None, np.arange(m, dtype=np.int64), np.arange(n, dtype=np.int64)
        )


def _sorter_of(ids: np.ndarray) -> np.ndarray | None:
    if len(ids) > 1 and not np.all(ids[1:] > ids[:-1]):
        return np.argsort(ids, kind="stable")
    return None


def _check_finite(values: np.ndarray, what: str) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{int(bad.sum())} non-finite {what} value(s) (NaN or inf); first at position "
            f"{first}: {values[first]!r}"
        )


def _handle_duplicates(u, i, r, ts, n_items, policy):
    keys = u.astype(np.int64) * max(n_items, 1) + i
    sorted_keys = np.sort(keys)
    dup_sorted = sorted_keys[1:] == sorted_keys[:-1]
    n_dup = int(np.count_nonzero(dup_sorted))
    if n_dup == 0:
        return u, i, r, ts
    if policy == "error":
        n_pairs = int(np.count_nonzero(dup_sorted & ~np.r_[False, dup_sorted[:-1]]))
        raise ValueError(
            f"{n_dup} duplicate rating(s) of {n_pairs} (user, item) pair(s); pass "
            "duplicates='mean', 'last' or 'sum' to aggregate them"
        )
    logger.info("aggregating %d duplicate rating(s) with duplicates=%r", n_dup, policy)
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
    ends = np.r_[starts[1:], len(sk)]
    ukeys = sk[starts]
    if policy == "last":
        pick = order[ends - 1]
        r_out = r[pick]
        ts_out = None if ts is None else ts[pick]
    else:
        sums = np.add.reduceat(r[order].astype(np.float64), starts)
        if policy == "mean":
            sums = sums / (ends - starts)
        with np.errstate(over="ignore", invalid="ignore"):
            r_out = sums.astype(np.float32)
        _check_finite(r_out, "aggregated ratings")
        ts_out = None if ts is None else np.maximum.reduceat(ts[order], starts)
    nb = max(n_items, 1)
    return (ukeys // nb).astype(np.int32), (ukeys % nb).astype(np.int32), r_out, ts_out


def _import_pandas(what: str):
    try:
        import pandas as pd  # noqa: PLC0415 - optional dependency, imported lazily
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"{what} needs pandas, which is not installed; install it with `pip install pandas`"
            " (and `pip install pyarrow` for parquet files)"
        ) from exc
    return pd


# --------------------------------------------------------------------------------------
# text parsing
# --------------------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        logger.debug("%s is not UTF-8; decoding as latin-1", path)
        return data.decode("latin-1")


def _text_lines(text: str) -> list[str]:
    """Split on LF / CRLF / CR only (never on the Unicode breaks str.splitlines knows)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


class _Table:
    """Non-blank lines of a delimited text file, with 1-based line numbers and header."""

    def __init__(self, path: Path, text: str, sep: str | None, header: bool | str, rating_col):
        self.path = path
        self.sep = sep
        lines = _text_lines(text)
        if sep is not None and len(sep) > 1:
            # multi-character separator such as '::' -> a control character never in data
            lines = [ln.replace(sep, "\x1f") for ln in lines] if lines else lines
            self._split_sep: str | None = "\x1f"
        else:
            self._split_sep = sep
        blank = np.fromiter((not ln or ln.isspace() for ln in lines), dtype=bool, count=len(lines))
        if blank.any():
            keep = np.flatnonzero(~blank)
            self.linenos = keep + 1
            lines = [lines[k] for k in keep]
        else:
            self.linenos = np.arange(1, len(lines) + 1)
        self.header: list[str] | None = None
        self.header_lineno = 0
        if lines:
            first = self._split(lines[0])
            if header == "auto":
                has_header = _looks_like_header(first, rating_col)
            else:
                has_header = bool(header)
            if has_header:
                self.header = [f.strip().strip('"') for f in first]
                self.header_lineno = int(self.linenos[0])
                lines = lines[1:]
                self.linenos = self.linenos[1:]
        self.lines = lines

    def _split(self, line: str) -> list[str]:
        return line.split(self._split_sep) if self._split_sep is not None else line.split()

    def where(self, k: int) -> str:
        return f"{self.path}: line {int(self.linenos[k])}"

    def columns(self, ncols: int | None, min_cols: int) -> list[list[str]]:
        """Split all lines into fields; ``ncols`` exact count or ``None`` for >= min_cols."""
        lines = self.lines
        n = len(lines)
        s = self._split_sep
        if s is not None:
            counts = np.fromiter((ln.count(s) for ln in lines), dtype=np.int64, count=n) + 1
        else:
            counts = np.fromiter((len(ln.split()) for ln in lines), dtype=np.int64, count=n)
        if ncols is not None:
            bad = np.flatnonzero(counts != ncols)
        else:
            bad = np.flatnonzero(counts < min_cols)
        if bad.size:
            k = int(bad[0])
            want = f"{ncols}" if ncols is not None else f"at least {min_cols}"
            sep_name = "whitespace" if self.sep is None else repr(self.sep)
            raise ValueError(
                f"{self.where(k)}: expected {want} fields separated by {sep_name}, found "
                f"{int(counts[k])}: {lines[k][:200]!r}"
                + (f" ({bad.size} malformed line(s) in total)" if bad.size > 1 else "")
            )
        if n and (counts == counts[0]).all():
            width = int(counts[0])
            flat = s.join(lines).split(s) if s is not None else " ".join(lines).split()
            return [flat[j::width] for j in range(width)]
        rows = [self._split(ln) for ln in lines]
        return [[row[j] if j < len(row) else "" for row in rows] for j in range(min_cols)]


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _looks_like_header(fields: list[str], rating_col) -> bool:
    if isinstance(rating_col, str):
        return True
    if rating_col is None:
        return not all(_is_number(f) for f in fields)
    if rating_col >= len(fields):
        return not all(_is_number(f) for f in fields)
    return not _is_number(fields[rating_col].strip().strip('"'))


def _first_bad(values: Sequence[str], conv) -> int:
    for k, v in enumerate(values):
        try:
            x = conv(v)
        except (ValueError, TypeError, OverflowError):
            return k
        if isinstance(x, float) and not math.isfinite(x):
            return k
    return -1  # pragma: no cover - only called after a failure


def _parse_int(table: _Table, values: list[str], what: str) -> np.ndarray:
    try:
        return np.fromiter(map(int, values), dtype=np.int64, count=len(values))
    except (ValueError, OverflowError):
        k = _first_bad(values, int)
        raise ValueError(
            f"{table.where(k)}: {what} {values[k]!r} is not an integer"
        ) from None


def _parse_float(table: _Table, values: list[str], what: str) -> np.ndarray:
    try:
        arr = np.fromiter(map(float, values), dtype=np.float64, count=len(values))
    except ValueError:
        k = _first_bad(values, float)
        raise ValueError(f"{table.where(k)}: {what} {values[k]!r} is not a number") from None
    bad = ~np.isfinite(arr)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{table.where(k)}: {what} {values[k]!r} is not finite "
            f"({int(bad.sum())} non-finite value(s) in total)"
        )
    return arr


def _parse_id(table: _Table, values: list[str], what: str) -> np.ndarray:
    """Integer ids when every value is an integer, else stripped strings."""
    try:
        return np.fromiter(map(int, values), dtype=np.int64, count=len(values))
    except (ValueError, OverflowError):
        return np.array([v.strip().strip('"') for v in values], dtype=str)


def _parse_time(table: _Table, values: list[str], what: str) -> np.ndarray:
    """Integer unix timestamps, float seconds, or ISO dates / datetimes."""
    try:
        return np.fromiter(map(int, values), dtype=np.int64, count=len(values))
    except (ValueError, OverflowError):
        pass
    try:
        return _parse_float(table, values, what).astype(np.int64)
    except ValueError:
        pass
    try:
        stripped = [v.strip().strip('"').replace(" ", "T") for v in values]
        return np.array(stripped, dtype="datetime64[s]").astype(np.int64)
    except ValueError:
        k = _first_bad(values, lambda v: np.datetime64(v.strip().strip('"').replace(" ", "T"), "s"))
        raise ValueError(
            f"{table.where(k)}: {what} {values[k]!r} is neither a unix time nor an ISO date"
        ) from None


def _empty(path: Path, table: _Table) -> None:
    if not table.lines:
        raise ValueError(f"{path}: no ratings found (file is empty or has only a header)")


def _finish(path: Path, table: _Table, u, i, r, ts, t0: float, what: str, **kw) -> Ratings:
    try:
        out = Ratings.from_triples(u, i, r, ts, **kw)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    logger.info(
        "loaded %s (%s): %d ratings, %d users, %d items in %.2f s",
        path, what, len(out), out.shape[0], out.shape[1], time.perf_counter() - t0,
    )
    return out


# --------------------------------------------------------------------------------------
# loaders
# --------------------------------------------------------------------------------------
def _read_ml100k(path: Path) -> tuple[np.ndarray, ...]:
    text = _read_text(path)
    first = next((ln for ln in _text_lines(text[:4096]) if ln.strip()), "")
    sep = "\t" if "\t" in first else None
    table = _Table(path, text, sep, header=False, rating_col=2)
    _empty(path, table)
    cols = table.columns(4, 4)
    u = _parse_int(table, cols[0], "user id")
    i = _parse_int(table, cols[1], "item id")
    r = _parse_float(table, cols[2], "rating")
    ts = _parse_int(table, cols[3], "timestamp")
    return u, i, r, ts


def load_movielens_100k(path: str | os.PathLike, *, duplicates: str = "error") -> Ratings:
    """Load a MovieLens 100K ratings file (``u.data``, ``ua.base``, ``u1.test``, ...).

    The format is ``user item rating timestamp`` separated by tabs, without a header.

    Parameters
    ----------
    path : str or path-like
        The file.
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        See :meth:`Ratings.from_triples`.

    Returns
    -------
    Ratings
        With timestamps; id maps hold the raw MovieLens ids.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> r = load_movielens_100k("ml-100k/u.data")  # doctest: +SKIP
    >>> r.shape  # doctest: +SKIP
    (943, 1682)
    """
    path = Path(path)
    t0 = time.perf_counter()
    u, i, r, ts = _read_ml100k(path)
    return _finish(path, None, u, i, r, ts, t0, "MovieLens 100K", duplicates=duplicates)


def load_movielens_100k_split(
    directory: str | os.PathLike, split: str = "ua"
) -> tuple[Ratings, Ratings]:
    """Load an official MovieLens 100K split (``ua``, ``ub``, ``u1`` ... ``u5``).

    Train (``<split>.base``) and test (``<split>.test``) share one pair of id maps built over
    the union of both files, so an index means the same user/item in both.

    Parameters
    ----------
    directory : str or path-like
        The ``ml-100k`` directory.
    split : {"ua", "ub", "u1", "u2", "u3", "u4", "u5"}, default "ua"
        Which split.

    Returns
    -------
    (Ratings, Ratings)
        ``(train, test)`` with identical ``user_ids``, ``item_ids`` and ``shape``.

    Raises
    ------
    ValueError
        On an unknown split name, a malformed line, or a (user, item) pair that occurs in
        both files.

    Examples
    --------
    >>> train, test = load_movielens_100k_split("ml-100k", "ua")  # doctest: +SKIP
    >>> len(train), len(test), train.shape == test.shape  # doctest: +SKIP
    (90570, 9430, True)
    """
    valid = ("ua", "ub", "u1", "u2", "u3", "u4", "u5")
    if split not in valid:
        raise ValueError(f"split must be one of {valid}, got {split!r}")
    directory = Path(directory)
    t0 = time.perf_counter()
    base_path, test_path = directory / f"{split}.base", directory / f"{split}.test"
    for p in (base_path, test_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} not found")
    bu, bi, br, bt = _read_ml100k(base_path)
    tu, ti, tr, tt = _read_ml100k(test_path)
    umap, _ = _factorize(np.concatenate([bu, tu]))
    imap, _ = _factorize(np.concatenate([bi, ti]))
    parts = []
    for p, (u, i, r, t) in ((base_path, (bu, bi, br, bt)), (test_path, (tu, ti, tr, tt))):
        try:
            parts.append(Ratings.from_triples(u, i, r, t, user_ids=umap, item_ids=imap))
        except ValueError as exc:
            raise ValueError(f"{p}: {exc}") from None
    train, test = parts
    n = train.shape[1]
    overlap = np.intersect1d(
        train.users.astype(np.int64) * n + train.items, test.users.astype(np.int64) * n + test.items
    )
    if overlap.size:
        raise ValueError(
            f"{base_path} and {test_path} share {overlap.size} (user, item) pair(s)"
        )
    # share the exact same map objects
    test = Ratings._new(test.users, test.items, test.ratings, test.timestamps,
                        train.user_ids, train.item_ids)
    logger.info("loaded MovieLens 100K split %r from %s: %d train / %d test in %.2f s",
                split, directory, len(train), len(test), time.perf_counter() - t0)
    return train, test


def _named_columns(table: _Table, path: Path, wanted: dict[str, Sequence[str]]) -> dict[str, int]:
    """Resolve logical column names against a header (case-insensitive alternatives)."""
    header = [h.lower() for h in (table.header or [])]
    out = {}
    for key, alternatives in wanted.items():
        for alt in alternatives:
            if alt.lower() in header:
                out[key] = header.index(alt.lower())
                break
    return out


def load_movielens_csv(path: str | os.PathLike, *, duplicates: str = "error") -> Ratings:
    """Load a MovieLens ``ratings.csv`` (latest, latest-small, 20M, 25M, 32M).

    Header ``userId,movieId,rating,timestamp`` (columns are found by name; a file without
    a header is read in that order; the timestamp column is optional).

    Parameters
    ----------
    path : str or path-like
        The CSV file (LF or CRLF, UTF-8 or latin-1, optionally gzip-compressed).
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        See :meth:`Ratings.from_triples`.

    Returns
    -------
    Ratings
        With timestamps when the file has them.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> r = load_movielens_csv("ml-latest-small/ratings.csv")  # doctest: +SKIP
    >>> len(r), r.shape  # doctest: +SKIP
    (100836, (610, 9724))
    """
    path = Path(path)
    t0 = time.perf_counter()
    text = _read_text(path)
    table = _Table(path, text, ",", header="auto", rating_col=2)
    _empty(path, table)
    if table.header is not None:
        idx = _named_columns(
            table, path,
            {"user": ("userId", "user_id", "user"), "item": ("movieId", "movie_id", "item", "itemId"),
             "rating": ("rating",), "timestamp": ("timestamp", "time")},
        )
        missing = [k for k in ("user", "item", "rating") if k not in idx]
        if missing:
            raise ValueError(
                f"{path}: line {table.header_lineno}: header "
                f"{table.header} lacks column(s) for {missing} (expected userId,movieId,rating,timestamp)"
            )
        ncols = len(table.header)
    else:
        ncols = len(table._split(table.lines[0]))
        if ncols not in (3, 4):
            raise ValueError(f"{table.where(0)}: expected 3 or 4 fields, found {ncols}")
        idx = {"user": 0, "item": 1, "rating": 2}
        if ncols == 4:
            idx["timestamp"] = 3
    cols = table.columns(ncols, ncols)
    u = _parse_int(table, cols[idx["user"]], "userId")
    i = _parse_int(table, cols[idx["item"]], "movieId")
    r = _parse_float(table, cols[idx["rating"]], "rating")
    ts = _parse_int(table, cols[idx["timestamp"]], "timestamp") if "timestamp" in idx else None
    return _finish(path, table, u, i, r, ts, t0, "MovieLens CSV", duplicates=duplicates)


def load_movielens_dat(path: str | os.PathLike, *, duplicates: str = "error") -> Ratings:
    """Load a MovieLens 1M / 10M ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``).

    Parameters
    ----------
    path : str or path-like
        The file.
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        See :meth:`Ratings.from_triples`.

    Returns
    -------
    Ratings
        With timestamps.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> r = load_movielens_dat("ml-1m/ratings.dat")  # doctest: +SKIP
    >>> r.shape  # doctest: +SKIP
    (6040, 3706)
    """
    path = Path(path)
    t0 = time.perf_counter()
    table = _Table(path, _read_text(path), "::", header=False, rating_col=2)
    _empty(path, table)
    cols = table.columns(4, 4)
    u = _parse_int(table, cols[0], "UserID")
    i = _parse_int(table, cols[1], "MovieID")
    r = _parse_float(table, cols[2], "Rating")
    ts = _parse_int(table, cols[3], "Timestamp")
    return _finish(path, table, u, i, r, ts, t0, "MovieLens .dat", duplicates=duplicates)


def _parse_netflix_file(path: Path) -> tuple[np.ndarray, ...]:
    lines = _text_lines(_read_text(path))
    n = len(lines)
    stripped = [ln.strip() for ln in lines]
    is_blank = np.fromiter((not s for s in stripped), dtype=bool, count=n)
    is_hdr = np.fromiter((s.endswith(":") for s in stripped), dtype=bool, count=n)
    hdr_pos = np.flatnonzero(is_hdr)
    data_pos = np.flatnonzero(~is_hdr & ~is_blank)
    if data_pos.size == 0:
        raise ValueError(f"{path}: no ratings found")
    if hdr_pos.size == 0 or data_pos[0] < hdr_pos[0]:
        k = int(data_pos[0])
        raise ValueError(
            f"{path}: line {k + 1}: rating line before any 'movieid:' header: {lines[k][:200]!r}"
        )
    movie_ids = np.empty(hdr_pos.size, dtype=np.int64)
    for j, p in enumerate(hdr_pos):
        try:
            movie_ids[j] = int(stripped[p][:-1])
        except ValueError:
            raise ValueError(
                f"{path}: line {p + 1}: movie header {lines[p][:200]!r} is not '<integer>:'"
            ) from None
    block = np.cumsum(is_hdr) - 1
    items = movie_ids[block[data_pos]]
    data_lines = [stripped[k] for k in data_pos]
    counts = np.fromiter((s.count(",") for s in data_lines), dtype=np.int64, count=len(data_lines))
    bad = np.flatnonzero(counts != 2)
    if bad.size:
        k = int(data_pos[bad[0]])
        raise ValueError(
            f"{path}: line {k + 1}: expected 3 fields 'customer,rating,date', found "
            f"{int(counts[bad[0]]) + 1}: {lines[k][:200]!r}"
        )
    flat = ",".join(data_lines).split(",")
    linenos_table = _Table.__new__(_Table)
    linenos_table.path = path
    linenos_table.linenos = data_pos + 1
    u = _parse_int(linenos_table, flat[0::3], "customer id")
    r = _parse_float(linenos_table, flat[1::3], "rating")
    dates = flat[2::3]
    try:
        ts = np.array(dates, dtype="datetime64[D]").astype(np.int64) * 86400
    except ValueError:
        k = _first_bad(dates, lambda v: np.datetime64(v, "D"))
        raise ValueError(
            f"{linenos_table.where(k)}: date {dates[k]!r} is not YYYY-MM-DD"
        ) from None
    return u, items, r, ts


def load_netflix(path_or_dir: str | os.PathLike, *, duplicates: str = "error") -> Ratings:
    """Load Netflix-prize ratings.

    Accepts a per-movie file (``mv_0000001.txt``: a ``1:`` line, then
    ``customer,rating,YYYY-MM-DD`` lines), a ``combined_data_*.txt`` style file (many
    ``movieid:`` blocks), or a directory holding either kind (``training_set/`` is looked
    into). Dates become unix timestamps (midnight UTC).

    Parameters
    ----------
    path_or_dir : str or path-like
        A file or a directory.
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        See :meth:`Ratings.from_triples`.

    Returns
    -------
    Ratings
        Users are customer ids, items movie ids, with timestamps.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> r = load_netflix("netflix/training_set")  # doctest: +SKIP
    >>> r.shape  # doctest: +SKIP
    (480189, 17770)
    """
    path = Path(path_or_dir)
    t0 = time.perf_counter()
    if path.is_dir():
        root = path / "training_set" if (path / "training_set").is_dir() else path
        files = sorted(root.glob("mv_*.txt")) or sorted(root.glob("combined_data_*.txt"))
        if not files:
            raise ValueError(f"{path}: no mv_*.txt or combined_data_*.txt files found")
    else:
        files = [path]
    parts = [_parse_netflix_file(f) for f in files]
    u, i, r, ts = (np.concatenate([p[k] for p in parts]) for k in range(4))
    return _finish(path, None, u, i, r, ts, t0, f"Netflix, {len(files)} file(s)",
                   duplicates=duplicates)


def _sniff_sep(path: Path, text: str) -> str | None:
    sample = [ln for ln in _text_lines(text[:65536]) if ln.strip()][:20]
    if not sample:
        return None
    if all("::" in ln for ln in sample):
        return "::"
    for cand in ("\t", ",", ";", "|"):
        counts = {ln.count(cand) for ln in sample}
        if len(counts) == 1 and counts.pop() >= 1:
            return cand
    for cand in ("\t", ",", ";"):
        if all(cand in ln for ln in sample):
            return cand
    return None


def _resolve_column(spec: int | str, table: _Table, path: Path, what: str) -> int:
    if isinstance(spec, (int, np.integer)):
        if spec < 0:
            raise ValueError(f"{what} column index must be >= 0, got {spec}")
        return int(spec)
    if table.header is None:
        raise ValueError(f"{path}: column {spec!r} given by name but the file has no header")
    if spec in table.header:
        return table.header.index(spec)
    lowered = [h.lower() for h in table.header]
    if spec.lower() in lowered:
        return lowered.index(spec.lower())
    raise ValueError(f"{path}: column {spec!r} not in header {table.header}")


def _load_parquet(path: Path, columns, timestamp_column, **kw) -> Ratings:
    pd = _import_pandas(f"reading {path}")
    try:
        df = pd.read_parquet(path)
    except ImportError as exc:  # pragma: no cover - environment dependent
        raise ImportError(
            f"reading {path} needs pyarrow (or fastparquet); install it with `pip install pyarrow`"
        ) from exc
    names = list(df.columns)

    def name(spec):
        if isinstance(spec, (int, np.integer)):
            return names[int(spec)]
        return spec

    ucol, icol, rcol = (name(c) for c in columns)
    tcol = name(timestamp_column) if timestamp_column is not None else None
    return Ratings.from_pandas(df, ucol, icol, rcol, tcol, **kw)


def load_triples(
    path: str | os.PathLike,
    *,
    sep: str | None = None,
    columns: Sequence[int | str] = (0, 1, 2),
    header: bool | str = "auto",
    timestamp_column: int | str | None = None,
    duplicates: str = "error",
) -> Ratings:
    """Load generic (user, item, rating) triples from a delimited text or parquet file.

    Parameters
    ----------
    path : str or path-like
        A text file (``.csv``, ``.tsv``, ``.txt``, ``.dat``..., optionally gzip-compressed)
        or a ``.parquet`` file (read with pandas + pyarrow, imported lazily).
    sep : str, optional
        Field separator; sniffed when ``None``: ``'::'``, tab, comma, ``';'``, ``'|'``,
        else any whitespace.
    columns : sequence of 3 int or str, default (0, 1, 2)
        User, item and rating columns, by 0-based position or by header name.
    header : {"auto", True, False}, default "auto"
        With "auto", the first line is a header when its rating field is not a number.
    timestamp_column : int or str, optional
        Column of timestamps: integer unix seconds, float seconds or ISO dates.
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        See :meth:`Ratings.from_triples`.

    Returns
    -------
    Ratings
        Ids that are all integers become integer raw ids; otherwise strings.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> r = load_triples("user_artists.dat")  # doctest: +SKIP
    >>> r.shape  # doctest: +SKIP
    (1892, 17632)
    """
    path = Path(path)
    t0 = time.perf_counter()
    columns = tuple(columns)
    if len(columns) != 3:
        raise ValueError(f"columns must name 3 columns (user, item, rating), got {columns!r}")
    if header not in ("auto", True, False):
        raise ValueError(f"header must be 'auto', True or False, got {header!r}")
    if path.suffix.lower() in (".parquet", ".pq"):
        return _load_parquet(path, columns, timestamp_column, duplicates=duplicates)
    text = _read_text(path)
    if sep is None:
        sep = _sniff_sep(path, text)
    elif sep == "":
        raise ValueError("sep must be a non-empty string or None")
    rating_spec = columns[2]
    if sep == "," and '"' in text:
        return _load_quoted_csv(path, text, columns, header, timestamp_column, duplicates, t0)
    table = _Table(path, text, sep, header=header, rating_col=rating_spec)
    _empty(path, table)
    idx = [_resolve_column(c, table, path, w) for c, w in zip(columns, ("user", "item", "rating"))]
    tcol = None
    if timestamp_column is not None:
        tcol = _resolve_column(timestamp_column, table, path, "timestamp")
    need = max(idx + ([tcol] if tcol is not None else [])) + 1
    cols = table.columns(None, need)
    u = _parse_id(table, cols[idx[0]], "user id")
    i = _parse_id(table, cols[idx[1]], "item id")
    r = _parse_float(table, cols[idx[2]], "rating")
    ts = _parse_time(table, cols[tcol], "timestamp") if tcol is not None else None
    return _finish(path, table, u, i, r, ts, t0, f"triples, sep={sep!r}", duplicates=duplicates)


def _load_quoted_csv(path, text, columns, header, timestamp_column, duplicates, t0) -> Ratings:
    """CSV with quoted fields (commas inside ids): the slower csv-module path."""
    lines = _text_lines(text)
    rows: list[list[str]] = []
    linenos: list[int] = []
    reader = csv.reader(io.StringIO("\n".join(lines)))
    for row in reader:
        if row and any(f.strip() for f in row):
            rows.append(row)
            linenos.append(reader.line_num)
    table = _Table.__new__(_Table)
    table.path, table.sep, table._split_sep = path, ",", ","
    table.linenos = np.asarray(linenos, dtype=np.int64)
    table.header = None
    if rows:
        has_header = (
            _looks_like_header(rows[0], columns[2]) if header == "auto" else bool(header)
        )
        if has_header:
            table.header = [f.strip() for f in rows[0]]
            rows, table.linenos = rows[1:], table.linenos[1:]
    table.lines = rows
    _empty(path, table)
    idx = [_resolve_column(c, table, path, w) for c, w in zip(columns, ("user", "item", "rating"))]
    tcol = None
    if timestamp_column is not None:
        tcol = _resolve_column(timestamp_column, table, path, "timestamp")
    need = max(idx + ([tcol] if tcol is not None else [])) + 1
    for k, row in enumerate(rows):
        if len(row) < need:
            raise ValueError(
                f"{table.where(k)}: expected at least {need} fields, found {len(row)}: {row!r}"
            )
    col = lambda j: [row[j] for row in rows]  # noqa: E731
    u = _parse_id(table, col(idx[0]), "user id")
    i = _parse_id(table, col(idx[1]), "item id")
    r = _parse_float(table, col(idx[2]), "rating")
    ts = _parse_time(table, col(tcol), "timestamp") if tcol is not None else None
    return _finish(path, table, u, i, r, ts, t0, "quoted CSV", duplicates=duplicates)


_ML100K_NAME = re.compile(r"^(u\.data|u[a-b1-5]\.(base|test))$")


def _first_line(path: Path) -> str:
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if head[:2] == b"\x1f\x8b":
        with gzip.open(path, "rb") as fh:
            head = fh.read(4096)
    return head.decode("latin-1").split("\n", 1)[0].rstrip("\r")


def load(path: str | os.PathLike, **kwargs: Any) -> Ratings:
    """Load ratings, choosing the loader by the file's name, extension and first line.

    ``u.data`` / ``ua.base`` / ``u1.test`` / ``*.base`` / ``*.test`` go to
    :func:`load_movielens_100k`; ``ratings.csv`` (or a CSV whose header starts with
    ``userId,movieId``) to :func:`load_movielens_csv`; ``*.dat`` with ``::`` separators to
    :func:`load_movielens_dat`; ``mv_*.txt`` / ``combined_data*.txt`` to :func:`load_netflix`;
    ``.parquet`` and everything else to :func:`load_triples`. A directory is searched for
    ``u.data``, ``ratings.csv``, ``ratings.dat`` or Netflix files, in that order.

    Parameters
    ----------
    path : str or path-like
        A file or a directory.
    **kwargs
        Passed to the chosen loader.

    Returns
    -------
    Ratings

    Examples
    --------
    >>> load("ml-latest-small/ratings.csv").shape  # doctest: +SKIP
    (610, 9724)
    """
    path = Path(path)
    if path.is_dir():
        for name in ("u.data", "ratings.csv", "ratings.dat"):
            if (path / name).is_file():
                return load(path / name, **kwargs)
        if any(path.glob("mv_*.txt")) or (path / "training_set").is_dir() or any(
            path.glob("combined_data_*.txt")
        ):
            return load_netflix(path, **kwargs)
        raise ValueError(f"{path}: no known ratings file (u.data, ratings.csv, ratings.dat, mv_*.txt)")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = Path(name).suffix
    if _ML100K_NAME.match(name) or suffix in (".base", ".test"):
        return load_movielens_100k(path, **kwargs)
    if suffix in (".parquet", ".pq"):
        return load_triples(path, **kwargs)
    first = _first_line(path)
    if name == "ratings.csv" or (suffix == ".csv" and first.lower().startswith("userid,movieid")):
        return load_movielens_csv(path, **kwargs)
    if suffix == ".dat" and "::" in first:
        return load_movielens_dat(path, **kwargs)
    if name.startswith("mv_") or name.startswith("combined_data") or re.fullmatch(r"\d+:", first.strip()):
        return load_netflix(path, **kwargs)
    return load_triples(path, **kwargs)


def load_titles(path: str | os.PathLike) -> dict[Any, str]:
    """Read movie titles: ``u.item``, ``movies.csv``, ``movies.dat`` or ``movie_titles.txt``.

    Parameters
    ----------
    path : str or path-like
        ``u.item`` (``|``-separated, latin-1), ``movies.csv`` (quoted CSV with header
        ``movieId,title,genres``), ``movies.dat`` (``::``) or Netflix ``movie_titles.txt``
        (``id,year,title``).

    Returns
    -------
    dict
        Raw item id (int where numeric) -> title.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> titles = load_titles("ml-100k/u.item")  # doctest: +SKIP
    >>> titles[1]  # doctest: +SKIP
    'Toy Story (1995)'
    """
    path = Path(path)
    text = _read_text(path)
    lines = _text_lines(text)
    first = next((ln for ln in lines if ln.strip()), "")
    name = path.name.lower()

    def key(v: str, lineno: int):
        v = v.strip()
        try:
            return int(v)
        except ValueError:
            if not v:
                raise ValueError(f"{path}: line {lineno}: empty movie id") from None
            return v

    titles: dict[Any, str] = {}
    if "::" in first:
        for k, ln in enumerate(lines, 1):
            if not ln.strip():
                continue
            f = ln.split("::")
            if len(f) < 2:
                raise ValueError(f"{path}: line {k}: expected 'id::title::genres': {ln[:200]!r}")
            titles[key(f[0], k)] = f[1]
        return titles
    if "|" in first and first.split("|", 1)[0].strip().isdigit():
        for k, ln in enumerate(lines, 1):
            if not ln.strip():
                continue
            f = ln.split("|")
            if len(f) < 2:
                raise ValueError(f"{path}: line {k}: expected 'id|title|...': {ln[:200]!r}")
            titles[key(f[0], k)] = f[1]
        return titles
    if name.startswith("movie_titles") or re.match(r"^\d+,(\d{4}|NULL),", first):
        for k, ln in enumerate(lines, 1):
            if not ln.strip():
                continue
            f = ln.split(",", 2)
            if len(f) < 3:
                raise ValueError(f"{path}: line {k}: expected 'id,year,title': {ln[:200]!r}")
            titles[key(f[0], k)] = f[2]
        return titles
    reader = csv.reader(io.StringIO("\n".join(lines)))
    header = None
    for row in reader:
        k = reader.line_num
        if not row or not any(c.strip() for c in row):
            continue
        if header is None:
            lowered = [c.strip().lower() for c in row]
            if "title" in lowered:
                header = lowered
                continue
            header = ["movieid", "title"]
        id_col = next((header.index(c) for c in ("movieid", "itemid", "id") if c in header), 0)
        t_col = header.index("title") if "title" in header else 1
        if len(row) <= max(id_col, t_col):
            raise ValueError(f"{path}: line {k}: expected {len(header)} fields, found {len(row)}")
        titles[key(row[id_col], k)] = row[t_col]
    return titles


# --------------------------------------------------------------------------------------
# synthetic data
# --------------------------------------------------------------------------------------
_PRESETS: dict[str, tuple[int, int, int]] = {
    # name: (users, items, ratings) -- the data sets of the clMF paper's Table 1
    "movielens-100k": (943, 1_682, 100_000),
    "movielens-10m": (71_567, 65_133, 10_000_054),
    "movielens-20m": (138_493, 26_744, 20_000_263),
    "netflix": (480_189, 17_770, 99_072_112),
    "yahoomusic-r1": (1_948_882, 98_213, 115_579_440),
    "yahoomusic-r4": (7_642, 11_916, 211_231),
    "delicious": (1_867, 69_226, 104_799),
}

_MAX_DENSITY = 0.5
_CHUNK_NNZ = 1 << 19
_HEAVY_FRACTION = 1 / 8
_MAX_ROUNDS = 40
_DOT_BLOCK = 1 << 16


class SyntheticFactors(NamedTuple):
    """The true model behind :func:`synthetic` data (before rounding, clipping and noise).

    ``rating ~ clip(round(global_mean + user_bias[u] + item_bias[i] + user_factors[u] @
    item_factors[i] + noise), 1, 5)``.

    Attributes
    ----------
    user_factors : numpy.ndarray
        ``(n_users, rank)`` float32.
    item_factors : numpy.ndarray
        ``(n_items, rank)`` float32.
    user_bias : numpy.ndarray
        ``(n_users,)`` float32.
    item_bias : numpy.ndarray
        ``(n_items,)`` float32.
    global_mean : float
        The global offset.
    item_popularity : numpy.ndarray
        ``(n_items,)`` float64 sampling probabilities of the items.

    Examples
    --------
    >>> r, f = synthetic(shape=(20, 30), nnz=100, return_factors=True)
    >>> f.user_factors.shape, f.item_factors.shape
    ((20, 8), (30, 8))
    """

    user_factors: np.ndarray
    item_factors: np.ndarray
    user_bias: np.ndarray
    item_bias: np.ndarray
    global_mean: float
    item_popularity: np.ndarray


def _fmt_count(x: int) -> str:
    for div, suf in ((1e6, "M"), (1e3, "K")):
        if x >= div:
            return f"{x / div:.3g}{suf}"
    return str(int(x))


def synthetic_from_spec(spec: str, seed: int = 0) -> tuple[Ratings, str] | None:
    """``(ratings, name)`` of a ``synthetic:USERSxITEMSxRATINGS`` spec (the benchmark's and the
    tuner's data-set syntax, e.g. ``synthetic:200000x10000x4450000`` → ``synthetic-200Kx10Kx4.45M``),
    or None when ``spec`` is not one."""
    m = re.fullmatch(r"synthetic:(\d+)x(\d+)x(\d+)", str(spec).strip())
    if not m:
        return None
    u, i, z = (int(g) for g in m.groups())
    data = synthetic(shape=(u, i), nnz=z, seed=seed)
    return data, f"synthetic-{_fmt_count(u)}x{_fmt_count(i)}x{_fmt_count(z)}"


def list_presets() -> dict[str, tuple[int, int, int]]:
    """The synthetic presets: name -> (n_users, n_items, n_ratings) at ``scale=1``.

    The shapes are those of the data sets of the clMF paper's Table 1.

    Returns
    -------
    dict
        A copy; changing it changes nothing.

    Examples
    --------
    >>> list_presets()["movielens-100k"]
    (943, 1682, 100000)
    """
    return dict(_PRESETS)


def _power_weights(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Zipf-like probabilities ``rank**-exponent`` assigned to a random permutation."""
    w = np.arange(1, n + 1, dtype=np.float64) ** (-float(exponent))
    w = w[rng.permutation(n)]
    return w / w.sum()


def _multinomial(rng: np.random.Generator, total: int, p: np.ndarray) -> np.ndarray:
    p = p / p.sum()
    # numpy requires sum(p[:-1]) <= 1; guard the rounding
    p = np.clip(p, 0, None)
    p[-1] = max(0.0, 1.0 - p[:-1].sum())
    return rng.multinomial(total, p).astype(np.int64)


def _user_counts(rng, nnz: int, m: int, cap: int, exponent: float) -> np.ndarray:
    """Per-user rating counts: >= 1 each, <= cap each, power-law distributed, sum nnz."""
    p = _power_weights(m, exponent, rng)
    counts = 1 + _multinomial(rng, nnz - m, p)
    for _ in range(1000):
        over = counts > cap
        if not over.any():
            break
        excess = int((counts[over] - cap).sum())
        counts[over] = cap
        free = counts < cap
        pf = np.where(free, p, 0.0)
        counts += _multinomial(rng, excess, pf)
    else:  # pragma: no cover - cannot happen while nnz <= m * cap
        raise RuntimeError("could not distribute ratings over users")
    return counts


def _alias_table(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker alias table for O(1) sampling from ``p``."""
    n = len(p)
    q = p * n
    alias = np.arange(n, dtype=np.int32)
    small = list(np.flatnonzero(q < 1.0))
    large = list(np.flatnonzero(q >= 1.0))
    q = q.copy()
    while small and large:
        s = small.pop()
        g = large.pop()
        alias[s] = g
        q[g] -= 1.0 - q[s]
        (small if q[g] < 1.0 else large).append(g)
    for k in small + large:
        q[k] = 1.0
    return q, alias


def _draw_items(rng, size: int, n: int, q: np.ndarray, alias: np.ndarray) -> np.ndarray:
    x = rng.random(size) * n
    j = x.astype(np.int32)
    np.minimum(j, n - 1, out=j)
    x -= j
    return np.where(x < q[j], j, alias[j])


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """Sorted unique values by sort + adjacent compare (faster than hash-based np.unique)."""
    a = np.sort(a)
    if a.size > 1:
        keep = np.empty(a.size, dtype=bool)
        keep[0] = True
        np.not_equal(a[1:], a[:-1], out=keep[1:])
        a = a[keep]
    return a


def _in_sorted(keys: np.ndarray, sorted_arr: np.ndarray) -> np.ndarray:
    if sorted_arr.size == 0 or keys.size == 0:
        return np.zeros(keys.shape, dtype=bool)
    pos = np.searchsorted(sorted_arr, keys)
    np.minimum(pos, sorted_arr.size - 1, out=pos)
    return sorted_arr[pos] == keys


def _exact_sample(rng, users, counts, n, inv_pop, exclude_keys=None) -> np.ndarray:
    """Weighted sampling without replacement (Efraimidis-Spirakis) for a few users.

    Returns sorted int64 keys ``user * n + item``; ``exclude_keys`` (sorted) are avoided.
    """
    out = []
    batch = max(1, (1 << 21) // max(n, 1))
    for b0 in range(0, len(users), batch):
        bu = users[b0: b0 + batch]
        bc = counts[b0: b0 + batch]
        e = rng.standard_exponential((len(bu), n)) * inv_pop[None, :]
        if exclude_keys is not None and exclude_keys.size:
            lo = np.searchsorted(exclude_keys, bu.astype(np.int64) * n)
            hi = np.searchsorted(exclude_keys, (bu.astype(np.int64) + 1) * n)
            for r_, (a, b) in enumerate(zip(lo, hi)):
                e[r_, (exclude_keys[a:b] - bu[r_].astype(np.int64) * n)] = np.inf
        for r_, (u, c) in enumerate(zip(bu, bc)):
            c = int(c)
            if c <= 0:
                continue
            if c >= n:
                chosen = np.arange(n)
            else:
                chosen = np.argpartition(e[r_], c - 1)[:c]
            out.append(np.int64(u) * n + np.sort(chosen).astype(np.int64))
    return np.concatenate(out) if out else np.empty(0, np.int64)


def _chunk_pairs(rng, u0: int, counts: np.ndarray, n: int, q, alias, inv_pop) -> np.ndarray:
    """Unique sorted keys ``user*n+item`` for users ``u0 .. u0+len(counts)-1``."""
    k = len(counts)
    users = np.arange(u0, u0 + k, dtype=np.int64)
    heavy = counts > max(8, int(n * _HEAVY_FRACTION))
    parts = []
    if heavy.any():
        parts.append(_exact_sample(rng, users[heavy], counts[heavy], n, inv_pop))
    light = ~heavy
    lu, lc = users[light], counts[light]
    if lu.size:
        rows = np.repeat(lu, lc)
        big = _sorted_unique(rows * n + _draw_items(rng, rows.size, n, q, alias))
        del rows
        have = np.bincount(big // n - u0, minlength=k)[light]
        short = lc - have
        extra = np.empty(0, np.int64)
        for _ in range(_MAX_ROUNDS):
            act = short > 0
            if not act.any():
                break
            rows = np.repeat(lu[act], short[act])
            cand = _sorted_unique(rows * n + _draw_items(rng, rows.size, n, q, alias))
            cand = cand[~_in_sorted(cand, big)]
            cand = cand[~_in_sorted(cand, extra)]
            extra = np.sort(np.concatenate([extra, cand]), kind="stable")
            short -= np.bincount(cand // n - u0, minlength=k)[light]
        if (short > 0).any():
            act = short > 0
            excl = np.sort(np.concatenate([big, extra]), kind="stable")
            extra = np.concatenate([extra, _exact_sample(rng, lu[act], short[act], n, inv_pop, excl)])
        parts += [big, extra]
    # parts are sorted runs: the stable sort (timsort) merges them in near-linear time
    return np.sort(np.concatenate(parts), kind="stable")


def synthetic(
    preset: str = "movielens-100k",
    *,
    scale: float = 1.0,
    seed: int | np.random.Generator | None = 0,
    rank: int = 8,
    noise: float = 0.5,
    return_factors: bool = False,
    shape: tuple[int, int] | None = None,
    nnz: int | None = None,
    user_exponent: float = 0.6,
    item_exponent: float = 0.5,
    timestamps: bool = False,
    n_jobs: int | None = None,
):
    """Seeded synthetic ratings: low rank plus noise, power-law users and items.

    Ratings are ``clip(round(mu + b_u + b_i + p_u . q_i + e), 1, 5)`` as float32 with
    ``e ~ N(0, noise**2)``. Each user's number of ratings follows a Zipf-like law
    (``rank**-user_exponent`` over a random order of users, at least one each, at most half
    the items); items are drawn without repetition per user with Zipf-like popularity
    (``rank**-item_exponent``, mixed with 5 % uniform). Pairs are unique; the output is
    sorted by (user, item) with identity id maps. The result depends only on the
    arguments, not on ``n_jobs``.

    Generation runs in chunks of about half a million ratings on a thread pool, so memory
    stays close to the size of the output (int32 users and items, float32 ratings).

    Parameters
    ----------
    preset : str, default "movielens-100k"
        One of :func:`list_presets` (the clMF paper's data set shapes).
    scale : float, default 1.0
        Multiplies users, items and ratings (each at least 1; ratings then capped so the
        density is at most 50 % and raised so every user has one rating).
    seed : int, numpy.random.Generator or None, default 0
        Seed; ``None`` draws fresh entropy.
    rank : int, default 8
        Rank of the true factors.
    noise : float, default 0.5
        Standard deviation of the Gaussian noise before rounding.
    return_factors : bool, default False
        Also return the true model as :class:`SyntheticFactors`.
    shape : (int, int), optional
        ``(n_users, n_items)``, overriding the preset (``scale`` still applies).
    nnz : int, optional
        Number of ratings, overriding the preset (``scale`` still applies).
    user_exponent, item_exponent : float, default 0.6, 0.5
        Power-law exponents of user activity and item popularity (0 = uniform).
    timestamps : bool, default False
        Add uniform random timestamps in 2000-2010.
    n_jobs : int, optional
        Worker threads; default ``min(os.cpu_count(), 16)``.

    Returns
    -------
    Ratings or (Ratings, SyntheticFactors)

    Examples
    --------
    >>> r = synthetic("movielens-100k", seed=1)
    >>> r.shape, len(r)
    ((943, 1682), 100000)
    >>> float(r.ratings.min()) >= 1 and float(r.ratings.max()) <= 5
    True
    """
    t0 = time.perf_counter()
    if preset not in _PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(_PRESETS)}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    if int(rank) < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    if not (noise >= 0 and math.isfinite(noise)):
        raise ValueError(f"noise must be >= 0, got {noise}")
    for name, e in (("user_exponent", user_exponent), ("item_exponent", item_exponent)):
        if not (e >= 0 and math.isfinite(e)):
            raise ValueError(f"{name} must be >= 0, got {e}")
    m0, n0, nnz0 = _PRESETS[preset]
    if shape is not None:
        if len(shape) != 2 or min(int(shape[0]), int(shape[1])) < 1:
            raise ValueError(f"shape must be two positive ints, got {shape!r}")
        m0, n0 = int(shape[0]), int(shape[1])
    if nnz is not None:
        if int(nnz) < 1:
            raise ValueError(f"nnz must be >= 1, got {nnz}")
        nnz0 = int(nnz)
    m = max(1, int(round(m0 * scale)))
    n = max(1, int(round(n0 * scale)))
    total = max(1, int(round(nnz0 * scale)))
    if m >= 2**31 or n >= 2**31:
        raise ValueError(f"shape ({m}, {n}) exceeds int32 indices")
    cap_total = max(m, int(_MAX_DENSITY * m * n))
    if total > cap_total:
        logger.warning("synthetic: %d ratings capped to %d (density <= 50%%)", total, cap_total)
        total = cap_total
    if total < m:
        logger.info("synthetic: raising %d ratings to %d so every user has one", total, m)
        total = m
    user_cap = max(1, math.ceil(n * _MAX_DENSITY), math.ceil(total / m))
    user_cap = min(user_cap, n)

    if isinstance(seed, np.random.Generator):
        seed = int(seed.integers(0, 2**63 - 1))
    root = np.random.SeedSequence(seed)
    s_struct, s_factors, s_chunks, s_time = root.spawn(4)
    rng = np.random.default_rng(s_struct)
    counts = _user_counts(rng, total, m, user_cap, user_exponent)
    pop = _power_weights(n, item_exponent, rng)
    pop = 0.95 * pop + 0.05 / n
    q, alias = _alias_table(pop)
    inv_pop = 1.0 / pop

    # chunks of users of about _CHUNK_NNZ ratings (fixed by the data, not by n_jobs)
    cum = np.cumsum(counts)
    bounds = np.searchsorted(cum, np.arange(_CHUNK_NNZ, total, _CHUNK_NNZ), side="left") + 1
    bounds = np.unique(np.r_[0, bounds[bounds < m], m])
    offsets = np.r_[0, cum][bounds]
    chunk_seeds = s_chunks.spawn(len(bounds) - 1)

    users_out = np.empty(total, dtype=np.int32)
    items_out = np.empty(total, dtype=np.int32)
    ratings_out = np.empty(total, dtype=np.float32)

    frng = np.random.default_rng(s_factors)
    rank = int(rank)
    fscale = math.sqrt(0.7 / math.sqrt(rank))  # sd of p.q is about 0.7
    P = (frng.standard_normal((m, rank), dtype=np.float32) * fscale).astype(np.float32)
    Q = (frng.standard_normal((n, rank), dtype=np.float32) * fscale).astype(np.float32)
    bu = (frng.standard_normal(m, dtype=np.float32) * 0.35).astype(np.float32)
    bi = (frng.standard_normal(n, dtype=np.float32) * 0.45).astype(np.float32)
    mu = 3.5

    def work(c: int) -> None:
        a, b = int(bounds[c]), int(bounds[c + 1])
        crng = np.random.default_rng(chunk_seeds[c])
        keys = _chunk_pairs(crng, a, counts[a:b], n, q, alias, inv_pop)
        lo, hi = int(offsets[c]), int(offsets[c + 1])
        if keys.size != hi - lo:  # pragma: no cover - internal invariant
            raise RuntimeError(f"chunk {c}: generated {keys.size} pairs, expected {hi - lo}")
        uu = (keys // n).astype(np.int32)
        ii = (keys - uu.astype(np.int64) * n).astype(np.int32)
        del keys
        x = np.empty(uu.size, dtype=np.float32)
        for s0 in range(0, uu.size, _DOT_BLOCK):  # bounded float32 temporaries
            s1 = s0 + _DOT_BLOCK
            x[s0:s1] = np.einsum("ij,ij->i", P[uu[s0:s1]], Q[ii[s0:s1]])
        x += bu[uu]
        x += bi[ii]
        x += np.float32(mu)
        if noise > 0:
            x += crng.standard_normal(x.size, dtype=np.float32) * np.float32(noise)
        np.rint(x, out=x)
        np.clip(x, 1, 5, out=x)
        users_out[lo:hi] = uu
        items_out[lo:hi] = ii
        ratings_out[lo:hi] = x

    n_chunks = len(bounds) - 1
    workers = n_jobs if n_jobs is not None else min(os.cpu_count() or 1, 16)
    workers = max(1, min(int(workers), n_chunks))
    if workers == 1:
        for c in range(n_chunks):
            work(c)
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            for f in [pool.submit(work, c) for c in range(n_chunks)]:
                f.result()

    ts = None
    if timestamps:
        trng = np.random.default_rng(s_time)
        start, stop = 946_684_800, 1_262_304_000  # 2000-01-01 .. 2010-01-01 UTC
        ts = trng.integers(start, stop, size=total, dtype=np.int64)

    out = Ratings._new(
        users_out, items_out, ratings_out, ts,
        np.arange(m, dtype=np.int64), np.arange(n, dtype=np.int64),
    )
    logger.info(
        "synthetic %r scale=%g: %d users x %d items, %d ratings in %.2f s (%d chunks, %d threads)",
        preset, scale, m, n, total, time.perf_counter() - t0, n_chunks, workers,
    )
    if return_factors:
        return out, SyntheticFactors(P, Q, bu, bi, mu, pop)
    return out


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
    from .splits import random_holdout  # noqa: PLC0415 - splits imports this module

    return random_holdout(
        data, test_fraction=_DEFAULT_SPEC["test_fraction"], random_state=_DEFAULT_SPEC["split_seed"]
    )


def __getattr__(name: str) -> Any:
    # DEFAULT_DATASET is built on first access, not at import time.
    if name == "DEFAULT_DATASET":
        return _default_ratings()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
