"""The reduce mode's pipeline (issue 28): packed systems (pack / unpack kernels against NumPy),
the host's segments and sums (:class:`clmf.parallel.reducer.Reducer`, no device), and fits whose
reduced side wraps the device's ring, has fewer rows than devices, or whose fixed side has a
device block without ratings, each against the one-device fit."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import random_ratings, rel_err

from clmf import reference
from clmf.engine.memory import packed_width
from clmf.parallel.reducer import Reducer, cut_segments, segment_rows

MODES = {"explicit": {}, "implicit": dict(implicit_alpha=2.0),
         "biased": dict(biased=True, offset=3.0)}


def _packed(A, B):
    """NumPy's packing: each row's lower triangle (row-major) then its right side."""
    i, j = np.tril_indices(A.shape[1])
    return np.concatenate([A[:, i, j], B], axis=1)


@pytest.mark.parametrize("fs", [7, 13])
def test_pack_and_unpack_kernels_match_numpy(cl_device, fs):
    """pack_systems writes the lower triangle and the right side of each row; unpack_systems
    restores the symmetric matrix from a ring offset with λ·n (weighted) or λ on the diagonal
    and the Gram matrix added, and the right side; in both unpack forms (GPUs', CPUs')."""
    import pyopencl as cl

    from clmf.engine.device import get_context
    from clmf.engine.kernels import build, render
    ctx, q = get_context(cl_device)
    rng = np.random.default_rng(fs)
    n, w = 5, packed_width(fs)
    M = rng.standard_normal((n, fs, fs)).astype(np.float32)
    A = (M + M.transpose(0, 2, 1)).astype(np.float32)
    B = rng.standard_normal((n, fs)).astype(np.float32)
    mf = cl.mem_flags
    dA = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=A)
    dB = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=B)
    dP = cl.Buffer(ctx, mf.READ_WRITE, size=4 * n * w)
    progs = [build(ctx, render("reduce.cl.j2", mirror=m)).kernels for m in (False, True)]
    P = np.empty((n, w), np.float32)
    for groups, wg in ((n, 1), (2, 8), (n, 64)):    # any work-group size, groups ≤ rows
        cl.enqueue_fill_buffer(q, dP, np.float32(np.nan), 0, 4 * n * w)
        progs[groups % 2]["pack_systems"](q, (groups * wg,), (wg,), dA, dB, dP, np.int32(n),
                                          np.int32(fs))
        cl.enqueue_copy(q, P, dP)
        assert np.array_equal(P, _packed(A, B))
    # unpack rows 2..4 of a ring holding the packed rows, with the own-block rows 1..3
    counts = np.array([0, 3, 3, 7, 9, 12], np.int64)        # row pointers: 3, 0, 4, 2, 3
    G = rng.standard_normal((fs, fs)).astype(np.float32)
    G = G + G.T
    dS = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=P)
    ip = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=counts)
    dG = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=G)
    outA = cl.Buffer(ctx, mf.READ_WRITE, size=4 * 3 * fs * fs)
    outB = cl.Buffer(ctx, mf.READ_WRITE, size=4 * 3 * fs)
    for k, (weighted, gram, groups, wg) in ((k, c) for k in progs
                                            for c in ((1, 0, 3, 64), (0, 1, 2, 8), (1, 1, 3, 1))):
        k["unpack_systems"](q, (groups * wg,), (wg,), dS, np.int64(2), np.int32(3), ip,
                            np.int32(1), np.float32(0.5), np.int32(weighted), dG, np.int32(gram),
                            outA, outB, np.int32(fs))
        gotA, gotB = np.empty((3, fs, fs), np.float32), np.empty((3, fs), np.float32)
        cl.enqueue_copy(q, gotA, outA)
        cl.enqueue_copy(q, gotB, outB)
        want = A[2:5] + (G if gram else 0)
        diag = 0.5 * np.diff(counts)[1:4] if weighted else np.full(3, 0.5)
        want = want + diag[:, None, None] * np.eye(fs, dtype=np.float32)
        assert np.allclose(gotA, want, rtol=1e-6, atol=1e-6)
        assert np.array_equal(gotB, B[2:5])


def test_segments_cut_each_block_in_order():
    """Segments lie inside one device's block each, in row order, none for an empty block;
    their size is capped by every device's batch and gives each block several."""
    assert cut_segments([0, 5, 5, 9], 2) == [(0, 2, 0), (2, 4, 0), (4, 5, 0), (5, 7, 2),
                                             (7, 9, 2)]
    assert segment_rows(39_780, 4, 100, [13_000, 9_000, 13_000]) == (8 << 20) // (4 * 5150)
    assert segment_rows(100, 2, 6, [16, 40]) == 13
    assert segment_rows(100, 2, 6, [8, 40]) == 8
    assert segment_rows(0, 4, 6, [8]) == 1


