"""Every S1 code variant (batch[+reg][+local][+vecN][+tile]) agrees with the NumPy reference
from the same init: ‖ΔX‖/‖X‖ ≤ 1e-4 after one iteration, on edge-case problems (empty rows and
columns, a row longer than any nnz batch, f not a multiple of the vector width or tile)."""
import numpy as np
import pytest
from conftest import random_ratings, rel_err

import clmf
from clmf import reference as ref
from clmf.engine.config import KernelConfig, hermitian_variants, representative_variants
from clmf.errors import InvalidConfigError

TOL = 1e-4
CI_F = [1, 3, 10, 17, 32]
FULL_F = [1, 5, 10, 16, 17, 32, 50, 64, 100, 128]


def edge_problem(f, seed=0):
    R = random_ratings(61, 43, 0.25, seed=seed + f, empty_rows=[2, 60], empty_cols=[5]).tolil()
    R[7, :] = 4.0                    # a row longer than any nnz batch / batch of rows
    R[7, 5] = 0.0
    R = R.tocsr()
    R.eliminate_zeros()
    return R


def mode_problem(f, seed=0):
    """The edge problem (empty rows 2 and m − 1, empty column 5, row 7 rated everywhere else),
    at least 3f × 2f so that the Gram matrices of implicit feedback are well conditioned at
    every f (with fewer users than factors XᵀX is singular and float32 loses ~3 digits)."""
    m, n = max(61, 3 * f), max(43, 2 * f)
    R = random_ratings(m, n, min(0.25, 12.0 / n), seed=seed + f, empty_rows=[2, m - 1],
                       empty_cols=[5]).tolil()
    R[7, :] = 4.0                    # a row longer than any nnz batch / batch of rows
    R[7, 5] = 0.0
    R = R.tocsr()
    R.eliminate_zeros()
    return R


EPS32 = float(np.finfo(np.float32).eps)


def tolerance(cfg, mode="explicit", kappa=1.0):
    """Relative error a correct kernel stays within after one iteration, by storage, solver and
    the systems' condition number ``kappa``: 1e-4 in float32 (the issue's table), 1e-2 with
    float16 storage; a float32 CG drifts from the float64 reference CG by about eps·cond(A) per
    step (×10); biases add a half-step's error to the other side's targets (×10 after two
    half-steps, as tests/test_feedback.py). Implicit feedback's systems (a dense Gram against a
    plain λI) have cond(A) in the hundreds to thousands: float32 rounding then bounds the error
    at about 4·eps·κ (Cholesky, backward stable) or 20·eps·κ (three CG steps from the start)."""
    tol = 1e-2 if cfg.storage == "float16" else TOL
    if cfg.solver != "cholesky":
        tol *= 10
    tol *= 10 if mode == "biased" else 1
    return max(tol, (20 if cfg.solver != "cholesky" else 4) * EPS32 * kappa)


def condition(R, Y, X, mode):
    """The largest condition number of the reference's normal equations of both half-steps
    (users' from ``Y``, items' from ``X``) in ``mode``."""
    out = 1.0
    for M, F in ((R, Y), (R.T.tocsr(), X)):
        rows = np.flatnonzero(np.diff(M.indptr))
        F = np.asarray(F, np.float64)
        if mode == "biased":
            F = np.column_stack([F, np.ones(len(F))])
        A = ref.hermitians(M, F, 0.1, mode != "implicit", rows=rows,
                           implicit_alpha=2.0 if mode == "implicit" else None)
        # the systems are symmetric positive definite: their 2-norm condition number is the
        # ratio of extreme eigenvalues (eigvalsh: a third of np.linalg.cond's SVD time at f = 130)
        w = np.abs(np.linalg.eigvalsh(A))
        out = max(out, float((w.max(axis=-1) / w.min(axis=-1)).max()))
    return out


