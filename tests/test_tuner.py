"""The autotuner (tuner/): space, sampling, validation/timing, strategies, resume, report, CLI,
and that ALS(variant="auto") then uses the tuning (rule "tuned")."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DEVICES, random_ratings

import clmf
from clmf import tuning
from clmf.autotune import strategies
from clmf.autotune.measure import (
    SLOW_CAP,
    SLOW_MIN,
    Measurer,
    full_sample,
    make_sample,
    slow_caps,
    stratified_rows,
)
from clmf.autotune.space import Space, canonical, make_space, prune
from clmf.engine.config import KernelConfig
from clmf.engine.device import device_info
from clmf.errors import InvalidConfigError


def tiny_space(f):
    """7 configurations: the baseline at 3 widths and batch+reg+local at 4 (tx, ty)."""
    return Space("tiny", f, [(False, False, 0, False), (True, True, 0, False)],
                 dict(tx=[2, 4], ty=[2, 4], nnz_batch=[8], bx=[f], by=[f], square_tiles=True,
                      tz=[1], solve_wg=[0], solver=["cholesky"], cg_steps=[3]))


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No shipped or per-user tunings; the test's database through $CLMF_TUNING_DB."""
    db = tmp_path / "db.jsonl"
    monkeypatch.setenv("CLMF_TUNING_DB", str(db))
    monkeypatch.setattr(tuning.database, "user_db_path", lambda: tmp_path / "user.jsonl")
    monkeypatch.setattr(tuning.database, "shipped_paths", lambda: [])
    return db


def skewed(m=240, n=160, seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.minimum(n, (rng.pareto(1.2, m) * 4 + 1).astype(int))
    rows = np.repeat(np.arange(m), lengths)
    cols = np.concatenate([rng.choice(n, k, replace=False) for k in lengths])
    return sp.csr_matrix((rng.integers(1, 6, rows.size).astype(np.float32), (rows, cols)),
                         shape=(m, n))


# ----- space -------------------------------------------------------------------------------------
@pytest.mark.parametrize("f", [10, 50, 100])
def test_bounded_space_is_a_few_hundred(f):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    for d in DEVICES:
        info = device_info(d)
        rejected = []
        cands = make_space("bounded", f, info).enumerate(info, rejected)
        assert 100 <= len(cands) <= 800
        assert len({c.key() for c in cands}) == len(cands)
        assert all(r in ("idle_work_items", "geometry", "work_group_size", "local_memory",
                         "work_item_sizes") for _, r, _ in rejected)
        assert all(c.storage == "float32" and c.solver == "cholesky" for c in cands)


def test_canonical_forms():
    assert canonical(KernelConfig.parse("batch:tx=2,ty=8")) == canonical(KernelConfig.parse("batch:tx=4,ty=4"))
    assert canonical(KernelConfig.parse("batch+reg:tx=4,ty=4,nnz_batch=64")).nnz_batch == 32
    assert canonical(KernelConfig.parse("batch+reg:tx=4,ty=4,bx=8,tz=2")).tz == 1
    fused = canonical(KernelConfig.parse("batch+reg+local+tile:tx=4,ty=4,bx=8,by=8,solver=fusedcg"))
    assert fused.name == "batch"


def test_full_space_sampling_and_mutation():
    if not DEVICES:
        pytest.skip("no OpenCL device")
    info = device_info(DEVICES[0])
    full = make_space("full", 50, info, solvers=["cholesky", "cg"])
    assert not full.enumerable
    rng = np.random.default_rng(0)
    for _ in range(50):
        c = full.sample(rng, info)
        assert c is not None and prune(c, 50, info) is c and canonical(c) == c
        m = full.mutate(c, rng, info)
        if m is not None:
            assert m != c and prune(m, 50, info) is m


# ----- sampling ----------------------------------------------------------------------------------
def test_stratified_sample_keeps_the_length_distribution():
    R = skewed(2000, 300, seed=3)
    lengths = np.diff(R.indptr)
    idx = stratified_rows(lengths, 0.1, np.random.default_rng(0))
    assert lengths.argmax() in idx
    bins_all = np.bincount(np.floor(np.log2(lengths[lengths > 0])).astype(int))
    bins_s = np.bincount(np.floor(np.log2(lengths[idx])).astype(int), minlength=bins_all.size)
    for a, b in zip(bins_all, bins_s):
        if a >= 20:
            assert abs(b / a - 0.1) < 0.03
    s = make_sample(R, "users", 0.1)
    assert s.R.shape[1] == R.shape[1] and s.rows == idx.size
    t = make_sample(R, "items", 0.2)
    assert t.R.shape[0] == R.shape[0] and t.R.shape[1] == t.rows
    assert 0.15 < t.fraction < 0.3


def test_balanced_sample_grows_until_the_longest_row_is_a_small_share():
    """A GPU's sample grows until its ratings are BALANCE × compute units × its longest row (the
    stratified sample always holds the longest item, here rated by 900 of 2,000 users), up to the
    whole side; capped by max_growth; a sample already balanced (or a CPU's 2 units) is kept."""
    from clmf.autotune.measure import BALANCE, balanced_sample, longest_row
    rng = np.random.default_rng(5)
    m, n = 2000, 400
    rows = np.concatenate([rng.choice(m, 900, replace=False), rng.integers(0, m, 6000)])
    cols = np.concatenate([np.zeros(900, np.int64), rng.integers(1, n, 6000)])
    R = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(m, n))
    R.sum_duplicates()
    s = make_sample(R, "items", 0.05)
    assert longest_row(s) == 900 and s.nnz < BALANCE * 8 * 900
    g = balanced_sample(R, "items", s, 8)
    assert g.fraction > s.fraction and longest_row(g) == 900
    assert g.nnz >= BALANCE * 8 * 900 or g.fraction == 1.0
    assert balanced_sample(R, "items", s, 8, max_growth=1.1) is s          # no room to grow
    capped = balanced_sample(R, "items", s, 8, max_growth=2.0)
    assert s.nnz < capped.nnz <= 2.6 * s.nnz
    t = make_sample(R, "items", 0.5)
    assert balanced_sample(R, "items", t, 1) is t                          # already balanced
    u = make_sample(R, "users", 0.1)
    assert longest_row(u) == int(np.diff(R.indptr)[np.diff(R.indptr) > 0].max())


