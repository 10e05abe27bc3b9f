"""The reduce mode's pipeline (issue 28): packed systems (pack / unpack kernels, the unpack
summing the peers' copies, against NumPy), the host's segments, sums and hand-overs
(:class:`clmf.parallel.reducer.Reducer`, no device, both sum modes), and fits whose reduced
side wraps the device's ring, has fewer rows than devices, uneven blocks, or whose fixed side
has a device block without ratings, each against the one-device fit (and NumPy's), in both sum
modes (device, host), which agree."""
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
SUMS = ("device", "host")


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
        k["unpack_systems"](q, (groups * wg,), (wg,), dS, np.int64(2), np.int32(3), dS,
                            np.int32(0), np.int64(0), ip, np.int32(1), np.float32(0.5),
                            np.int32(weighted), dG, np.int32(gram), outA, outB, np.int32(fs))
        gotA, gotB = np.empty((3, fs, fs), np.float32), np.empty((3, fs), np.float32)
        cl.enqueue_copy(q, gotA, outA)
        cl.enqueue_copy(q, gotB, outB)
        want = A[2:5] + (G if gram else 0)
        diag = 0.5 * np.diff(counts)[1:4] if weighted else np.full(3, 0.5)
        want = want + diag[:, None, None] * np.eye(fs, dtype=np.float32)
        assert np.allclose(gotA, want, rtol=1e-6, atol=1e-6)
        assert np.array_equal(gotB, B[2:5])


@pytest.mark.parametrize("fs", [7, 13])
def test_unpack_sums_the_peers_copies(cl_device, fs):
    """With device sums unpack_systems sums a row's own packed system and its peers' copies
    (each peer's ring ``pstride`` floats after the last; own first, then the peers in order:
    the host's sums, to the bit), in both forms and any geometry; rows outside are unread."""
    import pyopencl as cl

    from clmf.engine.device import get_context
    from clmf.engine.kernels import build, render
    ctx, q = get_context(cl_device)
    rng = np.random.default_rng(fs)
    ring, w, peers = 6, packed_width(fs), 3
    own = rng.standard_normal((ring, w)).astype(np.float32)
    rings = rng.standard_normal((peers, ring, w)).astype(np.float32)
    total = own.copy()
    for p in rings:
        np.add(total, p, out=total)                        # the host's order
    counts = np.arange(0, 2 * ring + 2, 2, dtype=np.int64)
    mf = cl.mem_flags

    def const(a):
        return cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a))
    dS, dT, ip = const(own), const(rings), const(counts)
    dG = const(np.zeros((fs, fs), np.float32))
    outA = cl.Buffer(ctx, mf.READ_WRITE, size=4 * 4 * fs * fs)
    outB = cl.Buffer(ctx, mf.READ_WRITE, size=4 * 4 * fs)
    progs = [build(ctx, render("reduce.cl.j2", mirror=m)).kernels for m in (False, True)]
    i, j = np.tril_indices(fs)
    for k, (s0, rows, groups, wg) in ((k, c) for k in progs
                                      for c in ((2, 4, 4, 1), (0, 3, 2, 8), (5, 1, 1, 64))):
        k["unpack_systems"](q, (groups * wg,), (wg,), dS, np.int64(s0), np.int32(rows), dT,
                            np.int32(peers), np.int64(ring * w), ip, np.int32(0),
                            np.float32(0.0), np.int32(0), dG, np.int32(0), outA, outB,
                            np.int32(fs))
        gotA, gotB = np.empty((rows, fs, fs), np.float32), np.empty((rows, fs), np.float32)
        cl.enqueue_copy(q, gotA, outA)
        cl.enqueue_copy(q, gotB, outB)
        want = total[s0:s0 + rows]
        assert np.array_equal(gotA[:, i, j], want[:, :len(i)]), (s0, rows, groups, wg)
        assert np.array_equal(gotA[:, j, i], want[:, :len(i)])
        assert np.array_equal(gotB, want[:, len(i):])


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
    rd = Reducer("items", rows, [0, 4, 4, 10], fs, [2, 3, 5],
                 lambda d, shape: np.zeros(shape, np.float32), sums="host")
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
        _assert_failure_wakes(ports[2], ports[0])
    finally:
        rd.close()