def test_reducer_sums_each_segment_once_every_device_landed():
    """Segments summed into their owner's rows (devices in index order) once all landed, in
    any order of landings; each owner takes its own in row order, an owner of an empty block
    none; a failure wakes a waiting owner with an error."""
    n, rows, fs = 3, 10, 3
    rd = Reducer("items", rows, [0, 4, 4, 10], fs, [2, 3, 5], lambda d, shape: np.zeros(shape,
                                                                                   np.float32))
    try:
        rng = np.random.default_rng(0)
        parts = [rng.standard_normal(h.shape).astype(np.float32) for h in rd.host]
        for h, p in zip(rd.host, parts):
            h[...] = p
        ports = [rd.port(d) for d in range(n)]
        assert ports[1].take(block=False) is None             # an empty block: nothing to take
        segs = rd.segments
        last = len(segs) - 1
        assert [s[2] for s in segs] == sorted(s[2] for s in segs) and segs[last][2] == 2
        order = [(d, k) for k in reversed(range(len(segs))) for d in range(n)
                 if (d, k) != (0, last)]
        for d, k in order:
            ports[d].landed(k)
        got = {0: [], 2: []}
        while (t := ports[0].take(block=True)) is not None:
            got[0] += t
        assert got[0] == [(a, b) for a, b, o in segs if o == 0]
        ports[0].landed(last)                   # the last landing: device 2's last segment
        while (t := ports[2].take(block=True)) is not None:
            got[2] += t
        assert got[2] == [(a, b) for a, b, o in segs if o == 2]
        want = parts[0] + parts[1] + parts[2]
        assert np.allclose(rd.host[0][0:4], want[0:4]) and np.allclose(rd.host[2][4:], want[4:])
        assert rd.finish()["sum"] > 0
        rd.start()
        err = []
        t = threading.Thread(target=lambda: err.append(_raises(ports[2].take, True)))
        t.start()
        ports[0].fail(ValueError("boom"))
        t.join(5)
        assert err and "boom" in err[0]
    finally:
        rd.close()


def _raises(fn, *args):
    """The message of the error ``fn(*args)`` raises (or None)."""
    try:
        fn(*args)
    except RuntimeError as e:
        return str(e)
    return None


def _fit_pair(devs, R, f, modes, cfg, extra, check=None, iterations=2):
    """Factors (with biases) after ``iterations`` on one device and on ``devs`` with ``modes``
    (``check(engine)`` called on the multi-device one)."""
    from clmf.parallel import MultiEngine, make_backend
    X0, Y0 = reference.start_factors(*R.shape, f, 0)
    out = []
    for many in (False, True):
        e = (MultiEngine(devs, R, f, [(cfg, cfg)] * len(devs), pinned=True,
                         modes=dict(zip(("users", "items"), modes)), **extra) if many
             else make_backend(devs[:1], R, f, [(cfg, cfg)], **extra))
        try:
            if many and check is not None:
                check(e)
            e.set_factors("users", X0)
            e.set_factors("items", Y0)
            for _ in range(iterations):
                e.iteration(0.1, "implicit_alpha" not in extra)
            out.append((e.get_factors("users", True), e.get_factors("items", True)))
        finally:
            e.release()
    return out


