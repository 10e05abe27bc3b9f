"""Shared fixtures: every test that takes ``cl_device`` runs once per OpenCL device visible
(PoCL and Intel's CPU runtime here; NVIDIA on the GPU machine), the way pyopencl's
``pytest_generate_tests_for_pyopencl`` does."""
from __future__ import annotations

import os
import pathlib
import re

import numpy as np
import pytest
import scipy.sparse as sp

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
IN_CI = os.environ.get("CI", "").lower() == "true"
# the tensor-core (mma) S1 variant runs as its emulation on devices without tensor cores, so the
# shared variant checks (reference, Oclgrind) cover its staging, guards and reductions there; the
# tuning lookup never picks it on such devices (tests/test_mma.py checks both)
os.environ.setdefault("CLMF_MMA_EMULATION", "1")


def _list_devices():
    try:
        import pyopencl as cl
        out = []
        for p in cl.get_platforms():
            if "oclgrind" in p.name.lower():
                continue  # the simulator is for the race tests only
            for d in p.get_devices():
                out.append(d)
        return out
    except Exception:  # no OpenCL at all: device tests are reported, not silently passed
        return []


DEVICES = _list_devices()


def device_id(d):
    """A device's test id: its platform's short name and its name."""
    from clmf.engine.device import platform_short
    return f"{platform_short(d.platform.name)}-{re.sub(r'[^A-Za-z0-9]+', '_', d.name.strip())[:24]}"


def pytest_generate_tests(metafunc):
    if "cl_device" in metafunc.fixturenames:
        if not DEVICES:
            metafunc.parametrize("cl_device", [pytest.param(None, marks=pytest.mark.skip(
                reason="no OpenCL device"))], ids=["no-device"])
        else:
            metafunc.parametrize("cl_device", DEVICES, ids=[device_id(d) for d in DEVICES])


def shared_data(relpath):
    """Path of a real data file under ../shared/data: skip when missing, FAIL under CI=true."""
    p = SHARED_DATA / relpath
    if not p.exists():
        if IN_CI:
            pytest.fail(f"shared data file {p} is missing (CI=true requires it)")
        pytest.skip(f"shared data file {p} not available")
    return p


def random_ratings(m, n, density=0.2, seed=0, empty_rows=(), empty_cols=()):
    """A random explicit-ratings CSR in 1..5 with chosen empty rows/columns."""
    rng = np.random.default_rng(seed)
    mask = rng.random((m, n)) < density
    for r in empty_rows:
        mask[r, :] = False
    for c in empty_cols:
        mask[:, c] = False
    rows, cols = np.nonzero(mask)
    vals = rng.integers(1, 6, size=rows.size).astype(np.float32)
    return sp.csr_matrix((vals, (rows, cols)), shape=(m, n))


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (nb if nb > 0 else 1.0))


@pytest.fixture(autouse=True, scope="session")
def _clmf_cache_dir(tmp_path_factory):
    """clmf's on-disk caches (tuning indexes, probe verdicts) in a per-session directory, not
    the user's."""
    old = os.environ.get("CLMF_CACHE_DIR")
    os.environ["CLMF_CACHE_DIR"] = str(tmp_path_factory.mktemp("clmf-cache"))
    yield
    if old is None:
        os.environ.pop("CLMF_CACHE_DIR", None)
    else:
        os.environ["CLMF_CACHE_DIR"] = old
