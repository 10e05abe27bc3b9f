"""The one reader of delimited rating files (:mod:`clmf.data._csv`, pyarrow's CSV reader) and the
Parquet fast path: what each input gives — ids with their types, values, timestamps — or which
error (file and line named), and that the reader's two ways, by fields and by lines, agree on
every file both can read.

:func:`both_ways` loads a file as the user calls it (noting whether it was read by fields) and
again with the by-fields way turned off (every file then read from its lines) and asserts the same
outcome; the cases' expectations pin the rules of a field (module docstring of ``_csv``).
"""
from __future__ import annotations

import gzip
import sys
from pathlib import Path

import numpy as np
import pytest

from clmf import data
from clmf.data import _csv, _fastload, _ids, scan

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FIELDS = ("users", "items", "ratings", "timestamps", "user_ids", "item_ids", "shape")
LOADERS = {"ml": data.load_movielens_csv, "triples": data.load_triples,
           "dat": data.load_movielens_dat, "100k": data.load_movielens_100k}


def _outcome(fn):
    """``("ok", result)`` or ``("error", exception)`` of calling ``fn``."""
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - the exception is what is compared
        return "error", exc


def assert_same(a, b):
    """Two Ratings hold the same indices, values, timestamps and id maps (dtypes included)."""
    for field in FIELDS:
        x, y = getattr(a, field), getattr(b, field)
        if field == "shape":
            assert x == y
        elif x is None or y is None:
            assert x is None and y is None, field
        else:
            assert x.dtype == y.dtype and np.array_equal(x, y), (field, x, y)


def both_ways(monkeypatch, kind, path, by_fields=None, **kw):
    """Load ``path`` with the ``kind`` loader, then with the by-fields way off, and assert the
    same result or error; ``by_fields=True``/``False`` also asserts which way read the file.
    Returns the result (or the exception)."""
    loader = LOADERS[kind]
    real = _csv._by_fields
    served = []

    def spy(*a, **k):
        """The by-fields way, noting whether it read the file."""
        try:
            out = real(*a, **k)
        except ValueError:
            served.append(True)      # it named the problem itself
            raise
        served.append(out is not None)
        return out

    monkeypatch.setattr(_csv, "_by_fields", spy)
    got = _outcome(lambda: loader(path, **kw))
    monkeypatch.setattr(_csv, "_by_fields", lambda *a, **k: None)
    want = _outcome(lambda: loader(path, **kw))
    monkeypatch.setattr(_csv, "_by_fields", real)
    if by_fields is not None:
        assert bool(served and served[-1]) == by_fields, \
            f"by fields {'skipped' if by_fields else 'taken'}"
    assert got[0] == want[0], (got, want)
    if got[0] == "error":
        assert type(got[1]) is type(want[1]) and str(got[1]) == str(want[1])
        return got[1]
    assert_same(got[1], want[1])
    return got[1]


def check(out, expect):
    """``out`` (Ratings or exception) against ``expect``: a regex of the error, or a dict of
    field → list (``users``/``items`` are the id maps, ``ts`` the timestamps)."""
    if isinstance(expect, str):
        assert isinstance(out, Exception), f"expected an error matching {expect!r}, got {out}"
        import re
        assert re.search(expect, str(out)), (expect, str(out))
        return
    assert not isinstance(out, Exception), out
    names = {"users": "user_ids", "items": "item_ids", "r": "ratings", "ts": "timestamps"}
    for key, want in expect.items():
        got = getattr(out, names[key])
        assert (got is None if want is None else got.tolist() == want), (key, got, want)


def write(path: Path, text, newline="\n") -> Path:
    """Write ``text`` (str: UTF-8 with ``newline`` line ends; bytes as they are)."""
    if isinstance(text, str):
        text = text.replace("\n", newline).encode("utf-8")
    path.write_bytes(text)
    return path


ML = "userId,movieId,rating,timestamp\n1,10,4.5,978300760\n3,10,2.0,978300761\n1,7,1.0,978300762\n"
TR = "user\titem\tscore\nann\tx1\t4\nbob\tx1\t2.5\nann\tx2\t1\n"
ML_OK = {"users": [1, 3], "items": [7, 10], "r": [4.5, 2.0, 1.0],
         "ts": [978300760, 978300761, 978300762]}


