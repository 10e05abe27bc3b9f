"""gzip tuning databases (``*.jsonl.gz``, issue 32): read and searched like plain ones, one gzip
member per append with a plain append's guarantees (a member cut short is skipped by readers and
dropped by the next append), and compaction into one member that concurrent appends survive. No
OpenCL device needed."""
from __future__ import annotations

import gzip
import json
import multiprocessing
import os

import pytest
from test_tuning_db import ML, A, B, best_records, fake_info, stats

from clmf import tuning
from clmf.tuning.database import Database


def _lines(path):
    return [json.loads(x) for x in gzip.decompress(path.read_bytes()).splitlines()]


def test_gzip_database_appends_members_and_reads_as_the_plain_one(tmp_path, monkeypatch):
    info = fake_info()
    runs = [best_records(info, f, ML, A, B, f"r{f}") for f in (10, 50)]
    for name in ("db.jsonl", "db.jsonl.gz"):
        for recs in runs:
            Database(tmp_path / name).append(recs)
    gz, plain = tmp_path / "db.jsonl.gz", tmp_path / "db.jsonl"
    assert gz.read_bytes()[:2] == b"\x1f\x8b" and gz.stat().st_size < plain.stat().st_size
    assert gzip.decompress(gz.read_bytes()) == plain.read_bytes()     # two members, one stream
    assert tuning.read_database(gz, strict=True) == tuning.read_database(plain)
    # a directory in $CLMF_TUNING_DB serves its *.jsonl.gz files
    plain.unlink()
    monkeypatch.setenv("CLMF_TUNING_DB", str(tmp_path))
    monkeypatch.setattr(tuning.database, "user_db_path", lambda: tmp_path / "none.jsonl")
    monkeypatch.setattr(tuning.database, "shipped_paths", lambda: [])
    assert [p for _, p in tuning.database_paths()] == [gz]
    assert tuning.choose(info, 50, "users", stats("users", ML)).rule == "tuned"


def test_a_member_cut_short_is_skipped_then_dropped_by_the_next_append(tmp_path):
    info = fake_info()
    path = tmp_path / "db.jsonl.gz"
    Database(path).append(best_records(info, 10, ML, A, B, "r1"))
    whole = path.read_bytes()
    member = gzip.compress(json.dumps(best_records(info, 50, ML, A, B, "r2")[0]).encode() + b"\n")
    path.write_bytes(whole + member[:len(member) // 2])          # a writer died mid-append
    with pytest.warns(tuning.TuningDatabaseWarning, match="gzip member cut short"):
        recs = tuning.read_database(path)
    assert [r["run_id"] for r in recs] == ["r1", "r1"]
    assert path.read_bytes()[:len(whole)] == whole                # the reader changes nothing
    Database(path).append(best_records(info, 100, ML, A, B, "r3"))
    assert [r["run_id"] for r in _lines(path)] == ["r1", "r1", "r3", "r3"]


def test_bytes_that_are_not_gzip_are_refused_by_the_writer(tmp_path):
    info = fake_info()
    path = tmp_path / "db.jsonl.gz"
    Database(path).append(best_records(info, 10, ML, A, B, "r1"))
    raw = path.read_bytes() + b"\x00\x01 not gzip" + gzip.compress(b"{}\n")
    path.write_bytes(raw)
    with pytest.warns(tuning.TuningDatabaseWarning, match="not gzip data after byte"):
        assert len(tuning.read_database(path)) == 2                # the members before it serve
    with pytest.raises(ValueError, match="not gzip data"):
        Database(path).append(best_records(info, 50, ML, A, B, "r2"))
    assert path.read_bytes() == raw


def test_compact_packs_the_members_into_one(tmp_path):
    info = fake_info()
    path = tmp_path / "db.jsonl.gz"
    db = Database(path)
    for f in range(1, 21):
        db.append(best_records(info, f, ML, A, B, f"r{f}"))
    os.chmod(path, 0o640)
    before, records = path.stat().st_size, gzip.decompress(path.read_bytes())
    saved = db.compact()
    assert saved == before - path.stat().st_size > before // 2
    assert path.read_bytes() == gzip.compress(records, compresslevel=9, mtime=0)
    assert path.stat().st_mode & 0o777 == 0o640
    assert db.compact() == 0                                      # one member already
    db.append(best_records(info, 99, ML, A, B, "r99"))            # appends go on after it
    assert len(_lines(path)) == 42
    plain = tmp_path / "db.jsonl"
    plain.write_bytes(records)
    assert Database(plain).compact() == 0 and plain.read_bytes() == records


def _writer(path, wid, n):
    db = Database(path)
    for k in range(n):
        db.append([{"schema_version": tuning.SCHEMA_VERSION, "kind": "measurement", "w": wid,
                    "k": k, "part": p, "pad": "x" * (300 + 37 * p)} for p in range(3)])


def _compactor(path, n):
    for _ in range(n):
        Database(path).compact()


def test_appends_survive_concurrent_compaction(tmp_path):
    path = tmp_path / "db.jsonl.gz"
    _writer(path, -1, 1)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, w, 25)) for w in range(4)]
    procs.append(ctx.Process(target=_compactor, args=(path, 30)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    recs = _lines(path)
    assert len(recs) == 3 + 4 * 25 * 3                   # none lost to a renamed-over file
    for i in range(0, len(recs), 3):                     # each append whole and contiguous
        grp = recs[i:i + 3]
        assert [r["part"] for r in grp] == [0, 1, 2] and len({(r["w"], r["k"]) for r in grp}) == 1