def check(cl_device, variant, f, mode="explicit", single_row=None):
    """Fit one iteration with ``variant`` in ``mode`` (explicit, implicit with alpha 2, biased)
    and compare with the NumPy reference of the mode from the same start: relative error within
    :func:`tolerance`, empty rows and columns zero; ``single_row``: that user keeps one rating."""
    R = edge_problem(f) if mode == "explicit" else mode_problem(f)
    if single_row is not None:
        R = R.tolil()
        R[single_row, :] = 0.0
        R[single_row, 0] = 5.0
        R = R.tocsr()
        R.eliminate_zeros()
    X0, Y0 = ref.start_factors(*R.shape, f, 1)
    kw = {"implicit": dict(feedback="implicit", alpha=2.0), "biased": dict(biases=True)}
    try:
        m = clmf.ALS(f, iterations=1, variant=variant, device=cl_device, **kw.get(mode, {})).fit(
            R, init=(X0, Y0), show_progress=False)
    except InvalidConfigError as e:
        # only geometric impossibilities may be refused, never a build failure
        # (kernel_work_group_size: what the built kernel allows, e.g. its registers on a GPU)
        assert e.reason in ("geometry", "local_memory", "work_group_size", "registers",
                            "kernel_work_group_size"), e
        pytest.skip(f"{variant} invalid at f={f}: {e}")
    cfg = KernelConfig.parse(variant)
    assert m.config_["users"].config.solver == cfg.solver      # the variant as given
    empty_u, empty_i = [2, R.shape[0] - 1], [5]
    if mode == "biased":
        X, Y, bu, bi, _mu = ref.als_biased(R, f, 0.1, 1, init=(X0, Y0), solver=cfg.solver,
                                           cg_steps=cfg.cg_steps)
        got = [(np.column_stack([m.user_factors_, m.user_biases_]), np.column_stack([X, bu])),
               (np.column_stack([m.item_factors_, m.item_biases_]), np.column_stack([Y, bi]))]
    else:
        X, Y = ref.als(R, f, 0.1, 1, init=(X0, Y0), solver=cfg.solver, cg_steps=cfg.cg_steps,
                       weighted=mode != "implicit",
                       implicit_alpha=2.0 if mode == "implicit" else None)
        got = [(m.user_factors_, X), (m.item_factors_, Y)]
    tol = tolerance(cfg, mode, condition(R, Y0, X, mode) if mode != "explicit" else 1.0)
    errs = [rel_err(a, b) for a, b in got]
    assert max(errs) <= tol, (errs, tol)
    assert np.all(m.user_factors_[empty_u] == 0) and np.all(m.item_factors_[empty_i] == 0)


@pytest.mark.parametrize("f", CI_F)
@pytest.mark.parametrize("variant", representative_variants())
def test_variant_matches_reference(cl_device, variant, f):
    check(cl_device, variant, f)


@pytest.mark.slow
@pytest.mark.parametrize("f", FULL_F)
@pytest.mark.parametrize("variant", representative_variants())
def test_variant_full_sweep(cl_device, variant, f):
    check(cl_device, variant, f)


# the fused CG's dimensions form with several float4 slices per work-item (dims_q) and the sums of
# an entry's parts spread over work-items (dims_p) in every mode, users with 0, 1 and all
# ratings: f = 3 (one slice), 17 (5 slices: 2 per work-item over 3 work-items, the last slice
# partial; P = 3 does not divide them) and 130 (33 slices, 4 per work-item over 9 work-items: a
# GPU's geometry with 28 entry groups, f not a multiple of 4; one build per mode and device, the
# reason this check takes a few seconds)
DIMS_GEOMETRIES = [
    "batch+vec4:solver=fusedcg,fused_dims=1,dims_q=2,dims_p=0,solve_wg=16,nnz_batch=1",
    "batch+vec4:solver=fusedcg,fused_dims=1,dims_q=2,dims_p=3,solve_wg=16,nnz_batch=3,"
    "batch_rows=7",
    "batch+vec4:solver=fusedcg,fused_dims=1,dims_q=2,dims_p=2,solve_wg=64,nnz_batch=4,"
    "storage=float16"]
DIMS_GPU_GEOMETRY = ("batch+vec4:solver=fusedcg,fused_dims=1,dims_q=4,dims_p=0,solve_wg=256,"
                     "nnz_batch=2")


