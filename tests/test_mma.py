"""The tensor-core S1 variant (batch+vec4+mma): against the NumPy reference in every mode on
devices that have tensor cores (NVIDIA, compute capability ≥ 8.0), and through its emulation
(same staging, guards, split-K reduction and write-back; the mma replaced by per-lane sums) on
every other device. Elsewhere it is filtered out of the tuning lookup, never failing a fit."""
import dataclasses

import numpy as np
import pytest
from conftest import random_ratings, rel_err

import clmf
from clmf import reference as ref
from clmf.engine.config import KernelConfig
from clmf.engine.device import device_info, select_device
from clmf.engine.kernels import mma_supported, validate
from clmf.errors import InvalidConfigError

TOL = 1e-4
# shapes: one warp, no split-K; warps × slices with chunks that end mid k-group; a CG solver;
# float16 storage; the plain TF32 precision
VARIANTS = ["batch+vec4+mma:tx=1,ks=1,nnz_batch=8",
            "batch+vec4+mma:tx=2,ks=2,nnz_batch=16,batch_rows=9",
            "batch+vec4+mma:tx=4,ks=1,nnz_batch=32,solver=cg",
            "batch+vec4+mma:tx=2,ks=1,nnz_batch=16,storage=float16",
            "batch+vec4+mma:tx=4,ks=2,nnz_batch=16,precision=tf32",
            # the CG in the S1 work-group (systems kept in local memory), b aug / apart
            "batch+vec4+mma:tx=2,ks=2,nnz_batch=16,solver=cg,fused_solve=1,batch_rows=9",
            "batch+vec4+mma:tx=3,ks=1,nnz_batch=8,solver=cg,cg_steps=2,fused_solve=1",
            # the hermitian written from the warps' registers (no packed triangle), b aug / apart
            "batch+vec4+mma:tx=3,nnz_batch=16,direct=1,batch_rows=9",
            "batch+vec4+mma:tx=2,nnz_batch=8,solver=cg,direct=3"]
# on a GPU every f of the issue, with the shapes that hold the largest f (one variant per path:
# split-K, CG, float16 storage, TF32, the fused solve); on CPUs (the emulation is slow) all
# shapes at a few f
GPU_SKIP = {VARIANTS[0]}
CPU_F = [1, 3, 16, 17]
GPU_F = [8, 10, 16, 17, 32, 50, 64, 100, 128, 256]


def _info(cl_device):
    return device_info(select_device(cl_device))


def _tol(variant):
    cfg = KernelConfig.parse(variant)
    if cfg.storage == "float16":
        return 1e-2
    if cfg.precision == "tf32":
        return 2e-2                     # 10-bit mantissas: ~1e-3 relative per sum
    return TOL


def fit(f, *args, **kw):
    """``clmf.ALS(f, ...).fit`` on the test problem, or None where the variant's geometry does not
    fit f (too many accumulators for its warps: a typed refusal, never a build failure)."""
    R, init = problem(f)
    try:
        return R, init, clmf.ALS(f, *args, **kw).fit(R, init=init, show_progress=False)
    except InvalidConfigError as e:
        assert e.reason in ("geometry", "local_memory", "work_group_size"), e
        return R, init, None


def problem(f, seed=0):
    # at least 3f rows each way: tensor cores accumulate with truncation, and the small edge
    # problem's systems at f = 50..128 are ill-conditioned enough to magnify it past 1e-4
    m, n = max(61, 3 * f), max(43, 3 * f)
    R = random_ratings(m, n, 0.25, seed=seed + f, empty_rows=[2, m - 1],
                       empty_cols=[5]).tolil()
    R[7, :] = 3.0                        # a row longer than any chunk (and ends mid k-group)
    R[7, 5] = 0
    R = R.tocsr()
    R.eliminate_zeros()
    # standard-normal start factors: from start_factors' small values, a CG's first steps leave
    # the item side's factors nearly confined to a few Krylov directions, so the next systems are
    # ill-conditioned and float32 rounding alone lands ~1e-3 from the float64 reference (the CG
    # variants at f >= 32 on the H100, and the baseline batch CG on PoCL alike)
    rng = np.random.default_rng(seed + f)
    return R, (rng.standard_normal((m, f)).astype(np.float32),
               rng.standard_normal((n, f)).astype(np.float32))


