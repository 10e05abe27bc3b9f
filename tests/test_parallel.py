"""clmf.parallel: partitioning, memory plans, layouts, and fits over several devices or streamed,
checked against the one-device fit (factors within 1e-4 relative, RMSE within 0.1 %)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DEVICES, IN_CI, random_ratings, rel_err

import clmf
from clmf import reference
from clmf.parallel import (
    Layout,
    SideLayout,
    balanced_blocks,
    choose_modes,
    chunk_rows,
    make_plan,
    plan_device,
    transpose_csr,
)

HERE = pathlib.Path(__file__).resolve().parent


# ----- partitioning (no device) ------------------------------------------------------------
def test_balanced_blocks_balance_work_not_rows():
    rng = np.random.default_rng(0)
    counts = (rng.pareto(1.2, 10_000) * 20).astype(np.int64) + 1
    for parts in (1, 2, 3, 4, 7):
        b = balanced_blocks(counts, parts, f=30)
        assert b.dtype == np.int64 and b[0] == 0 and b[-1] == counts.size
        assert np.all(np.diff(b) >= 0)
        w = counts + 10.0
        loads = [w[b[d]:b[d + 1]].sum() for d in range(parts)]
        # within one row's work of the ideal share
        assert max(loads) - min(loads) <= 2 * w.max() + 1e-9, (parts, loads)
    # shares: a device twice as fast gets about twice the work
    b = balanced_blocks(np.ones(3000, np.int64), 2, shares=[2, 1])
    assert abs(b[1] - 2000) <= 1


def test_balanced_blocks_more_parts_than_rows_and_errors():
    b = balanced_blocks([5, 0, 7], 5)
    assert b[0] == 0 and b[-1] == 3 and np.all(np.diff(b) >= 0)
    with pytest.raises(ValueError, match="parts"):
        balanced_blocks([1, 2], 0)
    with pytest.raises(ValueError, match="shares"):
        balanced_blocks([1, 2], 2, shares=[1, -1])


def test_partition_past_2_31_ratings_is_int64():
    # a Hugewiki-sized layout: 3.1e9 ratings over 50M rows, only its counts
    counts = np.full(1000, 3_100_000, np.int64)
    counts[::7] = 3_300_000
    b = balanced_blocks(counts, 4)
    cum = np.r_[0, np.cumsum(counts)]
    assert cum[-1] > 2**31
    shares = np.diff(cum[b])
    assert shares.sum() == cum[-1] and np.all(np.abs(shares - cum[-1] / 4) <= counts.max())
    indptr = cum.astype(np.int64)
    chunks = chunk_rows(indptr, 700, 1000, max_nnz=2**31 - 1, max_rows=10**6)
    assert chunks[0][0] == 700 and chunks[-1][1] == 1000
    for a, z in chunks:
        assert indptr[z] - indptr[a] <= 2**31 - 1 or z - a == 1
    assert all(c[1] == d[0] for c, d in zip(chunks, chunks[1:]))


def test_chunk_rows_keeps_long_rows_whole():
    indptr = np.r_[0, np.cumsum([3, 100, 2, 2, 2, 50])].astype(np.int64)
    ch = chunk_rows(indptr, 0, 6, max_nnz=10, max_rows=100)
    assert ch == [(0, 1), (1, 2), (2, 5), (5, 6)]
    assert chunk_rows(indptr, 2, 5, max_nnz=100, max_rows=2) == [(2, 4), (4, 5)]


def test_choose_modes_rule():
    # Netflix at f=100: replicate both factors
    assert choose_modes((480_189, 17_770), 100, 100, 2) == {"users": "replicate",
                                                            "items": "replicate"}
    # Hugewiki: X (50M × 100) is reduced in the items' half-step, Y replicated
    assert choose_modes((50_082_604, 39_780), 100, 100, 2) == {"users": "replicate",
                                                               "items": "reduce"}
    assert choose_modes((50_082_604, 39_780), 100, 100, 1)["items"] == "replicate"
    plan = make_plan([3, 1, 2], [4, 2], 2, 4)
    assert plan.nnz == 6 and plan["users"].owner(2) == 1 and "users" in plan.describe()
    with pytest.raises(ValueError, match="disagree"):
        make_plan([1], [2], 1, 4)


# ----- memory plan (no device) -------------------------------------------------------------
def _blocks(R):
    L = Layout.from_csr(R)
    return L, {s: (L[s].indptr, 0, L[s].rows) for s in ("users", "items")}


def test_memory_plan_resident_streamed_and_error():
    R = random_ratings(300, 200, 0.1, seed=4)
    L, blocks = _blocks(R)
    kw = dict(f=8, ldf=8, itemsize=4, blocks=blocks, factor_rows={"users": 300, "items": 200})
    p = plan_device("dev", 1 << 30, 1 << 28, **kw)
    assert p.streamed == [] and p.total <= p.budget
    assert p.bytes["ratings_users"] >= L.nnz * 8
    # a cap below the data's size streams, in several chunks, within the cap
    cap = p.total - p.bytes["ratings_users"] // 2
    q = plan_device("dev", 1 << 30, 1 << 28, max_device_memory=cap, **kw)
    assert q.streamed and q.total <= cap
    for s in q.streamed:
        ch = q.sides[s].chunks
        assert len(ch) >= 2 and ch[0][0] == 0 and ch[-1][1] == L[s].rows
        assert q.sides[s].buffers == 2
    # even one chunk of the longest row cannot fit: a typed error naming the bytes needed
    with pytest.raises(clmf.DeviceMemoryError, match=r"needs at least [\d,]+ bytes"):
        plan_device("dev", 1 << 30, 1 << 28, max_device_memory=17_000, **kw)
    with pytest.raises(clmf.DeviceMemoryError, match="largest allocation"):
        plan_device("dev", 1 << 30, 1 << 10, **kw)
    # a fraction of the device's memory
    r = plan_device("dev", 1 << 30, 1 << 28, max_device_memory=0.5, **kw)
    assert r.budget == 1 << 29


def test_memory_plan_on_a_layout_past_2_31():
    # the row pointers of a 3-billion-rating side, the block of the last rows
    counts = np.full(3000, 1_000_000, np.int64)
    indptr = np.r_[0, np.cumsum(counts)].astype(np.int64)
    blocks = {"users": (indptr, 2500, 3000)}
    p = plan_device("dev", 4 << 30, 1 << 30, f=4, ldf=4, itemsize=4, blocks=blocks,
                    factor_rows={"users": 3000, "items": 10})
    m = p.sides["users"]
    assert m.nnz == 500 * 1_000_000 and not m.resident      # 4 GB of ratings: streamed
    assert m.chunks[0][0] == 2500 and m.chunks[-1][1] == 3000 and len(m.chunks) >= 3
    assert m.chunk_nnz * 4 <= p.max_alloc and p.total <= p.budget
    assert sum(indptr[b] - indptr[a] for a, b in m.chunks) == m.nnz


# ----- layouts -----------------------------------------------------------------------------
def test_transpose_matches_scipy():
    R = random_ratings(120, 70, 0.15, seed=5, empty_rows=(3,), empty_cols=(9,))
    L = Layout.from_csr(R)
    C = R.tocsc()
    assert np.array_equal(L.items.indptr, C.indptr)
    assert np.array_equal(L.items.indices, C.indices)
    assert np.array_equal(L.items.data, C.data.astype(np.float32))
    T = transpose_csr(L.items, 120, threads=3)
    assert np.array_equal(T.indptr, L.users.indptr) and np.array_equal(T.indices, R.indices)


def test_synthetic_layout_is_consistent():
    from clmf.parallel.generate import LARGE_PRESETS, synthetic_layout
    assert LARGE_PRESETS["hugewiki"] == (50_082_604, 39_780, 3_101_144_313)
    L = synthetic_layout("hugewiki", 2e-5, threads=2)
    m, n = L.shape
    assert n == 39_780 and m == round(50_082_604 * 2e-5)
    R = sp.csr_matrix((L.users.data, L.users.indices, L.users.indptr), shape=L.shape)
    R.has_canonical_format = False
    assert R.has_sorted_indices and R.nnz == L.nnz and L.nnz > 0.9 * 3_101_144_313 * 2e-5
    C = R.tocsc()
    assert np.array_equal(C.indptr, L.items.indptr) and np.array_equal(C.indices, L.items.indices)
    assert set(np.unique(L.users.data)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    again = synthetic_layout("hugewiki", 2e-5, threads=1)
    assert np.array_equal(again.users.indices, L.users.indices)


# ----- fits on one device: streamed, and the error before any device work ------------------
@pytest.mark.parametrize("mode", ["explicit", "implicit", "biased"])
def test_streamed_fit_matches_resident(cl_device, mode):
    R = random_ratings(260, 150, 0.1, seed=6, empty_rows=(2,), empty_cols=(4,))
    extra = {"implicit": dict(feedback="implicit", alpha=2.0), "biased": dict(biases=True),
             "explicit": {}}[mode]
    kw = dict(factors=8, iterations=1, solver="cholesky", random_state=0, device=cl_device,
              variant="batch", **extra)
    one = clmf.ALS(**kw).fit(R, show_progress=False)
    assert "streamed" not in one.memory_              # the single-device engine, unchanged
    # below the data's size (the engine's metrics buffers are not part of the streamed plan)
    cap = (one.memory_["total"] - one.memory_.get("metrics", 0)
           - (one.memory_["ratings_users"] + one.memory_["ratings_items"]) // 3)
    st = clmf.ALS(max_device_memory=cap, **kw).fit(R, show_progress=False)
    assert st.memory_["streamed"][0], st.memory_     # it did stream
    assert st.memory_["total"] <= cap
    assert rel_err(st.user_factors_, one.user_factors_) <= 1e-4
    assert rel_err(st.item_factors_, one.item_factors_) <= 1e-4
    if mode != "implicit":
        a = clmf.ALS(max_device_memory=cap, **{**kw, "iterations": 3}).fit(R, show_progress=False)
        b = clmf.ALS(**{**kw, "iterations": 3}).fit(R, show_progress=False)
        assert abs(a.rmse(R) - b.rmse(R)) <= 1e-3 * b.rmse(R)
    # and matches the NumPy reference half-steps
    if mode == "explicit":
        X0, Y0 = reference.start_factors(*R.shape, 8, 0)
        X1 = reference.half_step(R, Y0, 0.1)
        Y1 = reference.half_step(R.T.tocsr(), X1, 0.1)
        assert rel_err(st.user_factors_, X1) <= 1e-4 and rel_err(st.item_factors_, Y1) <= 1e-4


@pytest.mark.parametrize("pinned,modes", [(False, None), (True, None),
                                          (False, ("reduce", "replicate")),
                                          (True, ("replicate", "reduce"))])
def test_streamed_chunks_pinned_or_not(cl_device, pinned, modes):
    """Streaming through page-locked staging arrays (the GPU default) or straight from the
    host arrays gives the resident answer; several chunks per side, two workers, the
    replicated half-step and the reduce mode's partial systems (both go through
    ``Engine._batches``)."""
    from clmf.engine.config import KernelConfig
    from clmf.parallel import MultiEngine
    R = random_ratings(300, 160, 0.1, seed=12, empty_rows=(1,))
    cfg = KernelConfig.parse("batch+reg:solver=cholesky")
    X0, Y0 = reference.start_factors(*R.shape, 6, 0)
    got = []
    md = None if modes is None else dict(zip(("users", "items"), modes))
    for kw in (dict(modes=md), dict(force_stream=("users", "items"), pinned=pinned, modes=md)):
        e = MultiEngine([cl_device] * 2, R, 6, [(cfg, cfg)] * 2, **kw)
        try:
            if "force_stream" in kw:
                assert all(len(p.sides[s].chunks) >= 3 for p in e.dplans for s in p.streamed)
                assert all(p.streamed == ["users", "items"] for p in e.dplans)
            e.set_factors("users", X0)
            e.set_factors("items", Y0)
            e.iteration(0.1, True)
            e.iteration(0.1, True)
            got.append((e.get_factors("users"), e.get_factors("items")))
        finally:
            e.release()
    assert rel_err(got[1][0], got[0][0]) <= 1e-6 and rel_err(got[1][1], got[0][1]) <= 1e-6


def test_streamed_batches_wait_for_the_buffer_sets_previous_chunk():
    """``Engine._batches`` (no device): every row of a side once, batch by batch within
    its chunk; a streamed chunk is uploaded into the buffer sets in turn, each upload waiting
    for the event the caller gave as the last batch's ``done`` of the set's previous chunk,
    and only a chunk's first batch waits for its upload; a resident side runs its planned
    launches (split or not) and is not uploaded."""
    from types import SimpleNamespace

    from clmf.engine import Engine
    chunks = [(0, 5), (5, 9), (9, 9), (9, 16), (16, 20)]
    for resident in (False, True):
        uploads = []

        def upload(side, bset, chunk, wait_for=None):
            uploads.append((bset["name"], chunk, wait_for))
            return f"up{chunk}"
        sets = [{"name": k, "event": None} for k in range(2)]
        w = SimpleNamespace(
            dplan=SimpleNamespace(sides={"users": SimpleNamespace(
                chunks=chunks[:1] if resident else chunks, resident=resident, batch_rows=3,
                r0=0)}),
            buf={"users": {"sets": sets}}, _upload_chunk=upload,
            launches={"users": [(0, 3, 0, 0), (3, 2, 0, 4)]})
        events, rows = [], []
        for b in Engine._batches(w, "users", events):
            rows.extend(range(b.r0 + b.row0, b.r0 + b.row0 + b.rows))
            assert b.rows <= 3
            b.done = f"done{b.r0 + b.row0}"
            if resident:
                assert b.wait is None and b.bset is w.buf["users"]
                assert (b.v0, b.nv) == ((0, 0) if b.row0 == 0 else (0, 4))
            else:
                assert b.wait == ([f"up{uploads[-1][1]}"] if b.row0 == 0 else None)
        assert rows == list(range(5 if resident else 20))
        if resident:
            assert uploads == [] and events == []
            continue
        assert [u[:2] for u in uploads] == [(k % 2, c) for k, c in enumerate(chunks)]
        # chunk c waits for the last batch of chunk c-2 (same set); the empty chunk has none
        assert [u[2] for u in uploads] == [None, None, ["done3"], ["done8"], None]
        assert events == [f"up{c}" for c in chunks]
        assert sets[0]["event"] == "done19" and sets[1]["event"] == "done15"


def test_plan_that_cannot_fit_raises_before_device_work(cl_device, monkeypatch):
    from clmf.parallel import backend

    def no_worker(*a, **k):
        raise AssertionError("a device worker was created")

    monkeypatch.setattr(backend, "device_engine", no_worker)
    R = random_ratings(200, 120, 0.2, seed=7)
    with pytest.raises(clmf.DeviceMemoryError, match=r"bytes.*max_device_memory"):
        clmf.ALS(64, iterations=1, device=cl_device,     # the factors alone take 82 KB
                 max_device_memory=90_000).fit(R, show_progress=False)


def test_bad_max_device_memory(cl_device):
    R = random_ratings(30, 20, 0.3, seed=15)
    with pytest.raises(ValueError, match="max_device_memory"):
        clmf.ALS(4, iterations=1, device=cl_device, max_device_memory=-1).fit(
            R, show_progress=False)


def test_device_lists_and_all():
    from clmf.parallel import select_devices
    if not DEVICES:
        pytest.skip("no OpenCL device")
    cpus = select_devices("cpu:all")
    assert len(cpus) == sum(1 for d in DEVICES if "CPU" in str(d.type) or d.type == 2) or cpus
    assert select_devices([cpus[0]]) == [cpus[0]]
    with pytest.raises(ValueError, match="named twice"):
        select_devices([cpus[0], cpus[0]])
    with pytest.raises(ValueError, match="device type"):
        select_devices("tpu:all")
    with pytest.raises(ValueError, match="empty"):
        select_devices([])


# ----- several workers on one device: every exchange and the reduce mode, on every device --
@pytest.mark.parametrize("mode", ["explicit", "implicit", "biased"])
@pytest.mark.parametrize("modes", [("replicate", "replicate"), ("replicate", "reduce"),
                                   ("reduce", "replicate")])
def test_workers_replicate_and_reduce_match_engine(cl_device, mode, modes):
    """Three workers sharing one device (each its own queues and buffers) exchange through
    host memory exactly as three devices do; replicating and reducing give the one-device
    answer (factors 1e-4 relative after two iterations, squared error 0.1 %)."""
    from clmf.engine.config import KernelConfig
    from clmf.parallel import MultiEngine, make_backend
    R = random_ratings(240, 110, 0.1, seed=9, empty_rows=(4,), empty_cols=(7,))
    m, n = R.shape
    cfg = KernelConfig.parse("batch+reg:solver=cholesky")
    kw = dict(implicit_alpha=2.0 if mode == "implicit" else None, biased=mode == "biased",
              offset=3.0 if mode == "biased" else 0.0)
    X0, Y0 = reference.start_factors(m, n, 6, 0)
    C = R.tocoo()
    out = []
    for devs, md in (([cl_device], None),
                     ([cl_device] * 3, dict(zip(("users", "items"), modes)))):
        if md is None:
            e = make_backend(devs, R, 6, [(cfg, cfg)], **kw)
        else:    # page-locked exchange and partial arrays, as on GPUs
            e = MultiEngine(devs, R, 6, [(cfg, cfg)] * len(devs), modes=md, pinned=True, **kw)
        try:
            assert isinstance(e, MultiEngine) == (len(devs) > 1)
            if md:
                assert (e.plan["users"].mode, e.plan["items"].mode) == modes
            e.set_factors("users", X0)
            e.set_factors("items", Y0)
            for _ in range(2):
                e.iteration(0.1, mode != "implicit")
            e.finish()
            se = e.squared_error("train", C.row, C.col, C.data)[0]
            # a second call reuses the triples kept on the device
            assert e.squared_error("train", C.row, C.col, C.data)[0] == pytest.approx(se)
            out.append((e.get_factors("users", True), e.get_factors("items", True), se))
        finally:
            e.release()
    (x1, bu1), (y1, bi1), se1 = out[0]
    (x3, bu3), (y3, bi3), se3 = out[1]
    assert rel_err(x3, x1) <= 1e-4 and rel_err(y3, y1) <= 1e-4
    assert abs(se3 - se1) <= 1e-3 * se1
    if mode == "biased":
        assert rel_err(bu3, bu1) <= 1e-4 and rel_err(bi3, bi1) <= 1e-4


@pytest.mark.parametrize("variant,mode", [
    ("batch+reg:solver=cg", "explicit"), ("batch+reg:solver=fusedcg", "implicit"),
    ("batch+reg:solver=cg", "biased"),
    ("batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=8,nnz_batch=2", "explicit"),
    ("batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=8,nnz_batch=2", "biased")])
def test_workers_with_cg_solvers_match_engine(cl_device, variant, mode):
    """The CG solvers warm-start from the factor rows at their offset (``xoff``) in each
    worker's buffer: two workers give the one-device answer."""
    from clmf.engine.config import KernelConfig
    from clmf.parallel import MultiEngine, make_backend
    R = random_ratings(200, 90, 0.12, seed=13)
    cfg = KernelConfig.parse(variant)
    kw = dict(implicit_alpha=2.0 if mode == "implicit" else None, biased=mode == "biased",
              offset=3.0 if mode == "biased" else 0.0)
    X0, Y0 = reference.start_factors(*R.shape, 6, 0)
    out = []
    for devs in ([cl_device], [cl_device] * 2):
        e = make_backend(devs, R, 6, [(cfg, cfg)] * len(devs), **kw)
        try:
            assert isinstance(e, MultiEngine) == (len(devs) > 1)
            e.set_factors("users", X0)
            e.set_factors("items", Y0)
            for _ in range(2):
                e.iteration(0.1, mode != "implicit")
            out.append((e.get_factors("users"), e.get_factors("items")))
        finally:
            e.release()
    assert rel_err(out[1][0], out[0][0]) <= 1e-4 and rel_err(out[1][1], out[0][1]) <= 1e-4


