"""The selection model's leave-one-out offline (clmf.autotune.loo, issue 27): from planted tuning
records alone — no device — each cell's pick with all its runs left out, its time from the
cell's own measurements, picks never timed there reported unmeasured, and a configuration the
device refused at the cell's f rejected as the on-device check's build would."""
from __future__ import annotations

import dataclasses
import importlib

import pytest
from test_selection_model import run
from test_tuning_db import best_records, fake_info, write

from clmf import tuning
from clmf.engine.config import KernelConfig
from clmf.tuning.database import base_record

A = "batch:tx=8,ty=8"
B = "batch:tx=16,ty=16"
SHAPE = (2000, 1000, 40000)
DS = {"m": 2000, "n": 1000, "nnz": 40000}


def _loo():
    try:
        return importlib.import_module("clmf.autotune.loo")
    except ImportError:                      # a source checkout without the installed layout
        return importlib.import_module("tuner.loo")


def _cell(info, f, times, run_id, best):
    """One tuning run of a cell: its run record (the device as recorded), measurements and best
    records."""
    head = base_record("run", run_id=run_id, device=tuning.device_record(info), f=f,
                       storage="float32", device_info=dataclasses.asdict(info))
    return [head] + run(info, f, times, run_id, shape=SHAPE) \
        + best_records(info, f, DS, best, best, run_id, mode="explicit")


def _rows(path, **kw):
    return {r["f"]: r for r in _loo().offline_loo([path], **kw)}


def test_offline_leave_one_out(tmp_path):
    info = fake_info(name="Fake GPU loo")
    db = tmp_path / "db.jsonl"
    # (f = 48 beside f = 64: the f = 128 run, as near as f = 32's, never timed A, and a
    # configuration a near group does not report counts the prior's time there)
    write(db, _cell(info, 32, {A: 1.0, B: 1.5}, "r32", A)
          + _cell(info, 48, {A: 1.0, B: 1.3}, "r48", A)
          + _cell(info, 64, {A: 1.0, B: 1.4}, "r64", A)
          + _cell(info, 128, {B: 1.0}, "r128", B))
    rows = _rows(db)
    assert set(rows) == {32, 48, 64, 128}
    for f in (32, 48, 64):                   # A, from the neighbours, measured best here
        r = rows[f]
        assert (r["rule"], r["verdict"], r["runs"]) == ("model", "hit", [f"r{f}"])
        assert r["ratio"] == 1.0 and r["pick"] == str(KernelConfig.parse(A))
    r = rows[128]                            # A from f = 64, never timed at f = 128
    assert r["verdict"] == "unmeasured" and r["ratio"] is None
    assert r["pick"] == str(KernelConfig.parse(A)) and r["sides"]["users"] is None
    s = _loo().summary(rows.values())[r["device"]]
    assert (s["cells"], s["measured"], s["hits"], s["unmeasured"]) == (4, 3, 3, 1)
    assert "3 of 3 measured cells within 15 %" in _loo().markdown(list(rows.values()))


def test_the_held_out_cells_records_reach_the_model_from_no_database(tmp_path, monkeypatch):
    """The leave-one-out is honest: the held-out cell's runs are left out of every database it
    reads (a second given file — a distilled copy, another run of the cell under another id —
    included), and it reads no database but the given ones (the shipped and user databases,
    $CLMF_TUNING_DB). Here every other database says B at f = 32, the neighbours A: A."""
    from clmf.tuning import database
    info = fake_info(name="Fake GPU loo honest")
    db, copy, env = (tmp_path / x for x in ("db.jsonl", "copy.jsonl", "env.jsonl"))
    write(db, _cell(info, 32, {A: 1.0, B: 1.5}, "r32", A)
          + _cell(info, 64, {A: 1.0, B: 1.4}, "r64", A))
    write(copy, _cell(info, 32, {B: 1.0, A: 3.0}, "r32-copy", B))
    write(env, _cell(info, 32, {B: 1.0, A: 3.0}, "r32-env", B))
    monkeypatch.setenv("CLMF_TUNING_DB", str(env))
    monkeypatch.setattr(database, "shipped_paths", lambda: [env])
    monkeypatch.setattr(database, "user_db_path", lambda: env)
    (r,) = [r for r in _loo().offline_loo([db, copy]) if r["f"] == 32]
    assert set(r["runs"]) == {"r32", "r32-copy"} and r["rule"] == "model"
    assert r["pick"] == str(KernelConfig.parse(A))


def test_offline_leave_one_out_rejects_what_the_device_refused(tmp_path):
    """A measured as invalid at f = 128 (a built kernel's limit): the pick there is B, timed."""
    info = fake_info(name="Fake GPU refusing")
    db = tmp_path / "db.jsonl"
    bad = base_record("measurement", status="invalid", reason="kernel_work_group_size",
                      run_id="r128", device=tuning.device_record(info), f=128,
                      storage="float32", side="both", mode="explicit",
                      config=KernelConfig.parse(A).to_dict(), variant=A)
    write(db, _cell(info, 64, {A: 1.0, B: 1.3}, "r64", A)
          + _cell(info, 128, {B: 1.0, "batch:tx=4,ty=4": 1.1}, "r128", B) + [bad])
    with pytest.warns(tuning.TuningFallbackWarning, match="refused by this device"):
        r = _rows(db)[128]
    assert r["pick"] == str(KernelConfig.parse(B)) and r["verdict"] == "hit", r


