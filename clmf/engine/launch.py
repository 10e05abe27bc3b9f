"""The kernels' launches: S1 → S2 → S3 over a batch of rows, long rows cut into pieces summed by
separate S1 work-groups (:func:`split_rows`, :func:`launch_split_batch`), the implicit Gram, the
solve alone; each enqueues on a queue and returns its events (the one engine,
:class:`clmf.engine.Engine`, runs them)."""
from __future__ import annotations

import time

import numpy as np

from .blocks import SIDES, other_side
from .kernels import ROTATE_ROWS, als_variables, reduce_launch, reduce_program, rotate_program
from .memory import gram_geometry, gram_tiled, gram_virtual_rows, packed_width, split_pays
from .rotate import may_apply, tile_fits

__all__ = ["launch_gram", "gram_buffers", "launch_batch", "split_rows",
           "launch_split_batch", "launch_solve", "warm"]

_INT32_MAX = (1 << 31) - 1

def gram_buffers(cl, ctx, info, fs, rows, batch_rows):
    """The buffers of a Gram over ``rows`` rows of the fixed side (:func:`launch_gram`'s
    ``gram``): the tiled kernels' partial tiles, or the S1 path's virtual rows' CSR."""
    mf = cl.mem_flags
    if gram_tiled(info.type):
        geo = gram_geometry(fs, rows, info.max_work_group_size)
        return {"geo": geo, "rows": int(rows),
                "P": cl.Buffer(ctx, mf.READ_WRITE, size=geo.partial_bytes)}
    k = gram_virtual_rows(batch_rows, rows)
    gptr = np.linspace(0, rows, k + 1).astype(np.int64)
    ro = mf.READ_ONLY | mf.COPY_HOST_PTR
    return {"k": k, "indptr": cl.Buffer(ctx, ro, hostbuf=gptr),
            "indices": cl.Buffer(ctx, ro, hostbuf=np.arange(max(1, rows), dtype=np.int32)),
            "data": cl.Buffer(ctx, ro, hostbuf=np.ones(max(1, rows), np.float32))}


