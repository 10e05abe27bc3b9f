"""Useful work of an ALS iteration (FLOPs, bytes) and the device limits measured in the same job
(``clmf/cl_kernels/peak.cl.j2``: FMA chains at vector widths 1/4/8/16 and a float4 copy)."""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)


def useful_flops(m, n, nnz, f):
    """Useful floating-point operations of one ALS iteration (both half-steps).

    ``m``, ``n``: rows solved on the users / items side (rows with at least one rating);
    ``nnz``: ratings. Counted, as the performance issue asks, only what the maths needs:

    * S1, the hermitians' lower triangles: ``nnz·f·(f+1)`` per side (f(f+1)/2 multiply-adds per
      rating), so ``2·nnz·f·(f+1)`` — a kernel computing the full Gram gets no credit for it;
    * S2, the right-hand sides: ``2·nnz·f`` per side, ``4·nnz·f``;
    * S3, the Cholesky factorisations: ``(m+n)·f³/3`` (the triangular solves are not counted).

    Returns a dict with ``s1``, ``s2``, ``s3`` and ``total`` (floats).

    >>> useful_flops(2, 3, 4, 2)["total"]
    93.33333333333333
    """
    s1 = 2.0 * nnz * f * (f + 1)
    s2 = 4.0 * nnz * f
    s3 = (m + n) * f ** 3 / 3.0
    return {"s1": s1, "s2": s2, "s3": s3, "total": s1 + s2 + s3}


def useful_bytes(m, n, nnz, f, rows_users=None, rows_items=None):
    """Bytes a stage must move at least (4-byte floats and indices, 8-byte row pointers).

    Per side with ``r`` rows (``rows_*``, default ``m``/``n``), ``s`` rows solved and ``z = nnz``:

    * S1: row pointers ``8(r+1)`` + column indices ``4z`` + gathered factors ``4fz`` + the
      hermitians' triangles written ``4s·f(f+1)/2``;
    * S2: ``8(r+1)`` + indices and ratings ``8z`` + gathered factors ``4fz`` + ``b`` written
      ``4sf``;
    * S3: triangles and ``b`` read, factors written: ``4s·f(f+1)/2 + 8sf``;
    * the iteration, as one fused pass would need it: ``8(r+1) + 8z + 4fz + 4sf`` per side
      (CSR read once, each rating's factor row gathered once, the new factors written).

    Gathers are counted at full cost although caches may serve them, so on a CPU the "effective"
    GB/s can exceed the copy bandwidth. Returns a dict ``s1``, ``s2``, ``s3``, ``total``.

    >>> useful_bytes(2, 3, 4, 2)["total"]
    224.0
    """
    ru = m if rows_users is None else rows_users
    ri = n if rows_items is None else rows_items
    tri = f * (f + 1) / 2.0
    s1 = s2 = s3 = tot = 0.0
    for r, s in ((ru, m), (ri, n)):
        s1 += 8 * (r + 1) + 4 * nnz + 4 * f * nnz + 4 * s * tri
        s2 += 8 * (r + 1) + 8 * nnz + 4 * f * nnz + 4 * s * f
        s3 += 4 * s * tri + 8 * s * f
        tot += 8 * (r + 1) + 8 * nnz + 4 * f * nnz + 4 * s * f
    return {"s1": s1, "s2": s2, "s3": s3, "total": tot}


# ----- the device's limits -----------------------------------------------------------------------
def _median_event_seconds(launch, repeats):
    out = []
    for _ in range(repeats):
        ev = launch()
        ev.wait()
        out.append((ev.profile.end - ev.profile.start) * 1e-9)
    return float(np.median(out)), out


def measure_peaks(device, repeats=7, quick=False, widths=(1, 4, 8, 16), chains=8, unroll=8):
    """Measured fp32 FMA throughput (GFLOP/s) and copy bandwidth (GB/s) of an OpenCL device.

    FMA: for each vector width, a calibration launch sets the loop count so one launch takes
    about 50 ms (GPU) / 150 ms (CPU) (5 ms with ``quick``); the median of ``repeats`` launches
    counts; the best width is the peak. Copy: ``dst[i] = src[i]`` over float4 buffers of
    min(512 MiB, max_alloc/4) (GPU) / 256 MiB (CPU) (16 MiB with ``quick``), 2 bytes moved per
    byte copied. Returns a dict.
    """
    import pyopencl as cl

    from ..engine import kernels as K
    from ..engine.device import device_info, get_context
    info = device_info(device)
    ctx, queue = get_context(device)
    gpu = info.type == "GPU"
    target = 0.005 if quick else (0.05 if gpu else 0.15)
    local = max(1, min(256 if gpu else 64, info.max_work_group_size))
    groups = info.compute_units * (16 if gpu else 4)
    gsize = groups * local
    out_buf = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, size=4 * gsize)
    res = {"device": info.name, "platform": info.platform, "driver": info.driver,
           "type": info.type, "fma": {}}
    best = (0.0, None)
    for w in widths:
        src = K.render("peak.cl.j2", width=w, chains=chains, unroll=unroll)
        prog = K.build(ctx, src, options=())
        kern = prog.kernels["fma_peak"]

        def launch(iters):
            return kern(queue, (gsize,), (local,), out_buf, np.float32(0.9999), np.float32(1e-4),
                        np.int32(iters))
        iters = 16
        for _ in range(12):                        # calibrate the loop count
            t, _x = _median_event_seconds(lambda: launch(iters), 1)
            if t >= target / 4 or iters >= 1 << 24:
                break
            iters *= 4
        iters = max(1, int(iters * target / max(t, 1e-6)))
        launch(iters).wait()                       # warm
        med, runs = _median_event_seconds(lambda: launch(iters), repeats)
        flop = 2.0 * w * chains * unroll * iters * gsize
        g = flop / med * 1e-9
        res["fma"][w] = {"gflops": g, "iters": iters, "runs_s": runs}
        if g > best[0]:
            best = (g, w)
    res["peak_gflops"], res["fma_width"] = best
    # copy
    if quick:
        size = 16 << 20
    elif gpu:
        size = min(512 << 20, info.max_alloc // 4)
    else:
        size = min(256 << 20, info.max_alloc // 4)
    size -= size % (16 * local)
    n4 = size // 16
    a = cl.Buffer(ctx, cl.mem_flags.READ_ONLY, size=size)
    b = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, size=size)
    cl.enqueue_fill_buffer(queue, a, np.float32(1.0), 0, size).wait()
    cl.enqueue_fill_buffer(queue, b, np.float32(0.0), 0, size).wait()
    prog = K.build(ctx, K.render("peak.cl.j2", width=1, chains=1, unroll=1), options=())
    ck = prog.kernels["copy_peak"]
    fk = prog.kernels["copy_peak_flat"]
    cg = min(n4, (info.compute_units * 2048) if gpu else info.compute_units * local * 64)
    cg -= cg % local
    cg = max(local, cg)
    launches = {"grid-stride": lambda: ck(queue, (cg,), (local,), a, b, np.int64(n4)),
                "flat": lambda: fk(queue, (n4,), (local,), a, b)}
    med, runs, how = float("inf"), [], ""
    for kname, copy in launches.items():       # the better of the two kernels counts
        copy().wait()
        m_, r_ = _median_event_seconds(copy, repeats)
        if m_ < med:
            med, runs, how = m_, r_, kname
    res["peak_gbps"] = 2.0 * size / med * 1e-9
    res["copy"] = {"bytes": size, "runs_s": runs, "kernel": how}
    for buf in (a, b, out_buf):
        buf.release()
    return res


# ----- data --------------------------------------------------------------------------------------
