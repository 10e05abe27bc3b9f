"""Tests of clmf.data: the Ratings container, the loaders and the synthetic generator.

The unit tests write their own small files into ``tmp_path``. The tests marked "real
data" read the offline copies in ``../shared/data`` (relative to the repository root):
they skip when those files are missing, except under ``CI=true`` where they fail.
"""

from __future__ import annotations

import gzip
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import clmf
from clmf import data
from clmf.data import Ratings

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def shared_data(relpath: str) -> Path:
    """Path of a file under ``../shared/data``; skip if missing (fail when CI == "true")."""
    path = SHARED_DATA / relpath
    if not path.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"shared data file {path} is missing and CI=true")
        pytest.skip(f"shared data file {path} not available")
    return path


def write(path: Path, text: str | bytes, newline: str = "\n") -> Path:
    if isinstance(text, str):
        text = text.replace("\n", newline).encode("utf-8")
    path.write_bytes(text)
    return path


# --------------------------------------------------------------------------------------
# Ratings
# --------------------------------------------------------------------------------------
class TestRatings:
    def test_from_triples_maps_sorted_raw_ids(self):
        r = Ratings.from_triples(["bob", "ann", "bob"], [30, 10, 10], [1.0, 2.0, 3.5], [5, 6, 7])
        assert r.user_ids.tolist() == ["ann", "bob"]
        assert r.item_ids.tolist() == [10, 30]
        assert r.users.dtype == np.int32 and r.items.dtype == np.int32
        assert r.ratings.dtype == np.float32 and r.timestamps.dtype == np.int64
        assert r.users.tolist() == [1, 0, 1] and r.items.tolist() == [1, 0, 0]
        assert r.user_ids[r.users].tolist() == ["bob", "ann", "bob"]
        assert r.shape == (2, 2) and len(r) == 3 and r.nnz == 3
        assert r.n_users == 2 and r.n_items == 2 and r.density == 0.75
        assert "2 users" in repr(r)

    def test_to_csr_and_coo(self):
        r = Ratings.from_triples([1, 1, 2], [5, 6, 5], [1.0, 2.0, 3.0])
        csr = r.to_csr()
        assert isinstance(csr, sp.csr_matrix) and csr.dtype == np.float32
        np.testing.assert_array_equal(csr.toarray(), [[1, 2], [3, 0]])
        coo = r.to_coo()
        assert coo.shape == (2, 2) and coo.nnz == 3

    def test_to_csr_keeps_shape_with_unrated_items(self):
        r = Ratings(users=[0], items=[0], ratings=[4.0], timestamps=None,
                    user_ids=[7, 8], item_ids=["a", "b", "c"])
        assert r.to_csr().shape == (2, 3)

    def test_to_csr_rejects_duplicates_with_count(self):
        r = Ratings(users=[0, 0, 0, 1], items=[1, 1, 1, 0], ratings=[1, 2, 3, 4],
                    timestamps=None, user_ids=[0, 1], item_ids=[0, 1])
        with pytest.raises(ValueError, match=r"2 duplicate"):
            r.to_csr()

    def test_arrays_read_only_but_caller_arrays_untouched(self):
        u = np.array([0, 1], dtype=np.int32)
        r = Ratings(u, np.array([0, 0]), np.array([1.0, 2.0]), None, [1, 2], [3])
        assert u.flags.writeable
        with pytest.raises(ValueError):
            r.ratings[0] = 5
        with pytest.raises(Exception):
            r.users = u  # frozen dataclass

    def test_constructor_validation(self):
        with pytest.raises(ValueError, match="range"):
            Ratings([0, 2], [0, 0], [1.0, 1.0], None, [1, 2], [1])
        with pytest.raises(ValueError, match="unique"):
            Ratings([0], [0], [1.0], None, [1, 1], [1])
        with pytest.raises(ValueError, match="length"):
            Ratings([0, 1], [0], [1.0], None, [1, 2], [1])
        with pytest.raises(ValueError, match="non-finite"):
            Ratings([0], [0], [np.nan], None, [1], [1])

    def test_subset_keeps_maps(self):
        r = Ratings.from_triples([1, 2, 3, 3], [1, 1, 2, 1], [1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4])
        s = r.subset(r.ratings >= 3)
        assert s.user_ids is r.user_ids and s.item_ids is r.item_ids and s.shape == r.shape
        assert s.ratings.tolist() == [3.0, 4.0] and s.timestamps.tolist() == [3, 4]
        t = r.subset(np.array([0, 2]))
        assert t.ratings.tolist() == [1.0, 3.0]
        assert len(r.subset(np.array([], dtype=int))) == 0
        with pytest.raises(ValueError):
            r.subset(np.array([True, False]))
        with pytest.raises(IndexError):
            r.subset(np.array([10]))

    @pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
    def test_non_finite_ratings_name_count_and_position(self, bad):
        with pytest.raises(ValueError) as exc:
            Ratings.from_triples([1, 2, 3, 4], [1, 1, 1, 1], [1.0, 2.0, bad, bad])
        msg = str(exc.value)
        assert "2 non-finite" in msg and "position 2" in msg

    def test_float32_overflow_is_non_finite(self):
        with pytest.raises(ValueError, match="non-finite"):
            Ratings.from_triples([1], [1], [1e300])

    def test_length_and_empty_validation(self):
        with pytest.raises(ValueError, match="length"):
            Ratings.from_triples([1, 2], [1], [1.0, 2.0])
        with pytest.raises(ValueError, match="length"):
            Ratings.from_triples([1], [1], [1.0], [1, 2])
        with pytest.raises(ValueError, match="empty"):
            Ratings.from_triples([], [], [])
        with pytest.raises(ValueError, match="duplicates must be"):
            Ratings.from_triples([1], [1], [1.0], duplicates="max")
        with pytest.raises(ValueError, match="numeric"):
            Ratings.from_triples([1], [1], ["good"])

    def test_duplicates_error_names_count(self):
        with pytest.raises(ValueError) as exc:
            Ratings.from_triples([1, 1, 1, 2, 2], [5, 5, 5, 6, 6], [1, 2, 3, 4, 5])
        # pair (1,5) three times -> 2 redundant, pair (2,6) twice -> 1 redundant
        assert "3 duplicate rating(s) of 2 (user, item) pair(s)" in str(exc.value)

    def test_duplicates_aggregation(self):
        u, i = [1, 2, 1, 1], [5, 5, 5, 6]
        r, t = [1.0, 4.0, 3.0, 2.0], [10, 20, 30, 5]
        mean = Ratings.from_triples(u, i, r, t, duplicates="mean")
        # output sorted by (user, item): (1,5) (1,6) (2,5)
        assert mean.ratings.tolist() == [2.0, 2.0, 4.0]
        assert mean.timestamps.tolist() == [30, 5, 20]
        last = Ratings.from_triples(u, i, r, [40, 20, 30, 5], duplicates="last")
        assert last.ratings.tolist() == [3.0, 2.0, 4.0]
        assert last.timestamps.tolist() == [30, 5, 20]  # the last one's timestamp
        total = Ratings.from_triples(u, i, r, duplicates="sum")
        assert total.ratings.tolist() == [4.0, 2.0, 4.0] and total.timestamps is None
        assert len(total.to_csr().data) == 3

    def test_no_duplicates_keeps_input_order(self):
        r = Ratings.from_triples([3, 1, 2], [1, 1, 1], [3.0, 1.0, 2.0])
        assert r.ratings.tolist() == [3.0, 1.0, 2.0]

    def test_index_lookup(self):
        r = Ratings.from_triples(["b", "a", "c"], [100, 7, 7], [1.0, 2.0, 3.0])
        assert r.user_index(["c", "a"]).tolist() == [2, 0]
        assert r.user_index("b") == 1 and isinstance(r.user_index("b"), int)
        assert r.item_index(np.array([7, 100])).tolist() == [0, 1]
        with pytest.raises(KeyError, match=r"'zz'"):
            r.user_index(["a", "zz"])
        with pytest.raises(KeyError, match="555"):
            r.item_index([7, 555])
        assert r.item_index([7, 555, 100], missing="ignore").tolist() == [0, -1, 1]
        assert r.user_index(5, missing="ignore") == -1  # int query on str ids: unknown
        with pytest.raises(KeyError):
            r.item_index("7")  # str query on int ids is not silently converted
        with pytest.raises(ValueError):
            r.user_index("a", missing="skip")

    def test_index_lookup_with_unsorted_maps(self):
        r = Ratings([0, 1, 2], [0, 0, 0], [1.0, 2.0, 3.0], None, [30, 10, 20], ["x"])
        assert r.user_index([10, 20, 30]).tolist() == [1, 2, 0]
        assert r.user_index([11], missing="ignore").tolist() == [-1]

    def test_from_triples_with_given_maps(self):
        r = Ratings.from_triples([2, 1], [9, 9], [1.0, 2.0], user_ids=[1, 2, 3], item_ids=[8, 9])
        assert r.shape == (3, 2) and r.users.tolist() == [1, 0] and r.items.tolist() == [1, 1]
        with pytest.raises(KeyError, match="4"):
            Ratings.from_triples([4], [9], [1.0], user_ids=[1, 2, 3], item_ids=[9])

    def test_large_sparse_int_ids(self):
        r = Ratings.from_triples([10**12, 5, 10**12], [1, 2, 3], [1.0, 2.0, 3.0])
        assert r.user_ids.tolist() == [5, 10**12] and r.users.tolist() == [1, 0, 1]

    def test_datetime_timestamps(self):
        ts = np.array(["2020-01-01T00:00:00", "1970-01-02T00:00:00"], dtype="datetime64[s]")
        r = Ratings.from_triples([1, 2], [1, 1], [1.0, 2.0], ts)
        assert r.timestamps.tolist() == [1577836800, 86400]

    def test_pickle_round_trip(self):
        import pickle

        r = Ratings.from_triples(["a", "b"], [1, 2], [1.0, 2.0], [3, 4])
        r2 = pickle.loads(pickle.dumps(r))
        assert r2.shape == r.shape and r2.user_ids.tolist() == ["a", "b"]
        np.testing.assert_array_equal(r2.to_csr().toarray(), r.to_csr().toarray())
        assert r2.user_index("b") == 1

    def test_from_sparse_identity_maps(self):
        X = sp.csr_matrix(np.array([[0, 4.0, 0], [1.0, 0, 2.0]]))
        r = Ratings.from_sparse(X)
        assert r.shape == (2, 3)
        assert r.user_ids.tolist() == [0, 1] and r.item_ids.tolist() == [0, 1, 2]
        np.testing.assert_array_equal(r.to_csr().toarray(), X.toarray())
        r2 = Ratings.from_sparse(sp.coo_matrix(X))
        np.testing.assert_array_equal(r2.to_csr().toarray(), X.toarray())
        with pytest.raises(TypeError):
            Ratings.from_sparse(X.toarray())

    def test_from_pandas_mapping_and_missing_column(self):
        cols = {"u": ["x", "y"], "i": [1, 2], "r": [3.0, 4.0], "t": [1, 2]}
        r = Ratings.from_pandas(cols, user="u", item="i", rating="r", timestamp="t")
        assert r.user_ids.tolist() == ["x", "y"] and r.timestamps.tolist() == [1, 2]
        with pytest.raises(KeyError, match="rating"):
            Ratings.from_pandas(cols, user="u", item="i")

    def test_pandas_round_trip(self):
        pd = pytest.importorskip("pandas")
        df = pd.DataFrame({"user": ["a", "b"], "item": [3, 4], "rating": [1.0, 2.0]})
        r = Ratings.from_pandas(df)
        out = r.to_pandas()
        assert out["user"].tolist() == ["a", "b"] and out["rating"].tolist() == [1.0, 2.0]

    def test_to_pandas_without_pandas_says_so(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "pandas", None)
        r = Ratings.from_triples([1], [1], [1.0])
        with pytest.raises(ImportError, match="pandas"):
            r.to_pandas()


