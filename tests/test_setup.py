"""The fit's set-up path (issue 16): canonical CSR input taken without copies, the items' CSR
transposed on the device, the training error read from the device's CSR."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from clmf.data.validation import check_ratings


def _random_csr(m, n, nnz, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, m * n, size=nnz))
    vals = rng.integers(1, 6, size=keys.size).astype(dtype)
    return sp.csr_matrix((vals, (keys // n, keys % n)), shape=(m, n))


def test_canonical_csr_is_not_copied():
    R = _random_csr(50, 40, 600)
    R.indices = R.indices.astype(np.int32)
    out = check_ratings(R)
    assert out.data is R.data or np.shares_memory(out.data, R.data)
    assert np.shares_memory(out.indices, R.indices)
    assert out.dtype == np.float32 and out.indices.dtype == np.int32


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.float32])
@pytest.mark.parametrize("index", [np.int32, np.int64])
def test_canonical_fast_path_equals_general_path(dtype, index):
    R = _random_csr(30, 20, 200, dtype=dtype)
    R.indices = R.indices.astype(index)
    R.indptr = R.indptr.astype(index)
    fast = check_ratings(R)
    slow = check_ratings(R.tocoo())                 # the general (sorting) path
    assert fast.dtype == np.float32 and fast.indices.dtype == np.int32
    for a in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(fast, a), getattr(slow, a))


def _raw_csr(data, indices, indptr, shape):
    """A CSR whose arrays scipy does not check or sort."""
    R = sp.csr_matrix(shape, dtype=np.float32)
    R.data, R.indices, R.indptr = (np.asarray(data, np.float32), np.asarray(indices, np.int32),
                                   np.asarray(indptr, np.int32))
    return R


def test_non_canonical_csr_takes_the_general_path():
    # unsorted row: sorted by the general path, same result as the sorted input
    R = _raw_csr([1, 2, 3], [2, 0, 1], [0, 2, 3], (2, 3))
    out = check_ratings(R)
    np.testing.assert_array_equal(out.indices, [0, 2, 1])
    np.testing.assert_array_equal(out.data, [2, 1, 3])
    # duplicates within a row are named
    with pytest.raises(ValueError, match="duplicate"):
        check_ratings(_raw_csr([1, 2], [1, 1], [0, 2], (1, 3)))
    # NaN ratings are named
    with pytest.raises(ValueError, match="NaN"):
        check_ratings(_raw_csr([1, np.nan], [0, 1], [0, 2], (1, 3)))
    # a column index past the shape is refused (scipy's own check on conversion)
    with pytest.raises(ValueError):
        check_ratings(_raw_csr([1, 2], [0, 5], [0, 2], (1, 3)))


@pytest.mark.parametrize("band", [None, 3])
def test_device_transpose_equals_scipy(cl_device, band, monkeypatch):
    import pyopencl as cl

    from clmf.engine import transpose as T
    from clmf.engine.device import device_info, get_context
    if band is not None:
        monkeypatch.setattr(T, "_CPU_BAND", band)
    # empty rows and columns, one long row, a few blocks
    R = _random_csr(300, 47, 3000, seed=3).tolil()
    R[5, :] = 0
    R[:, 7] = 0
    R[11, :] = np.arange(1, 48)
    R = sp.csr_matrix(R)
    R.eliminate_zeros()
    R.indices = R.indices.astype(np.int32)
    info = device_info(cl_device)
    ctx, q = get_context(cl_device)
    mf = cl.mem_flags
    ip = R.indptr.astype(np.int64)
    C = R.tocsc()
    col = C.indptr.astype(np.int64)
    bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
            for a in (ip, R.indices, R.data.astype(np.float32), col)]
    oi, ov = T.device_transpose(ctx, q, info, ip, bufs[0], bufs[1], bufs[2], R.shape[1], bufs[3])
    gi, gv = np.empty(R.nnz, np.int32), np.empty(R.nnz, np.float32)
    cl.enqueue_copy(q, gi, oi)
    cl.enqueue_copy(q, gv, ov)
    np.testing.assert_array_equal(gi, C.indices)
    np.testing.assert_array_equal(gv, C.data)


@pytest.mark.parametrize("keep", [True, False])
def test_staging_buffers_kept_for_the_next_uploader(cl_device, keep, monkeypatch):
    """A finished uploader's staging buffers serve the next one on the context (at most
    ``stages`` kept; none with ``KEEP_STAGING`` off), its uploads still exact."""
    import pyopencl as cl

    from clmf.engine import upload as U
    from clmf.engine.device import get_context
    monkeypatch.setattr(U, "_SMALL", 0)
    monkeypatch.setattr(U, "KEEP_STAGING", keep)
    monkeypatch.setattr(U, "_staging_cache", U._StagingCache())
    ctx, q = get_context(cl_device)
    rng = np.random.default_rng(2)
    a, b = (rng.random(3000).astype(np.float32) for _ in range(2))
    up = U.Uploader(ctx, q, in_place=False, stage_bytes=4096, stages=2)
    buf_a = up.buffer(a)
    first = [st[0] for st in up._stages]           # (held: no object's id is reused)
    up.finish()
    up2 = U.Uploader(ctx, q, in_place=False, stage_bytes=4096, stages=2)
    buf_b = up2.buffer(b)
    reused = [st[0] for st in up2._stages if any(st[0] is x for x in first)]
    up2.finish()
    assert len(first) == 2 and bool(reused) == keep
    kept = U._staging_cache._free.get((__import__("os").getpid(), ctx.int_ptr, 4096), [])
    assert len(kept) == (min(2, U.STAGES) if keep else 0)
    for want, got in ((a, buf_a), (b, buf_b)):
        out = np.empty_like(want)
        cl.enqueue_copy(q, out, got)
        np.testing.assert_array_equal(out, want)
    U._staging_cache.clear()
    assert not U._staging_cache._free


@pytest.mark.parametrize("biases", [False, True])
def test_train_error_from_device_csr(cl_device, biases):
    from clmf.engine.config import KernelConfig
    from clmf.engine.core import Engine
    R = _random_csr(40, 30, 500, seed=5)
    cfg = KernelConfig.parse("batch")
    eng = Engine(cl_device, R, 6, (cfg, cfg), biased=biases, offset=3.0 if biases else 0.0)
    try:
        rng = np.random.default_rng(0)
        eng.set_factors("users", rng.random((40, 6)), biases=rng.random(40) if biases else None)
        eng.set_factors("items", rng.random((30, 6)), biases=rng.random(30) if biases else None)
        C = R.tocoo()
        want = eng.squared_error("t", C.row, C.col, C.data)
        got = eng.train_squared_error()
        assert got[1] == want[1] == R.nnz
        assert got[0] == pytest.approx(want[0], rel=1e-5)
    finally:
        eng.release()


def test_fit_records_setup_timings(cl_device):
    import clmf
    R = _random_csr(60, 50, 900, seed=2)
    m = clmf.ALS(factors=4, iterations=2, device=cl_device, random_state=0)
    m.fit(R, show_progress=False)
    t = m.timings_
    for k in ("validation", "preparation", "counts", "checks", "tuning", "plan", "engine",
              "engine_host", "build", "build_wait", "upload", "transpose", "upload_transpose",
              "buffers", "start_factors", "factors_upload", "setup", "wrap_up", "ranker",
              "fit"):
        assert t[k] >= 0.0, k
    assert t["setup"] + t["wrap_up"] + t["ranker"] <= t["fit"]
    assert t["upload_transpose"] == pytest.approx(t["upload"] + t["transpose"])
    parts = t["validation"] + t["preparation"] + t["engine"] + t["start_factors"] + \
        t["factors_upload"]
    assert parts <= t["setup"] + 1e-6 and t["setup"] <= t["fit"]
    assert t["counts"] + t["checks"] + t["tuning"] + t["plan"] <= t["preparation"] + 1e-6


@pytest.mark.parametrize("threads", [False, True])
def test_host_scans_equal_numpy(monkeypatch, threads):
    from clmf.data import scan
    monkeypatch.setattr(scan, "CHUNK", 7)              # several chunks and a partial last one
    monkeypatch.setattr(scan, "_PARALLEL_FROM", 0 if threads else 1 << 40)
    rng = np.random.default_rng(4)
    for size in (0, 5, 7, 100):
        idx = rng.integers(0, 13, size=size).astype(np.int32)
        got = scan.count_columns(idx, 13)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.bincount(idx, minlength=13))
        if size:
            v = rng.normal(size=size).astype(np.float32)
            assert scan.value_range(v) == (v.min(), v.max())
            assert scan.value_sum(v) == pytest.approx(float(np.sum(v, dtype=np.float64)),
                                                      rel=1e-12)
            v[size // 2] = np.nan
            assert all(np.isnan(x) for x in scan.value_range(v))
        M = rng.normal(size=(size, 3)).astype(np.float32)
        assert scan.all_finite(M) and scan.all_finite(M[:, ::2])
        for bad in (np.nan, np.inf, -np.inf):
            for at in ({0, size - 1} if size else ()):
                B = M.copy()
                B[at, 1] = bad
                assert not scan.all_finite(B) and not scan.all_finite(B[:, 1:])


@pytest.mark.parametrize("threads", [False, True])
def test_blockwise_canonical_check_equals_scipy(monkeypatch, threads):
    from clmf.data import scan
    monkeypatch.setattr(scan, "CHUNK", 16)             # many blocks of rows
    monkeypatch.setattr(scan, "_PARALLEL_FROM", 0 if threads else 1 << 40)
    R = _random_csr(40, 30, 500, seed=9)
    cases = [R.indptr.copy(), R.indices.copy()]

    def check(ip, ix):
        want = sp.csr_matrix((np.ones(len(ix), np.float32), ix, ip), shape=R.shape,
                             copy=True).has_canonical_format
        assert scan.csr_is_canonical(ip, ix, np.ones(len(ix), np.float32), 30) == want
        return want

    assert check(*cases)
    for k in range(1, R.nnz):                          # swap or repeat neighbours anywhere
        ix = cases[1].copy()
        ix[k - 1], ix[k] = ix[k], ix[k - 1]
        check(cases[0], ix)
        ix = cases[1].copy()
        ix[k] = ix[k - 1]
        check(cases[0], ix)
    ip = cases[0].copy()
    ip[5], ip[6] = ip[6], ip[5]                        # decreasing row pointers
    assert not scan.csr_is_canonical(ip, cases[1], R.data, 30)
    empty = np.zeros(41, np.int32)
    assert scan.csr_is_canonical(empty, np.zeros(0, np.int32), np.zeros(0, np.float32), 30)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_pinned_staging_upload_is_exact(cl_device, dtype, monkeypatch):
    import pyopencl as cl

    from clmf.engine import upload as U
    from clmf.engine.device import get_context
    monkeypatch.setattr(U, "_SMALL", 0)                # every array through the staging buffers
    ctx, q = get_context(cl_device)
    rng = np.random.default_rng(1)
    # sizes around the stage size (4096 B): one byte short, exact, several stages and a tail;
    # more chunks than staging buffers, so buffers are reused after their copy ended
    arrays = [(rng.random(k) * 1e6).astype(dtype) for k in (1023, 1024, 5 * 1024 + 3, 9000)]
    up = U.Uploader(ctx, q, in_place=False, stage_bytes=4096, stages=2, threads=2)
    try:
        bufs = [up.buffer(a) for a in arrays]
        big = rng.integers(0, 256, size=(8 << 20) + 5, dtype=np.uint8)
        into = np.zeros_like(big)
        up._copy(into, big)                            # split over the two threads
        np.testing.assert_array_equal(into, big)
        dst = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=arrays[3].nbytes)
        up.write(dst, arrays[3][::-1])                 # a non-contiguous view is copied first
    finally:
        up.finish()
    assert up.bytes == sum(a.nbytes for a in arrays) + arrays[3].nbytes
    for a, b in zip(arrays, bufs):
        out = np.empty_like(a)
        cl.enqueue_copy(q, out, b)
        np.testing.assert_array_equal(out, a)
    out = np.empty_like(arrays[3])
    cl.enqueue_copy(q, out, dst)
    np.testing.assert_array_equal(out, arrays[3][::-1])
    # read back through the staging buffers: more chunks than stages, a tail, a tiny array
    up = U.Uploader(ctx, q, in_place=False, stage_bytes=4096, stages=2, threads=2)
    try:
        for a, b in zip(arrays, bufs):
            back = np.full_like(a, 7)
            assert up.read(b, back) is back
            np.testing.assert_array_equal(back, a)
    finally:
        up.finish()


@pytest.mark.parametrize("biases", [False, True])
def test_fit_through_pinned_staging_equals_zero_copy(cl_device, biases, monkeypatch):
    """The GPUs' upload path (pinned staging buffers, chunked copies), run on a CPU device,
    fits exactly what the CPU's zero-copy path fits."""
    import clmf
    from clmf.engine import upload as U
    R = _random_csr(300, 200, 6000, seed=7)

    def fit():
        m = clmf.ALS(factors=8, iterations=3, device=cl_device, random_state=0, biases=biases)
        return m.fit(R, show_progress=False)

    direct = fit()
    monkeypatch.setattr(U, "zero_copy", lambda info: False)
    monkeypatch.setattr(U, "_SMALL", 0)
    monkeypatch.setattr(U, "STAGE_BYTES", 4096)
    staged = fit()
    np.testing.assert_array_equal(staged.user_factors_, direct.user_factors_)
    np.testing.assert_array_equal(staged.item_factors_, direct.item_factors_)
    assert staged.timings_["upload"] >= 0.0


