"""The tuning database and the library's fallback chain (clmf.tuning): every rung, the search
order, corrupted and foreign-schema files (warning, safe default, file untouched), atomic appends
under concurrency. No OpenCL device needed: a DeviceInfo is made up."""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import warnings

import pytest

from clmf import tuning
from clmf.engine.config import KernelConfig
from clmf.engine.device import DeviceInfo
from clmf.tuning.database import Database, base_record


def fake_info(platform="FakeCL", vendor="FakeVendor", name="Fake GPU 1", type_="GPU", **kw):
    d = dict(index="0:0", platform=platform, platform_version="FakeCL 3.0", vendor=vendor, name=name,
             type=type_, driver="1.0", opencl_c_version="OpenCL C 1.2", compute_units=8,
             global_mem=8 << 30, max_alloc=2 << 30, local_mem=48 * 1024, local_mem_type="local",
             max_work_group_size=1024, max_work_item_sizes=(1024, 1024, 64),
             preferred_vector_width_float=1, native_vector_width_float=1, clock_mhz=1000)
    d.update(kw)
    names = {f.name for f in dataclasses.fields(DeviceInfo)}
    return DeviceInfo(**{k: v for k, v in d.items() if k in names})


ML = {"m": 943, "n": 1682, "nnz": 90570}
NETFLIX = {"m": 24009, "n": 888, "nnz": 4953606}


def stats(side, ds):
    rows, cols = (ds["m"], ds["n"]) if side == "users" else (ds["n"], ds["m"])
    return {"rows": rows, "cols": cols, "nnz": ds["nnz"], "mean": ds["nnz"] / rows, "max": 100}


def best_records(info, f, ds, users, items, run_id, rel=0.5, storage="float32", mode=None,
                 alpha=None):
    """``best`` records of one run; ``mode=None`` writes them as before modes existed."""
    dev = tuning.device_record(info)
    extra = {} if mode is None else {"mode": mode}
    if alpha is not None:
        extra["alpha"] = alpha
    out = []
    for side, v in (("users", users), ("items", items)):
        cfg = KernelConfig.parse(v, storage=storage)
        out.append(base_record("best", run_id=run_id, device=dev, f=f, storage=storage, side=side,
                               dataset=dict(ds, name="x"), config=cfg.to_dict(), variant=str(cfg),
                               seconds=1.0, iteration_rel_baseline=rel, **extra))
    return out


def measurement(info, f, run_id, side, variant, seconds, mode=None):
    cfg = KernelConfig.parse(variant)
    extra = {} if mode is None else {"mode": mode}
    return base_record("measurement", status="ok", run_id=run_id, device=tuning.device_record(info),
                       f=f, storage="float32", side=side, dataset=dict(ML, name="x"),
                       config=cfg.to_dict(), variant=str(cfg), seconds=seconds, **extra)


@pytest.fixture
def dbenv(tmp_path, monkeypatch):
    """Isolated search path: $CLMF_TUNING_DB, the per-user database and no shipped files."""
    env = tmp_path / "env.jsonl"
    user = tmp_path / "user" / "tuning.jsonl"
    monkeypatch.setenv("CLMF_TUNING_DB", str(env))
    monkeypatch.setattr(tuning.database, "user_db_path", lambda: user)
    monkeypatch.setattr(tuning.database, "shipped_paths", lambda: [])
    return {"env": env, "user": user, "tmp": tmp_path}


def write(path, records):
    Database(path).append(records)


A = "batch+reg+local:tx=8,ty=8,nnz_batch=16"
B = "batch+reg:tx=4,ty=4"
C = "batch+local:tx=4,ty=8,nnz_batch=64"


def test_no_database_uses_the_heuristic(dbenv):
    info = fake_info()
    ch = tuning.choose(info, 10, "users", stats("users", ML))
    assert ch.rule == "heuristic"
    assert ch.config == tuning.heuristic(info, 10)
    # the paper's rule: tx = ty = the largest divisor of the tile edge that fits
    assert ch.config.reg and ch.config.tx == ch.config.ty == 10


def test_heuristic_rule_sizes():
    info = fake_info(max_work_group_size=256)
    assert tuning.heuristic(info, 64).tx == 16          # 16 | 64, 16·16 ≤ 256, 4×4 registers
    assert tuning.heuristic(info, 50).tx == 10
    c = tuning.heuristic(info, 17)                       # prime: no divisor fits → sized baseline
    assert not c.reg and c.tx * c.ty <= 256