# (explicit at f = 1, 3, 10, 17 and 32: two of the representative variants are of this kind)
@pytest.mark.parametrize("variant,f,mode", [(v, 17, m) for v in DIMS_GEOMETRIES
                                            for m in ("explicit", "implicit", "biased")]
                         + [(DIMS_GEOMETRIES[0], 3, m) for m in ("implicit", "biased")])
def test_fused_dims_geometries_match_reference(cl_device, variant, f, mode):
    check(cl_device, variant, f, mode, single_row=11)


@pytest.mark.parametrize("mode", ["explicit", "implicit", "biased"])
def test_fused_dims_gpu_geometry_matches_reference(cl_device, mode):
    g = KernelConfig.parse(DIMS_GPU_GEOMETRY).fcg_geometry(130)
    assert (g["fd_f4"], g["fd_q"], g["fd_d"], g["fd_e"], g["fd_p"]) == (33, 4, 9, 28, 4)
    check(cl_device, DIMS_GPU_GEOMETRY, 130, mode, single_row=11)


# the butterfly over an entry's D lanes (clmf.engine.kernels.dims_shuffle): PTX shuffles on
# NVIDIA, elsewhere their emulation through local memory in the same pairwise order. D = 2
# (f = 17, 4 slices per work-item: slices past F4 read as 0), 4 (f = 50: the last slice
# partial) and 4 at one slice per work-item (f = 15; biased 16), 2 and 3 entries per group
DIMS_SHUFFLE = [("batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_q=4,solve_wg=32,"
                 "nnz_batch=3", 17),
                ("batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_q=4,solve_wg=32,"
                 "nnz_batch=3", 50),
                ("batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,solve_wg=64,nnz_batch=2,"
                 "batch_rows=7", 15),
                # the weights loaded by one lane each and shared by shuffles (2 entries, 4 lanes)
                ("batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_wshfl=1,dims_q=4,"
                 "solve_wg=32,nnz_batch=2", 50),
                # the entry sums reduce-scattered (4 lanes: 2 entries, one halving level and a
                # butterfly level; 4 entries, two halving levels; 1 entry, butterflies only)
                ("batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_rsum=1,dims_q=4,"
                 "solve_wg=32,nnz_batch=2", 50),
                ("batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_rsum=1,dims_q=4,"
                 "solve_wg=32,nnz_batch=4", 50),
                ("batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_rsum=1,solve_wg=64,"
                 "nnz_batch=1,batch_rows=7", 15),
                # D rounded up to a power of two, the slices past F4 zero: f = 21 (6 slices,
                # 2 a work-item: D = 3 -> 4, the last work-item's second slice empty) and
                # f = 10 (3 slices, 1 a work-item: D = 3 -> 4, one work-item without a slice)
                ("batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_rsum=1,dims_q=2,"
                 "solve_wg=32,nnz_batch=2", 21),
                ("batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,solve_wg=32,nnz_batch=3",
                 10)]


@pytest.mark.parametrize("variant,f", DIMS_SHUFFLE)
@pytest.mark.parametrize("mode", ["explicit", "implicit", "biased"])
def test_fused_dims_shuffle_matches_reference(cl_device, monkeypatch, variant, f, mode):
    from clmf.engine.device import device_info, platform_short, select_device
    from clmf.engine.kernels import dims_shuffle, validate
    info = device_info(select_device(cl_device))
    native = platform_short(info.platform) == "nvidia"
    monkeypatch.setenv("CLMF_SHFL_EMULATION", "1")         # (conftest sets it too)
    kf = f + 1 if mode == "biased" else f
    cfg = KernelConfig.parse(variant)
    assert validate(cfg, kf, info) and dims_shuffle(cfg, info) == (1 if native else 2)
    check(cl_device, variant, f, mode, single_row=11)