def _close(out):
    (x1, b1), (y1, c1) = out[0]
    (x2, b2), (y2, c2) = out[1]
    assert rel_err(x2, x1) <= 1e-4 and rel_err(y2, y1) <= 1e-4
    assert np.allclose(b2, b1, rtol=1e-4, atol=1e-5) and np.allclose(c2, c1, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_ring_smaller_than_the_block_wraps(cl_device, monkeypatch, mode):
    """A scratch cap leaves each device a ring of summed systems smaller than its block: the
    uploads wrap it, waiting for the unpacks of the rows they overwrite; two devices give the
    one-device answer (f = 7)."""
    from clmf.engine import memory
    from clmf.engine.config import KernelConfig
    from clmf.parallel import MultiEngine
    f = 7
    fs = f + 1 if mode == "biased" else f
    per_row = 4 * (fs * fs + fs)
    monkeypatch.setattr(memory, "SCRATCH_BUDGET", per_row * 16)
    R = random_ratings(150, 130, 0.12, seed=23, empty_rows=(5,), empty_cols=(9,))
    cfg = KernelConfig.parse("batch+reg:solver=cholesky")
    e = MultiEngine([cl_device] * 2, R, f, [(cfg, cfg)] * 2, pinned=False,
                    modes={"users": "replicate", "items": "reduce"}, **MODES[mode])
    try:
        rings = [w.buf["items"]["ring"] for w in e.workers]
        blocks = [w.share.blocks["items"] for w in e.workers]
        assert all(r < b - a for r, (a, b) in zip(rings, blocks)), (rings, blocks)
    finally:
        e.release()
    for modes in (("replicate", "reduce"), ("reduce", "replicate")):
        _close(_fit_pair([cl_device] * 2, R, f, modes, cfg, MODES[mode]))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_reduced_side_with_fewer_rows_than_devices(cl_device, mode):
    """Four devices reduce a side of three rows (a device with no rows to solve) while the last
    device's block of the fixed side holds no rating (its partial systems are zeros)."""
    from clmf.engine.config import KernelConfig
    cfg = KernelConfig.parse("batch+reg:solver=cholesky,batch_rows=2")
    rng = np.random.default_rng(5)
    dense = (rng.random((60, 3)) < 0.5) * rng.integers(1, 6, (60, 3))
    dense[30:] = 0                                 # the last users rate nothing
    dense[0] = [1, 2, 3]
    R = sp.csr_matrix(dense.astype(np.float32))
    for data, modes in ((R, ("replicate", "reduce")), (R.T.tocsr(), ("reduce", "replicate"))):
        side = "items" if modes[1] == "reduce" else "users"

        def check(e, side=side):
            assert e.layout[side].rows == 3 and len(e.workers) == 4
            assert any(a == b for a, b in (e.plan[side].block(d) for d in range(4)))
            assert e.sources[3][side].nnz == 0           # the fixed side's last block: empty
        _close(_fit_pair([cl_device] * 4, data, 3, modes, cfg, MODES[mode], check))


def test_time_split_reports_the_reduce(cl_device):
    """With profiling, an iteration's split holds the reduce's host sums (threads' seconds),
    the devices' copies of the reduced systems and the exposed wait (also ``reduce``)."""
    from clmf.engine.config import KernelConfig
    from clmf.parallel import MultiEngine
    R = random_ratings(120, 90, 0.15, seed=29)
    cfg = KernelConfig.parse("batch+reg:solver=cholesky,batch_rows=16")
    e = MultiEngine([cl_device] * 2, R, 6, [(cfg, cfg)] * 2, profile=True,
                    modes={"users": "replicate", "items": "reduce"})
    try:
        X0, Y0 = reference.start_factors(*R.shape, 6, 0)
        e.set_factors("users", X0)
        e.set_factors("items", Y0)
        e.iteration(0.1, True)
        sp_ = e.time_split()
        assert sp_["reduce_sum"] > 0 and sp_["reduce_copies"] > 0
        assert 0 <= sp_["reduce_wait"] == sp_["reduce"] <= sp_["wall"]
        assert all(w.stage_times["pack"] > 0 for w in e.workers)
        e.reset_times()
        assert e.time_split()["reduce_sum"] == 0.0
    finally:
        e.release()
