"""Fuzz-style cases, as an attacker and a careless user would try them (issue 22): tuning records
are untrusted input, a fit is all-or-nothing, memory is planned before it is taken, overflow is
named, nothing is lost on a fault. Each case failed before the fix it guards."""
from __future__ import annotations

import json
import os
import re
import stat
import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DEVICES, random_ratings

import clmf
from clmf import reference, tuning
from clmf.data.validation import check_ratings
from clmf.engine import kernels, memory
from clmf.engine.config import KernelConfig
from clmf.engine.device import DeviceInfo, device_info
from clmf.errors import (
    DeviceMemoryError,
    HostMemoryError,
    InvalidConfigError,
    RatingRangeError,
    SingularSystemError,
)
from clmf.tuning.database import Database

# the payloads of issue 22, verbatim, and one that compiles
INJECT = ("*/ #define fma(a,b,c) ((a)*(b)*0.9f+(c)) __kernel void clmf_injected(...) {...} /*")
INJECT_COMPILES = ("*/ #define fma(a,b,c) ((a)*(b)*0.9f+(c)) __kernel void clmf_injected("
                   "__global float *x) { x[0] = 1.0f; } /*")
ERROR = "*/ #error x /*"


@pytest.fixture
def dbenv(tmp_path, monkeypatch):
    """$CLMF_TUNING_DB and the per-user database under tmp_path; no shipped tunings."""
    env = tmp_path / "env.jsonl"
    user = tmp_path / "user.jsonl"
    monkeypatch.setenv("CLMF_TUNING_DB", str(env))
    monkeypatch.setattr(tuning.database, "user_db_path", lambda: user)
    monkeypatch.setattr(tuning.database, "shipped_paths", lambda: [])
    return {"env": env, "user": user, "tmp": tmp_path}


def _best(info, f, R, config, run_id="r1", **over):
    """The two ``best`` records of a tuning run of ``R`` on ``info`` with ``config`` (a dict)."""
    m, n = R.shape
    out = []
    for side in ("users", "items"):
        r = {"schema_version": 1, "kind": "best", "run_id": run_id, "date": "2026-11-22T00:00:00",
             "device": tuning.device_record(info), "f": f, "storage": "float32", "side": side,
             "dataset": {"m": m, "n": n, "nnz": int(R.nnz)}, "config": dict(config),
             "iteration_rel_baseline": 0.5}
        r.update(over)
        out.append(r)
    return out


def _write(path, records, tail=b""):
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records) + tail)


def _fake_info(**kw):
    import dataclasses
    d = dict(index="0:0", platform="FakeCL", platform_version="FakeCL 3.0", vendor="FakeVendor",
             name="Fake GPU", type="GPU", driver="1.0", opencl_c_version="OpenCL C 1.2",
             compute_units=8, global_mem=8 << 30, max_alloc=2 << 30, local_mem=48 * 1024,
             local_mem_type="local", max_work_group_size=1024, max_work_item_sizes=(1024, 1024, 64),
             preferred_vector_width_float=1, native_vector_width_float=1, clock_mhz=1000)
    d.update(kw)
    names = {f.name for f in dataclasses.fields(DeviceInfo)}
    return DeviceInfo(**{k: v for k, v in d.items() if k in names})


def _stats(R, side):
    m, n = R.shape
    rows, cols = (m, n) if side == "users" else (n, m)
    return {"rows": rows, "cols": cols, "nnz": int(R.nnz), "mean": R.nnz / rows, "max": 10}


# ----- tuning records are untrusted input ---------------------------------------------------------
@pytest.mark.parametrize("payload", [INJECT, INJECT_COMPILES, ERROR])
def test_config_fields_are_strictly_typed(payload):
    with pytest.raises(InvalidConfigError, match="triangle"):
        KernelConfig.from_dict({"triangle": payload})
    for field in ("solver", "storage"):
        with pytest.raises(InvalidConfigError, match=field):
            KernelConfig.from_dict({field: payload})
    with pytest.raises(InvalidConfigError, match="solver|variant|parameter"):
        KernelConfig.parse(f"batch:solver={payload}")


@pytest.mark.parametrize("fields", [
    {"reg": 1}, {"reg": "true"}, {"triangle": None}, {"tx": True}, {"tx": 4.0}, {"tx": "4"},
    {"tx": 0}, {"tx": 1 << 40}, {"cg_steps": 2000000000}, {"batch_rows": -1}, {"vec": 3},
    {"vec": False}, {"solver": ["cg"]}, {"storage": "float64"}, {"nnz_batch": 10 ** 30},
])
def test_bad_field_values_are_refused(fields):
    with pytest.raises(InvalidConfigError):
        KernelConfig.from_dict(fields)


@pytest.mark.parametrize("text", ["batch:solver=cg,cg_steps=99999999999999999999",
                                  "batch:tx=1_0", "batch:tx=\uff11", "batch:tx= +4",
                                  "batch:triangle=maybe", "batch:tx=-1"])
def test_variant_strings_are_validated(text):
    with pytest.raises(InvalidConfigError):
        KernelConfig.parse(text)
    with pytest.raises(InvalidConfigError):          # before any device work
        clmf.ALS(factors=4, variant=text, device="no such device").fit(random_ratings(5, 5, 0.5))


def test_cg_steps_bounded_by_f():
    info = _fake_info()
    cfg = KernelConfig.parse("batch:solver=cg,cg_steps=50")
    with pytest.raises(InvalidConfigError, match="cg_steps"):
        kernels.validate(cfg, 10, info)
    assert kernels.validate(cfg, 50, info)
    # the default 3 steps stay allowed at f < 3 (what an untuned CG fit runs)
    assert kernels.validate(KernelConfig.parse("batch:solver=fusedcg"), 2, info)


def test_only_whitelisted_text_is_rendered():
    with pytest.raises(InvalidConfigError, match="may not be rendered"):
        kernels.render("metrics.cl.j2", f=4, ldf=4, storage="float32", wg=128, implicit=False,
                       biased=False, config_str="x */ #error y /*")
    src = kernels.render_als(KernelConfig.parse("batch+reg:tx=2,ty=2,triangle=0"), 4)
    assert "#error" not in src