def test_reducer_device_sums_hand_over_each_copy_as_it_lands():
    """Device sums: the host sums nothing; each owner takes the copies of its segments as they
    land (any device, any order), an owner of an empty block nothing; the exposed wait runs
    from the last landing to the last owner's sum; a failure wakes a waiting owner."""
    n, rows, fs = 3, 10, 3
    rd = Reducer("items", rows, [0, 4, 4, 10], fs, [2, 3, 5],
                 lambda d, shape: np.zeros(shape, np.float32))
    try:
        assert rd.device_sums and Reducer.__init__.__defaults__[-1] == "device"
        with pytest.raises(ValueError, match="sums"):
            Reducer("items", rows, [0, 10], fs, [2], lambda d, s: np.zeros(s), sums="gpu")
        ports = [rd.port(d) for d in range(n)]
        for h in rd.host:
            h[...] = 1.0
        assert ports[1].take(block=False) is None             # an empty block: nothing to take
        segs = rd.segments
        k0 = [k for k, s in enumerate(segs) if s[2] == 2][0]     # device 2's first segment
        a, b, _ = segs[k0]
        assert ports[2].take(block=False) == []
        ports[1].landed(k0)                  # a peer before the owner: handed over at once
        assert ports[2].take(block=False) == [(a, b, 1)]
        ports[2].landed(k0)
        ports[0].landed(k0)
        assert ports[2].take(block=False) == [(a, b, 2), (a, b, 0)]
        order = [(d, k) for k in reversed(range(len(segs))) for d in range(n) if k != k0]
        for d, k in order:
            ports[d].landed(k)
        got = []
        while (t := ports[2].take(block=True)) is not None:
            got += t
        assert got == [(*segs[k][:2], d) for d, k in order if segs[k][2] == 2]
        got = []
        while (t := ports[0].take(block=True)) is not None:
            got += t
        assert sorted(got) == sorted((*s[:2], e) for s in segs if s[2] == 0 for e in range(n))
        assert all(np.all(h == 1.0) for h in rd.host)           # nothing summed on the host
        import time
        ports[2].summed(time.perf_counter() + 0.5)
        done = rd.finish()
        assert done["sum"] == 0.0 and 0.4 < done["wait"] < 5
        rd.start()
        assert rd.finish() == {"sum": 0.0, "wait": 0.0}
        _assert_failure_wakes(ports[2], ports[0])
    finally:
        rd.close()


def _assert_failure_wakes(waiter, failing):
    """A device failing (``failing.fail``) wakes an owner blocked in ``waiter.take``, which
    raises with the failure's message."""
    err = []
    t = threading.Thread(target=lambda: err.append(_raises(waiter.take, True)))
    t.start()
    failing.fail(ValueError("boom"))
    t.join(5)
    assert err and "boom" in err[0]


def _raises(fn, *args):
    """The message of the error ``fn(*args)`` raises (or None)."""
    try:
        fn(*args)
    except RuntimeError as e:
        return str(e)
    return None


def _fits(devs, R, f, modes, cfg, extra, check=None, iterations=2, sums=SUMS, shares=None):
    """Factors (with biases) after ``iterations`` on one device (``"one"``) and on ``devs``
    with ``modes`` in each way of summing of ``sums`` (``check(engine)`` called on each
    multi-device one)."""
    from clmf.parallel import MultiEngine, make_backend
    X0, Y0 = reference.start_factors(*R.shape, f, 0)
    out = {}
    for key in ("one", *sums):
        e = (make_backend(devs[:1], R, f, [(cfg, cfg)], **extra) if key == "one"
             else MultiEngine(devs, R, f, [(cfg, cfg)] * len(devs), pinned=True,
                              modes=dict(zip(("users", "items"), modes)), reduce_sum=key,
                              shares=shares, **extra))
        try:
            if key != "one" and check is not None:
                check(e)
            e.set_factors("users", X0)
            e.set_factors("items", Y0)
            for _ in range(iterations):
                e.iteration(0.1, "implicit_alpha" not in extra)
            out[key] = (e.get_factors("users", True), e.get_factors("items", True))
        finally:
            e.release()
    return out