def assert_same_factors_with(cl_device, mode, base, extra, seed):
    """Fit ``base`` and ``base + extra`` (61 × 43, f = 50, 2 iterations, the same start) in
    ``mode``: the same factors bit for bit; the second fit's users configuration returned."""
    R = random_ratings(61, 43, 0.3, seed=seed, empty_rows=[2], empty_cols=[5])
    kw = dict(feedback="implicit", alpha=2.0) if mode == "implicit" else \
        dict(biases=True) if mode == "biased" else {}
    rng = np.random.default_rng(seed)
    init = (rng.standard_normal((61, 50)).astype(np.float32),
            rng.standard_normal((43, 50)).astype(np.float32))
    got = [clmf.ALS(50, 0.1, 2, device=cl_device, variant=base + w, **kw).fit(
        R, init=init, show_progress=False) for w in ("", extra)]
    for name in ("user_factors_", "item_factors_"):
        np.testing.assert_array_equal(getattr(got[1], name), getattr(got[0], name))
    return got[1].config_["users"].config


@pytest.mark.parametrize("mode", ["explicit", "implicit", "biased"])
def test_fused_dims_shared_weights_equal_per_lane_weights(cl_device, mode):
    """dims_wshfl takes each entry's weight factors from the one lane that loaded them: the same
    values, so the same factors bit for bit (3 entries per group, 4 lanes an entry)."""
    base = "batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_q=4,solve_wg=32,nnz_batch=3"
    assert assert_same_factors_with(cl_device, mode, base, ",dims_wshfl=1", 5).dims_wshfl


@pytest.mark.parametrize("mode", ["explicit", "implicit", "biased"])
@pytest.mark.parametrize("base", [
    "batch+vec4:solver=fusedcg,fused_dims=1,dims_q=2,solve_wg=16,nnz_batch=3",
    "batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_rsum=1,dims_q=4,solve_wg=32,"
    "nnz_batch=2"])
def test_fused_dims_pipelined_gathers_equal_unpipelined(cl_device, mode, base):
    """dims_pipe gathers each chunk's rows while the previous chunk is summed: the same
    arithmetic, so the same factors bit for bit (rows of 0 .. 30 entries: chunks of 1, 2 and
    more, the last one partial)."""
    assert assert_same_factors_with(cl_device, mode, base, ",dims_pipe=1", 7).dims_pipe


def test_fused_dims_pipe_registers_counted():
    """dims_pipe holds two chunks' rows: refused where they pass the 16 float4s."""
    from test_tuning_db import fake_info

    from clmf.engine.kernels import validate
    nv = fake_info(platform="NVIDIA CUDA")
    cfg = KernelConfig.parse("batch+vec4:solver=fusedcg,fused_dims=1,dims_q=4,solve_wg=256,"
                             "nnz_batch=4")
    assert validate(cfg, 256, nv) and validate(cfg.replace(nnz_batch=2, dims_pipe=True), 256, nv)
    with pytest.raises(InvalidConfigError) as e:
        validate(cfg.replace(dims_pipe=True), 256, nv)
    assert e.value.reason == "geometry" and "dims_pipe" in str(e.value)
    with pytest.raises(InvalidConfigError):
        KernelConfig.parse("batch+vec4:solver=fusedcg,dims_pipe=1")   # a fused_dims parameter


