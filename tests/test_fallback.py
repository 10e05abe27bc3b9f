"""A tuning never breaks a fit (clmf.tuning.fallback): a planted record whose configuration fails to
build (no s1_hermitian kernel, as PyPI's PoCL 3.0 did) or whose probe process aborts is reported
once and the fit falls back; a caller's own variant still raises."""
from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
from conftest import random_ratings

import clmf
from clmf import tuning
from clmf.engine import kernels
from clmf.engine.config import KernelConfig
from clmf.engine.device import device_info
from clmf.errors import InvalidConfigError
from clmf.tuning import fallback
from clmf.tuning.database import Database, base_record

F = 8
PLANTED = "batch+reg:tx=4,ty=4,nnz_batch=16"


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Only the planted shipped file is searched; fresh rejection/probe state and probe cache."""
    shipped = tmp_path / "shipped.jsonl"
    monkeypatch.delenv("CLMF_TUNING_DB", raising=False)
    monkeypatch.delenv(fallback.PROBE_ENV, raising=False)
    monkeypatch.setattr(tuning.database, "user_db_path", lambda: tmp_path / "none" / "tuning.jsonl")
    monkeypatch.setattr(tuning.database, "shipped_paths", lambda: [shipped])
    monkeypatch.setattr(fallback, "_rejected", {})
    monkeypatch.setattr(fallback, "_probed", {})
    monkeypatch.setattr(fallback, "probe_cache_path", lambda: tmp_path / "probes.json")
    return shipped


def plant(path, device, R, variant=PLANTED, run_id="planted-run"):
    """Shipped ``best`` records (both sides) of ``variant`` for ``device`` and R's class."""
    ds = {"m": R.shape[0], "n": R.shape[1], "nnz": int(R.nnz), "name": "planted"}
    cfg = KernelConfig.parse(variant)
    Database(path).append([
        base_record("best", run_id=run_id, device=device, f=F, storage="float32", side=side,
                    dataset=ds, config=cfg.to_dict(), variant=str(cfg), seconds=1.0,
                    iteration_rel_baseline=0.5)
        for side in ("users", "items")])
    return cfg


def fallback_warnings(rec):
    return [w for w in rec if issubclass(w.category, fallback.TuningFallbackWarning)]


def drop_s1_from_planted(monkeypatch, cfg, how="no_s1"):
    """kernels.build, for the planted configuration's source: a program without s1_hermitian
    (what PyPI's PoCL 3.0 returned), a kernel work-group limit of 1, or a failed build."""
    real = kernels.build

    def build(context, source, options=kernels.BUILD_OPTIONS):
        if f"{cfg}" in source and how == "build_fails":
            raise InvalidConfigError("OpenCL build failed: simulated", "build_failed")
        prog = real(context, source, options)
        if f"{cfg}" in source and "s1_hermitian" in prog.kernels:
            prog = kernels.Program(prog.program, source, options)
            if how == "no_s1":
                del prog.kernels["s1_hermitian"]
            else:
                prog.work_group_limit = lambda name, device: 1
        return prog
    monkeypatch.setattr(kernels, "build", build)


@pytest.mark.parametrize("how,reason", [("no_s1", "s1_hermitian"),
                                        ("wg_limit", "at most 1"),
                                        ("build_fails", "build failed")])
def test_planted_record_that_cannot_run_falls_back_with_one_warning(cl_device, isolated,
                                                                     monkeypatch, how, reason):
    R = random_ratings(60, 45, density=0.25, seed=3)
    info = device_info(cl_device)
    cfg = plant(isolated, tuning.device_record(info), R)     # "tuned" on this device and driver
    drop_s1_from_planted(monkeypatch, cfg, how)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        m1 = clmf.ALS(factors=F, iterations=3, random_state=0, device=cl_device,
                      solver="cholesky").fit(R, show_progress=False)
        m2 = clmf.ALS(factors=F, iterations=3, random_state=0, device=cl_device,
                      solver="cholesky").fit(R, show_progress=False)
    ws = fallback_warnings(rec)
    assert len(ws) == 1, [str(w.message) for w in ws]
    msg = str(ws[0].message)
    assert str(cfg) in msg and "shipped database" in msg and reason in msg
    for m in (m1, m2):
        assert m.config_["users"].config != cfg.replace(solver="cholesky")
        assert m.config_["users"].rule in ("heuristic", "baseline")
    # the fallback fit is the ALS model: same factors as the plain variant given explicitly
    ref = clmf.ALS(factors=F, iterations=3, random_state=0, device=cl_device,
                   variant="batch", solver="cholesky").fit(R, show_progress=False)
    np.testing.assert_allclose(m1.user_factors_, ref.user_factors_, rtol=2e-3, atol=2e-4)


def test_callers_own_variant_still_raises(cl_device, isolated, monkeypatch):
    R = random_ratings(30, 20, density=0.3, seed=4)
    cfg = KernelConfig.parse(PLANTED).replace(solver="cholesky")
    drop_s1_from_planted(monkeypatch, cfg)
    with pytest.raises(InvalidConfigError, match="s1_hermitian"):
        clmf.ALS(factors=F, iterations=1, device=cl_device, variant=str(cfg)).fit(
            R, show_progress=False)