def launch_gram(kern, q, cfg, fs, gram, Yother, A, B, G, wait_for=None):
    """Enqueue G = Σ y yᵀ over the fixed side's rows ``Yother`` (implicit feedback) as
    :func:`gram_buffers` planned it: the tiled kernels' partial tiles (``gram["P"]``), or the
    side's S1 over ``gram["k"]`` virtual rows into ``A``; then their sum (the returned event)."""
    if "geo" in gram:
        geo = gram["geo"]
        kern["gr_partial"](q, (geo.chunks * geo.pairs * geo.lg * geo.lg,), (geo.lg * geo.lg,),
                           Yother, np.int64(gram["rows"]), np.int64(geo.rows_per_chunk),
                           gram["P"], wait_for=wait_for)
        return kern["gr_sum"](q, (-(-fs * fs // 64) * 64,), (64,), gram["P"],
                              np.int32(geo.chunks), G)
    k, s1_local = gram["k"], cfg.s1_local_size(fs)
    kern["s1_hermitian"](q, (cfg.s1_groups(fs, k) * s1_local,), (s1_local,), gram["indptr"],
                         gram["indices"], Yother, A, np.int32(0), np.int32(k), np.float32(0.0),
                         np.int32(0), gram["data"], np.float32(1.0), G, np.int32(0), B,
                         np.int32(0), np.float32(0.0), wait_for=wait_for)
    return kern["sum_partials"](q, (-(-fs * fs // 64) * 64,), (64,), A, np.int32(k), G)


def launch_batch(kern, q, cfg, v, fs, indptr, indices, data, Yother, A, B, G, Xout, status, row0,
                 n, xoff, regularization, weighted, implicit, alpha, offset, wait_for=None,
                 solve=True, gram=None):
    """Enqueue S1 → S2 → S3 for rows ``row0 .. row0 + n - 1`` of ``indptr`` (entry offsets
    relative to ``indices``/``data``), writing factor rows ``xoff + row0 ..`` of ``Xout``;
    returns the (S1, S2, S3) events (None for a stage the variant fuses or skips).

    ``solve=False`` stops after S2 (partial normal equations in ``A``/``B``: pass
    ``regularization=0`` and ``gram=False``); ``gram`` (default: ``implicit``) adds ``G``;
    ``gram=2`` (the dims form only): ``G`` holds the Gram matrix's diagonal (F floats: a
    half-step in its eigenbasis, :mod:`clmf.engine.rotate`)."""
    s1_local = cfg.s1_local_size(fs)
    groups = cfg.s1_groups(fs, n)
    fused = cfg.solver == "fusedcg"
    add_gram = implicit if gram is None else gram
    if add_gram == 2 and not (cfg.dims and solve):
        raise ValueError("a diagonal Gram matrix is for the fused CG's dimensions form only")
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
                            np.int32(int(add_gram)), Xout, status, np.int32(row0),
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
                       weighted, implicit, alpha, offset, wait_for=None, solve=True):
    """Enqueue S1 (and S2 unless S1 fuses it) over the pieces ``v0 .. v0 + nv - 1`` of
    ``vindptr`` into ``Av``/``Bp`` (unregularised, no Gram), the combine of each real row's
    pieces into ``A``/``B`` (diagonal and Gram added as S1 adds them to an unsplit row), then S3
    on the real rows ``row0 .. row0 + n - 1``; returns the (S1, S2, combine, S3) events (S2
    None when fused). ``solve=False`` stops after the combine (a reduce's partial normal
    equations: pass ``regularization=0`` and ``implicit=False``, no Gram; S3 None). Not for
    the fused CG solver or ``fused_solve``, which build no hermitians."""
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
    if not solve:
        return e1, e2, ec, None
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


def warm(eng, programs):
    """Launch each side's kernels of ``eng`` (a :class:`clmf.engine.Engine`) once on a one-row
    problem of their own (a runtime may compile or load a kernel at its first launch: PoCL
    builds a work-group function per local size there), on its idle ``out`` queue while the
    ratings upload, so that the first iteration does not pay for it."""
    cl, mf, fs = eng.cl, eng.cl.mem_flags, eng.fs
    q = eng.q["out"]

    def const(a):
        return cl.Buffer(eng.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)

    def zeros(nbytes):
        # written by the kernels (systems, right sides, factors, status): read-write (a
        # read-only buffer written is undefined behaviour; Oclgrind reports and aborts)
        return cl.Buffer(eng.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR,
                         hostbuf=np.zeros(max(1, nbytes) // 4 + 16, np.float32))
    ip, one = const(np.array([0, 1], np.int64)), const(np.array([0, 1], np.int64))
    idx, val = const(np.zeros(1, np.int32)), const(np.ones(1, np.float32))
    row = 2 * eng.ldf * eng.itemsize
    Y, X = zeros(row), zeros(row)
    A, B, G, st = zeros(4 * fs * fs), zeros(4 * fs), zeros(4 * fs * fs), zeros(4)
    for s in ("users", "items"):
        kern, cfg = programs[s].kernels, eng.configs[s]
        v = als_variables(cfg, fs, eng.info, eng.implicit, eng.biased, ldf=eng.ldf)
        if eng.implicit:
            gram = gram_buffers(eng.cl, eng.ctx, eng.info, fs, 1, 1)
            launch_gram(kern, q, cfg, fs, gram, Y, A, B, G)
        launch_batch(kern, q, cfg, v, fs, ip, idx, val, Y, A, B, G, X, st, 0, 1, 0, 1.0,
                     True, eng.implicit, eng.alpha, eng.offset)
        if eng.splits[s].active:
            launch_split_batch(kern, q, cfg, v, fs, ip, ip, one, idx, val, Y, A, B, A, B, G,
                               X, st, 0, 1, 0, 1, 0, 1.0, True, eng.implicit, eng.alpha,
                               eng.offset)
        if s in eng.share.reduced:
            launch_solve(kern, q, cfg, fs, ip, A, B, X, st, 0, 1, 0, 1.0, True)
            if f"packed_{s}" in eng.dplan.bytes:      # the pipelined reduce's kernels
                P, geo = zeros(4 * packed_width(fs)), reduce_launch(eng.info, 1)
                k = reduce_program(eng.ctx, eng.info).kernels
                k["pack_systems"](q, *geo, A, B, P, np.int32(1), np.int32(fs))
                k["unpack_systems"](q, *geo, P, np.int64(0), np.int32(1), P, np.int32(0),
                                    np.int64(0), ip, np.int32(0), np.float32(1.0), np.int32(1),
                                    G, np.int32(0), A, B, np.int32(fs))
                q.finish()
                P.release()
    if tile_fits(eng.info, eng.f) and any(
            may_apply(eng.implicit, eng.biased, eng.storage, eng.configs[s]) for s in SIDES):
        # the Gram eigenbasis's rotation (clmf.engine.rotate) on a one-row problem
        Vm = zeros(4 * eng.f * eng.f)
        rotate_program(eng.ctx).kernels["rt_rotate"](
            q, (1,), (1,), X, np.int64(1), np.int32(eng.f), np.int32(eng.ldf), Vm,
            cl.LocalMemory(4 * ROTATE_ROWS * eng.f))
        q.finish()
        Vm.release()
    q.finish()
    for b in (ip, one, idx, val, Y, X, A, B, G, st):
        b.release()


def timed_gram(eng, side, kern, cfg):
    """Enqueue G = Σ y yᵀ over the fixed side's rows an engine holds (timed alone when
    profiling: the host clock around its two kernels, added to its ``stage_times['gram']``)."""
    b, q = eng.buf[side], eng.queue
    if eng.profile:
        q.finish()
        t = time.perf_counter()
    launch_gram(kern, q, cfg, eng.fs, b["gram"], eng.factors[other_side(side)], b["A"], b["B"],
                b["G"])
    if eng.profile:
        q.finish()
        eng.stage_times["gram"] = eng.stage_times.get("gram", 0.0) + time.perf_counter() - t
