"""benchmarks/scaleout.py (the 4-GPU scale-out runs) at a tiny size on the CPU devices: a forced
reduce mode on two devices records the reduce's split in its summary (a few seconds: the only
check of the script before it runs on the GPUs)."""
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
              "--modes", "replicate,reduce", "--solver", "cholesky", "--cache", str(tmp_path)])
    rows = [json.loads(x) for x in (tmp_path / "scaleout.jsonl").read_text().splitlines()]
    assert [r["devices"] for r in rows] == [1, 2] and all("error" not in r for r in rows)
    assert "items: reduce" in rows[1]["plan"] and rows[1]["backend"] == "MultiEngine"
    split = rows[1]["split"]
    assert split["reduce_sum"] > 0 and split["reduce_copies"] > 0 and split["reduce_wait"] >= 0
    md = (tmp_path / "summary.md").read_text()
    assert "reduce sum / copies / wait s" in md and "300x200x3000@1" in md
    with pytest.raises(SystemExit):
        mod.main([str(tmp_path), "--modes", "reduce"])
