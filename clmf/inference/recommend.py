"""Inference on a fitted model: recommend, similar items/users, fold-in (implicit's signatures).

:class:`RecommenderMixin` is mixed into :class:`clmf.ALS`; it relies only on the learned
attributes (``user_factors_``, ``item_factors_``, ``user_counts_``, ``item_counts_``,
``global_mean_``, the id maps ``user_ids_``/``item_ids_``, and ``user_biases_``/``item_biases_``
when the model has biases) and the hyper-parameters ``regularization`` and
``weighted_regularization``. Ranking runs on the model's device (:mod:`.ranking`, :mod:`.topk`)
when one is there and the work passes the measured host threshold, else (and the fold-in solves
always) on the host in NumPy: a model loaded with :func:`clmf.load` recommends anywhere.

Conventions (the same as the `implicit <https://benfred.github.io/implicit/>`_ library):

* ids are 0-based indices into the factor matrices; a scalar id gives 1-D results, an array of
  ids gives 2-D results with one row per id;
* ``user_items`` is a sparse matrix of the users' ratings: either one row per requested user
  (row-aligned, which wins when its row count equals the number of requested users) or the whole
  training matrix, indexed by the user ids;
* scores are sorted best first; equal scores are ordered by ascending item (user) index.
"""
from __future__ import annotations

import logging
import numbers

import numpy as np
import scipy.sparse as sp

from .. import reference
from ..data.validation import check_ratings, check_sparse_structure, check_strengths
from ..tuning.spec import kernel_alpha, weighted_rule
from .conventions import LIKED_SCORE, confidence_rows, ids_dtype  # noqa: F401
from .host import _top_n, host_rank  # noqa: F401  (the host ranking, re-exported)
from .ranking import DeviceRankingMixin, ranking_vectors
from .raw_ids import RawIdsMixin, _map_lookup, _require_liked_rows
from .resident import contiguous_range

log = logging.getLogger(__name__)

__all__ = ["RecommenderMixin"]



# ----- helpers ---------------------------------------------------------------------------------
def _as_index_array(x, name, raw_hint=False):
    """``(1-D int64 array, was_scalar)`` from a scalar or array of 0-based indices
    (``raw_hint``: a refusal of raw ids points to :meth:`RecommenderMixin.recommend_raw`)."""
    arr = np.asarray(x)
    scalar = arr.ndim == 0
    arr = np.atleast_1d(arr)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a scalar or a 1-D array, got shape {arr.shape}")
    if arr.dtype.kind == "b" or (arr.dtype.kind not in "iu" and arr.size):
        hint = ("; for raw ids call recommend_raw(raw_users, train)"
                if raw_hint and arr.dtype.kind in "OSU" else "")
        raise TypeError(f"{name} must be integer indices, not dtype {arr.dtype}{hint}")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} contains a negative index ({int(arr.min())}); ids are 0-based")
    return arr, scalar


def _check_N(N):
    if not isinstance(N, numbers.Integral) or isinstance(N, bool) or N < 0:
        raise ValueError(f"N must be an integer ≥ 0, not {N!r}")
    return int(N)


def _as_csr(M, name, ratings=False):
    """A canonical CSR from a scipy.sparse matrix or a :class:`clmf.data.Ratings`.

    With ``ratings`` the values are ratings a solve reads (fold-in, ``recalculate_*``): they are
    checked as ``fit`` checks its ``X`` (:func:`clmf.data.validation.check_ratings`: NaN/inf,
    values beyond float32, duplicate entries and malformed matrices refused with the same error
    types); else only the pattern matters (the items to filter) and duplicates are merged."""
    if hasattr(M, "to_csr") and hasattr(M, "user_ids"):
        M = M.to_csr()
    if not sp.issparse(M):
        raise TypeError(f"{name} must be a scipy.sparse matrix (CSR) of ratings, "
                        f"not {type(M).__name__}")
    if M.ndim != 2:
        raise ValueError(f"{name} must be 2-D")
    if ratings and M.shape[0] and M.shape[1]:
        return check_ratings(M, what=name, allow_empty=True)
    check_sparse_structure(M, name)        # SciPy's own operations crash on a malformed CSR
    M = sp.csr_matrix(M)
    M.sum_duplicates()
    return M