# ----- 64-bit offsets end to end: a block whose ratings start past 2^31 ---------------------
def test_worker_on_a_block_past_2_31(cl_device, tmp_path):
    """Three ghost rows hold 2^31 + 12,345 ratings (a sparse memory-mapped file: nothing is
    written there); the device owns the 40 real users behind them, whose entries start at that
    offset. Its half-step must read them from there and solve them as the reference does."""
    from clmf.engine.config import KernelConfig
    from clmf.parallel import Exchange, device_engine
    from clmf.parallel.partition import Plan, SidePlan
    R = random_ratings(40, 30, 0.3, seed=8)
    base = 2**31 + 12_345
    ghost = np.array([2**30, 2**30, base - 2**31], np.int64)
    indptr = np.r_[0, np.cumsum(np.r_[ghost, np.diff(R.indptr)])].astype(np.int64)
    total = int(indptr[-1])
    try:
        idx = np.memmap(tmp_path / "indices", dtype=np.int32, mode="w+", shape=(total,))
        val = np.memmap(tmp_path / "data", dtype=np.float32, mode="w+", shape=(total,))
    except OSError as e:
        pytest.skip(f"no sparse 9 GB file here: {e}")
    idx[base:] = R.indices
    val[base:] = R.data
    assert indptr[3] == base > 2**31
    users = SideLayout(indptr, idx, val)
    items = Layout.from_csr(R).items              # the real items (the worker's item block)
    L = Layout((43, 30), users, items)
    plan = Plan((43, 30), total, 2, {"users": SidePlan("users", np.array([0, 3, 43], np.int64)),
                                     "items": SidePlan("items", np.array([0, 0, 30], np.int64))})
    cfg = KernelConfig.parse("batch:solver=cholesky")
    dplan = plan_device("dev", 1 << 30, 1 << 28, f=6, ldf=cfg.ldf(6), itemsize=4,
                        blocks={"users": (indptr, 3, 43), "items": (items.indptr, 0, 30)},
                        factor_rows={"users": 43, "items": 30})
    w = device_engine(1, cl_device, L, plan, dplan, 6, cfg.ldf(6), {"users": cfg, "items": cfg})
    try:
        _X0, Y0 = reference.start_factors(40, 30, 6, 0)
        host = np.zeros((30, cfg.ldf(6)), np.float32)
        host[:, :6] = Y0
        w.write_rows("items", host, 0, 30)
        ex = Exchange("users", np.zeros((43, cfg.ldf(6)), np.float32), 2, needed=False)
        w.half_step("users", 0.1, True, ex)
        out = np.zeros((43, cfg.ldf(6)), np.float32)
        w.read_rows("users", out, 3, 43)
    finally:
        w.release()
    X1 = reference.half_step(R, Y0, 0.1)
    assert rel_err(out[3:, :6], X1) <= 1e-4


