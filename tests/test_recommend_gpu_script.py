"""benchmarks/recommend_gpu.py and recommend_scaling.py (the lead's GPU runs) at a tiny size on
CPU devices: every step runs and writes its JSON and markdown (a few seconds: one tiny fit, the
only check of those scripts before they run on the GPU)."""
import json

import pytest
from conftest import DEVICES, REPO, repo_script


def script(name, monkeypatch):
    """The benchmark script ``benchmarks/<name>.py`` as a module."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))     # its helpers from bench_topk
    return repo_script(f"benchmarks/{name}.py")


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_recommend_gpu_small(tmp_path, monkeypatch):
    mod = script("recommend_gpu", monkeypatch)
    mod.main(["--out", str(tmp_path), "--small", "--device", "cpu", "--factors", "8",
              "--iterations", "1", "--million-users", "600", "--million-items", "3000",
              "--check"])
    d = json.loads((tmp_path / "recommend_gpu.json").read_text())
    assert [r["f"] for r in d["netflix"]] == [8]
    for r in d["netflix"]:
        assert "error" not in r, r.get("error")
        assert r["same_ids"] and r["warm_recommend_all_s"] > 0 and r["first_recommend_s"] > 0
        assert "ranker" in r and "implicit" in r
    mm = d["million"]
    assert "error" not in mm and mm["warm_s"] > 0 and mm["overlap_host_200"] == 1.0
    (dev,) = mm["split"]["devices"]                      # where the warm call's time went
    assert dev["users"] == [0, 600] and dev["rows"] == 600 and dev["kernel_s"] > 0
    md = (tmp_path / "recommend_gpu.md").read_text()
    assert "| 8 |" in md and "600 users × 3,000 items" in md
    assert d["meta"]["device"] and d["meta"]["driver"] and d["meta"]["date"]


@pytest.mark.skipif(len(DEVICES) < 2, reason="needs two OpenCL devices")
def test_recommend_scaling_small(tmp_path, monkeypatch):
    """benchmarks/recommend_scaling.py on two devices at a tiny size: together, alone, the GIL
    gap and the per-device split are reported."""
    from clmf.engine.device import all_devices
    mod = script("recommend_scaling", monkeypatch)
    index = {d.int_ptr: i for i, _p, d in all_devices()}       # "P:D": names may repeat
    spec = ";".join(index[d.int_ptr] for d in DEVICES[:2])
    mod.main(["--out", str(tmp_path), "--device", spec, "--users", "3000", "--items", "500",
              "--factors", "8", "--seen-per-user", "5", "--reps", "1"])
    r = json.loads((tmp_path / "recommend_scaling.json").read_text())["result"]
    assert r["warm_s"] > 0 and r["gil_gap_s"] >= 0 and len(r["alone"]) == 2
    assert [d["users"] for d in r["split"]["devices"]] == [a["users"] for a in r["alone"]]
    assert r["alone"][-1]["users"][1] == 3000
    assert "| device | users | alone s |" in (tmp_path / "recommend_scaling.md").read_text()