def _rows_for(ids, M, name, n_cols, ratings=False):
    """The rows of ``M`` for ``ids``: row-aligned if ``M`` has one row per id, else ``M[ids]``
    (``ratings``: values checked as ``fit`` checks them, see :func:`_as_csr`)."""
    M = _as_csr(M, name, ratings)
    if M.shape[1] != n_cols:     # a matrix of another data set (or of ids mapped differently)
        raise ValueError(f"{name} has {M.shape[1]} columns but the model has {n_cols} "
                         f"{'items' if name == 'user_items' else 'users'}: pass a matrix with "
                         "one column per model id")
    if M.shape[0] != len(ids):
        if ids.size and ids.max() >= M.shape[0]:
            raise ValueError(
                f"{name} has {M.shape[0]} rows: pass one row per requested id ({len(ids)}) or "
                f"a matrix indexed by id (more than {int(ids.max())} rows)")
        M = M[ids]
    return M


def _candidates(n, items, filter_items, name="items"):
    """Sorted candidate ids (``None`` meaning all ``n``), with ``filter_items`` removed."""
    cand = None
    if items is not None:
        cand, _ = _as_index_array(items, name)
        cand = np.unique(cand)
        if cand.size and cand[-1] >= n:
            raise IndexError(f"{name} contains id {int(cand[-1])}, out of range for {n}")
    if filter_items is not None:
        filt, _ = _as_index_array(filter_items, "filter_" + name)
        if filt.size and filt.max() >= n:
            raise IndexError(f"filter_{name} contains id {int(filt.max())}, out of range for {n}")
        keep = np.ones(n, dtype=bool)
        keep[filt] = False
        cand = np.flatnonzero(keep) if cand is None else cand[keep[cand]]
    return cand


def _normalized(F):
    norms = np.linalg.norm(F, axis=1)
    return F / np.where(norms > 0, norms, 1).astype(F.dtype)[:, None]


def _grow(a, n, fill=0):
    if a.shape[0] >= n:
        return a if a.flags.writeable else a.copy()
    pad = np.full((n - a.shape[0],) + a.shape[1:], fill, dtype=a.dtype)
    return np.concatenate([a, pad])


