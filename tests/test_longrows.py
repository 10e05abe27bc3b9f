"""Long rows split across S1 work-groups (KernelConfig.split): the pieces' row pointers and
launches on the host, the memory plan, and on every device split == unsplit == the NumPy
reference for explicit (weighted and not), implicit and biased fits over several S1 variants and
solvers, with rows exactly at the threshold, one past it, of one piece, of many pieces, longer
than a batch, and empty, in batches small enough that pieces and batches interleave."""
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import rel_err

import clmf
from clmf import reference as ref
from clmf.engine import memory
from clmf.engine.config import SPLIT_NEVER, KernelConfig
from clmf.engine.core import Engine, split_rows
from clmf.engine.device import device_info
from clmf.errors import InvalidConfigError

TOL = 1e-4
# λ: a CG after 3 of f = 7 steps on the 2-entry rows' systems at λ = 0.1 moves 1e-7 differences
# of its input (either path's, e.g. the other side's factors) to 1e-4: conditioned enough at 0.5
LAM = 0.5
T = 3                                          # entries per piece in the device tests
VARIANTS = ["batch:tx=4,ty=4",
            "batch+vec4+syrk:bx=4,ks=2,nnz_batch=5",
            "batch+vec4+gemm:tx=2,ty=2,bx=8,tz=2,nnz_batch=5",
            "batch+reg+local+vec4+tile:tx=2,ty=2,bx=8,by=8,tz=2,nnz_batch=6",
            "batch+reg+local:tx=4,ty=4,nnz_batch=8,solver=cg,cg_steps=3"]


def problem(seed=0):
    """34 × 29 ratings in 1..5: user rows of exactly T and T + 1 entries, of one entry, of many
    pieces (23 entries: 8 pieces, longer than a batch of 2 rows and than its pieces' share),
    empty rows (first, middle, last); an item rated by every user but one, an item never rated,
    the rest random (items of every length)."""
    rng = np.random.default_rng(seed)
    m, n = 34, 29
    mask = rng.random((m, n)) < 0.15
    mask[:, 4] = True                          # a long item (33 users)
    mask[:, 9] = False                         # an empty item
    lengths = {1: T, 2: T + 1, 3: 1, 5: 23, 6: 2 * T, 7: 2 * T + 1}
    for r, k in lengths.items():
        mask[r] = False
        mask[r, rng.choice([c for c in range(n) if c != 9], size=k, replace=False)] = True
    for r in (0, 17, m - 1):                  # empty rows, incl. the first and last of the side
        mask[r] = False
    rows, cols = np.nonzero(mask)
    vals = rng.integers(1, 6, size=rows.size).astype(np.float32)
    R = sp.csr_matrix((vals, (rows, cols)), shape=(m, n))
    counts = np.diff(R.indptr)
    assert counts[1] == T and counts[2] == T + 1 and counts[5] == 23 and counts[0] == 0
    return R


# ----- host side: pieces, launches, thresholds, the plan ------------------------------------------
def test_split_rows_pieces_and_launches():
    counts = np.array([0, 3, 4, 1, 0, 23, 6, 7, 0])
    indptr = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    vptr, vstart, launches = split_rows(indptr, 3, 2, 8)
    pieces = np.diff(vstart)
    assert list(pieces) == [1, 1, 2, 1, 1, 8, 2, 3, 1]        # at T: 1; T + 1: 2; empty: 1
    assert vptr[0] == 0 and vptr[-1] == indptr[-1] and np.all(np.diff(vptr) >= 0)
    assert np.all(np.diff(vptr) <= 3)
    for r in range(len(counts)):             # a row's pieces cover exactly its entries
        assert vptr[vstart[r]] == indptr[r] and vptr[vstart[r + 1]] == indptr[r + 1]
    # launches: consecutive, every row once, ≤ 2 rows and ≤ 8 pieces each
    nxt = 0
    for row0, n, v0, nv in launches:
        assert row0 == nxt and 1 <= n <= 2 and v0 == vstart[row0]
        got = vstart[row0 + n] - vstart[row0]
        assert got <= 8
        assert nv == (got if got > n else 0)
        nxt = row0 + n
    assert nxt == len(counts)
    assert any(nv for *_, nv in launches) and any(not nv for *_, nv in launches)
    # the row of 8 pieces alone fills a launch's scratch
    assert (5, 1, int(vstart[5]), 8) in launches
    with pytest.raises(ValueError, match="pieces"):
        split_rows(indptr, 3, 2, 7)
    with pytest.raises(ValueError, match="threshold"):
        split_rows(indptr, 0, 2, 8)


