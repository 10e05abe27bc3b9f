"""The tuner never makes a default fit slower (issue 20): what ``variant="auto"`` chose before the
run (the incumbent) is a candidate, measured like every other; the record written is the measured
minimum of the side-by-side re-timing; a search that finds nothing faster keeps the incumbent."""
from __future__ import annotations

import json
import os

import pytest
from conftest import DEVICES, random_ratings

import clmf
from clmf import tuning
from clmf.autotune import strategies
from clmf.autotune.measure import Measurer
from clmf.autotune.space import Space
from clmf.engine.config import KernelConfig
from clmf.engine.device import device_info

F = 4
EARLIER = "batch+reg:tx=2,ty=2"          # another data set's tuning: the lookup's "nearest" rule


def tiny_space(f, mode="explicit"):
    """The baseline at 2 widths and batch+reg+local at 4 (tx, ty) (with the fused CG in
    implicit mode, whose untuned solver it is)."""
    kf = tuning.kernel_factors(f, mode)
    return Space("tiny", kf, [(False, False, 0, False), (True, True, 0, False)],
                 dict(tx=[2, 4], ty=[2, 4], nnz_batch=[8], bx=[kf], by=[kf], square_tiles=True,
                      tz=[1], solve_wg=[0], solver=["cholesky"] + (
                          ["fusedcg"] if mode == "implicit" else []), cg_steps=[3]), mode=mode)


def mode_kw(mode):
    return {"implicit": dict(feedback="implicit", alpha=2.0), "biased": dict(biases=True),
            "explicit": {}}[mode]


@pytest.fixture
def dbs(tmp_path, monkeypatch):
    """(earlier tunings' file, the run's database); no shipped or per-user tunings."""
    seed, db = tmp_path / "earlier.jsonl", tmp_path / "db.jsonl"
    monkeypatch.setenv("CLMF_TUNING_DB", os.pathsep.join([str(db), str(seed)]))
    monkeypatch.setattr(tuning.database, "user_db_path", lambda: tmp_path / "user.jsonl")
    monkeypatch.setattr(tuning.database, "shipped_paths", lambda: [])
    return seed, db


def write_earlier(path, device, mode, variant=EARLIER):
    """A finished tuning run of another (much larger) data set on this device, at this f/mode."""
    info = device_info(device)
    cfg = KernelConfig.parse(variant)
    if mode == "implicit":
        cfg = cfg.replace(solver="fusedcg")
    recs = [tuning.base_record(
        "best", run_id="0123456789abcdef", side=side, config=cfg.to_dict(), variant=str(cfg),
        device=tuning.device_record(info), f=F, storage="float32", mode=mode,
        **({"alpha": 2.0} if mode == "implicit" else {}),
        dataset={"m": 40_000, "n": 9_000, "nnz": 3_000_000, "name": "elsewhere"},
        iteration_rel_baseline=0.5) for side in ("users", "items")]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return cfg


def lookup_now(case):
    stats = {s: case.side_class(s) for s in ("users", "items")}
    return tuning.incumbent(case.info, case.f, stats, case.storage, None, case.mode)


def records(db, kind):
    return [json.loads(x) for x in db.read_text().splitlines() if json.loads(x)["kind"] == kind]


def test_incumbent_leaves_out_given_paths_and_runs(dbs):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    seed, _db = dbs
    cfg = write_earlier(seed, DEVICES[0], "explicit")
    info = device_info(DEVICES[0])
    stats = {"users": {"rows": 50, "cols": 40, "nnz": 400},
             "items": {"rows": 40, "cols": 50, "nnz": 400}}
    got = tuning.incumbent(info, F, stats)
    assert got["users"].rule == "nearest" and got["users"].config == cfg
    for kw in (dict(exclude_paths=[seed]), dict(exclude_runs=["0123456789abcdef"])):
        assert tuning.incumbent(info, F, stats, **kw)["users"].rule == "heuristic"
    # the same as a default fit's choice
    for side in ("users", "items"):
        assert tuning.choose(info, F, side, stats[side]) == got[side]


