"""The :class:`Ratings` container and its id-map helpers (raw ids as an id map and the raw id →
index lookup are in :mod:`._ids`).

Everything that enters :mod:`clmf` as rating data passes through :class:`Ratings`: it holds
0-based ``int32`` user and item indices, ``float32`` ratings, optional ``int64`` timestamps
and the *id maps* that turn an index back into the raw id found in the source
(``user_ids[index] == raw id``). Splits (:mod:`clmf.data.splits`) keep the id maps, so a model
trained on a split can always report raw ids.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import scipy.sparse as sp

from . import frames
from ._ids import _as_id_array, _lookup, _sorter_of, factorize
from .frames import RATING_COLUMNS
from .scan import has_duplicate_pairs
from .validation import check_float32_range

logger = logging.getLogger(__name__)


_DUPLICATE_POLICIES = ("error", "mean", "last", "sum")


# --------------------------------------------------------------------------------------
# helpers for ids
# --------------------------------------------------------------------------------------
def _factorize(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map raw ids to contiguous indices sorted by raw id (:func:`._ids.factorize`)."""
    return factorize(raw)


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
        check_float32_range(ratings, "ratings")
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
        pd = import_pandas("Ratings.to_pandas()")
        data: dict[str, np.ndarray] = {
            "user": self.user_ids[self.users] if raw_ids else np.asarray(self.users),
            "item": self.item_ids[self.items] if raw_ids else np.asarray(self.items),
            "rating": np.asarray(self.ratings),
        }
        if self.timestamps is not None:
            data["timestamp"] = np.asarray(self.timestamps)
        return pd.DataFrame(data)

    def __getitem__(self, key: Any) -> "Ratings":
        """The ratings selected by a boolean mask of length ``nnz`` (also as scikit-learn's
        ``(mask, ...)``): :meth:`subset`, same id maps and shape. This is how scikit-learn's
        cross-validation hands a fold of :class:`clmf.data.splits.RatingsKFold` to an estimator.

        Integer positions are refused: scikit-learn's ``cv=<int>`` (``KFold``) counts a
        ``Ratings``' samples as its users (``shape[0]``) and would pick ratings by them; use
        :meth:`subset` for positions.
        """
        if isinstance(key, tuple) and len(key) == 2 and key[1] is Ellipsis:
            key = key[0]
        mask = np.asarray(key)
        if mask.dtype != bool or mask.shape != (len(self),):
            raise TypeError(
                f"a Ratings is indexed by a boolean mask over its {len(self)} ratings (got "
                f"{mask.dtype} of shape {mask.shape}); scikit-learn's cv=<int> (KFold) splits "
                "its users, not its ratings: use cv=clmf.data.splits.RatingsKFold(k), or "
                "Ratings.subset(positions) for positions")
        return self.subset(mask)

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
        r32 = _as_ratings(r, "ratings")
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
        user: str = RATING_COLUMNS[0],
        item: str = RATING_COLUMNS[1],
        rating: str = RATING_COLUMNS[2],
        timestamp: str | None = None,
        **kw: Any,
    ) -> "Ratings":
        """Build from a table of raw-id ratings: a :class:`pandas.DataFrame`, a
        :class:`pyarrow.Table` / ``RecordBatch``, or a mapping of columns (the column rules of
        :mod:`clmf.data.frames`, shared with :meth:`clmf.ALS.fit`).

        Parameters
        ----------
        df : pandas.DataFrame, pyarrow.Table or mapping
            Holds the columns.
        user, item, rating : str
            Column names of raw user ids, raw item ids and ratings (default ``"user"``,
            ``"item"``, ``"rating"``).
        timestamp : str, optional
            Column of timestamps (integers or datetimes).
        **kw
            Passed to :meth:`from_triples` (``duplicates=``, ``user_ids=``, ``item_ids=``).

        Returns
        -------
        Ratings

        Raises
        ------
        clmf.errors.MissingColumnError
            If a named column is missing (a ``KeyError``; the message lists the columns found).
        ValueError
            On missing values (NaN/None) in a column, and as :meth:`from_triples`.

        Examples
        --------
        >>> Ratings.from_pandas({"user": [1, 2], "item": [5, 5], "rating": [3.0, 4.0]}).shape
        (2, 1)
        """
        ts = frames.column(df, timestamp) if timestamp is not None else None
        # each column checked under its own name (the errors then say which column is wrong)
        return cls.from_triples(
            _as_id_array(frames.column(df, user), f"column {user!r} (user ids)"),
            _as_id_array(frames.column(df, item), f"column {item!r} (item ids)"),
            _as_ratings(frames.column(df, rating), f"column {rating!r} (ratings)"), ts, **kw)

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


def _as_ratings(r: np.ndarray, what: str) -> np.ndarray:
    """Rating values as float32: numbers only (not dates, durations, lists), finite and inside
    float32's range; ``what`` names them in the errors."""
    if r.dtype.kind in "mM":          # NumPy would cast them to numbers (ns since 1970)
        raise ValueError(f"{what} must be numeric, not {r.dtype} (dates or durations; first "
                         f"{r[0]!r})")
    if r.dtype.kind == "O" and len(r) and isinstance(r[0], (list, tuple, dict, np.ndarray)):
        raise ValueError(f"{what} must be numeric, not {type(r[0]).__name__}s (first "
                         f"{r[0]!r})")
    check_float32_range(r, what)
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            r32 = r.astype(np.float32)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be numeric, got dtype {r.dtype}") from exc
    _check_finite(r32, what)
    return r32


def _check_finite(values: np.ndarray, what: str) -> None:
    """Refuse NaN/inf values (naming the count and the first position)."""
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{int(bad.sum())} non-finite {what} value(s) (NaN or inf); first at position "
            f"{first}: {values[first]!r}"
        )


def _handle_duplicates(u, i, r, ts, n_items, policy):
    if not has_duplicate_pairs(u, i, n_items):
        return u, i, r, ts
    keys = u.astype(np.int64) * max(n_items, 1) + i
    sorted_keys = np.sort(keys)
    dup_sorted = sorted_keys[1:] == sorted_keys[:-1]
    n_dup = int(np.count_nonzero(dup_sorted))
    if policy == "error":
        n_pairs = int(np.count_nonzero(dup_sorted & ~np.r_[False, dup_sorted[:-1]]))
        raise ValueError(
            f"{n_dup} duplicate rating(s) of {n_pairs} (user, item) pair(s); pass "
            "duplicates='mean', 'last' or 'sum' to aggregate them (to Ratings.from_triples, "
            "Ratings.from_pandas or the loaders)"
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


def import_pandas(what: str):
    """pandas, or an ImportError saying that ``what`` needs it."""
    try:
        import pandas as pd  # noqa: PLC0415 - optional dependency, imported lazily
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"{what} needs pandas, which is not installed; install it with `pip install pandas`"
            " (and `pip install pyarrow` for parquet files)"
        ) from exc
    return pd