# ----- measurement -------------------------------------------------------------------------------
def test_measure_wrong_invalid_and_ok(cl_device, monkeypatch):
    R = skewed()
    m = Measurer(cl_device, R, 4, {s: make_sample(R, s, 0.5) for s in ("users", "items")})
    ok = m.evaluate(KernelConfig.parse("batch:tx=2,ty=2"))
    assert ok.status == "ok" and ok.verify_rel_err <= 1e-4
    for side in ("users", "items"):
        d = ok.sides[side]
        assert d["runs"] >= 7 and len(d["raw"]) == d["runs"] and d["seconds"] > 0
        assert set(d["stages"]) == {"s1", "s2", "s3"}
    info = device_info(cl_device)
    big = KernelConfig(tx=64, ty=64 * 64)
    bad = m.evaluate(big)
    assert bad.status == "invalid" and bad.reason in ("work_group_size", "work_item_sizes")
    # a kernel that disagrees with the reference is "wrong" (the reference is perturbed here)
    X0, Y0, Xr, Yr = m._reference(KernelConfig())
    m._verify_ref[("cholesky", 0)] = (X0, Y0, Xr * 1.01, Yr)
    wrong = m.evaluate(KernelConfig.parse("batch:tx=2,ty=4"))
    assert wrong.status == "wrong" and wrong.reason == "reference_mismatch"
    assert not wrong.sides
    assert info.max_work_group_size < big.s1_local_size()


def test_a_hopeless_candidate_is_timed_by_its_warm_up_alone(cl_device):
    """Past the session's cap (slow_caps: 20x the incumbent's wall time) a candidate's warm-up
    half-step is its one timing on the search's sample; the reference rows time it in full."""
    R = skewed()
    m = Measurer(cl_device, R, 4, {s: make_sample(R, s, 0.5) for s in ("users", "items")})
    cfg = KernelConfig.parse("batch:tx=2,ty=2")
    full = m.evaluate(cfg)
    assert all(full.sides[s]["runs"] >= 7 for s in ("users", "items"))
    caps = slow_caps([full])
    assert caps == {s: max(SLOW_MIN, SLOW_CAP * float(np.median(full.sides[s]["wall"])))
                    for s in ("users", "items")}
    m.slow_cap = {"users": 0.0}
    t = m.time_side(cfg, "users", 7, 0.0)
    assert t["runs"] == 1 and len(t["raw"]) == 1 and t["seconds"] > 0
    assert m.time_side(cfg, "items", 7, 0.0)["runs"] >= 7                 # no cap on this side
    assert m.time_side(cfg, "users", 7, 0.0, sample=full_sample(R, "users"))["runs"] >= 7


# ----- a tiny real tuning run, then ALS(variant="auto") ------------------------------------------
def test_tiny_tuning_then_auto_uses_it(cl_device, isolated, tmp_path):
    R = random_ratings(160, 120, 0.08, seed=5)
    case = strategies.Case(cl_device, R, 4, "tiny", "float32")
    summary = strategies.run(case, tiny_space(4), "exhaustive", db=isolated,
                             state_dir=tmp_path / "state", progress=False, sample_time=0.01)
    assert summary["best"] is not None
    assert summary["statuses"].get("ok", 0) >= 5
    recs = [json.loads(x) for x in isolated.read_text().splitlines()]
    kinds = {r["kind"] for r in recs}
    assert {"run", "measurement", "best"} <= kinds
    for r in recs:
        assert r["schema_version"] == tuning.SCHEMA_VERSION and r["date"] and r["commit"]
        assert r["device"]["platform"] == device_info(cl_device).platform.strip()
    best = {r["side"]: KernelConfig.from_dict(r["config"]) for r in recs if r["kind"] == "best"}
    model = clmf.ALS(4, 0.1, 2, device=cl_device, random_state=0).fit(R, show_progress=False)
    for side in ("users", "items"):
        assert model.config_[side].rule == "tuned", model.config_[side]
        assert model.config_[side].config == best[side]
    # the report: markdown with the best, runner-ups, speed-ups, and the Figure-13-style plot
    from clmf.autotune.report import write_run_report
    md = write_run_report(summary, tmp_path / "rep")
    text = md.read_text()
    assert "## Best" in text and "Runner-ups" in text and "speed-up" in text
    pytest.importorskip("matplotlib")
    assert md.with_suffix(".png").exists()


class _Crash(BaseException):
    pass


def test_resume_after_a_crash(isolated, tmp_path, monkeypatch):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    dev = DEVICES[0]
    R = random_ratings(120, 90, 0.1, seed=6)
    case = strategies.Case(dev, R, 4, "tiny", "float32")
    real = Measurer.evaluate
    calls = []

    def crashing(self, cfg, fidelity="full", verified=None):
        calls.append(cfg.key())
        if len(calls) == 4:
            raise _Crash("the process dies in the fourth measurement")
        return real(self, cfg, fidelity, verified)

    monkeypatch.setattr(Measurer, "evaluate", crashing)
    kw = dict(db=isolated, state_dir=tmp_path / "state", progress=False, sample_time=0.01)
    with pytest.raises(_Crash):
        strategies.run(case, tiny_space(4), "exhaustive", **kw)
    first = list(calls)
    calls.clear()
    def counting(self, cfg, fidelity="full", verified=None):
        if verified is None:              # a new candidate (the final showdown re-times known ones)
            calls.append(cfg.key())
        return real(self, cfg, fidelity, verified)

    monkeypatch.setattr(Measurer, "evaluate", counting)
    summary = strategies.run(case, tiny_space(4), "exhaustive", **kw)
    # nothing finished is measured twice; the measurement the process died in is measured again
    assert calls and set(calls) & set(first) == {first[3]} and calls.count(first[3]) == 1
    recs = [json.loads(x) for x in isolated.read_text().splitlines()]
    killed = [r for r in recs if r.get("status") == "interrupted"]
    assert len(killed) == 1 and killed[0]["reason"] == "killed"
    assert KernelConfig.from_dict(killed[0]["config"]).key() == first[3]
    assert not [r for r in recs if r.get("reason") == "crashed"]
    assert summary["best"] is not None
    assert summary["evaluated"] >= 7
    # a third run is a pure replay: nothing measured
    calls.clear()
    again = strategies.run(case, tiny_space(4), "exhaustive", **kw)
    assert calls == [] and again["best"]["configs"] == summary["best"]["configs"]