def _close(a, b, tol=1e-4):
    """Two fits' factors and biases agree within ``tol`` (relative)."""
    (x1, b1), (y1, c1) = a
    (x2, b2), (y2, c2) = b
    assert rel_err(x2, x1) <= tol and rel_err(y2, y1) <= tol, (rel_err(x2, x1), rel_err(y2, y1))
    assert rel_err(b2, b1) <= tol and rel_err(c2, c1) <= tol


def _agree(out):
    """Each way of summing gives the one-device factors; the two ways the same ones."""
    for key in SUMS:
        if key in out:
            _close(out["one"], out[key])
    if all(k in out for k in SUMS):
        _close(out["host"], out["device"], 1e-6)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_ring_smaller_than_the_block_wraps(cl_device, monkeypatch, mode):
    """A scratch cap leaves each device a ring of summed systems smaller than its block (device
    sums: a ring of the peer's copies as large): the uploads wrap them, waiting for the unpacks
    of the rows they overwrite (device sums: the own rows past the ring's first pass go through
    the host), and segments cut the batches; two devices give the one-device answer in both sum
    modes (f = 7)."""
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
        seg = e.reducers["items"].seg
        assert all(w.batch_rows["items"] % seg or blocks[0][1] % seg for w in e.workers)
        assert all(w.buf["items"]["peers"] == 1 for w in e.workers)
        assert all(e.dplans[d].bytes["staging_items"] == e.dplans[d].bytes["sums_items"]
                   for d in range(2))
    finally:
        e.release()
    for modes in (("replicate", "reduce"), ("reduce", "replicate")):
        _agree(_fits([cl_device] * 2, R, f, modes, cfg, MODES[mode]))


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
        _agree(_fits([cl_device] * 4, data, 3, modes, cfg, MODES[mode], check))


def _reference(R, f, mode, iterations):
    """NumPy's factors and biases after ``iterations`` from the fits' start factors (biased:
    the offset is the ratings' mean)."""
    X0, Y0 = reference.start_factors(*R.shape, f, 0)
    if mode == "biased":
        X, Y, bu, bi, _mu = reference.als_biased(R, f, 0.1, iterations, init=(X0, Y0))
        return (X, bu), (Y, bi)
    X, Y = reference.als(R, f, 0.1, iterations, weighted=mode != "implicit", init=(X0, Y0),
                         implicit_alpha=2.0 if mode == "implicit" else None)
    return (X, np.zeros(len(X))), (Y, np.zeros(len(Y)))


