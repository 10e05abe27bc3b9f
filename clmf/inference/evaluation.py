"""Ranking evaluation on the device: :func:`evaluate` (the ``implicit`` library's
``ranking_metrics_at_k`` for a clmf model) and :class:`RankingEvaluator`, which a fit builds once
for its validation set and runs on each iteration's factors.

The ranking is the one :meth:`clmf.ALS.recommend` gives (seen items left out, equal scores by the
lower item index), computed by :class:`clmf.inference.topk.DeviceTopK` when a device is there
and the work passes its measured host threshold, else by :func:`clmf.inference.host.host_rank`.
"""
from __future__ import annotations

import logging

import numpy as np
import scipy.sparse as sp

log = logging.getLogger(__name__)

__all__ = ["RankingEvaluator", "evaluate"]


def _csr(M, name, shape=None):
    """A canonical CSR (sorted indices, no duplicates; stored zeros kept) of ``M`` (scipy.sparse
    or a :class:`clmf.datasets.Ratings`) with the expected ``shape``."""
    if hasattr(M, "to_csr") and hasattr(M, "user_ids"):
        M = M.to_csr()
    if not sp.issparse(M):
        raise TypeError(f"{name} must be a scipy.sparse matrix or a clmf.datasets.Ratings, not "
                        f"{type(M).__name__}")
    M = sp.csr_matrix(M, copy=True)
    M.sum_duplicates()
    if shape is not None and M.shape != tuple(shape):
        raise ValueError(f"{name} has shape {M.shape}, the model's is {tuple(shape)} (users × "
                         "items, the model's indices)")
    return M