def test_incumbent_is_a_candidate_and_the_record_is_the_measured_minimum(cl_device, dbs,
                                                                         tmp_path):
    seed, db = dbs
    write_earlier(seed, cl_device, "explicit")
    R = random_ratings(160, 90, 0.08, seed=3)
    case = strategies.Case(cl_device, R, F, "tiny", "float32")
    before = lookup_now(case)
    assert before["users"].rule == "nearest"
    s = strategies.run(case, tiny_space(F), "budgeted", db=db, budget=1.0,
                       state_dir=tmp_path / "st", progress=False, sample="full")
    inc = {side: str(before[side].config) for side in ("users", "items")}
    # the incumbent the lookup chose was measured first, like every other candidate
    meas = records(db, "measurement")
    assert meas[0]["variant"] == inc["users"] and meas[0]["status"] == "ok"
    assert s["anchors"]["incumbent"]["config"] == inc["users"]
    assert s["incumbent"]["rule"] == "nearest" and s["incumbent"]["configs"] == inc
    # the record holds the faster of the side-by-side pair
    fin, best = s["final"], records(db, "best")
    won = min(("tuned", "incumbent"), key=lambda k: fin[k]["iteration_seconds"])
    if fin["tuned"]["iteration_seconds"] == fin["incumbent"]["iteration_seconds"]:
        won = "incumbent"
    assert s["best"]["chosen"] == won and fin["chosen"] == won
    assert {r["side"]: r["variant"] for r in best} == fin[won]["configs"]
    assert all(r["chosen"] == won and r["incumbent"]["rule"] == "nearest" for r in best)
    assert all(fin[won]["iteration_seconds"] <= fin[k]["iteration_seconds"] for k in fin
               if k in ("tuned", "incumbent"))
    assert all(fin["whole_side"].values())
    model = clmf.ALS(F, iterations=1, device=cl_device, random_state=0).fit(R, show_progress=False)
    for side in ("users", "items"):
        assert model.config_[side].rule == "tuned"
        assert str(model.config_[side].config) == fin[won]["configs"][side]


class Rigged(Measurer):
    """Times every configuration but the incumbent pair's ×``search`` during the search and
    ×``guard`` in the final side-by-side re-timing (the calls that pass ``sample``)."""
    incumbent, search, guard = set(), 50.0, 50.0

    def time_side(self, cfg, side, *a, **kw):
        t = super().time_side(cfg, side, *a, **kw)
        if cfg.key() not in self.incumbent:
            x = self.guard if kw.get("sample") is not None else self.search
            t = dict(t, seconds=t["seconds"] * x, stages_estimated={
                k: v * x for k, v in t["stages_estimated"].items()})
        return t


@pytest.mark.parametrize("mode,search", [("explicit", 50.0), ("explicit", 0.02),
                                         ("biased", 0.02), ("implicit", 0.02)])
