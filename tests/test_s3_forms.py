"""benchmarks/s3_forms.py: per-stage times in every mode (explicit and biased as well as
implicit)."""
from __future__ import annotations

import json

import pytest
from conftest import DEVICES, repo_script


def _script():
    """The script as a module."""
    return repo_script("benchmarks/s3_forms.py")


@pytest.mark.skipif(not any("portable" in d.platform.name.lower() for d in DEVICES),
                    reason="no PoCL device")
@pytest.mark.parametrize("mode", ["explicit", "biased", "implicit"])
def test_modes_write_stage_rows(tmp_path, mode):
    _script().main([str(tmp_path), "--data", "synthetic:300x200x6000", "--device", "portable",
                    "--factors", "8", "--mode", mode, "--rounds", "1", "--config",
                    "batch+reg:tx=4,ty=4", "batch+vec4:tx=1,ty=1,solve_wg=1,solver=fusedcg"])
    doc = json.loads((tmp_path / "s3_forms.json").read_text())
    assert doc["meta"]["mode"] == mode
    built, fused = doc["rows"]
    assert built["s1"] > 0 and built["s3"] > 0 and fused["s3"] > 0
    assert fused["s1"] == 0                       # the fused CG builds no hermitians
    assert (fused.get("gram", 0) > 0) == (mode == "implicit")     # YᵀY: implicit only
    assert (tmp_path / "s3_forms.md").read_text().startswith(f"# {mode.capitalize()} iteration")