def test_fused_dims_shuffle_where_it_applies(monkeypatch):
    from test_tuning_db import fake_info
    monkeypatch.delenv("CLMF_SHFL_EMULATION", raising=False)

    from clmf.engine.kernels import dims_shuffle, render_als, validate
    nv = fake_info(platform="NVIDIA CUDA")
    cfg = KernelConfig.parse("batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_q=4,"
                             "solve_wg=256,nnz_batch=4")
    assert validate(cfg, 256, nv) and dims_shuffle(cfg, nv) == 1
    assert "shfl.sync" in render_als(cfg, 256, nv)
    off = cfg.replace(dims_shfl=False)
    assert dims_shuffle(off, nv) == 0 and "shfl.sync" not in render_als(off, 256, nv)
    # D = ceil(33 / 4) = 9 work-items an entry at f = 130: rounded up to 16
    assert validate(cfg, 130, nv) and cfg.fcg_geometry(130)["fd_d"] == 16
    for c, f, reason in ((cfg.replace(dims_q=1), 256, "geometry"),  # D = 64 > 32: not one warp
                         (cfg.replace(solve_wg=16), 64, "geometry"),  # not whole warps
                         (cfg, 256, "unsupported_device")):         # not NVIDIA (below)
        info = nv if reason == "geometry" else fake_info(platform="Intel(R) OpenCL")
        with pytest.raises(InvalidConfigError) as e:
            validate(c, f, info)
        assert e.value.reason == reason
    with pytest.raises(InvalidConfigError):
        KernelConfig.parse("batch+vec4:solver=cg,dims_shfl=1")     # a fused_dims parameter
    with pytest.raises(InvalidConfigError):
        KernelConfig.parse("batch+vec4:solver=fusedcg,fused_dims=1,dims_wshfl=1")  # of dims_shfl
    with pytest.raises(InvalidConfigError) as e:                   # 8 entries, 4 lanes an entry
        validate(cfg.replace(dims_wshfl=True, nnz_batch=8), 64, nv)
    assert e.value.reason == "geometry"
    assert validate(cfg.replace(dims_wshfl=True), 256, nv)        # 4 entries, 16 lanes
    assert "shfl.sync.idx" in render_als(cfg.replace(dims_wshfl=True), 256, nv)
    rs = cfg.replace(dims_rsum=True)                               # 4 entries, 16 lanes
    assert validate(rs, 256, nv) and "pcl_rsum(yv" in render_als(rs, 256, nv)
    assert "pcl_rsum(yv" not in render_als(cfg, 256, nv)
    for bad in (rs.replace(nnz_batch=3), rs.replace(nnz_batch=8)):  # no power of two; 8 > 4
        with pytest.raises(InvalidConfigError) as e:
            validate(bad, 64 if bad.nnz_batch == 8 else 256, nv)
        assert e.value.reason == "geometry"
    for text in ("dims_rsum=1", "dims_shfl=1,dims_wshfl=1,dims_rsum=1"):  # of dims_shfl, alone
        with pytest.raises(InvalidConfigError):
            KernelConfig.parse(f"batch+vec4:solver=fusedcg,fused_dims=1,{text}")
    monkeypatch.setenv("CLMF_SHFL_EMULATION", "1")         # (tests: the emulation elsewhere)
    intel = fake_info(platform="Intel(R) OpenCL")
    assert validate(cfg, 256, intel) and dims_shuffle(cfg, intel) == 2
    assert dims_shuffle(cfg, nv) == 1                 # PTX wherever it runs


# the hermitian path of implicit feedback (YᵀY once per half-step plus Σ (c − 1) y yᵀ through the
# S1 kernels) and of biases (issue 27): one variant of each S1 family in CI at f = 33 (above 32,
# no multiple of a vector width) and every S1 variant × Cholesky / CG at f = 8 … 128 in the slow
# sweep
MODE_CI_F = [33]
MODE_FULL_F = [8, 16, 33, 64, 128]


@pytest.mark.parametrize("f", MODE_CI_F)
@pytest.mark.parametrize("variant", hermitian_variants(per_family=True), ids=str)
@pytest.mark.parametrize("mode", ["implicit", "biased"])
def test_hermitian_modes_match_reference(cl_device, mode, variant, f):
    check(cl_device, variant, f, mode)


@pytest.mark.slow
@pytest.mark.parametrize("f", MODE_FULL_F)
@pytest.mark.parametrize("variant", hermitian_variants(), ids=str)
@pytest.mark.parametrize("mode", ["implicit", "biased"])
def test_hermitian_modes_full_sweep(cl_device, mode, variant, f):
    check(cl_device, variant, f, mode)


def test_per_side_variants(cl_device):
    R = edge_problem(10)
    X0, Y0 = ref.start_factors(*R.shape, 10, 1)
    m = clmf.ALS(10, iterations=1, device=cl_device,
                 variant=("batch+reg+local:tx=4,ty=4",
                          KernelConfig.parse("batch+local+tile:bx=8,by=8,tx=4,ty=4"))
                 ).fit(R, init=(X0, Y0), show_progress=False)
    assert m.config_["users"].config.name == "batch+reg+local"
    assert m.config_["items"].config.name == "batch+local+tile"
    Xr, Yr = ref.als(R, 10, 0.1, 1, init=(X0, Y0))
    assert rel_err(m.user_factors_, Xr) <= TOL and rel_err(m.item_factors_, Yr) <= TOL


