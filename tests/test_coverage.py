"""The coverage table and the leave-one-out check of the selection model (issue 27):
scripts/coverage.py at a small size on one CPU device (tuning its own cells into an isolated
database), its rows, rules and table; the check's arithmetic; and scripts/gpu_implicit.py's
phases at a tiny size on a CPU (the GPU command, resumable)."""
from __future__ import annotations

import json
import os

import pytest
from conftest import DEVICES, repo_script

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")


@pytest.fixture(autouse=True)
def _environment_restored():
    """The scripts' main() sets the process's tuning-database variables (as a command would):
    restored after each test, so later tests see the shipped tunings again."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _script(name):
    """The script ``scripts/<name>.py`` as a module."""
    return repo_script(f"scripts/{name}.py")


def _restore_env(monkeypatch):
    """The scripts set their databases in os.environ: restored after the test."""
    for k in ("CLMF_TUNING_DB", "CLMF_TUNING_NO_SHIPPED", "XDG_DATA_HOME"):
        if k in os.environ:
            monkeypatch.setenv(k, os.environ[k])
        else:                  # (recorded as unset: removed again after the test)
            monkeypatch.setenv(k, "")
            monkeypatch.delenv(k)


def _device():
    """The first device's selector (PoCL where present)."""
    d = DEVICES[0]
    return f"{d.platform.name.strip()} | {d.name.strip()}"


def test_loo_check_counts_cells_within_tolerance():
    from clmf.autotune import coverage as C
    cell = {"device": "d", "dataset": "x", "mode": "explicit"}
    rows = [dict(cell, f=f, **r) for f, r in enumerate(
        [{"loo_ratio": 1.0}, {"loo_ratio": 1.1}, {"loo_ratio": 1.2}, {"auto_ratio": 1.0}])]
    c = C.loo_check(rows)
    assert (c["cells"], c["within"]) == (3, 2) and not c["ok"]
    assert C.loo_check(rows[:2])["ok"]
    assert "2 of 3 cells within 15 %" in C.markdown(rows)


def test_coverage_script_small(tmp_path, monkeypatch):
    """Two f × two modes on a small synthetic set: each cell tuned (a 1-second budget, whole
    half-steps), then auto (rule tuned) and the leave-one-out choice (another rule: the cell's
    tunings left out) timed; the table and the check are written, and a second run resumes
    (nothing measured again). ~1 min on the 2-core machine: four tuning runs and their fits."""
    cov = _script("coverage")
    out = tmp_path / "cov"
    _restore_env(monkeypatch)
    monkeypatch.setenv("CLMF_PROBE", "off")
    argv = [str(out), "--devices", _device(), "--data", "synthetic:300x200x6000",
            "--factors", "4,8", "--modes", "explicit,implicit", "--budget", "1",
            "--sample", "full", "--iterations", "3", "--rounds", "1", "--isolated"]
    assert cov.main(argv) == 0
    rows = [json.loads(x) for x in (out / "coverage.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["tuned_here"] for r in rows)
    for r in rows:
        assert r["auto_rule"] == "tuned" and r["auto_s_per_it"] > 0, r
        assert r["loo_rule"] != "tuned" and r["loo_s_per_it"] > 0, r
        assert r["best_s_per_it"] == min(r["auto_s_per_it"], r["loo_s_per_it"])
        assert r["cell_runs"] and r["auto_ratio"] >= 1.0 and r["loo_ratio"] >= 1.0
    # with tunings at the other f (and the other mode) the model answers the held-out cells
    assert {r["loo_rule"] for r in rows} <= {"model", "nearest", "heuristic"}
    assert any(r["loo_rule"] == "model" for r in rows)
    md = (out / "coverage.md").read_text()
    assert "Leave-one-out:" in md and md.count("| synthetic-300x200x6K |") == 4
    meta = json.loads((out / "meta.json").read_text())
    assert meta["commit"] and meta["drivers"] and "scripts/coverage.py" in meta["command"]
    before = (out / "coverage.jsonl").read_text()
    assert cov.main(argv) == 0                      # resumed: every cell already there
    assert (out / "coverage.jsonl").read_text() == before


def test_gpu_implicit_script_tiny_on_a_cpu(tmp_path, monkeypatch):
    """The GPU command's phases at a tiny size on a CPU device: auto fits of every mode and f
    (implicit with precision@10), the peers' row (skipped without CUDA), coverage cells tuned
    and timed, the report; a second run with --resume adds nothing, and a budget already spent
    leaves the report marked incomplete."""
    gpu = _script("gpu_implicit")
    out, again = tmp_path / "out", tmp_path / "again"
    _restore_env(monkeypatch)
    monkeypatch.setenv("CLMF_PROBE", "off")
    monkeypatch.setenv("CLMF_TUNING_NO_SHIPPED", "1")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "no-user-db"))
    common = ["--device", _device(), "--scale", "0.002", "--factors", "4,8",
              "--modes", "explicit,implicit", "--peer-factors", "8", "--iterations", "3",
              "--precision-users", "50", "--tune-budget", "1"]
    assert gpu.main(["--out", str(out), *common]) == 0
    auto = [json.loads(x) for x in (out / "auto.jsonl").read_text().splitlines()]
    assert {(r["mode"], r["f"]) for r in auto} == {(m, f) for m in ("explicit", "implicit")
                                                  for f in (4, 8)}
    assert all(0 <= r["precision_at_10"] <= 1 for r in auto if r["mode"] == "implicit")
    peers = [json.loads(x) for x in (out / "peers.jsonl").read_text().splitlines()]
    assert peers and (peers[0]["status"] == "skipped" or peers[0]["f"] == 8)
    cov = [json.loads(x) for x in (out / "coverage.jsonl").read_text().splitlines()]
    assert len(cov) == 4 and all(r["auto_rule"] == "tuned" for r in cov)
    assert (out / "tuning.jsonl.gz").is_file()
    rep = (out / "report.md").read_text()
    assert "implicit ÷ explicit" in rep and "Leave-one-out" in rep and "Incomplete" not in rep
    # resumed from the first run's files: nothing left to do
    assert gpu.main(["--out", str(again), "--resume", str(out), *common]) == 0
    assert (again / "auto.jsonl").read_text() == (out / "auto.jsonl").read_text()
    assert (again / "coverage.jsonl").read_text() == (out / "coverage.jsonl").read_text()
    # no time left: nothing measured, the report says to run again
    assert gpu.main(["--out", str(tmp_path / "none"), "--max-seconds", "0", *common]) == 0
    assert "Incomplete" in (tmp_path / "none" / "report.md").read_text()