# --------------------------------------------------------------------------------------
# loaders
# --------------------------------------------------------------------------------------
U_DATA = ("196\t242\t3\t881250949\n186\t302\t3\t891717742\n22\t377\t1\t878887116\n"
          "196\t377\t5\t881250950\n")


class TestMovieLens100K:
    def test_u_data(self, tmp_path):
        r = data.load_movielens_100k(write(tmp_path / "u.data", U_DATA))
        assert len(r) == 4 and r.shape == (3, 3)
        assert r.user_ids.tolist() == [22, 186, 196] and r.item_ids.tolist() == [242, 302, 377]
        assert r.user_ids[r.users].tolist() == [196, 186, 22, 196]
        assert r.ratings.tolist() == [3, 3, 1, 5]
        assert r.timestamps.tolist() == [881250949, 891717742, 878887116, 881250950]

    def test_crlf_and_blank_lines(self, tmp_path):
        p = write(tmp_path / "u.data", U_DATA + "\n\n", newline="\r\n")
        r = data.load_movielens_100k(p)
        assert len(r) == 4 and r.timestamps[0] == 881250949

    @pytest.mark.parametrize(
        "bad_line, what",
        [("1\t2\t3", "expected 4 fields"), ("1\t2\tgood\t4", "rating"),
         ("1.5\t2\t3\t4", "user id"), ("1\tx\t3\t4", "item id"), ("1\t2\tnan\t4", "finite")],
    )
    def test_malformed_line_reports_file_and_line(self, tmp_path, bad_line, what):
        text = "1\t1\t5\t1\n\n2\t1\t4\t2\n" + bad_line + "\n3\t3\t3\t3\n"
        p = write(tmp_path / "ua.base", text)
        with pytest.raises(ValueError) as exc:
            data.load_movielens_100k(p)
        msg = str(exc.value)
        assert str(p) in msg and "line 4" in msg and what in msg  # blank line 2 still counted

    def test_duplicates_name_the_file(self, tmp_path):
        p = write(tmp_path / "u.data", "1\t1\t5\t1\n1\t1\t4\t2\n")
        with pytest.raises(ValueError, match=f"{p}.*1 duplicate"):
            data.load_movielens_100k(p)
        r = data.load_movielens_100k(p, duplicates="last")
        assert r.ratings.tolist() == [4.0]

    def test_split_shares_id_maps(self, tmp_path):
        write(tmp_path / "ua.base", "1\t10\t5\t100\n2\t20\t3\t200\n3\t10\t4\t300\n")
        # test has an item (30) and a user (9) that never occur in train
        write(tmp_path / "ua.test", "9\t10\t2\t400\n1\t30\t1\t500\n")
        train, test = data.load_movielens_100k_split(tmp_path, "ua")
        assert train.user_ids is test.user_ids and train.item_ids is test.item_ids
        assert train.shape == test.shape == (4, 3)
        assert train.user_ids.tolist() == [1, 2, 3, 9] and train.item_ids.tolist() == [10, 20, 30]
        assert test.user_ids[test.users].tolist() == [9, 1]
        assert test.item_ids[test.items].tolist() == [10, 30]
        assert train.user_index(1) == test.user_index(1) == 0
        with pytest.raises(ValueError, match="split"):
            data.load_movielens_100k_split(tmp_path, "uc")
        with pytest.raises(FileNotFoundError):
            data.load_movielens_100k_split(tmp_path, "u1")

    def test_split_overlap_is_an_error(self, tmp_path):
        write(tmp_path / "u1.base", "1\t10\t5\t100\n")
        write(tmp_path / "u1.test", "1\t10\t2\t400\n")
        with pytest.raises(ValueError, match="share 1"):
            data.load_movielens_100k_split(tmp_path, "u1")

    def test_100k_lines_load_fast(self, tmp_path):
        rng = np.random.default_rng(0)
        u = rng.integers(1, 1000, 100_000)
        i = np.arange(100_000) % 1700 + 1 + 1700 * (np.arange(100_000) // 1700 % 2)
        keys = np.unique(u * 10_000 + i)
        u, i = keys // 10_000, keys % 10_000
        lines = "".join(f"{a}\t{b}\t{1 + a % 5}\t{880000000 + b}\n" for a, b in zip(u, i))
        p = write(tmp_path / "u.data", lines)
        t0 = time.perf_counter()
        r = data.load_movielens_100k(p)
        assert time.perf_counter() - t0 < 1.0
        assert len(r) == len(keys)


class TestMovieLensCsvDat:
    CSV = ("userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,3,4.5,964981247\n"
           "2,1,0.5,964982224\n")

    def test_csv_crlf(self, tmp_path):
        r = data.load_movielens_csv(write(tmp_path / "ratings.csv", self.CSV, "\r\n"))
        assert len(r) == 3 and r.shape == (2, 2)
        assert r.ratings.tolist() == [4.0, 4.5, 0.5]
        assert r.timestamps.tolist() == [964982703, 964981247, 964982224]

    def test_csv_columns_by_name_and_no_timestamp(self, tmp_path):
        p = write(tmp_path / "r.csv", "rating,movieId,userId\n3.5,10,7\n")
        r = data.load_movielens_csv(p)
        assert r.user_ids.tolist() == [7] and r.item_ids.tolist() == [10]
        assert r.ratings.tolist() == [3.5] and r.timestamps is None

    def test_csv_without_header(self, tmp_path):
        r = data.load_movielens_csv(write(tmp_path / "r.csv", "1,2,3.0,4\n"))
        assert r.timestamps.tolist() == [4]

    def test_csv_bad_header(self, tmp_path):
        p = write(tmp_path / "r.csv", "a,b,c\n1,2,3\n")
        with pytest.raises(ValueError, match=r"line 1.*lacks"):
            data.load_movielens_csv(p)

    def test_csv_malformed(self, tmp_path):
        p = write(tmp_path / "ratings.csv", self.CSV + "3,4\n", "\r\n")
        with pytest.raises(ValueError) as exc:
            data.load_movielens_csv(p)
        assert str(p) in str(exc.value) and "line 5" in str(exc.value)
        p = write(tmp_path / "ratings.csv", self.CSV + "3,4,five,1\n")
        with pytest.raises(ValueError, match=r"line 5: rating 'five'"):
            data.load_movielens_csv(p)

    def test_csv_header_only(self, tmp_path):
        with pytest.raises(ValueError, match="no ratings"):
            data.load_movielens_csv(write(tmp_path / "ratings.csv", "userId,movieId,rating\n"))

    def test_dat(self, tmp_path):
        p = write(tmp_path / "ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n")
        r = data.load_movielens_dat(p)
        assert r.item_ids.tolist() == [661, 1193] and r.ratings.tolist() == [5.0, 3.0]
        assert r.timestamps.tolist() == [978300760, 978302109]

    def test_dat_malformed(self, tmp_path):
        p = write(tmp_path / "ratings.dat", "1::1193::5::978300760\n1::661::3\n")
        with pytest.raises(ValueError) as exc:
            data.load_movielens_dat(p)
        assert str(p) in str(exc.value) and "line 2" in str(exc.value)


class TestNetflix:
    def test_per_movie_files_directory(self, tmp_path):
        d = tmp_path / "training_set"
        d.mkdir()
        write(d / "mv_0000001.txt", "1:\n1488844,3,2005-09-06\n822109,5,2005-05-13\n")
        write(d / "mv_0000002.txt", "2:\n1488844,4,2005-09-07\n", "\r\n")
        r = data.load_netflix(tmp_path)
        assert len(r) == 3 and r.shape == (2, 2)
        assert r.item_ids[r.items].tolist() == [1, 1, 2]
        assert r.user_ids[r.users].tolist() == [1488844, 822109, 1488844]
        assert r.timestamps[0] == 1125964800  # 2005-09-06T00:00:00Z
        assert r.timestamps[2] - r.timestamps[0] == 86400

    def test_combined_file(self, tmp_path):
        p = write(tmp_path / "combined_data_1.txt",
                  "1:\n10,3,2005-09-06\n11,4,2004-01-01\n7:\n10,1,2003-03-03\n")
        r = data.load_netflix(p)
        assert r.item_ids[r.items].tolist() == [1, 1, 7]
        assert r.ratings.tolist() == [3, 4, 1]

    @pytest.mark.parametrize(
        "text, line, what",
        [("10,3,2005-09-06\n", 1, "before any"),
         ("1:\n10,3\n", 2, "expected 3 fields"),
         ("1:\n10,3,2005-09-06\n11,4,yesterday\n", 3, "date"),
         ("1:\n10,3,2005-09-06\nx:\n", 3, "header"),
         ("1:\n10,three,2005-09-06\n", 2, "rating")],
    )
    def test_malformed(self, tmp_path, text, line, what):
        p = write(tmp_path / "mv_0000001.txt", text)
        with pytest.raises(ValueError) as exc:
            data.load_netflix(p)
        msg = str(exc.value)
        assert str(p) in msg and f"line {line}" in msg and what in msg

    def test_empty_dir(self, tmp_path):
        with pytest.raises(ValueError, match="no mv_"):
            data.load_netflix(tmp_path)


class TestTriples:
    @pytest.mark.parametrize("sep", ["\t", ",", "::", ";", " "])
    def test_sniff_separator(self, tmp_path, sep):
        lines = [["u1", "i1", "4"], ["u2", "i1", "2.5"], ["u1", "i2", "1"]]
        p = write(tmp_path / "x.txt", "\n".join(sep.join(f) for f in lines) + "\n")
        r = data.load_triples(p)
        assert r.user_ids.tolist() == ["u1", "u2"] and r.ratings.tolist() == [4.0, 2.5, 1.0]

    def test_whitespace_runs(self, tmp_path):
        r = data.load_triples(write(tmp_path / "x.txt", "1   2  3\n4 5    6\n"))
        assert r.user_ids.tolist() == [1, 4] and r.ratings.tolist() == [3.0, 6.0]

    def test_header_auto_and_names(self, tmp_path):
        p = write(tmp_path / "user_artists.dat",
                  "userID\tartistID\tweight\n2\t51\t13883\n2\t52\t11690\n3\t51\t7\n", "\r\n")
        r = data.load_triples(p)
        assert len(r) == 3 and r.user_ids.tolist() == [2, 3]
        r2 = data.load_triples(p, columns=("artistID", "userID", "weight"))
        assert r2.user_ids.tolist() == [51, 52]
        with pytest.raises(ValueError, match="not in header"):
            data.load_triples(p, columns=("user", "artistID", "weight"))
        with pytest.raises(ValueError, match="no header"):
            data.load_triples(p, header=False, columns=("userID", "artistID", "weight"))

    def test_explicit_header_false_reports_line_1(self, tmp_path):
        p = write(tmp_path / "x.csv", "user,item,rating\n1,2,3\n")
        with pytest.raises(ValueError) as exc:
            data.load_triples(p, header=False)
        assert str(p) in str(exc.value) and "line 1" in str(exc.value)

    def test_columns_and_timestamp_iso(self, tmp_path):
        p = write(tmp_path / "x.csv", "when,score,who,what\n2020-01-01,5,ann,apple\n"
                                      "2020-01-02 12:00:00,3,bob,pear\n")
        r = data.load_triples(p, columns=(2, 3, 1), timestamp_column="when")
        assert r.user_ids.tolist() == ["ann", "bob"]
        assert r.timestamps.tolist() == [1577836800, 1577836800 + 86400 + 12 * 3600]

    def test_bad_timestamp(self, tmp_path):
        p = write(tmp_path / "x.csv", "1,2,3,100\n1,3,3,soon\n")
        with pytest.raises(ValueError, match=r"line 2: timestamp 'soon'"):
            data.load_triples(p, timestamp_column=3)

    def test_too_few_fields(self, tmp_path):
        p = write(tmp_path / "x.tsv", "1\t2\t3\n4\t5\n")
        with pytest.raises(ValueError) as exc:
            data.load_triples(p)
        assert str(p) in str(exc.value) and "line 2" in str(exc.value)

    def test_ragged_extra_fields_ok(self, tmp_path):
        r = data.load_triples(write(tmp_path / "x.tsv", "1\t2\t3\textra\n4\t5\t6\n"))
        assert r.ratings.tolist() == [3.0, 6.0]

    def test_quoted_csv(self, tmp_path):
        p = write(tmp_path / "x.csv", 'user,item,rating\n"Smith, J",1,4\n"Doe, A",2,3\n')
        r = data.load_triples(p)
        assert r.user_ids.tolist() == ["Doe, A", "Smith, J"]
        p = write(tmp_path / "y.csv", 'user,item,rating\n"Smith, J",1,x\n')
        with pytest.raises(ValueError, match="line 2"):
            data.load_triples(p)

    def test_latin1_ids(self, tmp_path):
        p = write(tmp_path / "x.tsv", "Jos\xe9\tcaf\xe9\t4\nAnn\tcaf\xe9\t2\n".encode("latin-1"))
        r = data.load_triples(p)
        assert r.user_ids.tolist() == ["Ann", "José"] and r.item_ids.tolist() == ["café"]

    def test_gzip(self, tmp_path):
        p = tmp_path / "u.data.gz"
        p.write_bytes(gzip.compress(U_DATA.encode()))
        assert len(data.load(p)) == 4

    def test_argument_validation(self, tmp_path):
        p = write(tmp_path / "x.tsv", "1\t2\t3\n")
        with pytest.raises(ValueError, match="3 columns"):
            data.load_triples(p, columns=(0, 1))
        with pytest.raises(ValueError, match="header"):
            data.load_triples(p, header="yes")

    def test_parquet(self, tmp_path):
        pd = pytest.importorskip("pandas")
        pytest.importorskip("pyarrow")
        p = tmp_path / "r.parquet"
        pd.DataFrame({"u": [1, 2], "i": ["a", "b"], "r": [1.0, 5.0], "t": [3, 4]}).to_parquet(p)
        r = data.load(p, columns=("u", "i", "r"), timestamp_column="t")
        assert r.shape == (2, 2) and r.timestamps.tolist() == [3, 4]

    def test_parquet_without_pandas_says_so(self, tmp_path, monkeypatch):
        monkeypatch.setitem(sys.modules, "pandas", None)
        p = write(tmp_path / "r.parquet", b"PAR1")
        with pytest.raises(ImportError, match="pandas"):
            data.load_triples(p)


class TestLoadDispatch:
    def test_dispatch(self, tmp_path):
        assert len(data.load(write(tmp_path / "ub.test", U_DATA))) == 4
        assert len(data.load(write(tmp_path / "x.base", U_DATA))) == 4
        csv_p = write(tmp_path / "ratings.csv", TestMovieLensCsvDat.CSV)
        assert data.load(csv_p).timestamps is not None
        dat = write(tmp_path / "ratings.dat", "1::1193::5::978300760\n")
        assert data.load(dat).timestamps.tolist() == [978300760]
        tsv_dat = write(tmp_path / "user_artists.dat", "userID\tartistID\tweight\n2\t51\t13883\n")
        assert data.load(tsv_dat).ratings.tolist() == [13883.0]
        mv = write(tmp_path / "mv_0000003.txt", "3:\n5,2,2005-01-01\n")
        assert data.load(mv).item_ids.tolist() == [3]
        other = write(tmp_path / "data.txt", "a b 1\n")
        assert data.load(other).user_ids.tolist() == ["a"]

    def test_directory_dispatch(self, tmp_path):
        write(tmp_path / "u.data", U_DATA)
        assert len(data.load(tmp_path)) == 4
        with pytest.raises(FileNotFoundError):
            data.load(tmp_path / "nope.csv")
        empty = tmp_path / "empty"
        empty.mkdir()
        with pytest.raises(ValueError, match="no known"):
            data.load(empty)


class TestTitles:
    def test_u_item_latin1(self, tmp_path):
        raw = ("1|Toy Story (1995)|01-Jan-1995||http://x|0|0\n"
               "2|Les Mis\xe9rables (1995)|01-Jan-1995||http://y|0|1\n").encode("latin-1")
        titles = data.load_titles(write(tmp_path / "u.item", raw))
        assert titles == {1: "Toy Story (1995)", 2: "Les Misérables (1995)"}

    def test_movies_csv_quoted_commas(self, tmp_path):
        text = ('movieId,title,genres\n1,Toy Story (1995),Animation\n'
                '11,"American President, The (1995)",Comedy|Drama\n'
                '12,"Dracula: Dead and Loving It (1995)",Comedy\n')
        titles = data.load_titles(write(tmp_path / "movies.csv", text, "\r\n"))
        assert titles[11] == "American President, The (1995)" and len(titles) == 3

    def test_movies_csv_without_header(self, tmp_path):
        p = write(tmp_path / "m.csv", '1,Toy Story (1995),Adventure|Animation\n2,"A, B",Drama\n')
        assert data.load_titles(p) == {1: "Toy Story (1995)", 2: "A, B"}

    def test_movies_dat_and_netflix_titles(self, tmp_path):
        d = data.load_titles(write(tmp_path / "movies.dat", "1::Toy Story (1995)::Animation\n"))
        assert d == {1: "Toy Story (1995)"}
        n = data.load_titles(write(tmp_path / "movie_titles.txt",
                                       "1,2003,Dinosaur Planet\n2,NULL,Hello, World\n"))
        assert n == {1: "Dinosaur Planet", 2: "Hello, World"}

    def test_malformed(self, tmp_path):
        p = write(tmp_path / "u.item", "1|A|x\n2\n")
        with pytest.raises(ValueError) as exc:
            data.load_titles(p)
        assert str(p) in str(exc.value) and "line 2" in str(exc.value)
        p = write(tmp_path / "movies.csv", "movieId,title,genres\n1\n")
        with pytest.raises(ValueError, match="line 2"):
            data.load_titles(p)


# --------------------------------------------------------------------------------------
# synthetic
# --------------------------------------------------------------------------------------
class TestSynthetic:
    def test_movielens_100k_preset(self):
        r = data.synthetic("movielens-100k", seed=3)
        assert r.shape == (943, 1682) and len(r) == 100_000
        assert r.users.dtype == np.int32 and r.items.dtype == np.int32
        assert r.ratings.dtype == np.float32
        assert set(np.unique(r.ratings).tolist()) <= {1.0, 2.0, 3.0, 4.0, 5.0}
        assert len(np.unique(r.ratings)) == 5
        keys = r.users.astype(np.int64) * r.shape[1] + r.items
        assert len(np.unique(keys)) == len(r)  # unique pairs
        counts = np.bincount(r.users, minlength=r.shape[0])
        assert counts.min() >= 1  # every user rated something
        assert counts.max() >= 5 * np.median(counts)  # power-law skew
        pop = np.bincount(r.items, minlength=r.shape[1])
        assert pop.max() >= 8 * np.median(pop)
        r.to_csr()  # no duplicates

    def test_reproducible_and_thread_count_independent(self):
        a = data.synthetic("delicious", seed=5, scale=0.5, n_jobs=1)
        b = data.synthetic("delicious", seed=5, scale=0.5, n_jobs=3)
        c = data.synthetic("delicious", seed=6, scale=0.5)
        for name in ("users", "items", "ratings"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert not np.array_equal(a.items, c.items)

    def test_multi_chunk_generation(self, monkeypatch):
        from clmf.data import generator
        monkeypatch.setattr(generator, "_CHUNK_NNZ", 5000)
        r = data.synthetic("movielens-100k", scale=0.5, seed=1, n_jobs=2)
        keys = r.users.astype(np.int64) * r.shape[1] + r.items
        assert np.all(np.diff(keys) > 0)  # sorted by (user, item) and unique
        assert len(r) == round(100_000 * 0.5)

    @pytest.mark.parametrize("preset", sorted(data.list_presets()))
    def test_preset_shapes_at_small_scale(self, preset):
        m0, n0, nnz0 = data.list_presets()[preset]
        scale = 0.002 if nnz0 > 1_000_000 else 0.05
        r = data.synthetic(preset, scale=scale, seed=0)
        m, n = max(1, round(m0 * scale)), max(1, round(n0 * scale))
        assert r.shape == (m, n)
        expected = min(max(1, round(nnz0 * scale)), max(m, int(0.5 * m * n)))
        assert len(r) == max(expected, m)
        assert np.bincount(r.users, minlength=m).min() >= 1
        assert len(r) / (m * n) <= 0.5 or len(r) == m

    def test_netflix_scale_002(self):
        t0 = time.perf_counter()
        r = data.synthetic("netflix", scale=0.02, seed=0)
        elapsed = time.perf_counter() - t0
        assert r.shape == (9604, 355)
        assert len(r) == int(0.5 * 9604 * 355)  # 1.98M requested, capped at 50 % density
        keys = r.users.astype(np.int64) * r.shape[1] + r.items
        assert np.all(np.diff(keys) > 0)
        assert elapsed < 10

    def test_overrides_factors_and_timestamps(self):
        r, f = data.synthetic(shape=(50, 40), nnz=300, seed=2, rank=4, return_factors=True,
                                  timestamps=True)
        assert r.shape == (50, 40) and len(r) == 300
        assert f.user_factors.shape == (50, 4) and f.item_factors.shape == (40, 4)
        assert f.item_popularity.shape == (40,) and abs(f.item_popularity.sum() - 1) < 1e-9
        assert r.timestamps is not None and r.timestamps.min() >= 946_684_800
        # the ratings follow the true model: correlation of prediction and rating is high
        pred = (f.global_mean + f.user_bias[r.users] + f.item_bias[r.items]
                + np.sum(f.user_factors[r.users] * f.item_factors[r.items], axis=1))
        assert np.corrcoef(pred, r.ratings)[0, 1] > 0.6

    def test_noise_free_is_rounded_model(self):
        r, f = data.synthetic(shape=(30, 30), nnz=200, seed=1, noise=0.0, return_factors=True)
        pred = (f.global_mean + f.user_bias[r.users] + f.item_bias[r.items]
                + np.sum(f.user_factors[r.users] * f.item_factors[r.items], axis=1))
        np.testing.assert_array_equal(r.ratings, np.clip(np.rint(pred), 1, 5))

    def test_density_cap_and_tiny_shapes(self):
        r = data.synthetic(shape=(10, 10), nnz=1000, seed=0)
        assert len(r) == 50
        r = data.synthetic(shape=(5, 1), nnz=1, seed=0)  # every user needs one rating
        assert len(r) == 5 and r.items.tolist() == [0] * 5
        r = data.synthetic("movielens-100k", scale=1e-6, seed=0)
        assert r.shape == (1, 1) and len(r) == 1

    def test_uniform_exponents(self):
        r = data.synthetic(shape=(200, 100), nnz=2000, user_exponent=0, item_exponent=0)
        counts = np.bincount(r.users, minlength=200)
        assert counts.max() < 30  # ~ Poisson around 10, no heavy tail

    @pytest.mark.parametrize(
        "kwargs",
        [dict(preset="nope"), dict(scale=0), dict(scale=float("nan")), dict(rank=0),
         dict(noise=-1), dict(shape=(0, 5)), dict(nnz=0), dict(user_exponent=-1)],
    )
    def test_validation(self, kwargs):
        with pytest.raises(ValueError):
            data.synthetic(**kwargs)

    def test_generator_seed(self):
        a = data.synthetic(shape=(20, 20), nnz=50, seed=np.random.default_rng(1))
        b = data.synthetic(shape=(20, 20), nnz=50, seed=np.random.default_rng(1))
        np.testing.assert_array_equal(a.items, b.items)

    def test_list_presets_is_a_copy(self):
        p = data.list_presets()
        assert p["netflix"] == (480_189, 17_770, 99_072_112)
        assert p["yahoomusic-r1"] == (1_948_882, 98_213, 115_579_440)
        p["netflix"] = (1, 1, 1)
        assert data.list_presets()["netflix"] == (480_189, 17_770, 99_072_112)


class TestDefault:
    def test_default_split(self):
        train, test = data.default()
        assert len(train) == 90_000 and len(test) == 10_000
        assert train.user_ids is test.user_ids and train.shape == test.shape == (943, 1682)
        train2, test2 = data.default(split=True)
        np.testing.assert_array_equal(test.ratings, test2.ratings)
        np.testing.assert_array_equal(test.users, test2.users)
        whole = data.default(split=False)
        assert whole is data.DEFAULT_DATASET and len(whole) == 100_000
        ref = data.synthetic("movielens-100k", seed=42)
        np.testing.assert_array_equal(whole.items, ref.items)
        with pytest.raises(AttributeError):
            data.NOT_A_THING  # noqa: B018


class TestFormerNames:
    """clmf.datasets and clmf.splits (issue 32 made clmf.data the one home) still answer as
    attributes of clmf, with a FutureWarning naming the new module."""

    def test_clmf_datasets_is_clmf_data_with_a_warning(self):
        with pytest.warns(FutureWarning, match=r"clmf\.datasets is now clmf\.data\b"):
            old = clmf.datasets
        assert old is data and old.Ratings is Ratings

    def test_clmf_splits_is_clmf_data_splits_with_a_warning(self):
        from clmf.data import splits
        with pytest.warns(FutureWarning, match=r"clmf\.splits is now clmf\.data\.splits"):
            old = clmf.splits
        assert old is splits and old.leave_k_out is splits.leave_k_out


# --------------------------------------------------------------------------------------
# real data (../shared/data)
# --------------------------------------------------------------------------------------
class TestRealData:
    def test_ml100k_ua_split(self):
        base = shared_data("ml-100k/ua.base")
        t0 = time.perf_counter()
        r = data.load(base)
        assert time.perf_counter() - t0 < 1.0
        assert len(r) == 90_570 and r.shape[0] == 943 and r.shape[1] == 1680
        train, test = data.load_movielens_100k_split(base.parent, "ua")
        assert len(train) == 90_570 and len(test) == 9_430
        assert train.shape == test.shape == (943, 1682)
        assert train.user_ids is test.user_ids
        assert np.all(np.bincount(test.users, minlength=943) == 10)  # 10 test ratings per user
        # same raw triples as reading each file on its own
        alone = data.load_movielens_100k(shared_data("ml-100k/ua.test"))
        got = set(zip(test.user_ids[test.users].tolist(), test.item_ids[test.items].tolist(),
                      test.ratings.tolist()))
        want = set(zip(alone.user_ids[alone.users].tolist(), alone.item_ids[alone.items].tolist(),
                       alone.ratings.tolist()))
        assert got == want

    def test_ml100k_union_equals_u_data(self):
        full = data.load(shared_data("ml-100k/u.data"))
        assert len(full) == 100_000 and full.shape == (943, 1682)
        train, test = data.load_movielens_100k_split(shared_data("ml-100k"), "ua")
        np.testing.assert_array_equal(train.user_ids, full.user_ids)
        k = lambda r: set((r.users.astype(np.int64) * 2000 + r.items).tolist())  # noqa: E731
        assert k(train) | k(test) == k(full) and not (k(train) & k(test))

    def test_ml_latest_small_crlf(self):
        path = shared_data("ml-latest-small/ratings.csv")
        assert b"\r\n" in path.read_bytes()[:100]
        r = data.load(path)
        assert len(r) == 100_836 and r.shape == (610, 9_724)
        assert float(r.ratings.min()) == 0.5 and float(r.ratings.max()) == 5.0
        assert r.timestamps is not None and r.timestamps[0] == 964982703

    def test_titles(self):
        movies = data.load_titles(shared_data("ml-latest-small/movies.csv"))
        assert len(movies) == 9_742 and movies[1] == "Toy Story (1995)"
        assert movies[11] == "American President, The (1995)"
        items = data.load_titles(shared_data("ml-100k/u.item"))
        assert len(items) == 1_682 and items[1] == "Toy Story (1995)"

    def test_lastfm(self):
        r = data.load(shared_data("hetrec2011-lastfm-2k/user_artists.dat"))
        assert len(r) == 92_834 and r.shape == (1_892, 17_632)


def test_synthetic_from_spec_is_shared_by_bench_and_tuner():
    got = clmf.data.synthetic_from_spec("synthetic:300x40x2000", seed=1)
    assert got is not None
    data, name = got
    R = data.to_csr()
    assert R.shape == (300, 40) and name == "synthetic-300x40x2K"
    assert clmf.data.synthetic_from_spec("ml-100k") is None
    assert clmf.data.synthetic_from_spec("synthetic:3x4") is None
    from clmf import autotune
    R2, name2 = autotune.load_data("synthetic:300x40x2000", seed=1)
    assert name2 == name and (R2 != R).nnz == 0


def test_duplicate_pair_check_equals_sorting():
    """The O(N) duplicate check (two counting sorts) finds exactly the inputs with a repeated
    (user, item) pair, in any input order, a repeat anywhere (first/last entries, neighbouring
    items' lists)."""
    from clmf.data.scan import has_duplicate_pairs as _has_duplicate_pairs
    rng = np.random.default_rng(11)
    for trial in range(200):
        n_users, n_items = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        size = int(rng.integers(0, 3 * n_users * n_items // 2 + 2))
        u = rng.integers(0, n_users, size).astype(np.int32)
        i = rng.integers(0, n_items, size).astype(np.int32)
        keys = u.astype(np.int64) * n_items + i
        want = np.unique(keys).size != keys.size
        assert _has_duplicate_pairs(u, i, n_items) == want, (u, i)
        for order in (np.argsort(keys, kind="stable"),                  # sorted by (user, item)
                      np.argsort(i.astype(np.int64) * n_users + u, kind="stable"),  # (item, user)
                      np.argsort(u, kind="stable")):                    # grouped by user
            assert _has_duplicate_pairs(u[order], i[order], n_items) == want, (u, i, order)
    u = np.arange(1000, dtype=np.int32) % 37
    i = np.arange(1000, dtype=np.int32) // 37
    assert not _has_duplicate_pairs(u[::-1].copy(), i[::-1].copy(), 28)
    for a, b in ((0, 999), (0, 1), (998, 999), (500, 37)):
        uu, ii = u.copy(), i.copy()
        uu[b], ii[b] = uu[a], ii[a]
        assert _has_duplicate_pairs(uu, ii, 28)
