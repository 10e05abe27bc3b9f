"""Ranking through the device top-k: the per-model upload cache (the factors and seen items kept
on the model's devices, :mod:`.resident`), the host/device choice and ``recommend_all`` (mixed
into :class:`clmf.inference.recommend.RecommenderMixin`).

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


# work (multiply-adds) from which an untuned device ranks without measuring the host threshold
# first: a device that loses to NumPy at 10^10 multiply-adds (e.g. 5,600 users × 17,770 items
# at f = 100) would lose at every size the calibration measures
_MEASURE_BELOW = 1e10
DEFAULT_BATCH = 65536    # users per device launch unless the caller says (rounded to waves)


class _Fallback(Exception):
    """The device path failed (logged, the model now ranks on the host): rank on the host."""


_pool = None


def _verifier():
    """The thread that verifies a reused ``user_items``'s content while the devices rank."""
    global _pool
    if _pool is None:
        import concurrent.futures
        _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="clmf-seen")
    return _pool


def _is_csr(M):
    """A SciPy CSR matrix or array (the inputs whose preparation is cached)."""
    return sp.issparse(M) and M.format == "csr"


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
        user_items : scipy.sparse matrix, :class:`clmf.data.Ratings` or table, optional
            The training matrix (one row per model user; a table of raw ids as
            :meth:`recommend` takes it): its items are left out when
            ``filter_already_liked_items`` (needed then, as in :meth:`recommend`).
        filter_already_liked_items, filter_items, items
            As :meth:`recommend`.
        batch_size : int, optional
            Users per batch (default: the device's memory plan, about 65,536 rounded to whole
            waves of the device's work-groups; 4,096 on the host). ``user_items`` as a SciPy
            CSR is prepared and uploaded once and reused by later calls with the same matrix
            (:mod:`clmf.inference.resident`).
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
        ids = scores = None
        m = self.user_factors_.shape[0] if hasattr(self, "user_factors_") else 0
        sink = {}
        for users, i_, s_ in self._iter_all(N, user_items, filter_already_liked_items,
                                            filter_items, items, batch_size, show_progress,
                                            ordered=False, sink=sink):
            if sink:                            # the devices' threads wrote into the result
                continue
            if ids is None:
                if i_.shape[0] == m:            # one batch: its arrays are the result
                    return i_, s_
                ids = np.empty((m, i_.shape[1]), i_.dtype)
                scores = np.empty((m, s_.shape[1]), s_.dtype)
            ids[users[0]:users[0] + i_.shape[0]] = i_
            scores[users[0]:users[0] + s_.shape[0]] = s_
        if sink:
            return sink["ids"], sink["scores"]
        if ids is None:
            k = min(int(N), self.item_factors_.shape[0])
            return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
        return ids, scores

    def iter_recommend_all(self, N=10, user_items=None, filter_already_liked_items=True,
                           filter_items=None, items=None, batch_size=None, show_progress=False):
        """:meth:`recommend_all` batch by batch: yields ``(user_indices, ids, scores)``.

        The device path ranks from the factors and the seen items kept on the model's devices
        (every device of a multi-device model; ``user_items`` prepared and uploaded once, see
        :mod:`clmf.inference.resident` for when a later matrix counts as the same); the host
        path ranks ``batch_size`` users at a time.

        Examples
        --------
        >>> for users, ids, scores in model.iter_recommend_all(10, train):   # doctest: +SKIP
        ...     write(users, ids, scores)
        """
        yield from self._iter_all(N, user_items, filter_already_liked_items, filter_items, items,
                                  batch_size, show_progress)

    def _iter_all(self, N, user_items, filter_already_liked_items, filter_items, items,
                  batch_size, show_progress, ordered=True, sink=None):
        """:meth:`iter_recommend_all`; ``ordered=False``: a multi-device model's batches come
        as its devices finish them (:meth:`recommend_all` places them by their users). With
        a ``sink`` (a dict) the device path writes every user's lists into two arrays of all
        users (each device's thread its own rows), yields views of them, and puts them in the
        sink as ``"ids"`` and ``"scores"`` with its first batch."""
        from .conventions import ids_dtype
        from .host import host_rank
        self._require_fitted()
        N, cand, raw = self._all_inputs(N, user_items, filter_already_liked_items, filter_items,
                                        items, batch_size, rows=False)
        X, Y = self.user_factors_, self.item_factors_
        n_users, n_items = X.shape[0], Y.shape[0]
        liked_last = items is not None and raw is not None      # as recommend(items=...)
        bi = getattr(self, "item_biases_", None)
        add = None
        if bi is not None:
            add = (np.float32(self.global_mean_)
                   + np.asarray(self.user_biases_, np.float32))[:, None]
        C = n_items if cand is None else len(cand)
        f = Y.shape[1] + (bi is not None)
        res = self._resident_for(float(n_users) * C * f, min(N, C))
        fast = res is not None and (raw is None or (_is_csr(raw) and not liked_last))
        rows = None
        if raw is not None and not fast:
            rows = self._seen_rows(np.arange(n_users), raw)
        bar = None
        if show_progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=n_users, desc="recommend", unit="user")
        try:
            if res is not None:
                done = 0
                out = None
                if sink is not None:
                    k = min(N, C)
                    out = (np.empty((n_users, k), ids_dtype(np.zeros(0, np.int64), n_items).dtype),
                           np.empty((n_users, k), np.float32))
                try:
                    for u0, ids, sc in self._iter_resident(res, 0, n_users, N, cand,
                                                           raw if fast else rows, 0,
                                                           batch_size, ordered, out):
                        u1 = u0 + ids.shape[0]
                        if liked_last:
                            ids, sc = _liked_last(ids, sc, cand, rows[u0:u1], n_items)
                        ids = ids_dtype(ids, n_items)
                        if add is not None:
                            sc += add[u0:u1]
                        if bar is not None:
                            bar.update(u1 - u0)
                        done = u1
                        if out is not None and not sink:
                            sink["ids"], sink["scores"] = out
                        yield np.arange(u0, u1), ids, sc
                    return
                except _Fallback as e:
                    if done:                        # some users went out: not the host's to redo
                        raise e.__cause__ from None
            if rows is None and raw is not None:
                rows = self._seen_rows(np.arange(n_users), raw)
            Xq, Yq = ranking_vectors(X, Y, bi)
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
    def _inference_devices(self):
        """The devices for inference (an override, else the model's ``device``: all of a
        multi-device model's), or an empty list."""
        t = _topk()
        if not t.device_path_enabled() or getattr(self, "_topk_disabled", False):
            return []
        spec = t.options()["device"] or getattr(self, "device", "auto")
        try:
            from ..engine.device import select_devices
            return select_devices(spec)
        except Exception as e:                          # no OpenCL here: host inference
            log.debug("no inference device (%s); host path", e)
            return []

    def _inference_device(self):
        """The first device for inference, or None."""
        devs = self._inference_devices()
        return devs[0] if devs else None

    def _resident(self, devs=None, handed=None):
        """The model's :class:`~clmf.inference.resident.ResidentRanker` on its devices
        (built, i.e. uploaded, on a miss: the factors or the devices changed), or None;
        ``handed``: the fit's factor buffers, kept where they fit (no biases)."""
        from .resident import ResidentRanker
        devs = self._inference_devices() if devs is None else devs
        if not devs:
            return None
        X, Y = self.user_factors_, self.item_factors_
        bi = getattr(self, "item_biases_", None)
        stamp = (tuple(d.int_ptr for d in devs), id(X), X.shape, id(Y), Y.shape, id(bi))
        cache = self.__dict__.setdefault("_topk_cache", {})
        hit = cache.get("resident")
        if hit is not None and hit[0] == stamp:
            return hit[1]
        cache.pop("resident", None)        # the old buffers go before the new ones
        try:
            Xq, Yq = ranking_vectors(X, Y, bi)
            res = ResidentRanker(Xq, Yq, devs, handed=handed if bi is None else None)
        except Exception as e:
            self._device_failed(e)
            return None
        cache["resident"] = (stamp, res)
        return res

    def _resident_for(self, work, k):
        """The resident ranker when ranking ``work`` multiply-adds with lists of ``k`` pays on
        the devices (the measured or tuned host threshold), else None (rank on the host)."""
        devs = self._inference_devices()
        if not devs or k > _topk().MAX_K:
            return None
        bi = getattr(self, "item_biases_", None)
        known = _topk().known_threshold(devs[0], self.item_factors_.shape[1] + (bi is not None))
        if known is not None and work < known:
            return None
        res = self._resident(devs)
        if res is None:
            return None
        # the host wins only small calls: the threshold is measured (a few device and host
        # rankings of up to 64 queries) only for work where it could matter
        if (known is None and work < _MEASURE_BELOW) and work < res.first.host_threshold():
            return None
        return res

    def _iter_resident(self, res, r0, r1, N, cand, M, row0, batch_rows, ordered=True,
                       out=None):
        """Yield ``(user0, ids, scores)`` of users ``r0..r1`` from the resident ranker, the
        stored entries of the CSR ``M`` (its first row is user ``row0``; None: nothing) left
        out: ``M`` is prepared and uploaded once (:class:`~clmf.inference.resident.SeenItems`);
        a matrix that matches the last one's cheap fingerprint has its content verified in a
        host thread while the devices rank, and is prepared again (and the users ranked
        again) if it changed. ``ordered`` and ``out``: as :meth:`ResidentRanker.iter_rank
        <clmf.inference.resident.ResidentRanker.iter_rank>`."""
        seen, verify = None, None
        # the caller's batch size exactly, or the default's in whole waves of the device
        batch = ({"batch_rows": batch_rows} if batch_rows
                 else {"max_batch": DEFAULT_BATCH})
        if M is not None:
            seen, reused = res.seen_for(M, row0, cand)
            if not seen.covers(r0, r1):
                raise ValueError(f"user_items has {M.shape[0]} rows: pass one row per requested "
                                 f"id ({r1 - r0}) or a matrix indexed by id (more than {r1 - 1} "
                                 "rows)")
            if reused:
                verify = _verifier().submit(seen.same_content, M)
        try:
            gen = res.iter_rank(r0, r1, N, cand, seen, ordered=ordered, out=out, **batch)
            for item in gen:
                if verify is not None:
                    ok, verify = verify.result(), None
                    if not ok:
                        gen.close()
                        log.info("user_items changed in place since it was uploaded: "
                                 "preparing it again")
                        res.forget_seen()
                        seen, _ = res.seen_for(M, row0, cand)
                        yield from res.iter_rank(r0, r1, N, cand, seen, ordered=ordered,
                                                 out=out, **batch)
                        return
                yield item
        except (ValueError, IndexError, TypeError):
            raise
        except Exception as e:                  # the caller ranks on the host
            self._device_failed(e)
            raise _Fallback(e) from e
        finally:
            if verify is not None:
                verify.cancel()

    def _recommend_range(self, span, M, N, cand):
        """``(item ids, scores)`` of users ``span = (r0, r1)`` from the resident ranker (``M``:
        the CSR of seen items, row-aligned with the users or indexed by id; None: nothing
        left out), biases added; None when the host should rank (small work, no device, a
        device failure)."""
        r0, r1 = span
        n_items = self.item_factors_.shape[0]
        bi = getattr(self, "item_biases_", None)
        C = n_items if cand is None else len(cand)
        k = min(int(N), C)
        work = float(r1 - r0) * C * (self.item_factors_.shape[1] + (bi is not None))
        res = self._resident_for(work, k)
        if res is None:
            return None
        from .conventions import ids_dtype
        row0 = r0 if M is not None and M.shape[0] == r1 - r0 else 0
        ids = np.empty((r1 - r0, k), ids_dtype(np.zeros(0, np.int64), n_items).dtype)
        sc = np.empty((r1 - r0, k), np.float32)
        try:
            # batches of about 65,536 users: the host finishes one while the device ranks the next;
            # each device's thread writes its users' lists into ids, sc
            for _ in self._iter_resident(res, r0, r1, N, cand, M, row0, None, ordered=False,
                                         out=(ids, sc)):
                pass
        except _Fallback:
            return None
        if bi is not None:
            sc += (np.float32(self.global_mean_)
                   + np.asarray(self.user_biases_, np.float32)[r0:r1])[:, None]
        return ids, sc

    def clear_device_cache(self):
        """Free the device memory this model holds for ranking (its factors and the seen items
        of the last ``user_items``); the next call uploads them again.

        Examples
        --------
        >>> model.clear_device_cache()                                  # doctest: +SKIP
        """
        self._invalidate_inference()

    def _warm_inference(self, N=10):
        """Before a fit: free the device memory held for ranking (the fit plans with it), and
        build the top-k program of the model's GPUs for its ranking vectors (``factors``, one
        more with biases) and lists of ``N`` in a background thread (the fit runs meanwhile,
        so the first ``recommend`` after it finds the program built); CPU devices build on
        first use. Never fails (the fit checks the parameters)."""
        import threading

        from ..engine.device import device_info, thread_safe
        self._invalidate_inference()
        try:
            width = int(self.factors) + bool(getattr(self, "biases", False))
            gpus = [d for d in self._inference_devices()
                    if device_info(d).type == "GPU" and thread_safe(d)]
        except Exception as e:                  # inference must never break a fit
            log.debug("no top-k warm-up (%s)", e)
            return
        if not gpus:
            return

        def build():
            for d in gpus:
                try:
                    _topk().prebuild(d, width, N)
                except Exception as e:          # the first call builds (and reports) it
                    log.debug("top-k warm-up build failed on %s: %s", d.name, e)
        threading.Thread(target=build, name="clmf-topk-build", daemon=True).start()

    def _prepare_seen(self, X):
        """Before a fit of the SciPy CSR ``X``: a :class:`~clmf.inference.resident.PreparedSeen`
        of it (started by the fit when it iterates) for :meth:`_keep_on_device`, or None (not
        a CSR, no inference device, or ranking all users would go to the host by a known
        threshold). Never fails."""
        if not _is_csr(X):
            return None
        try:
            devs = self._inference_devices()
            if not devs:
                return None
            f = int(self.factors) + bool(getattr(self, "biases", False))
            known = _topk().known_threshold(devs[0], f)
            if known is not None and float(X.shape[0]) * X.shape[1] * f < known:
                return None
        except Exception as e:                  # inference must never break a fit
            log.debug("no seen-items preparation (%s)", e)
            return None
        from .resident import PreparedSeen
        return PreparedSeen(X)

    def _keep_on_device(self, seen=None, handed=None):
        """After a fit: drop what was uploaded for the old factors and upload the new ones to
        the model's devices in the ranker's layout — or keep the fit's own factor buffers
        (``handed``, :func:`clmf.engine.factors.hand_over`) where their layout is the
        ranker's; with ``seen`` (the training CSR's
        :class:`~clmf.inference.resident.PreparedSeen`) its seen items too, so a first call
        with that matrix uploads nothing. Never fails a fit."""
        from ..engine.factors import release_unused
        self._invalidate_inference()
        try:
            res = self._resident(handed=handed)
        except Exception as e:                  # inference must never break a fit
            log.debug("keeping the factors on the device failed (%s); uploaded on first use", e)
            return
        finally:
            release_unused(handed)              # what the ranker did not keep
        s = None if seen is None or res is None else seen.result()
        if s is None:
            return
        try:
            res.adopt_seen(s)
        except Exception as e:                  # e.g. beyond an allocation: the call decides
            log.debug("seen items not uploaded after the fit (%s); prepared on first use", e)

    def _device_topk(self, kind, F, sources=(), work=None):
        """The cached :class:`DeviceTopK` of ``kind`` (uploading ``F`` on a miss), or None (no
        device, or ``work`` below a threshold known without uploading: a tuned record's). The
        model's items (``"items"``, ``"items_biased"``) are its resident ranker's: with several
        devices the :class:`~clmf.inference.resident.ResidentRanker` itself (its ``query``
        splits the rows over them)."""
        dev = self._inference_device()
        if dev is None:
            return None
        if work is not None:
            known = _topk().known_threshold(dev, F.shape[1])
            if known is not None and work < known:
                return None
        if kind in ("items", "items_biased"):
            res = self._resident()
            return None if res is None else res.first if len(res.parts) == 1 else res
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