@pytest.mark.parametrize("payload", [INJECT, ERROR])
def test_injected_record_is_skipped_alone(dbenv, payload):
    info = _fake_info()
    R = random_ratings(40, 30, 0.3, seed=1)
    good = _best(info, 10, R, KernelConfig.parse("batch+reg:tx=2,ty=5").to_dict(), "good")
    bad = _best(info, 10, R, {**KernelConfig().to_dict(), "triangle": payload}, "bad",
                date="2026-11-23T00:00:00")          # newer: it would win if it were read
    _write(dbenv["env"], good + bad)
    with pytest.warns(tuning.TuningDatabaseWarning,
                      match=rf"{dbenv['env']}: 2 record\(s\) skipped.*line 3.*triangle"):
        ch = tuning.choose(info, 10, "users", _stats(R, "users"))
    assert ch.rule == "tuned" and "run good" in ch.reason
    assert ch.config == KernelConfig.parse("batch+reg:tx=2,ty=5")


def test_hanging_and_broken_records_leave_the_other_sources_serving(dbenv):
    info = _fake_info()
    R = random_ratings(40, 30, 0.3, seed=1)
    hang = _best(info, 10, R, {**KernelConfig.parse("batch:solver=cg").to_dict(),
                               "cg_steps": 2000000000}, "hang")
    oops = _best(info, 10, R, KernelConfig().to_dict(), "oops", device="oops")
    _write(dbenv["env"], hang + oops)
    _write(dbenv["user"], _best(info, 10, R, KernelConfig.parse("batch+reg:tx=5,ty=2").to_dict(),
                                "user"))
    with pytest.warns(tuning.TuningDatabaseWarning) as rec:
        ch = tuning.choose(info, 10, "users", _stats(R, "users"))
    text = " ".join(str(w.message) for w in rec)
    assert "cg_steps" in text and "device must be an object" in text and "line 3" in text
    assert ch.rule == "tuned" and "run user" in ch.reason          # the user database serves


def test_injected_record_on_a_real_fit(cl_device, dbenv):
    info = device_info(cl_device)
    R = random_ratings(40, 30, 0.3, seed=2)
    bad = _best(info, 4, R, {**KernelConfig().to_dict(), "triangle": INJECT_COMPILES})
    _write(dbenv["env"], bad)
    kernels._programs.clear()
    with pytest.warns(tuning.TuningDatabaseWarning, match="line 1"):
        m = clmf.ALS(factors=4, iterations=2, device=cl_device, random_state=0).fit(
            R, show_progress=False)
    assert m.config_["users"].rule != "tuned"
    assert not any("clmf_injected" in p.source or "#define fma" in p.source
                   for p in kernels._programs.values())
    clean = clmf.ALS(factors=4, iterations=2, device=cl_device, random_state=0,
                     variant=m.config_["users"].config).fit(R, show_progress=False)
    np.testing.assert_allclose(m.user_factors_, clean.user_factors_, rtol=1e-5, atol=1e-6)


def test_cli_variant_is_refused_without_traceback(tmp_path, capsys):
    from clmf.cli import main
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n" + "".join(f"{u},{i},{(u + i) % 5 + 1}\n"
                                                    for u in range(8) for i in range(6)))
    rc = main(["fit", str(path), "--variant", "batch:solver=cg,cg_steps=99999999999999999999",
               "--output", str(tmp_path / "m.npz")])
    err = capsys.readouterr().err
    assert rc != 0 and "cg_steps" in err and "Traceback" not in err
    assert not (tmp_path / "m.npz").exists()


# ----- the tuner survives interruption -----------------------------------------------------------
def test_torn_tail_is_repaired_and_fit_uses_the_good_records(dbenv):
    info = _fake_info()
    R = random_ratings(40, 30, 0.3, seed=1)
    good = _best(info, 10, R, KernelConfig.parse("batch+reg:tx=2,ty=5").to_dict())
    _write(dbenv["env"], good, tail=b'{"schema_version": 1, "kind": "be')
    with pytest.warns(tuning.TuningDatabaseWarning, match="line 3.*torn"):
        assert tuning.choose(info, 10, "users", _stats(R, "users")).rule == "tuned"
    db = Database(dbenv["env"])
    db.append(_best(info, 50, R, KernelConfig().to_dict(), "r2"))        # not refused
    lines = dbenv["env"].read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(x) for x in lines[:-1]) and len(lines) == 5
    assert len(db.records()) == 4
    # a last line that lacks only its newline is kept, not dropped
    dbenv["env"].write_bytes(dbenv["env"].read_bytes().rstrip(b"\n"))
    db.append(_best(info, 20, R, KernelConfig().to_dict(), "r3"))
    assert len(Database(dbenv["env"]).records()) == 6


def _tiny_space(f):
    from clmf.autotune.space import Space
    return Space("tiny", f, [(False, False, 0, False), (True, True, 0, False)],
                 dict(tx=[2, 4], ty=[2, 4], nnz_batch=[8], bx=[f], by=[f], square_tiles=True,
                      tz=[1], solve_wg=[0], solver=["cholesky"], cg_steps=[3]))


class _Killed(BaseException):
    """The process dying mid-measurement (SIGKILL: no handler runs)."""


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_interrupted_measurement_is_retried(dbenv, monkeypatch):
    from clmf.autotune import strategies
    from clmf.autotune.measure import Measurer
    case = strategies.Case(DEVICES[0], random_ratings(120, 90, 0.1, seed=6), 4, "tiny", "float32")
    real = Measurer.evaluate
    calls = []

    def flaky(exc, at):
        def evaluate(self, cfg, fidelity="full", verified=None):
            calls.append(cfg.key())
            if len(calls) == at:
                raise exc
            return real(self, cfg, fidelity, verified)
        return evaluate

    kw = dict(db=dbenv["env"], state_dir=dbenv["tmp"] / "state", progress=False,
              sample_time=0.01)
    monkeypatch.setattr(Measurer, "evaluate", flaky(KeyboardInterrupt(), 3))
    with pytest.raises(KeyboardInterrupt):
        strategies.run(case, _tiny_space(4), "exhaustive", **kw)
    hit = calls[2]
    recs = [json.loads(x) for x in dbenv["env"].read_text().splitlines()]
    intr = [r for r in recs if r.get("status") == "interrupted"]
    assert len(intr) == 1 and intr[0]["reason"] == "interrupted"
    assert KernelConfig.from_dict(intr[0]["config"]).key() == hit
    # resumed: the interrupted configuration is measured again, nothing else twice; then the
    # process dies in that same configuration twice: only then is it given up as crashed
    calls.clear()
    monkeypatch.setattr(Measurer, "evaluate", flaky(_Killed(), 1))
    with pytest.raises(_Killed):
        strategies.run(case, _tiny_space(4), "exhaustive", **kw)
    assert calls == [hit]
    calls.clear()
    with pytest.raises(_Killed):
        strategies.run(case, _tiny_space(4), "exhaustive", **kw)
    assert calls == [hit]                    # killed once: measured again
    calls.clear()
    monkeypatch.setattr(Measurer, "evaluate", flaky(_Killed(), 0))
    summary = strategies.run(case, _tiny_space(4), "exhaustive", **kw)
    assert hit not in calls and summary["best"] is not None
    recs = [json.loads(x) for x in dbenv["env"].read_text().splitlines()]
    crashed = [r for r in recs if r.get("reason") == "crashed"]
    assert len(crashed) == 1 and KernelConfig.from_dict(crashed[0]["config"]).key() == hit


