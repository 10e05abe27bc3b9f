"""The reduce mode of an engine (a multi-device fit whose fixed factor is partitioned): the
partial normal equations of every row of a side over the device's block of the fixed side, and the
solve of the device's own rows once the caller has summed them over the devices."""
from __future__ import annotations

import time

from .blocks import Publisher, other_side
from .launch import launch_batch, launch_gram, launch_solve

__all__ = ["partials", "solve_reduced"]


def partials(eng, side, host_A, host_B, host_G):
    """Partial normal equations of every row of ``side`` over this device's block of the
    fixed side, into ``host_A`` (rows × f × f), ``host_B`` (rows × f) and, with implicit
    feedback, ``host_G`` (f × f, the block's Gram matrix); nothing regularised."""
    cl = eng.cl
    t0 = time.perf_counter()
    other = other_side(side)
    b, v, cfg = eng.buf[side], eng.vars[side], eng.configs[side]
    kern = eng.programs[side].kernels
    q, fs = eng.queue, eng.fs
    events, stream_events = [], []
    if eng.implicit:
        e = launch_gram(kern, q, cfg, fs, b["gram_k"], b["g_indptr"], b["g_indices"],
                        b["g_data"], eng.factors[other], b["A"], b["B"], b["G"])
        events.append((e, None, None, None))
        cl.enqueue_copy(q, host_G, b["G"], is_blocking=False)
    for batch in eng._batches(side, stream_events):
        bset, n = batch.bset, batch.rows
        evs = launch_batch(
            kern, q, cfg, v, fs, bset["indptr"], bset["indices"], bset["data"],
            eng.factors[other], b["A"], b["B"], b["G"], None, None, batch.row0, n, 0, 0.0,
            False, eng.implicit, eng.alpha, eng.offset, wait_for=batch.wait,
            solve=False, gram=False)
        events.append((*evs, None))
        g0 = batch.r0 + batch.row0
        # the scratch is reused by the next batch: copied on the same (in-order) queue
        cl.enqueue_copy(q, host_A[g0:g0 + n], b["A"], is_blocking=False)
        batch.done = cl.enqueue_copy(q, host_B[g0:g0 + n], b["B"], is_blocking=False)
    q.finish()
    eng.times["compute"] += time.perf_counter() - t0
    if eng.profile:
        eng._account(events, stream_events)


def solve_reduced(eng, side, host_A, host_B, regularization, weighted, exchange):
    """Solve ``eng``'s rows of ``side`` from the reduced systems in ``host_A``/``host_B``
    (regularised, Gram added) and exchange them as :meth:`Engine.half_step` does."""
    cl = eng.cl
    t0 = time.perf_counter()
    b, cfg = eng.buf[side], eng.configs[side]
    kern = eng.programs[side].kernels
    q, fs = eng.queue, eng.fs
    lo, _hi = eng.frange[side]
    r0, r1 = eng.share.blocks[side]
    bs = eng.batch_rows[side]
    cl.enqueue_copy(q, eng.status, eng._ok)
    publisher = Publisher(exchange, eng.index) if exchange.needed else None
    events, copy_events = [], []
    for row0 in range(0, r1 - r0, bs):
        n = min(bs, r1 - r0 - row0)
        g0 = r0 + row0
        cl.enqueue_copy(q, b["A"], host_A[g0:g0 + n], is_blocking=False)
        cl.enqueue_copy(q, b["B"], host_B[g0:g0 + n], is_blocking=False)
        e3 = launch_solve(kern, q, cfg, fs, b["counts"], b["A"], b["B"], eng.factors[side],
                          eng.status, row0, n, r0 - lo, regularization, weighted)
        events.append((None, None, e3, None))
        if publisher is not None:
            ev = eng.read_rows(side, exchange.host, g0, g0 + n, blocking=False,
                                wait_for=[e3])
            copy_events.append(ev)
            publisher.put(ev, g0, g0 + n)
    eng._finish_half_step(side, regularization, publisher, exchange, t0, events, [],
                           copy_events)