@pytest.mark.parametrize("mode", ["explicit", "biased"])
def test_cpu_anchors_are_measured_where_the_space_holds_them(mode):
    cpus = [d for d in DEVICES if device_info(d).type == "CPU"]
    if not cpus:
        pytest.skip("no OpenCL CPU device")
    case = strategies.Case(cpus[0], random_ratings(60, 40, 0.2), 16, "tiny", "float32", mode)
    got = strategies.device_anchors(case, make_space("default", case.kf, case.info, mode=mode))
    assert [(c.solver, c.solve_wg, c.solve_vec, c.vec) for c in got] == [
        ("fusedcg", 1, 16, 16), ("fusedcg", 1, 8, 8)]
    assert strategies.device_anchors(case, make_space("bounded", case.kf, case.info)) == []
    assert strategies.device_anchors(case, tiny_space(case.kf)) == []


def test_budgeted_stays_within_its_budget(isolated, tmp_path):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    R = random_ratings(120, 90, 0.1, seed=7)
    case = strategies.Case(DEVICES[-1], R, 4, "tiny", "float32")
    space = make_space("bounded", 4, case.info)
    s = strategies.run(case, space, "budgeted", db=isolated, budget=4.0,
                       state_dir=tmp_path / "state", progress=False, sample_time=0.01)
    assert s["best"] is not None
    assert s["evaluated"] < len(space.enumerate(case.info))
    slack = max(r["seconds_spent"] for r in s["results"]) * 3
    assert s["spent_seconds"] <= 4.0 + slack