# ----- fit is all-or-nothing -------------------------------------------------------------------
def _ratings(seed, users, items, n):
    rng = np.random.default_rng(seed)
    pairs = rng.choice(users * items, n, replace=False)
    return clmf.data.Ratings.from_triples(1000 + pairs // items, 5000 + pairs % items,
                                              rng.integers(1, 6, n).astype(np.float32))


def _state(m):
    keys = ("user_factors_", "item_factors_", "user_ids_", "item_ids_", "user_counts_",
            "item_counts_", "global_mean_", "history_", "best_iteration_", "config_", "device_")
    return {k: getattr(m, k) for k in keys}


ALL = {"filter_already_liked_items": False}     # no training data given: rank every item


def _assert_unchanged(m, before, raw_user):
    for k, v in before.items():
        now = getattr(m, k)
        if isinstance(v, np.ndarray):
            assert now is v or np.array_equal(now, v), k
        else:
            assert now == v, k
    ids, scores = m.recommend_raw(raw_user, N=3, **ALL)
    return ids, scores


@pytest.fixture
def fitted_pair(cl_device):
    a = _ratings(1, 40, 30, 400)
    b = _ratings(2, 55, 20, 300)
    m = clmf.ALS(factors=4, iterations=3, device=cl_device, random_state=0).fit(
        a, show_progress=False)
    return m, a, b


def test_failed_refit_keeps_the_model(fitted_pair, tmp_path):
    m, a, b = fitted_pair
    raw_user = int(a.user_ids[1])
    ids0, scores0 = m.recommend_raw(raw_user, N=3, **ALL)
    before = _state(m)
    with pytest.raises(ValueError, match="early_stopping_rounds needs validation"):
        m.fit(b, early_stopping_rounds=2)                         # the issue's exact case
    ids, scores = _assert_unchanged(m, before, raw_user)
    np.testing.assert_array_equal(ids, ids0)
    np.testing.assert_array_equal(scores, scores0)
    m.save(tmp_path / "m.npz")
    loaded = clmf.load(tmp_path / "m.npz")
    np.testing.assert_array_equal(loaded.recommend_raw(raw_user, N=3, **ALL)[0], ids0)
    with pytest.raises(clmf.NoOpenCLError):                       # a bad device name
        m.set_params(device="no such device 42").fit(b, show_progress=False)
    _assert_unchanged(m, before, raw_user)


def test_interrupted_refit_keeps_the_model(fitted_pair):
    m, a, b = fitted_pair
    raw_user = int(a.user_ids[1])
    before = _state(m)

    def ctrl_c(it, elapsed, metrics):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        m.fit(b.to_csr(), callback=ctrl_c)                        # another shape, no id maps
    _assert_unchanged(m, before, raw_user)
    assert np.isfinite(m.rmse(a))


# ----- memory is planned before it is taken ---------------------------------------------------
def _peak_during(fn):
    tracemalloc.start()
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        err = e
    else:
        err = None
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return err, peak


@pytest.mark.parametrize("big", [2 ** 31 + 5, 2 * 10 ** 8])
def test_ids_implying_a_huge_matrix_are_refused_early(big):
    def fit():
        clmf.ALS(factors=4, device="no such device").fit(
            (np.array([0, big, 1, 2]), np.array([0, 1, 1, 0]), np.array([1.0, 2.0, 3.0, 4.0])))
    err, peak = _peak_during(fit)
    assert isinstance(err, ValueError) and "Ratings.from_triples" in str(err)
    assert peak < 32 << 20
    err, peak = _peak_during(lambda: clmf.ALS(factors=4).fit(   # the issue-13 case verbatim
        (np.array([0, 2 ** 31 + 5]), np.array([0, 1]), np.array([1.0, 2.0]))))
    assert isinstance(err, ValueError) and "Ratings.from_triples" in str(err)
    assert peak < 32 << 20
    # a sparse matrix of that shape: CSR at 2·10⁸ rows; beyond 2³¹ rows its COO, since a CSR's
    # row pointers alone would be 17 GB to build in the test (20-60 s) before clmf sees it
    fmt = sp.coo_matrix if big >= 2 ** 31 else sp.csr_matrix
    with pytest.raises(ValueError, match="from_triples"):
        clmf.ALS().fit(fmt((np.ones(2), ([0, 1], [0, 1])), shape=(big, 2)))


def test_host_plan_refuses_before_the_start_factors(monkeypatch):
    monkeypatch.setattr(memory, "available_host_memory", lambda: 16 << 30)

    def no_start(*a, **k):
        raise AssertionError("start factors allocated before the memory plan said no")

    monkeypatch.setattr(reference, "start_factors", no_start)
    m = 2_200_000
    R = sp.csr_matrix((np.ones(m, np.float32), (np.arange(m), np.arange(m) % 1000)),
                      shape=(m, 1000))
    with pytest.raises((HostMemoryError, DeviceMemoryError), match=r"needs \d+ bytes"):
        clmf.ALS(factors=1000, iterations=1).fit(R, show_progress=False)


