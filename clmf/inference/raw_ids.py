"""Raw ids in and out of a fitted model (mixed into
:class:`clmf.inference.recommend.RecommenderMixin`): id lookups (``user_index``/``item_index``),
tables of raw ids (pandas DataFrames, pyarrow Tables: :mod:`clmf.data.frames`) as the model's
indices or its users × items matrix, and ``recommend_raw``."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..data import frames
from ..data.validation import check_ids

__all__ = ["RawIdsMixin"]


def _require_liked_rows(user_items, filter_already_liked_items, what="recommend",
                        arg="user_items"):
    """Refuse ``filter_already_liked_items=True`` without ``user_items``, as implicit does (the
    model keeps no training matrix: without it nothing could be filtered, and seen items would
    come back silently)."""
    if user_items is None and filter_already_liked_items:
        raise ValueError(
            f"{what}: filter_already_liked_items=True needs {arg} (the users' known ratings, "
            f"e.g. the training data); the model keeps no training matrix. Pass {arg}, or "
            "filter_already_liked_items=False to rank every item")


def _map_lookup(id_map, raw, missing, what):
    """Vectorised raw id → index through ``id_map`` (index → raw id)."""
    if missing not in ("raise", "ignore"):
        raise ValueError(f"missing must be 'raise' or 'ignore', not {missing!r}")
    q = np.asarray(raw)
    scalar = q.ndim == 0
    q = np.atleast_1d(q).ravel()
    kind = id_map.dtype.kind
    if q.dtype.kind in "OSU":
        if kind in "iuf":    # raw ids typed as text (a command line) for a numeric map
            conv = []
            for v in q:
                v = v.decode() if isinstance(v, bytes) else v
                try:
                    conv.append(int(v) if kind in "iu" else float(v))
                except (TypeError, ValueError):
                    conv.append(None)
            ok = np.array([c is not None for c in conv], dtype=bool)
            vals = np.array([c if c is not None else 0 for c in conv], dtype=id_map.dtype)
        else:
            vals = q.astype(str)
            ok = np.ones(len(q), dtype=bool)
    else:
        if kind == "U":
            vals = q.astype(str)
        else:
            vals = q
        ok = np.ones(len(q), dtype=bool)
    out = np.full(len(q), -1, dtype=np.int64)
    if len(id_map) and len(q):
        sorter = np.argsort(id_map, kind="stable")
        smap = id_map[sorter]
        p = np.minimum(np.searchsorted(smap, vals), len(smap) - 1)
        found = ok & (smap[p] == vals)
        out[found] = sorter[p[found]]
    if missing == "raise" and (out < 0).any():
        unknown = q[out < 0]
        shown = ", ".join(repr(v.item() if hasattr(v, "item") else v) for v in unknown[:10])
        more = f" (and {len(unknown) - 10} more)" if len(unknown) > 10 else ""
        raise KeyError(f"{len(unknown)} unknown {what} id(s): {shown}{more}")
    return int(out[0]) if scalar else out


def codes_in(id_map, n, raw, side):
    """Model indices of raw ids of ``side`` through ``id_map`` (index → raw id), -1 for ids not
    in it; without an id map (a model fitted on a matrix) the ids are the 0-based indices
    themselves (-1 from ``n`` on)."""
    if id_map is not None:
        return np.atleast_1d(_map_lookup(np.asarray(id_map), raw, "ignore", side))
    q = np.atleast_1d(np.asarray(raw))
    if q.dtype.kind not in "iuf":
        raise ValueError(f"this model has no raw {side} ids (it was fitted on a matrix, not on "
                         f"raw ids): its {side} ids are 0-based indices, not {q.dtype} values")
    q = check_ids(f"{side} ids", q)
    return np.where(q < n, q, -1)




class RawIdsMixin:
    """Raw ids and tables of raw ids (see the module docstring); relies on the learned
    ``user_factors_``/``item_factors_``, the id maps ``user_ids_``/``item_ids_`` and on
    ``recommend`` of the class it is mixed into."""

    # ----- raw ids ---------------------------------------------------------------------------
    def _id_map(self, side):
        id_map = getattr(self, f"{side}_ids_", None)
        if id_map is None:
            raise ValueError(f"this model has no raw {side} ids (it was fitted on a matrix, not "
                             "on clmf.data.Ratings); use 0-based indices")
        return np.asarray(id_map)

    def _raw_codes(self, side, raw):
        """Model indices of raw ids of ``side`` (-1: unknown to the model); see
        :func:`codes_in`."""
        n = (self.user_factors_ if side == "user" else self.item_factors_).shape[0]
        return codes_in(getattr(self, f"{side}_ids_", None), n, raw, side)

    def _table_codes(self, X, columns=None, ratings=True, what="the ratings"):
        """``(users, items, ratings)`` of a table of raw ids (:mod:`clmf.data.frames`: pandas,
        pyarrow) as the model's indices, -1 for ids unknown to it; ``ratings`` False: no rating
        column is read (None in its place)."""
        ucol, icol, rcol = frames.rating_columns(columns)
        frames.check_columns(X, (ucol, icol, rcol) if ratings else (ucol, icol), what)
        u = self._raw_codes("user", frames.column(X, ucol, what))
        i = self._raw_codes("item", frames.column(X, icol, what))
        if not ratings:
            return u, i, None
        r = frames.column(X, rcol, what)
        if r.dtype.kind not in "fiub":
            raise TypeError(f"column {rcol!r} of {what} must hold numbers, not {r.dtype}")
        r = r.astype(np.float64)
        bad = ~np.isfinite(r)
        if bad.any():
            raise ValueError(f"column {rcol!r} of {what} has {int(bad.sum())} NaN/inf value(s) "
                             f"(first at row {int(np.argmax(bad))})")
        return u, i, r

    def _known_pairs(self, X, what, columns=None):
        """``X`` itself, or for a table of raw ids the users × items CSR of its pairs known to
        the model (its ratings where it has a rating column, else 1; ids unknown to the model
        left out)."""
        if not frames.is_frame(X):
            return X
        rcol = frames.rating_columns(columns)[2]
        return self._pairs_csr(*self._table_codes(X, columns, rcol in frames.column_names(X),
                                                  what))

    def _pairs_csr(self, u, i, r=None):
        """The users × items CSR of the model of index pairs ``(u, i)`` (-1: unknown, left out)
        with values ``r`` (None: 1)."""
        keep = (u >= 0) & (i >= 0)
        vals = np.ones(int(keep.sum()), np.float32) if r is None else r[keep].astype(np.float32)
        shape = (self.user_factors_.shape[0], self.item_factors_.shape[0])
        return sp.csr_matrix((vals, (u[keep], i[keep])), shape=shape)

    def user_index(self, raw_ids, missing="raise"):
        """0-based indices of raw user ids (models fitted on :class:`clmf.data.Ratings`).

        Parameters
        ----------
        raw_ids : scalar or array_like
            Raw user ids; text is converted for numeric id maps (``"1"`` finds user ``1``).
        missing : {"raise", "ignore"}
            Unknown ids raise :class:`KeyError`, or give -1.

        Returns
        -------
        int or numpy.ndarray of int64

        Examples
        --------
        >>> model.user_index("1")                                       # doctest: +SKIP
        0
        """
        self._require_fitted()
        return _map_lookup(self._id_map("user"), raw_ids, missing, "user")

    def item_index(self, raw_ids, missing="raise"):
        """0-based indices of raw item ids; see :meth:`user_index`.

        Parameters
        ----------
        raw_ids : scalar or array_like
        missing : {"raise", "ignore"}

        Returns
        -------
        int or numpy.ndarray of int64

        Examples
        --------
        >>> model.item_index([1, 50]).tolist()                          # doctest: +SKIP
        [0, 48]
        """
        self._require_fitted()
        return _map_lookup(self._id_map("item"), raw_ids, missing, "item")

    def recommend_raw(self, raw_user, train=None, N=10, filter_already_liked_items=True,
                      filter_items=None, items=None, *, columns=None):
        """:meth:`recommend` in raw ids: raw user ids in, the users' own item ids out.

        Parameters
        ----------
        raw_user : scalar, or array_like of raw user ids (a list, array, pandas Series)
            The users' raw ids (as in the data the model was fitted on).
        train : optional :class:`clmf.data.Ratings`, table of raw ids or scipy.sparse matrix
            Known ratings whose items are filtered out. A ``Ratings`` or a table (pandas
            DataFrame, pyarrow Table: ``columns``, see :meth:`clmf.ALS.fit`) is matched by raw
            ids (its own id maps may differ from the model's); a sparse matrix must be indexed
            like the model. Needed while ``filter_already_liked_items`` (as :meth:`recommend`).
        N : int, default 10
        filter_already_liked_items : bool, default True
        filter_items, items : array_like of raw item ids, optional
            Excluded / allowed items; raw ids unknown to the model are ignored.
        columns : the user, item (and rating) columns of a ``train`` table.

        Returns
        -------
        (raw_item_ids, scores) for one user
            1-D arrays, best first.
        pandas.DataFrame for a batch of users
            Columns ``user, item, score, rank`` (raw ids, rank 1 = best, ``min(N, candidates)``
            rows a user) — the form of :meth:`clmf.dask.ALS.recommend_all`.

        Raises
        ------
        KeyError
            Naming raw user ids the model does not know.

        Examples
        --------
        >>> ids, scores = model.recommend_raw(1, train, N=10)          # doctest: +SKIP
        >>> model.recommend_raw(["u1", "u2"], train_df, N=3)           # doctest: +SKIP
          user  item  score  rank
        0   u1   m42   4.91     1
        ...
        """
        self._require_fitted()
        _require_liked_rows(train, filter_already_liked_items, "recommend_raw", "train")
        scalar = np.ndim(raw_user) == 0
        raw = np.asarray(raw_user) if scalar else np.asarray(list(raw_user))
        u = _map_lookup(self._id_map("user"), raw, "raise", "user")
        item_map = self._id_map("item")
        seen = None
        if train is not None and filter_already_liked_items:
            if hasattr(train, "user_ids") and hasattr(train, "item_ids"):   # by raw ids
                seen = self._pairs_csr(self._raw_codes("user", train.user_ids)[train.users],
                                       self._raw_codes("item", train.item_ids)[train.items],
                                       train.ratings)
            else:
                seen = self._known_pairs(train, "train", columns)
        fi = None if filter_items is None else self._known_items(filter_items)
        it = None if items is None else self._known_items(items)
        ids, scores = self.recommend(u, seen, N=N,
                                     filter_already_liked_items=filter_already_liked_items,
                                     filter_items=fi, items=it)
        if scalar:
            return item_map[ids], scores
        from ..data.ratings import import_pandas
        pd = import_pandas("recommend_raw() of several users")
        keep = ids >= 0
        return pd.DataFrame({
            "user": np.repeat(raw, keep.sum(axis=1)),
            "item": item_map[ids[keep]],
            "score": scores[keep].astype(np.float32),
            "rank": np.cumsum(keep, axis=1, dtype=np.int32)[keep]})

    def _known_items(self, raw):
        idx = _map_lookup(self._id_map("item"), np.atleast_1d(np.asarray(raw)), "ignore", "item")
        return idx[idx >= 0]