@pytest.fixture(autouse=True)
def mapped(monkeypatch):
    """Text files memory-mapped as large ones are (the small files of the other test modules
    take the copy)."""
    monkeypatch.setattr(_csv, "_MAP_FROM", 1)


@pytest.fixture
def small_chunks(monkeypatch):
    """Scan threads and pyarrow blocks on tiny inputs: many chunks, per-block dictionaries."""
    monkeypatch.setattr(scan, "CHUNK", 4)
    monkeypatch.setattr(scan, "_PARALLEL_FROM", 8)
    monkeypatch.setattr(_ids, "CHUNK", 4)
    monkeypatch.setattr(_ids, "_PARALLEL_FROM", 8)
    monkeypatch.setattr(_csv, "_block_size", lambda n: 64)


# ----- MovieLens ratings.csv -----------------------------------------------------------------
@pytest.mark.parametrize("text, expect", [
    (ML, ML_OK), (ML.rstrip("\n"), ML_OK), (ML.replace("\n", "\r\n"), ML_OK),
    (ML.replace("\n", "\r\n").rstrip("\r\n"), ML_OK), (ML.split("\n", 1)[1], ML_OK),  # no header
    ("userId,movieId,rating\n1,10,4\n2,10,3.5\n", {"users": [1, 2], "ts": None}),
    ("rating,movieId,userId,timestamp\n3.5,10,7,1\n1,11,7,2\n",       # columns by name
     {"users": [7], "items": [10, 11], "r": [3.5, 1.0], "ts": [1, 2]}),
    ('"userId","movieId","rating","timestamp"\n1,2,3,4\n', {"users": [1], "ts": [4]}),
    (ML + "\n\n2,7,5,1\n", {"users": [1, 2, 3]}),                     # blank lines
    ("\ufeff" + ML, ML_OK),                                            # UTF-8 mark
    (ML + "-5,-7,1.5,-100\n", {"users": [-5, 1, 3], "items": [-7, 7, 10]}),
    (ML + "05,10,3,1\n2, 11,3,1\n+9,7,3,1\n", {"users": [1, 2, 3, 5, 9], "items": [7, 10, 11]}),
    (ML + "9223372036854775807,4294967296,1e0,1\n", {"users": [1, 3, 2**63 - 1]}),
])
def test_movielens_csv(tmp_path, monkeypatch, text, expect):
    check(both_ways(monkeypatch, "ml", write(tmp_path / "ratings.csv", text), by_fields=True),
          expect)


@pytest.mark.parametrize("bad, expect", [
    ("1,10,nan,5", r"line 5: rating 'nan' is not finite \(1 non-finite"),
    ("1,10,inf,5", "line 5: rating 'inf' is not finite"),
    ("1,10,-Infinity,5", "line 5: rating '-Infinity' is not finite"),
    ("1,10,1e999,5", "line 5: rating '1e999' is not finite"),
    ("0x1f,10,4,5", "line 5: userId '0x1f' is not an integer"),        # pyarrow would read 31
    ("1,0X10,4,5", "line 5: movieId '0X10' is not an integer"),
    ("1,10,4,0x10", "line 5: timestamp '0x10' is not an integer"),
    ("1e5,10,4,5", "line 5: userId '1e5' is not an integer"),
    ("1.0,10,4,5", "line 5: userId '1.0' is not an integer"),
    ("1_0,10,4,5", r"line 5: userId '1_0' is not an integer \(ASCII digits only\)"),
    ("\uff11,10,4,5", r"line 5: userId '\uff11' is not an integer \(ASCII digits only\)"),
    ("1,,4,5", "line 5: movieId '' is not an integer"),
    ("1,10,,5", "line 5: rating '' is not a number"),
    ("1,10,4", r"line 5: expected 4 fields separated by ',', found 3: '1,10,4'"),
    ("1,10,4,5,6", "line 5: expected 4 fields separated by ',', found 5"),
    ("9223372036854775808,10,4,5", "line 5: userId '9223372036854775808' is not an integer"),
    ("1,10,four,5", "line 5: rating 'four' is not a number"),
    ("   ", ML_OK),                                                     # a blank line
    ("1,10,1e39,5", "float32 range"),
    ('"1",10,4,5', "1 duplicate rating"),                             # CSV quotes: the id 1
])
def test_movielens_problems_name_the_line(tmp_path, monkeypatch, bad, expect):
    p = write(tmp_path / "ratings.csv", ML + bad + "\n")
    if '"' in bad:            # CSV quoting: read by fields only (lines are split without it)
        out = _outcome(lambda: data.load_movielens_csv(p))[1]
    else:
        out = both_ways(monkeypatch, "ml", p)
    check(out, expect)
    if isinstance(out, Exception):
        assert str(p) in str(out)