class RankingEvaluator:
    """The top-``K`` items of every user with held-out items, for new factors at each call.

    Built once per held-out set (a fit's validation set): the test users, their relevant items
    and their seen items are prepared here; on a device the seen items are uploaded with the
    first call and kept there, and later calls write the new item factors into the same buffer
    (:meth:`DeviceTopK.set_factors`) and upload only the users' query vectors.

    Parameters
    ----------
    test : scipy.sparse matrix or Ratings (users × items)
        Held-out items: every stored entry of a row is relevant (as in ``implicit``).
    seen : scipy.sparse matrix or Ratings, optional
        Items never recommended to a user (the training matrix), same shape.
    K : int
        List length.
    device : pyopencl.Device or None
        Where to rank (None: the host).
    topk : DeviceTopK, optional
        A :class:`~clmf.inference.topk.DeviceTopK` already holding the factors ranked (a model's
        cached one): used as it is, nothing kept on it.
    """

    def __init__(self, test, seen=None, K=10, device=None, topk=None):
        """Prepare the test users, their relevant and seen items."""
        from ..metrics import _check_k
        T = _csr(test, "test")
        T.data = np.ones_like(T.data, dtype=np.float32)
        self.shape = T.shape
        self.K = _check_k(K)
        self.users = np.flatnonzero(np.diff(T.indptr) > 0)
        self.relevant = T[self.users]
        self.seen = None if seen is None else _csr(seen, "seen", T.shape)[self.users]
        self.device = device
        self._dtk = topk
        self._own = topk is None
        self._resident = False           # the seen items uploaded (own DeviceTopK only)
        self._host = device is None and topk is None
        self._lists = None               # the last top-K lists of strict_precision
        self.ranked = 0

    # ----- ranking -----------------------------------------------------------------------------
    def rank(self, Q, F, rows=None):
        """Top-``K`` item ids ``(len(rows), K)`` (``-1`` pads) of the test users (``rows``:
        positions in :attr:`users`, default all) for user vectors ``Q`` (all users) and item
        vectors ``F``."""
        rows = np.arange(self.users.size) if rows is None else np.asarray(rows, np.int64)
        Qu = np.asarray(Q, np.float32)[self.users[rows]]
        F = np.asarray(F, np.float32)
        everyone = rows.size == self.users.size
        ids = None
        if not self._host and rows.size:
            try:
                ids = self._device_rank(Qu, F, rows, everyone)
            except Exception as e:               # a device failure never breaks an evaluation
                log.warning("device ranking failed (%s: %s); ranking on the host",
                            type(e).__name__, e)
                self._host, self._dtk = True, None
        if ids is None:
            from .host import host_rank
            seen = None if self.seen is None else self.seen[rows]
            ids = host_rank(Qu, F, None, seen, self.K)[0]
        if ids.shape[1] < self.K:                # fewer items than K: pad as misses
            ids = np.hstack([ids, np.full((ids.shape[0], self.K - ids.shape[1]), -1, ids.dtype)])
        return ids

    def _device_rank(self, Qu, F, rows, everyone):
        """:meth:`rank` on the device, or None where the host is faster for this much work."""
        from . import topk
        work = float(rows.size) * F.shape[0] * F.shape[1]
        if self.K > topk.MAX_K:
            return None
        if self._dtk is None:
            known = topk.known_threshold(self.device, F.shape[1])
            if known is not None and work < known:
                return None
            self._dtk = topk.DeviceTopK(F, self.device)
        elif self._own:
            self._dtk.set_factors(F)
        dtk = self._dtk
        if work < dtk.host_threshold():
            return None
        if self._own and everyone:
            # the seen items stay on the device, aligned with the resident query rows
            if not self._resident and self.seen is not None:
                dtk.set_exclude(self.seen)
            self._resident = True
            dtk.set_queries(Qu)
            return dtk.query_rows(0, rows.size, self.K,
                                  exclude=None if self.seen is None else "resident")[0]
        return dtk.query(Qu, self.K, exclude=None if self.seen is None else self.seen[rows])[0]

    # ----- metrics -----------------------------------------------------------------------------
    def metrics(self, Q, F):
        """implicit's ``ranking_metrics_at_k`` of the factors (see
        :func:`clmf.metrics.ranking_metrics`): precision, map, ndcg, auc, strict_precision."""
        from ..metrics import ranking_metrics
        return ranking_metrics(self.rank(Q, F), self.relevant, self.K, self.shape[1])

    def strict_precision(self, Q, F):
        """Mean over the test users of hits / ``K`` (:func:`clmf.metrics.precision_at_k`), the
        value a full ranking gives.

        From the second call on, a user is ranked again only where its last top-``K`` list
        cannot prove that it has no hit now: when, for every held-out item, ``K`` items of
        that list (unseen, other than the item) score above it by more than float32 rounding
        can explain (:meth:`_certified`), the held-out item is outside the new top ``K`` on the
        host and on the device alike. :attr:`ranked` counts the users ranked by the last call.
        """
        from ..metrics import _hits
        if self.users.size == 0:
            return float("nan")
        Q = np.asarray(Q, np.float32)
        F = np.asarray(F, np.float32)
        if self._lists is None:
            rows = np.arange(self.users.size)
            self._lists = self.rank(Q, F)
            ids = self._lists
        else:
            rows = np.flatnonzero(~self._certified(Q, F))
            ids = self.rank(Q, F, rows)
            self._lists[rows] = ids
        self.ranked = int(rows.size)
        hits = _hits(ids, self.relevant[rows], self.K)[0].sum() if rows.size else 0
        return float(hits / (self.K * self.users.size))

    def _certified(self, Q, F):
        """Per test user: True where every held-out item has ``K`` items of the user's last list
        (not the item itself) scoring above it by more than ``8·f·u·‖q‖·max‖y‖`` (u the float32
        unit roundoff; a float32 dot product of length f errs by at most ``f·u·‖q‖·‖y‖``), so
        that no held-out item can be in the user's top ``K`` of ``Q``, ``F``."""
        L = self._lists
        Qu = Q[self.users]
        rel = self.relevant
        pair_row = np.repeat(np.arange(self.users.size), np.diff(rel.indptr))
        item = rel.indices
        s_item = np.einsum("ij,ij->i", Qu[pair_row], F[item])
        s_list = np.einsum("rf,rkf->rk", Qu, F[np.maximum(L, 0)])
        s_list[L < 0] = -np.inf
        ymax = float(np.sqrt(np.einsum("ij,ij->i", F, F).max(initial=0.0)))
        u = np.finfo(np.float32).eps / 2
        margin = 8 * F.shape[1] * u * np.linalg.norm(Qu, axis=1) * ymax
        above = ((s_list[pair_row] - s_item[:, None] > margin[pair_row, None])
                 & (L[pair_row] != item[:, None])).sum(axis=1)
        doubtful = np.bincount(pair_row[above < self.K], minlength=self.users.size)
        return doubtful == 0