def test_probe_that_aborts_rejects_a_foreign_record(cl_device, isolated, monkeypatch):
    R = random_ratings(50, 40, density=0.25, seed=5)
    info = device_info(cl_device)
    other = dict(tuning.device_record(info), device="Another " + info.name, driver="0.0-other")
    cfg = plant(isolated, other, R)                         # the "vendor" rule: never ran here
    calls = []

    def aborting():
        calls.append(1)
        return [sys.executable, "-c", "import os, sys; sys.stderr.write('LLVM ERROR: "
                "simulated\\n'); sys.stderr.flush(); os.abort()"]
    monkeypatch.setattr(fallback, "_probe_command", aborting)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        m = clmf.ALS(factors=F, iterations=2, random_state=0, device=cl_device,
                     solver="cholesky").fit(R, show_progress=False)
        clmf.ALS(factors=F, iterations=2, random_state=0, device=cl_device,
                 solver="cholesky").fit(R, show_progress=False)
    ws = fallback_warnings(rec)
    assert len(ws) == 1 and len(calls) == 1
    assert "SIGABRT" in str(ws[0].message) and "LLVM ERROR: simulated" in str(ws[0].message)
    assert m.config_["users"].rule in ("heuristic", "baseline")
    assert np.isfinite(m.rmse(R))
    # a new process (fresh in-memory state) reads the verdict from the disk cache: no child
    monkeypatch.setattr(fallback, "_rejected", {})
    monkeypatch.setattr(fallback, "_probed", {})
    monkeypatch.setattr(fallback, "_probe_command", lambda: pytest.fail("probed again"))
    assert fallback.probe(info, cfg.replace(solver="cholesky"), F, "explicit") is not None


def test_real_probe_accepts_the_plain_variant(cl_device, isolated):
    info = device_info(cl_device)
    assert fallback.probe(info, KernelConfig(), F, "explicit") is None
    assert fallback.probe(info, KernelConfig(solver="fusedcg"), F, "implicit") is None


def test_probe_off_and_rejections_are_per_configuration(isolated, monkeypatch):
    from test_tuning_db import fake_info
    info = fake_info()
    a, b = KernelConfig(), KernelConfig(reg=True, tx=2, ty=2)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fallback.reject(info, a, 8, "explicit", "somewhere", "it broke")
        fallback.reject(info, a, 8, "explicit", "somewhere", "it broke again")
    assert len(fallback_warnings(rec)) == 1
    assert fallback.rejection(info, a, 8, "explicit") == "it broke"
    assert fallback.rejection(info, a, 16, "explicit") is None
    assert fallback.rejection(info, b, 8, "explicit") is None
    assert not fallback.usable(info, a, 8, "explicit", "x")
    monkeypatch.setenv(fallback.PROBE_ENV, "off")
    monkeypatch.setattr(fallback, "_probe_command", lambda: pytest.fail("probed with off"))
    assert fallback.usable(info, b, 8, "explicit", "x", record_device=None)


# ----- no probe for what already ran on this device and driver ------------------------------------
def _probe_spy(monkeypatch):
    """Count the probe children of a faked device (seen by the process; each probe passes)."""
    calls = []
    monkeypatch.setattr(fallback, "_device_present", lambda info: True)
    monkeypatch.setattr(fallback, "_probe_command",
                        lambda: calls.append(1) or [sys.executable, "-c", "pass"])
    return calls


def _choose_both(info, R):
    """The lookup's choice of both sides of a fit of R on ``info`` (no warning allowed)."""
    stats = {"users": tuning.side_stats(np.diff(R.indptr), R.shape[1]),
             "items": tuning.side_stats(np.bincount(R.indices, minlength=R.shape[1]),
                                        R.shape[0])}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return [tuning.choose(info, F, side, stats[side], "float32", None)
                for side in ("users", "items")]


@pytest.mark.parametrize("driver,probes", [("1.0", 0), ("0.9", 1)])
def test_shipped_record_of_this_device_and_driver_is_not_probed(isolated, monkeypatch, driver,
                                                                probes):
    """A shipped tuning measured on this device name *and* driver ran here already: no probe
    child. The same device with another driver: the configuration is probed (once)."""
    from test_tuning_db import fake_info
    info = fake_info(driver="1.0")
    calls = _probe_spy(monkeypatch)
    R = random_ratings(60, 45, density=0.25, seed=3)
    cfg = plant(isolated, dict(tuning.device_record(info), driver=driver), R)
    chosen = _choose_both(info, R)
    assert [c.rule for c in chosen] == ["tuned", "tuned"]
    assert all(c.config == cfg for c in chosen)
    assert len(calls) == probes


def _measured(device, variant=PLANTED, run_id="measured-run"):
    """``ok`` measurements (both sides) of ``variant`` on ``device``."""
    cfg = KernelConfig.parse(variant)
    return [base_record("measurement", status="ok", run_id=run_id, device=device, f=F,
                        storage="float32", side=side, dataset={"m": 60, "n": 45, "nnz": 675,
                                                               "name": "x"},
                        config=cfg.to_dict(), variant=str(cfg), seconds=1.0)
            for side in ("users", "items")]


