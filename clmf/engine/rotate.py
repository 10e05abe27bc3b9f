"""Implicit half-steps in the eigenbasis of their Gram matrix.

An implicit-feedback system is ``(G + Σ_e (c_e − 1) y_e y_eᵀ + λI) x = Σ_e c_e p_e y_e`` with the
Gram matrix ``G = YᵀY`` of the fixed side. The fused CG's dimensions form applies ``G`` to a
vector in every CG application of every row: f² work and f² floats read per application, which
on the H100 made a Netflix-shaped users' half-step 20–40 % slower than explicit feedback's.

The model is invariant under an orthogonal change of basis of both factor matrices (every
prediction ``xᵀy``, norm and regulariser stays), and so is CG. So before such a half-step the
engine computes ``G`` (as always), takes its eigendecomposition ``G = VΛVᵀ`` on the host (f × f,
float64), rotates both factor matrices on the device (``X ← XV``, ``Y ← YV``: the
``rt_rotate`` kernel, one pass over each) and runs the half-step with ``Λ`` for ``G``: the
Gram term costs f per application. The rotations accumulate (``R``); any read or write of the
factors (:meth:`Engine.get_factors` and the rest) first turns them back (``X ← XR⁻¹``).

Where (:func:`applies`): implicit, unbiased fits on one device (both factors whole, no
exchange), float32 factors, a dimensions-form fused CG for the side, whose rows are at least
as many as the fixed side's (the half-step the Gram term costs most; the other half-step runs
in the current basis with its full Gram matrix), no rows split for S1, and a rotation tile
(:data:`clmf.engine.kernels.ROTATE_ROWS` rows of f floats) that fits the local memory.
``CLMF_GRAM_ROTATION=0`` turns it off (a side-by-side benchmark, or a suspected bug), ``serial``
solves no head rows before the rotation. (Both sides rotated — the items' Gram term diagonal
too, for a second eigendecomposition and rotation an iteration — was slower on the H100:
0.4273 against 0.4109 s/it at f = 256; two register-tiled forms of ``rt_rotate`` were no faster
than its one column of 8 rows per work-item at f = 256: 6.96 and 8.90 ms over the Netflix
shape's users; ``results/bench/gpu-implicit/run-43``.)

On a GPU the host's eigendecomposition (7–9 ms at f = 256 on the H100's host) need not leave
the device idle: the half-step's first :data:`HEAD_FRACTION`-th of rows is solved in the
current basis with the full Gram matrix while the host takes it, then both matrices are
rotated (solved rows included) and the other rows are solved with ``Λ``.
"""
from __future__ import annotations

import functools
import os
import time

import numpy as np

from ..interrupts import deferred_interrupts
from . import kernels as K
from .blocks import SIDES, other_side

__all__ = ["ENV", "HEAD_FRACTION", "enabled", "overlapped", "may_apply", "tile_fits", "applies",
           "launch_geometry", "Rotation"]

ENV = "CLMF_GRAM_ROTATION"


# a GPU's rotated half-step solves 1/HEAD_FRACTION of its rows before the rotation (in the
# current basis, full Gram term) while the host takes the eigendecomposition
HEAD_FRACTION = 32


def _setting():
    """``$CLMF_GRAM_ROTATION``, lower-case (default ``1``)."""
    return os.environ.get(ENV, "1").strip().lower()


def enabled():
    """Whether half-steps may run in their Gram matrix's eigenbasis (``$CLMF_GRAM_ROTATION``,
    on unless ``0``/``off``/``false``/``no``)."""
    return _setting() not in ("0", "off", "false", "no")


def overlapped():
    """Whether a GPU's rotated half-steps solve their head rows while the host takes the
    eigendecomposition (``$CLMF_GRAM_ROTATION`` not ``serial``)."""
    return _setting() != "serial"


def may_apply(implicit, biased, storage, cfg):
    """Whether a fit of this kind (feedback, biases, factor storage) with configuration ``cfg``
    for a side may run that side's half-steps rotated (the engine's set-up builds the rotation's
    program then, beside the others)."""
    return enabled() and implicit and not biased and storage == "float32" and cfg.dims


def tile_fits(info, f):
    """Whether ``rt_rotate``'s tile (:data:`clmf.engine.kernels.ROTATE_ROWS` rows of ``f``
    floats) fits the local memory of the device ``info`` describes."""
    return 4 * K.ROTATE_ROWS * f <= info.local_mem


def applies(eng, side, cfg, exchange):
    """Whether ``eng``'s half-step of ``side`` with configuration ``cfg`` runs rotated."""
    other = other_side(side)
    return (may_apply(eng.implicit, eng.biased, eng.storage, cfg) and exchange is None
            and eng._whole_factor(side) and eng._whole_factor(other)
            and eng.side_rows(side) >= eng.side_rows(other)
            and not eng.splits[side].active
            and tile_fits(eng.info, eng.f))