def test_baseline_when_nothing_fits(dbenv):
    info = fake_info(max_work_group_size=32, max_work_item_sizes=(32, 32, 32))
    ch = tuning.choose(info, 17, "users", None)
    assert ch.rule in ("heuristic", "baseline")
    tiny = fake_info(max_work_group_size=1, max_work_item_sizes=(1, 1, 1))
    ch = tuning.choose(tiny, 17, "users", None)
    assert ch.rule == "baseline" and ch.config == tuning.BASELINE


def test_tuned_exact_and_pair_consistency(dbenv):
    info = fake_info()
    write(dbenv["env"], best_records(info, 10, ML, A, B, "r1"))
    write(dbenv["env"], best_records(info, 10, NETFLIX, C, A, "r2"))
    u = tuning.choose(info, 10, "users", stats("users", ML))
    i = tuning.choose(info, 10, "items", stats("items", ML))
    assert (u.rule, i.rule) == ("tuned", "tuned")
    assert u.config == KernelConfig.parse(A) and i.config == KernelConfig.parse(B)
    assert "r1" in u.reason
    u = tuning.choose(info, 10, "users", stats("users", NETFLIX))
    i = tuning.choose(info, 10, "items", stats("items", NETFLIX))
    assert u.config == KernelConfig.parse(C) and i.config == KernelConfig.parse(A)


def test_nearest_class_and_f_on_the_same_device(dbenv):
    info = fake_info()
    write(dbenv["env"], best_records(info, 10, ML, A, B, "r1"))
    # a data set of another class, same f → nearest
    far = {"m": 400000, "n": 17000, "nnz": 90_000_000}
    ch = tuning.choose(info, 10, "users", stats("users", far))
    assert ch.rule == "nearest" and ch.config == KernelConfig.parse(A)
    # another f → nearest f of the same device (validated for this f)
    ch = tuning.choose(info, 12, "users", stats("users", ML))
    assert ch.rule == "nearest" and ch.config.name == "batch+reg+local"


def test_vendor_rung(dbenv):
    seen = fake_info(name="Fake GPU 1")
    other = fake_info(name="Fake GPU 2")       # same vendor and platform, another device
    write(dbenv["env"], best_records(seen, 10, ML, A, B, "r1"))
    ch = tuning.choose(other, 10, "users", stats("users", ML))
    assert ch.rule == "vendor" and ch.config == KernelConfig.parse(A)


def test_computed_default_rung(dbenv):
    seen = fake_info(platform="OtherCL", vendor="OtherVendor", name="GPU X")
    unseen = fake_info(platform="FakeCL", vendor="FakeVendor", name="GPU Y")
    recs = []
    # two runs × two sides: A is best on average though never the single best
    for run, (ta, tb, tc) in {"m1": (1.1, 1.0, 3.0), "m2": (1.1, 3.0, 1.0)}.items():
        for side in ("users", "items"):
            recs += [measurement(seen, 10, run, side, A, ta), measurement(seen, 10, run, side, B, tb),
                     measurement(seen, 10, run, side, C, tc)]
    write(dbenv["env"], recs)
    ch = tuning.choose(unseen, 10, "users", stats("users", ML))
    assert ch.rule == "default" and ch.config == KernelConfig.parse(A)
    assert "mean relative time" in ch.reason
    # another device type: no stored results of its type → the heuristic
    cpu = fake_info(type_="CPU", name="CPU Z", max_work_group_size=8192)
    assert tuning.choose(cpu, 10, "users", stats("users", ML)).rule == "heuristic"


def test_invalid_tuned_config_falls_through(dbenv):
    info = fake_info()
    small = fake_info(max_work_group_size=16, max_work_item_sizes=(16, 16, 16))
    write(dbenv["env"], best_records(info, 10, ML, A, A, "r1"))   # 64 work-items
    ch = tuning.choose(small, 10, "users", stats("users", ML))
    assert ch.rule not in ("tuned", "nearest", "vendor") or ch.config.s1_local_size() <= 16


