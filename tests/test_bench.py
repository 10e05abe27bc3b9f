"""clmf bench: the FLOP/byte accounting, the device-limit microbenchmarks, a tiny end-to-end run
(CSV and markdown with the required columns) and the reporting of a peer that is missing."""
from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from conftest import random_ratings

from clmf.bench import peers as bench_peers
from clmf.bench import runner as bench


# ----- accounting, against numbers worked out by hand ------------------------------------------
def test_useful_flops_by_hand():
    # m=2 users, n=3 items, nnz=4, f=2:
    #   S1 = 2 sides · nnz·f·(f+1) = 2·4·2·3 = 48
    #   S2 = 2 sides · 2·nnz·f     = 2·2·4·2 = 32
    #   S3 = (m+n)·f³/3            = 5·8/3
    fl = bench.useful_flops(2, 3, 4, 2)
    assert fl["s1"] == 48
    assert fl["s2"] == 32
    assert fl["s3"] == pytest.approx(40 / 3)
    assert fl["total"] == pytest.approx(48 + 32 + 40 / 3)
    # Netflix at f=100: both S1 stages ≈ 2.0e12 useful flop (the "≈2.1e12" with S2)
    fl = bench.useful_flops(480_189, 17_770, 99_072_112, 100)
    assert fl["s1"] == pytest.approx(2 * 99_072_112 * 100 * 101)
    assert 2.0e12 < fl["s1"] + fl["s2"] < 2.1e12


def test_useful_bytes_by_hand():
    # users side (r=s=2): 8·3 + 4·4 + 4·2·4 + 4·2·3 = 24+16+32+24 = 96   (S1)
    #                     8·3 + 8·4 + 4·2·4 + 4·2·2 = 24+32+32+16 = 104  (S2, and fused)
    #                     4·2·3 + 8·2·2 = 24+32 = 56                     (S3)
    # items side (r=s=3): 8·4 + 16 + 32 + 4·3·3 = 32+16+32+36 = 116     (S1)
    #                     8·4 + 32 + 32 + 4·3·2 = 32+32+32+24 = 120     (S2, and fused)
    #                     4·3·3 + 8·3·2 = 36+48 = 84                    (S3)
    by = bench.useful_bytes(2, 3, 4, 2)
    assert by["s1"] == 96 + 116
    assert by["s2"] == 104 + 120
    assert by["s3"] == 56 + 84
    assert by["total"] == 104 + 120
    # empty rows still cost their row pointers
    assert bench.useful_bytes(2, 3, 4, 2, rows_users=5)["total"] == 224 + 8 * 3


def test_device_slug():
    from clmf.engine.device import DeviceInfo
    base = dict(index="0:0", platform_version="", vendor="", type="CPU", driver="",
                opencl_c_version="", compute_units=1, global_mem=1, max_alloc=1, local_mem=1,
                local_mem_type="local",
                max_work_group_size=1, max_work_item_sizes=(1,), preferred_vector_width_float=1,
                native_vector_width_float=1, clock_mhz=1)
    assert bench.device_slug(DeviceInfo(platform="Portable Computing Language",
                                        name="pthread-skylake-avx512-AMD EPYC",
                                        **base)) == "pocl-amd-epyc"
    assert bench.device_slug(DeviceInfo(platform="Intel(R) OpenCL", name="AMD EPYC",
                                        **base)) == "intel-amd-epyc"
    assert bench.device_slug(DeviceInfo(platform="NVIDIA CUDA", name="NVIDIA H100 80GB HBM3",
                                        **base)) == "nvidia-h100-80gb-hbm3"


# ----- microbenchmarks ---------------------------------------------------------------------------
def test_peaks_positive_finite(cl_device):
    pk = bench.measure_peaks(cl_device, repeats=2, quick=True, widths=(1, 4))
    assert math.isfinite(pk["peak_gflops"]) and pk["peak_gflops"] > 0
    assert math.isfinite(pk["peak_gbps"]) and pk["peak_gbps"] > 0
    assert pk["fma_width"] in (1, 4)
    assert all(v["gflops"] > 0 for v in pk["fma"].values())


# ----- a tiny run --------------------------------------------------------------------------------
def _tiny_problem(monkeypatch):
    R = random_ratings(60, 40, density=0.25, seed=3)
    T = random_ratings(60, 40, density=0.03, seed=4)
    T = T - T.multiply(R != 0)            # disjoint from train
    T.eliminate_zeros()
    problem = bench_peers.Problem("tiny", R.tocsr(), T.tocsr())
    monkeypatch.setattr(bench, "load_problem", lambda spec, **kw: problem)
    return problem