def test_split_rows_only_where_it_pays():
    """With the automatic threshold a launch is split only when its longest row outlasts the
    balanced share by more than its rows' trip through the pieces' scratch costs."""
    counts = np.array([1] * 20 + [9] + [1] * 20 + [40] + [1] * 20)
    indptr = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    # 64 slots, launches of 21 rows: 40 · 64 > 60 + 2048 · 21 fails, so nothing pays there ...
    _, _, launches = split_rows(indptr, 3, 21, 21 + 13, slots=64)
    assert all(nv == 0 for *_, nv in launches)
    # ... with 4096 slots the launch of the 40-entry row pays (163840 > 60 + 43008), the 9-entry
    # one not (36864 < 29 + 43008); forced (slots=0) both are split
    _, _, launches = split_rows(indptr, 3, 21, 21 + 13, slots=4096)
    cut = [r0 for r0, n, v0, nv in launches if nv]
    assert len(cut) == 1 and counts[cut[0]:cut[0] + 21].max() == 40
    _, _, launches = split_rows(indptr, 3, 21, 21 + 13)
    assert sum(1 for *_, nv in launches if nv) == 2
    # the rule itself
    # calibrated on the H100 (Netflix shape): a users' launch loses, an items' launch gains
    assert not memory.split_pays(17_000, 2_700_000, 13_300, 132 * 8)
    assert memory.split_pays(233_000, 50_000_000, 8_885, 132 * 8)
    assert memory.split_pays(5, 10 ** 9, 10 ** 6, 0)                     # forced


def test_split_rows_without_long_rows_is_the_plain_batching():
    indptr = np.array([0, 2, 2, 5, 6, 9], np.int64)
    vptr, vstart, launches = split_rows(indptr, 3, 2, 2)
    assert np.array_equal(vptr, indptr) and np.array_equal(vstart, np.arange(6))
    assert launches == [(0, 2, 0, 0), (2, 2, 2, 0), (4, 1, 4, 0)]


class _Info:
    """A device's limits as plan_split reads them (an H100-like GPU)."""
    compute_units = 132
    global_mem = 80 << 30
    max_alloc = 20 << 30
    type = "GPU"