def test_user_database_wins_over_shipped(dbenv, tmp_path, monkeypatch):
    info = fake_info()
    shipped = tmp_path / "shipped.jsonl"
    write(shipped, best_records(info, 10, ML, B, B, "shipped-run"))
    write(dbenv["user"], best_records(info, 10, ML, A, A, "user-run"))
    monkeypatch.setattr(tuning.database, "shipped_paths", lambda: [shipped])
    monkeypatch.delenv("CLMF_TUNING_DB")
    ch = tuning.choose(info, 10, "users", stats("users", ML))
    assert ch.rule == "tuned" and ch.config == KernelConfig.parse(A) and "user database" in ch.reason
    # $CLMF_TUNING_DB comes first
    write(dbenv["env"], best_records(info, 10, ML, C, C, "env-run"))
    monkeypatch.setenv("CLMF_TUNING_DB", str(dbenv["env"]))
    ch = tuning.choose(info, 10, "users", stats("users", ML))
    assert ch.config == KernelConfig.parse(C) and "env database" in ch.reason
    # the shipped file alone still answers
    monkeypatch.delenv("CLMF_TUNING_DB")
    dbenv["user"].unlink()
    ch = tuning.choose(info, 10, "users", stats("users", ML))
    assert ch.config == KernelConfig.parse(B) and "shipped" in ch.reason


def test_solver_request_overrides(dbenv):
    info = fake_info()
    write(dbenv["env"], best_records(info, 10, ML, A, B, "r1"))
    ch = tuning.choose(info, 10, "users", stats("users", ML), solver="cg")
    assert ch.rule == "tuned" and ch.config.solver == "cg" and "solver=cg requested" in ch.reason


@pytest.mark.parametrize("content", [
    b'{"schema_version": 1, "kind": "best"\n',                                  # torn JSON
    b"\x00\xff\xfe garbage\n",                                                    # binary junk
    b'[1, 2, 3]\n',                                                               # not an object
    b'{"schema_version": 99, "kind": "best", "future": true}\n',                 # foreign schema
    b'{"kind": "best", "no_schema": true}\n',                                    # no schema
], ids=["torn", "binary", "array", "foreign-schema", "no-schema"])
def test_corrupted_or_foreign_file(dbenv, content):
    info = fake_info()
    good = best_records(info, 10, ML, A, B, "r1")
    raw = b"".join(json.dumps(r).encode() + b"\n" for r in good) + content
    dbenv["env"].write_bytes(raw)
    before = os.stat(dbenv["env"])
    with pytest.warns(tuning.TuningDatabaseWarning, match=f"{dbenv['env']}: 1 record.*line 3"):
        ch = tuning.choose(info, 10, "users", stats("users", ML))
    assert ch.rule == "tuned"                     # the bad line alone is skipped
    assert dbenv["env"].read_bytes() == raw       # untouched
    assert os.stat(dbenv["env"]).st_mtime_ns == before.st_mtime_ns
    # the writer refuses to append to it, and leaves it alone
    with pytest.raises(ValueError):
        Database(dbenv["env"]).append(good)
    assert dbenv["env"].read_bytes() == raw
    # a fit-time lookup warns once per file version, not on every call
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tuning.choose(info, 10, "items", stats("items", ML))


def test_unreadable_directory_entry_is_ignored(dbenv, tmp_path, monkeypatch):
    d = tmp_path / "dbdir"
    d.mkdir()
    info = fake_info()
    write(d / "a.jsonl", best_records(info, 10, ML, A, B, "r1"))
    (d / "notes.txt").write_text("not a database")
    monkeypatch.setenv("CLMF_TUNING_DB", str(d))
    assert tuning.choose(info, 10, "users", stats("users", ML)).rule == "tuned"


def test_reads_are_cached_by_mtime(dbenv):
    info = fake_info()
    write(dbenv["env"], best_records(info, 10, ML, A, B, "r1"))
    first = tuning.read_database(dbenv["env"])
    assert tuning.read_database(dbenv["env"]) is first          # no re-parse
    write(dbenv["env"], best_records(info, 50, ML, A, B, "r2"))
    again = tuning.read_database(dbenv["env"])
    assert again is not first and len(again) == len(first) + 2


def _writer(path, wid, n):
    db = Database(path)
    for k in range(n):
        db.append([{"schema_version": tuning.SCHEMA_VERSION, "kind": "measurement", "w": wid,
                    "k": k, "part": p, "pad": "x" * (1000 + 37 * p)} for p in range(3)])


