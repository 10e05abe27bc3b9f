"""The command line's workflow: fit → model.npz → recommend / eval, end to end."""
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import shared_data

import clmf
from clmf import metrics
from clmf.cli import main
from clmf.data import splits

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
    assert "device:" in out and "kernels: users" in out
    assert re.search(r"^fitted f=4, .*3 iterations .*; test RMSE [\d.]+$", out, re.M)
    assert model_path.exists() and os.path.exists(f"{model_path}.holdout.json")

    rc = main(["recommend", str(model_path), "--user", "7", "-n", "5", "--titles", str(titles),
               "--train", str(data)])
    out = capsys.readouterr().out
    assert rc == 0, out
    ids, scores, names = parse_recommendations(out)
    model = clmf.load(model_path)
    ratings = clmf.data.load(data)
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

    data = clmf.data.load(ratings_csv)
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


def test_demo_runs_what_the_readme_says(small_files, capsys):
    """`clmf demo`'s model (one place: cli.DEMO_MODEL) is what the user guide's command-line page
    quotes, and the demo runs that many iterations."""
    from clmf.cli import DEMO_MODEL, build_parser
    readme = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide" / "cli.md").read_text()
    line = next(ln for ln in readme.splitlines() if ln.startswith("clmf demo "))
    quoted = dict(re.findall(r"--(factors|regularization|iterations) ([\d.]+)", line))
    assert {k: float(v) for k, v in quoted.items()} == {k: float(v) for k, v in DEMO_MODEL.items()}
    prose = re.search(r"`clmf demo` keeps the paper's\s+f = (\d+), λ = ([\d.]+), (\d+)\s+iterations",
                      readme)
    assert prose and tuple(map(float, prose.groups())) == (
        DEMO_MODEL["factors"], DEMO_MODEL["regularization"], DEMO_MODEL["iterations"])
    args = build_parser().parse_args(["demo"])
    assert {k: getattr(args, k) for k in DEMO_MODEL} == DEMO_MODEL
    data, _ = small_files
    assert main(["demo", "--data", str(data), "--factors", "3"]) == 0
    out = capsys.readouterr().out
    its = re.findall(r"^iteration\s+(\d+)\s+train RMSE [\d.]+\s+test RMSE [\d.]+", out, re.M)
    assert len(its) == DEMO_MODEL["iterations"]
    assert f"after {DEMO_MODEL['iterations']} iterations" in out