@pytest.mark.parametrize("text, match", [
    ("", "no ratings"), ("userId,movieId,rating,timestamp\n", "no ratings"),
    ("a,b,c\n1,2,3\n", r"line 1: header \['a', 'b', 'c'\] lacks"),
    ("1,2\n", "line 1: expected 3 or 4 fields, found 2"),
    ("\n\n1,2\n", "line 3: expected 3 or 4 fields"),
])
def test_movielens_empty_and_bad_headers(tmp_path, monkeypatch, text, match):
    check(both_ways(monkeypatch, "ml", write(tmp_path / "ratings.csv", text)), match)


@pytest.mark.parametrize("policy", ["error", "mean", "last", "sum"])
def test_movielens_duplicates(tmp_path, monkeypatch, policy):
    p = write(tmp_path / "ratings.csv", ML + "3,10,5.0,978300770\n1,7,3.0,1\n")
    out = both_ways(monkeypatch, "ml", p, duplicates=policy)
    if policy == "error":
        assert str(p) in str(out) and "2 duplicate rating(s) of 2" in str(out)
    else:
        # sorted by (user, item): (1, 7) of 1.0 and 3.0, (1, 10) of 4.5, (3, 10) of 2.0 and 5.0
        want = {"mean": [2.0, 4.5, 3.5], "last": [3.0, 4.5, 5.0], "sum": [4.0, 4.5, 7.0]}
        assert out.ratings.tolist() == want[policy]


def test_movielens_gzip_and_corrupt_gzip(tmp_path, monkeypatch):
    p = tmp_path / "ratings.csv.gz"
    p.write_bytes(gzip.compress(ML.encode()))
    check(both_ways(monkeypatch, "ml", p, by_fields=True), ML_OK)
    p.write_bytes(gzip.compress(ML.encode())[:30])
    check(both_ways(monkeypatch, "ml", p), "truncated or corrupt gzip")


@pytest.mark.parametrize("user", ["7", "0x7", "0X7", "-0x7"])
def test_movielens_hex_guard_looks_past_the_header(tmp_path, monkeypatch, user):
    text = f"userId,movieId,rating,timestamp,xtra\n1,2,3,4,x\n{user},2,3,4,y\n"
    out = both_ways(monkeypatch, "ml", write(tmp_path / "ratings.csv", text))
    check(out, {"users": [1, 7]} if user == "7" else f"line 3: userId '{user}' is not an")


@pytest.mark.parametrize("mapped", [False, True])
def test_movielens_latin1_and_lone_cr(tmp_path, monkeypatch, mapped):
    monkeypatch.setattr(_csv, "_MAP_FROM", 1 if mapped else 1 << 24)
    out = both_ways(monkeypatch, "ml", write(tmp_path / "a.csv", (ML + "2,3,4,5\n").encode()
                                             + b"\xe9\n"))
    check(out, "line 6: expected 4 fields separated by ',', found 1: '\u00e9'")
    check(both_ways(monkeypatch, "ml", write(tmp_path / "b.csv", ML.replace("\n", "\r"))), ML_OK)


def test_movielens_many_blocks(tmp_path, monkeypatch, small_chunks):
    rng = np.random.default_rng(0)
    u, i = rng.integers(-50, 50, 300), rng.integers(0, 10**12, 300)
    r, t = rng.integers(1, 11, 300), rng.integers(0, 2**40, 300)
    lines = [f"{a},{b},{c / 2},{d}" for a, b, c, d in zip(u, i, r, t)]
    p = write(tmp_path / "ratings.csv", "userId,movieId,rating,timestamp\n" + "\n".join(lines))
    out = both_ways(monkeypatch, "ml", p, by_fields=True, duplicates="last")
    assert out.user_ids.tolist() == sorted(set(u.tolist()))
    assert sorted(out.item_ids[out.items].tolist()) == sorted(
        {(a, b): b for a, b in zip(u.tolist(), i.tolist())}.values())