def test_cell_runs_include_runs_without_best_records(monkeypatch):
    """A run cut short left measurements of the cell but no best records: the selection model
    reads them as the case itself, so the leave-one-out must leave them out too (stop 39's
    implicit f = 256 cell was predicted from such a run, at d² = 0.20)."""
    import dataclasses

    import scipy.sparse as sp
    from test_selection_model import run
    from test_tuning_db import best_records, fake_info

    from clmf.autotune import coverage as C
    info = fake_info()
    monkeypatch.setattr(C.Cell, "info", property(lambda self: info))
    R = sp.random(2000, 1000, density=0.02, format="csr", random_state=0)
    ds = {"m": 2000, "n": 1000, "nnz": int(R.nnz)}
    cell = C.Cell(None, R, "x", 64, "implicit")
    A, B = "batch+reg:tx=4,ty=4", "batch+reg+local:nnz_batch=16"
    done = run(info, 64, {A: 1.0}, "done", mode="implicit", shape=(2000, 1000, R.nnz)) \
        + best_records(info, 64, ds, A, A, "done", mode="implicit")
    cut = run(info, 64, {B: 1.0}, "cut", mode="implicit", shape=(2000, 1000, R.nnz))
    other = run(info, 64, {B: 1.0}, "explicit", shape=(2000, 1000, R.nnz))
    far = run(info, 64, {B: 1.0}, "far", mode="implicit", shape=(20000, 1000, 10 * R.nnz))
    assert dataclasses.is_dataclass(cell)
    assert C.cell_runs(cell, [("db", "p", done + cut + other + far)]) == ["cut", "done"]


def test_choices_reject_a_pick_the_device_refuses(monkeypatch):
    """A pick that validates but whose built kernel the device refuses (stop 39: a syrk needing
    306 work-items where NVIDIA's built kernel allows 256) is rejected and the lookup asked
    again, as a fit does — the leave-one-out times what a user's fit would run."""
    import scipy.sparse as sp
    from test_tuning_db import fake_info

    import clmf.tuning as tuning
    from clmf.autotune import coverage as C
    from clmf.engine.config import KernelConfig
    from clmf.errors import InvalidConfigError
    from clmf.tuning import fallback
    from clmf.tuning.lookup import Choice
    info = fake_info()
    monkeypatch.setattr(C.Cell, "info", property(lambda self: info))
    bad, good = KernelConfig.parse("batch+vec4+syrk:bx=8,ks=2"), KernelConfig.parse("batch")
    f = 97                                           # (no other test rejects at this f)

    def incumbent(info_, f_, stats, storage, solver, mode, exclude_runs=(), paths=None):
        cfg = good if fallback.rejection(info_, bad, f_, mode) else bad
        return {s: Choice(cfg, "model", "planted") for s in ("users", "items")}

    def build(cell, cfg):
        if cfg == bad:
            raise InvalidConfigError("kernel s1_hermitian allows work-groups of at most 256",
                                     "kernel_work_group_size")
    monkeypatch.setattr(tuning, "incumbent", incumbent)
    monkeypatch.setattr(C, "_build", build)
    cell = C.Cell(None, sp.random(50, 40, density=0.1, format="csr", random_state=0), "x", f,
                  "biased")
    with pytest.warns(fallback.TuningFallbackWarning):
        picks = C.choices(cell)
    assert {s: c.config for s, c in picks.items()} == {"users": good, "items": good}
    assert fallback.rejection(info, bad, f, "biased") is not None