def _model_vectors(model):
    """``(Q, F, kind, sources)``: the user and item vectors whose dot products rank the model's
    items (``[x, 1]·[y, b_i]`` with biases; the user's own bias does not change its ranking)."""
    X, Y = model.user_factors_, model.item_factors_
    bi = getattr(model, "item_biases_", None)
    if bi is None:
        return X, Y, "items", (Y,)
    Q = np.hstack([np.asarray(X, np.float32), np.ones((X.shape[0], 1), np.float32)])
    F = np.hstack([np.asarray(Y, np.float32), np.asarray(bi, np.float32)[:, None]])
    return Q, F, "items_biased", (Y, bi)


def model_evaluator(model, train, test, K=10):
    """A :class:`RankingEvaluator` of a fitted model's items on ``test``, ranked on the model's
    device (its cached upload of the factors) where that pays, with the ``(Q, F)`` it ranks."""
    model._require_fitted()
    shape = (model.user_factors_.shape[0], model.item_factors_.shape[0])
    T = _csr(test, "test", shape)
    S = None if train is None else _csr(train, "train", shape)
    Q, F, kind, sources = _model_vectors(model)
    n_test = int(np.count_nonzero(np.diff(T.indptr)))
    dtk = model._device_topk(kind, F, sources, float(n_test) * F.shape[0] * F.shape[1])
    return RankingEvaluator(T, S, K, topk=dtk), Q, F


def evaluate(model, train, test, K=10):
    """Ranking metrics of a fitted model on held-out items, as the ``implicit`` library's
    ``ranking_metrics_at_k(model, train, test, K)`` computes them, ranked on the model's device.

    Every user with a held-out item gets its top-``K`` items (:meth:`clmf.ALS.recommend`'s
    ranking, the items of ``train`` left out); every stored entry of ``test`` is relevant.

    Parameters
    ----------
    model : a fitted :class:`clmf.ALS` (any model with ``user_factors_`` / ``item_factors_``)
    train : scipy.sparse matrix or Ratings (users × items, the model's indices), or None
        Items not to recommend (the training matrix); None leaves nothing out.
    test : scipy.sparse matrix or Ratings, same shape — the held-out items.
    K : int, default 10

    Returns
    -------
    dict
        * ``"precision"`` — implicit's precision: the users' hits summed, divided by the sum of
          ``min(K, |relevant|)`` (with two held-out items per user and K = 10: hits / 2);
        * ``"map"``, ``"ndcg"``, ``"auc"`` — implicit's MAP@K, nDCG@K and AUC (means over the
          users with held-out items);
        * ``"strict_precision"`` — hits / ``K`` averaged over those users (what
          :meth:`clmf.ALS.score` returns for implicit feedback).

        The first four equal ``implicit.evaluation.ranking_metrics_at_k(model, train, test, K)``
        (see :func:`clmf.metrics.ranking_metrics` for the formulas).

    Examples
    --------
    >>> res = clmf.evaluate(model, train, test, K=10)                 # doctest: +SKIP
    >>> sorted(res)                                                   # doctest: +SKIP
    ['auc', 'map', 'ndcg', 'precision', 'strict_precision']
    """
    ev, Q, F = model_evaluator(model, train, test, K)
    return ev.metrics(Q, F)
