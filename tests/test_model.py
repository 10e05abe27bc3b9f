"""The ALS estimator's contract: scikit-learn conventions, input forms, bad input, persistence."""
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import IN_CI, random_ratings

import clmf
from clmf.errors import SingularSystemError


def test_init_only_stores_params_and_clone():
    sklearn_base = pytest.importorskip("sklearn.base")
    m = clmf.ALS(factors=7, regularization=0.2, iterations=3, variant="batch", random_state=1)
    assert m.get_params()["factors"] == 7
    c = sklearn_base.clone(m)
    assert c.get_params() == m.get_params() and c is not m
    assert not hasattr(c, "user_factors_")
    m.set_params(factors=9)
    assert m.factors == 9
    with pytest.raises(ValueError, match="invalid parameter"):
        m.set_params(nope=1)
    assert "factors=9" in repr(m)


# fit, input forms, reproducibility, predict, pickling, not-fitted errors and the bad input every
# backend refuses (dense, empty, NaN, negative ids; factors, regularization, iterations) on every
# device: tests/behaviour.py (tests/test_behaviour_device.py), shared with the other backends


# ----- bad input: clear errors before any device work -------------------------------------------
R0 = random_ratings(10, 8, 0.4, seed=6)


@pytest.mark.parametrize("X, exc, msg", [
    (sp.csr_matrix(np.array([[np.inf, 1.0], [2.0, 3.0]])), ValueError, "NaN/inf"),
    ((np.array([0, 1.5]), np.array([0, 1]), np.array([1.0, 2.0])), ValueError, "integers"),
    ((np.array([0, 1]), np.array([0]), np.array([1.0, 2.0])), ValueError, "lengths differ"),
    ((np.array([0, 0, 1]), np.array([1, 1, 0]), np.array([1.0, 2.0, 3.0])), ValueError,
     "1 duplicate"),
    ("ratings.csv", TypeError, "scipy.sparse"),
])
def test_bad_ratings(X, exc, msg):
    with pytest.raises(exc, match=msg):
        clmf.ALS(2, iterations=1).fit(X, show_progress=False)


def test_duplicates_in_coo_counted():
    C = sp.coo_matrix((np.ones(4), (np.array([0, 0, 1, 1]), np.array([0, 0, 1, 1]))), shape=(2, 2))
    with pytest.raises(ValueError, match="2 duplicate"):
        clmf.ALS(2, iterations=1).fit(C, show_progress=False)


@pytest.mark.parametrize("params, msg", [
    (dict(factors=2.5), "factors"),
    (dict(solver="lu"), "solver"), (dict(dtype=np.float64), "float32"),
    (dict(storage="int8"), "storage"),
])
def test_bad_params(params, msg):
    with pytest.raises(ValueError, match=msg):
        clmf.ALS(**params).fit(R0, show_progress=False)


def test_unknown_variant_and_device():
    with pytest.raises(ValueError, match="unknown variant"):
        clmf.ALS(2, iterations=1, variant="fast").fit(R0, show_progress=False)
    with pytest.raises(clmf.NoOpenCLError, match="no OpenCL device matches"):
        clmf.ALS(2, iterations=1, device="no-such-device-xyz").fit(R0, show_progress=False)


def test_bad_init_shape():
    with pytest.raises(ValueError, match="init shapes"):
        clmf.ALS(2, iterations=1).fit(R0, init=(np.zeros((3, 2)), np.zeros((8, 2))),
                                      show_progress=False)


def test_singular_lambda_zero_is_clear():
    R = random_ratings(10, 12, 0.2, seed=8)
    with pytest.raises(SingularSystemError, match="fewer ratings than factors"):
        clmf.ALS(factors=8, regularization=0.0, iterations=1).fit(R, show_progress=False)


def test_singular_detected_on_device(cl_device):
    # λ = 0 and every row has ≥ f ratings, but two items are identical copies: rank-deficient
    # user systems that the host-side count check cannot see; the device must report, not NaN.
    rng = np.random.default_rng(0)
    D = rng.integers(1, 6, size=(12, 6)).astype(np.float32)
    R = sp.csr_matrix(D)
    Y0 = np.ones((6, 3), np.float32)   # all item factors equal → Σ y yᵀ has rank 1 < 3
    X0 = np.ones((12, 3), np.float32)
    with pytest.raises(SingularSystemError, match="not positive definite"):
        clmf.ALS(factors=3, regularization=0.0, iterations=1, device=cl_device).fit(
            R, init=(X0, Y0), show_progress=False)