@functools.lru_cache(maxsize=1)
def _blas_controller():
    """threadpoolctl's controller of the process's BLAS pools (made once: it scans the loaded
    libraries, about a millisecond), or None without threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def launch_geometry(info, rows):
    """``(work-groups, work-group size)`` of ``rt_rotate`` over ``rows`` rows on the device
    ``info`` describes: 128 lanes on GPUs, 8 on CPUs, a group per tile of
    :data:`clmf.engine.kernels.ROTATE_ROWS` rows up to a cap (groups take tiles in turn)."""
    gpu = info.type == "GPU"
    wg = min(128 if gpu else 8, info.max_work_group_size)
    cap = 65536 if gpu else 4 * max(1, info.compute_units)
    return min(-(-rows // K.ROTATE_ROWS), cap), wg


def eigh(G):
    """``G = VΛVᵀ`` of a small symmetric float32 matrix, in float64 (float32's vectors are
    orthogonal only to ~1e-4 at f = 256) on one BLAS thread where threadpoolctl is installed (a
    256 × 256 eigendecomposition is slower on many threads, and far slower where they compete
    with other work)."""
    G = G.astype(np.float64)
    ctl = _blas_controller()
    if ctl is None:
        return np.linalg.eigh(G)
    with ctl.limit(limits=1, user_api="blas"):
        return np.linalg.eigh(G)


class Rotation:
    """One engine's rotation state: the accumulated rotation ``R`` (float64; None: the
    original basis), the device's f × f matrix buffer and the rotation kernel."""

    def __init__(self, eng):
        """The program and the f × f buffer on ``eng``'s context."""
        cl = eng.cl
        self.eng = eng
        self.kern = K.rotate_program(eng.ctx).kernels["rt_rotate"]
        self.V = cl.Buffer(eng.ctx, cl.mem_flags.READ_ONLY, size=4 * eng.f * eng.f)
        self.R = None
        self.count = 0
        self._hosts = []          # the host arrays of copies in flight
        self._copied = None       # the last copy into V
        self._G = self._G_event = self._side = None

    def head_rows(self, rows):
        """Rows of a rotated half-step of ``rows`` rows solved before its rotation, in the
        current basis with the full Gram matrix, while the host takes the eigendecomposition
        (:data:`HEAD_FRACTION` of them on GPUs, none on CPUs, whose cores the host's
        eigendecomposition would take from the device). Sizes alone decide: the fit stays
        deterministic."""
        if self.eng.info.type != "GPU" or not overlapped():
            return 0
        head = -(-rows // HEAD_FRACTION)
        return head if head < rows else 0

    def start(self, side):
        """Enqueue the copy of ``side``'s Gram matrix (its buffer ``G``) to the host, not
        waiting for it (:meth:`complete` does)."""
        eng, cl, f = self.eng, self.eng.cl, self.eng.f
        self._G = np.empty((f, f), np.float32)
        self._side = side
        self._G_event = eng.keep(cl.enqueue_copy(eng.queue, self._G, eng.buf[side]["G"],
                                                 is_blocking=False))

    def complete(self):
        """Wait for :meth:`start`'s copy, turn both factor matrices into the Gram matrix's
        eigenbasis (enqueued after the commands before: the head rows' solves) and leave its
        eigenvalues in ``G``'s first f floats; True then (the rest of the half-step launches
        with ``gram=2``). False, nothing changed, where G is not finite or has no
        eigendecomposition (the half-step then runs with G as an unrotated one does, and
        reports what its solves find)."""
        eng, cl = self.eng, self.eng.cl
        self._G_event.wait()
        G, side = self._G, self._side
        self._G = self._G_event = None
        if not np.all(np.isfinite(G)):
            return False
        t = time.perf_counter()
        try:
            w, V = eigh(G)
        except np.linalg.LinAlgError:
            return False
        if eng.profile:
            eng.stage_times["eigh"] = eng.stage_times.get("eigh", 0.0) + time.perf_counter() - t
        V32 = np.ascontiguousarray(V, dtype=np.float32)
        lam = w.astype(np.float32)
        V64 = V32.astype(np.float64)
        with deferred_interrupts():      # both matrices rotated and R updated, or neither
            self._apply(V32, finish=False)
            self._hosts.append(lam)
            eng.keep(cl.enqueue_copy(eng.queue, eng.buf[side]["G"], lam, is_blocking=False))
            self.R = V64 if self.R is None else self.R @ V64
        self.count += 1
        return True

    def rotate(self, side):
        """:meth:`start` and :meth:`complete` at once (no rows solved before the rotation)."""
        self.start(side)
        return self.complete()

    def undo(self):
        """Turn both factor matrices back into the original basis (nothing if they are)."""
        if self.R is None:
            return
        inv = np.ascontiguousarray(np.linalg.inv(self.R), dtype=np.float32)
        with deferred_interrupts():      # both matrices turned back and R reset, or neither
            self._apply(inv)
            self.R = None
            self.eng.queue.finish()
        self._hosts = []

    def _apply(self, M, finish=True):
        """Enqueue both factor matrices times ``M`` (f × f float32), in place (``finish``: after
        all enqueued commands have ended; else after the previous rotation's only)."""
        eng, cl = self.eng, self.eng.cl
        if finish:
            eng.queue.finish()             # the previous copies of M's buffer have ended
        elif self._copied is not None:
            self._copied.wait()            # the previous matrix's copy (long done) ended
        self._hosts = [M]
        self._copied = eng.keep(cl.enqueue_copy(eng.queue, self.V, M, is_blocking=False))
        tile = cl.LocalMemory(4 * K.ROTATE_ROWS * eng.f)
        events = []
        for s in SIDES:
            rows = eng.side_rows(s)
            if rows == 0:
                continue
            groups, wg = launch_geometry(eng.info, rows)
            events.append(self.kern(eng.queue, (groups * wg,), (wg,), eng.factors[s],
                                    np.int64(rows), np.int32(eng.f), np.int32(eng.ldf), self.V,
                                    tile))
        if eng.profile:                    # the kernels' device seconds, a stage of their own
            cl.wait_for_events(events)
            eng.stage_times["rotate"] = eng.stage_times.get("rotate", 0.0) + sum(
                (e.profile.end - e.profile.start) * 1e-9 for e in events)

    def release(self):
        """Free the matrix buffer."""
        self.V.release()
