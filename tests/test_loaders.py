"""The loaders' fast paths (pyarrow CSV / Parquet, threaded id factorisation and checks) against the
paths they stand in for: on every input both give the same :class:`Ratings` (indices, values, id
maps with their dtypes, timestamps) or the same error (type and message, file and line included).

One helper, :func:`same`, loads a file twice — as the user calls it, and with the fast path turned
off — and compares the outcomes; it can also say whether the fast path served the file or left it
to the old path, so each case checks that the input takes the path it should.
"""
from __future__ import annotations

import gzip
import sys
from pathlib import Path

import numpy as np
import pytest

from clmf import datasets
from clmf.data import _fastcsv, _fastload, _ids, scan

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FIELDS = ("users", "items", "ratings", "timestamps", "user_ids", "item_ids", "shape")
LOADERS = {
    "ml": (datasets.load_movielens_csv, "movielens_csv"),
    "triples": (datasets.load_triples, "triples_csv"),
    "parquet": (datasets.load_triples, "parquet"),
}


def _outcome(fn):
    """``("ok", result)`` or ``("error", exception)`` of calling ``fn``."""
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - the exception is what is compared
        return "error", exc


def same(monkeypatch, kind, path, fast=None, **kw):
    """Load ``path`` with the ``kind`` loader with and without its fast path and assert the same
    result or error; ``fast=True``/``False`` also asserts that the fast path served the file /
    left it to the old path. Returns the result (or the exception)."""
    loader, name = LOADERS[kind]
    real = getattr(_fastload, name)
    served = []

    def spy(*a, **k):
        """The real fast path, noting whether it returned a result."""
        try:
            out = real(*a, **k)
        except ValueError:
            served.append(True)      # the duplicate-pair error: raised by the fast path itself
            raise
        served.append(out is not None)
        return out

    monkeypatch.setattr(_fastload, name, spy)
    got = _outcome(lambda: loader(path, **kw))
    monkeypatch.setattr(_fastload, name, lambda *a, **k: None)
    want = _outcome(lambda: loader(path, **kw))
    monkeypatch.setattr(_fastload, name, real)
    assert served or fast is False, "the fast path was not asked"
    if fast is not None and served:
        assert served[-1] == fast, f"fast path {'skipped' if fast else 'taken'}"
    assert got[0] == want[0], (got, want)
    if got[0] == "error":
        assert type(got[1]) is type(want[1]) and str(got[1]) == str(want[1])
        return got[1]
    a, b = got[1], want[1]
    for field in FIELDS:
        x, y = getattr(a, field), getattr(b, field)
        if field == "shape":
            assert x == y
        elif x is None or y is None:
            assert x is None and y is None, field
        else:
            assert x.dtype == y.dtype and np.array_equal(x, y), (field, x, y)
    return a


def write(path: Path, text, newline="\n") -> Path:
    """Write ``text`` (str: UTF-8 with ``newline`` line ends; bytes as they are)."""
    if isinstance(text, str):
        text = text.replace("\n", newline).encode("utf-8")
    path.write_bytes(text)
    return path


ML = "userId,movieId,rating,timestamp\n1,10,4.5,978300760\n3,10,2.0,978300761\n1,7,1.0,978300762\n"
TR = "user\titem\tscore\nann\tx1\t4\nbob\tx1\t2.5\nann\tx2\t1\n"


@pytest.fixture(autouse=True)
def mapped(monkeypatch):
    """Text files memory-mapped as large ones are (the small files of the other test modules, and
    the test that says so, take the copy)."""
    monkeypatch.setattr(_fastcsv, "_MAP_FROM", 1)


@pytest.fixture
def small_chunks(monkeypatch):
    """Scan threads and pyarrow blocks on tiny inputs: many chunks, per-block dictionaries."""
    monkeypatch.setattr(scan, "CHUNK", 4)
    monkeypatch.setattr(scan, "_PARALLEL_FROM", 8)
    monkeypatch.setattr(_ids, "CHUNK", 4)
    monkeypatch.setattr(_ids, "_PARALLEL_FROM", 8)
    monkeypatch.setattr(_fastcsv, "_block_size", lambda n: 64)