def test_no_opencl_platform_message(tmp_path):
    env = dict(os.environ, OCL_ICD_VENDORS=str(tmp_path), CLMF_DEVICE="")
    code = ("import clmf\ntry:\n    clmf.devices()\n"
            "except clmf.NoOpenCLError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert "ERR" in out.stdout and "pocl-opencl-icd" in out.stdout


def test_devices_listed_and_ci_platforms():
    infos = clmf.devices()
    assert infos and all(d.compute_units >= 1 and d.max_work_group_size >= 1 for d in infos)
    plats = " ".join(d.platform for d in infos)
    if IN_CI:
        assert "Portable Computing Language" in plats, "PoCL must be present under CI"
        assert "Intel(R) OpenCL" in plats, "Intel's CPU OpenCL runtime must be present under CI"


def test_select_device_grammar():
    from clmf.engine.device import select_device
    infos = clmf.devices()
    d0 = select_device(infos[0].index)
    assert d0.name.strip() == infos[0].name
    if any(d.type == "CPU" for d in infos):
        assert select_device("cpu").type & 2  # CL_DEVICE_TYPE_CPU
    if any(d.type == "GPU" for d in infos):
        assert select_device("gpu").type & 4  # CL_DEVICE_TYPE_GPU
    word = infos[-1].platform[:6]
    assert select_device(word).platform.name.strip().startswith(word)
    os.environ["CLMF_DEVICE"] = infos[-1].index
    try:
        assert select_device("auto").int_ptr == select_device(infos[-1].index).int_ptr
    finally:
        del os.environ["CLMF_DEVICE"]


def test_installed_package_is_tested():
    if os.environ.get("CLMF_TEST_INSTALLED") == "1":
        assert "site-packages" in clmf.__file__, clmf.__file__
        from clmf.engine import kernels
        assert "clmf" in kernels.render_als(clmf.KernelConfig(), 4)


def test_validation_rmse_matches_rmse_with_unknown_rows(cl_device):
    R = random_ratings(30, 25, 0.3, seed=21, empty_rows=[4], empty_cols=[6])
    V = random_ratings(30, 25, 0.1, seed=22)   # includes user 4 / item 6, unseen in training
    C = V.tocoo()
    assert np.any(C.row == 4) or np.any(C.col == 6)
    m = clmf.ALS(4, iterations=2, device=cl_device, random_state=0)
    m.fit(R, validation=V, show_progress=False)
    assert m.history_[-1]["validation_rmse"] == pytest.approx(m.rmse(V), rel=1e-5)


def test_early_stopping_keeps_best_iteration(one_device):
    # tiny λ and many factors on few ratings: validation RMSE rises after the first iterations
    R = random_ratings(40, 30, 0.25, seed=23)
    V = random_ratings(40, 30, 0.1, seed=24)
    V = V - V.multiply(R.astype(bool))   # disjoint from training
    V.eliminate_zeros()
    seen = []
    m = clmf.ALS(12, regularization=0.001, iterations=30, device=one_device, random_state=0,
                 solver="cholesky")     # exact solves: the overfitting this test relies on
    m.fit(R, validation=V, early_stopping_rounds=2, show_progress=False,
          callback=lambda it, el, mt: seen.append(mt["validation_rmse"]))
    best = int(np.argmin(seen))
    assert m.best_iteration_ == best
    assert len(seen) <= best + 1 + 2 and len(seen) < 30
    assert m.rmse(V) == pytest.approx(seen[best], rel=1e-5)


def test_device_memory_error_before_allocating(one_device, monkeypatch):
    import dataclasses

    from clmf.engine import core as engine
    real = engine.device_info

    def tiny(dev, index="?"):
        return dataclasses.replace(real(dev, index), global_mem=64 * 1024, max_alloc=16 * 1024)

    monkeypatch.setattr(engine, "device_info", tiny)
    R = random_ratings(200, 150, 0.3, seed=30)
    # the factors (51 KB a side) cannot fit a 16 KB allocation
    with pytest.raises(clmf.DeviceMemoryError, match="device memory|largest allocation"):
        clmf.ALS(64, iterations=1, device=one_device).fit(R, show_progress=False)
    # the ratings (72 KB) do not fit beside the factors: the one device streams them
    m = clmf.ALS(16, iterations=1, device=one_device).fit(R, show_progress=False)
    assert m.memory_["streamed"] == [["users", "items"]] and m.memory_["total"] <= 64 * 1024


def test_scratch_is_bounded_by_batch(cl_device):
    from clmf.engine import Engine
    from clmf.engine.config import KernelConfig
    R = random_ratings(300, 40, 0.2, seed=31)
    cfg = KernelConfig.parse("batch:batch_rows=16")
    eng = Engine(cl_device, R, 12, (cfg, cfg))
    try:
        assert eng.batch_rows == {"users": 16, "items": 16}
        assert eng.memory["scratch_users"] == 16 * 4 * (12 * 12 + 12)   # O(batch·f²), not O(m·f²)
    finally:
        eng.release()


# ----- small things a newcomer meets (issue 34, item 9) -----------------------------------------
def test_repr_names_dtypes():
    assert repr(clmf.ALS()) == "ALS()"
    assert repr(clmf.ALS(dtype="float32")) == "ALS()"               # the default, by name too
    assert repr(clmf.ALS(factors=8, dtype=np.float16)) == "ALS(factors=8, dtype='float16')"


def test_history_has_train_rmse_without_a_progress_bar(one_device):
    """Quiet fits record the fitted model's training RMSE (the last iteration's: one pass);
    train_metrics=True records every iteration's, equal to what a callback is shown;
    train_metrics=False none."""
    R = random_ratings(30, 20, 0.3, seed=7)
    m = clmf.ALS(3, iterations=3, device=one_device, random_state=0).fit(R, show_progress=False)
    assert [sorted(h) for h in m.history_] == [["seconds"]] * 2 + [["seconds", "train_rmse"]]
    every = clmf.ALS(3, iterations=3, device=one_device, random_state=0).fit(
        R, show_progress=False, train_metrics=True)
    assert [sorted(h) for h in every.history_] == [["seconds", "train_rmse"]] * 3
    shown = []
    clmf.ALS(3, iterations=3, device=one_device, random_state=0).fit(
        R, show_progress=False, callback=lambda it, t, mt: shown.append(mt["train_rmse"]))
    assert [h["train_rmse"] for h in every.history_] == pytest.approx(shown, rel=1e-6)
    assert m.history_[-1]["train_rmse"] == pytest.approx(shown[-1], rel=1e-6)
    none = clmf.ALS(3, iterations=3, device=one_device, random_state=0).fit(
        R, show_progress=False, train_metrics=False)
    assert [sorted(h) for h in none.history_] == [["seconds"]] * 3
    with pytest.raises(ValueError, match="train_metrics"):
        clmf.ALS(3, iterations=1, device=one_device).fit(R, train_metrics="yes")


class _Steps:
    """A backend of :func:`clmf.model.loop.run` without a device: fixed factors and metrics."""

    def __init__(self):
        from clmf.model import loop
        self._base = loop.FitSteps(self)

    def __getattr__(self, name):
        return getattr(self._base, name)

    def iterate(self, it):
        pass

    def metrics(self):
        return {"train_rmse": 1.0}

    def get_factors(self, side, with_biases=False):
        return np.ones((2, 2), np.float32), np.zeros(2, np.float32)


def test_progress_bar_counts_each_iteration(monkeypatch):
    """The bar shows k/n after k iterations (it stayed at 0/n while its postfix moved)."""
    import tqdm.auto

    from clmf.model import loop
    bars = []

    class Recorded(tqdm.auto.tqdm):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            bars.append(self)
    monkeypatch.setattr(tqdm.auto, "tqdm", Recorded)
    seen = []
    loop.run(_Steps(), 4, show_progress=True,
             callback=lambda it, t, mt: seen.append((bars[0].n, bars[0].total, bars[0].postfix)))
    assert [(n, total) for n, total, _ in seen] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all("train_rmse=1.0000" in p for _, _, p in seen)


def test_package_ships_py_typed():
    import importlib.resources
    assert importlib.resources.files("clmf").joinpath("py.typed").is_file()