def test_device_plan_counts_the_gram_buffers():
    info = _fake_info(type="CPU", global_mem=25_276_510_208, max_alloc=12_638_255_104,
                      max_work_group_size=8192)
    f = 46341
    cfg = KernelConfig()
    plan = memory.plan_fit(100, 50, 1000, f, (cfg, cfg), info)
    assert plan.device["gram_users"] == plan.device["gram_items"] == 4 * f * f
    assert plan.device["scratch_users"] == 4 * f * f + 4 * f        # batch of one row: A and B
    with pytest.raises(DeviceMemoryError, match=rf"needs {plan.device_total} bytes") as e:
        plan.check_device(info)
    assert e.value.needed == plan.device_total
    # implicit fits add the virtual rows of the Gram; validation its triples
    p2 = memory.plan_fit(100, 50, 1000, 8, (cfg, cfg), info, implicit=True, validation_nnz=77)
    assert p2.device["implicit_users"] > 0 and p2.device["metrics"] >= 12 * 77


def test_engine_memory_matches_the_plan(cl_device):
    from clmf.engine.core import Engine
    R = random_ratings(50, 40, 0.2, seed=3)
    cfg = KernelConfig.parse("batch:batch_rows=16")
    eng = Engine(cl_device, R, 6, (cfg, cfg))
    try:
        created = sum(b.size for side in eng.buf.values() for b in side.values()
                      if hasattr(b, "size")) + sum(b.size for b in eng.factors.values())
        created += eng.status.size
        planned = eng.memory["total"] - eng.memory.get("metrics", 0)
        # (the plan allows each side's indices and values their wraps from below, where the
        # runtime needs aligned host arrays: up to host_align bytes each)
        from clmf.engine.upload import host_align
        assert created <= planned <= created + 64 + 4 * host_align(device_info(cl_device))
    finally:
        eng.release()


# ----- overflow is named -------------------------------------------------------------------------
@pytest.mark.parametrize("scale,storage,solver", [
    (1e20, "float32", "cholesky"), (1e30, "float32", "cholesky"), (1e20, "float32", "cg"),
    (1e5, "float16", "cholesky"), (1e39, "float32", "cholesky")])
def test_overflow_is_named(cl_device, scale, storage, solver):
    R = random_ratings(60, 40, 0.3, seed=4).tocoo()
    X = (R.row, R.col, R.data.astype(np.float64) * scale)
    with pytest.raises(RatingRangeError) as e:
        clmf.ALS(factors=6, iterations=3, device=cl_device, storage=storage, solver=solver,
                 random_state=0).fit(X, show_progress=False)
    msg = str(e.value)
    assert (storage in msg) and "work" in msg and "increase regularization" not in msg
    assert not isinstance(e.value, SingularSystemError)


def test_float32_cast_overflow_is_named_before_any_work():
    with pytest.raises(RatingRangeError, match="float32"):
        clmf.data.Ratings.from_triples([1, 2], [3, 4], np.array([1e39, 2.0]))
    with pytest.raises(RatingRangeError, match="float32"):
        clmf.ALS(device="no such device").fit((np.array([0, 1]), np.array([1, 0]),
                                               np.array([1e39, 2.0])))


def test_moderate_scales_still_fit(cl_device):
    R = random_ratings(60, 40, 0.6, seed=4)                # every row has more ratings than f
    for scale, storage in ((1e3, "float32"), (1e3, "float16")):
        m = clmf.ALS(factors=6, iterations=3, device=cl_device, storage=storage,
                     random_state=0).fit(R * scale, show_progress=False)
        assert np.isfinite(m.user_factors_).all()


def test_regularization_below_precision_is_named(cl_device):
    R = random_ratings(60, 40, 0.1, seed=4)                # rows with fewer ratings than f
    try:
        clmf.ALS(factors=8, iterations=3, device=cl_device, solver="cholesky",
                 random_state=0).fit(R * 1e12, show_progress=False)
    except RatingRangeError as e:
        assert "precision" in str(e) and "divide the ratings" in str(e)
    else:                                                  # a runtime whose rounding held up
        pass


# ----- persistence -------------------------------------------------------------------------------
@pytest.fixture
def saved(fitted_pair, tmp_path):
    m, a, b = fitted_pair
    path = tmp_path / "model.npz"
    m.save(path)
    return m, path


def test_save_keeps_permissions_and_cleans_stale_temps(saved):
    m, path = saved
    os.chmod(path, 0o600)
    stale = path.parent / f".{path.name}.999999999.abcd.tmp"   # a killed save's leftover
    stale.write_bytes(b"x" * 1000)
    m.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not stale.exists()
    assert sorted(os.listdir(path.parent)) == ["model.npz"]