# ----- MovieLens ratings.csv -----------------------------------------------------------------
@pytest.mark.parametrize("text", [
    ML, ML.rstrip("\n"), ML.replace("\n", "\r\n"), ML.replace("\n", "\r\n").rstrip("\r\n"),
    ML.split("\n", 1)[1],                                          # no header
    "userId,movieId,rating\n1,10,4\n2,10,3.5\n",                   # no timestamp
    "rating,movieId,userId,timestamp\n3.5,10,7,1\n1,11,7,2\n",     # columns by name
    '"userId","movieId","rating","timestamp"\n1,2,3,4\n',          # quoted header
    ML + "\n\n2,7,5,1\n",                                          # blank lines
    "\ufeff" + ML,                                                 # UTF-8 mark
    ML + "-5,-7,1.5,-100\n",                                       # negative ids and time
    ML + "05,10,3,1\n2, 11,3,1\n",                                 # leading zero, space
    ML + "9223372036854775807,4294967296,1e0,1\n",                 # large ids
])
def test_movielens_fast_path_matches_line_parser(tmp_path, monkeypatch, text):
    same(monkeypatch, "ml", write(tmp_path / "ratings.csv", text), fast=True)


@pytest.mark.parametrize("bad", [
    "1,10,nan,5", "1,10,inf,5", "1,10,-Infinity,5", "1,10,1e999,5",   # non-finite ratings
    "0x1f,10,4,5", "1,0X10,4,5", "1,10,4,0x10",                        # hexadecimal (pyarrow: 31)
    "1e5,10,4,5", "1.0,10,4,5", "+5,10,4,5", "1_0,10,4,5",             # not integers there
    "\uff11,10,4,5",                                                    # non-ASCII digit
    '"1",10,4,5', "1,,4,5", "1,10,,5", "1,10,4", "1,10,4,5,6",          # quotes, missing, ragged
    "9223372036854775808,10,4,5", "1,10,four,5", "   ", "1,10,1e39,5",  # overflow, text, blank
])
def test_movielens_problems_give_the_line_parsers_errors(tmp_path, monkeypatch, bad):
    out = same(monkeypatch, "ml", write(tmp_path / "ratings.csv", ML + bad + "\n"))
    if isinstance(out, Exception) and bad.strip():
        assert "line 5" in str(out) or "float32 range" in str(out)   # a parse error names the line


@pytest.mark.parametrize("text, match", [
    ("", "no ratings"), ("userId,movieId,rating,timestamp\n", "no ratings"),
    ("a,b,c\n1,2,3\n", "lacks"), ("1,2\n", "expected 3 or 4"),
])
def test_movielens_empty_and_bad_headers(tmp_path, monkeypatch, text, match):
    err = same(monkeypatch, "ml", write(tmp_path / "ratings.csv", text), fast=False)
    assert match in str(err)


@pytest.mark.parametrize("policy", ["error", "mean", "last", "sum"])
def test_movielens_duplicates(tmp_path, monkeypatch, policy):
    p = write(tmp_path / "ratings.csv", ML + "3,10,5.0,978300770\n1,7,3.0,1\n")
    out = same(monkeypatch, "ml", p, fast=True, duplicates=policy)
    if policy == "error":
        assert str(p) in str(out) and "2 duplicate rating(s) of 2" in str(out)


def test_movielens_gzip_and_corrupt_gzip(tmp_path, monkeypatch):
    p = tmp_path / "ratings.csv.gz"
    p.write_bytes(gzip.compress(ML.encode()))
    same(monkeypatch, "ml", p, fast=True)
    p.write_bytes(gzip.compress(ML.encode())[:30])
    assert "truncated or corrupt gzip" in str(same(monkeypatch, "ml", p, fast=False))