@pytest.mark.parametrize("name", ["batch", "batch+reg", "batch+reg+local+vec8+tile",
                                  "batch+local+vec16"])
def test_variant_names_roundtrip(name):
    c = KernelConfig.parse(name + ":tx=2,ty=4")
    assert c.name == name and KernelConfig.parse(str(c)) == c
    assert KernelConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("bad", ["reg", "batch+local+reg", "batch+vec3", "batch:tx=x",
                                 "batch:nope=1", "batch+tile+reg"])
def test_bad_variant_names(bad):
    with pytest.raises(InvalidConfigError):
        KernelConfig.parse(bad)


def test_invalid_configs_rejected_with_reason():
    from clmf.engine.device import device_info, select_device
    from clmf.engine.kernels import validate
    info = device_info(select_device(clmf.devices()[0].index))
    with pytest.raises(InvalidConfigError) as e:
        validate(KernelConfig.parse(f"batch:tx={info.max_work_group_size},ty=2"), 8, info)
    assert e.value.reason == "work_group_size"
    with pytest.raises(InvalidConfigError) as e:
        validate(KernelConfig.parse("batch+reg:tx=1,ty=1"), 100, info)
    assert e.value.reason == "geometry"
    with pytest.raises(InvalidConfigError) as e:
        validate(KernelConfig.parse("batch+local:nnz_batch=100000"), 100, info)
    assert e.value.reason == "local_memory"
    with pytest.raises(InvalidConfigError) as e:
        validate(KernelConfig.parse("batch:solve_wg=32"), 8, info)
    assert e.value.reason == "geometry"


def test_float16_storage_rmse_close_to_float32(cl_device):
    from clmf import data
    train, test = data.default()
    kw = dict(factors=16, regularization=0.1, iterations=10, device=cl_device, random_state=0)
    r32 = clmf.ALS(**kw).fit(train, show_progress=False).rmse(test)
    m16 = clmf.ALS(storage="float16", **kw).fit(train, show_progress=False)
    assert m16.config_["users"].config.storage == "float16"
    assert abs(m16.rmse(test) - r32) <= 0.005 * r32


def test_cg_more_steps_approaches_cholesky(cl_device):
    R = edge_problem(10)
    X0, Y0 = ref.start_factors(*R.shape, 10, 1)
    Xc, _ = ref.als(R, 10, 0.1, 1, init=(X0, Y0))
    errs = []
    # rows with 1-2 ratings converge in ~2 steps; past that float32 and float64 CG part ways
    for steps in (1, 2, 3):
        m = clmf.ALS(10, iterations=1, device=cl_device, solver="cg",
                     variant=f"batch:cg_steps={steps}").fit(R, init=(X0, Y0), show_progress=False)
        Xr, Yr = ref.als(R, 10, 0.1, 1, init=(X0, Y0), solver="cg", cg_steps=steps)
        assert rel_err(m.user_factors_, Xr) <= TOL and rel_err(m.item_factors_, Yr) <= TOL
        errs.append(rel_err(m.user_factors_, Xc))
    assert errs[2] < errs[1] < errs[0]


def test_solve_vec_applies_to_the_one_work_item_fused_cg_only():
    from clmf.autotune.space import canonical
    from clmf.engine.kernels import render_als
    c = KernelConfig.parse("batch:solve_wg=1,solve_vec=8,solver=fusedcg")
    assert c.svec(10) == 8 and "typedef float8 svec" in render_als(c, 10, implicit=True)
    for other in (c.replace(solver="cg"), c.replace(solve_wg=2)):
        assert other.svec(10) == 0 and "svec" not in render_als(other, 10, implicit=True)
        assert canonical(other).solve_vec == 0
    assert canonical(c).solve_vec == 8
    assert KernelConfig.from_dict(c.to_dict()) == c and KernelConfig.parse(str(c)) == c
    with pytest.raises(InvalidConfigError):
        KernelConfig.parse("batch:solve_wg=1,solve_vec=3,solver=fusedcg")