def test_atomic_appends_under_concurrency(tmp_path):
    path = tmp_path / "db.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, w, 40)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    recs = [json.loads(x) for x in lines[:-1]]          # every line whole
    assert len(recs) == 6 * 40 * 3
    # each append's records are contiguous (one write under the lock)
    for i in range(0, len(recs), 3):
        grp = recs[i:i + 3]
        assert [r["part"] for r in grp] == [0, 1, 2]
        assert len({(r["w"], r["k"]) for r in grp}) == 1
    assert tuning.read_database(path, strict=True) is not None


def test_dataset_class_and_distance():
    import numpy as np
    import scipy.sparse as sp
    R = sp.random(50, 30, density=0.2, random_state=0, format="csr")
    c = tuning.dataset_class(R)
    assert (c["m"], c["n"], c["nnz"]) == (50, 30, R.nnz)
    assert c["row_max"] == int(np.diff(R.indptr).max())
    assert tuning.class_distance(c, c) == 0
    assert tuning.class_distance(ML, NETFLIX) > tuning.CLASS_TOL


def test_device_slug():
    info = fake_info(platform="Portable Computing Language", name="pthread-skylake-avx512-AMD EPYC")
    assert tuning.device_slug(tuning.device_record(info)) == \
        "portable-computing-language-pthread-skylake-avx512-amd-epyc"


# ----- modes: explicit, implicit, biased -------------------------------------------------------
D = "batch+reg+local:tx=4,ty=4,nnz_batch=32,solver=cg"
E = "batch+reg:tx=2,ty=2,solver=cholesky"


def test_mode_round_trip_and_old_records_are_explicit(dbenv):
    info = fake_info()
    write(dbenv["env"], best_records(info, 10, ML, A, B, "old"))                 # no mode key
    write(dbenv["env"], best_records(info, 10, ML, C, D, "imp", mode="implicit", alpha=2.0))
    write(dbenv["env"], best_records(info, 10, ML, E, E, "bia", mode="biased"))
    recs = tuning.read_database(dbenv["env"], strict=True)
    assert all(r["schema_version"] == tuning.SCHEMA_VERSION == 1 for r in recs)
    assert [tuning.record_mode(r) for r in recs] == ["explicit"] * 2 + ["implicit"] * 2 + \
        ["biased"] * 2
    assert recs[2]["alpha"] == 2.0
    cases = {c.run_id: c for c in tuning.lookup.record_cases(recs, "env")}
    assert {k: c.mode for k, c in cases.items()} == {"old": "explicit", "imp": "implicit",
                                                     "bia": "biased"}
    assert cases["imp"].configs["items"] == KernelConfig.parse(D)
    # a mode this clmf does not know is skipped, the rest of the file still answers
    write(dbenv["env"], best_records(info, 10, ML, E, E, "fut", mode="tensor"))
    assert "fut" not in {c.run_id for c in tuning.lookup.record_cases(tuning.read_database(dbenv["env"]), "e")}
    assert tuning.choose(info, 10, "users", stats("users", ML)).rule == "tuned"


def test_lookup_prefers_the_fits_mode(dbenv):
    info = fake_info()
    write(dbenv["env"], best_records(info, 10, ML, A, B, "exp", mode="explicit"))
    write(dbenv["env"], best_records(info, 10, ML, C, D, "imp", mode="implicit", alpha=2.0))
    write(dbenv["env"], best_records(info, 10, ML, E, E, "bia", mode="biased", rel=0.9))
    u = tuning.choose(info, 10, "users", stats("users", ML))
    assert u.rule == "tuned" and u.config == KernelConfig.parse(A) and "exp" in u.reason
    u = tuning.choose(info, 10, "users", stats("users", ML), mode="implicit")
    i = tuning.choose(info, 10, "items", stats("items", ML), mode="implicit")
    assert (u.rule, i.rule) == ("tuned", "tuned")
    assert u.config == KernelConfig.parse(C) and i.config == KernelConfig.parse(D)
    assert i.config.solver == "cg"              # tuned for implicit: its solver is kept
    assert "-mode tuning" not in u.reason and "imp" in u.reason
    b = tuning.choose(info, 10, "users", stats("users", ML), mode="biased")
    assert b.rule == "tuned" and b.config == KernelConfig.parse(E) and "bia" in b.reason
    # same mode on this device beats a nearer data-set class of another mode
    far = {"m": 400000, "n": 17000, "nnz": 90_000_000}
    write(dbenv["env"], best_records(info, 10, far, A, A, "exp-far", mode="explicit"))
    n = tuning.choose(info, 10, "users", stats("users", far), mode="implicit")
    assert n.rule == "nearest" and n.config == KernelConfig.parse(C)
    with pytest.raises(ValueError):
        tuning.choose(info, 10, "users", None, mode="tensor")