@pytest.mark.parametrize("user", ["7", "0x7", "0X7", "-0x7"])
def test_movielens_hex_guard_looks_past_the_header(tmp_path, monkeypatch, user):
    text = f"userId,movieId,rating,timestamp,xtra\n1,2,3,4,x\n{user},2,3,4,y\n"
    out = same(monkeypatch, "ml", write(tmp_path / "ratings.csv", text))
    assert (user == "7") != isinstance(out, Exception)


@pytest.mark.parametrize("mapped", [False, True])
def test_movielens_latin1_and_lone_cr(tmp_path, monkeypatch, mapped):
    monkeypatch.setattr(_fastcsv, "_MAP_FROM", 1 if mapped else 1 << 24)
    same(monkeypatch, "ml", write(tmp_path / "a.csv", (ML + "2,3,4,5\n").encode() + b"\xe9\n"))
    same(monkeypatch, "ml", write(tmp_path / "b.csv", ML.replace("\n", "\r")), fast=False)


def test_movielens_many_blocks(tmp_path, monkeypatch, small_chunks):
    rng = np.random.default_rng(0)
    lines = [f"{u},{i},{r / 2},{t}" for u, i, r, t in zip(
        rng.integers(-50, 50, 300), rng.integers(0, 10**12, 300), rng.integers(1, 11, 300),
        rng.integers(0, 2**40, 300))]
    p = write(tmp_path / "ratings.csv", "userId,movieId,rating,timestamp\n" + "\n".join(lines))
    same(monkeypatch, "ml", p, fast=True, duplicates="last")


# ----- load_triples on text ------------------------------------------------------------------
@pytest.mark.parametrize("text, kw", [
    (TR, {}), (TR.replace("\n", "\r\n"), {}), (TR.rstrip("\n"), {}),
    (TR.replace("\t", ","), {}), (TR.replace("\t", ";"), {}), (TR.replace("\t", "|"), {}),
    ("1\t2\t3\n4\t5\t6\n", {}),                                        # integer ids, no header
    ("1,2,3\n4,5,6\n", {"header": False}),
    ("u,i,r\n1,2,3\n", {"header": True}),
    ("-1,7,3\n-2,7,1\n0,8,2\n", {}),                                   # negative ids
    ("01,7,3\n1,7,1\n", {}), ("+5,7,3\n5,7,1\n", {}), ("-0,7,3\n0,7,1\n", {}),   # stay texts
    ("0x1f,7,3\n31,7,1\n", {}), ("1e5,7,3\n100000,7,1\n", {}), ("1_0,7,3\n10,7,1\n", {}),
    ("\uff11,7,3\n1,7,1\n", {}), ("Jos\u00e9,caf\u00e9,4\nAnn,caf\u00e9,2\n", {}),
    ("a,7,3\n1,7,1\n2,x,4\n", {}),                                     # mixed: all texts
    (" a,7,3\na,8,1\n", {}), ("5 ,7,3\n5,8,1\n", {}), ('x\t"q"\t1\nx\tq\t2\n', {}),  # stripped
    ("9223372036854775807,1,1\n-9223372036854775808,1,2\n", {}),
    ("9223372036854775808,1,1\n1,1,2\n", {}),                          # beyond int64: texts
    ("u,i,r,t\na,b,1,100\nc,b,2,-5\n", {"timestamp_column": "t"}),
    ("x,b,1,100\ny,b,2,-5\n", {"timestamp_column": 3}),               # an x: times as text
    ("when,score,who,what\n7,5,ann,apple\n8,3,bob,pear\n",
     {"columns": ("who", "what", "score"), "timestamp_column": 0}),
    ("a,,3\nb,x,4\n", {}),                                             # an empty id
    ("\ufeffu,i,r\na,b,1\n", {}), ("u,i,r\na,b,1\n\nc,b,2\n\n", {}),   # mark, blank lines
])
def test_triples_fast_path_matches_line_parser(tmp_path, monkeypatch, text, kw):
    same(monkeypatch, "triples", write(tmp_path / "x.txt", text), fast=True, **kw)