def test_automatic_threshold_rule():
    cfg = KernelConfig()
    # small data on a CPU: the floor, so nothing is split
    assert memory.split_threshold(cfg, 10_000, 100, 100, 2) == memory.SPLIT_FLOOR
    # Netflix items at f = 100 (two launches of ≤ 13,000 rows): nnz / (2 · 132 · 8)
    t = memory.split_threshold(cfg, 99_072_112, 17_770, 13_000, 132)
    assert t == -(-(-(-99_072_112 // 2)) // (132 * memory.SPLIT_WAVES))
    assert memory.split_threshold(cfg.replace(split=3), 99_072_112, 17_770, 13_000, 132) == 3
    p = memory.plan_split(cfg, 100, 17_770, 99_072_112, 232_944, _Info())
    assert p.active and p.threshold == t and p.virtual_rows >= -(-232_944 // t)
    assert p.slots == 132 * memory.SPLIT_WAVES
    assert memory.plan_split(cfg.replace(split=3), 100, 17_770, 99_072_112, 232_944,
                             _Info()).slots == 0
    # 80 GiB: the budget binds, not the memory: as many rows per launch as unsplit
    assert p.batch_rows == memory.choose_batch_rows(cfg, 100, 17_770, _Info())

    class Small(_Info):                   # 1 GiB: an eighth of it holds both scratches
        global_mem = 1 << 30
    q = memory.plan_split(cfg, 100, 17_770, 99_072_112, 232_944, Small())
    plain = memory.choose_batch_rows(cfg, 100, 17_770, Small())
    assert q.active and q.batch_rows == plain // 2
    assert 2 * 4 * (100 * 100 + 100) * q.virtual_rows <= (1 << 30) // 8 + 4 * (10_100)
    # no row over the threshold, the fused CG, or never: not split, plain batches
    for c, longest in ((cfg, t), (cfg.replace(solver="fusedcg"), 232_944),
                       (cfg.replace(split=SPLIT_NEVER), 232_944)):
        q = memory.plan_split(c, 100, 17_770, 99_072_112, longest, _Info())
        assert not q.active and q.batch_rows == memory.choose_batch_rows(c, 100, 17_770, _Info())


def test_plan_counts_the_pieces_scratch():
    cfg = KernelConfig.parse("batch:split=3,batch_rows=4")
    info = _Info()
    splits = {"users": memory.plan_split(cfg, 8, 100, 1000, 40, info),
              "items": memory.plan_split(cfg, 8, 50, 1000, 2, info)}
    assert splits["users"].active and not splits["items"].active
    plain = memory.plan_fit(100, 50, 1000, 8, (cfg, cfg), info)
    plan = memory.plan_fit(100, 50, 1000, 8, (cfg, cfg), info, splits=splits)
    u = splits["users"]
    assert u.virtual_rows == 14                   # ⌈40 / 3⌉ pieces > 4 rows per launch
    assert plan.device["split_users"] == (4 * (64 + 8) * 14 + 8 * (u.pieces_bound + 1)
                                          + 8 * 101)
    assert "split_items" not in plan.device
    assert plan.device_total > plain.device_total and "split_users" in plan.host


def test_config_field():
    c = KernelConfig.parse("batch+vec4+syrk:bx=4,split=3")
    assert c.split == 3 and str(c) == "batch+vec4+syrk:bx=4,split=3"
    assert KernelConfig.parse(str(c)) == c and KernelConfig.from_dict(c.to_dict()) == c
    assert KernelConfig().split == 0 and "split" not in str(KernelConfig())
    for bad in (-1, SPLIT_NEVER + 1, 2.0, "3", True):
        with pytest.raises(InvalidConfigError):
            KernelConfig(split=bad)
    with pytest.raises(InvalidConfigError):
        KernelConfig.parse("batch:split=x")


def test_tuner_space_searches_split_on_gpus_only():
    from clmf.autotune.space import canonical, make_space

    class Gpu(_Info):
        max_work_group_size = 1024
        max_work_item_sizes = (1024, 1024, 64)
        local_mem = 48 * 1024
        platform = "NVIDIA CUDA"
        compute_capability = (9, 0)

    class Cpu(Gpu):
        type = "CPU"

    assert "split" in make_space("default", 50, Gpu()).grid
    assert "split" not in make_space("default", 50, Cpu()).grid
    sp_ = make_space("default", 50, Gpu())
    syrk = (False, False, 4, False, False, True, False)
    mma = (False, False, 4, False, False, False, True)
    assert "split" in sp_.active(syrk, "cholesky") and "split" in sp_.active(mma, "cg")
    assert "split" not in sp_.active(syrk, "fusedcg")
    assert canonical(KernelConfig(solver="fusedcg", split=8192)).split == 0
    assert canonical(KernelConfig.parse("batch+vec4+mma:solver=cg,fused_solve=1,split=8192")
                     ).split == 0


# ----- on every device ------------------------------------------------------------------------
def _splits_of(cl_device, R, f, cfg, biased=False):
    """The two sides' split plans the engine makes for ``R`` (is anything split at all?)."""
    info = device_info(cl_device)
    fs = f + 1 if biased else f
    m, n = R.shape
    return (memory.plan_split(cfg, fs, m, R.nnz, int(np.diff(R.indptr).max()), info),
            memory.plan_split(cfg, fs, n, R.nnz, int(np.bincount(R.indices, minlength=n).max()),
                              info))


def _fit(cl_device, R, f, variant, init, **kw):
    cfg = KernelConfig.parse(variant)
    return clmf.ALS(f, LAM, kw.pop("iterations", 1), device=cl_device, variant=cfg,
                    solver=cfg.solver, **kw).fit(R, init=init, show_progress=False)


@pytest.mark.parametrize("mode", ["explicit", "unweighted", "implicit", "biased"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_split_matches_unsplit_and_reference(cl_device, variant, mode):
    check(cl_device, variant, mode)


@pytest.mark.parametrize("mode", ["explicit", "implicit", "biased"])
@pytest.mark.parametrize("variant", ["batch+vec4+mma:tx=2,ks=2,nnz_batch=16",
                                     "batch+vec4+mma:tx=1,ks=1,nnz_batch=8,solver=cg"])
def test_split_mma(cl_device, monkeypatch, variant, mode):
    """The tensor-core S1 over pieces (its emulation where the device has no tensor cores)."""
    from clmf.engine.kernels import mma_supported
    if not mma_supported(device_info(cl_device)):
        monkeypatch.setenv("CLMF_MMA_EMULATION", "1")
    check(cl_device, variant, mode)


def test_fused_solve_is_not_split(cl_device, monkeypatch):
    """mma's fused_solve keeps the systems in local memory: nothing to split, the fit exact."""
    from clmf.engine.kernels import mma_supported
    if not mma_supported(device_info(cl_device)):
        monkeypatch.setenv("CLMF_MMA_EMULATION", "1")
    v = "batch+vec4+mma:tx=2,ks=2,nnz_batch=16,solver=cg,fused_solve=1"
    R = problem()
    assert not any(p.active for p in _splits_of(cl_device, R, 7,
                                                 KernelConfig.parse(f"{v},split={T}")))
    check(cl_device, v, "explicit", split_active=False)


def check(cl_device, variant, mode, split_active=True):
    """A fit of ``variant`` split at T with 2 rows per launch, the same unsplit, the reference:
    all three agree; the empty rows get zero factors."""
    f = 7
    R = problem()
    init = ref.start_factors(*R.shape, f, 1)
    split = f"{variant},split={T},batch_rows=2"
    cfg = KernelConfig.parse(split)
    assert all(p.active == split_active
               for p in _splits_of(cl_device, R, f, cfg, mode == "biased"))
    kw = {"explicit": {}, "unweighted": {"weighted_regularization": False},
          "implicit": {"feedback": "implicit", "alpha": 2.0}, "biased": {"biases": True}}[mode]
    if mode == "biased":
        kw["iterations"] = 2
    got = _fit(cl_device, R, f, split, init, **dict(kw))
    plain = _fit(cl_device, R, f, f"{variant},split={SPLIT_NEVER},batch_rows=2", init, **dict(kw))
    steps = dict(solver=cfg.solver, cg_steps=cfg.cg_steps)
    if mode == "biased":
        X, Y, bu, bi, _mu = ref.als_biased(R, f, LAM, 2, init=init, **steps)
        pairs = [(got.user_factors_, plain.user_factors_, X), (got.item_factors_,
                 plain.item_factors_, Y), (got.user_biases_, plain.user_biases_, bu),
                 (got.item_biases_, plain.item_biases_, bi)]
        tol = 10 * TOL                                       # two iterations, as test_feedback
    else:
        X, Y = ref.als(R, f, LAM, 1, weighted=mode == "explicit", init=init,
                       implicit_alpha=2.0 if mode == "implicit" else None, **steps)
        pairs = [(got.user_factors_, plain.user_factors_, X),
                 (got.item_factors_, plain.item_factors_, Y)]
        tol = TOL
    for g, p, want in pairs:
        assert rel_err(g, want) <= tol
        assert rel_err(p, want) <= tol
        assert rel_err(g, p) <= tol
    assert np.all(got.user_factors_[[0, 17, 33]] == 0) and np.all(got.item_factors_[9] == 0)


@pytest.mark.parametrize("f", [1, 17])
def test_split_engine_half_steps(cl_device, f):
    """The engine itself: split launches present on both sides (some unsplit), stage times of
    the combine recorded, each half-step equal to the reference's."""
    R = problem(seed=1)
    cfg = KernelConfig.parse(f"batch+vec4+syrk:bx=4,ks=2,nnz_batch=5,split={T},batch_rows=3")
    eng = Engine(cl_device, R, f, (cfg, cfg), profile=True)
    try:
        for s in ("users", "items"):
            assert eng.splits[s].active and eng.splits[s].threshold == T
            ls = eng.launches[s]
            assert any(nv for *_, nv in ls) and sum(n for _, n, _, _ in ls) == eng.side[s].rows
            assert "split_" + s in eng.memory
        X0, Y0 = ref.start_factors(*R.shape, f, 2)
        eng.set_factors("users", X0)
        eng.set_factors("items", Y0)
        eng.half_step("users", 0.1, True)
        X = eng.get_factors("users")
        assert rel_err(X, ref.half_step(R, Y0.astype(np.float64), 0.1)) <= TOL
        eng.half_step("items", 0.1, True)
        Y = eng.get_factors("items")
        assert rel_err(Y, ref.half_step(R.T.tocsr(), X.astype(np.float64), 0.1)) <= TOL
        assert eng.stage_times["combine"] > 0 and eng.stage_times["s1"] > 0
    finally:
        eng.release()


def test_automatic_split_leaves_small_data_alone(cl_device):
    R = problem()
    eng = Engine(cl_device, R, 5, (KernelConfig(), KernelConfig()))
    try:
        assert not any(p.active for p in eng.splits.values())
        assert all(nv == 0 for s in eng.launches for *_, nv in eng.launches[s])
        assert not any(k.startswith("split_") for k in eng.memory)
    finally:
        eng.release()


@pytest.mark.parametrize("feedback", ["explicit", "implicit"])
def test_fused_cg_ignores_split(cl_device, feedback):
    """The fused CG builds no hermitians: a split is planned on neither side, the fit is the
    reference's."""
    f = 5
    R = problem()
    init = ref.start_factors(*R.shape, f, 1)
    v = f"batch:solver=fusedcg,cg_steps=3,split={T},batch_rows=2"
    assert not any(p.active for p in _splits_of(cl_device, R, f, KernelConfig.parse(v)))
    kw = {"feedback": "implicit", "alpha": 2.0} if feedback == "implicit" else {}
    m = _fit(cl_device, R, f, v, init, **kw)
    X, Y = ref.als(R, f, LAM, 1, weighted=feedback == "explicit", init=init, solver="fusedcg",
                   cg_steps=3, implicit_alpha=2.0 if feedback == "implicit" else None)
    assert rel_err(m.user_factors_, X) <= TOL and rel_err(m.item_factors_, Y) <= TOL


def test_automatic_split_on_a_skewed_side(cl_device):
    """One user with 60,000 ratings among 200 users of 10: the automatic rule cuts that row on
    any device (T ≤ max(4096, 62,000 / 16) and the split pays: 60,000 · 16 > 62,000 + 2048 ·
    200), the items stay whole; the half-steps equal the reference's and the unsplit engine's."""
    rng = np.random.default_rng(3)
    m, n, f = 200, 60_000, 4
    rows = np.concatenate([np.zeros(n, np.int64), np.repeat(np.arange(1, m), 10)])
    cols = np.concatenate([np.arange(n), rng.integers(0, n, size=10 * (m - 1))])
    R = sp.csr_matrix((rng.integers(1, 6, size=rows.size).astype(np.float32), (rows, cols)),
                      shape=(m, n))
    R.sum_duplicates()
    R.data[:] = np.minimum(R.data, 5)
    X0, Y0 = ref.start_factors(m, n, f, 4)
    out = {}
    for split in (0, SPLIT_NEVER):
        cfg = KernelConfig.parse(f"batch+reg:tx=4,ty=4,split={split}")
        eng = Engine(cl_device, R, f, (cfg, cfg))
        try:
            assert eng.splits["users"].active == (split == 0) and not eng.splits["items"].active
            if split == 0:
                assert eng.splits["users"].threshold < n
                assert sum(1 for *_, nv in eng.launches["users"] if nv) >= 1
            eng.set_factors("users", X0)
            eng.set_factors("items", Y0)
            eng.half_step("users", 0.1, True)
            out[split] = eng.get_factors("users")
        finally:
            eng.release()
    want = ref.half_step(R, Y0.astype(np.float64), 0.1)
    assert rel_err(out[0], want) <= TOL and rel_err(out[SPLIT_NEVER], want) <= TOL
    assert rel_err(out[0], out[SPLIT_NEVER]) <= TOL


def test_launch_rows_rule():
    """Only the dimensions form's launches pass the scratch's rows, up to MAX_BATCH_ROWS; a fixed
    ``batch_rows`` and every other variant keep the scratch's batches."""
    dims = KernelConfig.parse("batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=8,nnz_batch=4")
    assert memory.launch_rows(dims, 2040, 480_189) == memory.MAX_BATCH_ROWS
    assert memory.launch_rows(dims, 2040, 17_770) == 17_770
    assert memory.launch_rows(dims, 16, 1) == 16              # never below the scratch's rows
    # a block published to other devices launch by launch keeps PUBLISH_LAUNCHES launches
    assert memory.launch_rows(dims, 2040, 120_000, published=True) == 15_000
    assert memory.launch_rows(dims, 2040, 10_000, published=True) == 2040
    fixed = KernelConfig.parse("batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=8,batch_rows=3")
    assert memory.launch_rows(fixed, 3, 34) == 3
    for v in ("batch:solver=fusedcg", "batch+vec4+syrk:bx=4,ks=2,nnz_batch=5"):
        assert memory.launch_rows(KernelConfig.parse(v), 16, 34) == 16


@pytest.mark.parametrize("batch", [0, 3])
def test_dims_form_launches_past_the_scratch(cl_device, monkeypatch, batch):
    """With a scratch of 4 rows the dimensions form still solves each side in one launch (with
    ``batch_rows=3`` in launches of 3), and its half-steps equal the reference's."""
    f = 6
    monkeypatch.setattr(memory, "SCRATCH_BUDGET", 4 * 4 * (f * f + f))
    R = problem(seed=2)
    v = "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=8,nnz_batch=4,cg_steps=6"
    cfg = KernelConfig.parse(v + (f",batch_rows={batch}" if batch else ""))
    eng = Engine(cl_device, R, f, (cfg, cfg))
    try:
        for s in ("users", "items"):
            rows = eng.side[s].rows
            assert eng.batch_rows[s] == (batch or 4)
            want = [(r, min(batch or rows, rows - r), 0, 0) for r in range(0, rows, batch or rows)]
            assert eng.launches[s] == want
        X0, Y0 = ref.start_factors(*R.shape, f, 2)
        eng.set_factors("users", X0)
        eng.set_factors("items", Y0)
        eng.half_step("users", LAM, True)
        X = eng.get_factors("users")
        want = ref.half_step(R, Y0.astype(np.float64), LAM, solver="cg", X0=X0, cg_steps=6)
        assert rel_err(X, want) <= TOL
        eng.half_step("items", LAM, True)
        Y = eng.get_factors("items")
        want = ref.half_step(R.T.tocsr(), X.astype(np.float64), LAM, solver="cg", X0=Y0,
                             cg_steps=6)
        assert rel_err(Y, want) <= TOL
    finally:
        eng.release()