@pytest.mark.parametrize("variant", ["batch+reg:solver=cholesky,batch_rows=5,split=4",
                                     "batch+vec4+syrk:bx=4,ks=2,nnz_batch=5,split=3"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_reduced_side_splits_long_rows(cl_device, monkeypatch, mode, variant):
    """The reduced side's long rows cut into pieces (a forced ``split``): the partial systems
    are the pieces' sums (the combine, without regularisation or Gram), so four devices give
    the one-device factors (and NumPy's) in both sum modes, and the reduced side's launches are
    split on every device (and launched split)."""
    from clmf.engine import reduce as RD
    from clmf.engine.config import KernelConfig
    calls = []

    def counted(*a, **kw):
        calls.append(kw.get("solve"))
        return launch(*a, **kw)
    launch = RD.launch_split_batch
    monkeypatch.setattr(RD, "launch_split_batch", counted)
    f = 5
    R = random_ratings(90, 70, 0.3, seed=37, empty_rows=(4,), empty_cols=(11,))
    extra = dict(MODES[mode])
    if mode == "biased":
        extra["offset"] = float(R.data.mean())
    cfg = KernelConfig.parse(variant)

    def check(e):
        for w in e.workers:
            assert w.splits["items"].active
            assert any(nv for _r, _n, _v, nv in w.launches["items"]), w.launches["items"]
    out = _fits([cl_device] * 4, R, f, ("replicate", "reduce"), cfg, extra, check,
                shares=[3.0, 1.0, 0.5, 2.0])
    _agree(out)
    _close(_reference(R, f, mode, 2), out["device"], 1e-3)
    assert calls and not any(calls)                 # the partials' launches, unsolved


@pytest.mark.parametrize("mode", sorted(MODES))
def test_uneven_blocks_four_devices_match_numpy(cl_device, mode):
    """Four devices of uneven shares (one block several times another's) reduce the items in
    segments that cut batches of 5 rows: both sum modes give NumPy's factors and biases."""
    from clmf.engine.config import KernelConfig
    f = 5
    R = random_ratings(90, 70, 0.15, seed=31, empty_rows=(4,), empty_cols=(11,))
    extra = dict(MODES[mode])
    if mode == "biased":
        extra["offset"] = float(R.data.mean())
    cfg = KernelConfig.parse("batch+reg:solver=cholesky,batch_rows=5")

    def check(e):
        sizes = np.diff(e.plan["items"].bounds)
        assert sizes.max() >= 3 * max(1, sizes.min()), sizes
        assert len(e.reducers["items"].segments) > len(e.workers)
    out = _fits([cl_device] * 4, R, f, ("replicate", "reduce"), cfg, extra, check,
                shares=[4.0, 1.0, 0.5, 2.0])
    _agree(out)
    want = _reference(R, f, mode, 2)
    for key in SUMS:
        _close(want, out[key], 1e-3)


@pytest.mark.parametrize("sums", SUMS)
def test_time_split_reports_the_reduce(cl_device, sums):
    """With profiling, an iteration's split holds the reduce's host sums (the threads' seconds;
    none with device sums, made by the unpack kernels, counted with the packs), the devices'
    copies of the reduced systems and the exposed wait (also ``reduce``). With device
    sums an owner's own rows never reach the host (its host array's rows stay zero), and none
    is left out of the ring's first pass here."""
    from clmf.engine.config import KernelConfig
    from clmf.parallel import MultiEngine
    R = random_ratings(120, 90, 0.15, seed=29)
    cfg = KernelConfig.parse("batch+reg:solver=cholesky,batch_rows=16")
    e = MultiEngine([cl_device] * 2, R, 6, [(cfg, cfg)] * 2, profile=True,
                    modes={"users": "replicate", "items": "reduce"}, reduce_sum=sums)
    try:
        X0, Y0 = reference.start_factors(*R.shape, 6, 0)
        e.set_factors("users", X0)
        e.set_factors("items", Y0)
        e.iteration(0.1, True)
        sp_ = e.time_split()
        assert (sp_["reduce_sum"] > 0) == (sums == "host") and sp_["reduce_copies"] > 0
        assert 0 <= sp_["reduce_wait"] == sp_["reduce"] <= sp_["wall"]
        assert all(w.stage_times["pack"] > 0 for w in e.workers)
        rd = e.reducers["items"]
        for d, w in enumerate(e.workers):
            a, b = w.share.blocks["items"]
            assert b - a <= w.buf["items"]["ring"]
            own, other = rd.host[d][a:b], np.delete(rd.host[d], np.s_[a:b], axis=0)
            assert np.any(other != 0)
            assert np.all(own == 0) == (sums == "device")
            assert ("T" in w.buf["items"]) == (sums == "device")
        e.reset_times()
        assert e.time_split()["reduce_sum"] == 0.0
    finally:
        e.release()


def test_reduce_sum_is_checked():
    """An unknown way of summing is refused before any device work."""
    from clmf.parallel import MultiEngine
    with pytest.raises(ValueError, match="reduce_sum"):
        MultiEngine([], random_ratings(5, 5), 2, [], reduce_sum="gpu")