# ----- load_triples on text ------------------------------------------------------------------
TR_OK = {"users": ["ann", "bob"], "items": ["x1", "x2"], "r": [4.0, 2.5, 1.0]}


@pytest.mark.parametrize("text, kw, expect", [
    (TR, {}, TR_OK), (TR.replace("\n", "\r\n"), {}, TR_OK), (TR.rstrip("\n"), {}, TR_OK),
    (TR.replace("\t", ","), {}, TR_OK), (TR.replace("\t", ";"), {}, TR_OK),
    (TR.replace("\t", "|"), {}, TR_OK),
    ("1\t2\t3\n4\t5\t6\n", {}, {"users": [1, 4], "r": [3.0, 6.0]}),   # integer ids, no header
    ("1,2,3\n4,5,6\n", {"header": False}, {"users": [1, 4]}),
    ("u,i,r\n1,2,3\n", {"header": True}, {"users": [1]}),
    ("-1,7,3\n-2,7,1\n0,8,2\n", {}, {"users": [-2, -1, 0]}),
    # ids stay texts unless every one is a canonical ASCII integer: distinct texts, distinct ids
    ("01,7,3\n1,7,1\n", {}, {"users": ["01", "1"]}),
    ("+5,7,3\n5,7,1\n", {}, {"users": ["+5", "5"]}),
    ("-0,7,3\n0,7,1\n", {}, {"users": ["-0", "0"]}),
    ("0x1f,7,3\n31,7,1\n", {}, {"users": ["0x1f", "31"]}),
    ("1e5,7,3\n100000,7,1\n", {}, {"users": ["100000", "1e5"]}),
    ("1_0,7,3\n10,7,1\n", {}, {"users": ["10", "1_0"]}),
    ("\uff11,7,3\n1,7,1\n", {}, {"users": ["1", "\uff11"]}),
    ("Jos\u00e9,caf\u00e9,4\nAnn,caf\u00e9,2\n", {}, {"users": ["Ann", "Jos\u00e9"]}),
    ("a,7,3\n1,7,1\n2,x,4\n", {}, {"users": ["1", "2", "a"], "items": ["7", "x"]}),
    (" a,7,3\na,8,1\n", {}, {"users": ["a"]}), ("5 ,7,3\n5,8,1\n", {}, {"users": [5]}),
    ('x\t"q"\t1\nx\tq\t2\n', {}, "1 duplicate rating"),                # quotes stripped
    ("9223372036854775807,1,1\n-9223372036854775808,1,2\n", {},
     {"users": [-2**63, 2**63 - 1]}),
    ("9223372036854775808,1,1\n1,1,2\n", {}, {"users": ["1", "9223372036854775808"]}),
    ("u,i,r,t\na,b,1,100\nc,b,2,-5\n", {"timestamp_column": "t"}, {"ts": [100, -5]}),
    ("x,b,1,100\ny,b,2,-5\n", {"timestamp_column": 3}, {"ts": [100, -5]}),
    ("when,score,who,what\n7,5,ann,apple\n8,3,bob,pear\n",
     {"columns": ("who", "what", "score"), "timestamp_column": 0},
     {"users": ["ann", "bob"], "r": [5.0, 3.0], "ts": [7, 8]}),
    ("a,,3\nb,x,4\n", {}, {"items": ["", "x"]}),                        # an empty id
    ("\ufeffu,i,r\na,b,1\n", {}, {"users": ["a"]}),                     # UTF-8 mark
    ("u,i,r\na,b,1\n\nc,b,2\n\n", {}, {"users": ["a", "c"]}),           # blank lines
    ("u,i,r\n   \na,b,1\n", {}, {"users": ["a"]}), ("\n\nu,i,r\na,b,1\n", {}, {"users": ["a"]}),
    ("Jos\xe9,caf\xe9,4\n".encode("latin-1"), {}, {"users": ["Jos\u00e9"]}),   # not UTF-8
    ("a,b,1,1.5\nc,d,2,2020\n", {"timestamp_column": 3}, {"ts": [1, 2020]}),    # float seconds
    ("a,b,1,2020-01-01\nc,d,2,2020-01-02 12:00:00\n", {"timestamp_column": 3},
     {"ts": [1577836800, 1577836800 + 86400 + 12 * 3600]}),               # ISO dates
    ("a,b,1\n", {"columns": (0, 0, 2)}, {"users": ["a"], "items": ["a"]}),
    ("a,b,1\n", {"columns": (0, 1, 5)}, "no ratings found"),           # rating column: header
    ("a,b,nan\n", {}, "line 1: rating 'nan' is not finite"),
    ("a,b,inf\n", {}, "line 1: rating 'inf' is not finite"),
    ("a,b,\n", {}, "no ratings found"),
    ("a,b,x\n", {"header": False}, "line 1: rating 'x' is not a number"),
    ("a,b,1,0x10\n", {"timestamp_column": 3}, "line 1: timestamp '0x10' is neither"),
    ("a,b,1,100\nc,d,1,soon\n", {"timestamp_column": 3}, "line 2: timestamp 'soon' is neither"),
    ("", {}, "no ratings found"), ("u,i,r\n", {}, "no ratings found"),
    ("u,i,r\n", {"header": False}, "line 1: rating 'r' is not a number"),
    ("1\t2\t3\n4\t5\n", {}, r"line 2: expected at least 3 fields separated by '\\t', found 2"),
    ("u,i,r\na,b,1\n", {"columns": ("u", "nope", "r")}, r"column 'nope' not in header"),
    ("a,b,1\n", {"columns": ("u", "i", "r")}, r"column 'u' not in header \['a', 'b', '1'\]"),
])
def test_triples_by_fields(tmp_path, monkeypatch, text, kw, expect):
    check(both_ways(monkeypatch, "triples", write(tmp_path / "x.txt", text), **kw), expect)