def test_save_checks_consistency(saved):
    m, path = saved
    before = path.read_bytes()
    m.item_ids_ = m.item_ids_[:-1]
    with pytest.raises(ValueError, match="item_ids_"):
        m.save(path)
    assert path.read_bytes() == before
    m.item_ids_ = None
    m.user_factors_ = m.user_factors_.copy()
    m.user_factors_[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        m.save(path)
    assert path.read_bytes() == before


def _rewrite(src, dst, change):
    with np.load(src, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    np.savez_compressed(dst, **change(members))
    return dst


def test_load_reads_only_known_members(saved, tmp_path):
    m, path = saved
    bomb = _rewrite(path, tmp_path / "bomb.npz",
                    lambda d: {**d, "unused": np.zeros(50 << 20, np.uint8)})
    assert os.path.getsize(bomb) < 2 << 20
    err, peak = _peak_during(lambda: clmf.load(bomb))
    assert err is None and peak < 16 << 20
    huge = _rewrite(path, tmp_path / "huge.npz",
                    lambda d: {**d, "user_counts": np.zeros(50 << 20, np.int64)})
    err, peak = _peak_during(lambda: clmf.load(huge))
    assert isinstance(err, ValueError) and str(huge) in str(err) and "bytes" in str(err)
    assert peak < 16 << 20


@pytest.mark.parametrize("name,change,match", [
    ("nan", lambda d: {**d, "user_factors": np.full_like(d["user_factors"], np.nan)}, "NaN"),
    ("meta-list", lambda d: {**d, "meta": np.array("[1, 2]")}, "meta"),
    ("params-str", lambda d: {**d, "meta": np.array(json.dumps(
        {**json.loads(str(d["meta"])), "params": "oops"}))}, "params"),
    ("config-int", lambda d: {**d, "meta": np.array(json.dumps(
        {**json.loads(str(d["meta"])), "config": {"users": 3}}))}, "corrupted"),
    ("variant", lambda d: {**d, "meta": np.array(json.dumps(
        {**json.loads(str(d["meta"])), "params": {"variant": ERROR}}))}, "parameters"),
    ("mean-str", lambda d: {**d, "global_mean": np.array("abc")}, "global_mean"),
    ("mean-vec", lambda d: {**d, "global_mean": np.ones(3)}, "global_mean"),
    ("mean-inf", lambda d: {**d, "global_mean": np.array(np.inf)}, "global_mean"),
])
def test_every_load_failure_is_a_value_error_naming_the_file(saved, tmp_path, name, change,
                                                             match):
    m, path = saved
    bad = _rewrite(path, tmp_path / f"{name}.npz", change)
    with pytest.raises(ValueError, match=match) as e:
        clmf.load(bad)
    assert str(bad) in str(e.value)


# ----- loaders -----------------------------------------------------------------------------------
def test_truncated_gzip_names_the_file(tmp_path, capsys):
    import gzip

    from clmf.cli import main
    text = "user,item,rating\n" + "".join(f"{u},{i},{(u * i) % 5 + 1}\n"
                                           for u in range(50) for i in range(40))
    full = gzip.compress(text.encode())
    path = tmp_path / "ratings.csv.gz"
    path.write_bytes(full[: len(full) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt gzip") as e:
        clmf.data.load(path)
    assert str(path) in str(e.value)
    rc = main(["fit", str(path), "--output", str(tmp_path / "m.npz")])
    err = capsys.readouterr().err
    assert rc != 0 and "truncated or corrupt gzip" in err and "Traceback" not in err


@pytest.mark.parametrize("ids", [["1", "\uff11", "1_0", "10"], ["1", "01"], ["5", "+5"]])
def test_integer_ids_are_ascii_digits_only(tmp_path, ids):
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n" + "".join(f"{u},7,{k + 1}\n" for k, u in enumerate(ids)),
                    encoding="utf-8")
    r = clmf.data.load(path)
    assert len(r.user_ids) == len(ids)              # distinct texts stay distinct users
    assert sorted(map(str, r.user_ids)) == sorted(ids)


def test_movielens_ids_refuse_non_ascii_digits(tmp_path):
    path = tmp_path / "u.data"
    path.write_text("1\t7\t4\t881250949\n\uff11\t8\t3\t881250950\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2.*ASCII digits"):
        clmf.data.load(path)


def test_cli_reports_memory_errors_and_interrupts_without_traceback(tmp_path, capsys,
                                                                    monkeypatch):
    from clmf import cli
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n" + "".join(f"{u},{i},{(u + i) % 5 + 1}\n"
                                                    for u in range(8) for i in range(6)))
    monkeypatch.setattr(memory, "available_host_memory", lambda: 1024)
    assert cli.main(["fit", str(path), "--output", str(tmp_path / "m.npz")]) == 1  # runtime error
    err = capsys.readouterr().err
    assert "host memory" in err and "bytes" in err and "Traceback" not in err

    def ctrl_c(args):
        raise KeyboardInterrupt

    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(parser(), ctrl_c))
    assert cli.main(["tune", str(path)]) == 130
    assert "resume" in capsys.readouterr().err


def _with_func(parser, func):
    """The CLI parser with every sub-command's handler replaced by ``func``."""
    parser.set_defaults(func=func)
    for action in parser._subparsers._group_actions:
        for sub in action.choices.values():
            sub.set_defaults(func=func)
    return parser


# ----- issue 33: every public call checks what fit checks ----------------------------------------
# Fold-in, load, the loaders, recommend_all, the Dask path and the command line refuse what fit
# refuses, with the same error types; each case let a wrong result through (or an unclear
# error) before.
def _host_model(biases=False, feedback="explicit", n_users=30, n_items=20, f=4):
    """A fitted-looking model (factors set directly: fold-in runs on the host, no device)."""
    rng = np.random.default_rng(5)
    m = clmf.ALS(factors=f, biases=biases, feedback=feedback)
    m.user_factors_ = rng.standard_normal((n_users, f)).astype(np.float32)
    m.item_factors_ = rng.standard_normal((n_items, f)).astype(np.float32)
    m.user_counts_ = np.full(n_users, 3, np.int64)
    m.item_counts_ = np.full(n_items, 4, np.int64)
    m.global_mean_ = 3.0
    if biases:
        m.user_biases_ = rng.standard_normal(n_users).astype(np.float32)
        m.item_biases_ = rng.standard_normal(n_items).astype(np.float32)
    return m


def _row(values, cols, n, rows=None):
    """A CSR of ``values`` at ``cols`` (one row unless ``rows`` are given), float64, kept as
    given (duplicates are not summed)."""
    rows = np.zeros(len(cols), np.int64) if rows is None else np.asarray(rows)
    indptr = np.searchsorted(rows, np.arange(rows.max() + 2))
    return sp.csr_matrix((np.asarray(values, np.float64), np.asarray(cols), indptr),
                         shape=(int(rows.max()) + 1, n))


FOLD_IN = {
    "partial_fit_users": lambda m, M: m.partial_fit_users([0], M),
    "partial_fit_users(new)": lambda m, M: m.partial_fit_users([m.user_factors_.shape[0]], M),
    "recalculate_user": lambda m, M: m.recalculate_user(0, M),
    "recommend(recalculate_user)": lambda m, M: m.recommend(0, M, recalculate_user=True),
    "partial_fit_items": lambda m, M: m.partial_fit_items([0], M),
    "recalculate_item": lambda m, M: m.recalculate_item(0, M),
}


@pytest.mark.parametrize("call", list(FOLD_IN))
@pytest.mark.parametrize("biases", [False, True], ids=["plain", "biased"])
@pytest.mark.parametrize("case", ["1e300", "1e39", "nan", "inf", "duplicates",
                                  "decreasing-indptr"])