def test_lookup_falls_back_to_explicit_tunings_with_a_reason(dbenv):
    info = fake_info()
    write(dbenv["env"], best_records(info, 10, ML, A, B, "exp"))      # an old, explicit record
    u = tuning.choose(info, 10, "users", stats("users", ML), mode="implicit")
    i = tuning.choose(info, 10, "items", stats("items", ML), mode="implicit")
    assert (u.rule, i.rule) == ("tuned", "tuned")
    # the explicit tuning's kernels and solver: implicit feedback runs the same hermitian path
    # (issue 27: no fused CG forced on it)
    assert u.config == KernelConfig.parse(A) and i.config == KernelConfig.parse(B)
    assert "explicit-mode tuning" in u.reason and "no implicit-mode tuning" in u.reason
    assert "fusedcg" not in u.reason
    # a solver the caller asks for still wins
    u = tuning.choose(info, 10, "users", stats("users", ML), solver="cg", mode="implicit")
    assert u.config.solver == "cg" and "solver=cg requested" in u.reason
    assert "fusedcg" not in u.reason
    # biases: the explicit tuning as it is, validated for the biased kernels (f + 1 unknowns)
    b = tuning.choose(info, 10, "users", stats("users", ML), mode="biased")
    assert b.rule == "tuned" and b.config == KernelConfig.parse(A)
    assert "explicit-mode tuning" in b.reason and "no biased-mode tuning" in b.reason
    # the same device's explicit tuning comes before another device's implicit tuning
    other = fake_info(name="Fake GPU 2")
    write(dbenv["env"], best_records(other, 10, ML, C, C, "imp-other", mode="implicit"))
    assert tuning.choose(info, 10, "users", stats("users", ML), mode="implicit").rule == "tuned"
    v = tuning.choose(fake_info(name="Fake GPU 3"), 10, "users", stats("users", ML),
                      mode="implicit")
    assert v.rule == "vendor" and v.config == KernelConfig.parse(C) and "-mode" not in v.reason


def test_implicit_with_nothing_tuned_keeps_the_fused_cg(dbenv):
    info = fake_info()
    ch = tuning.choose(info, 10, "users", stats("users", ML), mode="implicit")
    assert ch.rule == "heuristic" and ch.config == tuning.heuristic(info, 10).replace(
        solver="fusedcg")
    assert "solver=fusedcg" in ch.reason
    # explicit and biased fits keep the heuristic's Cholesky; biases size it for f + 1
    assert tuning.choose(info, 10, "users", None).config.solver == "cholesky"
    assert tuning.choose(info, 10, "users", None, mode="biased").config == \
        tuning.heuristic(info, 11)


def test_biased_lookup_validates_at_f_plus_one(dbenv, monkeypatch):
    import clmf.engine.kernels
    info = fake_info()
    write(dbenv["env"], best_records(info, 10, ML, A, B, "bia", mode="biased"))
    seen = []
    real = clmf.engine.kernels.validate

    def spy(cfg, f, dev):
        seen.append(f)
        return real(cfg, f, dev)
    monkeypatch.setattr(clmf.engine.kernels, "validate", spy)
    assert tuning.choose(info, 10, "users", stats("users", ML), mode="biased").rule == "tuned"
    assert seen and set(seen) == {11}


def test_computed_default_by_mode(dbenv):
    seen = fake_info(platform="OtherCL", vendor="OtherVendor", name="GPU X")
    unseen = fake_info(platform="FakeCL", vendor="FakeVendor", name="GPU Y")
    recs = []
    for run, (ta, tb) in {"m1": (1.0, 2.0), "m2": (1.0, 2.0)}.items():
        for side in ("users", "items"):
            recs += [measurement(seen, 10, run, side, A, ta), measurement(seen, 10, run, side, B, tb)]
            recs += [measurement(seen, 10, "i" + run, side, A, tb, mode="implicit"),
                     measurement(seen, 10, "i" + run, side, B, ta, mode="implicit")]
    write(dbenv["env"], recs)
    assert tuning.choose(unseen, 10, "users", None).config == KernelConfig.parse(A)
    ch = tuning.choose(unseen, 10, "users", None, mode="implicit")
    assert ch.rule == "default" and ch.config == KernelConfig.parse(B)   # its own kernel
    assert "-mode tuning" not in ch.reason and ch.config.solver == "cholesky"
    ch = tuning.choose(unseen, 10, "users", None, mode="biased")       # none: explicit ones
    assert ch.rule == "default" and ch.config == KernelConfig.parse(A)
    assert "explicit-mode tuning" in ch.reason


