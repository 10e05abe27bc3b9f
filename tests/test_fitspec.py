"""The fit specification (:class:`clmf.tuning.FitSpec`) and :func:`clmf.tuning.resolve`
(issue 32): the rules in one home, the estimator's parameters read once, the tuning looked up
once per device."""
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import random_ratings

import clmf
from clmf import tuning
from clmf.engine.config import KernelConfig
from clmf.tuning import spec as S


@pytest.mark.parametrize("params, mode, unknowns, width, weighted", [
    ({"factors": 8}, "explicit", 8, 8, True),
    ({"factors": 8, "biases": True}, "biased", 9, 10, True),
    ({"factors": 8, "feedback": "implicit"}, "implicit", 8, 8, False),
    ({"factors": 8, "feedback": "implicit", "weighted_regularization": True}, "implicit", 8, 8,
     True),
    ({"factors": 5, "weighted_regularization": False}, "explicit", 5, 5, False),
])
def test_spec_of_parameters(params, mode, unknowns, width, weighted):
    for source in (params, clmf.ALS(**params)):      # a dict or an estimator
        spec = tuning.FitSpec.of(source)
        assert (spec.mode, spec.unknowns, spec.width, spec.weighted) == (mode, unknowns, width,
                                                                         weighted)
        assert spec.variant == ("auto", "auto") and spec.solver is None
    biased = mode == "biased"
    assert S.unknowns(params["factors"], biased) == unknowns
    assert S.row_width(params["factors"], biased) == width
    assert S.system_row_width(unknowns, biased) == width


def test_leading_dimension_rules():
    assert [S.leading_dim(w, 4) for w in (1, 4, 5, 8, 10)] == [4, 4, 8, 8, 12]
    assert S.leading_dim(7, 0) == 7 and S.leading_dim(7, None) == 7
    a, b = KernelConfig.parse("batch+reg+vec4"), KernelConfig.parse("batch+reg+vec8")
    assert a.ldf(10) == 12 and b.ldf(10) == 16
    assert S.common_ldf([(a, a), (b, a)], 10) == 16
    spec = tuning.FitSpec.of({"factors": 8, "biases": True})        # rows 10 wide
    assert spec.ldf((a, a)) == 12 and spec.ldf([(a, a), (a, b)]) == 16


def test_confidence_rule():
    R = sp.csr_matrix(np.array([[0.0, 2.0], [4.0, 0.0]]))
    spec = tuning.FitSpec.of({"factors": 2, "feedback": "implicit", "alpha": 4.0,
                              "confidence": "alpha*r"})
    assert spec.shift == -0.25 and spec.kernel_alpha == 4.0
    K = spec.kernel_ratings(R)
    # the kernels weight by 1 + alpha·r': with r' = r − 1/alpha that is alpha·r
    assert np.allclose(1 + 4.0 * K.data, 4.0 * R.data) and K is not R
    assert np.array_equal(R.data, [2.0, 4.0])                           # the input untouched
    # the kernels' float32, each value rounded once from the float64 shift; the pattern shared
    assert K.dtype == np.float32 and np.array_equal(
        K.data, (R.data.astype(np.float64) - 0.25).astype(np.float32))
    assert np.shares_memory(K.indices, R.indices) and np.shares_memory(K.indptr, R.indptr)
    plain = tuning.FitSpec.of({"factors": 2, "feedback": "implicit", "alpha": 4.0})
    assert plain.shift == 0.0 and plain.kernel_ratings(R) is R
    assert tuning.FitSpec.of({"factors": 2, "alpha": 4.0}).kernel_alpha is None


def test_variant_pair_and_lookup_solver():
    with pytest.raises(ValueError, match="pair"):
        tuning.FitSpec.of({"variant": ("batch", "batch", "batch")})
    s = tuning.FitSpec.of({"variant": ["batch", "auto"], "regularization": 0.0})
    assert s.variant == ("batch", "auto") and s.lookup_solver == "cholesky"
    assert tuning.FitSpec.of({"regularization": 0.0, "feedback": "implicit"}).lookup_solver \
        is None
    assert tuning.FitSpec.of({"solver": "cg"}).lookup_solver == "cg"