@pytest.mark.parametrize("text, kw, expect", [
    ("1 2 3\n4  5 6\n", {}, {"users": [1, 4], "r": [3.0, 6.0]}),      # whitespace runs
    ("1::2::3\n4::5::6\n", {}, {"users": [1, 4]}),                     # multi-character
    ("1\t2\t3\textra\n4\t5\t6\n", {}, {"users": [1, 4]}),              # extra fields: ignored
])
def test_triples_by_lines(tmp_path, monkeypatch, text, kw, expect):
    check(both_ways(monkeypatch, "triples", write(tmp_path / "x.txt", text), by_fields=False,
                    **kw), expect)


def test_quoted_csv_is_read_by_fields_with_quotes(tmp_path):
    p = write(tmp_path / "x.csv", 'u,i,r\n"Smith, J",1,4\n"Doe, A",2,3\n')
    check(data.load_triples(p), {"users": ["Doe, A", "Smith, J"], "r": [4.0, 3.0]})
    check(_outcome(lambda: data.load_triples(write(tmp_path / "y.csv",
                                                       'u,i,r\n"Smith, J",1,x\n')))[1],
          "line 2: rating 'x' is not a number")
    ragged = write(tmp_path / "z.csv", 'u,i,r\n"Smith, J",1,4,extra\n')   # no split by lines
    check(_outcome(lambda: data.load_triples(ragged))[1],
          "line 2: expected 3 fields separated by ',', found 4")