@pytest.mark.parametrize("text, kw", [
    ("1 2 3\n4  5 6\n", {}),                                           # whitespace runs
    ("1::2::3\n4::5::6\n", {}),                                        # multi-character
    ('u,i,r\n"Smith, J",1,4\n"Doe, A",2,3\n', {}),                     # quoted CSV
    ('u,i,r\n"Smith, J",1,x\n', {}),
    ("1\t2\t3\textra\n4\t5\t6\n", {}),                                 # ragged: extra fields
    ("1\t2\t3\n4\t5\n", {}),                                           # too few
    ("a,b,nan\n", {}), ("a,b,inf\n", {}), ("a,b,\n", {}), ("a,b,x\n", {"header": False}),
    ("a,b,1,0x10\n", {"timestamp_column": 3}),                         # hex time: an error
    ("a,b,1,soon\n", {"timestamp_column": 3}),
    ("a,b,1,1.5\nc,d,2,2020\n", {"timestamp_column": 3}),              # float seconds
    ("x,b,1,1.5\nc,d,2,2020\n", {"timestamp_column": 3}),
    ("a,b,1,2020-01-01\n", {"timestamp_column": 3}),                   # ISO dates
    ("Jos\xe9,caf\xe9,4\n".encode("latin-1"), {}),                      # not UTF-8
    ("u,i,r\n   \na,b,1\n", {}), ("\n\nu,i,r\na,b,1\n", {}),           # blank first / inner
    ("", {}), ("u,i,r\n", {}), ("u,i,r\n", {"header": False}),          # empty, header only
    ("u,i,r\na,b,1\n", {"columns": ("u", "nope", "r")}),
    ("a,b,1\n", {"columns": ("u", "i", "r")}), ("a,b,1\n", {"columns": (0, 0, 2)}),
    ("a,b,1\n", {"columns": (0, 1, 5)}), ("a,b,1\n", {"sep": ""}),
])
def test_triples_unusual_inputs_take_the_line_parser(tmp_path, monkeypatch, text, kw):
    same(monkeypatch, "triples", write(tmp_path / "x.txt", text), fast=False, **kw)


@pytest.mark.parametrize("policy", ["error", "mean", "last", "sum"])
def test_triples_duplicates(tmp_path, monkeypatch, policy):
    p = write(tmp_path / "x.tsv", TR + "ann\tx1\t2\n")
    same(monkeypatch, "triples", p, fast=True, duplicates=policy)


def test_triples_gzip_and_many_blocks(tmp_path, monkeypatch, small_chunks):
    rng = np.random.default_rng(1)
    ids = np.array(["7", "007", "x7", "-3", "u\u00e9", "12", " 12", "0x1f"])
    lines = [f"{u}\t{i}\t{r}\t{t}" for u, i, r, t in zip(
        rng.choice(ids, 400), rng.integers(0, 50, 400), rng.random(400), rng.integers(0, 99, 400))]
    p = tmp_path / "big.tsv.gz"
    p.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    r = same(monkeypatch, "triples", p, fast=True, duplicates="mean", timestamp_column=3)
    assert r.user_ids.dtype.kind == "U" and " 12" not in r.user_ids.tolist()
    only_ints = "\n".join(ln for ln in lines if ln.split("\t")[0] in ("7", "-3", "12")) + "\n"
    r = same(monkeypatch, "triples", write(tmp_path / "ints.tsv", only_ints), fast=True,
             duplicates="sum")
    assert r.user_ids.tolist() == [-3, 7, 12]


def test_dispatch_uses_the_fast_paths(tmp_path, monkeypatch):
    csv = write(tmp_path / "ratings.csv", ML)
    other = write(tmp_path / "plays.csv", "user,artist,plays\na,b,3\n")
    same(monkeypatch, "ml", csv, fast=True)
    served = []
    real = _fastload.triples_csv
    monkeypatch.setattr(_fastload, "triples_csv",
                        lambda *a, **k: served.append(1) or real(*a, **k))
    assert datasets.load(other).user_ids.tolist() == ["a"] and served


