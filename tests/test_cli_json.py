"""The command line for scripts: library defaults shown in --help, --json documents on stdout
(everything else on stderr), exit status 1 for failures and 2 for usage errors."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import DEVICES
from test_cli import small_files  # noqa: F401  (fixture)

import clmf
from clmf.cli import build_parser, main


def run_cli(*argv, timeout=300):
    """``python -m clmf ARGV`` in a subprocess, from the folder of the clmf under test (not the
    checkout, whose clmf has no cl_kernels): (exit status, stdout, stderr)."""
    root = os.path.dirname(os.path.dirname(clmf.__file__))
    env = dict(os.environ, PYTHONPATH=root)
    r = subprocess.run([sys.executable, "-m", "clmf", *map(str, argv)], capture_output=True,
                       text=True, env=env, timeout=timeout, cwd=root)
    return r.returncode, r.stdout, r.stderr


def test_fit_uses_the_librarys_defaults_and_help_shows_them(capsys):
    als = {k: p.default for k, p in inspect.signature(clmf.ALS.__init__).parameters.items()}
    args = build_parser().parse_args(["fit", "data.csv"])
    for opt in ("factors", "regularization", "iterations", "device", "variant", "solver",
                "storage", "feedback", "alpha", "confidence"):
        assert getattr(args, opt) == als[opt], opt
    assert args.unweighted is False and args.biases is False
    with pytest.raises(SystemExit) as e:
        main(["fit", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for opt in ("factors", "regularization", "iterations"):
        assert f"(default: {als[opt]})" in out, opt
    assert "(default: 1+alpha*r)" in out


def test_json_fit_eval_recommend(small_files, tmp_path):  # noqa: F811
    data, titles = small_files
    model = tmp_path / "m.npz"
    rc, out, err = run_cli("fit", data, "-f", "4", "-i", "2", "--seed", "1", "--test-fraction",
                           "0.2", "-o", model, "--json")
    assert rc == 0, err
    doc = json.loads(out)                      # stdout is exactly one JSON document
    assert doc["command"] == "fit" and doc["users"] == 30 and doc["items"] == 25
    assert doc["train_ratings"] == 240 and doc["test_ratings"] == 60
    assert doc["params"]["factors"] == 4 and doc["params"]["regularization"] == 0.1
    assert len(doc["history"]) == 2 and doc["output"] == str(model)
    assert set(doc["config"]) == {"users", "items"} and doc["config"]["users"]["rule"]
    m = clmf.load(model)
    np.testing.assert_allclose(doc["history"][-1]["validation_rmse"], doc["test_rmse"],
                               rtol=1e-4)
    assert "data:" in err and "test RMSE" in err        # the human report went to stderr

    rc, out, err = run_cli("eval", model, data, "--train", data, "--k", "5", "10", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["command"] == "eval" and doc["ratings"] == 300 and doc["skipped"] == 0
    assert 0 < doc["rmse"] < 5 and 0 < doc["mae"] <= doc["rmse"]
    assert {"precision@5", "precision@10", "ndcg@10"} <= set(doc["ranking"])

    rc, out, err = run_cli("recommend", model, "--user", "7", "-n", "4", "--titles", titles,
                           "--train", data, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert [r["rank"] for r in doc["items"]] == [1, 2, 3, 4]
    ids, scores = m.recommend_raw(7, clmf.data.load(data), N=4)
    assert [r["item"] for r in doc["items"]] == ids.tolist()
    np.testing.assert_allclose([r["score"] for r in doc["items"]], scores, rtol=1e-6)
    assert all(r["title"].startswith("Movie ") for r in doc["items"])


def test_json_errors_and_exit_status(small_files, tmp_path):  # noqa: F811
    data, _ = small_files
    rc, out, err = run_cli("recommend", tmp_path / "none.npz", "--user", "1", "--json")
    assert rc == 1 and json.loads(out) == {
        "command": "recommend", "exit_status": 1,
        "error": f"[Errno 2] no such clmf model file: '{tmp_path / 'none.npz'}'"}
    assert err.startswith("clmf recommend: error: ")
    rc, out, err = run_cli("fit", data, "--test-fraction", "2", "--json")
    assert rc == 2 and json.loads(out)["exit_status"] == 2 and "--test-fraction" in err
    rc, out, err = run_cli("fit", data, "--no-such-option", "--json")
    assert rc == 2 and "unrecognized arguments" in err     # argparse's errors: a document too
    assert json.loads(out) == {"command": "fit", "error": "unrecognized arguments: "
                               "--no-such-option", "exit_status": 2}


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_json_bench(tmp_path):
    dev = f"{DEVICES[0].platform.name.strip()} | {DEVICES[0].name.strip()}"
    rc, out, err = run_cli("bench", "--data", "synthetic:60x40x600", "-f", "4", "-i", "1",
                           "--peers", "none", "--no-plots", "--peak-repeats", "1", "--out",
                           tmp_path, "-d", dev, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["command"] == "bench" and os.path.isfile(doc["files"]["csv"])
    runs = [r for r in doc["rows"] if r.get("system") == "clmf"]
    assert runs and all(r["status"] == "ok" for r in runs)
    rc, out, err = run_cli("bench", "--iterations", "0", "--json")
    assert rc == 2 and "--iterations" in err
