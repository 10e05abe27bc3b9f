"""benchmarks/recommend_gpu.py (the lead's GPU run) at a tiny size on a CPU device: every step
runs and writes its JSON and markdown (a few seconds: one tiny fit, the only check of that
script before it runs on the GPU)."""
import importlib.util
import json

import pytest
from conftest import DEVICES, REPO


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_recommend_gpu_small(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))     # its helpers from bench_topk
    spec = importlib.util.spec_from_file_location(
        "recommend_gpu", REPO / "benchmarks" / "recommend_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
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
    md = (tmp_path / "recommend_gpu.md").read_text()
    assert "| 8 |" in md and "600 users × 3,000 items" in md
    assert d["meta"]["device"] and d["meta"]["driver"] and d["meta"]["date"]