def test_newest_run_of_the_same_case_wins(dbenv):
    """Two runs of one case: the newer measured the current kernels; its pair is used even when
    the older run's time relative to its own (older, slower) baseline looks better."""
    info = fake_info()
    old = best_records(info, 10, ML, A, A, "old", rel=0.1)
    new = best_records(info, 10, ML, B, B, "new", rel=0.6)
    for r in old:
        r["date"] = "2026-11-21T10:00:00+00:00"
    for r in new:
        r["date"] = "2026-11-22T10:00:00+00:00"
    write(dbenv["env"], new + old)                   # file order does not decide either
    ch = tuning.choose(info, 10, "users", stats("users", ML))
    assert ch.rule == "tuned" and ch.config == KernelConfig.parse(B) and "new" in ch.reason


def test_a_training_split_takes_the_newest_tuning_of_its_set(dbenv):
    """A set and its training split (a few ratings held out) are one shape: the newest run of
    either wins, not the older run that happens to match the split's nnz exactly (the Netflix
    shape less 20,000 held-out ratings kept an old tuning over a newer one of the whole set)."""
    info = fake_info()
    split = dict(NETFLIX, nnz=NETFLIX["nnz"] - 2000)          # 0.04 % fewer ratings
    far = dict(NETFLIX, nnz=int(NETFLIX["nnz"] * 1.2))          # 20 % more: another shape
    runs = {"old-split": (split, A, "2026-11-21"), "new-far": (far, B, "2026-11-22"),
            "new-whole": (NETFLIX, B, "2026-11-23")}
    recs = {}
    for run, (ds, cfg, day) in runs.items():
        recs[run] = best_records(info, 10, ds, cfg, cfg, run)
        for r in recs[run]:
            r["date"] = f"{day}T10:00:00+00:00"
    # a newer tuning of a shape further away than SAME_SHAPE_TOL: the distance ranks first
    write(dbenv["env"], recs["old-split"] + recs["new-far"])
    ch = tuning.choose(info, 10, "users", stats("users", split))
    assert ch.rule == "tuned" and ch.config == KernelConfig.parse(A) and "old-split" in ch.reason
    write(dbenv["env"], recs["new-whole"])
    ch = tuning.choose(info, 10, "users", stats("users", split))
    assert ch.rule == "tuned" and ch.config == KernelConfig.parse(B) and "new-whole" in ch.reason


def test_a_tuned_syrk_is_adapted_to_a_larger_f_not_refused(dbenv, monkeypatch):
    """The syrk tuned at f = 100 with 2 slices (182 work-items) needs 306 at f = 128, more than a
    built kernel's register-bound limit of 256 on an H100 (issue 27): once that rejection is
    known, the lookup halves the split-K slices (153 work-items, the same tiles) and says so,
    instead of falling through to another rule; a device whose work-group limit itself is too
    small gets the halved form before any build."""
    from clmf.tuning import fallback
    monkeypatch.setattr(fallback, "_rejected", {})          # this test's rejections only
    info = fake_info()
    syrk = "batch+vec4+syrk:bx=8,ks=2,solver=cg"
    write(dbenv["env"], best_records(info, 100, NETFLIX, syrk, syrk, "syrk100"))
    ch = tuning.choose(info, 128, "users", stats("users", NETFLIX))
    assert ch.config == KernelConfig.parse(syrk) and ch.rule in ("model", "nearest"), ch
    fallback.reject(info, ch.config, 128, "explicit", "test", "kernel s1_hermitian allows "
                    "work-groups of at most 256 on this device, the configuration needs 306")
    ch = tuning.choose(info, 128, "users", stats("users", NETFLIX))
    assert ch.config == KernelConfig.parse(syrk, ks=1), ch
    assert "ks 2→1" in ch.reason
    small = fake_info(name="Fake GPU 1", max_work_group_size=256, max_work_item_sizes=(256, 256, 64))
    ch = tuning.choose(small, 128, "users", stats("users", NETFLIX))
    assert ch.config == KernelConfig.parse(syrk, ks=1) and "ks 2→1" in ch.reason, ch
