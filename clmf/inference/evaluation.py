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

MIN_GROUP = 64           # fewest users a validation query ranks among a subset of the items


def _csr(M, name, shape=None):
    """A canonical CSR (sorted indices, no duplicates; stored zeros kept) of ``M`` (scipy.sparse
    or a :class:`clmf.data.Ratings`) with the expected ``shape``."""
    if hasattr(M, "to_csr") and hasattr(M, "user_ids"):
        M = M.to_csr()
    if not sp.issparse(M):
        raise TypeError(f"{name} must be a scipy.sparse matrix or a clmf.data.Ratings, not "
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
        from ..metrics import check_k
        T = _csr(test, "test")
        T.data = np.ones_like(T.data, dtype=np.float32)
        self.shape = T.shape
        self.K = check_k(K)
        self.users = np.flatnonzero(np.diff(T.indptr) > 0)
        self.relevant = T[self.users]
        self.seen = None if seen is None else _csr(seen, "seen", T.shape)[self.users]
        self.device = device
        self._dtk = topk
        self._own = topk is None
        self._resident = False           # the seen items uploaded (own DeviceTopK only)
        self._host = device is None and topk is None
        self._on_device = None           # the factors uploaded, within one strict_precision
        self._lists = None               # the last top-K lists of strict_precision
        self.ranked, self.ranked_work = 0, 0.0

    # ----- ranking -----------------------------------------------------------------------------
    def rank(self, Q, F, rows=None, candidates=None):
        """Top-``K`` item ids ``(len(rows), K)`` (``-1`` pads) of the test users (``rows``:
        positions in :attr:`users`, default all) for user vectors ``Q`` (all users) and item
        vectors ``F``, among ``candidates`` (sorted item ids; default all items)."""
        self._on_device = None
        return self._rank(Q, F, rows, candidates)

    def _rank(self, Q, F, rows=None, candidates=None):
        """:meth:`rank`, uploading ``F`` only where it is not the array uploaded last."""
        rows = np.arange(self.users.size) if rows is None else np.asarray(rows, np.int64)
        Qu = np.asarray(Q, np.float32)[self.users[rows]]
        F = np.asarray(F, np.float32)
        everyone = rows.size == self.users.size and candidates is None
        ids = None
        if not self._host and rows.size:
            try:
                ids = self._device_rank(Qu, F, rows, everyone, candidates)
            except Exception as e:               # a device failure never breaks an evaluation
                log.warning("device ranking failed (%s: %s); ranking on the host",
                            type(e).__name__, e)
                self._host, self._dtk = True, None
        if ids is None:
            from .host import host_rank
            seen = None if self.seen is None else self.seen[rows]
            ids = host_rank(Qu, F, candidates, seen, self.K)[0]
        if ids.shape[1] < self.K:                # fewer items than K: pad as misses
            ids = np.hstack([ids, np.full((ids.shape[0], self.K - ids.shape[1]), -1, ids.dtype)])
        return ids

    def _device_rank(self, Qu, F, rows, everyone, candidates=None):
        """:meth:`rank` on the device, or None where the host is faster for this much work."""
        from . import topk
        C = F.shape[0] if candidates is None else len(candidates)
        work = float(rows.size) * C * F.shape[1]
        if self.K > topk.MAX_K:
            return None
        if self._dtk is None:
            known = topk.known_threshold(self.device, F.shape[1])
            if known is not None and work < known:
                return None
            self._dtk = topk.DeviceTopK(F, self.device)
            self._on_device = F
        dtk = self._dtk
        if work < dtk.host_threshold():
            return None
        if self._own and F is not self._on_device:
            dtk.set_factors(F)
            self._on_device = F
        if self._own and everyone:
            # the seen items stay on the device, aligned with the resident query rows
            if not self._resident and self.seen is not None:
                dtk.set_exclude(self.seen)
            self._resident = True
            dtk.set_queries(Qu)
            return dtk.query_rows(0, rows.size, self.K,
                                  exclude=None if self.seen is None else "resident")[0]
        return dtk.query(Qu, self.K, candidates,
                         exclude=None if self.seen is None else self.seen[rows])[0]

    # ----- metrics -----------------------------------------------------------------------------
    def metrics(self, Q, F):
        """implicit's ``ranking_metrics_at_k`` of the factors (see
        :func:`clmf.metrics.ranking_metrics`): precision, map, ndcg, auc, strict_precision."""
        from ..metrics import ranking_metrics
        return ranking_metrics(self.rank(Q, F), self.relevant, self.K, self.shape[1])

    def strict_precision(self, Q, F):
        """Mean over the test users of hits / ``K`` (:func:`clmf.metrics.precision_at_k`), the
        value a full ranking gives.

        From the second call on, the users' last top-``K`` lists bound the work, exactly (the
        margins cover float32 rounding on the host and the device, :meth:`_bounds`):

        * a user is ranked again only where its list cannot prove that it has no hit now: where
          for some held-out item fewer than ``K`` items of the list (unseen, other than the
          item) score above it;
        * such a user is ranked among the items whose norm can reach the lowest score of its
          list (``‖q‖·‖y‖``), users with similar counts of such items together.

        :attr:`ranked` counts the users ranked by the last call, :attr:`ranked_work` the share
        of a full ranking's multiply-adds they took.
        """
        from ..metrics import count_hits
        if self.users.size == 0:
            return float("nan")
        Q = np.asarray(Q, np.float32)
        F = np.asarray(F, np.float32)
        self._on_device = None        # F is new here: uploaded once, by its first _rank
        n = F.shape[0]
        hits = 0
        if self._lists is None:
            self._lists = ids = self._rank(Q, F)
            self.ranked, self.ranked_work = self.users.size, 1.0
            hits = count_hits(ids, self.relevant, self.K)[0].sum()
            return float(hits / (self.K * self.users.size))
        ynorm = np.sqrt(np.einsum("ij,ij->i", F, F, dtype=np.float64))
        certified, need = self._bounds(Q, F, ynorm)
        rows = np.flatnonzero(~certified)
        order = np.argsort(-ynorm, kind="stable")             # items by norm, largest first
        reach = np.searchsorted(-ynorm[order], -need[rows], side="right")
        work = 0
        # rows by the number of items (largest norms first) they need, in groups of up to
        # twice their need (at most log2(n) queries, each at most twice the least work); a group
        # of fewer than MIN_GROUP users joins the next one (one query less costs more than
        # ranking them among more items)
        bucket = np.ceil(np.log2(np.maximum(reach, self.K))).astype(np.int64)
        kinds = np.unique(bucket)
        pending = np.zeros(0, np.int64)
        for j, b in enumerate(kinds):
            pending = np.concatenate([pending, rows[bucket == b]])
            if pending.size < MIN_GROUP and j + 1 < kinds.size:
                continue
            sub, pending = pending, np.zeros(0, np.int64)
            p = min(n, 1 << int(b))
            cand = np.sort(order[:p]) if p < n else None
            ids = self._rank(Q, F, sub, cand)
            self._lists[sub] = ids
            hits += count_hits(ids, self.relevant[sub], self.K)[0].sum()
            work += sub.size * p
        self.ranked, self.ranked_work = int(rows.size), work / (self.users.size * n)
        return float(hits / (self.K * self.users.size))

    def _bounds(self, Q, F, ynorm):
        """Per test user, from its last list: ``(certified, need)``. ``certified``: every
        held-out item has ``K`` items of the list (not the item itself) scoring above it by more
        than the margin, so none is in the user's top ``K`` now. ``need``: the least item norm
        (``ynorm``, float64) that can score above the list's lowest score less the margin
        (``‖q‖·‖y‖`` bounds a score), so the top ``K`` lies among the items of that norm or more
        (0: all items). The margin ``8·f·u·‖q‖·max‖y‖`` (u the float32 unit roundoff) covers the
        rounding of a float32 dot product of length f (at most ``f·u·‖q‖·‖y‖``) on the host and
        the device."""
        L = self._lists
        Qu = Q[self.users]
        rel = self.relevant
        pair_row = np.repeat(np.arange(self.users.size), np.diff(rel.indptr))
        item = rel.indices
        s_item = np.einsum("ij,ij->i", Qu[pair_row], F[item])
        s_list = np.einsum("rf,rkf->rk", Qu, F[np.maximum(L, 0)])
        s_list[L < 0] = -np.inf
        qnorm = np.sqrt(np.einsum("ij,ij->i", Qu, Qu, dtype=np.float64))
        u = np.finfo(np.float32).eps / 2
        margin = 8 * F.shape[1] * u * qnorm * ynorm.max(initial=0.0)
        above = ((s_list[pair_row] - s_item[:, None] > margin[pair_row, None])
                 & (L[pair_row] != item[:, None])).sum(axis=1)
        doubtful = np.bincount(pair_row[above < self.K], minlength=self.users.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            need = (s_list.min(axis=1) - margin) / qnorm
        return doubtful == 0, np.where(np.isfinite(need) & (need > 0), need, 0.0)


def _model_vectors(model):
    """``(Q, F, kind, sources)``: the vectors ranking the model's items
    (:func:`~clmf.inference.ranking.ranking_vectors`) and the model's upload-cache key of F."""
    from .ranking import ranking_vectors
    Y, bi = model.item_factors_, getattr(model, "item_biases_", None)
    Q, F = ranking_vectors(model.user_factors_, Y, bi)
    return (Q, F, "items", (Y,)) if bi is None else (Q, F, "items_biased", (Y, bi))


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
    model : a fitted :class:`clmf.ALS` (or :class:`clmf.dask.ALS`)
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
