"""Ranking through the device top-k: the per-model upload cache, the host/device choice and
``recommend_all`` (mixed into :class:`clmf.inference.recommend.RecommenderMixin`).

The host ranking is :mod:`.host`; the argument checks stay with :mod:`.recommend` (reached
through ``self``), so this module never imports it.
"""
from __future__ import annotations

import logging

import numpy as np
import scipy.sparse as sp

log = logging.getLogger(__name__)

__all__ = ["DeviceRankingMixin", "ranking_vectors"]


def ranking_vectors(X, Y, item_biases=None):
    """``(Q, F)`` whose dot products rank the items for the users ``X``: the factors, or with
    biases ``[x, 1]·[y, b_i]`` (μ and the user's bias, the same for all of a user's items, are
    added to the scores afterwards)."""
    if item_biases is None:
        return X, Y
    Q = np.hstack([np.asarray(X, np.float32), np.ones((X.shape[0], 1), np.float32)])
    F = np.hstack([np.asarray(Y, np.float32), np.asarray(item_biases, np.float32)[:, None]])
    return Q, F


def _topk():
    """The :mod:`clmf.inference.topk` module (imported on first use)."""
    from . import topk
    return topk


def _liked_last(ids, sc, cand, rows, n):
    """Fill each row's empty slots with its liked candidates (ascending ids, score
    :data:`LIKED_SCORE`): implicit's order for liked items among ``items=``."""
    from .conventions import LIKED_SCORE
    short = np.flatnonzero((ids < 0).any(axis=1)) if ids.shape[1] else []
    inside = np.ones(n, bool) if cand is None else np.isin(np.arange(n), cand)
    for r in short:
        liked = np.unique(rows.indices[rows.indptr[r]:rows.indptr[r + 1]])
        liked = liked[(liked < n) & inside[np.minimum(liked, n - 1)]]
        free = np.flatnonzero(ids[r] < 0)
        m = min(free.size, liked.size)
        ids[r, free[:m]] = liked[:m]
        sc[r, free[:m]] = LIKED_SCORE
    return ids, sc


def _device_rank(dtk, Q, cand, rows, N, self_ids=None, liked_last=False):
    """:func:`host_rank` on the device: the same ``(pos, scores)``, query items forced first."""
    n = dtk.n
    b = Q.shape[0]
    C = n if cand is None else len(cand)
    k = min(N, C)
    excl = None if rows is None else sp.csr_matrix(rows)
    forced = None
    if self_ids is not None and k > 0:
        sid = np.asarray(self_ids, np.int64)
        inside = (sid < n) if cand is None else np.isin(sid, cand)
        forced = np.flatnonzero(inside)
        add = sp.csr_matrix((np.ones(forced.size, np.float32), (forced, sid[forced])),
                            shape=(b, n))
        excl = add if excl is None else (excl.astype(bool) + add.astype(bool)).tocsr()
    ids, sc = dtk.query(Q, k, cand, excl)
    if liked_last and rows is not None:
        ids, sc = _liked_last(ids, sc, cand, sp.csr_matrix(rows), n)
    if forced is not None and forced.size:
        ids[forced, 1:] = ids[forced, :-1].copy()
        sc[forced, 1:] = sc[forced, :-1].copy()
        ids[forced, 0] = sid[forced]
        sc[forced, 0] = 1.0
    return ids, sc


