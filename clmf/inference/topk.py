"""Top-k on an OpenCL device: scores of query vectors against item vectors fused with selection.

The kernels (``cl_kernels/topk.cl.j2``) compute ``Q · Fᵀ`` tile by tile and keep, per query,
the best ``k`` (score, index) pairs in local memory, so the score matrix never reaches global
memory; a second kernel merges the partial lists of the candidate splits. Results are exact and
ordered like :func:`clmf.inference.host._top_n`: score descending, then the lower index.

The API is a function of (factors, queries, candidates, exclusion CSR, N) on one device, so
the model, the CLI and the multi-device paths share it::

    tk = DeviceTopK(item_factors, device="cpu")       # uploads the factors once
    ids, scores = tk.query(user_vectors, N=10, exclude=seen_csr)

:class:`DeviceTopK` caches the uploaded factors; :meth:`DeviceTopK.query` plans its batches
from the device's memory; :meth:`DeviceTopK.host_threshold` is the measured work (multiply-adds)
below which the host's NumPy path is faster (from a ``topk`` tuning record, else a calibration
of a few milliseconds on first use). :func:`inference_options` overrides the device choice and
the threshold (the tests force the device path with ``min_work=0``).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import os
import threading
import time

import numpy as np
import scipy.sparse as sp

from ..errors import DeviceMemoryError, InvalidConfigError
from ..interrupts import drain
from .calibration import _calibrated, calibrate  # noqa: F401  (calibrate re-exported)
from .topk_geometry import (  # noqa: F401  (re-exported: the configuration's home)
    MAX_K,
    TopKConfig,
    _shrink_to_fit,
    default_config,
    validate,
)
from .trace import QueryTrace  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

__all__ = ["TopKConfig", "DeviceTopK", "QueryTrace", "topk", "validate", "render_topk",
           "inference_options", "default_config", "lookup_config", "prebuild", "Exclusion", "MAX_K"]

_EMPTY = np.iinfo(np.int32).max


class Exclusion(collections.namedtuple("Exclusion", "indptr indices rows candidates nnz")):
    """An exclusion CSR on the device (:meth:`DeviceTopK.upload_exclude`): row pointers (int64)
    and candidate positions (int32) as buffers, its rows, candidates (None: all) and entries. A
    query that is given one holds it to its end, whatever other threads upload meanwhile."""
    __slots__ = ()


@functools.lru_cache(maxsize=256)
def render_topk(cfg: TopKConfig, ldf, kp):
    """OpenCL C source of the top-k program for one configuration, padded width and list length."""
    from ..engine import kernels
    return kernels.render("topk.cl.j2", ldf=ldf, tk=cfg.tk, wx=cfg.wx, wy=cfg.wy, rm=cfg.rm,
                          rnv=cfg.rnv, v=cfg.v, kp=kp, cap=cfg.cap, qres=bool(cfg.qres),
                          yt=int(cfg.yt),
                          config_str=f"{cfg} ldf={ldf} kp={kp}")


def _program(ctx, device, cfg, ldf, kp):
    """Build (memoized per context) the top-k program and check the kernel's work-group limit."""
    from ..engine import kernels
    prog = kernels.build(ctx, render_topk(cfg, ldf, kp))
    lim = prog.work_group_limit("topk_scan", device)
    if cfg.wx * cfg.wy > lim:
        raise InvalidConfigError(f"topk_scan allows work-groups of at most {lim} here, the "
                                 f"configuration needs {cfg.wx * cfg.wy}", "kernel_work_group_size")
    return prog


def prebuild(device, f, k=10):
    """Build (memoized per context) the top-k program a :class:`DeviceTopK` of ``f`` factors
    on ``device`` runs for lists of ``k``, without uploading anything."""
    from ..engine.device import device_info, get_context, select_device
    device = select_device(device)
    info = device_info(device)
    cfg = lookup_config(info, f)[0]
    ctx, _queue = get_context(device)
    return _program(ctx, device, _shrink_to_fit(cfg, f, k, info), cfg.ldf(f), k)