def test_a_search_finding_nothing_faster_keeps_the_incumbent(dbs, tmp_path, monkeypatch, mode,
                                                             search):
    """search = 50: every other candidate is slower, so the search's winner is the incumbent;
    search = 0.02: the search's winner looks faster on the sample but is slower side by side
    on the whole data (the guard keeps the incumbent)."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    seed, db = dbs
    dev = DEVICES[0]
    write_earlier(seed, dev, mode)
    R = random_ratings(160, 90, 0.08, seed=4)
    case = strategies.Case(dev, R, F, "tiny", "float32", mode, 2.0)
    before = lookup_now(case)
    assert before["users"].rule == "nearest"
    monkeypatch.setattr(Rigged, "incumbent", {before[s].config.key() for s in ("users", "items")})
    monkeypatch.setattr(Rigged, "search", search)
    monkeypatch.setattr(strategies, "Measurer", Rigged)
    s = strategies.run(case, tiny_space(F, mode), "exhaustive", db=db,
                       state_dir=tmp_path / "st", progress=False, sample="full")
    fin = s["final"]
    assert s["evaluated"] > 5                                   # the search did run
    assert fin["same_configuration"] == (search > 1)
    assert s["best"]["chosen"] == "incumbent" and s["best"]["beats_incumbent"] is False
    if search < 1:
        assert s["best"]["searched"]["configs"]["users"] != str(before["users"].config)
        cand, inc = fin["candidates"], fin["incumbent"]["configs"]
        for side, v in fin["searched_configs"].items():
            assert v == inc[side] or cand[side][inc[side]] < cand[side][v]
    best = records(db, "best")
    assert all(r["chosen"] == "incumbent" and r["mode"] == mode for r in best)
    assert {r["side"]: r["variant"] for r in best} == {k: str(v.config) for k, v in before.items()}
    model = clmf.ALS(F, iterations=1, device=dev, random_state=0, **mode_kw(mode)).fit(
        R, show_progress=False)
    for side in ("users", "items"):
        ch = model.config_[side]
        assert ch.rule == "tuned" and ch.config == before[side].config, ch


def in_space(sp, variant, info):
    """Whether ``variant`` is a point of the space ``sp`` (flags, grid values, valid)."""
    from clmf.autotune.space import canonical, flags_of
    c = canonical(KernelConfig.parse(variant), sp.mode)
    return (flags_of(c) in sp.flags and c.solver in sp.grid["solver"]
            and sp._valid(c, info) is not None
            and all(getattr(c, k) in sp.grid[k] for k in sp.active(flags_of(c), c.solver)
                    if k != "solver"))


WINNERS = {   # shipped tunings' winners (results/tuning/*.jsonl) at f = 50 and 100
    ("CPU", 50): ["batch+reg+vec16:tx=16,ty=1,solve_wg=1,solver=cg",
                  "batch+reg+local+vec16:tx=13,ty=1,nnz_batch=64,solve_wg=1,solver=cg",
                  "batch+reg+local+vec16:tx=13,ty=1,solve_wg=16,solver=cg"],
    ("CPU", 100): ["batch+reg+vec16:tx=25,ty=2,solve_wg=1,solver=cg",
                   "batch+reg+local+vec16:tx=25,ty=2,nnz_batch=64,solve_wg=16,solver=cg"],
    ("GPU", 50): ["batch+vec4+syrk:bx=8,ks=4,solver=cg",
                  "batch+vec4+gemm:tx=13,ty=13,nnz_batch=16,solver=cg"],
    ("GPU", 100): ["batch+vec4+syrk:bx=8,ks=2,solver=cg",
                   "batch+vec4+gemm:bx=64,nnz_batch=8,solver=cg"]}


def test_default_space_holds_what_wins_on_known_devices():
    from test_tuning_db import fake_info

    from clmf.autotune.space import make_space
    infos = [fake_info(type_="GPU", compute_units=132, max_work_group_size=1024,
                       local_mem=228 * 1024)]
    infos += [device_info(d) for d in DEVICES if device_info(d).type == "CPU"]
    for info in infos:
        for f in (50, 100):
            sp = make_space("default", f, info)
            assert sp.name == "default" and set(sp.grid["solver"]) == {"cholesky", "cg", "fusedcg"}
            for v in WINNERS[(info.type, f)]:
                assert in_space(sp, v, info), (info.type, f, v)


def test_a_repeated_run_replays_the_guard(dbs, tmp_path):
    """The side-by-side verdict is journaled: replaying a finished run measures nothing and
    writes the same choice (a fresh re-timing could flip a near tie)."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    seed, db = dbs
    write_earlier(seed, DEVICES[0], "explicit")
    R = random_ratings(120, 90, 0.1, seed=6)
    case = strategies.Case(DEVICES[0], R, F, "tiny", "float32")
    kw = dict(db=db, state_dir=tmp_path / "st", progress=False, sample="full")
    first = strategies.run(case, tiny_space(F), "exhaustive", **kw)
    calls = []
    real = Measurer.time_side

    def counting(self, *a, **k):
        calls.append(a)
        return real(self, *a, **k)

    import unittest.mock
    with unittest.mock.patch.object(Measurer, "time_side", counting):
        again = strategies.run(case, tiny_space(F), "exhaustive", **kw)
    assert calls == [] and again["final"] == first["final"]
    assert again["best"]["configs"] == first["best"]["configs"]


class FormRigged(Measurer):
    """Fixed times by kernel form: on the search's sample the fused CG looks 2x slower than the
    hermitian forms; on the showdown's reference rows (the calls that pass ``sample``) it is 2x
    faster, as the dims form's items side was on the H100 (48f)."""

    def time_side(self, cfg, side, *a, **kw):
        t = super().time_side(cfg, side, *a, **kw)
        fused = cfg.solver == "fusedcg"
        x = (0.5 if fused else 1.0) if kw.get("sample") is not None else (2.0 if fused else 1.0)
        x *= 1.0 + (cfg.tx or 0) / 100          # distinct times within a form
        return dict(t, seconds=x, stages_estimated={"s1": x, "s2": 0.0, "s3": 0.0})


