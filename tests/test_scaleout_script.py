"""benchmarks/scaleout.py (the 4-GPU scale-out runs) at a tiny size on the CPU devices: a forced
reduce mode on two devices, summed on the host and on the devices side by side, records the
reduce's split in its summary (a few seconds: the only check of the script before it runs on the
GPUs)."""
import json

import pytest
from conftest import DEVICES, repo_script


def _cpus():
    """The CPU devices clmf sees."""
    import pyopencl as cl
    return [d for d in DEVICES if d.type & cl.device_type.CPU]


@pytest.mark.skipif(len(_cpus()) < 2, reason="fewer than 2 CPU devices")
def test_scaleout_small_with_the_reduce_mode(tmp_path):
    mod = repo_script("benchmarks/scaleout.py")
    mod.main([str(tmp_path), "--devices", "cpu", "--preset", "hugewiki", "--shape", "300x200x3000",
              "--factors", "8", "--gpus", "1,2", "--iterations", "1", "--budget", "5",
              "--modes", "replicate,reduce", "--solver", "cholesky", "--cache", str(tmp_path),
              "--reduce-sum", "host,device"])
    rows = [json.loads(x) for x in (tmp_path / "scaleout.jsonl").read_text().splitlines()]
    assert [r["devices"] for r in rows] == [1, 2, 2] and all("error" not in r for r in rows)
    assert [r["reduce_sum"] for r in rows] == [None, "host", "device"]
    for r in rows[1:]:
        assert "items: reduce" in r["plan"] and r["backend"] == "MultiEngine"
        split = r["split"]
        assert (split["reduce_sum"] > 0) == (r["reduce_sum"] == "host")
        assert split["reduce_copies"] > 0
        assert split["reduce_wait"] >= 0
        assert r["speedup"] > 0
    assert rows[1]["train_rmse_sample"] == pytest.approx(rows[2]["train_rmse_sample"], rel=1e-5)
    md = (tmp_path / "summary.md").read_text()
    assert "reduce sum / copies / wait s" in md and "300x200x3000@1" in md
    assert "(host sums)" in md and "(device sums)" in md
    for bad in (["--modes", "reduce"], ["--reduce-sum", "gpu"]):
        with pytest.raises(SystemExit):
            mod.main([str(tmp_path), *bad])
