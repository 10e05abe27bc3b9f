"""Device buffers and the S1 → S2 → S3 orchestration over batches of rows.

An :class:`Engine` owns, for one fit, the CSR of both sides (the users' CSR and the items' CSR,
i.e. the CSC of the ratings), the factor matrices X and Y, and per-side scratch for a batch of
hermitians (O(batch · f²), never O(m · f²)). Factors stay on the device across iterations.

Long rows (a Netflix item has up to 233K ratings, 5.7K on average) are cut into pieces summed by
separate S1 work-groups, so that no work-group runs alone at the end of a launch: see
:func:`split_rows` and :func:`launch_split_batch`; the threshold is the configuration's ``split``
(:func:`clmf.engine.memory.plan_split`).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time

import numpy as np
import scipy.sparse as sp

from ..data.scan import count_columns
from ..errors import InvalidConfigError, SingularSystemError
from ..interrupts import deferred_interrupts, drain
from ..tuning.spec import row_width, unknowns
from . import kernels as K
from . import upload as U
from .device import device_info, get_context
from .memory import choose_batch_rows, plan_fit, plan_split, split_pays
from .transpose import device_transpose

log = logging.getLogger(__name__)

__all__ = ["Engine", "SideData", "choose_batch_rows", "plan_fit", "split_rows",
           "launch_split_batch"]

_INT32_MAX = (1 << 31) - 1


@dataclasses.dataclass
class SideData:
    """CSR of one side (rows to solve) with the other side's factors as columns; ``indices`` and
    ``data`` are None where they exist only on the device (the items' side, transposed there)."""
    indptr: np.ndarray   # int64
    indices: np.ndarray  # int32 or None
    data: np.ndarray     # float32 or None

    @classmethod
    def from_csr(cls, R):
        """The side of a CSR (no copy of arrays already int32 indices / float32 data)."""
        R = sp.csr_matrix(R)
        return cls(R.indptr.astype(np.int64, copy=False), R.indices.astype(np.int32, copy=False),
                   R.data.astype(np.float32, copy=False))

    @property
    def rows(self):
        """Rows of this side."""
        return len(self.indptr) - 1

    @property
    def nnz(self):
        """Entries of this side."""
        return int(self.indptr[-1])

    def nbytes(self):
        """Bytes of the side on the device (int32 indices and float32 values per entry)."""
        if self.indices is None:
            return self.indptr.nbytes + 8 * self.nnz
        return self.indptr.nbytes + self.indices.nbytes + self.data.nbytes


# CPU devices with at most this many ratings transpose on the host (scipy's counting sort): there
# the device transpose runs on the same cores, and the first fit after an install also compiles
# its program (2-core development machine, shared: 1M ratings 5–8 ms on the host against 8 ms
# for the device transpose warm and 0.2–1.0 s with its compile; at 4M a wash warm, 35–50 ms;
# at 10M the host 95–105 ms against 140–155: results/bench/transpose-cpu/)
HOST_TRANSPOSE_MAX_NNZ = 1 << 22
# CPU runtimes: the factor buffers wrap adopted start factors in place (Engine.set_factors);
# False copies them into the engine's own buffers as before (for comparisons)
ADOPT_FACTORS = True


def host_transpose(info, nnz):
    """Whether the items' CSR is built on the host: the Oclgrind simulator (it flags the device
    transpose's output as uninitialised) and CPU devices up to ``HOST_TRANSPOSE_MAX_NNZ``."""
    if "oclgrind" in info.platform.lower():
        return True
    return info.type == "CPU" and nnz <= HOST_TRANSPOSE_MAX_NNZ


def padded_factors(side, M, rows, f, ldf, np_store, biased, biases=None):
    """A side's factors (``rows`` × f) as the devices' padded host rows ``(max(1, rows), ldf)``:
    with biases, column f holds the 1 and column f + 1 the bias."""
    M = np.asarray(M, dtype=np.float32)
    if M.shape != (rows, f):
        raise ValueError(f"{side} factors must have shape {(rows, f)}, not {M.shape}")
    host = np.zeros((max(1, rows), ldf), dtype=np_store)
    host[:rows, :f] = M
    if biased:
        host[:, f] = 1.0
        if biases is not None:
            host[:rows, f + 1] = biases
    return host


def host_factor_rows(rows, f, ldf, biased=False):
    """float32 host rows ``(max(1, rows), ldf)`` in the devices' padded layout, as
    :func:`padded_factors` writes them (the padding zero; with biases column f one, the biases
    zero), starting at a page boundary in NumPy's memory, the factors themselves uninitialised;
    returns their ``[:rows, :f]`` view, to be filled (the start factors of a fit) and handed to
    :meth:`Engine.set_factors` with ``adopt``, whose CPU runtimes then wrap the rows in place."""
    host = U.aligned_empty((max(1, rows), ldf), np.float32, small_pages=False)
    host[:, f:] = 0
    host[rows:] = 0
    if biased:
        host[:, f] = 1.0
    return host[:rows, :f]


def _padded_base(M, rows, f, ldf):
    """The padded rows ``(max(1, rows), ldf)`` that ``M`` is the ``[:rows, :f]`` view of
    (:func:`host_factor_rows`; the padding is trusted to be as that wrote it), or None."""
    base, n = M.base, max(1, rows) * ldf
    if (not isinstance(base, np.ndarray) or M.dtype != np.float32 or M.shape != (rows, f)
            or M.strides != (4 * ldf, 4) or not base.flags.c_contiguous):
        return None
    off = M.ctypes.data - base.ctypes.data
    if off < 0 or off + 4 * n > base.nbytes:
        return None
    return np.ndarray((max(1, rows), ldf), np.float32, buffer=base, offset=off)


def unpadded_factors(host, rows, f, biased, with_biases=False):
    """The factors (float32, ``rows`` × f) of padded host rows, and with ``with_biases`` the
    biases too (column f + 1 where ``biased``, else zeros)."""
    X = np.ascontiguousarray(host[:rows, :f], dtype=np.float32)
    if with_biases:
        b = (host[:rows, f + 1].astype(np.float32) if biased
             else np.zeros(rows, np.float32))
        return X, b
    return X


def launch_gram(kern, q, cfg, fs, k, g_indptr, g_indices, g_data, Yother, A, B, G):
    """Enqueue G = Σ y yᵀ over the other side's rows (``k`` virtual rows of partial Grams summed
    by ``sum_partials``; implicit feedback)."""
    s1_local = cfg.s1_local_size(fs)
    kern["s1_hermitian"](q, (cfg.s1_groups(fs, k) * s1_local,), (s1_local,), g_indptr, g_indices,
                         Yother, A, np.int32(0), np.int32(k), np.float32(0.0), np.int32(0), g_data,
                         np.float32(1.0), G, np.int32(0), B, np.int32(0), np.float32(0.0))
    return kern["sum_partials"](q, (-(-fs * fs // 64) * 64,), (64,), A, np.int32(k), G)


def launch_batch(kern, q, cfg, v, fs, indptr, indices, data, Yother, A, B, G, Xout, status, row0,
                 n, xoff, regularization, weighted, implicit, alpha, offset, wait_for=None,
                 solve=True, gram=None):
    """Enqueue S1 → S2 → S3 for rows ``row0 .. row0 + n - 1`` of ``indptr`` (entry offsets
    relative to ``indices``/``data``), writing factor rows ``xoff + row0 ..`` of ``Xout``;
    returns the (S1, S2, S3) events (None for a stage the variant fuses or skips).

    ``solve=False`` stops after S2 (partial normal equations in ``A``/``B``: pass
    ``regularization=0`` and ``gram=False``); ``gram`` (default: ``implicit``) adds ``G``."""
    s1_local = cfg.s1_local_size(fs)
    groups = cfg.s1_groups(fs, n)
    fused = cfg.solver == "fusedcg"
    add_gram = implicit if gram is None else gram
    if fused and not solve:
        raise ValueError("the fused CG solver builds no normal equations to reduce")
    if cfg.fused_solve and solve:
        # S1 and the CG in one kernel (mma): the systems stay in local memory
        e1 = kern["s1s3_mma"](
            q, (groups * s1_local,), (s1_local,), indptr, indices, Yother, A, np.int32(row0),
            np.int32(n), np.float32(regularization), np.int32(1 if weighted else 0), data,
            np.float32(alpha), G, np.int32(1 if add_gram else 0), B, np.int32(1),
            np.float32(offset), Xout, status, np.int32(xoff), wait_for=wait_for)
        return e1, None, None
    e1 = None if fused else kern["s1_hermitian"](
        q, (groups * s1_local,), (s1_local,), indptr, indices, Yother, A, np.int32(row0),
        np.int32(n), np.float32(regularization), np.int32(1 if weighted else 0), data,
        np.float32(alpha), G, np.int32(1 if add_gram else 0), B,
        np.int32(1 if cfg.fuses_rhs else 0), np.float32(offset), wait_for=wait_for)
    if e1 is not None:
        wait_for = None           # the queue is in order: only the first kernel waits
    # S2 (right-hand sides), unless the S1 variant computed them from its staged panels
    e2 = None if cfg.fuses_rhs else kern["s2_rhs"](
        q, (n * v["s2_wg"],), (v["s2_wg"],), indptr, indices, data, Yother, B, np.int32(row0),
        np.int32(n), np.float32(alpha), np.float32(offset), wait_for=wait_for)
    if not solve:
        return e1, e2, None
    if cfg.dims:
        # the fused CG's dimensions form: b formed in its first pass (no S2 above)
        swg = cfg.swg(fs)
        e3 = kern["s3_fcg"](q, (n * swg,), (swg,), indptr, indices, data, Yother, G,
                            np.int32(1 if add_gram else 0), Xout, status, np.int32(row0),
                            np.int32(n), np.float32(regularization),
                            np.int32(1 if weighted else 0), np.float32(alpha),
                            np.float32(offset), np.int32(xoff), wait_for=wait_for)
        return e1, e2, e3
    if fused:
        e3 = kern["s3_fused"](q, (n * cfg.swg(fs),), (cfg.swg(fs),), indptr, indices, data, Yother,
                              G, np.int32(1 if add_gram else 0), B, Xout, status, np.int32(row0),
                              np.int32(n), np.float32(regularization),
                              np.int32(1 if weighted else 0), np.float32(alpha), np.int32(xoff),
                              wait_for=wait_for if e2 is None else None)
        return e1, e2, e3
    e3 = launch_solve(kern, q, cfg, fs, indptr, A, B, Xout, status, row0, n, xoff,
                      regularization, weighted)
    return e1, e2, e3


def split_rows(indptr, threshold, batch_rows, virtual_rows, slots=0):
    """The pieces of a side's rows and its launches, built once on the host.

    Row r of ``indptr`` (int64 CSR row pointers) is cut into ⌈count / threshold⌉ consecutive
    pieces of ``threshold`` entries (the last holds the rest; an empty row is one empty piece):
    ``vindptr`` holds the pieces' row pointers (the same entry offsets: S1 and S2 run on it
    unchanged) and ``vstart[r]`` the first piece of row r (``vstart[rows]`` = pieces). Launches
    are consecutive real rows, at most ``batch_rows`` of them and at most ``virtual_rows``
    pieces; each is ``(row0, n, v0, nv)``: ``nv`` its pieces from ``v0``, 0 when none of its
    rows is cut or when cutting does not pay on ``slots`` work-group slots
    (:func:`clmf.engine.memory.split_pays`; 0: it always does) — it then runs the unsplit
    path."""
    indptr = np.asarray(indptr, np.int64)
    rows = len(indptr) - 1
    t = int(threshold)
    if t < 1:
        raise ValueError(f"split threshold must be ≥ 1, not {t}")
    counts = np.diff(indptr)
    pieces = np.maximum(1, -(-counts // t))
    most = int(pieces.max()) if rows else 0
    if most > virtual_rows:
        raise ValueError(f"a row of {most} pieces does not fit a scratch of {virtual_rows} pieces")
    vstart = np.zeros(rows + 1, np.int64)
    np.cumsum(pieces, out=vstart[1:])
    total = int(vstart[-1])
    if total > _INT32_MAX - 1:
        # the kernels take a launch's first row as a 32-bit int
        raise ValueError(f"splitting rows at {t} entries makes {total} pieces, beyond the "
                         f"kernels' 32-bit row numbers: use a larger split")
    owner = np.repeat(np.arange(rows, dtype=np.int64), pieces)
    vindptr = np.empty(total + 1, np.int64)
    vindptr[:-1] = indptr[:-1][owner] + (np.arange(total, dtype=np.int64) - vstart[:-1][owner]) * t
    vindptr[-1] = indptr[-1]
    del owner
    launches = []
    r = 0
    while r < rows:
        # the most rows from r whose pieces fit the scratch (row r's always do)
        fit = int(np.searchsorted(vstart, vstart[r] + virtual_rows, side="right")) - 1
        r1 = max(r + 1, min(r + int(batch_rows), fit, rows))
        nv = int(vstart[r1] - vstart[r])
        cut = nv > r1 - r and split_pays(counts[r:r1].max(), indptr[r1] - indptr[r], r1 - r,
                                         slots)
        launches.append((r, r1 - r, int(vstart[r]), nv if cut else 0))
        r = r1
    return vindptr, vstart, launches


def launch_split_batch(kern, q, cfg, v, fs, indptr, vindptr, vstart, indices, data, Yother, A,
                       B, Av, Bp, G, Xout, status, row0, n, v0, nv, xoff, regularization,
                       weighted, implicit, alpha, offset, wait_for=None):
    """Enqueue S1 (and S2 unless S1 fuses it) over the pieces ``v0 .. v0 + nv - 1`` of
    ``vindptr`` into ``Av``/``Bp`` (unregularised, no Gram), the combine of each real row's
    pieces into ``A``/``B`` (diagonal and Gram added as S1 adds them to an unsplit row), then S3
    on the real rows ``row0 .. row0 + n - 1``; returns the (S1, S2, combine, S3) events (S2
    None when fused). Not for the fused CG solver or ``fused_solve``, which build no
    hermitians."""
    if cfg.solver == "fusedcg" or cfg.fused_solve:
        raise ValueError("the fused CG solvers build no hermitians to split")
    if not (0 <= v0 and v0 + nv <= _INT32_MAX and row0 + n <= _INT32_MAX):
        raise ValueError(f"pieces {v0} .. {v0 + nv} pass the kernels' 32-bit row numbers")
    s1_local = cfg.s1_local_size(fs)
    e1 = kern["s1_hermitian"](
        q, (cfg.s1_groups(fs, nv) * s1_local,), (s1_local,), vindptr, indices, Yother, Av,
        np.int32(v0), np.int32(nv), np.float32(0.0), np.int32(0), data, np.float32(alpha), G,
        np.int32(0), Bp, np.int32(1 if cfg.fuses_rhs else 0), np.float32(offset),
        wait_for=wait_for)
    e2 = None if cfg.fuses_rhs else kern["s2_rhs"](
        q, (nv * v["s2_wg"],), (v["s2_wg"],), vindptr, indices, data, Yother, Bp, np.int32(v0),
        np.int32(nv), np.float32(alpha), np.float32(offset))
    wg = v["comb_wg"]
    ec = kern["s1_combine"](q, (n * wg,), (wg,), indptr, vstart, Av, Bp, A, B, np.int32(row0),
                            np.int32(n), np.float32(regularization),
                            np.int32(1 if weighted else 0), G, np.int32(1 if implicit else 0))
    e3 = launch_solve(kern, q, cfg, fs, indptr, A, B, Xout, status, row0, n, xoff,
                      regularization, weighted)
    return e1, e2, ec, e3


def launch_solve(kern, q, cfg, fs, indptr, A, B, Xout, status, row0, n, xoff, regularization,
                 weighted, wait_for=None):
    """Enqueue S3 alone (Cholesky or CG) on the systems in ``A``/``B``; ``indptr`` gives the
    rows' counts (an empty row gets zero factors)."""
    return kern["s3_solve"](q, (n * cfg.swg(fs),), (cfg.swg(fs),), indptr, A, B, Xout, status,
                            np.int32(row0), np.int32(n), np.float32(regularization),
                            np.int32(1 if weighted else 0), np.int32(xoff), wait_for=wait_for)


class Engine:
    """All device state of one fit and the half-step orchestration.

    Parameters
    ----------
    device : pyopencl.Device
    R : scipy.sparse.csr_matrix (users × items), canonical (sorted, no duplicates)
    f : factors
    configs : (users_config, items_config) KernelConfig pair
    item_counts : optional ratings per item (``np.bincount(R.indices)``, when already known)
    """

    def __init__(self, device, R, f, configs, profile=False, implicit_alpha=None, biased=False,
                 offset=0.0, item_counts=None):
        import pyopencl as cl
        self.cl = cl
        self.device = device
        self.info = device_info(device)
        self.ctx, self.queue = get_context(device)
        self._released = False                       # see __del__
        self.f = f                                   # latent factors
        self.implicit = implicit_alpha is not None
        self.alpha = float(implicit_alpha or 0.0)
        self.biased = bool(biased)
        if self.implicit and self.biased:
            raise ValueError("biases are for explicit feedback")
        self.offset = float(offset)                  # global mean with biases
        self.fs = unknowns(f, self.biased)           # unknowns per system
        self.configs = {"users": configs[0], "items": configs[1]}
        width = row_width(f, self.biased)            # [factors | 1 | bias] with biases
        if configs[0].storage != configs[1].storage or configs[0].ldf(width) != configs[1].ldf(width):
            # the two sides share factor buffers: same storage and leading dimension
            raise ValueError("both sides must use the same storage dtype and vector padding")
        self.ldf = configs[0].ldf(width)
        self.storage = configs[0].storage
        self.np_store = np.float16 if self.storage == "float16" else np.float32
        self.shape = R.shape
        m, n = R.shape
        rows = {"users": m, "items": n}
        if item_counts is None:
            item_counts = count_columns(R.indices, R.shape[1])
        longest = {"users": int(np.diff(R.indptr).max()) if m else 0,
                   "items": int(item_counts.max()) if n else 0}
        # long rows cut into pieces (per side: threshold, rows per launch, pieces' scratch)
        self.splits = {s: plan_split(self.configs[s], self.fs, rows[s], R.nnz, longest[s],
                                     self.info) for s in ("users", "items")}
        self.batch_rows = {s: self.splits[s].batch_rows for s in ("users", "items")}
        # every device buffer planned from the shapes, and checked, before any is created (and
        # before the users' CSR is prepared on the host and transposed on the device)
        plan = plan_fit(m, n, R.nnz, f, (configs[0], configs[1]), self.info,
                        implicit=self.implicit, biased=self.biased, batch_rows=self.batch_rows,
                        splits=self.splits)
        plan.check_device(self.info)
        self.memory = plan.device_dict()
        est = self.memory
        t_host = time.perf_counter()
        users = SideData.from_csr(R)
        col_ptr = np.zeros(R.shape[1] + 1, np.int64)
        np.cumsum(item_counts, out=col_ptr[1:])
        # the items' CSR (the ratings' CSC) is built on the device from the users' (below)
        self.side = {"users": users, "items": SideData(col_ptr, None, None)}
        fs = self.fs
        t0 = time.perf_counter()
        # the programs are built (or loaded from the cache) in a thread while the ratings are
        # uploaded and transposed (the OpenCL compilers release the GIL)
        pool = concurrent.futures.ThreadPoolExecutor(1)
        builds = pool.submit(self._build_programs)
        pool.shutdown(wait=False)
        self.buf = {s: {} for s in ("users", "items")}
        # where each side's first entry lies in its indices/values buffers (see _upload_side)
        self.entry_offset = {"users": 0, "items": 0}
        try:
            times = self._upload_ratings()
            t1 = time.perf_counter()
            self.programs, build_s = builds.result()
        except BaseException:
            with deferred_interrupts():      # Ctrl-C here too: the copies and the transpose end
                builds.cancel()
                concurrent.futures.wait([builds])
                self._release_buffers()
            raise
        t2 = time.perf_counter()
        self.vars = {s: K.als_variables(self.configs[s], fs, self.info, self.implicit, self.biased)
                     for s in ("users", "items")}
        mf = cl.mem_flags
        # seconds of the engine's set-up: the host's CSR arrays and column pointers, building
        # (or loading) the programs (in a thread; ``build_wait``: what the set-up waited for them
        # after the uploads), uploading the users' CSR and transposing it on the device
        self.setup_times = {"engine_host": t0 - t_host, "build": build_s,
                            "build_wait": t2 - t1, **times,
                            "upload_transpose": times["upload"] + times["transpose"]}
        t3 = time.perf_counter()
        for s in ("users", "items"):
            self.buf[s].update(
                A=cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * fs * self.batch_rows[s]),
                B=cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * self.batch_rows[s]))
            if self.implicit:
                # the other side's rows as K virtual rows: S1 with unit weights gives K partial
                # Gram matrices, summed into G = (other)ᵀ(other) once per half-step
                n_other = self.side["items" if s == "users" else "users"].rows
                k = int(max(1, min(64, self.batch_rows[s], n_other)))
                gptr = np.linspace(0, n_other, k + 1).astype(np.int64)
                self.buf[s].update(
                    gram_k=k,
                    g_indptr=cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=gptr),
                    g_indices=cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                                        hostbuf=np.arange(n_other, dtype=np.int32)),
                    g_data=cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                                     hostbuf=np.ones(n_other, np.float32)))
            self.buf[s]["G"] = cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * fs)
        self.launches = {}
        for s in ("users", "items"):
            self.launches[s] = self._plan_launches(s)
        itemsize = np.dtype(self.np_store).itemsize
        self.factors = {s: cl.Buffer(self.ctx, mf.READ_WRITE,
                                     size=max(1, self.side[s].rows) * self.ldf * itemsize)
                        for s in ("users", "items")}
        self._factor_hosts = {}                      # host arrays the factor buffers wrap
        self.status = cl.Buffer(self.ctx, mf.READ_WRITE, size=4)
        self.profile = profile
        self.stage_times = {"s1": 0.0, "s2": 0.0, "s3": 0.0, "combine": 0.0}
        self._events = []
        self._metrics_prog = None
        self._metric_bufs = {}
        self.setup_times["buffers"] = time.perf_counter() - t3
        log.debug("engine on %s: batch rows %s, memory %s", self.info.name, self.batch_rows, est)

    def _plan_launches(self, side):
        """The launches of a side's half-step, ``(row0, n, v0, nv)`` (``nv`` > 0: split), with
        the pieces' row pointers and scratch on the device when the side is split."""
        sp_, d, bs = self.splits[side], self.side[side], self.batch_rows[side]
        if not sp_.active:
            return [(r0, min(bs, d.rows - r0), 0, 0) for r0 in range(0, d.rows, bs)]
        cl, mf, fs = self.cl, self.cl.mem_flags, self.fs
        vindptr, vstart, launches = split_rows(d.indptr, sp_.threshold, bs, sp_.virtual_rows,
                                               sp_.slots)
        vindptr += self.entry_offset[side]      # entry offsets into the side's buffers
        cut = int(np.count_nonzero(np.diff(d.indptr) > sp_.threshold))
        log.debug("%s: %d row(s) over %d entries cut into %d pieces in all; %d of %d launches "
                  "split", side, cut, sp_.threshold, len(vindptr) - 1,
                  sum(1 for x in launches if x[3]), len(launches))
        self.buf[side].update(
            vindptr=cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=vindptr),
            vstart=cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=vstart),
            Av=cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * fs * sp_.virtual_rows),
            Bp=cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * fs * sp_.virtual_rows))
        return launches

    def _build_programs(self):
        """The programs of both sides and the seconds they took (an
        :class:`InvalidConfigError` names the side whose configuration failed)."""
        t0 = time.perf_counter()
        programs = {}
        for s in ("users", "items"):
            try:
                programs[s] = K.als_program(self.ctx, self.device, self.configs[s], self.fs,
                                            self.info, self.implicit, self.biased)
            except InvalidConfigError as e:
                e.side = s                   # which side's configuration failed (fit falls back)
                raise
        return programs, time.perf_counter() - t0

    def _upload_ratings(self):
        """The users' CSR to the device once (a CPU device reads the host arrays in place, a GPU
        gets them through pinned staging buffers), the items' CSR transposed from it there (or
        on the host: :func:`host_transpose`); returns the seconds of the ``upload`` and the
        ``transpose``."""
        u, col_ptr = self.side["users"], self.side["items"].indptr
        t0 = time.perf_counter()
        # Intel's CPU runtime reads only aligned host arrays in place: misaligned ones are
        # wrapped from the boundary below them (the device's row pointers shifted to match) or,
        # where the indices and values start differently, copied into aligned arrays by the
        # uploader's threads; either is held with the ratings
        up = U.Uploader(self.ctx, self.queue, U.zero_copy(self.info), align=U.host_align(self.info))
        self._hold = [np.zeros(1, np.int32), np.zeros(1, np.float32)]
        on_host = host_transpose(self.info, u.nnz)
        t_host = 0.0
        try:
            self._upload_side("users", up, u.indptr, u.indices, u.data)
            if on_host:
                t_host = time.perf_counter()
                C = sp.csr_matrix((u.data, u.indices, u.indptr), shape=self.shape).tocsc()
                idx = C.indices.astype(np.int32, copy=False)
                val = C.data.astype(np.float32, copy=False)
                self._hold += [idx, val]
                t_host = time.perf_counter() - t_host
                self._upload_side("items", up, col_ptr, idx, val)
            else:
                self.buf["items"]["indptr"] = up.buffer(col_ptr)
        finally:
            up.finish()
            self._hold += up.held
        log.debug("ratings on %s: %d bytes copied to the device, %d into aligned host copies, %d "
                  "wrapped from below (entry offsets %s)", self.info.name, up.bytes,
                  up.aligned_bytes, up.skewed_bytes, self.entry_offset)
        t1 = time.perf_counter()
        if not on_host:
            bu, bi = self.buf["users"], self.buf["items"]
            bi["indices"], bi["data"] = device_transpose(
                self.ctx, self.queue, self.info, u.indptr, bu["indptr"], bu["indices"],
                bu["data"], self.shape[1], bi["indptr"])
        return {"upload": t1 - t0 - t_host, "transpose": time.perf_counter() - t1 + t_host}

    def _upload_side(self, side, up, indptr, indices, data):
        """A side's CSR into its device buffers; its row pointers shifted by the entry offset
        at which the uploader placed the indices and values (:meth:`Uploader.entry_buffers`),
        kept in :attr:`entry_offset` for the pieces' row pointers of split rows."""
        b = self.buf[side]
        (b["indices"], b["data"]), k = up.entry_buffers((indices, data), self._hold[:2])
        self.entry_offset[side] = k
        if k:
            indptr = indptr + k
            self._hold.append(indptr)
        b["indptr"] = up.buffer(indptr)

    # ----- factors -------------------------------------------------------------------------
    def set_factors(self, side, M, biases=None, adopt=False):
        """Upload the factors (and biases) of ``side`` into its device buffer.

        ``adopt``: ``M`` is the engine's to keep and overwrite (start factors that no one else
        holds). On a device that reads host memory in place, the factor buffer then wraps the
        rows in the device's layout without a copy where ``M`` is the ``[:rows, :f]`` view of
        such rows (:func:`host_factor_rows`, aligned as the runtime needs); else ``M`` is
        copied."""
        rows = self.side[side].rows
        M = np.asarray(M, dtype=np.float32)
        if M.shape != (rows, self.f):
            raise ValueError(f"{side} factors must have shape {(rows, self.f)}, not {M.shape}")
        if adopt and ADOPT_FACTORS and biases is None and self.np_store == np.float32:
            host = _padded_base(M, rows, self.f, self.ldf)
            if host is not None and self._wrappable(host):
                mf = self.cl.mem_flags
                buf = self.cl.Buffer(self.ctx, mf.READ_WRITE | mf.USE_HOST_PTR, hostbuf=host)
                self.factors[side].release()
                self.factors[side] = buf
                self._factor_hosts[side] = host         # the buffer's memory: kept with it
                return
        if self.ldf == self.f and not self.biased and self.np_store == np.float32:
            host = np.ascontiguousarray(M)          # the device's layout already: no copy
        else:
            host = padded_factors(side, M, rows, self.f, self.ldf, self.np_store, self.biased,
                                  biases)
        up = U.Uploader(self.ctx, self.queue, U.zero_copy(self.info))
        try:
            up.write(self.factors[side], host)
        finally:
            up.finish()

    def _wrappable(self, host):
        """Whether the device reads ``host`` (a writable, C-contiguous array) in place: a CPU
        runtime, and the start its runtime needs for that (:func:`upload.needs_aligned_host`)."""
        align = U.host_align(self.info)
        return (U.zero_copy(self.info) and host.size > 0 and host.flags.c_contiguous
                and host.flags.writeable and (align <= 1 or host.ctypes.data % align == 0))

    def get_factors(self, side, with_biases=False):
        """A side's factors (and biases) copied from its device buffer."""
        rows = self.side[side].rows
        host = np.empty((rows, self.ldf), dtype=self.np_store)
        self.cl.enqueue_copy(self.queue, host, self.factors[side])
        return unpadded_factors(host, rows, self.f, self.biased, with_biases)

    # ----- one half-step -------------------------------------------------------------------
    def half_step(self, side, regularization, weighted):
        """Solve every row of ``side`` given the other side's factors (stays on the device)."""
        cl = self.cl
        other = "items" if side == "users" else "users"
        b, prog, v = self.buf[side], self.programs[side], self.vars[side]
        cfg = self.configs[side]
        kern = prog.kernels
        q = self.queue
        fs = self.fs
        cl.enqueue_copy(q, self.status, np.array([np.iinfo(np.int32).max], np.int32))
        events = []
        if self.implicit:      # G = (other side)ᵀ(other side), once per half-step
            if self.profile:           # timed alone (host clock around its two kernels)
                q.finish()
                t_gram = time.perf_counter()
            launch_gram(kern, q, cfg, fs, b["gram_k"], b["g_indptr"], b["g_indices"], b["g_data"],
                        self.factors[other], b["A"], b["B"], b["G"])
            if self.profile:
                q.finish()
                self.stage_times["gram"] = (self.stage_times.get("gram", 0.0)
                                            + time.perf_counter() - t_gram)
        for row0, n, v0, nv in self.launches[side]:
            if nv:
                e1, e2, ec, e3 = launch_split_batch(
                    kern, q, cfg, v, fs, b["indptr"], b["vindptr"], b["vstart"], b["indices"],
                    b["data"], self.factors[other], b["A"], b["B"], b["Av"], b["Bp"], b["G"],
                    self.factors[side], self.status, row0, n, v0, nv, 0, regularization,
                    weighted, self.implicit, self.alpha, self.offset)
            else:
                ec = None
                e1, e2, e3 = launch_batch(
                    kern, q, cfg, v, fs, b["indptr"], b["indices"], b["data"],
                    self.factors[other], b["A"], b["B"], b["G"], self.factors[side], self.status,
                    row0, n, 0, regularization, weighted, self.implicit, self.alpha, self.offset)
            events.append((e1, e2, e3, ec))
        st = np.empty(1, np.int32)
        cl.enqueue_copy(q, st, self.status)   # blocking: also ends the half-step
        if self.profile:
            for e1, e2, e3, ec in events:
                for key, e in (("s1", e1), ("s2", e2), ("s3", e3), ("combine", ec)):
                    if e is not None:
                        self.stage_times[key] = (self.stage_times.get(key, 0.0)
                                                 + (e.profile.end - e.profile.start) * 1e-9)
        if st[0] != np.iinfo(np.int32).max:
            raise SingularSystemError(
                f"the normal equations of {side[:-1]} row {int(st[0])} are not positive definite "
                f"(regularization={regularization}); increase regularization")

    def iteration(self, regularization, weighted):
        """One ALS iteration: users, then items."""
        self.half_step("users", regularization, weighted)
        self.half_step("items", regularization, weighted)

    def finish(self):
        """Wait for every command enqueued so far."""
        self.queue.finish()

    # ----- metrics on the device -----------------------------------------------------------
    def squared_error(self, key, users, items, ratings, offset=0.0):
        """Sum of squared errors of the current factors on triples (uploaded once per ``key``)."""
        cl = self.cl
        mf = cl.mem_flags
        if self._metrics_prog is None:
            self._metrics_prog = K.metrics_program(self.ctx, self.fs, self.storage, self.ldf,
                                                   biased=self.biased)
        wg = 128
        if key not in self._metric_bufs:
            n = len(ratings)
            groups = max(1, -(-n // wg))
            self._metric_bufs[key] = (
                n, groups,
                cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(users, np.int32)),
                cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(items, np.int32)),
                cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(ratings, np.float32)),
                cl.Buffer(self.ctx, mf.READ_WRITE, size=4 * groups))
        n, groups, bu, bi, br, bp = self._metric_bufs[key]
        self._metrics_prog.kernels["sq_error"](self.queue, (groups * wg,), (wg,), bu, bi, br,
                                               self.factors["users"], self.factors["items"],
                                               np.int64(n), np.float32(offset + self.offset), bp)
        part = np.empty(groups, np.float32)
        cl.enqueue_copy(self.queue, part, bp)
        return float(part.astype(np.float64).sum()), n

    def train_squared_error(self):
        """Sum of squared errors of the current factors on the training ratings, read from the
        users' CSR already on the device (nothing uploaded); returns ``(sse, count)``."""
        cl = self.cl
        if self._metrics_prog is None:
            self._metrics_prog = K.metrics_program(self.ctx, self.fs, self.storage, self.ldf,
                                                   biased=self.biased)
        wg = 128
        rows = self.side["users"].rows
        nnz = self.side["users"].nnz
        groups = max(1, -(-nnz // wg))                 # a work-item per rating
        if "train_csr" not in self._metric_bufs:
            self._metric_bufs["train_csr"] = (None, groups, cl.Buffer(
                self.ctx, cl.mem_flags.READ_WRITE, size=4 * groups))
        bp = self._metric_bufs["train_csr"][2]
        b = self.buf["users"]
        self._metrics_prog.kernels["sq_error_csr"](
            self.queue, (groups * wg,), (wg,), b["indptr"], b["indices"], b["data"],
            self.factors["users"], self.factors["items"], np.int32(rows), np.int64(nnz),
            np.float32(self.offset), bp)
        part = np.empty(groups, np.float32)
        cl.enqueue_copy(self.queue, part, bp)
        return float(part.astype(np.float64).sum()), nnz

    def _release_buffers(self):
        """Release the ratings' buffers created so far (a set-up that failed), once the
        commands queued on them have ended."""
        self._drain()
        for d in self.buf.values():
            for bufobj in d.values():
                if isinstance(bufobj, self.cl.MemoryObjectHolder):
                    bufobj.release()
        self.buf = {}

    def _drain(self):
        """Wait for the queue (Ctrl-C held back): no kernel or copy still uses a buffer or a
        host array the engine wraps once this returns; a failed wait is only logged."""
        try:
            drain(getattr(self, "queue", None))
        except Exception as e:  # noqa: BLE001 - freeing must go on after a failed command
            log.warning("waiting for %s before freeing its buffers failed: %s",
                        getattr(getattr(self, "info", None), "name", "the device"), e)

    def release(self):
        """Free the device buffers, once every command queued on them has ended (also after
        Ctrl-C: the kernels of an interrupted half-step finish first); again, nothing."""
        if getattr(self, "_released", True):
            return
        with deferred_interrupts():
            self._drain()
            for d in list(self.buf.values()) + [self.factors]:
                for bufobj in d.values():
                    if isinstance(bufobj, self.cl.MemoryObjectHolder):
                        bufobj.release()
            for entry in self._metric_bufs.values():
                for bufobj in entry[2:]:
                    bufobj.release()
            self.status.release()
            self.buf = {}
            self._metric_bufs = {}
            self.factors = {}
            self._factor_hosts = {}
            self._released = True

    def __del__(self):
        """An engine dropped unreleased (an error or Ctrl-C before :meth:`release`) waits for
        its queue before its buffers and the host arrays they wrap are freed with it."""
        if not getattr(self, "_released", True):
            try:
                self._drain()
            except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing to wait for
                pass