def test_movielens_dat_and_100k_by_lines_and_fields(tmp_path, monkeypatch):
    dat = write(tmp_path / "ratings.dat", "1::1193::5::978300760\n\n1::661::3::978302109\n")
    check(both_ways(monkeypatch, "dat", dat, by_fields=False),
          {"users": [1], "items": [661, 1193], "ts": [978300760, 978302109]})
    bad = write(tmp_path / "bad.dat", "1::1193::5::978300760\n1::x::3::1\n")
    check(both_ways(monkeypatch, "dat", bad), "line 2: MovieID 'x' is not an integer")
    u = write(tmp_path / "u.data", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n")
    check(both_ways(monkeypatch, "100k", u, by_fields=True), {"users": [186, 196]})
    spaced = write(tmp_path / "u1.base", "196 242  3 881250949\n 186 302 3 891717742\n")
    check(both_ways(monkeypatch, "100k", spaced, by_fields=False), {"users": [186, 196]})


@pytest.mark.parametrize("policy", ["error", "mean", "last", "sum"])
def test_triples_duplicates(tmp_path, monkeypatch, policy):
    p = write(tmp_path / "x.tsv", TR + "ann\tx1\t2\n")
    out = both_ways(monkeypatch, "triples", p, duplicates=policy)
    if policy == "error":
        assert "1 duplicate rating(s) of 1" in str(out)
    else:
        assert out.ratings[0] == {"mean": 3.0, "last": 2.0, "sum": 6.0}[policy]


def test_triples_gzip_and_many_blocks(tmp_path, monkeypatch, small_chunks):
    rng = np.random.default_rng(1)
    ids = np.array(["7", "007", "x7", "-3", "u\u00e9", "12", " 12", "0x1f"])
    lines = [f"{u}\t{i}\t{r}\t{t}" for u, i, r, t in zip(
        rng.choice(ids, 400), rng.integers(0, 50, 400), rng.random(400), rng.integers(0, 99, 400))]
    p = tmp_path / "big.tsv.gz"
    p.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    r = both_ways(monkeypatch, "triples", p, by_fields=True, duplicates="mean",
                  timestamp_column=3)
    assert r.user_ids.dtype.kind == "U" and " 12" not in r.user_ids.tolist()
    assert sorted(r.user_ids.tolist()) == sorted({v.strip() for v in ids})
    only_ints = "\n".join(ln for ln in lines if ln.split("\t")[0] in ("7", "-3", "12")) + "\n"
    r = both_ways(monkeypatch, "triples", write(tmp_path / "ints.tsv", only_ints),
                  by_fields=True, duplicates="sum")
    assert r.user_ids.tolist() == [-3, 7, 12]


def test_many_lines_error_names_the_right_line(tmp_path, monkeypatch, small_chunks):
    """Blank and whitespace-only lines between many blocks: the bad field's line is counted
    over all of them."""
    body = "".join(f"{k},{k % 7},{k % 5}.5,{k}\n" + ("\n" if k % 3 == 0 else "   \n" * (k % 4 == 1))
                   for k in range(1, 200))
    text = "userId,movieId,rating,timestamp\n" + body + "7,1,bad,3\n"
    p = write(tmp_path / "ratings.csv", text)
    line = text.count("\n")
    check(both_ways(monkeypatch, "ml", p), f"line {line}: rating 'bad' is not a number")


def test_dispatch_reads_csv_and_triples(tmp_path):
    csv = write(tmp_path / "ratings.csv", ML)
    other = write(tmp_path / "plays.csv", "user,artist,plays\na,b,3\n")
    check(data.load(csv), ML_OK)
    assert data.load(other).user_ids.tolist() == ["a"]


def test_pyarrow_is_a_dependency():
    """One reader, pyarrow's: the package declares it (no path without it)."""
    from importlib.metadata import requires
    assert any(r.split(">")[0].split("=")[0].strip() == "pyarrow" and "extra" not in r
               for r in requires("clmf"))


# ----- Parquet -------------------------------------------------------------------------------
def same_parquet(monkeypatch, path, fast=None, **kw):
    """Load a Parquet file with and without its fast path (pandas then) and assert the same
    result or error; ``fast`` asserts whether the fast path served it."""
    real = _fastload.parquet
    served = []

    def spy(*a, **k):
        """The real fast path, noting whether it returned a result."""
        try:
            out = real(*a, **k)
        except ValueError:
            served.append(True)
            raise
        served.append(out is not None)
        return out
    monkeypatch.setattr(_fastload, "parquet", spy)
    got = _outcome(lambda: data.load_triples(path, **kw))
    monkeypatch.setattr(_fastload, "parquet", lambda *a, **k: None)
    want = _outcome(lambda: data.load_triples(path, **kw))
    monkeypatch.setattr(_fastload, "parquet", real)
    if fast is not None and served:
        assert served[-1] == fast, f"fast path {'skipped' if fast else 'taken'}"
    assert got[0] == want[0], (got, want)
    if got[0] == "error":
        assert type(got[1]) is type(want[1]) and str(got[1]) == str(want[1])
        return got[1]
    assert_same(got[1], want[1])
    return got[1]


def _parquet(path, row_group_size=None, **columns):
    """Write the columns (numpy arrays or pyarrow arrays) to ``path``."""
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


@pytest.mark.parametrize("ids", [
    np.array([-100, 100, 5, -100, 7], np.int8), np.array([-30000, 30000, 5, 1, 7], np.int16),
    np.array([3, 1, 3, 200, 0], np.uint8), np.array([2**31 - 1, -2**31, 0, 5, 6], np.int32),
    np.array([2**64 - 1, 2**63, 2**63 + 5, 1, 2**63], np.uint64),
    np.array([2**62, -2**62, 0, 1, 2], np.int64), np.array([9, 8, 7, 9, 1], np.uint32),
    pa.array(["b", "a", "b", "", "\u00e9"]), pa.array(["b", "a", "b", "x", "y"], pa.large_string()),
])
def test_parquet_fast_path_matches_pandas(tmp_path, monkeypatch, ids):
    items = np.array([1, 1, 2, 2, 1], np.int64)
    p = _parquet(tmp_path / "r.parquet", u=ids, i=items, r=np.arange(5, dtype=np.float32) + 1)
    r = same_parquet(monkeypatch, p, fast=True, columns=("u", "i", "r"), duplicates="mean")
    want = sorted(set(ids.tolist() if isinstance(ids, np.ndarray) else ids.to_pylist()))
    assert r.user_ids.tolist() == want
    same_parquet(monkeypatch, p, fast=True, columns=("i", "u", "r"))


@pytest.mark.parametrize("policy", ["error", "mean", "last", "sum"])
def test_parquet_duplicates_timestamps_and_row_groups(tmp_path, monkeypatch, policy):
    rng = np.random.default_rng(2)
    n = 200
    p = _parquet(tmp_path / "r.parquet", row_group_size=16, a=rng.integers(0, 9, n),
                 b=pa.array([f"s{k}" for k in rng.integers(0, 30, n)]), c=rng.random(n),
                 t=pa.array(rng.integers(0, 10**9, n), pa.timestamp("ms")))
    same_parquet(monkeypatch, p, fast=True, columns=(0, 1, 2), timestamp_column=3,
                 duplicates=policy)


@pytest.mark.parametrize("change", [
    {"u": pa.array([1, None, 3])}, {"u": pa.array(["a", None, "c"])},         # nulls
    {"r": pa.array([1.0, np.nan, 3.0])}, {"r": pa.array([1.0, None, 3.0])},
    {"r": pa.array([1e39, 1.0, 2.0])}, {"r": pa.array([True, False, True])},
    {"u": pa.array([1.5, 2.0, 3.0])}, {"u": pa.array([True, False, True])},     # float/bool ids
    {"u": pa.array(["a", "b", "a"]).dictionary_encode()},                      # categorical
    {"t": pa.array([1, 2, 3], pa.timestamp("s", tz="UTC"))}, {"t": pa.array([1.5, 2, 3])},
])
def test_parquet_unusual_columns_take_the_pandas_path(tmp_path, monkeypatch, change):
    cols = {"u": np.array([1, 2, 3]), "i": np.array([1, 1, 1]), "r": np.array([1.0, 2.0, 3.0]),
            "t": np.array([5, 6, 7]), **change}
    p = _parquet(tmp_path / "r.parquet", **cols)
    same_parquet(monkeypatch, p, fast=False, columns=("u", "i", "r"), timestamp_column="t")


def test_parquet_pandas_extension_dtypes(tmp_path, monkeypatch):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"u": pd.array([5, -2, 5], dtype="Int64"),
                       "i": pd.array(["a", "b", "b"], dtype="string"),
                       "r": pd.array([1.5, 2.0, 3.0], dtype="Float64"),
                       "t": pd.array([7, 8, 9], dtype="UInt32")})
    df.to_parquet(tmp_path / "x.parquet")
    same_parquet(monkeypatch, tmp_path / "x.parquet", columns=("u", "i", "r"),
                 timestamp_column="t")


