"""The command line's workflow: fit → model.npz → recommend / eval, end to end."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import shared_data

import clmf
from clmf import datasets, metrics, splits
from clmf.cli import main

ROW = re.compile(r"^\s*(\d+)\s+(\S+)\s+(-?[\d.]+|-?inf)(?:\s+(.*))?$")


def parse_recommendations(out):
    rows = [ROW.match(line) for line in out.splitlines()]
    rows = [m for m in rows if m]
    return ([int(m.group(2)) for m in rows], np.array([float(m.group(3)) for m in rows]),
            [m.group(4) for m in rows])


@pytest.fixture
def small_files(tmp_path):
    """A MovieLens-style ratings.csv and movies.csv with 30 users × 25 items."""
    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(1, 31), 10)
    items = np.concatenate([rng.choice(np.arange(101, 126), 10, replace=False) for _ in range(30)])
    ratings = rng.integers(1, 11, users.size) / 2
    path = tmp_path / "ratings.csv"
    lines = ["userId,movieId,rating,timestamp"]
    lines += [f"{u},{i},{r:g},{1000 + k}" for k, (u, i, r) in enumerate(zip(users, items, ratings))]
    path.write_text("\n".join(lines) + "\n")
    titles = tmp_path / "movies.csv"
    titles.write_text("movieId,title,genres\n" + "".join(
        f'{i},"Movie {i}, The ({1990 + i % 20})",Drama\n' for i in range(101, 126)))
    return path, titles


def test_fit_recommend_eval_end_to_end(small_files, tmp_path, capsys):
    data, titles = small_files
    model_path = tmp_path / "model.npz"
    rc = main(["fit", str(data), "-f", "4", "-i", "3", "--test-fraction", "0.2", "--seed", "1",
               "--no-progress", "--output", str(model_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "30 users × 25 items, 240 train / 60 test ratings" in out
    its = re.findall(r"iteration\s+(\d+)\s+train RMSE ([\d.]+)\s+test RMSE ([\d.]+)\s+([\d.]+) s", out)
    assert [int(i) for i, *_ in its] == [1, 2, 3]
    assert "device:" in out and "kernels: users" in out and "test RMSE" in out.splitlines()[-2]
    assert model_path.exists()

    rc = main(["recommend", str(model_path), "--user", "7", "-n", "5", "--titles", str(titles),
               "--train", str(data)])
    out = capsys.readouterr().out
    assert rc == 0, out
    ids, scores, names = parse_recommendations(out)
    model = clmf.load(model_path)
    ratings = datasets.load(data)
    api_ids, api_scores = model.recommend_raw(7, ratings, N=5)
    assert ids == api_ids.tolist() and len(ids) == 5
    np.testing.assert_allclose(scores, api_scores, atol=5e-5)
    assert names == [f"Movie {i}, The ({1990 + i % 20})" for i in ids]
    seen = set(ratings.item_ids[ratings.items[ratings.users == ratings.user_index(7)]].tolist())
    assert not seen & set(ids)

    rc = main(["eval", str(model_path), str(data), "--k", "3", "5", "--train", str(data)])
    out = capsys.readouterr().out
    assert rc == 0, out
    vals = dict(re.findall(r"^(\S+)\s+([\d.]+|nan)$", out, re.M))
    pred = model.predict(model.user_index(ratings.user_ids[ratings.users]),
                         model.item_index(ratings.item_ids[ratings.items]))
    assert float(vals["RMSE"]) == pytest.approx(metrics.rmse(ratings.ratings, pred), abs=1e-4)
    assert float(vals["MAE"]) == pytest.approx(metrics.mae(ratings.ratings, pred), abs=1e-4)
    for name in ("precision@3", "recall@3", "map@3", "ndcg@3", "precision@5", "ndcg@5"):
        assert name in vals
    # every test item is also a --train item here: all filtered, so no hits at all
    assert float(vals["precision@5"]) == 0.0

    # without --train nothing is filtered; a relevance threshold is reported
    rc = main(["eval", str(model_path), str(data), "--k", "5", "--relevance-threshold", "4"])
    out = capsys.readouterr().out
    assert rc == 0 and "no --train data" in out and "≥ 4 relevant" in out


def test_entry_point_in_a_subprocess(small_files, tmp_path):
    data, _ = small_files
    model_path = tmp_path / "m.npz"
    assert main(["fit", str(data), "-f", "3", "-i", "1", "--no-progress", "-o", str(model_path)]) == 0
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(clmf.__file__)))
    run = subprocess.run([sys.executable, "-m", "clmf", "recommend", str(model_path), "--user", "3",
                          "-n", "4"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert len(parse_recommendations(run.stdout)[0]) == 4
    run = subprocess.run([sys.executable, "-m", "clmf", "recommend", str(model_path), "--user",
                          "nobody"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1                  # a runtime error, not a usage error
    assert run.stderr.strip() == "clmf recommend: error: 1 unknown user id(s): 'nobody'"


def test_cli_errors(small_files, tmp_path, capsys):
    data, _ = small_files
    cases = [   # (argv, exit status: 1 the work failed, 2 usage error, message)
        (["recommend", str(tmp_path / "none.npz"), "--user", "1"], 1, "no such clmf model file"),
        (["recommend", str(data), "--user", "1"], 1, "not a clmf model file"),
        (["eval", str(tmp_path / "none.npz"), str(data)], 1, "no such clmf model file"),
        (["fit"], 2, "give a ratings file"),
        (["fit", str(data), "--preset", "movielens-100k"], 2, "not both"),
        (["fit", str(tmp_path / "nothing.csv")], 1, "not found"),
        (["fit", str(data), "--test-fraction", "1.5"], 2, "--test-fraction"),
        (["fit", "--preset", "nope"], 2, "unknown preset"),
        (["fit", str(data), "--factors", "0"], 2, "factors must be an integer"),
        (["fit", str(data), "--feedback", "implicit", "--alpha", "-1"], 2, "alpha"),
        (["tune"], 2, "give a ratings file"),
        (["tune", "--preset", "movielens-100k", "--factors", "0"], 2, "--factors"),
    ]
    for argv, status, msg in cases:
        assert main(argv) == status, argv
        err = capsys.readouterr().err
        assert err.startswith(f"clmf {argv[0]}: error: ") and msg in err, (argv, err)
    # argparse's own usage errors exit with 2 too
    with pytest.raises(SystemExit) as e:
        main(["fit", str(data), "--no-such-option"])
    assert e.value.code == 2
    capsys.readouterr()


def test_fit_preset_without_test_set(tmp_path, capsys):
    rc = main(["fit", "--preset", "movielens-100k", "--scale", "0.02", "-f", "2", "-i", "1",
               "--test-fraction", "0", "--no-progress", "-o", str(tmp_path / "p.npz")])
    out = capsys.readouterr().out
    assert rc == 0 and "synthetic preset 'movielens-100k'" in out and "no test set" in out
    m = clmf.load(tmp_path / "p.npz")
    assert m.user_ids_ is not None and m.user_factors_.shape[1] == 2


def test_movielens_100k_official_split(tmp_path, capsys):
    d = shared_data("ml-100k/ua.base").parent
    model_path = tmp_path / "ua.npz"
    assert main(["fit", str(d), "--split", "ua", "-f", "8", "-i", "2", "--no-progress",
                 "-o", str(model_path)]) == 0
    out = capsys.readouterr().out
    assert "official ua.base/ua.test split" in out and "90570 train / 9430 test" in out
    assert main(["eval", str(model_path), str(d), "--split", "ua", "--k", "10"]) == 0
    out = capsys.readouterr().out
    vals = dict(re.findall(r"^(\S+)\s+([\d.]+)$", out, re.M))
    assert 0.8 < float(vals["RMSE"]) < 1.3 and float(vals["precision@10"]) >= 0
    assert "no --train" not in out        # ua.base filters the seen items
    rc = main(["recommend", str(model_path), "--user", "1", "-n", "3", "--titles",
               str(d / "u.item"), "--train", str(d / "ua.base")])
    ids, _, names = parse_recommendations(capsys.readouterr().out)
    assert rc == 0 and len(ids) == 3 and all(n and n != "?" for n in names)


def test_acceptance_ml_latest_small_cli_equals_python_api(tmp_path, capsys):
    """Issue 5's acceptance check: `clmf fit ratings.csv ... && clmf recommend ... --user 1`
    works, and the Python API with the same seed gives the same top 10 (scores within 1e-5)."""
    ratings_csv = shared_data("ml-latest-small/ratings.csv")
    movies_csv = shared_data("ml-latest-small/movies.csv")
    model_path = tmp_path / "ml.npz"
    assert main(["fit", str(ratings_csv), "-f", "16", "-i", "5", "--seed", "7", "--no-progress",
                 "--output", str(model_path)]) == 0
    capsys.readouterr()
    assert main(["recommend", str(model_path), "--user", "1", "--titles", str(movies_csv),
                 "--train", str(ratings_csv)]) == 0
    cli_ids, cli_scores, names = parse_recommendations(capsys.readouterr().out)
    assert len(cli_ids) == 10 and all(n and n != "?" for n in names)

    data = datasets.load(ratings_csv)
    train, _ = splits.random_holdout(data, test_fraction=0.1, random_state=7)
    model = clmf.ALS(factors=16, iterations=5, random_state=7)      # λ: the library default
    model.fit(train, show_progress=False)
    ids, scores = model.recommend_raw(1, data, N=10)
    assert ids.tolist() == cli_ids
    saved_ids, saved_scores = clmf.load(model_path).recommend_raw(1, data, N=10)
    assert saved_ids.tolist() == cli_ids
    np.testing.assert_allclose(saved_scores, scores, atol=1e-5, rtol=0)
    np.testing.assert_allclose(cli_scores, scores, atol=5e-5, rtol=0)   # printed to 4 decimals
    seen = set(data.item_ids[data.items[data.users == data.user_index(1)]].tolist())
    assert not seen & set(cli_ids)