class DeviceRankingMixin:
    """Ranking on the model's device (:class:`clmf.inference.topk.DeviceTopK`, uploads cached
    per model) with the host fallback; ``recommend_all``. Mixed into
    :class:`clmf.inference.recommend.RecommenderMixin`."""

    def recommend_all(self, N=10, user_items=None, filter_already_liked_items=True,
                      filter_items=None, items=None, batch_size=None, show_progress=False):
        """Top-N items for every user of the model, batched on the device.

        Parameters
        ----------
        N : int, default 10
        user_items : scipy.sparse matrix, :class:`clmf.datasets.Ratings` or table, optional
            The training matrix (one row per model user; a table of raw ids as
            :meth:`recommend` takes it): its items are left out when
            ``filter_already_liked_items`` (needed then, as in :meth:`recommend`).
        filter_already_liked_items, filter_items, items
            As :meth:`recommend`.
        batch_size : int, optional
            Users per batch (default: the device's memory plan, at most 65,536; 4,096 on the
            host).
        show_progress : bool, default False
            A tqdm bar over the users.

        Returns
        -------
        (ids, scores)
            ``(n_users, min(N, candidates))`` int64 item indices and float32 scores, best first,
            padded with -1 / -inf (as a batched :meth:`recommend`).

        Examples
        --------
        >>> ids, scores = model.recommend_all(10, train)                # doctest: +SKIP
        >>> ids.shape                                                   # doctest: +SKIP
        (943, 10)
        """
        parts = list(self.iter_recommend_all(N, user_items, filter_already_liked_items,
                                             filter_items, items, batch_size, show_progress))
        if not parts:
            k = min(int(N), self.item_factors_.shape[0])
            return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
        return np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])

    def iter_recommend_all(self, N=10, user_items=None, filter_already_liked_items=True,
                           filter_items=None, items=None, batch_size=None, show_progress=False):
        """:meth:`recommend_all` batch by batch: yields ``(user_indices, ids, scores)``.

        The device path uploads the user factors once (resident queries) and streams the
        seen-item rows per batch; the host path ranks ``batch_size`` users at a time.

        Examples
        --------
        >>> for users, ids, scores in model.iter_recommend_all(10, train):   # doctest: +SKIP
        ...     write(users, ids, scores)
        """
        from .host import host_rank
        self._require_fitted()
        N, cand, rows = self._all_inputs(N, user_items, filter_already_liked_items, filter_items,
                                         items, batch_size)
        from .conventions import ids_dtype
        X, Y = self.user_factors_, self.item_factors_
        n_users, n_items = X.shape[0], Y.shape[0]
        liked_last = items is not None and rows is not None      # as recommend(items=...)
        bi = getattr(self, "item_biases_", None)
        Xq, Yq = ranking_vectors(X, Y, bi)
        if bi is not None:
            kind, sources = "items_biased", (Y, bi)
            add = (np.float32(self.global_mean_)
                   + np.asarray(self.user_biases_, np.float32))[:, None]
        else:
            kind, sources, add = "items", (Y,), None
        C = n_items if cand is None else len(cand)
        dtk = self._device_topk(kind, Yq, sources, float(n_users) * C * Yq.shape[1])
        use_dev = (dtk is not None and min(N, C) <= _topk().MAX_K
                   and float(n_users) * C * Yq.shape[1] >= dtk.host_threshold())
        bar = None
        if show_progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=n_users, desc="recommend", unit="user")
        try:
            if use_dev:
                stamp = (id(X), X.shape, bi is not None)
                if getattr(dtk, "_queries_stamp", None) != stamp:
                    dtk.set_queries(Xq)
                    dtk._queries_stamp = stamp
                B = min(batch_size or 65536, max(1, n_users))
                for b0, ids, sc in dtk.iter_query(None, N, cand, rows, rows=(0, n_users),
                                                  batch_rows=B):
                    users = np.arange(b0, b0 + ids.shape[0])
                    if liked_last:
                        ids, sc = _liked_last(ids, sc, cand, rows[b0:b0 + ids.shape[0]],
                                              n_items)
                    ids = ids_dtype(ids, n_items)
                    if add is not None:
                        sc = sc + add[users]
                    if bar is not None:
                        bar.update(users.size)
                    yield users, ids, sc
                return
            B = batch_size or 4096
            for b0 in range(0, n_users, B):
                b1 = min(n_users, b0 + B)
                sub = None if rows is None else rows[b0:b1]
                ids, sc = host_rank(Xq[b0:b1], Yq, cand, sub, N, liked_last=liked_last)
                ids = ids_dtype(ids, n_items)
                users = np.arange(b0, b1)
                if add is not None:
                    sc = sc + add[users]
                if bar is not None:
                    bar.update(users.size)
                yield users, ids, sc
        finally:
            if bar is not None:
                bar.close()

    def _rank(self, Q, F, cand, rows, N, self_ids=None, liked_last=False, kind=None,
              sources=()):
        """Rank candidates ``cand`` of ``F`` for the queries ``Q`` (see :func:`host_rank`): on
        the model's device through :class:`clmf.inference.topk.DeviceTopK` when one is
        available and the work passes its measured host threshold, else on the host.

        ``kind`` names the factor matrix for the per-model upload cache and ``sources`` are
        the model arrays it derives from (its cache stamp)."""
        if kind is not None:
            C = F.shape[0] if cand is None else len(cand)
            work = float(Q.shape[0]) * C * F.shape[1]
            dtk = self._device_topk(kind, F, sources, work)
            if dtk is not None:
                if min(N, C) <= _topk().MAX_K and work >= dtk.host_threshold():
                    try:
                        return _device_rank(dtk, Q, cand, rows, N, self_ids, liked_last)
                    except Exception as e:              # a device failure never breaks a call
                        self._device_failed(e)
        from .host import host_rank
        return host_rank(Q, F, cand, rows, N, self_ids, liked_last)

    # ----- the device path -------------------------------------------------------------------
    def _inference_device(self):
        """The device for inference (an override, else the model's ``device``), or None."""
        t = _topk()
        if not t.device_path_enabled() or getattr(self, "_topk_disabled", False):
            return None
        spec = t.options()["device"] or getattr(self, "device", "auto")
        try:
            from ..engine.device import first_device
            return first_device(spec)
        except Exception as e:                          # no OpenCL here: host inference
            log.debug("no inference device (%s); host path", e)
            return None

    def _device_topk(self, kind, F, sources=(), work=None):
        """The cached :class:`DeviceTopK` of ``kind`` (uploading ``F`` on a miss), or None (no
        device, or ``work`` below a threshold known without uploading: a tuned record's)."""
        dev = self._inference_device()
        if dev is None:
            return None
        if work is not None:
            known = _topk().known_threshold(dev, F.shape[1])
            if known is not None and work < known:
                return None
        stamp = (dev.int_ptr,) + tuple((id(a), getattr(a, "shape", None)) for a in sources)
        cache = self.__dict__.setdefault("_topk_cache", {})
        hit = cache.get(kind)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        try:
            dtk = _topk().DeviceTopK(F, dev)
        except Exception as e:
            self._device_failed(e)
            return None
        cache[kind] = (stamp, dtk)
        return dtk

    def _device_failed(self, e):
        """Log a device failure once and keep this model on the host from now on."""
        log.warning("device top-k failed (%s: %s); this model now ranks on the host",
                    type(e).__name__, e)
        self._topk_disabled = True

    def _invalidate_inference(self):
        """Forget the factors uploaded for inference (after a refit or a fold-in)."""
        self.__dict__.pop("_topk_cache", None)
        self.__dict__.pop("_topk_disabled", None)