def test_a_form_the_sample_misranks_is_timed_where_the_ranking_is_decided(dbs, tmp_path,
                                                                           monkeypatch):
    """On sampled sides the fastest configuration of each other kernel form is re-timed beside
    the search's winner on the reference rows; the faster one there is chosen, and every
    configuration timed there is recorded as a measurement of fidelity ``reference``."""
    from clmf.autotune.incumbent import kernel_form
    if not DEVICES:
        pytest.skip("no OpenCL device")
    seed, db = dbs
    dev = DEVICES[0]
    write_earlier(seed, dev, "explicit")
    R = random_ratings(400, 300, 0.05, seed=5)
    case = strategies.Case(dev, R, F, "tiny", "float32")
    kf = tuning.kernel_factors(F, "explicit")
    space = Space("forms", kf, [(False, False, 4, False)],      # batch+vec4, both solvers
                  dict(tx=[1, 2], ty=[1], nnz_batch=[8], bx=[kf], by=[kf], square_tiles=True,
                       tz=[1], solve_wg=[0], solver=["cholesky", "fusedcg"], cg_steps=[3]))
    monkeypatch.setattr(strategies, "Measurer", FormRigged)
    s = strategies.run(case, space, "exhaustive", db=db, state_dir=tmp_path / "st",
                       progress=False, sample=0.5, sample_tol=0)     # (no sample check: it
    fin = s["final"]                                  # could grow the samples to whole sides)
    assert all(kernel_form(KernelConfig.parse(v)) == "hermitian"
               for v in fin["searched_configs"].values())      # the sample's ranking
    for side in ("users", "items"):
        assert any("fusedcg" in v for v in fin["candidates"][side])
        assert "fusedcg" in fin["tuned"]["configs"][side]      # the reference rows' ranking
    assert fin["chosen"] == "tuned" and s["best"]["chosen"] == "tuned"
    best = {r["side"]: r["variant"] for r in records(db, "best")}
    assert best == fin["tuned"]["configs"]
    ref = [r for r in records(db, "measurement") if r.get("fidelity") == "reference"]
    assert {(r["side"], r["variant"]) for r in ref} == {
        (side, v) for side in ("users", "items") for v in fin["candidates"][side]}
    assert all(r["seconds"] == fin["candidates"][r["side"]][r["variant"]] for r in ref)


class ChallengerFails(FormRigged):
    """FormRigged whose fused CG cannot run on the reference rows."""

    def time_side(self, cfg, side, *a, **kw):
        if cfg.solver == "fusedcg" and kw.get("sample") is not None:
            raise RuntimeError("out of device memory")
        return super().time_side(cfg, side, *a, **kw)


def test_a_challenger_that_cannot_run_is_left_out(dbs, tmp_path, monkeypatch):
    """A challenger failing on the reference rows is dropped (logged); the showdown decides
    between the search's pair and the incumbent as before."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    seed, db = dbs
    write_earlier(seed, DEVICES[0], "explicit")
    case = strategies.Case(DEVICES[0], random_ratings(400, 300, 0.05, seed=5), F, "tiny",
                           "float32")
    kf = tuning.kernel_factors(F, "explicit")
    space = Space("forms", kf, [(False, False, 4, False)],
                  dict(tx=[1, 2], ty=[1], nnz_batch=[8], bx=[kf], by=[kf], square_tiles=True,
                       tz=[1], solve_wg=[0], solver=["cholesky", "fusedcg"], cg_steps=[3]))
    monkeypatch.setattr(strategies, "Measurer", ChallengerFails)
    s = strategies.run(case, space, "exhaustive", db=db, state_dir=tmp_path / "st",
                       progress=False, sample=0.5, sample_tol=0)
    fin = s["final"]
    for side in ("users", "items"):
        assert not any("fusedcg" in v for v in fin["candidates"][side])
        assert fin["tuned"]["configs"][side] == fin["searched_configs"][side]
    assert fin["chosen"] == "tuned"                    # 1.01 against the incumbent's 1.02


def test_form_probes_one_per_other_form_and_none_on_cpus(dbs):
    """The sample check's extra probes: on a many-CU device, the first configuration of each
    kernel form other than the probe's among what the user had and the earlier bests; none on
    a CPU (its samples are not balanced either)."""
    import dataclasses

    from clmf.autotune.incumbent import form_probes, kernel_form
    if not DEVICES:
        pytest.skip("no OpenCL device")
    seed, _db = dbs
    dev = DEVICES[0]
    earlier = write_earlier(seed, dev, "explicit", "batch+vec4:tx=1,ty=1,solver=fusedcg")
    case = strategies.Case(dev, random_ratings(160, 90, 0.08, seed=4), F, "tiny", "float32")
    probe = KernelConfig.parse("batch+reg:tx=2,ty=2")
    if case.info.type == "CPU":
        assert form_probes(case, probe) == []
    case.info = dataclasses.replace(case.info, type="GPU")
    got = form_probes(case, probe)
    assert [kernel_form(c) for c in got] == ["fusedcg"] and got[0].name == earlier.name
    other = [kernel_form(c) for c in form_probes(case, earlier)]
    assert "fusedcg" not in other and len(set(other)) == len(other)   # one per other form