# ----- several devices (subprocess: POCL_DEVICES must be set before OpenCL starts) ---------
def _pocl_available():
    return any("portable" in d.platform.name.lower() for d in DEVICES)


def _intel_available():
    return any("intel" in d.platform.name.lower() for d in DEVICES)


def _run_check(pocl_devices, *specs):
    env = dict(os.environ, POCL_DEVICES=pocl_devices)
    res = subprocess.run([sys.executable, str(HERE / "multidev_check.py"), *specs], env=env,
                         capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    fits = [r for r in rows if "reduce" not in r]
    assert len(fits) == 3 * len(specs), res.stdout + res.stderr[-2000:]
    # each side reduced by a MultiEngine on the same devices, in each mode, summed on the host,
    # on the devices and on the devices through a small ring
    assert len(rows) - len(fits) == 18 * len(specs), res.stdout + res.stderr[-2000:]
    return rows


def _check_rows(rows, n_devices):
    for r in rows:
        if "reduce" in r:
            assert r["devices"] == n_devices and r["x"] <= 1e-4 and r["y"] <= 1e-4, r
            assert r.get("bias", 0.0) <= 1e-4 and r.get("vs_host", 0.0) <= 1e-6, r
            continue
        assert isinstance(r["devices"], list) and len(r["devices"]) == n_devices, r
        assert r["x"] <= 1e-4 and r["y"] <= 1e-4, r
        if "rmse_rel" in r:
            assert r["rmse_rel"] <= 1e-3, r
        if "bias" in r:
            assert r["bias"] <= 1e-4, r
        assert r["recommend"] == 5 and r["saved"]


def _need(ok, what):
    if not ok:
        if IN_CI:
            pytest.fail(f"{what} is missing (CI=true requires it)")
        pytest.skip(f"{what} not available")


def test_two_pocl_devices_match_one():
    _need(_pocl_available(), "PoCL")
    _check_rows(_run_check("pthread pthread", '["0:0", "0:1"]'), 2)


def test_pocl_and_intel_together_match_one():
    _need(_pocl_available() and _intel_available(), "PoCL and Intel's CPU runtime")
    rows = _run_check("pthread", '["Portable", "Intel"]')
    _check_rows(rows, 2)
    # each device its own tuning lookup
    assert all(len(r["configs"]) == 2 for r in rows if "reduce" not in r)


def test_four_pocl_devices_match_one():
    _need(_pocl_available(), "PoCL")
    _check_rows(_run_check("pthread pthread pthread pthread", '["0:0", "0:1", "0:2", "0:3"]'), 4)


def test_scaling_table(cl_device):
    from clmf.parallel.scaling import render_scaling, scaling_rows
    R = random_ratings(150, 60, 0.15, seed=14)
    rows = scaling_rows([cl_device, cl_device], R, 4, iterations=2, budget_s=30)
    assert [r["devices"] for r in rows] == [1, 2]
    assert rows[0]["speedup"] == 1.0 and rows[0]["backend"] == "Engine"
    assert rows[1]["backend"] == "MultiEngine" and 0 <= rows[1]["exchange_share"] <= 1
    table = render_scaling(rows, "t")
    assert "| devices | f | s/it | speedup | efficiency | exchange share |" in table
    assert table.count("\n| ") >= 3


def test_reduce_mode_and_the_fused_cg():
    """The reduce mode solves the summed hermitians, which the fused CG never builds: where the
    rule picks it for such a side, that side replicates; a caller's reduce is refused, naming
    the side and the device (no silent swap of the solver)."""
    from clmf.engine.config import KernelConfig
    from clmf.errors import InvalidConfigError
    from clmf.parallel import fit_modes
    cg = KernelConfig.parse("batch+reg:solver=cg")
    fused = KernelConfig.parse("batch+reg:solver=fusedcg")
    shape = (50, 100_000)            # few users, many items: the rule reduces the users' side
    rule = {"users": "reduce", "items": "replicate"}
    assert fit_modes(shape, 8, 8, 2, [(cg, cg)] * 2) == rule
    assert fit_modes(shape, 8, 8, 2, [(cg, cg), (fused, cg)]) == {
        "users": "replicate", "items": "replicate"}
    assert fit_modes(shape, 8, 8, 2, [(cg, fused)] * 2) == rule     # items replicate anyway
    with pytest.raises(InvalidConfigError, match="fused CG") as e:
        fit_modes(shape, 8, 8, 2, [(cg, cg), (fused, cg)], rule)
    assert (e.value.side, e.value.device_index, e.value.reason) == ("users", 1, "reduce")
    assert fit_modes(shape, 8, 8, 1, [(fused, fused)], rule) == {
        "users": "replicate", "items": "replicate"}


@pytest.mark.parametrize("modes", [("replicate", "reduce"), ("reduce", "replicate")])
def test_reduce_mode_in_many_batches_matches_engine(cl_device, modes):
    """Batches of 16 rows take the reduce mode's two packed buffers in turn (a batch's packed
    systems copied out while the next batch runs), in segments shorter than a batch (copies cut
    at their ends, summed and uploaded to the owner while the devices compute): two devices give
    the one-device answer."""
    from clmf.engine.config import KernelConfig
    from clmf.parallel import MultiEngine, make_backend
    R = random_ratings(150, 120, 0.12, seed=21, empty_rows=(5,))
    cfg = KernelConfig.parse("batch+reg:solver=cholesky,batch_rows=16")
    X0, Y0 = reference.start_factors(*R.shape, 6, 0)
    out = []
    for devs in ([cl_device], [cl_device] * 2):
        e = (make_backend(devs, R, 6, [(cfg, cfg)]) if len(devs) == 1 else
             MultiEngine(devs, R, 6, [(cfg, cfg)] * 2, modes=dict(zip(("users", "items"), modes))))
        try:
            if len(devs) > 1:
                s = "users" if modes[0] == "reduce" else "items"
                assert all(w.batch_rows[s] == 16 and "P2" in w.buf[s] and "A2" not in w.buf[s]
                           for w in e.workers)
                segs = e.reducers[s].segments      # some of them across two batches
                assert len(segs) > 4 and any(a // 16 != (b - 1) // 16 for a, b, _o in segs)
            e.set_factors("users", X0)
            e.set_factors("items", Y0)
            for _ in range(2):
                e.iteration(0.1, True)
            out.append((e.get_factors("users"), e.get_factors("items")))
        finally:
            e.release()
    assert rel_err(out[1][0], out[0][0]) <= 1e-4 and rel_err(out[1][1], out[0][1]) <= 1e-4


def test_float16_exchange_keeps_the_rmse(cl_device):
    """exchange_dtype="float16": the solved rows cross between devices in half precision
    (converted on the devices, half the host array's bytes); the RMSE stays within 0.1 % of the
    float32 exchange and the factors close to it, but not equal (rows really were rounded)."""
    from clmf.engine.config import KernelConfig
    from clmf.parallel import MultiEngine
    R = random_ratings(220, 130, 0.1, seed=17)
    C = R.tocoo()
    cfg = KernelConfig.parse("batch+reg:solver=cholesky,batch_rows=32")
    X0, Y0 = reference.start_factors(*R.shape, 6, 0)
    out = []
    for dt in (None, "float16"):
        e = MultiEngine([cl_device] * 2, R, 6, [(cfg, cfg)] * 2, exchange_dtype=dt,
                        modes={"users": "replicate", "items": "replicate"})
        try:
            assert e.host["users"].dtype == (np.float16 if dt else np.float32)
            e.set_factors("users", X0)
            e.set_factors("items", Y0)
            for _ in range(3):
                e.iteration(0.1, True)
            se, n = e.squared_error("train", C.row, C.col, C.data)
            out.append((np.sqrt(se / n), e.get_factors("users"), e.get_factors("items")))
        finally:
            e.release()
    (r32, x32, y32), (r16, x16, y16) = out
    assert abs(r16 - r32) <= 1e-3 * r32
    assert 0 < rel_err(x16, x32) <= 1e-2 and 0 < rel_err(y16, y32) <= 1e-2
    with pytest.raises(ValueError, match="exchange_dtype"):
        MultiEngine([cl_device] * 2, R, 6, [(cfg, cfg)] * 2, exchange_dtype="bf16")


def test_resident_side_reads_rows_back_after_all_its_kernels(cl_device, monkeypatch):
    """A resident side's half-step enqueues every launch before the first read-back of solved
    rows (a driver that holds a copy's enqueue call must not starve the device of kernels),
    publishes every batch's rows, and still gives the one-device answer; the singular-row flag
    is reset by a fill each half-step (no host copy)."""
    from clmf.engine import core
    from clmf.engine.config import KernelConfig
    from clmf.parallel import MultiEngine, make_backend
    R = random_ratings(300, 90, 0.12, seed=4)
    m, n = R.shape
    cfg = KernelConfig.parse("batch+reg:solver=cholesky,batch_rows=16")
    X0, Y0 = reference.start_factors(m, n, 5, 1)
    log = []
    launch, read = core.launch_batch, core.Engine.read_rows
    fills = []
    fill = core.Engine.reset_status

    def spy_launch(*a, **kw):
        log.append("launch")
        return launch(*a, **kw)

    def spy_read(self, side, host, r0, r1, blocking=True, wait_for=None):
        log.append(("read", r1 - r0))
        return read(self, side, host, r0, r1, blocking, wait_for)

    def spy_fill(self):
        fills.append(self.index)
        return fill(self)
    out = []
    for devs in ([cl_device], [cl_device] * 2):
        e = (make_backend(devs, R, 5, [(cfg, cfg)]) if len(devs) == 1 else
             MultiEngine(devs, R, 5, [(cfg, cfg)] * 2, modes={"users": "replicate",
                                                              "items": "replicate"}))
        try:
            e.set_factors("users", X0)
            e.set_factors("items", Y0)
            if len(devs) == 2:
                assert all(w.dplan.sides[s].resident for w in e.workers for s in ("users",
                                                                                 "items"))
                monkeypatch.setattr(core, "launch_batch", spy_launch)
                monkeypatch.setattr(core.Engine, "read_rows", spy_read)
                monkeypatch.setattr(core.Engine, "reset_status", spy_fill)
                # one device's half-step alone, so that its calls are in order
                from clmf.parallel.worker import Exchange
                ex = Exchange("users", e.host["users"], 2, needed=True)
                w = e.workers[0]
                ex.finish(1)              # the other device published nothing
                w.half_step("users", 0.1, True, ex)
                reads = [x for x in log if x != "launch"]
                assert log.count("launch") >= 3 and len(reads) == log.count("launch")
                assert log.index(reads[0]) == log.count("launch")   # all launches first
                mine = w.dplan.sides["users"]      # the rows this device solves
                assert sum(x[1] for x in reads) == mine.r1 - mine.r0
                assert ex.chunks[-1][2] == mine.r1
                assert fills == [w.index]
                monkeypatch.undo()
            for _ in range(2):
                e.iteration(0.1, True)
            e.finish()
            out.append((e.get_factors("users"), e.get_factors("items")))
        finally:
            e.release()
    assert rel_err(out[1][0], out[0][0]) <= 1e-4 and rel_err(out[1][1], out[0][1]) <= 1e-4


def test_published_chunks_coalesce():
    """Adjacent published row ranges of one device become one upload; ranges of different
    devices stay apart even where adjacent (a Dask worker's host rows are one array per
    device), as do gaps."""
    from clmf.engine.blocks import coalesce
    assert coalesce([]) == []
    assert coalesce([(1, 10, 20), (0, 0, 10), (2, 25, 30), (1, 20, 22)]) == [
        (0, 10), (10, 22), (25, 30)]
    assert coalesce([(0, 5, 6), (0, 0, 5), (0, 7, 9)]) == [(0, 6), (7, 9)]


def test_resident_launches_interleaved_from_one_thread(cl_device, monkeypatch):
    """Resident sides: the calling thread launches the devices' batches in turn (each device's
    first batch before any second one), the devices' threads only wait and exchange; a launch
    that fails on one device is raised from the half-step and no device hangs."""
    import threading

    from clmf.engine import core
    from clmf.engine.config import KernelConfig
    from clmf.parallel import MultiEngine
    R = random_ratings(300, 90, 0.12, seed=5)
    m, n = R.shape
    cfg = KernelConfig.parse("batch+reg:solver=cholesky,batch_rows=16")
    X0, Y0 = reference.start_factors(m, n, 5, 2)
    e = MultiEngine([cl_device] * 3, R, 5, [(cfg, cfg)] * 3,
                    modes={"users": "replicate", "items": "replicate"})
    launch = core.launch_batch
    log = []
    fail_at = [None]

    def spy(kern, q, *a, **kw):
        dev = next(w.index for w in e.workers if w.queue == q)
        log.append((threading.get_ident(), dev))
        if fail_at[0] is not None and len(log) == fail_at[0]:
            raise RuntimeError("planted launch failure")
        return launch(kern, q, *a, **kw)
    try:
        e.set_factors("users", X0)
        e.set_factors("items", Y0)
        monkeypatch.setattr(core, "launch_batch", spy)
        e.half_step("users", 0.1, True)
        me = threading.get_ident()
        assert {t for t, _d in log} == {me}
        devs = [d for _t, d in log]
        assert devs[:3] == [0, 1, 2] and devs.count(0) >= 3
        log.clear()
        fail_at[0] = 5
        with pytest.raises(RuntimeError, match="planted launch failure|another device failed"):
            e.half_step("items", 0.1, True)
    finally:
        monkeypatch.undo()
        e.release()