@pytest.fixture
def mma_device(cl_device, monkeypatch, request):
    """The device, with the emulation switched on where it has no tensor cores; the f values
    to check (every f of the issue on a GPU, a few on CPUs, where the emulation is slow)."""
    if not mma_supported(_info(cl_device)):
        monkeypatch.setenv("CLMF_MMA_EMULATION", "1")
        return cl_device, CPU_F
    variant = request.node.callspec.params.get("variant")
    if variant in GPU_SKIP:
        pytest.skip("one warp holds too few blocks for the GPU's f values (checked on CPUs)")
    return cl_device, GPU_F


@pytest.mark.parametrize("variant", VARIANTS)
def test_mma_explicit_matches_reference(mma_device, variant):
    dev, fs = mma_device
    cfg = KernelConfig.parse(variant)
    ran, errs = 0, {}
    for f in fs:
        R, init, m = fit(f, 0.1, 1, device=dev, variant=variant)
        if m is None:
            continue
        ran += 1
        assert m.config_["users"].config.mma
        Xr, Yr = ref.als(R, f, 0.1, 1, init=init, solver=cfg.solver,
                         cg_steps=cfg.cg_steps)
        errs[f] = max(rel_err(m.user_factors_, Xr), rel_err(m.item_factors_, Yr))
        assert np.all(m.user_factors_[[2, -1]] == 0) and np.all(m.item_factors_[5] == 0)
    assert ran >= len(fs) // 2
    assert max(errs.values()) <= _tol(variant), errs       # every f's error, in one report


@pytest.mark.parametrize("variant", VARIANTS[:3] + VARIANTS[4:])
def test_mma_implicit_matches_reference(mma_device, variant):
    dev, fs = mma_device
    cfg = KernelConfig.parse(variant)
    errs = {}
    for f in fs:
        R, init, m = fit(f, 0.1, 1, device=dev, variant=variant, feedback="implicit",
                         alpha=2.0, solver=cfg.solver)
        if m is None:
            continue
        Xr, Yr = ref.als(R, f, 0.1, 1, weighted=False, init=init, implicit_alpha=2.0,
                         solver=cfg.solver, cg_steps=cfg.cg_steps)
        errs[f] = max(rel_err(m.user_factors_, Xr), rel_err(m.item_factors_, Yr))
        assert np.all(m.user_factors_[2] == 0)
    assert errs and max(errs.values()) <= _tol(variant), errs


@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[1], VARIANTS[4], VARIANTS[5],
                                     VARIANTS[7]])
def test_mma_biased_matches_reference(mma_device, variant):
    dev, fs = mma_device
    cfg = KernelConfig.parse(variant)
    errs = {}
    for f in fs:
        R, init, m = fit(f, 0.1, 2, device=dev, variant=variant, biases=True,
                         solver=cfg.solver)
        if m is None:
            continue
        X, Y, bu, bi, mu = ref.als_biased(R, f, 0.1, 2, init=init, solver=cfg.solver,
                                          cg_steps=cfg.cg_steps)
        errs[f] = max(rel_err(got, want) for got, want in (
            (m.user_factors_, X), (m.item_factors_, Y), (m.user_biases_, bu),
            (m.item_biases_, bi)))
        assert m.user_biases_[2] == 0 and m.item_biases_[5] == 0
    assert errs and max(errs.values()) <= 10 * _tol(variant), errs


def test_mma_rejected_without_tensor_cores(cl_device, monkeypatch):
    """On a device without tensor cores the variant is refused with a typed reason (an explicit
    request fails loudly; the lookup filters it out)."""
    info = _info(cl_device)
    if mma_supported(info):
        pytest.skip("this device has tensor cores")
    monkeypatch.delenv("CLMF_MMA_EMULATION", raising=False)
    with pytest.raises(InvalidConfigError) as e:
        validate(KernelConfig.parse("batch+vec4+mma:tx=4"), 32, info)
    assert e.value.reason == "unsupported_device"


def test_lookup_filters_mma_records_on_other_devices(cl_device, monkeypatch):
    """An mma record for this very device (faked) is passed over where the device lacks tensor
    cores, even with the emulation switched on: the fit runs another configuration."""
    from clmf.tuning import lookup
    info = _info(cl_device)
    if mma_supported(info):
        pytest.skip("this device has tensor cores")
    monkeypatch.setenv("CLMF_MMA_EMULATION", "1")
    mma = KernelConfig.parse("batch+vec4+mma:tx=2,ks=1,nnz_batch=16")
    assert lookup._fits({"users": mma, "items": mma}, info, 16, "float32") is None
    R, init = problem(16)
    m = clmf.ALS(16, 0.1, 1, device=cl_device).fit(R, init=init, show_progress=False)
    assert not m.config_["users"].config.mma and not m.config_["items"].config.mma