# ----- tuned configurations ----------------------------------------------------------------------
def lookup_config(info, f):
    """``(config, host_threshold or None, origin)`` for a device: the newest ``topk`` record of
    the same device (nearest f) in the tuning databases, else the device type's default."""
    from ..tuning.lookup import record_sources
    from ..tuning.schema import device_record, same_device
    best = None
    dev = device_record(info)
    try:
        sources = record_sources()
    except Exception as e:                      # a database must never break inference
        log.warning("topk tuning lookup failed (%s); using the default", e)
        sources = []
    for origin, _path, recs in sources:
        for r in recs:
            if r.get("kind") != "topk" or not same_device(r.get("device") or {}, dev):
                continue
            try:
                cfg = TopKConfig.from_dict(r["config"])
                rf = int(r["f"])
            except (KeyError, TypeError, ValueError, InvalidConfigError):
                continue
            key = (abs(math.log(max(rf, 1) / max(f, 1))), _age(r.get("date")))
            if best is None or key < best[0]:
                best = (key, cfg, r.get("host_threshold"), origin)
    if best is None:
        return default_config(info), None, "default"
    thr = best[2]
    return best[1], (float(thr) if thr is not None else None), f"tuned ({best[3]})"


def _age(date):
    """Sort key: the newest record first (undated ones last)."""
    import datetime
    try:
        return -datetime.datetime.fromisoformat(date).timestamp()
    except (TypeError, ValueError):
        return math.inf


# ----- overrides ---------------------------------------------------------------------------------
_options = {"device": None, "min_work": None, "enabled": None}
_olock = threading.Lock()


@contextlib.contextmanager
def inference_options(device=None, min_work=None, enabled=None):
    """Temporarily choose the inference device, the host threshold (multiply-adds; 0 forces the
    device path) or disable the device path (``enabled=False``)."""
    with _olock:
        old = dict(_options)
        if device is not None:
            _options["device"] = device
        if min_work is not None:
            _options["min_work"] = float(min_work)
        if enabled is not None:
            _options["enabled"] = bool(enabled)
    try:
        yield
    finally:
        with _olock:
            _options.update(old)


def options():
    """The current overrides (``device``, ``min_work``, ``enabled``)."""
    with _olock:
        return dict(_options)


def device_path_enabled():
    """False when ``CLMF_INFERENCE=host`` or :func:`inference_options` disabled the device."""
    o = options()
    if o["enabled"] is not None:
        return o["enabled"]
    return os.environ.get("CLMF_INFERENCE", "").lower() != "host"


def known_threshold(device, f):
    """The host threshold for ``device`` at ``f`` factors without touching the device: the
    override, else a tuned record's, else None (then :meth:`DeviceTopK.host_threshold`
    measures it)."""
    o = options()
    if o["min_work"] is not None:
        return o["min_work"]
    from ..engine.device import device_info
    key = (device.int_ptr, int(f))
    hit = _known.get(key)
    if hit is None:
        hit = _known[key] = (lookup_config(device_info(device), f)[1],)
    return hit[0]


_known: dict = {}