def test_without_pyarrow_the_line_parser_reads(tmp_path, monkeypatch):
    ml = write(tmp_path / "ratings.csv", ML)
    tr = write(tmp_path / "x.tsv", TR)
    with_arrow = datasets.load_movielens_csv(ml), datasets.load_triples(tr)
    for mod in ("pyarrow", "pyarrow.csv", "pyarrow.compute", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, mod, None)
    assert _fastcsv.read_columns(_fastcsv.read_raw(tr), "\t", 3, True, {0: "id"}) is None
    without = datasets.load_movielens_csv(ml), datasets.load_triples(tr)
    for a, b in zip(with_arrow, without):
        for field in FIELDS[:-1]:
            x, y = getattr(a, field), getattr(b, field)
            assert (x is None and y is None) or np.array_equal(x, y)


# ----- Parquet -------------------------------------------------------------------------------
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
    r = same(monkeypatch, "parquet", p, fast=True, columns=("u", "i", "r"), duplicates="mean")
    want = sorted(set(ids.tolist() if isinstance(ids, np.ndarray) else ids.to_pylist()))
    assert r.user_ids.tolist() == want
    same(monkeypatch, "parquet", p, fast=True, columns=("i", "u", "r"))


@pytest.mark.parametrize("policy", ["error", "mean", "last", "sum"])
def test_parquet_duplicates_timestamps_and_row_groups(tmp_path, monkeypatch, policy):
    rng = np.random.default_rng(2)
    n = 200
    p = _parquet(tmp_path / "r.parquet", row_group_size=16, a=rng.integers(0, 9, n),
                 b=pa.array([f"s{k}" for k in rng.integers(0, 30, n)]), c=rng.random(n),
                 t=pa.array(rng.integers(0, 10**9, n), pa.timestamp("ms")))
    same(monkeypatch, "parquet", p, fast=True, columns=(0, 1, 2), timestamp_column=3,
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
    same(monkeypatch, "parquet", p, fast=False, columns=("u", "i", "r"), timestamp_column="t")


def test_parquet_pandas_extension_dtypes(tmp_path, monkeypatch):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"u": pd.array([5, -2, 5], dtype="Int64"),
                       "i": pd.array(["a", "b", "b"], dtype="string"),
                       "r": pd.array([1.5, 2.0, 3.0], dtype="Float64"),
                       "t": pd.array([7, 8, 9], dtype="UInt32")})
    df.to_parquet(tmp_path / "x.parquet")
    same(monkeypatch, "parquet", tmp_path / "x.parquet", columns=("u", "i", "r"),
         timestamp_column="t")


def test_parquet_names_positions_and_empty(tmp_path, monkeypatch):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"u": [1, 2], "i": ["a", "b"], "r": [1.0, 5.0], "t": [3, 4]})
    df.to_parquet(tmp_path / "a.parquet")
    same(monkeypatch, "parquet", tmp_path / "a.parquet", fast=True, columns=(0, 1, 2),
         timestamp_column="t")
    same(monkeypatch, "parquet", tmp_path / "a.parquet", fast=False, columns=("u", "x", "r"))
    same(monkeypatch, "parquet", tmp_path / "a.parquet", fast=False, columns=(0, 1, 9))
    df.set_index("i").to_parquet(tmp_path / "b.parquet")               # a stored index
    same(monkeypatch, "parquet", tmp_path / "b.parquet", fast=False, columns=(0, 0, 1))
    pd.DataFrame({0: [1, 2], 1: [3, 4], 2: [1.0, 2.0]}).to_parquet(tmp_path / "c.parquet")
    same(monkeypatch, "parquet", tmp_path / "c.parquet", fast=False, columns=("0", "1", "2"))
    df.iloc[:0].to_parquet(tmp_path / "d.parquet")
    same(monkeypatch, "parquet", tmp_path / "d.parquet", fast=False, columns=("u", "i", "r"))
    write(tmp_path / "e.parquet", b"PAR1 not really")
    same(monkeypatch, "parquet", tmp_path / "e.parquet", fast=False)


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
    r = datasets.Ratings.from_triples(np.array([-100, 100, 5], np.int8),
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