def test_parquet_names_positions_and_empty(tmp_path, monkeypatch):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"u": [1, 2], "i": ["a", "b"], "r": [1.0, 5.0], "t": [3, 4]})
    df.to_parquet(tmp_path / "a.parquet")
    same_parquet(monkeypatch, tmp_path / "a.parquet", fast=True, columns=(0, 1, 2),
                 timestamp_column="t")
    same_parquet(monkeypatch, tmp_path / "a.parquet", fast=False, columns=("u", "x", "r"))
    same_parquet(monkeypatch, tmp_path / "a.parquet", fast=False, columns=(0, 1, 9))
    df.set_index("i").to_parquet(tmp_path / "b.parquet")               # a stored index
    same_parquet(monkeypatch, tmp_path / "b.parquet", fast=False, columns=(0, 0, 1))
    pd.DataFrame({0: [1, 2], 1: [3, 4], 2: [1.0, 2.0]}).to_parquet(tmp_path / "c.parquet")
    same_parquet(monkeypatch, tmp_path / "c.parquet", fast=False, columns=("0", "1", "2"))
    df.iloc[:0].to_parquet(tmp_path / "d.parquet")
    same_parquet(monkeypatch, tmp_path / "d.parquet", fast=False, columns=("u", "i", "r"))
    write(tmp_path / "e.parquet", b"PAR1 not really")
    same_parquet(monkeypatch, tmp_path / "e.parquet", fast=False)