def test_fit_implicit_prints_ranking_metrics_and_stops_early(small_files, tmp_path, capsys):
    """Implicit feedback: per iteration the recorded test precision@10 (no train/test RMSE, no
    nan), at the end clmf.evaluate's metrics; --early-stopping-rounds keeps the best iteration."""
    data, _ = small_files
    model_path = tmp_path / "imp.npz"
    rc = main(["fit", str(data), "--feedback", "implicit", "-f", "4", "-i", "8",
               "--test-fraction", "0.3", "--seed", "2", "--early-stopping-rounds", "1",
               "--no-progress", "-o", str(model_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "RMSE" not in out and "nan" not in out
    per_it = re.findall(r"^iteration\s+\d+\s+test strict precision@10 ([\d.]+)\s+[\d.]+ s$",
                        out, re.M)
    assert 1 <= len(per_it) <= 8
    model = clmf.load(model_path)
    train, test = splits.random_holdout(clmf.data.load(data), test_fraction=0.3, random_state=2)
    want = clmf.evaluate(model, model_csr(model, train), model_csr(model, test), K=10)
    got = dict(re.findall(r"(precision|strict precision|MAP|nDCG|AUC) ([\d.]+)", out))
    assert float(got["precision"]) == pytest.approx(want["precision"], abs=1e-4)
    assert float(got["strict precision"]) == pytest.approx(want["strict_precision"], abs=1e-4)
    for key in ("MAP", "nDCG", "AUC"):
        assert float(got[key]) == pytest.approx(want[key.lower()], abs=1e-4), key
    best = re.search(r"early stopping: the best, iteration (\d+), kept", out)
    assert best and float(per_it[int(best.group(1)) - 1]) == max(map(float, per_it))
    for argv in (["--early-stopping-rounds", "0"],
                 ["--early-stopping-rounds", "2", "--test-fraction", "0"]):
        assert main(["fit", str(data), "-f", "2", "-i", "1", "--no-progress", *argv]) == 2
        assert "needs N ≥ 1 and a test set" in capsys.readouterr().err


def model_csr(model, ratings):
    """``ratings`` (raw ids) as a CSR in the model's indices."""
    import scipy.sparse as sp
    u = model.user_index(ratings.user_ids[ratings.users])
    i = model.item_index(ratings.item_ids[ratings.items])
    return sp.csr_matrix((ratings.ratings, (u, i)), shape=model.shape_)


def test_eval_uses_the_holdout_the_fit_recorded(small_files, tmp_path, capsys):
    """`clmf eval MODEL` scores the fit's own holdout (training items left out) after checking
    that the data still gives it; no holdout recorded (or a stale one removed): a usage error."""
    data, _ = small_files
    model_path = tmp_path / "m.npz"
    assert main(["fit", str(data), "-f", "4", "-i", "2", "--test-fraction", "0.25", "--seed", "3",
                 "--no-progress", "-o", str(model_path)]) == 0
    capsys.readouterr()
    assert main(["eval", str(model_path)]) == 0
    out = capsys.readouterr().out
    assert "the fit's holdout" in out and "0.25 random holdout (seed 3)" in out
    vals = dict(re.findall(r"^(\S+)\s+([\d.]+|nan)$", out, re.M))
    model = clmf.load(model_path)
    train, test = splits.random_holdout(clmf.data.load(data), test_fraction=0.25, random_state=3)
    assert float(vals["RMSE"]) == pytest.approx(model.rmse(model_csr(model, test)), abs=1e-4)
    assert "no --train" not in out                # the fit's training items are left out
    # the data changed since the fit: refused
    data.write_text(data.read_text() + "31,101,3,9999\n")
    assert main(["eval", str(model_path)]) == 1
    assert "no longer gives the holdout" in capsys.readouterr().err
    # a fit without a test set records nothing and removes the stale record
    assert main(["fit", str(data), "-f", "2", "-i", "1", "--test-fraction", "0", "--no-progress",
                 "-o", str(model_path)]) == 0
    assert not os.path.exists(f"{model_path}.holdout.json")
    assert main(["eval", str(model_path)]) == 2
    assert "no recorded holdout" in capsys.readouterr().err


def test_help_shows_each_default_once():
    """No option's help says its default twice, nor "(default: None)"."""
    import argparse

    from clmf.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        text = " ".join(p.format_help().split())
        assert "(default: None)" not in text, name
        for action in p._actions:
            h = (p._get_formatter()._get_help_string(action) or "").replace("%(default)s", "")
            assert h.lower().count("default") <= 1 or "(default:" not in h, (name, h)


def test_titles_without_titles_warn(small_files, tmp_path, capsys, caplog):
    """--titles given a ratings file: a warning naming the problem, no made-up titles; a titles
    file lacking some recommended items: a warning counting them."""
    data, titles = small_files
    model_path = tmp_path / "m.npz"
    assert main(["fit", str(data), "-f", "3", "-i", "1", "--no-progress", "-o",
                 str(model_path)]) == 0
    capsys.readouterr()
    assert main(["recommend", str(model_path), "--user", "2", "-n", "3", "--titles",
                 str(data)]) == 0
    out = capsys.readouterr().out
    assert "is it a ratings file?" in caplog.text and "title" not in out.splitlines()[1]
    ids, _, names = parse_recommendations(out)
    assert len(ids) == 3 and names == [None] * 3
    caplog.clear()
    short = tmp_path / "few.csv"
    short.write_text("movieId,title\n" + "".join(f"{i},Film {i}\n" for i in ids[:1]))
    assert main(["recommend", str(model_path), "--user", "2", "-n", "3", "--titles",
                 str(short)]) == 0
    _, _, names = parse_recommendations(capsys.readouterr().out)
    assert names == [f"Film {ids[0]}", "?", "?"]
    assert "2 of the 3 recommended items have no title" in caplog.text