def test_cli_tune(isolated, tmp_path, capsys):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    from clmf.cli import main
    d = DEVICES[0]
    spec = f"{d.platform.name.strip()} | {d.name.strip()}"
    rc = main(["tune", "--preset", "movielens-100k", "--scale", "0.02", "--factors", "4",
               "--device", spec, "--strategy", "budgeted", "--budget", "3", "--db", str(isolated),
               "--report", str(tmp_path / "rep"), "--no-progress", "--sample-time", "0.01"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "vs what you had" in out and "vs the plain batch variant" in out
    assert out.index("vs what you had") < out.index("vs the plain batch variant")
    assert str(isolated) in out
    assert list((tmp_path / "rep").glob("*.md"))
    assert main(["tune", "--factors", "x"]) == 2


def test_tune_into_a_gzip_database_packs_it_and_auto_reads_it(tmp_path, monkeypatch):
    """``clmf tune --db X.jsonl.gz`` (as results/tuning is kept since issue 32): one gzip member
    per append while it runs, one member for the whole file when it ends, read by the lookup."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    import gzip

    from clmf.autotune import tune
    db = tmp_path / "db.jsonl.gz"
    monkeypatch.setenv("CLMF_TUNING_DB", str(db))
    monkeypatch.setattr(tuning.database, "user_db_path", lambda: tmp_path / "user.jsonl")
    monkeypatch.setattr(tuning.database, "shipped_paths", lambda: [])
    appends = []
    real = tuning.Database.append
    monkeypatch.setattr(tuning.Database, "append",
                        lambda self, recs: (real(self, recs), appends.append(self.path)))
    R = random_ratings(160, 120, 0.08, seed=5)
    tune(R, factors=[4], device=DEVICES[0], strategy="budgeted", budget=2, db=db,
         state_dir=tmp_path / "state", progress=False, sample_time=0.01, plot=False)
    packed = db.read_bytes()
    records = gzip.decompress(packed)
    assert len(appends) > 1 and packed == gzip.compress(records, compresslevel=9, mtime=0)
    best = {r["side"]: KernelConfig.from_dict(r["config"])
            for r in map(json.loads, records.splitlines()) if r["kind"] == "best"}
    model = clmf.ALS(4, 0.1, 2, device=DEVICES[0], random_state=0).fit(R, show_progress=False)
    assert {s: model.config_[s].config for s in best} == best
    assert all(model.config_[s].rule == "tuned" for s in best)


# ----- modes: implicit feedback and biases ------------------------------------------------------
def mode_space(f, mode):
    """The tiny space with the fused CG too (at the kernels' f: f + 1 with biases)."""
    kf = tuning.kernel_factors(f, mode)
    return Space("tiny", kf, [(False, False, 0, False), (True, True, 0, False)],
                 dict(tx=[2, 4], ty=[2, 4], nnz_batch=[8], bx=[kf], by=[kf], square_tiles=True,
                      tz=[1], solve_wg=[0], solver=["cholesky", "fusedcg"], cg_steps=[3]), mode=mode)


@pytest.mark.parametrize("mode", ["implicit", "biased"])
def test_measure_in_a_mode_validates_and_rejects_wrong(cl_device, mode):
    R = skewed()
    m = Measurer(cl_device, R, 4, {s: make_sample(R, s, 0.5) for s in ("users", "items")},
                 mode=mode, alpha=2.0)
    for v in ("batch:tx=2,ty=2", "batch+reg+local:tx=2,ty=2,nnz_batch=8,solver=fusedcg"):
        ok = m.evaluate(KernelConfig.parse(v))
        assert ok.status == "ok", ok.message
        assert ok.verify_rel_err <= 1e-4              # far inside the mode's tolerance here
        for side in ("users", "items"):
            st = ok.sides[side]["stages"]
            assert ("gram" in st) == (mode == "implicit")
            if mode == "implicit":
                assert st["gram"] > 0                 # the Gram YᵀY every implicit half-step runs
    # a kernel that disagrees with the mode's reference is "wrong" (the reference is perturbed)
    ref = m._reference(KernelConfig())
    m._verify_ref[("cholesky", 0)] = (ref[0], ref[1], ref[2] * 1.05) + tuple(ref[3:])
    wrong = m.evaluate(KernelConfig.parse("batch:tx=2,ty=4"))
    assert wrong.status == "wrong" and wrong.reason == "reference_mismatch" and not wrong.sides


def test_explicit_kernels_are_wrong_for_the_implicit_reference(cl_device):
    """The validation really compares with the mode's maths: explicit results (the engine run
    without the confidence weights) are rejected by the implicit reference."""
    R = skewed()
    imp = Measurer(cl_device, R, 4, {}, mode="implicit", alpha=2.0)
    exp = Measurer(cl_device, R, 4, {})
    cfg = KernelConfig.parse("batch:tx=2,ty=2")
    imp._verify_ref[("cholesky", 0)] = exp._reference(cfg)     # swap in the explicit answer
    assert imp.verify(cfg) > 1e-2
    bia = Measurer(cl_device, R, 4, {}, mode="biased")
    ref = exp._reference(cfg)
    bia._verify_ref[("cholesky", 0)] = ref + ((np.zeros(61), np.zeros(173), 3.0),)
    assert bia.verify(cfg) > 1e-2


@pytest.mark.parametrize("mode", ["implicit", "biased"])
def test_tiny_tuning_in_a_mode_then_auto_uses_it(cl_device, isolated, tmp_path, mode):
    R = random_ratings(160, 120, 0.08, seed=5)
    case = strategies.Case(cl_device, R, 4, "tiny", "float32", mode, 2.0)
    summary = strategies.run(case, mode_space(4, mode), "exhaustive", db=isolated,
                             state_dir=tmp_path / "state", progress=False, sample_time=0.01)
    assert summary["best"] is not None and summary["mode"] == mode
    assert summary["statuses"].get("ok", 0) >= 5
    recs = [json.loads(x) for x in isolated.read_text().splitlines()]
    assert {r["mode"] for r in recs} == {mode}
    assert all(r["alpha"] == 2.0 for r in recs) if mode == "implicit" else \
        all("alpha" not in r for r in recs)
    best = {r["side"]: KernelConfig.from_dict(r["config"]) for r in recs if r["kind"] == "best"}
    # the anchors are what an untuned fit of this mode runs
    if mode == "implicit":
        assert "solver=fusedcg" in summary["anchors"]["default"]["config"]
    kw = dict(feedback="implicit", alpha=2.0) if mode == "implicit" else dict(biases=True)
    model = clmf.ALS(4, 0.1, 2, device=cl_device, random_state=0, **kw).fit(R, show_progress=False)
    for side in ("users", "items"):
        ch = model.config_[side]
        assert ch.rule == "tuned" and ch.config == best[side], ch
        assert "-mode tuning" not in ch.reason and "default: no" not in ch.reason
    # an explicit fit does not take the implicit/biased tuning as its own: the selection model
    # predicts from it, weighing the other mode's run less, and says so
    plain = clmf.ALS(4, 0.1, 1, device=cl_device, random_state=0).fit(R, show_progress=False)
    ch = plain.config_["users"]
    assert ch.rule == "model" and f"f=4 {mode}" in ch.reason, ch
    from clmf.autotune.report import write_run_report
    text = write_run_report(summary, tmp_path / "rep", plot=False).read_text()
    assert mode in text and "## Best" in text
    assert ("Gram" in text) == (mode == "implicit")


def test_implicit_fit_falls_back_to_explicit_tunings(cl_device, isolated, tmp_path):
    R = random_ratings(160, 120, 0.08, seed=5)
    case = strategies.Case(cl_device, R, 4, "tiny", "float32")
    strategies.run(case, tiny_space(4), "exhaustive", db=isolated, state_dir=tmp_path / "state",
                   progress=False, sample_time=0.01)
    model = clmf.ALS(4, 0.1, 1, device=cl_device, random_state=0, feedback="implicit",
                     alpha=2.0).fit(R, show_progress=False)
    recs = [json.loads(x) for x in isolated.read_text().splitlines()]
    best = {r["side"]: KernelConfig.from_dict(r["config"]) for r in recs if r["kind"] == "best"}
    for side in ("users", "items"):
        # the selection model from the explicit run, its hermitian solver kept (issue 27: the
        # fused CG is no longer forced on implicit fits)
        ch = model.config_[side]
        assert ch.rule == "model" and "f=4 explicit" in ch.reason, ch
        assert ch.config.solver == best[side].solver == "cholesky" and "fusedcg" not in ch.reason


# ----- the sample and its calibration check ----------------------------------------------------
def synthetic_csr(scale=0.004):
    from clmf import data
    return data.synthetic("movielens-100k", scale=1.0, seed=3).to_csr() if scale is None \
        else data.synthetic("netflix", scale=scale, seed=3).to_csr()


def test_sample_check_passes_on_a_synthetic_problem(isolated, tmp_path):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    from clmf.autotune.measure import check_samples
    dev = DEVICES[0]
    R = synthetic_csr(None)                      # MovieLens-100K-shaped, 943 × 1682
    info = device_info(dev)
    probe = canonical(tuning.heuristic(info, 8))
    samples = {s: make_sample(R, s, 0.3, 0, 8) for s in ("users", "items")}
    out, cal = check_samples(dev, R, 8, probe, samples, tol=0.5, check_time=5.0)
    for side in ("users", "items"):
        c = cal[side]
        assert c["checked"] and c["reference"]["whole_side"]
        assert c["reference"]["rows"] == out[side].full_rows
        # the check's outcome depends on timings (a loaded machine may grow the sample), so only
        # its consistency is asserted: a sample that agreed is kept, one that did not was grown
        assert c["ok"], c
        if c["grown"]:
            assert out[side].rows > samples[side].rows
        else:
            assert abs(c["first_ratio"] - 1) <= 0.5 and out[side] is samples[side]


def test_sample_check_grows_a_tiny_sample_under_a_strict_tolerance(isolated, tmp_path):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    dev = DEVICES[0]
    R = synthetic_csr(None)
    case = strategies.Case(dev, R, 4, "synthetic", "float32")
    s = strategies.Session(case, tiny_space(4), "exhaustive", isolated, state_dir=tmp_path / "st",
                           progress=False, sample=0.01, sample_tol=1e-9)
    s.start()
    try:
        cal = s.calibration
        assert cal["sample"] == 0.01
        grown = {}
        for side in ("users", "items"):
            c = cal["sides"][side]
            if not c["checked"]:
                # a GPU's minimum sample (enough rows to fill every compute unit) is already the
                # whole side of this small problem: there is nothing to check or grow
                assert not c["grown"] and s.samples[side].rows >= s.samples[side].full_rows
                continue
            grown[side] = True
            assert c["checked"] and c["grown"] and len(c["steps"]) >= 2
            rows = [x["rows"] for x in c["steps"]]
            assert rows == sorted(rows) and rows[-1] > rows[0]
            assert s.samples[side].rows == c["final"]["rows"] > rows[0]
            for x in c["steps"]:
                assert x["sample_seconds"] > 0 and x["estimate_seconds"] > 0 and x["ratio"] > 0
            assert c["reference"]["estimate_seconds"] > 0
    finally:
        s.close()
    run = [json.loads(x) for x in isolated.read_text().splitlines()
           if json.loads(x)["kind"] == "run"]
    for side in grown:
        assert run[-1]["calibration"]["sides"][side]["grown"]
    # a resumed run rebuilds the grown samples from the journal
    again = strategies.Session(case, tiny_space(4), "exhaustive", isolated,
                               state_dir=tmp_path / "st", progress=False, sample=0.01,
                               sample_tol=1e-9)
    again.start()
    again.close()
    assert again.resumed
    assert {k: v.rows for k, v in again.samples.items()} == {k: v.rows for k, v in s.samples.items()}


def test_the_best_is_checked_on_the_whole_side(isolated, tmp_path):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    R = synthetic_csr(None)
    case = strategies.Case(DEVICES[0], R, 4, "synthetic", "float32")
    summary = strategies.run(case, tiny_space(4), "exhaustive", db=isolated,
                             state_dir=tmp_path / "state", progress=False, sample=0.2,
                             sample_tol=10.0)           # a loose check: the 20% sample is kept
    ver = summary["best"]["verified"]
    sampled = {side for side, d in summary["samples"].items() if d["rows"] < d["full_rows"]}
    # (a GPU's minimum sample may already be the whole side here: nothing to verify then)
    assert set(ver) == sampled
    for side, v in ver.items():
        assert v["whole_side"] and v["rows"] == summary["samples"][side]["full_rows"]
        assert v["measured_seconds"] > 0 and v["ratio"] == pytest.approx(
            v["estimate_seconds"] / v["measured_seconds"])
        assert v["config"] == summary["best"]["configs"][side]
    best = [json.loads(x) for x in isolated.read_text().splitlines()
            if json.loads(x)["kind"] == "best"]
    assert {r["side"] for r in best if r["verified"]} == sampled
    assert all(r["verified"]["whole_side"] for r in best if r["verified"])
    from clmf.autotune.report import write_run_report
    text = write_run_report(summary, tmp_path / "rep", plot=False).read_text()
    assert ("Checked afterwards" in text) == bool(sampled)


def test_sample_full_times_whole_half_steps(isolated, tmp_path):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    R = random_ratings(300, 200, 0.05, seed=8)
    case = strategies.Case(DEVICES[0], R, 4, "tiny", "float32")
    summary = strategies.run(case, tiny_space(4), "exhaustive", db=isolated,
                             state_dir=tmp_path / "state", progress=False, sample="full")
    assert summary["calibration"]["sample"] == "full"
    for side in ("users", "items"):
        d = summary["samples"][side]
        assert d["fraction"] == 1.0 and d["rows"] == d["full_rows"] and d["nnz"] == d["full_nnz"]
        b = summary["best"]["sides"][side]
        for k in ("s1", "s2", "s3"):                                         # nothing scaled
            assert b["stages_estimated"][k] == pytest.approx(b["stages"][k], abs=1e-9)
    assert summary["best"]["verified"] == {}                  # nothing to check
    with pytest.raises(ValueError):
        strategies.Session(case, tiny_space(4), "exhaustive", isolated, sample="most")


def test_gpu_samples_fill_the_device():
    from test_tuning_db import fake_info
    gpu = fake_info(type_="GPU", compute_units=132, max_work_group_size=1024)
    from clmf.autotune.measure import sample_min_rows
    assert sample_min_rows(gpu, KernelConfig(reg=True, tx=10, ty=10)) >= 132 * 20
    cpu = fake_info(type_="CPU", compute_units=2, max_work_group_size=8192)
    assert sample_min_rows(cpu, KernelConfig()) == 8              # CPUs as before


def test_cli_tune_modes(isolated, tmp_path, capsys):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    from clmf.cli import main
    d = DEVICES[0]
    spec = f"{d.platform.name.strip()} | {d.name.strip()}"
    rc = main(["tune", "--preset", "movielens-100k", "--scale", "0.02", "--factors", "4",
               "--device", spec, "--budget", "3", "--db", str(isolated), "--no-progress",
               "--feedback", "implicit", "--alpha", "2", "--log1p", "--sample", "full",
               "--report", str(tmp_path / "rep")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "mode implicit, alpha 2" in out and "vs what you had" in out
    assert list((tmp_path / "rep").glob("*_implicit-a2.md"))
    recs = [json.loads(x) for x in isolated.read_text().splitlines()]
    assert {r["mode"] for r in recs} == {"implicit"} and all(r["alpha"] == 2.0 for r in recs)
    assert main(["tune", "--preset", "movielens-100k", "--feedback", "implicit", "--biases"]) == 2
    assert main(["tune", "--preset", "movielens-100k", "--sample", "2"]) == 2


def test_sample_check_promotes_the_reference_to_the_whole_side(monkeypatch):
    """A sample that overestimates (a GPU sample leaving the device idle) must not talk the check
    out of timing the whole side: when the larger reference sample's estimate is affordable, the
    whole side becomes the reference."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    from clmf.autotune.measure import check_samples
    R = synthetic_csr(None)
    full = {"users": int(np.count_nonzero(np.diff(R.indptr))),
            "items": int(np.count_nonzero(np.bincount(R.indices, minlength=R.shape[1])))}

    def fake_time_side(self, cfg, side, repeats, min_time, sample=None):
        s = sample if sample is not None else self.samples[side]
        est = 0.5 * (1 + 9 * (1 - s.rows / full[side]) ** 16)     # ≈ 4 s at 2% → 0.5 s whole
        return {"seconds": est, "sample_seconds": est * s.rows / full[side]}
    monkeypatch.setattr(Measurer, "time_side", fake_time_side)
    samples = {s: make_sample(R, s, 0.02, 0, 8) for s in ("users", "items")}
    out, cal = check_samples(DEVICES[0], R, 4, KernelConfig(), samples, tol=0.2, check_time=1.0)
    for side in ("users", "items"):
        c = cal[side]
        assert c["reference"]["whole_side"] and c["reference"]["estimate_seconds"] == 0.5
        assert c["grown"] and c["ok"] and out[side].rows > samples[side].rows


def test_sample_check_of_each_kernel_form_grows_the_sample_the_probe_kept(monkeypatch):
    """A sample can estimate the kernel forms unequally (H100: the dims form's items side 3x
    too slow on a sample that estimated gemm right): each configuration of ``forms`` is
    checked after the probe, from the sample the probe left, and grows it while its own
    estimate is off; a form that cannot run is left out."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    from clmf.autotune.measure import check_samples
    R = synthetic_csr(None)
    full = {"users": int(np.count_nonzero(np.diff(R.indptr))),
            "items": int(np.count_nonzero(np.bincount(R.indices, minlength=R.shape[1])))}
    probe, form = KernelConfig(), KernelConfig.parse("batch+vec4:tx=1,ty=1,solver=fusedcg")
    broken = KernelConfig.parse("batch:tx=2,ty=2")

    def fake_time_side(self, cfg, side, repeats, min_time, sample=None):
        if cfg == broken:
            raise RuntimeError("cannot build")
        s = sample if sample is not None else self.samples[side]
        x = 1.0 if cfg == probe else 1 + 3 * (1 - s.rows / full[side])   # 3x off when small
        return {"seconds": 0.5 * x, "sample_seconds": 0.5 * x * s.rows / full[side]}
    monkeypatch.setattr(Measurer, "time_side", fake_time_side)
    samples = {s: make_sample(R, s, 0.1, 0, 8) for s in ("users", "items")}
    kept, cal0 = check_samples(DEVICES[0], R, 4, probe, samples, tol=0.2, check_time=1.0)
    out, cal = check_samples(DEVICES[0], R, 4, probe, samples, tol=0.2, check_time=1.0,
                             forms=[broken, form])
    for side in ("users", "items"):
        assert not cal0[side]["grown"] and kept[side].rows == samples[side].rows
        assert "forms" not in cal0[side]
        assert not cal[side]["grown"]                      # the probe's own check kept it
        (c,) = cal[side]["forms"]                          # the broken form left out
        assert c["probe"] == str(form) and c["grown"] and c["ok"]
        assert out[side].rows > samples[side].rows
        assert cal[side]["final"]["rows"] == out[side].rows


def test_a_changed_tuner_makes_a_new_run(monkeypatch, tmp_path):
    """The tuner's source hash is part of a run's identity: the same case tuned by a changed
    tuner is another run (no resume of the older journal, no records merged under one id)."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    from clmf.autotune import journal
    R = random_ratings(60, 40, 0.1, seed=2)
    case = strategies.Case(DEVICES[0], R, 4, "tiny", "float32")
    ids = [strategies.Session(case, tiny_space(4), "budgeted", tmp_path / "db.jsonl",
                              state_dir=tmp_path).run_id for _ in range(2)]
    assert ids[0] == ids[1] and len(journal.tuner_hash()) == 16
    monkeypatch.setattr(journal, "tuner_hash", lambda: "0" * 16)
    other = strategies.Session(case, tiny_space(4), "budgeted", tmp_path / "db.jsonl",
                               state_dir=tmp_path).run_id
    assert other != ids[0]


def test_best_pair_chooses_among_the_showdown_finalists(isolated, tmp_path):
    """After a showdown the finalists were re-timed side by side; a configuration with one
    older (and possibly luckier) timing must not beat them on that alone."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    from clmf.autotune.measure import Result
    R = synthetic_csr(None)
    case = strategies.Case(DEVICES[0], R, 4, "synthetic", "float32")
    s = strategies.Session(case, tiny_space(4), "exhaustive", isolated, state_dir=tmp_path / "st",
                           progress=False)
    a, b, c = (KernelConfig.parse(v) for v in ("batch:tx=2,ty=2", "batch:tx=2,ty=4",
                                               "batch:tx=4,ty=4"))

    def res(cfg, t, fid):
        return Result(cfg, "ok", sides={side: {"seconds": t} for side in ("users", "items")},
                      fidelity=fid)
    s.results = {(a.key(), "full"): res(a, 1.0, "full"), (a.key(), "final"): res(a, 1.5, "final"),
                 (b.key(), "full"): res(b, 1.1, "full"), (b.key(), "final"): res(b, 1.4, "final"),
                 (c.key(), "full"): res(c, 1.3, "full")}
    best = s.best_pair()
    assert best["configs"] == {"users": b, "items": b}
    s.results = {k: v for k, v in s.results.items() if k[1] != "final"}   # no showdown: all compete
    assert s.best_pair()["configs"] == {"users": a, "items": a}


def test_invalid_start_is_pruned_with_a_typed_record_before_any_build(isolated, tmp_path,
                                                                     monkeypatch):
    """A configuration from outside the space (a start, the incumbent, an earlier best) that
    exceeds the device's work-group limit at this f is recorded ``invalid`` with its typed
    reason and never built or timed (issue 27); the space's own pruned configurations are
    counted by reason in the summary."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    info = device_info(DEVICES[0])
    R = random_ratings(160, 120, 0.08, seed=5)
    case = strategies.Case(DEVICES[0], R, 4, "tiny", "float32")
    too_big = KernelConfig.parse(f"batch:tx={info.max_work_group_size},ty=2")
    built = []
    real = strategies.Measurer.evaluate
    monkeypatch.setattr(strategies.Measurer, "evaluate",
                        lambda self, cfg, *a, **k: built.append(cfg) or real(self, cfg, *a, **k))
    space = Space("tiny-idle", 4, [(True, True, 0, False)],      # tx=8 > the tile edge 4
                  dict(tx=[2, 8], ty=[2], nnz_batch=[8], bx=[4], by=[4], square_tiles=True,
                       tz=[1], solve_wg=[0], solver=["cholesky"], cg_steps=[3]))
    summary = strategies.run(case, space, "exhaustive", db=isolated, starts=[too_big],
                             state_dir=tmp_path / "state", progress=False, sample_time=0.01)
    assert canonical(too_big) not in built and summary["best"] is not None
    recs = [json.loads(x) for x in isolated.read_text().splitlines()]
    key = canonical(too_big).to_dict()
    bad = [r for r in recs if r["kind"] == "measurement" and r["config"] == key]
    assert len(bad) == 1 and bad[0]["status"] == "invalid", bad
    assert bad[0]["reason"] == "work_group_size" and "pruned before building" in bad[0]["message"]
    assert summary["pruned"].get("work_group_size", 0) >= 1
    assert summary["pruned"].get("idle_work_items", 0) == 1      # the space's tx=8


def test_max_wall_cuts_the_search_but_still_writes_the_best(isolated, tmp_path):
    """``max_wall`` bounds the search's wall clock, kernel builds included (the budget counts
    measurement only: an H100 run at f = 128 sat minutes in builds after its budget and was cut
    by its command's limit before writing any best record): no new candidates once spent, yet
    the finalists, the showdown and the best records are still there."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    R = random_ratings(120, 90, 0.1, seed=7)
    case = strategies.Case(DEVICES[-1], R, 4, "tiny-wall", "float32")
    space = make_space("bounded", 4, case.info)
    s = strategies.run(case, space, "budgeted", db=isolated, budget=60.0, max_wall=1e-6,
                       state_dir=tmp_path / "state", progress=False, sample_time=0.01)
    assert s["wall_limited"] and s["max_wall"] == 1e-6
    assert s["best"] is not None
    full = strategies.run(case, space, "budgeted", db=isolated, budget=2.0,
                          state_dir=tmp_path / "state2", progress=False, sample_time=0.01,
                          resume=False)
    assert not full["wall_limited"] and s["evaluated"] < full["evaluated"]
    best = [r for r in tuning.Database(isolated).records() if r.get("kind") == "best"
            and r.get("run_id") == s["run_id"]]
    assert {r["side"] for r in best} == {"users", "items"}


# ----- the fused CG's dimensions form: slices per work-item, spread sums (issue 27) -------------
def test_fused_dims_geometry_fields_parse_print_and_keep_old_meaning():
    old = KernelConfig.parse("batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=128,nnz_batch=8")
    assert old == KernelConfig.parse(str(old)) and "dims_" not in str(old)
    assert (old.dims_q, old.dims_p) == (1, 1)
    # an old record (no dims_q / dims_p) reads as the same configuration and geometry
    rec = {k: v for k, v in old.to_dict().items() if k not in ("dims_q", "dims_p")}
    assert KernelConfig.from_dict(rec) == old
    for f, want in ((256, (64, 1, 64, 2, 1)), (128, (32, 1, 32, 4, 1)), (17, (5, 1, 5, 25, 1))):
        g = old.fcg_geometry(f)
        assert (g["fd_f4"], g["fd_q"], g["fd_d"], g["fd_e"], g["fd_p"]) == want
    new = KernelConfig.parse("batch+vec4:solver=fusedcg,fused_dims=1,dims_q=4,dims_p=0,"
                             "solve_wg=256,nnz_batch=4")
    assert KernelConfig.parse(str(new)) == new and KernelConfig.from_dict(new.to_dict()) == new
    g = new.fcg_geometry(256)
    assert (g["fd_q"], g["fd_d"], g["fd_e"], g["fd_p"]) == (4, 16, 16, 4)
    # q is at least what covers f, at most f/4 slices
    assert KernelConfig.parse("batch+vec4:solver=fusedcg,fused_dims=1,dims_q=2,solve_wg=8"
                              ).fcg_geometry(256)["fd_q"] == 8
    assert new.fcg_geometry(5)["fd_q"] == 2
    with pytest.raises(InvalidConfigError) as e:
        KernelConfig.parse("batch+vec4:solver=fusedcg,dims_q=2")
    assert e.value.reason == "fused_dims"
    with pytest.raises(InvalidConfigError):
        KernelConfig.parse("batch+vec4:solver=fusedcg,fused_dims=1,dims_q=0")
    # the dimensions form's geometry goes with it where another solver drops it
    c = canonical(KernelConfig.parse("batch+vec4:solver=cg,fused_dims=1,dims_q=2,dims_p=0"))
    assert (c.fused_dims, c.dims_q, c.dims_p) == (False, 1, 1)


def test_fused_dims_geometries_validated_and_pruned_with_reasons():
    from test_tuning_db import fake_info

    from clmf.engine.kernels import validate
    gpu = fake_info(type_="GPU", max_work_group_size=1024, local_mem=48 * 1024)
    cpu = fake_info(type_="CPU", max_work_group_size=8192, local_mem=32 * 1024)
    base = "batch+vec4:solver=fusedcg,fused_dims=1,"

    def reason(text, f, info=gpu):
        try:
            prune(canonical(KernelConfig.parse(base + text)), f, info)
        except InvalidConfigError as e:
            return e.reason
        return None

    assert reason("dims_q=4,dims_p=0,solve_wg=256,nnz_batch=4", 256) is None
    assert reason("solve_wg=256,nnz_batch=8", 128) is None           # the shipped H100 choice
    # too many registers per work-item, or for the work-group (GPUs only)
    assert reason("dims_q=8,solve_wg=64,nnz_batch=2", 256) == "registers"
    assert reason("dims_q=4,solve_wg=512,nnz_batch=4", 256) == "registers"
    validate(KernelConfig.parse(base + "dims_q=8,solve_wg=64,nnz_batch=2"), 256, cpu)
    assert reason("dims_q=4,solve_wg=64,nnz_batch=8", 256) == "geometry"   # 32 row float4s
    # more local memory than the device has (E·D·Q float4s of sums)
    assert reason("dims_q=2,dims_p=0,solve_wg=1024,nnz_batch=1", 512, cpu) == "local_memory"
    # the same kernel as another value at this f, or sum work-items left idle
    assert reason("dims_q=4,solve_wg=256,nnz_batch=4", 8) == "duplicate_geometry"
    assert reason("dims_p=0,solve_wg=8,nnz_batch=4", 16) == "duplicate_geometry"
    assert reason("dims_p=8,solve_wg=256,nnz_batch=8", 16) == "idle_work_items"


def test_gpu_spaces_offer_the_dims_geometries():
    from test_tuning_db import fake_info
    gpu = fake_info(type_="GPU", max_work_group_size=1024)
    cpu = fake_info(type_="CPU", max_work_group_size=8192)
    for name in ("default", "full"):
        g = make_space(name, 128, gpu, mode="implicit").grid
        assert g["dims_q"] == [1, 2, 4] and g["dims_p"] == [1, 0] and 256 in g["solve_wg"]
        assert make_space(name, 32, gpu).grid["dims_q"] == [1]
        assert "dims_q" not in make_space(name, 128, cpu).grid      # CPUs keep their spaces
    sp_ = make_space("default", 256, gpu, mode="implicit")
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(400):
        c = sp_.sample(rng, gpu)
        if c is not None and c.dims:
            assert prune(c, 256, gpu) is c and canonical(c, "implicit") == c
            seen.add((c.dims_q, c.dims_p))
            m = sp_.mutate(c, rng, gpu)
            assert m is None or prune(m, 256, gpu) is m
    assert {q for q, _ in seen} == {1, 2, 4} and {p for _, p in seen} == {0, 1}
    # on NVIDIA also the entry sums as warp shuffles (their dims_p canonical: not used)
    nv = fake_info(platform="NVIDIA CUDA", type_="GPU", max_work_group_size=1024)
    assert "dims_shfl" not in sp_.grid
    sp_nv = make_space("default", 256, nv, mode="implicit")
    assert sp_nv.grid["dims_shfl"] == [False, True] == sp_nv.grid["dims_wshfl"]
    assert sp_nv.grid["dims_rsum"] == [False, True] == sp_nv.grid["dims_pipe"]
    shfl = set()
    for _ in range(6000):         # (few random configurations are valid dims forms at f = 256)
        c = sp_nv.sample(rng, nv)
        if c is not None and c.dims:
            assert prune(c, 256, nv) is c and canonical(c, "implicit") == c
            shfl.add((c.dims_shfl, c.dims_wshfl, c.dims_rsum, c.dims_pipe))
            assert not c.dims_shfl or c.dims_p == 1
            assert not (c.dims_wshfl or c.dims_rsum) or c.dims_shfl
            assert not (c.dims_wshfl and c.dims_rsum)
    assert {s[0] for s in shfl} == {False, True}
    assert any(s[1] for s in shfl) and any(s[2] for s in shfl)
    assert {s[3] for s in shfl} == {False, True}


def test_fused_dims_group_sums_tree_everywhere_but_pocl():
    from test_tuning_db import fake_info

    from clmf.engine.kernels import gsum_tree_ok, render_als
    pocl = fake_info(platform="Portable Computing Language", type_="CPU")
    assert gsum_tree_ok(fake_info()) and gsum_tree_ok(fake_info(platform="Intel(R) OpenCL"))
    assert not gsum_tree_ok(pocl)
    cfg = KernelConfig.parse("batch+vec4:solver=fusedcg,fused_dims=1,dims_q=4,dims_p=0,"
                             "solve_wg=256,nnz_batch=2")
    assert cfg.fcg_geometry(130)["fd_tree"] == [16, 8, 4, 2, 1]          # 28 groups
    tree, flat = render_als(cfg, 130, fake_info()), render_als(cfg, 130, pocl)
    assert "g + 16" in tree and "g + 16" not in flat