def test_fold_in_refuses_what_fit_refuses(call, biases, case):
    m = _host_model(biases)
    n = m.item_factors_.shape[0] if "user" in call else m.user_factors_.shape[0]
    M = {"1e300": lambda: _row([1e300, 3.0], [0, 1], n),
         "1e39": lambda: _row([1e39, 3.0], [0, 1], n),
         "nan": lambda: _row([np.nan, 3.0], [0, 1], n),
         "inf": lambda: _row([np.inf, 3.0], [0, 1], n),
         "duplicates": lambda: _row([5.0, 5.0], [2, 2], n),        # summed to one 10 before
         "decreasing-indptr": lambda: sp.csr_matrix(
             (np.array([1.0, 2.0, 3.0]), np.array([0, 1, 2]), np.array([0, 2, 1])),
             shape=(2, n))}[case]()
    with pytest.raises(Exception) as fit_err:          # what fit makes of the same matrix
        clmf.ALS(factors=4, device="no such device").fit(M)
    assert isinstance(fit_err.value, ValueError)       # (refused before any device work)
    before = {k: np.array(v, copy=True) for k, v in vars(m).items() if k.endswith("_")
              and isinstance(v, np.ndarray)}
    with pytest.raises(type(fit_err.value)) as e:      # the same error type as fit
        FOLD_IN[call](m, M)
    assert type(e.value) is type(fit_err.value), (e.value, fit_err.value)
    for k, v in before.items():                        # nothing stored
        np.testing.assert_array_equal(getattr(m, k), v, err_msg=k)


@pytest.mark.parametrize("call", ["partial_fit_users", "recalculate_user", "partial_fit_items"])
def test_fold_in_refuses_negative_implicit_strengths(call):
    m = _host_model(feedback="implicit")
    n = m.item_factors_.shape[0] if "user" in call else m.user_factors_.shape[0]
    M = _row([-1.0, 3.0], [0, 1], n)
    with pytest.raises(ValueError, match="non-negative") as fit_err:
        clmf.ALS(factors=4, feedback="implicit", device="no such device").fit(M)
    with pytest.raises(ValueError, match="non-negative") as e:
        FOLD_IN[call](m, M)
    assert type(e.value) is type(fit_err.value)


def test_fold_in_still_folds_in_valid_rows():
    m = _host_model()
    M = _row([5.0, 3.0, 0.0], [0, 1, 4], 20)           # an explicit zero is a rating
    x = m.recalculate_user(0, M)
    ref = reference.half_step(M, m.item_factors_.astype(np.float64), m.regularization, True)
    np.testing.assert_allclose(x, ref[0], rtol=1e-5, atol=1e-6)
    m.partial_fit_users([30], M)
    np.testing.assert_allclose(m.user_factors_[30], ref[0], rtol=1e-5, atol=1e-6)
    assert m.user_counts_[30] == 3


@pytest.mark.parametrize("bad", [-5, 0, 2.5, True])
def test_recommend_all_refuses_bad_batch_sizes(bad):
    m = _host_model()
    with pytest.raises(ValueError, match="batch_size"):
        m.recommend_all(10, batch_size=bad)
    with pytest.raises(ValueError, match="batch_size"):
        next(m.iter_recommend_all(10, batch_size=bad))
    assert m.recommend_all(10, batch_size=7,
                           filter_already_liked_items=False)[0].shape == (30, 10)


@pytest.mark.parametrize("indptr,indices,match", [
    ([0, 2, 1, 3], [0, 1, 2], "decreasing indptr"),        # SciPy's own check refuses it
    ([0, 1, 2, 2], [0, 1, 2], "indptr from 0 to 2"),       # ends before the last entry
    ([1, 1, 2, 3], [0, 1, 2], "indptr from 1 to 3"),
    ([0, 1, 3], [0, 1, 2], "3 row pointers"),              # too few pointers
    ([0, 1, 2, 3], [0, 5, 1], "index 5 out of range"),
])
def test_invalid_csr_is_refused(indptr, indices, match):
    M = sp.csr_matrix(np.eye(3))                           # then broken as a caller could
    M.indptr, M.indices, M.data = np.array(indptr), np.array(indices), np.ones(3)
    with pytest.raises(ValueError, match=match):
        clmf.ALS(factors=2, device="no such device").fit(M)
    with pytest.raises(ValueError, match=match):
        check_ratings(M)
    m = _host_model(n_users=3, n_items=3)                  # also where only its pattern counts
    with pytest.raises(ValueError, match=match):
        m.recommend([0, 1, 2], M, N=2)
    with pytest.raises(ValueError, match=match):
        m.recommend_all(2, M)


def test_strided_csr_arrays_are_made_contiguous(cl_device):
    R = random_ratings(40, 30, 0.3, seed=7)
    wide = np.zeros((R.nnz, 2), np.float32)
    wide[:, 0] = R.data
    S = sp.csr_matrix((wide[:, 0], R.indices, R.indptr), shape=R.shape, copy=False)
    assert not S.data.flags.c_contiguous                  # a strided view of the caller's
    kw = dict(factors=4, iterations=2, device=cl_device, random_state=0)
    a = clmf.ALS(**kw).fit(S, show_progress=False)
    b = clmf.ALS(**kw).fit(R, show_progress=False)
    np.testing.assert_array_equal(a.user_factors_, b.user_factors_)