def _misaligned(a, skew=16, align=128):
    """A copy of ``a`` whose data starts ``skew`` bytes past a multiple of ``align`` (as NumPy's
    large arrays start 16 bytes past a page)."""
    k = a.dtype.itemsize
    raw = np.empty(a.size + 2 * align // k, a.dtype)      # a base of its dtype, barely larger:
    off = ((-raw.ctypes.data) % align + skew) // k        # scipy copies views of much larger ones
    out = raw[off:off + a.size].reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % align == skew
    return out


@pytest.mark.parametrize("align", [128, 4096])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_aligned_copy_is_aligned_and_equal(dtype, align):
    """aligned_copy returns an equal array of the same dtype and shape starting at a multiple
    of the alignment, for empty, 2-D, misaligned and non-contiguous inputs and through the
    uploader's threaded copy."""
    from clmf.engine import upload as U
    rng = np.random.default_rng(3)
    a = (rng.random(40_001) * 1e6).astype(dtype)
    cases = [a, _misaligned(a), a[::3], a[:40_000].reshape(200, 200), a[:0]]
    up = U.Uploader(None, None, in_place=True, threads=2)
    for x in cases:
        for copy in (None, up._copy):
            y = U.aligned_copy(x, align, copy)
            assert y.ctypes.data % align == 0 and y.flags.c_contiguous
            assert y.dtype == x.dtype and y.shape == x.shape and not np.shares_memory(x, y)
            np.testing.assert_array_equal(y, x)
    big = _misaligned(rng.integers(0, 1 << 30, size=(3 << 20) + 7, dtype=np.int64))
    y = U.aligned_copy(big, align, up._copy)           # over 4 MiB: split over the threads
    assert y.ctypes.data % align == 0
    np.testing.assert_array_equal(y, big)
    if up._pool is not None:
        up._pool.shutdown()


def test_aligned_host_copies_on_intels_platform_only():
    """The aligned copies follow the platform's name: Intel's CPU runtime, not PoCL on an Intel
    CPU (whose device name holds the CPU's), not Oclgrind, not a GPU."""
    from types import SimpleNamespace as NS

    from clmf.engine import upload as U
    assert U.needs_aligned_host(NS(type="CPU", platform="Intel(R) OpenCL",
                                   name="Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"))
    assert U.needs_aligned_host(NS(type="CPU", platform="Intel(R) CPU Runtime for OpenCL(TM) "
                                   "Applications", name="AMD EPYC 7763"))
    assert not U.needs_aligned_host(NS(type="CPU", platform="Portable Computing Language",
                                       name="pthread-icelake-server-Intel(R) Xeon(R) Gold"))
    assert not U.needs_aligned_host(NS(type="CPU", platform="Oclgrind", name="Oclgrind Simulator"))
    assert not U.needs_aligned_host(NS(type="GPU", platform="Intel(R) OpenCL Graphics",
                                       name="Intel(R) Arc(TM) A770 Graphics"))


def test_common_skew_and_widened_views():
    """Arrays starting the same whole number of elements past a boundary share a skew (a view
    from the boundary below each holds its bytes at that offset); different starts, a skew that
    is not a whole element, empty or strided arrays, mixed item sizes have none."""
    from clmf.engine import upload as U
    a = _misaligned(np.arange(1000, dtype=np.int32))
    b = _misaligned(np.linspace(0, 1, 1000, dtype=np.float32))
    assert U.common_skew((a, b), 128) == 16
    w = U.widened(b, 16)
    assert w.ctypes.data % 128 == 0 and w.size == b.nbytes + 16
    np.testing.assert_array_equal(w[16:].view(np.float32), b)
    assert U.common_skew((a, _misaligned(b, skew=64)), 128) is None
    raw = np.empty(b.nbytes + 256, np.uint8)
    off = (-raw.ctypes.data) % 128 + 6
    odd = raw[off:off + b.nbytes].view(np.float32)       # 6 bytes past: not a whole element
    assert U.common_skew((odd,), 128) is None and U.common_skew((a, odd), 128) is None
    assert U.common_skew((a, b[:0]), 128) is None and U.common_skew((a, b[::2]), 128) is None
    assert U.common_skew((a, _misaligned(np.arange(1000, dtype=np.int64))), 128) is None
    assert U.common_skew((a, b), 0) is None and U.common_skew((a, b), 1 << 16) is None
    assert U.common_skew((_misaligned(a, skew=0),), 128) == 0


@pytest.mark.parametrize("transpose", ["device", "host"])
@pytest.mark.parametrize("skews", [(16, 16), (16, 64)])
@pytest.mark.parametrize("variant", ["batch:tx=4,ty=4",
                                     "batch:tx=4,ty=4,solver=cg,cg_steps=3,split=3,batch_rows=2"])
@pytest.mark.parametrize("biases", [False, True])
def test_fit_through_aligned_host_wraps_equals_in_place(cl_device, biases, variant, skews,
                                                        transpose, monkeypatch):
    """On a runtime that reads only aligned host arrays in place (forced on every CPU device),
    misaligned indices and values starting alike are wrapped from the boundary below them with
    the row pointers shifted (long rows split into pieces too), and ones starting differently are
    copied into aligned arrays: either fits exactly what wrapping them as they are fits."""
    import clmf
    from clmf.engine import core
    from clmf.engine import upload as U
    from clmf.engine.device import device_info
    if not U.zero_copy(device_info(cl_device)):
        pytest.skip("the device does not read host arrays in place")
    monkeypatch.setattr(core, "HOST_TRANSPOSE_MAX_NNZ", -1 if transpose == "device" else 1 << 30)
    R = _random_csr(300, 200, 6000, seed=7).tolil()
    R[5, :] = 1.0                                  # a long row (split at 3 entries a piece)
    R = R.tocsr()
    R = sp.csr_matrix((_misaligned(R.data.astype(np.float32), skew=skews[1]),
                       _misaligned(R.indices.astype(np.int32), skew=skews[0]),
                       _misaligned(R.indptr.astype(np.int32))), shape=R.shape)
    assert R.data.ctypes.data % 128 == skews[1] and R.indices.ctypes.data % 128 == skews[0]

    def fit():
        m = clmf.ALS(factors=8, iterations=3, device=cl_device, random_state=0, biases=biases,
                     variant=variant)
        return m.fit(R, show_progress=False)

    monkeypatch.setattr(U, "HOST_ALIGN", 0)
    direct = fit()
    copies, wraps = [], []
    real_copy, real_widened = U.aligned_copy, U.widened

    def copy_spy(a, align=128, copy=None):
        copies.append(a)
        out = real_copy(a, align, copy)
        assert out.ctypes.data % align == 0
        return out

    def widened_spy(a, skew):
        wraps.append(a)
        out = real_widened(a, skew)
        assert out.ctypes.data % 128 == 0
        return out

    monkeypatch.setattr(U, "HOST_ALIGN", 128)
    monkeypatch.setattr(U, "needs_aligned_host", lambda info: True)
    monkeypatch.setattr(U, "aligned_copy", copy_spy)
    monkeypatch.setattr(U, "widened", widened_spy)
    aligned = fit()

    def users(arrays):
        """How many of ``arrays`` are the users' indices or values (shared, not copied)."""
        return sum(np.shares_memory(x, R.data) or np.shares_memory(x, R.indices) for x in arrays)
    # the users' indices and values: wrapped where they start alike, else copied
    same = skews[0] == skews[1]
    assert (users(wraps), users(copies)) == ((2, 0) if same else (0, 2))
    np.testing.assert_array_equal(aligned.user_factors_, direct.user_factors_)
    np.testing.assert_array_equal(aligned.item_factors_, direct.item_factors_)
    if biases:
        np.testing.assert_array_equal(aligned.user_biases_, direct.user_biases_)


def test_tuning_index_follows_the_database(tmp_path, monkeypatch):
    import json
    import os

    from clmf.tuning import index
    monkeypatch.setenv("CLMF_CACHE_DIR", str(tmp_path / "cache"))
    db = tmp_path / "db.jsonl"
    # records that pass the database's record checks (clmf.tuning.schema)
    dev = {"platform": "FakeCL", "vendor": "FakeVendor", "type": "GPU", "device": "big"}
    rec = {"schema_version": 1, "kind": "best", "run_id": "r1", "side": "users", "f": 10,
           "storage": "float32", "device": dev, "config": {}, "dataset": {"m": 5, "n": 4, "nnz": 9}}
    meas = {"schema_version": 1, "kind": "measurement", "run_id": "r1", "side": "users",
            "status": "ok", "f": 10, "seconds": 0.5, "config": {}, "device": dev}
    failed = dict(meas, status="failed", seconds=0.0)
    db.write_text("".join(json.dumps(r) + "\n" for r in (rec, meas, failed)))
    first = index.best_records(db)
    assert first == [rec]
    m = index.measurement_records(db)
    # a measurement that ran keeps its device's key (it verifies the configuration there)
    assert m[0]["device"] == dev and m[0]["seconds"] == 0.5
    assert m[1]["device"] == {"type": "GPU"} and m[1]["status"] == "failed"
    assert "schema_version" not in m[0]
    assert index.best_records(db) is first                       # memoized in the process
    index._memo.clear()
    assert index.best_records(db) == first                       # read back from the index
    assert index.measurement_records(db) == m
    # one version's three indexes: best records, measurements, the selection model's records
    assert len(list((tmp_path / "cache").glob("tuning-index-*.json"))) == 3
    rec2 = dict(rec, run_id="r2")
    db.write_text(json.dumps(rec2) + "\n")
    os.utime(db, ns=(1, 1))                                       # another version of the file
    assert index.best_records(db) == [rec2]
    assert index.measurement_records(db) == []
    assert index.model_records(db) == []
    assert len(list((tmp_path / "cache").glob("tuning-index-*.json"))) == 3   # old ones pruned
    db.write_text("not json\n")
    os.utime(db, ns=(2, 2))
    with pytest.warns(Warning, match="skipped"):                  # a bad line is skipped alone
        assert index.best_records(db) == []


def test_host_and_device_transpose_fit_alike(cl_device, monkeypatch):
    """A CPU device's small fits transpose on the host (no program to build); the items' side
    then holds exactly what the device transpose gives, so the fits agree bit for bit."""
    import clmf
    from clmf.engine import core
    from clmf.engine.device import device_info
    R = _random_csr(120, 70, 1500, seed=9)
    info = device_info(cl_device)
    assert core.host_transpose(info, R.nnz) == (info.type == "CPU")
    assert not core.host_transpose(info, core.HOST_TRANSPOSE_MAX_NNZ + 1) or \
        "oclgrind" in info.platform.lower()
    fits = []
    for limit in (core.HOST_TRANSPOSE_MAX_NNZ, -1):     # host (on CPUs), then the device's
        monkeypatch.setattr(core, "HOST_TRANSPOSE_MAX_NNZ", limit)
        m = clmf.ALS(8, regularization=0.1, iterations=2, device=cl_device, random_state=0,
                     variant="batch").fit(R, show_progress=False)
        fits.append((m.user_factors_, m.item_factors_))
    for a, b in zip(*fits):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["explicit", "biased", "implicit", "float16"])
