"""The items' CSR (the ratings' CSC) built on the device from the users' CSR already there: a
stable counting sort over blocks of rows (``cl_kernels/layout.cl.j2``), so the host neither sorts
nor copies the transpose and the ratings cross the bus once."""
from __future__ import annotations

import numpy as np

from . import kernels as K

__all__ = ["transpose_blocks", "device_transpose", "layout_program"]

_COUNTS_BUDGET = 512 << 20      # largest per-block column counters (bytes)
_CPU_BAND = 4096                # columns written per pass on CPUs


def layout_program(ctx):
    """The transpose's program (``layout.cl.j2``) for ``ctx``: built once (a fit starts it in a
    build thread before the ratings upload, :mod:`clmf.engine.programs`)."""
    return K.build(ctx, K.render("layout.cl.j2"))


def transpose_blocks(info, rows, ncols, nnz):
    """Blocks of rows (work-items) of the device transpose: enough to fill the device, each
    with ``ncols`` 4-byte counters within the budget (a sixteenth of the device's memory)."""
    per_cu = 8 if info.type == "CPU" else 64
    want = max(1, info.compute_units * per_cu)
    budget = min(_COUNTS_BUDGET, info.global_mem // 16, info.max_alloc)
    cap = max(1, budget // (4 * max(1, ncols)))
    return int(max(1, min(want, cap, rows, max(1, nnz // 256))))


def device_transpose(ctx, queue, info, indptr, indptr_buf, indices_buf, data_buf, ncols,
                     col_ptr_buf):
    """Enqueue the transpose of the CSR in ``indptr_buf``/``indices_buf``/``data_buf`` (host
    ``indptr`` int64 for the block bounds; ``col_ptr_buf``: the transpose's int64 row pointers,
    already on the device); returns the (indices, data) buffers of the transpose."""
    import pyopencl as cl
    mf = cl.mem_flags
    rows = len(indptr) - 1
    nnz = int(indptr[-1])
    out_idx = cl.Buffer(ctx, mf.READ_WRITE, size=max(1, nnz) * 4)
    out_val = cl.Buffer(ctx, mf.READ_WRITE, size=max(1, nnz) * 4)
    if nnz == 0:
        return out_idx, out_val
    nb = transpose_blocks(info, rows, ncols, nnz)
    # row bounds of blocks of about equal entries (searchsorted over the row pointers)
    bounds = np.searchsorted(indptr, np.linspace(0, nnz, nb + 1)[1:-1]).astype(np.int64)
    bounds = np.concatenate(([0], np.clip(bounds, 0, rows), [rows])).astype(np.int32)
    bounds = np.maximum.accumulate(bounds)
    kern = layout_program(ctx).kernels
    size = nb * ncols * 4
    counts = cl.Buffer(ctx, mf.READ_WRITE, size=size)
    totals = cl.Buffer(ctx, mf.READ_WRITE, size=max(1, ncols) * 4)
    b_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=bounds)
    # a CPU runtime runs a work-group on one thread: one block per work-group there
    wg = 1 if info.type == "CPU" else 64
    gb, gc = -(-nb // wg) * wg, -(-ncols // wg) * wg
    kern["lay_count"](queue, (gb,), (wg,), indptr_buf, indices_buf, b_buf, np.int32(nb),
                      np.int32(ncols), counts)
    kern["lay_scan"](queue, (gc,), (wg,), counts, np.int32(nb), np.int32(ncols), totals)
    # CPUs write a band of columns at a time (their open cache lines fit a core's cache)
    band = _CPU_BAND if info.type == "CPU" and ncols > _CPU_BAND else max(1, ncols)
    cursor = cl.Buffer(ctx, mf.READ_WRITE, size=4 * rows if band < ncols else 4)
    kern["lay_scatter"](queue, (gb,), (wg,), indptr_buf, indices_buf, data_buf, b_buf,
                        np.int32(nb), np.int32(ncols), counts, col_ptr_buf, out_idx, out_val,
                        np.int32(band), cursor)
    queue.finish()
    for b in (counts, totals, b_buf, cursor):
        b.release()
    return out_idx, out_val