def test_an_older_runs_time_is_set_against_the_cells_newest_best():
    """The pick P was timed only by an older run of the cell (1.07× that run's best A); the
    newest run timed A again beside M, 1.2× faster: P's time relative to the cell's best is
    1.07 × 1.2, not the older run's 1.07 (the on-device check times P against M)."""
    from clmf.tuning import model as M
    loo = _loo()
    cfg = {v: KernelConfig.parse(v) for v in (A, B, "batch:tx=4,ty=4")}
    P, M_ = cfg[B], cfg["batch:tx=4,ty=4"]
    measured = {}
    for side in ("users", "items"):
        measured[("old", side)] = {M.config_key(cfg[A]): (2.0, cfg[A]),
                                   M.config_key(P): (2.14, P)}
        measured[("new", side)] = {M.config_key(cfg[A]): (2.2, cfg[A]),
                                   M.config_key(M_): (2.2 / 1.2, M_)}
    cell = loo.LooCell({}, 64, "explicit", "float32", dict(DS), ["new", "old"])
    ratio, per = loo.pick_ratio(cell, {"users": P, "items": P}, measured,
                                {("new", s): M.config_key(M_) for s in ("users", "items")})
    assert ratio == pytest.approx(1.07 * 1.2) and per["users"] == (pytest.approx(1.07 * 1.2),
                                                                   "old")
    # a run sharing no configuration with the newer ones is left out: P unmeasured
    measured[("old", "users")].pop(M.config_key(cfg[A]))
    ratio, per = loo.pick_ratio(cell, {"users": P, "items": P}, measured)
    assert ratio is None and per["users"] is None


def test_configurations_running_the_same_kernels_at_the_cells_f_are_one():
    """A syrk with ``solve_wg=32`` runs the kernels of the one with the default at f = 32 (the
    default's S3 work-group there), not at f = 64: the offline check reads either's time for
    the other only where they are one."""
    key = _loo().same_kernels_key
    a = KernelConfig.parse("batch+vec4+syrk:bx=8,ks=8,solve_wg=32,solver=cg")
    b = KernelConfig.parse("batch+vec4+syrk:bx=8,ks=8,solver=cg")
    assert key(32, "explicit", "GPU")(a) == key(32, "explicit", "GPU")(b)
    assert key(64, "explicit", "GPU")(a) != key(64, "explicit", "GPU")(b)


def test_fused_cg_dimensions_forms_of_one_geometry_at_the_cells_f_are_one():
    """``dims_q`` is a least number of slices and ``dims_p=0`` as many work-items per entry as
    the work-group holds: the kernel reads only the geometry they come to at the cell's
    unknowns. At f = 100 (25 slices, 2 a work-item, 9 groups of 8 entries in 128 work-items)
    ``dims_p=0`` comes to one work-item per entry, the default; at f = 128 (8 groups) to two.
    With ``dims_shfl`` the parts are summed by shuffles and ``dims_p`` is not read at all."""
    key = _loo().same_kernels_key
    base = "batch+vec4:tx=1,ty=1,nnz_batch=8,solve_wg=128,solver=fusedcg,fused_dims=True,dims_q=2"
    a, b = KernelConfig.parse(base), KernelConfig.parse(base + ",dims_p=0")
    assert key(100, "explicit", "GPU")(a) == key(100, "explicit", "GPU")(b)
    assert key(128, "explicit", "GPU")(a) != key(128, "explicit", "GPU")(b)
    s, t = (KernelConfig.parse(base + x) for x in (",dims_shfl=True", ",dims_shfl=True,dims_p=0"))
    assert key(128, "explicit", "GPU")(s) == key(128, "explicit", "GPU")(t)
    # dims_q below what the work-group needs to cover f is the least that covers it
    u, v = (KernelConfig.parse(base.replace("dims_q=2", x).replace("solve_wg=128", "solve_wg=32"))
            for x in ("dims_q=1", "dims_q=2"))
    assert key(256, "explicit", "GPU")(u) == key(256, "explicit", "GPU")(v)
    assert key(64, "explicit", "GPU")(u) != key(64, "explicit", "GPU")(v)


def test_a_pick_the_tuner_found_wrong_in_the_cell_is_a_miss(tmp_path):
    """The cells of the first test, A found wrong by the f = 128 run (status ``wrong``: its
    reference check failed, so it was never timed there): the pick A at f = 128 is no longer
    unmeasured but a miss named ``wrong``."""
    info = fake_info(name="Fake GPU wrong")
    db = tmp_path / "db.jsonl"
    bad = base_record("measurement", status="wrong", reason="reference_mismatch",
                      run_id="r128", device=tuning.device_record(info), f=128,
                      storage="float32", side="both", mode="explicit", verify_rel_err=0.005,
                      config=KernelConfig.parse(A).to_dict(), variant=A)
    write(db, _cell(info, 32, {A: 1.0, B: 1.5}, "r32", A)
          + _cell(info, 48, {A: 1.0, B: 1.3}, "r48", A)
          + _cell(info, 64, {A: 1.0, B: 1.4}, "r64", A)
          + _cell(info, 128, {B: 1.0}, "r128", B) + [bad])
    rows = _rows(db)
    r = rows[128]
    assert r["pick"] == str(KernelConfig.parse(A)) and r["ratio"] is None
    assert r["verdict"] == "wrong" and r["wrong"] == {"users": 0.005, "items": 0.005}
    assert rows[64]["verdict"] == "hit" and rows[64]["wrong"] == {}
    s = _loo().summary(rows.values())[r["device"]]
    assert (s["measured"], s["hits"], s["unmeasured"], s["wrong"]) == (4, 3, 0, 1)
    assert "1 of the misses a pick the tuner found wrong" in _loo().markdown(list(rows.values()))