# ----- max_device_memory: one rule ------------------------------------------------------------
def test_max_device_memory_rule():
    from clmf.data.validation import check_memory_cap
    from clmf.engine.memory import device_budget
    g = 10 << 30
    assert check_memory_cap(1, g) == 1                     # an int is bytes: 1 is one byte
    assert check_memory_cap(np.int64(4096), g) == 4096
    assert check_memory_cap(1.0, g) == g                   # a float ≤ 1 is a fraction
    assert check_memory_cap(0.25, g) == g // 4
    assert check_memory_cap(8e9, g) == 8_000_000_000       # a float above 1 counts bytes
    assert device_budget(g, g, 1) == (1, 1)
    assert device_budget(g, g // 4, 0.5) == (g // 2, g // 4)


@pytest.mark.parametrize("cap", ["abc", "1MB", float("nan"), float("inf"), 0, -1, -0.5, True,
                                 [1]])
def test_bad_max_device_memory_is_named_before_any_work(cap):
    with pytest.raises((ValueError, TypeError), match="max_device_memory"):
        clmf.ALS(factors=2, max_device_memory=cap, device="no such device").fit(
            random_ratings(5, 5, 0.5))


def test_max_device_memory_one_byte_is_refused_by_the_plan(cl_device):
    with pytest.raises(DeviceMemoryError, match="bytes") as e:
        clmf.ALS(factors=4, iterations=1, device=cl_device, max_device_memory=1).fit(
            random_ratings(30, 20, 0.3), show_progress=False)
    assert "(1 bytes)" in str(e.value)


# ----- load is as strict as save ----------------------------------------------------------------
def _f64_with(value):
    def change(d):
        X = d["user_factors"].astype(np.float64)
        X[0, 0] = value
        return {**d, "user_factors": X}
    return change


def _meta_params(**over):
    def change(d):
        meta = json.loads(str(d["meta"]))
        meta["params"] = {**meta["params"], **over}
        return {**d, "meta": np.array(json.dumps(meta))}
    return change


@pytest.mark.parametrize("name,change,match", [
    ("f64-1e300", _f64_with(1e300), "NaN/inf"),            # inf once cast to float32
    ("f64-1e39", _f64_with(1e39), "NaN/inf"),
    ("uint64-counts", lambda d: {**d, "user_counts": np.full(d["user_counts"].shape, 2 ** 64 - 1,
                                                               np.uint64)}, "int64"),
    ("dup-ids", lambda d: {**d, "user_ids": np.zeros_like(d["user_ids"])}, "repeated"),
    ("nan-ids", lambda d: {**d, "item_ids": np.full(d["item_ids"].shape, np.nan)}, "NaN"),
    ("factors-param", _meta_params(factors=7), "factors=7"),
    ("mean-1e300", lambda d: {**d, "global_mean": np.array(1e300)}, "global_mean"),
    ("biases-1e300", lambda d: {**d, "user_biases": np.full(d["user_counts"].shape, 1e300),
                                "item_biases": np.zeros(d["item_counts"].shape)}, "biases"),
])
def test_load_checks_values_as_the_model_holds_them(saved, tmp_path, name, change, match):
    m, path = saved
    bad = _rewrite(path, tmp_path / f"{name}.npz", change)
    with pytest.raises(ValueError, match=match) as e:
        clmf.load(bad)
    assert str(bad) in str(e.value)


def test_load_of_a_text_file_does_not_suggest_pickles(tmp_path):
    for text in (b"user,item,rating\n1,2,3\n", b"\x80\x04 looks like a pickle", b""):
        path = tmp_path / "model.npz"
        path.write_bytes(text)
        with pytest.raises(ValueError, match="not an .npz archive") as e:
            clmf.load(path)
        assert "pickle" not in str(e.value) and str(path) in str(e.value)
        import io
        # an empty buffer is told apart (nothing left to read: seek(0)?)
        with pytest.raises(ValueError, match="not an .npz archive|nothing left to read") as e:
            clmf.load(io.BytesIO(text))
        assert "pickle" not in str(e.value)


def test_save_into_a_missing_directory_names_it(saved, tmp_path):
    m, path = saved
    target = tmp_path / "no" / "such" / "model.npz"
    with pytest.raises(FileNotFoundError) as e:
        m.save(target)
    assert e.value.filename == str(target.parent) and ".tmp" not in str(e.value)
    assert not (tmp_path / "no").exists()


def test_save_refuses_factors_param_disagreeing_with_the_width(saved):
    m, path = saved
    before = path.read_bytes()
    m.factors = m.user_factors_.shape[1] + 1
    with pytest.raises(ValueError, match="wide"):
        m.save(path)
    assert path.read_bytes() == before


# ----- loaders: what is wrong, in which column of which file ---------------------------------
def test_parquet_non_numeric_ratings_name_the_column_and_file(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    base = {"user": [1, 2, 3], "item": [4, 5, 6]}
    cases = {
        "datetime": {**base, "rating": pd.to_datetime(["2021-01-01"] * 3)},   # ~1.6e18 before
        "timedelta": {**base, "rating": pd.to_timedelta([1, 2, 3], unit="s")},
        "list-rating": {**base, "rating": [[1.0], [2.0], [3.0]]},
        "list-user": {"user": [[1, 2], [3], [4]], "item": [4, 5, 6], "rating": [1.0, 2.0, 3.0]},
    }
    for name, cols in cases.items():
        path = tmp_path / f"{name}.parquet"
        pd.DataFrame(cols).to_parquet(path)
        with pytest.raises(ValueError) as e:
            clmf.data.load(path)
        col = "user" if name == "list-user" else "rating"
        assert str(path) in str(e.value) and f"column {col!r}" in str(e.value), (name, e.value)


def test_corrupt_parquet_names_the_file(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    path = tmp_path / "ratings.parquet"
    path.write_bytes(b"PAR1" + b"\0" * 100)
    with pytest.raises(ValueError, match="not a readable Parquet file") as e:
        clmf.data.load(path)
    assert str(path) in str(e.value)
    from clmf.cli import main
    assert main(["fit", str(path)]) == 1
    assert str(path) in capsys.readouterr().err


@pytest.mark.parametrize("ids,match", [
    (np.array([7, "7", 8], dtype=object), "mix text and numbers"),
    (np.array(["a", 7.5, "b"], dtype=object), "mix text and numbers"),
    (np.array([7, None, 8], dtype=object), "missing"),
    (np.array(["a", None, "b"], dtype=object), "missing"),
    (np.array(["a", np.nan, "b"], dtype=object), "missing"),     # pandas' missing text
    (np.array([7.0, np.nan, 8.0]), "NaN"),
])
def test_raw_ids_missing_or_of_mixed_types_are_refused(ids, match):
    with pytest.raises(ValueError, match=match):
        clmf.data.Ratings.from_triples(ids, [1, 2, 3], [1.0, 2.0, 3.0])
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"user": [1, 2, 3], "item": ids, "rating": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match=match) as e:
        clmf.data.Ratings.from_pandas(df)
    assert "column 'item'" in str(e.value)
    # one type per column is fine: numbers stay numbers, texts stay texts
    assert clmf.data.Ratings.from_triples(np.array([9, 7, 8], dtype=object), [1, 2, 3],
                                              [1.0, 2.0, 3.0]).user_ids.tolist() == [7, 8, 9]


@pytest.fixture(scope="module")
def dask_client():
    """An in-process Dask cluster of one worker thread (the Dask path's checks, not its
    distribution, are under test)."""
    distributed = pytest.importorskip("distributed")
    pytest.importorskip("dask.dataframe")
    import clmf.dask  # noqa: F401
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                       dashboard_address=None, silence_logs=40)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


def _frame(n=400, seed=0, **over):
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"user": rng.integers(0, 40, n), "item": rng.integers(0, 30, n),
                       "rating": rng.integers(1, 6, n).astype(float)})
    df = df.drop_duplicates(["user", "item"]).reset_index(drop=True)
    for k, v in over.items():
        df[k] = v(df[k])
    return df