def test_tiny_bench_writes_csv_and_markdown(tmp_path, monkeypatch, cl_device):
    _tiny_problem(monkeypatch)
    # a peer whose package is missing must come back as such, not vanish
    monkeypatch.setitem(bench_peers._NEEDS, "spark", "clmf_no_such_package_xyz")
    rows, paths = bench.run_bench(datasets=["tiny"], factors=[4], devices=[cl_device],
                                  variants=["auto", "batch"], peers="reference,spark,no-such-peer",
                                  iterations=3, regularization=0.1, out=tmp_path, name="t",
                                  plots=False, peak_repeats=2, quick_peaks=True,
                                  progress=lambda *a: None)
    with open(paths["csv"]) as fh:
        got = list(csv.DictReader(fh))
    assert set(bench.FIELDS) <= set(got[0])
    required = ["seconds_per_iteration", "s1_s", "s2_s", "s3_s", "test_rmse", "gflops",
                "frac_peak_flops", "gbps", "frac_peak_bw", "device_memory_bytes", "commit",
                "device", "driver", "date", "status"]
    clmf_rows = [r for r in got if r["system"] == "clmf"]
    assert len(clmf_rows) == 2
    for r in clmf_rows:
        assert r["status"] == "ok"
        for k in required:
            assert r[k] != "", k
        assert float(r["seconds_per_iteration"]) > 0
        assert 0 < float(r["frac_peak_flops"]) < 1.5
        assert int(r["device_memory_bytes"]) > 0
        # same start, same maths (the reference solves exactly; a tuned CG's 3 steps per
        # iteration land within 1%)
        tol = 1e-2 if "solver=cg" in r["variant"] or "fusedcg" in r["variant"] else 1e-3
        assert abs(float(r["rmse_vs_reference"])) < tol
    by_sys = {r["system"]: r for r in got}
    assert by_sys["reference"]["status"] == "ok"
    assert by_sys["spark"]["status"].startswith("unavailable:")
    assert "clmf_no_such_package_xyz" in by_sys["spark"]["status"]
    assert by_sys["no-such-peer"]["status"].startswith("unavailable:")
    assert {"peak-fma", "peak-copy"} <= set(by_sys)
    md = paths["md"].read_text()
    for s in ("Measured device limits", "Ratios clmf ÷ peer", "| reference |", "unavailable",
              "bottleneck", "commit", "driver"):
        assert s in md, s


def test_failing_peer_is_reported(monkeypatch):
    problem = bench_peers.Problem("p", random_ratings(10, 8, seed=1),
                                  random_ratings(10, 8, 0.05, seed=2))

    def boom(*a):
        raise RuntimeError("kaput")
    monkeypatch.setitem(bench_peers.PEERS, "reference", boom)
    r = bench_peers.run_peer("reference", problem, 2, 0.1, 2, 0)
    assert r.status.startswith("failed: RuntimeError: kaput")


def test_rmse_rule_unknown_rows_predict_mean():
    import scipy.sparse as sp
    R = sp.csr_matrix(np.array([[5.0, 0, 0], [0, 3.0, 0]], np.float32))
    T = sp.csr_matrix(np.array([[0, 0, 2.0], [0, 3.0, 0]], np.float32))   # item 2 unseen
    p = bench_peers.Problem("p", R, T)
    X = np.array([[1.0], [1.0]])
    Y = np.array([[5.0], [3.0], [100.0]])
    # (mean 4 − 2)² and (3 − 3)²
    assert bench_peers.rmse_of(p, X, Y) == pytest.approx(np.sqrt(4 / 2))


def test_pytorch_peer_matches_reference():
    pytest.importorskip("torch")
    from clmf import reference
    R = random_ratings(50, 30, density=0.3, seed=5)
    X0, Y0 = reference.start_factors(50, 30, 6, 0)
    Xr, Yr = reference.als(R, 6, 0.1, 2, init=(X0, Y0))
    import torch
    m = bench_peers.TorchALS(R, 6, 0.1, "cpu", budget=4096)     # tiny budget: many buckets
    X = torch.as_tensor(X0).clone()
    Y = torch.as_tensor(Y0).clone()
    for _ in range(2):
        m.iteration(X, Y)
    assert np.linalg.norm(X.numpy() - Xr) / np.linalg.norm(Xr) < 1e-4
    assert np.linalg.norm(Y.numpy() - Yr) / np.linalg.norm(Yr) < 1e-4


def test_dataset_spec_errors():
    with pytest.raises(ValueError, match="unknown data set"):
        bench.load_problem("no-such-set")


def test_cli_bench_parser():
    from clmf.cli import build_parser
    a = build_parser().parse_args(["bench", "--data", "ml-100k", "--data", "netflix@0.01",
                                   "-f", "10", "50", "--variant", "auto", "--variant", "batch",
                                   "--peers", "cpu"])
    assert a.data == ["ml-100k", "netflix@0.01"] and a.factors == [10, 50]
    assert a.variant == ["auto", "batch"] and a.func.__name__ == "cmd_bench"


def test_skipping_peer_is_reported(monkeypatch):
    problem = bench_peers.Problem("p", random_ratings(10, 8, seed=1),
                                  random_ratings(10, 8, 0.05, seed=2))

    def skip(*a):
        raise bench_peers.PeerSkipped("too big")
    monkeypatch.setitem(bench_peers.PEERS, "reference", skip)
    assert bench_peers.run_peer("reference", problem, 2, 0.1, 2, 0).status == "skipped: too big"