def test_mma_config_grammar():
    c = KernelConfig.parse("batch+vec4+mma:tx=4,ks=2,nnz_batch=32,precision=tf32")
    assert c.name == "batch+vec4+mma" and c.precision == "tf32" and c.fuses_rhs
    assert KernelConfig.parse(str(c)) == c and KernelConfig.from_dict(c.to_dict()) == c
    g = c.s1_geometry(100)
    assert g["fp"] == 112 and g["nblk"] == 28 and g["wg"] == 256 and g["slots"] == 7
    for bad in ["batch+mma", "batch+vec4+syrk+mma", "batch+vec4+mma:nnz_batch=12",
                "batch+vec4+mma:ks=3", "batch+vec4+syrk:precision=tf32",
                "batch+vec4+mma:precision=fp16"]:
        with pytest.raises(InvalidConfigError):
            KernelConfig.parse(bad)


def test_tuner_space_offers_mma_only_with_tensor_cores(cl_device):
    """The default and full tuning spaces hold mma configurations on a device that reports
    tensor cores (a faked NVIDIA compute capability 9.0) and none on this device."""
    import dataclasses

    from clmf.autotune.space import make_space
    info = _info(cl_device)
    nv = dataclasses.replace(info, platform="NVIDIA CUDA", vendor="NVIDIA Corporation",
                             type="GPU", compute_capability=(9, 0), local_mem=48 * 1024,
                             max_work_group_size=1024, max_work_item_sizes=(1024, 1024, 64))
    for name in ("default", "full"):
        space = make_space(name, 100, nv)
        assert any(fl[-1] for fl in space.flags)
        cfg = space._valid(KernelConfig.parse("batch+vec4+mma:tx=7,nnz_batch=32,solver=cg"), nv)
        assert cfg is not None and cfg.mma and cfg.tx == 7
        if not mma_supported(info):
            assert not any(fl[-1] for fl in make_space(name, 100, info).flags)
    with pytest.raises(InvalidConfigError):
        from clmf.autotune.space import prune
        prune(KernelConfig.parse("batch+vec4+mma:tx=16"), 10, nv)     # 16 warps for 1 block


@pytest.mark.parametrize("mode", [{}, dict(feedback="implicit", alpha=2.0),
                                  dict(biases=True)], ids=["explicit", "implicit", "biased"])
def test_mma_direct_equals_packed(mma_device, mode):
    """The registers' write-back gives the packed triangle's values bit for bit (one slice), in
    one work-group per row or several: the lower triangle and its mirror, the diagonal and G
    added alike, row F as b."""
    dev, _ = mma_device
    for f in (3, 17):                    # b rides along as row F (explicit) / is summed apart
        R, init = problem(f)
        # one group per row; three (more warps than f = 3's one block: idle warps)
        got = [clmf.ALS(f, 0.1, 2, device=dev, variant=f"batch+vec4+mma:tx=1,nnz_batch=16,"
                        f"direct={d}", **mode).fit(R, init=init, show_progress=False)
               for d in (0, 1, 3)]
        for m in got[1:]:
            for name in ("user_factors_", "item_factors_"):
                np.testing.assert_array_equal(getattr(m, name), getattr(got[0], name))
        assert got[2].config_["items"].config.direct == 3


def test_mma_direct_holds_f_whose_triangle_does_not_fit(cl_device, monkeypatch):
    """At f = 256 the packed triangle (136 blocks, 139 KB) exceeds local memory: refused with a
    typed reason, while the direct form stages only the chunk; direct needs ks = 1 and no
    fused solve."""
    monkeypatch.setenv("CLMF_MMA_EMULATION", "1")
    # this device's limits with an H100's 48 KB of local memory (CPU runtimes report more)
    info = dataclasses.replace(_info(cl_device), local_mem=48 * 1024)
    packed = KernelConfig.parse("batch+vec4+mma:tx=16,nnz_batch=16")
    direct = packed.replace(direct=1)
    assert direct.local_mem_bytes(256) < info.local_mem < packed.local_mem_bytes(256)
    with pytest.raises(InvalidConfigError) as e:
        validate(packed, 256, info)
    assert e.value.reason == "local_memory"
    assert validate(direct, 256, info)
    for bad in ("batch+vec4+mma:tx=2,ks=2,direct=1",
                "batch+vec4+mma:tx=2,solver=cg,fused_solve=1,direct=1",
                "batch+vec4+mma:tx=16,direct=8",
                "batch+vec4+syrk:direct=1"):
        with pytest.raises(InvalidConfigError) as e:
            KernelConfig.parse(bad)
        assert e.value.reason == "direct"
