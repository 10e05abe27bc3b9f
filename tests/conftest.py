"""Shared fixtures: every test that takes ``cl_device`` runs once per OpenCL device visible
(PoCL and Intel's CPU runtime here; NVIDIA on the GPU machine), the way pyopencl's
``pytest_generate_tests_for_pyopencl`` does."""
from __future__ import annotations

import json
import os
import pathlib
import re
import resource
import time

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
# likewise the fused CG dimensions form's warp-shuffle entry sums (dims_shfl, PTX on NVIDIA): its
# emulation through local memory elsewhere, in the same pairwise order
os.environ.setdefault("CLMF_SHFL_EMULATION", "1")


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


# ----- test tiers ---------------------------------------------------------------------------------
# `make test` (the full tier, CI): every test not marked slow or perf, on every OpenCL device.
# `make test-fast` (`pytest --tier=fast`, the inner loop, <= 4 min on 2 cores): the tests below
# only, on one CPU device (FAST_DEVICE). An entry is a file or a test (a node id without its
# parameters); an entry that names nothing in a collected file is an error, so a renamed test
# cannot silently leave the tier.
FAST_TIER = (
    # agreement with the NumPy reference (the reference itself, then the kernels against it)
    "tests/test_reference.py",
    "tests/test_kernels_vs_reference.py",
    # the model's behaviour, every public estimator call (fit, predict, rmse, recommend,
    # similar, fold-in, save/load, pickling, errors), on one CPU device
    "tests/test_behaviour_device.py",
    # the rest of the public surface: the names clmf exports, the estimator's own contract,
    # scikit-learn's protocol, persistence, devices, evaluation, splits, the loaders' front door
    "tests/test_architecture.py::test_public_api_is_listed",
    "tests/test_model.py",
    "tests/test_sklearn_protocol.py",
    "tests/test_persistence.py",
    "tests/test_device_grammar.py",
    "tests/test_metrics.py",
    "tests/test_splits.py",
    "tests/test_datasets.py",
    "tests/test_loaders.py",
    "tests/test_frames.py",
)


def fast_device():
    """The tier's one CPU device: ``$CLMF_TEST_DEVICE`` (a part of a device id, e.g. ``intel``),
    else the first CPU device listed (else the first device)."""
    want = os.environ.get("CLMF_TEST_DEVICE", "").lower()
    if want:
        hits = [d for d in DEVICES if want in device_id(d).lower()]
        if not hits:
            raise pytest.UsageError(f"CLMF_TEST_DEVICE={want!r} matches none of "
                                    f"{[device_id(d) for d in DEVICES]}")
        return hits[0]
    import pyopencl as cl
    cpus = [d for d in DEVICES if d.type & cl.device_type.CPU]
    return (cpus or DEVICES)[0]