class RecommenderMixin(RawIdsMixin, DeviceRankingMixin):
    """Recommendation methods shared by clmf's models, with implicit's signatures.

    All methods work on the host from the learned factors; see the module docstring for the
    id, ``user_items`` and ordering conventions.

    Examples
    --------
    >>> import clmf, scipy.sparse as sp
    >>> train = clmf.data.synthetic(scale=0.05, seed=0)          # doctest: +SKIP
    >>> model = clmf.ALS(factors=8, iterations=5).fit(train)         # doctest: +SKIP
    >>> ids, scores = model.recommend(0, train.to_csr(), N=5)         # doctest: +SKIP
    >>> sim_ids, sims = model.similar_items(ids[0], N=3)             # doctest: +SKIP
    """

    # ----- shared pieces ---------------------------------------------------------------------
    def _require_fitted(self):
        check = getattr(self, "_check_fitted", None)
        if check is not None:
            check()
        elif not hasattr(self, "user_factors_"):
            raise RuntimeError(f"this {type(self).__name__} is not fitted yet; call fit() first")

    def _biased(self):
        return getattr(self, "user_biases_", None) is not None

    def _solve_rows(self, rows, side):
        """Solve the rows of ``rows`` (ratings of ``side`` = "user" or "item" against the other
        side's columns) for their factors, with the other side fixed: one ALS half-step.

        Returns ``(factors, biases)`` as float32; ``biases`` is None for a model without biases.
        With biases the system is the fit's augmented one (:func:`clmf.reference.als_biased`,
        the engine's ``[x | b]`` rows): unknowns ``[x_u, b_u]``, features ``[y_i, 1]``, targets
        ``r_ui − μ − b_i``, and the bias regularised like the factors (λ·n_u, or λ).
        """
        implicit = getattr(self, "feedback", "explicit") == "implicit"
        if implicit:
            check_strengths(rows, "user_items" if side == "user" else "item_users")
        other = np.asarray(self.item_factors_ if side == "user" else self.user_factors_,
                           np.float64)
        weighted = weighted_rule(getattr(self, "weighted_regularization", None),
                                 "implicit" if implicit else "explicit")
        lam = float(self.regularization)
        if not self._biased():
            X = reference.half_step(confidence_rows(rows, self), other, lam, bool(weighted),
                                    implicit_alpha=kernel_alpha("implicit" if implicit else "explicit",
                                                                getattr(self, "alpha", None)))
            return X.astype(np.float32), None
        if implicit:
            raise ValueError("biases are for explicit feedback")
        ob = np.asarray(self.item_biases_ if side == "user" else self.user_biases_, np.float64)
        if ob.shape != (other.shape[0],):
            raise ValueError(f"the model's {'item' if side == 'user' else 'user'} biases "
                             f"({ob.shape}) do not match its factors ({other.shape[0]} rows)")
        T = sp.csr_matrix(rows, dtype=np.float64, copy=True)
        T.sum_duplicates()
        # explicit zeros stay stored: the pattern (and n_u) is the rows' own, as in the fit
        T.data = T.data - float(self.global_mean_) - ob[T.indices]
        Z = reference.half_step(T, np.hstack([other, np.ones((other.shape[0], 1))]), lam,
                                bool(weighted))
        return Z[:, :-1].astype(np.float32), Z[:, -1].astype(np.float32)

    # ----- recommend -------------------------------------------------------------------------
    def recommend(self, userid, user_items=None, N=10, filter_already_liked_items=True,
                  filter_items=None, recalculate_user=False, items=None):
        """Top-N items for a user (or a batch of users) by predicted rating ``x_u·y_i``
        (``μ + b_u + b_i + x_u·y_i`` for a model with biases).

        Parameters
        ----------
        userid : int or array_like of int
            0-based user index, or an array of them for a batched call.
        user_items : scipy.sparse matrix, :class:`clmf.data.Ratings` or table, optional
            The users' known ratings (stored entries count as "already liked"): one row per
            requested user, or the whole training matrix indexed by ``userid`` (when its row
            count equals ``len(userid)`` it is taken as row-aligned); or a table of raw ids
            (pandas DataFrame, pyarrow Table with user, item and rating columns named as in
            :meth:`clmf.ALS.fit`), matched through the model's id maps. Needed to filter seen
            items and for ``recalculate_user``: ``None`` with ``filter_already_liked_items=True``
            raises ``ValueError``, as implicit does (the model keeps no training matrix). For
            raw user ids in and raw item ids out, see :meth:`recommend_raw`. For a range of
            users (``np.arange(m)``, ``np.arange(a, b)``) a SciPy CSR is prepared and uploaded
            to the model's devices once and reused while it stays the same matrix (see
            :mod:`clmf.inference.resident`).
        N : int, default 10
            Number of items to return.
        filter_already_liked_items : bool, default True
            Leave out the items stored in the user's row of ``user_items``; False ranks every
            item (then ``user_items`` may be None).
        filter_items : array_like of int, optional
            Item indices never to return.
        recalculate_user : bool, default False
            Solve the user's factors from ``user_items`` (one least-squares step against the
            item factors, as :meth:`recalculate_user`; with biases the user's bias too) instead
            of using the stored ones; the user ids may then lie beyond the model's users.
        items : array_like of int, optional
            Rank only these items; the user's liked ones among them are kept, ranked last with
            score −FLT_MAX, as implicit does (so rows hold ``min(N, len(items))``, no padding).

        Returns
        -------
        (ids, scores)
            For a scalar ``userid``: 1-D int32 item indices and float32 scores, best first,
            ``min(N, candidates)`` long (shorter when fewer items remain after filtering).
            For an array: 2-D ``(len(userid), min(N, candidates))``; without ``items`` shorter rows
            are padded with id ``-1``, score ``-inf``. Ids are int32, as implicit's.

        Notes
        -----
        Equal scores are ordered by ascending item index. Items without training ratings have
        zero factors (score 0); a user without ratings scores every item 0, so gets the lowest
        item indices.

        Examples
        --------
        >>> import numpy as np, scipy.sparse as sp, clmf
        >>> model = clmf.ALS(factors=2)
        >>> model.user_factors_ = np.array([[1, 0], [0, 1]], np.float32)   # normally from fit()
        >>> model.item_factors_ = np.array([[3, 0], [1, 1], [2, 5]], np.float32)
        >>> seen = sp.csr_matrix([[5.0, 0, 0], [0, 0, 0]])                  # user 0 rated item 0
        >>> model.recommend(0, seen, N=2)
        (array([2, 1], dtype=int32), array([2., 1.], dtype=float32))
        >>> ids, scores = model.recommend([0, 1], seen, N=3)               # batched, padded
        >>> ids
        array([[ 2,  1, -1],
               [ 2,  1,  0]], dtype=int32)
        >>> model.recommend(0, seen, N=3, items=[0, 1])       # liked item 0 kept, ranked last
        (array([1, 0], dtype=int32), array([ 1.0000000e+00, -3.4028235e+38], dtype=float32))
        """
        self._require_fitted()
        ids, scalar = _as_index_array(userid, "userid", raw_hint=True)
        N = _check_N(N)
        user_items = self._known_pairs(user_items, "user_items")
        Y = self.item_factors_
        n_items = Y.shape[0]
        if not recalculate_user:
            n_users = self.user_factors_.shape[0]
            if ids.size and ids.max() >= n_users:
                raise IndexError(f"userid {int(ids.max())} out of range for {n_users} users "
                                 "(fold new users in with partial_fit_users, or pass "
                                 "recalculate_user=True with their user_items)")
        elif user_items is None:
            raise ValueError("recalculate_user=True needs user_items")
        if not recalculate_user and (items is None or not filter_already_liked_items):
            # a range of users (np.arange(m) included): resident vectors and seen items
            _require_liked_rows(user_items, filter_already_liked_items)
            span = contiguous_range(ids)
            M = user_items if filter_already_liked_items else None
            if span is not None and (M is None or sp.issparse(M) and M.format == "csr"):
                got = self._recommend_range(span, M, N, _candidates(n_items, items,
                                                                    filter_items))
                if got is not None:
                    pos_out = ids_dtype(got[0], n_items)
                    if scalar:
                        keep = pos_out[0] >= 0
                        return pos_out[0][keep], got[1][0][keep]
                    return pos_out, got[1]
        rows = None
        if user_items is not None and (filter_already_liked_items or recalculate_user):
            rows = _rows_for(ids, user_items, "user_items", n_items, ratings=recalculate_user)
        if recalculate_user:
            Xu, bu_new = self._solve_rows(rows, "user")
        else:
            Xu, bu_new = self.user_factors_[ids], None
        if not filter_already_liked_items:
            rows = None
        cand = _candidates(n_items, items, filter_items)
        _require_liked_rows(user_items, filter_already_liked_items)
        bi = getattr(self, "item_biases_", None)
        if bi is not None:
            # biased MF: score = μ + b_u + b_i + x·y — rank on [x, 1]·[y, b_i], then add μ + b_u
            Xq, Yq = ranking_vectors(Xu, Y, bi)
            pos_out, sc_out = self._rank(Xq, Yq, cand, rows, N, liked_last=items is not None,
                                          kind="items_biased", sources=(Y, bi))
            bu = (bu_new if recalculate_user
                  else np.asarray(self.user_biases_, np.float32)[ids])
            sc_out = sc_out + (np.float32(self.global_mean_) + bu)[:, None]
        else:
            pos_out, sc_out = self._rank(Xu, Y, cand, rows, N, liked_last=items is not None,
                                          kind="items", sources=(Y,))
        pos_out = ids_dtype(pos_out, n_items)
        if scalar:
            keep = pos_out[0] >= 0
            return pos_out[0][keep], sc_out[0][keep]
        return pos_out, sc_out

    def _all_inputs(self, N, user_items, filter_already_liked_items, filter_items, items,
                    batch_size=None, rows=True):
        """(N, candidates, seen rows of every user) of a ``recommend_all`` call, checked (its
        ``batch_size`` too: None or a positive integer); with ``rows=False`` the seen items as
        given (a table of raw ids already turned into a CSR), or None when not filtering."""
        N = _check_N(N)
        if batch_size is not None and (not isinstance(batch_size, numbers.Integral)
                                       or isinstance(batch_size, bool) or batch_size < 1):
            raise ValueError(f"batch_size must be None or an integer ≥ 1, not {batch_size!r}")
        user_items = self._known_pairs(user_items, "user_items")
        _require_liked_rows(user_items, filter_already_liked_items, "recommend_all")
        n_users, n_items = self.user_factors_.shape[0], self.item_factors_.shape[0]
        seen = None
        if user_items is not None and filter_already_liked_items:
            seen = (self._seen_rows(np.arange(n_users), user_items) if rows else
                    _as_csr(user_items, "user_items") if not sp.issparse(user_items) else
                    user_items)
        return N, _candidates(n_items, items, filter_items), seen

    def _seen_rows(self, ids, user_items):
        """The canonical CSR rows of ``user_items`` for the users ``ids`` (row-aligned or
        indexed by id), checked."""
        return _rows_for(ids, user_items, "user_items", self.item_factors_.shape[0])

    # ----- similarity ------------------------------------------------------------------------
    def _similar(self, F, ids, scalar, N, filter_ids, restrict, name, query=None):
        cand = _candidates(F.shape[0], restrict, filter_ids, name)
        Fn = _normalized(np.asarray(F, np.float32))
        if query is None:
            Q = Fn[ids]
            self_ids = ids
        else:
            Q = _normalized(np.asarray(query, np.float32))
            self_ids = None
        pos, sc = self._rank(Q, Fn, cand, None, N, self_ids=self_ids, kind=name + "_cosine",
                             sources=(F,))
        sc = np.where(np.isfinite(sc), np.clip(sc, -1.0, 1.0), sc).astype(np.float32)
        pos = ids_dtype(pos, F.shape[0])
        if scalar:
            keep = pos[0] >= 0
            return pos[0][keep], sc[0][keep]
        return pos, sc

    def similar_items(self, itemid, N=10, recalculate_item=False, item_users=None,
                      filter_items=None, items=None):
        """The N items most similar to an item (or to each of a batch), by cosine similarity.

        Parameters
        ----------
        itemid : int or array_like of int
            0-based item index, or an array of them.
        N : int, default 10
            Number of items to return, the query item included.
        recalculate_item : bool, default False
            Solve the item's factors from ``item_users`` (see :meth:`recalculate_item`) first.
        item_users : scipy.sparse matrix, optional
            Item × user ratings for ``recalculate_item`` (row-aligned or indexed by itemid).
        filter_items : array_like of int, optional
            Item indices never to return.
        items : array_like of int, optional
            Restrict the candidates to these item indices.

        Returns
        -------
        (ids, scores)
            As :meth:`recommend`: 1-D for a scalar itemid, 2-D (padded with -1/-inf) for an
            array; scores are cosine similarities of the factors in [-1, 1].

        Notes
        -----
        As in implicit, the query item itself is part of the result; clmf always puts it
        first with similarity exactly 1 (also when its factors are zero), unless it is removed
        by ``filter_items``/``items``. Items with zero factors (no training ratings) have
        similarity 0 to every other item.

        Examples
        --------
        >>> ids, sims = model.similar_items(0, N=5)                     # doctest: +SKIP
        >>> int(ids[0]), float(sims[0])                                 # doctest: +SKIP
        (0, 1.0)
        """
        self._require_fitted()
        ids, scalar = _as_index_array(itemid, "itemid")
        N = _check_N(N)
        F = self.item_factors_
        query = None
        if recalculate_item:
            if item_users is None:
                raise ValueError("recalculate_item=True needs item_users")
            query = self.recalculate_item(ids, item_users)
            query = query.reshape(len(ids), -1)
        elif ids.size and ids.max() >= F.shape[0]:
            raise IndexError(f"itemid {int(ids.max())} out of range for {F.shape[0]} items")
        return self._similar(F, ids, scalar, N, filter_items, items, "items", query)

    def similar_users(self, userid, N=10, filter_users=None, users=None):
        """The N users most similar to a user (or to each of a batch), by cosine similarity.

        Parameters
        ----------
        userid : int or array_like of int
            0-based user index, or an array of them.
        N : int, default 10
            Number of users to return, the query user included (first, similarity 1).
        filter_users : array_like of int, optional
            User indices never to return.
        users : array_like of int, optional
            Restrict the candidates to these user indices.

        Returns
        -------
        (ids, scores)
            As :meth:`similar_items`.

        Examples
        --------
        >>> ids, sims = model.similar_users(3, N=5)                     # doctest: +SKIP
        >>> int(ids[0])                                                 # doctest: +SKIP
        3
        """
        self._require_fitted()
        ids, scalar = _as_index_array(userid, "userid")
        N = _check_N(N)
        F = self.user_factors_
        if ids.size and ids.max() >= F.shape[0]:
            raise IndexError(f"userid {int(ids.max())} out of range for {F.shape[0]} users")
        return self._similar(F, ids, scalar, N, filter_users, users, "users")

    # ----- fold-in ---------------------------------------------------------------------------
    def recalculate_user(self, userid, user_items, *, return_biases=False):
        """Solve a user's factors from their ratings against the fixed item factors.

        One least-squares solve with the model's λ and weighting (the ALS user half-step):
        ``x_u = (Σ y_i y_iᵀ + λ·n_u·I)⁻¹ Σ r_ui y_i``. For a model with biases it is the fit's
        augmented system: ``[x_u, b_u] = (Σ ŷ_i ŷ_iᵀ + λ·n_u·I)⁻¹ Σ (r_ui − μ − b_i) ŷ_i`` with
        ``ŷ_i = [y_i, 1]`` (the bias regularised like the factors). Nothing is stored.

        Parameters
        ----------
        userid : int or array_like of int
            The user index (any value ≥ 0, also new users), or an array of them.
        user_items : scipy.sparse matrix or :class:`clmf.data.Ratings`
            The users' ratings, one row per userid (or indexed by userid), items as columns.
        return_biases : bool, default False
            Also return the users' biases (zeros for a model without biases).

        Returns
        -------
        numpy.ndarray, or (numpy.ndarray, numpy.ndarray) with ``return_biases``
            float32 factors: ``(factors,)`` for a scalar userid, ``(len(userid), factors)``
            otherwise; the biases a float32 scalar or ``(len(userid),)``. A user with no
            ratings gets zeros.

        Examples
        --------
        >>> import scipy.sparse as sp
        >>> n_items = model.item_factors_.shape[0]                       # doctest: +SKIP
        >>> row = sp.csr_matrix(([5.0, 3.0], ([0, 0], [10, 42])), shape=(1, n_items))  # doctest: +SKIP
        >>> model.recalculate_user(0, row).shape                         # doctest: +SKIP
        (32,)
        """
        self._require_fitted()
        ids, scalar = _as_index_array(userid, "userid")
        rows = _rows_for(ids, user_items, "user_items", self.item_factors_.shape[0],
                         ratings=True)
        return self._recalculated(*self._solve_rows(rows, "user"), scalar, return_biases)

    def recalculate_item(self, itemid, item_users, *, return_biases=False):
        """Solve an item's factors from its ratings against the fixed user factors.

        The item analogue of :meth:`recalculate_user` (with biases: ``[y_i, b_i]`` against
        ``[x_u, 1]`` and the targets ``r_ui − μ − b_u``).

        Parameters
        ----------
        itemid : int or array_like of int
            The item index (any value ≥ 0), or an array of them.
        item_users : scipy.sparse matrix
            Item × user ratings, one row per itemid (or indexed by itemid).
        return_biases : bool, default False
            Also return the items' biases (zeros for a model without biases).

        Returns
        -------
        numpy.ndarray, or (numpy.ndarray, numpy.ndarray) with ``return_biases``
            float32 factors, ``(factors,)`` or ``(len(itemid), factors)``; biases as in
            :meth:`recalculate_user`.

        Examples
        --------
        >>> model.recalculate_item(7, item_users).shape                 # doctest: +SKIP
        (32,)
        """
        self._require_fitted()
        ids, scalar = _as_index_array(itemid, "itemid")
        rows = _rows_for(ids, item_users, "item_users", self.user_factors_.shape[0],
                         ratings=True)
        return self._recalculated(*self._solve_rows(rows, "item"), scalar, return_biases)

    @staticmethod
    def _recalculated(F, b, scalar, return_biases):
        if not return_biases:
            return F[0] if scalar else F
        if b is None:
            b = np.zeros(F.shape[0], np.float32)
        return (F[0], b[0]) if scalar else (F, b)

    def _fold_in(self, side, ids, M, raw_ids):
        self._require_fitted()
        ids, _ = _as_index_array(ids, "userids" if side == "user" else "itemids")
        if np.unique(ids).size != ids.size:
            raise ValueError(f"{side} ids must be unique")
        other = self.item_factors_ if side == "user" else self.user_factors_
        name = "user_items" if side == "user" else "item_users"
        rows = _rows_for(ids, M, name, other.shape[0], ratings=True)
        counts = np.diff(rows.indptr)
        fac_attr, cnt_attr, map_attr = f"{side}_factors_", f"{side}_counts_", f"{side}_ids_"
        old = getattr(self, fac_attr).shape[0]
        new = max(old, int(ids.max()) + 1 if ids.size else 0)
        if new > old:
            self._check_growth(side, ids, counts, new)
        F, b = self._solve_rows(rows, side)
        id_map = getattr(self, map_attr, None)
        if new > old and id_map is not None:
            missing = np.setdiff1d(np.arange(old, new), ids)
            if raw_ids is None or missing.size:
                raise ValueError(
                    f"this model maps raw {side} ids: growing it to {new} {side}s needs raw_ids "
                    f"for every new index {old}..{new - 1} (one per {side} id, aligned)")
            raw = np.asarray(raw_ids)
            if raw.shape != ids.shape:
                raise ValueError(f"raw_ids must align with the {side} ids ({ids.size}), "
                                 f"got shape {raw.shape}")
            order = np.argsort(ids)
            new_raw = raw[order][ids[order] >= old]      # in index order old..new-1
            if id_map.dtype.kind == "U":
                new_raw = new_raw.astype(str)
            else:
                new_raw = new_raw.astype(id_map.dtype)
            clash = _map_lookup(id_map, new_raw, "ignore", side)
            if (clash >= 0).any() or np.unique(new_raw).size != new_raw.size:
                raise ValueError(f"raw_ids of new {side}s must be new and unique")
            setattr(self, map_attr, np.concatenate([id_map, new_raw]))
        fac = _grow(getattr(self, fac_attr), new)
        cnt = _grow(getattr(self, cnt_attr), new)
        fac[ids] = F
        cnt[ids] = counts
        if b is not None:          # rows skipped by growing get bias 0 (they predict μ + b_other)
            bias = _grow(np.asarray(getattr(self, f"{side}_biases_"), np.float32), new)
            bias[ids] = b
            setattr(self, f"{side}_biases_", bias)
        setattr(self, fac_attr, fac)
        setattr(self, cnt_attr, cnt)
        self._invalidate_inference()
        log.info("folded in %d %s(s) (%d new)", ids.size, side, new - old)
        return self

    def _check_growth(self, side, ids, counts, new):
        """Refuse ids that would grow ``side`` to ``new`` rows as ``fit`` refuses such ids:
        far more rows than the model's ratings, or host arrays beyond the available memory."""
        from ..data.validation import check_shape_vs_ratings
        from ..engine.memory import MemoryPlan
        cnt = np.asarray(getattr(self, f"{side}_counts_"))
        known = ids[ids < cnt.shape[0]]
        nnz = int(cnt.sum()) - int(cnt[known].sum()) + int(counts.sum())
        n_other = (self.item_factors_ if side == "user" else self.user_factors_).shape[0]
        check_shape_vs_ratings(
            (new, n_other) if side == "user" else (n_other, new), nnz,
            what=f"the model with {side} {int(ids.max())} folded in",
            hint=f"Fold in new {side}s at the next free indices ({cnt.shape[0]}, "
                 f"{cnt.shape[0] + 1}, ...)")
        fac = getattr(self, f"{side}_factors_")
        MemoryPlan(device={}, host={
            f"{side}_factors_": new * fac.shape[1] * fac.dtype.itemsize,
            f"{side}_counts_": new * cnt.dtype.itemsize, f"{side}_biases_": 4 * new}).check_host()

    def partial_fit_users(self, userids, user_items, *, raw_ids=None):
        """Fold new or changed users into the model without refitting the items.

        Each user's factors are solved by one least-squares step against the fixed item
        factors with the model's λ and weighting (see :meth:`recalculate_user`) and stored;
        ``user_counts_`` is updated; a model with biases solves and stores each user's bias
        with the factors (``user_biases_``), so ``predict``, ``recommend`` and ``save`` see it.
        Ids beyond the current users grow the factor matrix (indices skipped in between get
        zero factors, zero counts and zero bias, i.e. predict ``global_mean_``, plus the
        item's bias with biases). ``global_mean_``, the item factors and item biases are
        unchanged.

        Parameters
        ----------
        userids : array_like of int
            Unique 0-based user indices to (re)compute.
        user_items : scipy.sparse matrix or :class:`clmf.data.Ratings`
            Their ratings: one row per userid (or indexed by userid), items as columns.
        raw_ids : array_like, optional
            Raw ids aligned with ``userids``; required when the model keeps raw id maps
            (fitted on :class:`clmf.data.Ratings`) and the users grow. New indices must
            then be contiguous.

        Returns
        -------
        self

        Examples
        --------
        >>> import scipy.sparse as sp
        >>> n = model.user_factors_.shape[0]                            # doctest: +SKIP
        >>> n_items = model.item_factors_.shape[0]                       # doctest: +SKIP
        >>> new = sp.csr_matrix(([4.0, 5.0], ([0, 0], [3, 9])), shape=(1, n_items))  # doctest: +SKIP
        >>> model.partial_fit_users([n], new).user_factors_.shape[0] == n + 1    # doctest: +SKIP
        True
        """
        return self._fold_in("user", userids, user_items, raw_ids)

    def partial_fit_items(self, itemids, item_users, *, raw_ids=None):
        """Fold new or changed items into the model without refitting the users.

        The item analogue of :meth:`partial_fit_users` (``item_users`` is item × user; with
        biases ``item_biases_`` is solved and stored too).

        Parameters
        ----------
        itemids : array_like of int
            Unique 0-based item indices to (re)compute.
        item_users : scipy.sparse matrix
            Their ratings: one row per itemid (or indexed by itemid), users as columns.
        raw_ids : array_like, optional
            Raw item ids aligned with ``itemids`` (needed to grow a model with id maps).

        Returns
        -------
        self

        Examples
        --------
        >>> model.partial_fit_items([n_items], item_users_row)          # doctest: +SKIP
        ALS(...)
        """
        return self._fold_in("item", itemids, item_users, raw_ids)