@pytest.mark.parametrize("rung", ["vendor", "default"])
@pytest.mark.parametrize("driver,probes", [("1.0", 0), ("0.9", 1)])
def test_configuration_measured_on_this_device_and_driver_is_not_probed(
        isolated, monkeypatch, rung, driver, probes):
    """Another device's record (the vendor rung) or the computed default is probed unless the
    same configuration was measured (status ok) in this mode on this device and driver."""
    from test_tuning_db import fake_info
    info = fake_info(driver="1.0")
    calls = _probe_spy(monkeypatch)
    R = random_ratings(60, 45, density=0.25, seed=3)
    here = tuning.device_record(info)
    # measured here too, at an f far from the case's (8×: farther than the selection model
    # looks, and no "best" record for the nearest rung)
    measured = [dict(r, f=8 * F) for r in _measured(dict(here, driver=driver))]
    if rung == "vendor":
        plant(isolated, dict(here, device="Fake GPU 2", driver="7.0"), R)
    Database(isolated).append(measured)
    chosen = _choose_both(info, R)
    assert [c.rule for c in chosen] == [rung, rung]
    assert all(c.config == KernelConfig.parse(PLANTED) for c in chosen)
    assert len(calls) == probes


# ----- device capabilities (clmf.engine.capability): 16-wide vectors --------------------------
def test_real_devices_build_wide_vectors(cl_device, tmp_path, monkeypatch):
    """Debian's PoCL, Intel's runtime and NVIDIA build 16-wide float fma (checked in a child)."""
    from clmf.engine import capability
    monkeypatch.setattr(capability, "_known", {})
    monkeypatch.setattr(capability, "_cache_path", lambda: tmp_path / "caps.json")
    monkeypatch.delenv(fallback.PROBE_ENV, raising=False)
    assert capability.wide_vectors_ok(device_info(cl_device))
    assert "wide_vectors" in (tmp_path / "caps.json").read_text()


def test_runtime_without_wide_vectors_refuses_vec16_at_once(cl_device, tmp_path, monkeypatch):
    """A runtime whose compiler aborts on 16-wide vectors (PyPI's PoCL 3.0): validate refuses
    vec16 / solve_vec=16 with a typed reason, 8-wide ones still pass, the verdict is cached on
    disk (no second child in a fresh process)."""
    from clmf.engine import capability
    info = device_info(cl_device)
    monkeypatch.setattr(capability, "_known", {})
    monkeypatch.setattr(capability, "_cache_path", lambda: tmp_path / "caps.json")
    monkeypatch.delenv(fallback.PROBE_ENV, raising=False)
    calls = []

    def aborting(job):
        calls.append(job)
        return False, "the child process was killed by SIGABRT (LLVM ERROR: simulated)"
    monkeypatch.setattr(capability, "_check_in_child", aborting)
    wide = KernelConfig.parse("batch+reg+vec16:tx=4,ty=4")
    with pytest.raises(InvalidConfigError) as e:
        kernels.validate(wide, 32, info)
    assert e.value.reason == "unsupported_device" and "16-wide" in str(e.value)
    svec = KernelConfig.parse("batch:solver=fusedcg,solve_wg=1,solve_vec=16")
    with pytest.raises(InvalidConfigError):
        kernels.validate(svec, 32, info)
    kernels.validate(KernelConfig.parse("batch+reg+vec8:tx=4,ty=4"), 32, info)
    kernels.validate(svec.replace(solve_vec=8), 32, info)
    assert len(calls) == 1
    monkeypatch.setattr(capability, "_known", {})
    monkeypatch.setattr(capability, "_check_in_child", lambda job: pytest.fail("checked again"))
    assert not capability.wide_vectors_ok(info)


def test_probe_timeout_from_the_environment(monkeypatch):
    monkeypatch.delenv(fallback.PROBE_TIMEOUT_ENV, raising=False)
    assert fallback.probe_timeout() == fallback.PROBE_TIMEOUT
    monkeypatch.setenv(fallback.PROBE_TIMEOUT_ENV, "7.5")
    assert fallback.probe_timeout() == 7.5
    for bad in ("abc", "-1", "0", "nan"):
        monkeypatch.setenv(fallback.PROBE_TIMEOUT_ENV, bad)
        assert fallback.probe_timeout() == fallback.PROBE_TIMEOUT


def test_a_probe_past_its_timeout_rejects_the_configuration(cl_device, isolated, monkeypatch):
    """A child that does not finish in time is killed and its configuration rejected (the fit
    falls through instead of stalling for minutes)."""
    info = device_info(cl_device)
    monkeypatch.setattr(fallback, "_probe_command",
                        lambda: [sys.executable, "-c", "import time; time.sleep(30)"])
    monkeypatch.setenv(fallback.PROBE_TIMEOUT_ENV, "1")
    reason = fallback.probe(info, KernelConfig(), F, "explicit")
    assert reason is not None and "did not finish in 1 s" in reason