# ----- the device object -------------------------------------------------------------------------
class DeviceTopK:
    """Item (or user) factors resident on one device, and exact top-k queries against them.

    Parameters
    ----------
    factors : (n, f) array — the vectors to rank (item factors; normalized ones for cosine)
    device : clmf device spec or ``pyopencl.Device``
    config : :class:`TopKConfig`, optional — default: the tuned one (``lookup_config``)
    memory_fraction : share of the device's memory a query may plan for
    handed : optional :class:`clmf.engine.factors.Handed` — a fit's device buffer holding
        ``factors``, kept as the ranked vectors instead of an upload where its layout is this
        ranker's (rows of ``ldf`` values, not the transposed layout)
    """

    def __init__(self, factors, device="auto", config=None, memory_fraction=0.5, handed=None):
        """Upload ``factors`` to ``device`` with the tuned (or given) configuration (or keep
        the ``handed`` buffer holding them)."""
        import pyopencl as cl

        from ..engine.device import device_info, get_context, select_device
        self.cl = cl
        self.device = select_device(device)
        self.info = device_info(self.device)
        self.ctx, self.queue = get_context(self.device)
        F = np.asarray(factors, np.float32)
        if F.ndim != 2:
            raise ValueError(f"factors must be 2-D, got shape {F.shape}")
        if not np.all(np.isfinite(F)):
            raise ValueError("factors contain NaN/inf")
        self.n, self.f = F.shape
        tuned, thr, origin = lookup_config(self.info, self.f)
        self.config = config or tuned
        self.config_origin = "given" if config is not None else origin
        self._tuned_threshold = thr
        self._threshold = None
        self.ldf = self.config.ldf(self.f)
        self.memory_fraction = float(memory_fraction)
        need = max(1, self.n) * self.ldf * 4
        if need > self.info.max_alloc:
            raise DeviceMemoryError(f"the factors need {need} B on the device, its largest "
                                    f"allocation is {self.info.max_alloc} B")
        self._F = F
        buf, self._handed_host = self._take(None if self.config.yt else handed, self.n)
        self.factors_buf, self.ldy = (buf, self.ldf) if buf is not None else \
            self._items_buffer(F)
        self._gathered = None              # (candidates, buffer, ldy) of the last gather (yt)
        self._queries = None               # resident query rows (recommend_all)
        self._queries_host = None          # host memory a handed query buffer wraps
        self.last_trace = None             # the QueryTrace of the last query
        self._excl = None                  # resident exclusion (set_exclude)
        self._free_slots = []              # result buffers of finished queries, for reuse
        self._lock = threading.RLock()   # host_threshold calibrates (queries) under it
        log.debug("DeviceTopK on %s: %d × %d (ldf %d), %s (%s)", self.info.name, self.n, self.f,
                  self.ldf, self.config, self.config_origin)

    # ----- buffers ------------------------------------------------------------------------------
    def _pad(self, M):
        """Rows of ``M`` zero-padded to ``ldf`` columns (one row at least)."""
        M = np.asarray(M, np.float32)
        out = np.zeros((max(1, M.shape[0]), self.ldf), np.float32)
        out[:M.shape[0], :M.shape[1]] = M
        return out

    def _take(self, handed, rows):
        """``(buffer, host memory it wraps)`` of ``rows`` rows in this ranker's layout from a
        fit's handed buffer (:meth:`clmf.engine.factors.Handed.take`: it, or a copy filled on
        the device; the host memory only when it is kept itself), or ``(None, None)``."""
        if handed is None:
            return None, None
        buf = handed.take(self.ctx, _upload_queue(self.ctx, self.device), self.ldf, rows)
        return buf, (handed.host if buf is not None and buf is handed.buffer else None)

    def _upload(self, a):
        """A read-only device copy of ``a`` (one element for an empty array), written by a
        blocking copy on the context's upload queue (on GPUs large arrays through pinned
        staging buffers, :class:`clmf.engine.upload.Uploader`): the GIL is released while it runs (a
        buffer created from the host pointer holds it for the whole copy, so the devices of a
        multi-device model could only be filled one at a time) and it does not wait behind
        the queries' kernels."""
        from ..engine import upload as U
        cl = self.cl
        a = np.ascontiguousarray(a)
        if a.size == 0:
            a = np.zeros(1, a.dtype)
        queue = _upload_queue(self.ctx, self.device)
        if not U.zero_copy(self.info):
            # (a GPU: large arrays through the kept page-locked staging buffers, the host's
            # copies into them split over threads, instead of one pageable copy)
            up = U.Uploader(self.ctx, queue, in_place=False)
            try:
                return up.buffer(a)
            finally:
                up.finish()
        buf = cl.Buffer(self.ctx, cl.mem_flags.READ_ONLY, size=a.nbytes)
        cl.enqueue_copy(queue, buf, a, is_blocking=True)
        return buf

    def _items_host(self, F):
        """The items as the device holds them: rows padded to ldf, or transposed (yt) with the
        item axis padded to a multiple of the tile; returns (host array, leading dimension)."""
        if not self.config.yt:
            return self._pad(F), self.ldf
        tn = self.config.tn
        ldy = max(1, -(-F.shape[0] // tn)) * tn
        if self.config.yt == 2:           # panels: (tiles, ldf, tn), each contiguous
            P = np.zeros((ldy, self.ldf), np.float32)
            P[:F.shape[0], :F.shape[1]] = F
            return np.ascontiguousarray(P.reshape(ldy // tn, tn, self.ldf).transpose(0, 2, 1)), tn
        Yt = np.zeros((self.ldf, ldy), np.float32)
        Yt[:F.shape[1], :F.shape[0]] = F.T
        return Yt, ldy

    def _items_buffer(self, F):
        """The items uploaded in the layout of :meth:`_items_host`: (buffer, leading dimension)."""
        host, ldy = self._items_host(F)
        return self._upload(host), ldy

    def _items_for(self, cand):
        """(buffer, ldy, candidate buffer or None) for a query over ``cand``: the transposed
        layout gathers the candidates on the host (cached for the last candidate list)."""
        if cand is None:
            return self.factors_buf, self.ldy, None
        if not self.config.yt:
            return self.factors_buf, self.ldy, self._upload(cand.astype(np.int32))
        g = self._gathered
        if g is None or not np.array_equal(g[0], cand):
            buf, ldy = self._items_buffer(self._F[cand])
            g = self._gathered = (cand.copy(), buf, ldy)
        return g[1], g[2], None

    def set_factors(self, factors):
        """Replace the ranked vectors with ``factors`` of the same shape, written into the
        buffer already on the device (a fit's validation: new factors every iteration)."""
        F = np.asarray(factors, np.float32)
        if F.shape != (self.n, self.f):
            raise ValueError(f"factors must keep the shape {(self.n, self.f)}, got {F.shape}")
        if not np.all(np.isfinite(F)):
            raise ValueError("factors contain NaN/inf")
        host, _ = self._items_host(F)
        if self.n:
            self.cl.enqueue_copy(self.queue, self.factors_buf, host, is_blocking=True)
        self._F = F
        self._gathered = None
        return self

    def set_queries(self, Q, handed=None):
        """Upload query vectors once (e.g. all user factors) for :meth:`query_rows` (or keep
        the ``handed`` buffer holding them, as the constructor's ``handed``)."""
        Q = np.asarray(Q, np.float32)
        if Q.ndim != 2 or Q.shape[1] != self.f:
            raise ValueError(f"queries must be (rows, {self.f}), got {Q.shape}")
        buf, self._queries_host = self._take(handed, Q.shape[0])
        self._queries = (buf if buf is not None else self._upload(self._pad(Q)), Q.shape[0])
        return self

    def set_exclude(self, exclude, candidates=None):
        """Upload an exclusion CSR once, aligned with the resident queries (row i excludes for
        query row i), for ``query_rows(..., exclude="resident")`` over ``candidates``."""
        cand = None if candidates is None else np.asarray(candidates, np.int64)
        excl = _to_positions(sp.csr_matrix(exclude), cand, self.n)
        return self.set_exclude_arrays(excl.indptr, excl.indices, cand)

    def set_exclude_arrays(self, indptr, indices, candidates=None):
        """As :meth:`upload_exclude`, kept as this object's resident exclusion (for
        ``exclude="resident"``)."""
        self._excl = None                  # the old one's memory goes first
        self._excl = self.upload_exclude(indptr, indices, candidates)
        return self

    def upload_exclude(self, indptr, indices, candidates=None):
        """Upload an exclusion already in the kernel's form: row pointers (any integer dtype,
        starting anywhere: they are rebased to 0) and the candidate positions of each row,
        sorted within the row (:func:`clmf.inference.resident.seen_positions`); the rows align
        with the resident queries as in :meth:`set_exclude`. Returns the :class:`Exclusion`,
        which :meth:`iter_query` takes as ``exclude``."""
        indptr = np.asarray(indptr)
        p0, p1 = int(indptr[0]), int(indptr[-1])
        nnz = p1 - p0
        need = 8 * indptr.size + 4 * nnz
        if need > self.info.max_alloc:
            raise DeviceMemoryError(f"the exclusion CSR needs {need} B, the device's largest "
                                    f"allocation is {self.info.max_alloc} B")
        ptr = indptr.astype(np.int64)
        if p0:
            ptr -= p0
        idx = np.asarray(indices)[p0:p1]
        if idx.dtype != np.int32:
            idx = idx.astype(np.int32)
        cand = None if candidates is None else np.asarray(candidates, np.int64)
        return Exclusion(self._upload(ptr), self._upload(idx), indptr.size - 1, cand, nnz)

    def resident_bytes(self):
        """Device bytes held between queries: the factors, resident queries and exclusion."""
        q = 0 if self._queries is None else max(1, self._queries[1]) * self.ldf * 4
        e = 0 if self._excl is None else 8 * (self._excl.rows + 1) + 4 * self._excl.nnz
        return max(1, self.n) * self.ldf * 4 + q + e

    # ----- planning -----------------------------------------------------------------------------
    def plan(self, nq, kp, splits, avg_excl=0.0, queries_on_device=False, in_flight=1):
        """Rows per launch so that the buffers of ``in_flight`` launches fit
        ``memory_fraction`` of the device (besides the factors, resident queries and
        exclusion)."""
        per_row = in_flight * (8 * kp * (splits + 1) + 8 + 4 * avg_excl * 1.25)
        if not queries_on_device:
            per_row += in_flight * 4 * self.ldf
        budget = self.memory_fraction * self.info.global_mem - self.resident_bytes()
        budget = min(budget, self.info.max_alloc)
        rows = int(budget // per_row)
        if rows < 1:
            raise DeviceMemoryError(f"a top-k launch needs {per_row:.0f} B per query beyond the "
                                    f"{self.resident_bytes()} B of factors (and resident "
                                    "queries and seen items); the device offers "
                                    f"{self.memory_fraction * self.info.global_mem:.0f} B")
        return max(1, min(nq, rows))

    def _wave_rows(self, cap, nq, cfg):
        """Queries per batch for a cap of about ``cap``: whole waves of the work-groups the
        device runs at once (:meth:`_splits`'s target × ``tm`` queries; the nearest count of
        waves, at least one), so no launch but the last leaves the device part empty. On an
        H100, 65,536 queries are 512 groups of the 528 it holds: 1M queries took 16 launches of
        a wave's time each, against 15 in whole waves (10.09 vs 9.86 s measured)."""
        wave = self._target_groups() * cfg.tm
        if cap >= nq or wave >= nq:
            return nq
        return max(wave, (cap + wave // 2) // wave * wave)

    def _target_groups(self):
        """Work-groups that fill the device once (4 per compute unit on GPUs, 2 on CPUs)."""
        return self.info.compute_units * (4 if self.info.type != "CPU" else 2)

    def _splits(self, nq, C, cfg):
        """(splits, candidates per split): enough work-groups to fill the device. The split
        factor is the target's ratio to the query groups rounded to the nearest whole number,
        not up: 489 groups against a target of 528 (62,500 queries of a batch on an H100) ran
        split in two, each query's candidates merged from two halves, 8 % slower than whole."""
        tiles = max(1, -(-C // cfg.tn))
        groups = max(1, -(-nq // cfg.tm))
        target = self._target_groups()
        s = min(tiles, max(1, (target + groups // 2) // groups))
        jper = -(-tiles // s) * cfg.tn
        return max(1, -(-C // jper)), jper

    # ----- queries ------------------------------------------------------------------------------
    def query(self, Q, N, candidates=None, exclude=None, show_progress=False):
        """Exact top-``N`` of ``Q · factors[candidates]ᵀ`` per row of ``Q``.

        Parameters
        ----------
        Q : (b, f) query vectors
        N : list length; ``k = min(N, len(candidates))``
        candidates : sorted unique indices into the factors, or None (all)
        exclude : CSR (b rows) whose stored column indices (factor indices) are left out

        Returns
        -------
        (ids, scores) : int64 ``(b, k)`` factor indices and float32 scores, best first, padded
        with -1 / -inf where fewer than k remain.
        """
        Q = np.asarray(Q, np.float32)
        if Q.ndim != 2 or Q.shape[1] != self.f:
            raise ValueError(f"queries must be (rows, {self.f}), got {Q.shape}")
        out = list(self.iter_query(Q, N, candidates, exclude, show_progress=show_progress))
        return _concat(out, Q.shape[0], self._k(N, candidates))

    def query_rows(self, r0, r1, N, candidates=None, exclude=None, show_progress=False):
        """As :meth:`query` for rows ``r0:r1`` of the queries uploaded by :meth:`set_queries`
        (``exclude`` has one row per query row ``r0:r1``)."""
        if self._queries is None:
            raise RuntimeError("no resident queries: call set_queries() first")
        out = list(self.iter_query(None, N, candidates, exclude, rows=(r0, r1),
                                   show_progress=show_progress))
        return _concat(out, r1 - r0, self._k(N, candidates))

    def _k(self, N, candidates):
        """The list length of a query: ``min(N, candidates)``."""
        C = self.n if candidates is None else len(candidates)
        return min(int(N), C)

    def iter_query(self, Q, N, candidates=None, exclude=None, rows=None, batch_rows=None,
                   show_progress=False, exclude_row0=None, trace=None, out=None, max_batch=None):
        """Yield ``(row0, ids, scores)`` batch by batch (the memory plan's batches, or
        ``batch_rows`` exactly, or at most about ``max_batch`` in whole device waves:
        :meth:`_wave_rows`); arguments as :meth:`query`, or ``rows=(r0, r1)`` of resident queries
        (``exclude="resident"``: the resident exclusion's row ``exclude_row0``, default
        ``r0``, belongs to query row ``r0``).

        Two batches are in flight: the next batch's kernels run while the host turns the
        previous one's lists (copied into page-locked host memory) into the results. Where the
        time went is recorded in ``trace`` (a :class:`~clmf.inference.trace.QueryTrace`;
        default a new one), also kept as ``self.last_trace``. With ``out`` (ids of an integer
        dtype and float32 scores, one row per query, ``min(N, candidates)`` columns) the lists
        are written there and the batches yielded are views of it (the caller's result,
        filled by this thread)."""
        cl = self.cl
        if rows is not None:
            r0, r1 = int(rows[0]), int(rows[1])
            if not 0 <= r0 <= r1 <= self._queries[1]:
                raise IndexError(f"rows {r0}:{r1} outside the {self._queries[1]} resident queries")
            nq = r1 - r0
        else:
            nq = Q.shape[0]
        cand = None
        if candidates is not None:
            cand = np.asarray(candidates, np.int64)
            if cand.size and (cand.min() < 0 or cand.max() >= self.n):
                raise IndexError(f"candidates outside 0..{self.n - 1}")
            if cand.size > 1 and np.any(np.diff(cand) <= 0):
                raise ValueError("candidates must be sorted and unique")
        C = self.n if cand is None else cand.size
        k = min(int(N), C)
        if k < 0:
            raise ValueError("N must be ≥ 0")
        excl = None
        resident = isinstance(exclude, str) and exclude == "resident"
        e0 = 0
        ex = None                          # the resident exclusion, held for the whole query
        if isinstance(exclude, Exclusion):
            resident, ex = True, exclude
        elif resident:
            ex = self._excl
        if resident:
            if rows is None or ex is None:
                raise ValueError('exclude="resident" needs set_exclude() and resident queries')
            rc = ex.candidates
            if (rc is None) != (cand is None) or (rc is not None and not np.array_equal(rc, cand)):
                raise ValueError("the resident exclusion was uploaded for other candidates")
            e0 = r0 if exclude_row0 is None else int(exclude_row0)
            if e0 < 0 or ex.rows < e0 + nq:
                raise ValueError(f"the resident exclusion has {ex.rows} rows, "
                                 f"the queries need {e0 + nq}")
        elif exclude is not None:
            excl = sp.csr_matrix(exclude)
            if excl.shape[0] != nq:
                raise ValueError(f"exclude has {excl.shape[0]} rows for {nq} queries")
            excl = _to_positions(excl, cand, self.n)
        if out is not None and (out[0].shape != (nq, k) or out[1].shape != (nq, k)):
            raise ValueError(f"out must hold ({nq}, {k}) ids and scores, not "
                             f"{out[0].shape} and {out[1].shape}")
        if k == 0 or nq == 0:
            if out is not None:
                yield 0, out[0], out[1]
                return
            yield 0, np.full((nq, k), -1, np.int64), np.full((nq, k), -np.inf, np.float32)
            return
        if k > MAX_K:
            raise InvalidConfigError(f"N = {k} is more than the device top-k keeps ({MAX_K})",
                                     "geometry")
        cfg = _shrink_to_fit(self.config, self.f, k, self.info)
        prog = _program(self.ctx, self.device, cfg, self.ldf, k)
        scan, merge = prog.kernels["topk_scan"], prog.kernels["topk_merge"]
        cap = (self._wave_rows(max_batch, nq, cfg)
               if not batch_rows and max_batch is not None else None)
        S, jper = self._splits(min(nq, batch_rows or cap or nq), C, cfg)
        avg = excl.nnz / max(1, nq) if excl is not None else 0.0
        B = batch_rows or self.plan(nq, k, S, 0.0 if resident else avg,
                                    queries_on_device=rows is not None, in_flight=2)
        if cap is not None:          # the default's whole waves, within the memory plan
            B = min(B, cap)
        B = max(1, min(B, nq))
        if B < nq:          # whole work-groups per batch
            B = max(cfg.tm, B // cfg.tm * cfg.tm)
        self.kernel_seconds = 0.0          # device time of this query's kernels (profiled)
        tr = self.last_trace = QueryTrace() if trace is None else trace
        ybuf, ldy, cand_buf = self._items_for(cand)
        nslots = 1 if B >= nq else 2
        slots = [self._slot(B, S, k) for _ in range(nslots)]
        bar = None
        if show_progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=nq, desc="top-k", unit="query")
        pending = []                       # the batches in flight (see launch)

        def launch(b0, slot):
            """Enqueue batch ``b0``'s kernels and the copies of its lists into ``slot``."""
            t_launch = time.perf_counter()
            b1 = min(nq, b0 + B)
            nb = b1 - b0
            keep = []                      # per-batch uploads live until the batch is done
            if rows is not None:
                qbuf, qrow0 = self._queries[0], r0 + b0
            else:
                qbuf, qrow0 = self._upload(self._pad(Q[b0:b1])), 0
                keep.append(qbuf)
            if resident:
                ex_ptr, ex_idx = ex.indptr, ex.indices
                has_excl, erow0 = 1, e0 + b0
            elif excl is not None:
                sub = excl[b0:b1]
                ex_ptr = self._upload(sub.indptr.astype(np.int64))
                ex_idx = self._upload(sub.indices.astype(np.int32))
                keep += [ex_ptr, ex_idx]
                has_excl, erow0 = 1, 0
            else:
                ex_ptr = ex_idx = None
                has_excl, erow0 = 0, 0
            groups = -(-nb // cfg.tm)
            events = [scan(self.queue, (cfg.wx * S, cfg.wy * groups), (cfg.wx, cfg.wy), qbuf,
                           np.int32(qrow0), np.int32(nb), ybuf, cand_buf,
                           np.int32(cand_buf is not None), np.int32(C), ex_ptr, ex_idx,
                           np.int32(has_excl), np.int32(erow0), np.int32(jper), np.int32(S),
                           np.int64(ldy), slot["part_s"], slot["part_i"])]
            enqueued = time.perf_counter()
            if S > 1:
                events.append(merge(
                    self.queue, (-(-nb // 64) * 64,), (64,), slot["part_s"], slot["part_i"],
                    np.int32(nb), np.int32(S), slot["fin_s"], slot["fin_i"]))
                src_s, src_i = slot["fin_s"], slot["fin_i"]
            else:
                src_s, src_i = slot["part_s"], slot["part_i"]
            hs, hi = slot["host_s"][:nb * k], slot["host_i"][:nb * k]
            # both copies' events are kept until the batch is finished: pyopencl waits for a
            # dropped (in-flight) copy's event without releasing the GIL, which held this
            # thread, and every other device's thread, for the whole batch
            copies = [cl.enqueue_copy(self.queue, hs, src_s, is_blocking=False)]
            done = cl.enqueue_copy(self.queue, hi, src_i, is_blocking=False)
            copies.append(done)
            pending.append((b0, nb, slot, events, done, keep, copies, enqueued))
            tr.enqueue_s += time.perf_counter() - t_launch

        def finish():
            """Wait for the oldest batch in flight and turn its lists into results."""
            b0, nb, slot, events, done, _keep, copies, enqueued = pending.pop(0)
            t_wait = time.perf_counter()
            done.wait()
            t_done = time.perf_counter()
            tr.wait_s += t_done - t_wait
            self.kernel_seconds += sum((e.profile.end - e.profile.start) * 1e-9
                                       for e in events)
            tr.batch(nb, enqueued, events, copies)
            ix = slot["host_i"][:nb * k].reshape(nb, k)
            sc = slot["host_s"][:nb * k].reshape(nb, k)
            got = _finish(ix, sc, cand, None if out is None
                          else (out[0][b0:b0 + nb], out[1][b0:b0 + nb]))
            tr.finish_s += time.perf_counter() - t_done
            return b0, nb, slot, got

        try:
            starts = list(range(0, nq, B))
            for i, b0 in enumerate(starts):
                launch(b0, slots[i % nslots])
                if len(pending) == nslots:
                    bb0, nb, _slot, (ids, sc) = finish()
                    yield bb0, ids, sc
                    if bar is not None:
                        bar.update(nb)
            while pending:
                bb0, nb, _slot, (ids, sc) = finish()
                yield bb0, ids, sc
                if bar is not None:
                    bar.update(nb)
        except BaseException:
            drain(self.queue)       # Ctrl-C: the batch's kernels end before its buffers go
            raise
        finally:
            if pending:             # the consumer stopped early: the copies end before reuse
                drain(self.queue)
                pending.clear()
            with self._lock:
                self._free_slots.extend(slots)
            tr.close()
            if bar is not None:
                bar.close()

    def _slot(self, B, S, k):
        """Device lists for ``B`` queries in ``S`` splits of ``k`` and page-locked host arrays
        for the final lists (reused across queries: allocating pinned memory is slow)."""
        cl = self.cl
        mf = cl.mem_flags
        free = self._free_slots
        with self._lock:
            for i, s in enumerate(free):
                if (s["B"] >= B and s["S"] >= S and s["k"] == k
                        and s["B"] * s["S"] <= 4 * B * S):
                    return free.pop(i)
            while len(free) > 4:           # keep a few; the oldest go
                free.pop(0)
        slot = {"B": B, "S": S, "k": k,
                "part_s": cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * B * S * k),
                "part_i": cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * B * S * k)}
        if S > 1:
            slot["fin_s"] = cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * B * k)
            slot["fin_i"] = cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * B * k)
        slot["host_s"], slot["_ms"] = self._pinned(B * k, np.float32)
        slot["host_i"], slot["_mi"] = self._pinned(B * k, np.int32)
        return slot

    def _pinned(self, count, dtype):
        """``(array, buffer)``: a page-locked host array of ``count`` items (a mapped
        ``ALLOC_HOST_PTR`` buffer; device copies into it run at the bus's speed), or a plain
        NumPy array where the runtime refuses the mapping."""
        cl = self.cl
        try:
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR,
                            size=max(1, count) * np.dtype(dtype).itemsize)
            arr, _ev = cl.enqueue_map_buffer(self.queue, buf,
                                             cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                             (max(1, count),), dtype, is_blocking=True)
            return arr, buf
        except cl.Error as e:              # no pinned memory here: pageable is correct too
            log.debug("no page-locked result buffer (%s)", e)
            return np.empty(max(1, count), dtype), None

    # ----- host threshold -----------------------------------------------------------------------
    def host_threshold(self):
        """Multiply-adds (queries × candidates × f) below which the host path is faster:
        the override, the tuned record's, else measured once here (see :func:`calibrate`)."""
        o = options()
        if o["min_work"] is not None:
            return o["min_work"]
        if self._tuned_threshold is not None:
            return self._tuned_threshold
        if self._threshold is None:
            with self._lock:
                if self._threshold is None:
                    self._threshold = _calibrated(self)
        return self._threshold


_upload_queues: dict = {}
_uq_lock = threading.Lock()


def _upload_queue(ctx, device):
    """A second command queue of the context (memoized), for :meth:`DeviceTopK._upload`."""
    key = ctx.int_ptr
    with _uq_lock:
        q = _upload_queues.get(key)
        if q is None:
            import pyopencl as cl
            q = _upload_queues[key] = cl.CommandQueue(ctx, device)
        return q


def _to_positions(excl, cand, n):
    """The exclusion CSR with columns as candidate positions (others dropped), rows sorted."""
    excl = excl.copy()
    excl.sum_duplicates()          # canonical: sorted indices per row, no duplicates
    if excl.nnz and excl.indices.max() >= n and cand is None:
        excl = excl[:, :n]
    if cand is None:
        return excl
    posmap = np.full(max(n, excl.shape[1]), -1, np.int64)
    posmap[cand] = np.arange(cand.size)
    cols = posmap[excl.indices]
    keep = cols >= 0
    rows = np.repeat(np.arange(excl.shape[0]), np.diff(excl.indptr))[keep]
    out = sp.csr_matrix((np.ones(int(keep.sum()), np.int8), (rows, cols[keep])),
                        shape=(excl.shape[0], max(1, cand.size)))
    out.sum_duplicates()
    return out


def _finish(ix, sc, cand, out=None):
    """Device lists → (ids, float32 scores) with -1 / -inf for empty slots: new int64 ids and
    scores, or written into ``out`` (ids of an integer dtype, scores; the lists' shape)."""
    ids, s = (np.empty(ix.shape, np.int64), np.empty(sc.shape, np.float32)) if out is None \
        else out
    empty = ix == _EMPTY
    some = bool(empty.any())
    if cand is None:
        ids[...] = ix
    else:
        ids[...] = cand[np.where(empty, 0, ix) if some else ix]
    s[...] = sc
    if some:
        ids[empty] = -1
        s[empty] = -np.inf
    return ids, s


def _concat(parts, nq, k):
    """Stack the batches of :meth:`DeviceTopK.iter_query` into ``(ids, scores)``."""
    if not parts:
        return np.full((nq, k), -1, np.int64), np.full((nq, k), -np.inf, np.float32)
    if len(parts) == 1:
        return parts[0][1], parts[0][2]
    return np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])


def topk(factors, queries, N, candidates=None, exclude=None, device="auto", config=None):
    """One-shot :meth:`DeviceTopK.query` (uploads ``factors``; keep a :class:`DeviceTopK` to
    query the same factors again)."""
    return DeviceTopK(factors, device, config).query(queries, N, candidates, exclude)