def test_resolve_given_variants(cl_device):
    stats = {s: tuning.side_stats(np.array([3, 0, 5]), 4) for s in tuning.SIDES}
    spec = tuning.FitSpec.of({"factors": 4, "variant": ("batch", "batch:solver=cg"),
                              "storage": "float16"})
    ch = tuning.resolve(spec, cl_device, stats)
    assert ch["users"].rule == ch["items"].rule == "explicit"
    assert ch["users"].config.storage == ch["items"].config.storage == "float16"
    assert ch["items"].config.solver == "cg" and ch["users"].config.solver == "cholesky"
    with pytest.raises(clmf.InvalidConfigError, match="conflict|names solver"):
        tuning.resolve(tuning.FitSpec.of({"variant": "batch:solver=cg", "solver": "cholesky"}),
                       cl_device, stats)


def test_side_stats():
    st = tuning.side_stats(np.array([0, 2, 4]), 7)
    assert st == {"rows": 3, "cols": 7, "nnz": 6, "mean": 3.0, "max": 4}


def test_tuning_looked_up_once_per_device(cl_device, monkeypatch):
    """A fit asks the tuning lookup once per side of each device (it asked twice: before the
    memory plan and again while building the engine)."""
    from clmf.tuning import resolver as resolve_mod
    calls = []
    real = resolve_mod.choose

    def counting(*a, **k):
        calls.append(a[2])
        return real(*a, **k)
    monkeypatch.setattr(resolve_mod, "choose", counting)
    monkeypatch.setattr(tuning, "choose", counting)
    R = random_ratings(30, 20, 0.3, seed=2)
    clmf.ALS(4, iterations=1, device=cl_device, random_state=0).fit(R, show_progress=False)
    assert sorted(calls) == ["items", "users"]


# ----- the trainer apart from the estimator; one parameter protocol -------------------------------
def test_dask_estimator_names_every_parameter_and_clones():
    """clmf.dask.ALS takes explicit keywords (scikit-learn's BaseEstimator rule), with clmf.ALS's
    defaults, and sklearn.base.clone copies it."""
    import inspect
    sklearn_base = pytest.importorskip("sklearn.base")
    cdask = pytest.importorskip("clmf.dask")
    sig = inspect.signature(cdask.ALS.__init__).parameters
    assert not [p for p in sig.values() if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    base = inspect.signature(clmf.ALS.__init__).parameters
    assert {k: p.default for k, p in sig.items() if k in base} == \
        {k: p.default for k, p in base.items()}
    assert list(sig)[-2:] == ["client", "workers"]
    m = cdask.ALS(factors=5, iterations=2, biases=True, workers=["tcp://a:1"], random_state=3)
    c = sklearn_base.clone(m)
    assert type(c) is cdask.ALS and c is not m and c.get_params() == m.get_params()
    assert repr(c) == ("clmf.dask.ALS(factors=5, iterations=2, random_state=3, biases=True, "
                       "workers=['tcp://a:1'])")
    assert repr(clmf.ALS(factors=5, biases=True)) == "ALS(factors=5, biases=True)"
    with pytest.raises(ValueError, match="invalid parameter"):
        c.set_params(nope=1)


def test_estimators_share_one_parameter_protocol():
    from clmf.model.params import ParamsMixin
    cdask = pytest.importorskip("clmf.dask")
    for cls in (clmf.ALS, cdask.ALS):
        for name in ("get_params", "set_params", "__repr__", "_get_param_names"):
            assert getattr(cls, name) is getattr(ParamsMixin, name) or \
                getattr(cls, name).__func__ is getattr(ParamsMixin, name).__func__, (cls, name)


def test_trainer_returns_the_fitted_state_without_touching_the_estimator(cl_device):
    """The trainer reads the estimator's parameters once and returns the fitted attributes; the
    estimator assigns them (ALS.fit is the trainer's result assigned in one step)."""
    from clmf.model.trainer import DeviceTrainer
    R = random_ratings(30, 20, 0.3, seed=4)
    est = clmf.ALS(4, iterations=2, device=cl_device, random_state=0)
    before = dict(est.__dict__)
    new = DeviceTrainer(est).fit(R, show_progress=False, t_fit=0.0, c_fit=0.0)
    assert est.__dict__ == before
    assert {"user_factors_", "item_factors_", "history_", "config_", "timings_"} <= set(new)
    fitted = clmf.ALS(4, iterations=2, device=cl_device, random_state=0).fit(
        R, show_progress=False)
    assert np.array_equal(new["user_factors_"], fitted.user_factors_)
    assert [h.keys() for h in new["history_"]] == [h.keys() for h in fitted.history_]
