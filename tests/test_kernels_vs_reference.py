"""Every kernel path agrees with the NumPy reference from the same init (core issue table):
after one iteration ‖X − X_ref‖_F / ‖X_ref‖_F ≤ 1e-4 in float32, likewise Y."""
import numpy as np
import pytest
from conftest import random_ratings, rel_err

import clmf
from clmf import reference as ref

TOL = 1e-4


def fit_one(cl_device, R, f, variant="auto", iterations=1, weighted=True, lam=0.1, seed=0):
    m, n = R.shape
    X0, Y0 = ref.start_factors(m, n, f, seed)
    # solver="cholesky": the reference solves exactly (variant="auto" may pick a tuned CG)
    model = clmf.ALS(factors=f, regularization=lam, iterations=iterations, device=cl_device,
                     variant=variant, weighted_regularization=weighted, solver="cholesky")
    model.fit(R, init=(X0, Y0), show_progress=False)
    Xr, Yr = ref.als(R, f, lam, iterations, weighted=weighted, init=(X0, Y0))
    return model, Xr, Yr


@pytest.mark.parametrize("f", [1, 3, 8, 10, 17, 32, 64, 100])
def test_factors_match_reference(cl_device, f):
    R = random_ratings(70, 45, 0.25, seed=f, empty_rows=[3, 50], empty_cols=[7])
    model, Xr, Yr = fit_one(cl_device, R, f)
    assert rel_err(model.user_factors_, Xr) <= TOL
    assert rel_err(model.item_factors_, Yr) <= TOL
    assert np.all(model.user_factors_[[3, 50]] == 0) and np.all(model.item_factors_[7] == 0)


@pytest.mark.parametrize("case", ["single_row", "single_col", "m>>n", "n>>m", "dense_row",
                                  "unweighted", "multi_batch"])
def test_edge_cases(cl_device, case):
    f, variant, kw = 10, "auto", {}
    if case == "single_row":
        R = random_ratings(1, 40, 0.8, seed=1)
    elif case == "single_col":
        R = random_ratings(40, 1, 0.8, seed=2)
    elif case == "m>>n":
        R = random_ratings(600, 6, 0.5, seed=3)
    elif case == "n>>m":
        R = random_ratings(6, 600, 0.5, seed=4)
    elif case == "dense_row":  # one row far longer than anything else (and than any batch)
        R = random_ratings(50, 400, 0.02, seed=5).tolil()
        R[0, :] = 3.0
        R = R.tocsr()
    elif case == "unweighted":
        R = random_ratings(50, 40, 0.3, seed=6)
        kw = {"weighted": False, "lam": 0.5}
    else:  # several launches per side: batches of 7 rows, odd work-group shapes
        R = random_ratings(53, 37, 0.3, seed=7, empty_rows=[0, 52])
        variant = "batch:tx=3,ty=5,solve_wg=8,batch_rows=7"
    model, Xr, Yr = fit_one(cl_device, R, f, variant, **kw)
    assert rel_err(model.user_factors_, Xr) <= TOL
    assert rel_err(model.item_factors_, Yr) <= TOL


def test_three_iterations_stay_close(cl_device):
    R = random_ratings(80, 60, 0.2, seed=11)
    model, Xr, Yr = fit_one(cl_device, R, 16, iterations=3)
    assert rel_err(model.user_factors_, Xr) <= 10 * TOL
    assert rel_err(model.item_factors_, Yr) <= 10 * TOL


def test_device_rmse_matches_host(cl_device):
    R = random_ratings(60, 50, 0.2, seed=12)
    seen = []
    model = clmf.ALS(factors=5, iterations=2, device=cl_device, random_state=0)
    model.fit(R, show_progress=False, callback=lambda it, el, mt: seen.append(mt["train_rmse"]))
    assert len(seen) == 2
    assert abs(seen[-1] - model.rmse(R)) <= 1e-5 * max(1.0, seen[-1])