def test_fit_with_adopted_start_factors_equals_copies(cl_device, mode, monkeypatch):
    """Start factors drawn by the fit into page-aligned host rows in the devices' layout (the
    padding of vector widths and biases included) are wrapped in place as the factor buffers on
    CPU runtimes (float16 storage is converted, so copied): the fit equals one whose start
    factors are copied into the engine's own buffers, and one given the same start as ``init``."""
    import clmf
    from clmf import reference as ref
    from clmf.engine import core
    from clmf.engine import upload as U
    from clmf.engine.device import device_info
    R = _random_csr(300, 200, 6000, seed=11)
    kw = {"explicit": {}, "biased": {"biases": True}, "float16": {"storage": "float16"},
          "implicit": {"feedback": "implicit", "alpha": 2.0}}[mode]

    def fit(**extra):
        m = clmf.ALS(factors=8, iterations=3, device=cl_device, random_state=0, **kw)
        return m.fit(R, show_progress=False, **extra)

    wrapped = []
    real = core.Engine._wrappable

    def spy(self, host):
        ok = real(self, host)
        wrapped.append((ok, host.ctypes.data % 4096))
        return ok

    monkeypatch.setattr(core.Engine, "_wrappable", spy)
    adopted = fit()
    if mode == "float16":
        assert wrapped == []
    else:
        ok = U.zero_copy(device_info(cl_device))
        assert wrapped == [(ok, 0), (ok, 0)]
    monkeypatch.setattr(core, "ADOPT_FACTORS", False)
    copied = fit()
    monkeypatch.setattr(core, "ADOPT_FACTORS", True)
    X0, Y0 = ref.start_factors(*R.shape, 8, 0, init=ref.default_init(kw.get("feedback")))
    given = fit(init=(X0, Y0))
    for other in (copied, given):
        np.testing.assert_array_equal(adopted.user_factors_, other.user_factors_)
        np.testing.assert_array_equal(adopted.item_factors_, other.item_factors_)
        if mode == "biased":
            np.testing.assert_array_equal(adopted.user_biases_, other.user_biases_)


@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 37])
def test_host_factor_rows_are_padded_factors(rows, biased):
    """host_factor_rows' view, filled, is the padded layout padded_factors writes, starting at a
    page; the engine finds the rows from the view, not from an unpadded array or another
    layout; start factors drawn into memory of the caller's are the same numbers."""
    from clmf.engine import core, factors
    from clmf.engine import upload as U
    f, ldf = 5, 8
    X = np.random.default_rng(rows).random((rows, f), dtype=np.float32)
    view = core.host_factor_rows(rows, f, ldf, biased)
    view[...] = X
    host = factors.padded_base(view, rows, f, ldf)
    assert host is not None and host.ctypes.data % 4096 == 0
    np.testing.assert_array_equal(host, core.padded_factors("users", X, rows, f, ldf, np.float32,
                                                            biased))
    assert factors.padded_base(X, rows, f, ldf) is None
    assert factors.padded_base(view, rows, f, ldf + 4) is None
    from clmf import reference as ref
    A, B = ref.start_factors(rows, 3, f, 0, empty=lambda shape, dtype: U.aligned_empty(shape))
    C, D = ref.start_factors(rows, 3, f, 0)
    np.testing.assert_array_equal(A, C)
    np.testing.assert_array_equal(B, D)