def _mixed(col):
    out = col.astype(object)
    out[::2] = out[::2].astype(str)            # 7 and "7": 1,886 users on Dask, 943 in-process
    return out


def _with_none(col):
    out = col.astype(object)
    out[3] = None
    return out


@pytest.mark.parametrize("change,match", [(_mixed, "mix text and numbers"),
                                          (_with_none, "missing")])
def test_dask_and_in_process_agree_on_raw_ids(dask_client, change, match):
    import clmf.dask
    df = _frame(user=change)
    with pytest.raises(ValueError, match=match) as local:
        clmf.data.Ratings.from_pandas(df)
    with pytest.raises(ValueError, match=match) as dist:
        clmf.dask.ALS(client=dask_client, factors=4, iterations=1,
                      device="no such device").fit(df, show_progress=False)
    assert "column 'user'" in str(local.value) and "column 'user'" in str(dist.value)


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_dask_names_overflow_as_in_process(dask_client):
    import clmf.dask
    df = _frame(rating=lambda r: r * 1e30)
    dev = f"{DEVICES[0].platform.name.strip()} | {DEVICES[0].name.strip()}"
    kw = dict(factors=6, iterations=3, random_state=0, solver="cholesky", device=dev)
    with pytest.raises(RatingRangeError) as local:
        clmf.ALS(**kw).fit(clmf.data.Ratings.from_pandas(df), show_progress=False)
    with pytest.raises(RatingRangeError) as dist:
        clmf.dask.ALS(client=dask_client, **kw).fit(df, show_progress=False)
    assert "increase regularization" not in str(dist.value)

    def same(e):          # (where the factors were when it failed may differ in the last bits)
        return re.sub(r"factors reached [^)]*", "", str(e.value))
    assert same(dist) == same(local) and "overflowed the float32 range" in same(dist)


# ----- the command line: usage errors exit 2, --json always one document ----------------------
def _cli(argv, capsys):
    """``clmf ARGV`` in-process: (exit status, stdout, stderr); argparse's own usage errors
    exit through SystemExit."""
    from clmf.cli import main
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def cli_files(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n" + "".join(f"{u},{i},{(u + i) % 5 + 1}\n"
                                                    for u in range(8) for i in range(6)))
    model = _host_model(n_users=8, n_items=6)
    model.user_ids_, model.item_ids_ = np.arange(8), np.arange(6)
    model.save(tmp_path / "m.npz")
    return path, tmp_path / "m.npz"


USAGE_ERRORS = [
    (["fit", "--preset", "movielens-100k", "--scale", "0"], "--scale"),
    (["fit", "--preset", "movielens-100k", "--scale", "-1"], "--scale"),
    (["recommend", "{model}", "--user", "1", "-n", "-1"], "-n"),
    (["recommend", "{model}", "--all", "--out", "{tmp}/recs.csv", "--batch-size", "-5"],
     "--batch-size"),
    (["eval", "{model}", "{data}", "--k", "0"], "--k"),
    (["eval", "{model}", "{data}", "--k", "5", "-3"], "--k"),
    (["fit", "{data}", "--variant", "batch:tx=0"], "tx"),
    (["fit", "{data}", "-f", "0"], "factors"),
    (["demo", "-f", "0"], "factors"),
    (["demo", "--variant", "nosuch"], "variant"),
    (["source", "-f", "0"], "--factors"),
    (["source", "nosuch"], "variant"),
    (["bench", "--factors", "0", "--peers", "none", "--no-plots", "--out", "{tmp}/b"],
     "--factors"),
    (["bench", "--variant", "nosuch", "--peers", "none", "--no-plots", "--out", "{tmp}/b"],
     "variant"),
    (["fit", "{data}", "--no-such-option"], "unrecognized"),
]


@pytest.mark.parametrize("argv,match,as_json", [
    pytest.param(a, m, j, id=f"{a[0]}{k}-{'json' if j else 'text'}")
    for k, (a, m) in enumerate(USAGE_ERRORS) for j in (False, True)
    if not (j and a[0] in ("source", "demo"))])          # (they have no --json)
def test_cli_usage_errors_exit_2(cli_files, capsys, argv, match, as_json):
    data, model = cli_files
    argv = [a.format(data=data, model=model, tmp=data.parent) for a in argv]
    if as_json:
        argv.append("--json")
    rc, out, err = _cli(argv, capsys)
    assert rc == 2, (argv, rc, err)
    assert match in err and "Traceback" not in err and " N " not in err, err
    if "--json" in argv:
        doc = json.loads(out)                      # exactly one JSON document
        assert doc["exit_status"] == 2 and match in doc["error"] and doc["command"] == argv[0]
    else:
        assert out == "" or "usage" not in out
    assert not (data.parent / "recs.csv").exists() and not (data.parent / "b").exists()


def test_cli_runtime_errors_exit_1_with_one_json_document(cli_files, capsys, tmp_path):
    data, model = cli_files
    rc, out, err = _cli(["recommend", model, "--user", "nobody", "--json"], capsys)
    assert rc == 1 and json.loads(out)["exit_status"] == 1


def test_cli_interrupt_prints_one_json_document(cli_files, capsys, monkeypatch):
    from clmf import cli
    data, model = cli_files

    def ctrl_c(args):
        raise KeyboardInterrupt

    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(parser(), ctrl_c))
    rc, out, err = _cli(["recommend", model, "--user", "1", "--json"], capsys)
    assert rc == 130 and "interrupted" in err
    assert json.loads(out) == {"command": "recommend", "error": "interrupted",
                               "exit_status": 130}
