"""benchmarks/side_profile.py (the lead's per-side GPU profile) at a tiny size on a CPU device:
every variant is timed per side, compared with auto's factors, and paired (a few seconds: the
only check of the script before it runs on the GPU)."""
import json

import pytest
from conftest import DEVICES, repo_script


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_side_profile_small(tmp_path):
    mod = repo_script("benchmarks/side_profile.py")
    refused = "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=16384"   # too many work-items
    mod.main(["--device", "cpu", "--scale", "0.002", "--factors", "8", "--modes",
              "explicit,implicit", "--iterations", "1", "--out", str(tmp_path), "--variants",
              f"batch+vec16:tx=1,ty=1,solve_wg=1,solve_vec=16,solver=fusedcg;{refused};"
              "batch:tx=oops"])
    rows = [json.loads(x) for x in (tmp_path / "side_profile.jsonl").read_text().splitlines()]
    for mode in ("explicit", "implicit"):
        mine = [r for r in rows if r["mode"] == mode]
        auto, vec, bad, malformed = (r for r in mine if not r.get("pair"))
        assert auto["status"] == "ok" and auto["diff_users"] == 0.0
        assert vec["status"] == "ok" and vec["users_s"] > 0 and vec["items_s"] > 0
        assert vec["diff_users"] < 1e-2 and vec["diff_items"] < 1e-1   # the same systems
        assert "InvalidConfigError" in bad["status"] and "Error" in malformed["status"]
        assert [r["variant"] for r in mine if r.get("pair")] == ["best pair", "auto"]
        pairs = {r["variant"]: r for r in mine if r.get("pair")}
        assert pairs["auto"]["status"] == "ok" and pairs["auto"]["s_per_it"] > 0
        # the best of each side may not share factor buffers (vector padding): then a reason
        best = pairs["best pair"]
        assert best.get("s_per_it", 0) > 0 if best["status"] == "ok" else "Error" in best["status"]
    md = (tmp_path / "side_profile.md").read_text()
    assert "best pair" in md and "InvalidConfigError" in md