@pytest.fixture
def one_device():
    """One CPU device (:func:`fast_device`) for checks of host logic that runs alike on every
    device (the loop, the memory plan, the history): the kernels themselves are checked on every
    device through ``cl_device``."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    return fast_device()


def pytest_addoption(parser):
    """``--tier=fast|full`` (default full)."""
    parser.addoption("--tier", choices=("full", "fast"), default="full",
                     help="fast: the inner-loop tier (tests/conftest.py FAST_TIER) on one CPU "
                          "device; full (default): every test on every OpenCL device")


def _in_fast_tier(nodeid):
    """The FAST_TIER entry that selects ``nodeid`` (parameters ignored), or None."""
    base = nodeid.split("[", 1)[0]
    for entry in FAST_TIER:
        if base == entry or base.startswith(entry + "::"):
            return entry
    return None


# pytest-xdist (`make test`: -n 2 --dist loadscope): a test file runs whole in one worker, which
# builds its module's fixtures (a fitted model, a Dask cluster, Oclgrind's pool, the README's
# session) and compiles the kernels its tests share once; the files below, large matrices of
# independent kernel checks with no shared fixture, are dealt out test by test and fill the tail.
# (xdist's --dist loadgroup would say this with marks, but it does not group under pytest 9.2:
# pytest-dev/pytest-xdist#1386.)
PER_TEST_FILES = ("tests/test_variants.py", "tests/test_feedback.py")


def _scope(nodeid):
    """The xdist work unit of a test: its file, or itself in a PER_TEST_FILES file."""
    path = nodeid.split("::", 1)[0]
    return nodeid if path in PER_TEST_FILES else path


@pytest.hookimpl(tryfirst=True, optionalhook=True)    # optional: xdist may be absent or off
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with :func:`_scope` as the unit (largest units first)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """Whole files, except PER_TEST_FILES test by test."""

        def _split_scope(self, nodeid):
            return _scope(nodeid)

    return FileScheduling(config, log)


def _shared_fixture(item):
    """The name of a module-, class- or session-scoped fixture that ``item`` uses from its own
    test module, else None."""
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(info, "names_closure", ()):
        for fd in info.name2fixturedefs.get(name, ()):
            if fd.scope != "function" and ".py" in fd.baseid:
                return name
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A PER_TEST_FILES test must not share a module's fixture (each worker would build it).
    Under ``--tier=fast``: keep the FAST_TIER tests, and fail on an entry that names nothing
    in a file that was collected."""
    for it in items:
        if it.nodeid.split("::", 1)[0] in PER_TEST_FILES and _shared_fixture(it):
            raise pytest.UsageError(f"{it.nodeid} uses the shared fixture {_shared_fixture(it)!r}"
                                    f": tests/conftest.py PER_TEST_FILES deals its file's tests "
                                    f"out one by one")
    if config.getoption("--tier") != "fast":
        return
    used, files = set(), {it.nodeid.split("::", 1)[0] for it in items}
    keep, drop = [], []
    for it in items:
        entry = _in_fast_tier(it.nodeid)
        (keep if entry else drop).append(it)
        used.add(entry)
    stale = [e for e in FAST_TIER if e.split("::", 1)[0] in files and e not in used]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py FAST_TIER names tests that do not exist: "
                                f"{stale}")
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_generate_tests(metafunc):
    """``cl_device``: every OpenCL device (the fast tier: one CPU device)."""
    if "cl_device" in metafunc.fixturenames:
        if not DEVICES:
            metafunc.parametrize("cl_device", [pytest.param(None, marks=pytest.mark.skip(
                reason="no OpenCL device"))], ids=["no-device"])
        else:
            devs = [fast_device()] if metafunc.config.getoption("--tier") == "fast" else DEVICES
            metafunc.parametrize("cl_device", devs, ids=[device_id(d) for d in devs])


def shared_data(relpath):
    """Path of a real data file under ../shared/data: skip when missing, FAIL under CI=true."""
    p = SHARED_DATA / relpath
    if not p.exists():
        if IN_CI:
            pytest.fail(f"shared data file {p} is missing (CI=true requires it)")
        pytest.skip(f"shared data file {p} not available")
    return p


def repo_script(relpath):
    """The repository's script ``relpath`` (e.g. ``"benchmarks/side_profile.py"``) as a module,
    loaded from its file (scripts and benchmarks are not installed)."""
    import importlib.util
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def model_of(X, Y, device="auto", global_mean=0.0, **attrs):
    """An unfitted-by-fit ALS holding the factors ``X``, ``Y`` (float32), unit counts, no id
    maps, ``global_mean`` and any other fitted ``attrs``: the inference tests' model."""
    import clmf
    m = clmf.ALS(factors=X.shape[1], device=device)
    m.user_factors_, m.item_factors_ = np.asarray(X, np.float32), np.asarray(Y, np.float32)
    m.user_counts_ = np.ones(X.shape[0], np.int64)
    m.item_counts_ = np.ones(Y.shape[0], np.int64)
    m.global_mean_ = global_mean
    m.user_ids_ = m.item_ids_ = None
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


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


# ----- per-test timing (results/ci-time): CLMF_TEST_TIMES=PATH appends one JSON line per test ----
_TIMES = os.environ.get("CLMF_TEST_TIMES")


def _cpu_seconds():
    """CPU seconds of this process and its waited-for children (user + system)."""
    me, kids = (resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


if _TIMES:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        """Wall and CPU seconds of one test, its fixtures' set-up and tear-down included."""
        t0, c0 = time.perf_counter(), _cpu_seconds()
        yield
        rec = {"test": item.nodeid, "wall": round(time.perf_counter() - t0, 3),
               "cpu": round(_cpu_seconds() - c0, 3),
               "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
        with open(_TIMES, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
