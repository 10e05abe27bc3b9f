"""The reduce mode of an engine (a multi-device fit whose fixed factor is partitioned): the
partial normal equations of every row of a side over the device's block of the fixed side, and the
solve of the device's own rows once the caller has summed them over the devices."""
from __future__ import annotations

import time

from .blocks import Publisher, other_side
from .launch import launch_batch, launch_gram, launch_solve

__all__ = ["partials", "solve_reduced"]


def _scratch(eng, side, k):
    """``(pair, A, B)``: the scratch pair of a reduced side's ``k``-th batch, its two pairs in
    turn (one pair where the plan left no room for the second)."""
    b = eng.buf[side]
    if k % 2 and "A2" in b:
        return 1, b["A2"], b["B2"]
    return 0, b["A"], b["B"]


def partials(eng, side, host_A, host_B, host_G):
    """Partial normal equations of every row of ``side`` over this device's block of the
    fixed side, into ``host_A`` (rows × f × f), ``host_B`` (rows × f) and, with implicit
    feedback, ``host_G`` (f × f, the block's Gram matrix); nothing regularised. Batches take
    the two scratch pairs in turn: the copy of batch k to the host (``out`` queue) overlaps the
    kernels of batch k + 1, batch k + 2 waits for it."""
    cl = eng.cl
    t0 = time.perf_counter()
    other = other_side(side)
    b, v, cfg = eng.buf[side], eng.vars[side], eng.configs[side]
    kern = eng.programs[side].kernels
    q, out, fs = eng.queue, eng.q["out"], eng.fs
    events, stream_events, copied = [], [], [None, None]   # each pair's last copy
    if eng.implicit:
        e = launch_gram(kern, q, cfg, fs, b["gram_k"], b["g_indptr"], b["g_indices"],
                        b["g_data"], eng.factors[other], b["A"], b["B"], b["G"])
        events.append((e, None, None, None))
        eng.keep(cl.enqueue_copy(out, host_G, b["G"], is_blocking=False, wait_for=[e]))
    for k, batch in enumerate(eng._batches(side, stream_events)):
        bset, n = batch.bset, batch.rows
        pair, A, B = _scratch(eng, side, k)
        wait = list(batch.wait or []) + ([copied[pair]] if copied[pair] else [])
        evs = launch_batch(
            kern, q, cfg, v, fs, bset["indptr"], bset["indices"], bset["data"],
            eng.factors[other], A, B, b["G"], None, None, batch.row0, n, 0, 0.0,
            False, eng.implicit, eng.alpha, eng.offset, wait_for=wait or None,
            solve=False, gram=False)
        events.append((*evs, None))
        batch.done = evs[1] or evs[0]
        g0 = batch.r0 + batch.row0
        eng.keep(cl.enqueue_copy(out, host_A[g0:g0 + n], A, is_blocking=False,
                                 wait_for=[batch.done]))
        copied[pair] = eng.keep(cl.enqueue_copy(out, host_B[g0:g0 + n], B, is_blocking=False))
    q.finish()
    out.finish()
    eng.prune()
    eng.times["compute"] += time.perf_counter() - t0
    if eng.profile:
        eng._account(events, stream_events)


def solve_reduced(eng, side, host_A, host_B, regularization, weighted, exchange):
    """Solve ``eng``'s rows of ``side`` from the reduced systems in ``host_A``/``host_B``
    (regularised, Gram added) and exchange them as :meth:`Engine.half_step` does. Batches take
    the two scratch pairs in turn: the upload of batch k + 1 (``stream`` queue) overlaps the
    solve of batch k, and waits for the solve of batch k - 1 that used its pair."""
    cl = eng.cl
    t0 = time.perf_counter()
    b, cfg = eng.buf[side], eng.configs[side]
    kern = eng.programs[side].kernels
    q, up, fs = eng.queue, eng.q["stream"], eng.fs
    lo, _hi = eng.frange[side]
    r0, r1 = eng.share.blocks[side]
    bs = eng.batch_rows[side]
    eng.keep(cl.enqueue_copy(q, eng.status, eng._ok, is_blocking=False))
    publisher = Publisher(exchange, eng.index) if exchange.needed else None
    events, copy_events, solved = [], [], [None, None]    # each pair's last solve
    for k, row0 in enumerate(range(0, r1 - r0, bs)):
        n = min(bs, r1 - r0 - row0)
        g0 = r0 + row0
        pair, A, B = _scratch(eng, side, k)
        eng.keep(cl.enqueue_copy(up, A, host_A[g0:g0 + n], is_blocking=False,
                                 wait_for=[solved[pair]] if solved[pair] else None))
        ev = eng.keep(cl.enqueue_copy(up, B, host_B[g0:g0 + n], is_blocking=False))
        e3 = launch_solve(kern, q, cfg, fs, b["counts"], A, B, eng.factors[side],
                          eng.status, row0, n, r0 - lo, regularization, weighted, wait_for=[ev])
        solved[pair] = e3
        events.append((None, None, e3, None))
        if publisher is not None:
            ev = eng.read_rows(side, exchange.host, g0, g0 + n, blocking=False,
                               wait_for=[e3])
            copy_events.append(ev)
            publisher.put(ev, g0, g0 + n)
    eng._finish_half_step(side, regularization, publisher, exchange, t0, events, [],
                          copy_events)
