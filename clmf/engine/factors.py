"""Factor rows between the host and the devices' padded layout: rows of ``ldf`` values, with
biases column f holding the 1 and column f + 1 the bias."""
from __future__ import annotations

import numpy as np

from . import kernels as K
from . import upload as U

__all__ = ["padded_factors", "host_factor_rows", "padded_base", "unpadded_factors",
           "half_rows", "Handed", "hand_over", "release_unused"]


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


def padded_base(M, rows, f, ldf):
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


def half_rows(eng, queue, side, host, a, b, blocking, wait_for=None):
    """Rows ``[a, b)`` of ``side``'s factor on the engine ``eng`` from (``out`` queue) or to
    (any other queue) the float16 host array ``host``, through a half staging buffer and a
    conversion kernel on the device: half the bytes of a float32 exchange cross the bus."""
    cl, q = eng.cl, eng.q[queue]
    n = (b - a) * eng.ldf
    stage = eng._half_stage.get(queue)
    if stage is None or stage.size < 2 * n:
        if stage is not None:
            q.finish()                    # its last copy and kernel have ended
            stage.release()
        most = max(n, eng.ldf * max(eng.batch_rows.values()))
        stage = eng._half_stage[queue] = cl.Buffer(eng.ctx, cl.mem_flags.READ_WRITE,
                                                    size=2 * most)
    kern = K.convert_program(eng.ctx).kernels
    off, gs = np.int64((a - eng.frange[side][0]) * eng.ldf), (-(-n // 64) * 64,)
    if queue == "out":
        kern["pack_half"](q, gs, (64,), eng.factors[side], off, stage, np.int64(n),
                          wait_for=wait_for)
        return cl.enqueue_copy(q, host[a:b], stage, is_blocking=blocking)
    eng.keep(cl.enqueue_copy(q, stage, host[a:b], is_blocking=False))
    ev = kern["unpack_half"](q, gs, (64,), stage, eng.factors[side], off, np.int64(n))
    if blocking:
        ev.wait()
    return ev


class Handed:
    """A factor buffer an engine gave away after its fit (:func:`hand_over`): ``rows`` rows of
    ``ld`` float32 values each (the first ``f`` the factors), ``host`` the host memory the buffer
    wraps (CPU runtimes) or None; ``taken`` is set by whoever keeps the buffer (the ranker),
    else :func:`release_unused` frees it (also after the ranker filled its own from it)."""

    __slots__ = ("buffer", "ld", "rows", "f", "host", "taken")

    def __init__(self, buffer, ld, rows, f, host=None):
        """Keep the buffer and its geometry."""
        self.buffer, self.host = buffer, host
        self.ld, self.rows, self.f = int(ld), int(rows), int(f)
        self.taken = False

    def take(self, ctx, queue, ld, rows):
        """A buffer of ``rows`` rows of ``ld`` float32 values in the context ``ctx``, the first
        ``f`` of each the factors and the rest zero: this one, now the caller's, when it is
        that already (no padding columns: a solve kernel's vector stores may leave values
        there, which a ranker reading whole rows would count), else a new one filled from it on
        the device on ``queue`` (zeros, then a rectangular copy of the factor columns); None
        when it lies in another context or has other rows."""
        if self.taken or rows != self.rows or ld < self.f \
                or self.buffer.context.int_ptr != ctx.int_ptr:
            return None
        if ld == self.ld == self.f:
            self.taken = True
            return self.buffer
        import pyopencl as cl
        nbytes = 4 * max(1, rows) * ld
        out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=nbytes)
        cl.enqueue_fill_buffer(queue, out, np.float32(0), 0, nbytes)
        if rows:
            cl.enqueue_copy(queue, out, self.buffer, src_origin=(0, 0), dst_origin=(0, 0),
                            region=(4 * self.f, rows), src_pitches=(4 * self.ld,),
                            dst_pitches=(4 * ld,))
        queue.finish()
        return out


def hand_over(eng):
    """The factor buffers of the one-device engine ``eng`` given away, ``{side: Handed}``, so
    that the model's ranker keeps them on the device instead of uploading the factors again;
    the engine no longer frees them. Only where they are the factors as ranked: every row of
    both sides held, float32, no bias columns, rows in the original basis (a rotation undone);
    else None. Call after the last iteration, before :meth:`Engine.release`."""
    if eng.biased or eng.np_store != np.float32 or not all(
            eng._whole_factor(s) for s in ("users", "items")):
        return None
    eng.finish()
    eng._unrotate()
    eng.finish()
    hosts = eng._factor_hosts
    return {s: Handed(eng.factors.pop(s), eng.ldf, eng.side_rows(s), eng.f, hosts.pop(s, None))
            for s in ("users", "items")}


def release_unused(handed):
    """Free the handed buffers nobody took (``handed``: :func:`hand_over`'s result or None)."""
    for h in (handed or {}).values():
        if not h.taken:
            h.buffer.release()
            h.taken = True