# ----- the threaded pieces -------------------------------------------------------------------
@pytest.mark.parametrize("raw", [
    np.array([-100, 100, 5, -100, 0, 127, -128], np.int8),
    np.array([-30000, 30000, 5, -30000], np.int16), np.array([0, 255, 3, 3], np.uint8),
    np.array([2**64 - 1, 2**63, 2**63 + 5, 2**63], np.uint64),
    np.array([2**63 - 1, -2**63, 0], np.int64), np.array([10**12, 5, 10**12, 7]),
    np.array(["b", "a", "b", "ccc"]), np.array([1.5, -0.5, 1.5]), np.array([5, 9, 5, 7]),
    np.array([1000, 1003, 1000], np.int32), np.array([0, 3, 3], np.uint64),
])
@pytest.mark.parametrize("threads", [False, True])
def test_factorize_equals_numpy_unique(monkeypatch, raw, threads):
    if threads:
        for mod in (scan, _ids):
            monkeypatch.setattr(mod, "CHUNK", 2)
            monkeypatch.setattr(mod, "_PARALLEL_FROM", 2)
    raw = np.tile(raw, 5)
    uniques, codes = _ids.factorize(raw)
    want_u, want_c = np.unique(raw, return_inverse=True)
    assert np.array_equal(uniques, want_u) and np.array_equal(codes, want_c.reshape(-1))
    assert np.array_equal(uniques[codes], raw)
    compact = raw.dtype.kind in "iu" and int(raw.max()) - int(raw.min()) < 4 * len(raw) + 4096
    assert uniques.dtype == (np.int64 if compact and raw.dtype.itemsize < 4 else raw.dtype)


def test_from_triples_keeps_negative_small_and_huge_unsigned_ids():
    r = data.Ratings.from_triples(np.array([-100, 100, 5], np.int8),
                                      np.array([2**63, 2**64 - 1, 2**63], np.uint64),
                                      [1.0, 2.0, 3.0])
    assert r.user_ids.tolist() == [-100, 5, 100] and r.users.tolist() == [0, 2, 1]
    assert r.item_ids.tolist() == [2**63, 2**64 - 1] and r.items.tolist() == [0, 1, 0]


def test_threaded_pair_checks(monkeypatch):
    monkeypatch.setattr(scan, "CHUNK", 3)
    monkeypatch.setattr(scan, "_PARALLEL_FROM", 4)
    rng = np.random.default_rng(3)
    for _ in range(50):
        u = np.sort(rng.integers(0, 6, 20)).astype(np.int32)
        i = rng.integers(0, 6, 20).astype(np.int32)
        keys = u.astype(np.int64) * 6 + i
        assert scan.pairs_increasing(u, i) == bool(np.all(np.diff(keys) > 0))
        assert scan.has_duplicate_pairs(u, i, 6) == (len(np.unique(keys)) < len(keys))


def test_without_pyarrow_loading_says_so(tmp_path, monkeypatch):
    p = write(tmp_path / "ratings.csv", ML)
    for mod in ("pyarrow", "pyarrow.csv", "pyarrow.compute"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(ImportError):
        data.load_movielens_csv(p)
