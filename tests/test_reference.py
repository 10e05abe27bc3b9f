"""The reference is checked against numpy.linalg.lstsq on the regularised least-squares problem,
so it is not only checked against itself."""
import numpy as np
import pytest
from conftest import random_ratings, rel_err

from clmf import reference as ref
from clmf.errors import SingularSystemError


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("f", [1, 3, 8])
def test_half_step_matches_lstsq_per_row(f, weighted):
    R = random_ratings(30, 20, 0.3, seed=f, empty_rows=[4])
    Y = np.random.default_rng(1).normal(size=(20, f))
    lam = 0.3
    X = ref.half_step(R, Y, lam, weighted)
    for u in range(R.shape[0]):
        cols = R.indices[R.indptr[u]:R.indptr[u + 1]]
        r = R.data[R.indptr[u]:R.indptr[u + 1]]
        if cols.size == 0:
            assert np.all(X[u] == 0)
            continue
        reg = lam * (cols.size if weighted else 1.0)
        # min ||Y_I x - r||² + reg ||x||²  ==  lstsq on the stacked system [Y_I; sqrt(reg) I]
        Aaug = np.vstack([Y[cols], np.sqrt(reg) * np.eye(f)])
        baug = np.concatenate([r, np.zeros(f)])
        x_ls = np.linalg.lstsq(Aaug, baug, rcond=None)[0]
        assert rel_err(X[u], x_ls) < 1e-9


def test_als_decreases_objective():
    R = random_ratings(40, 30, 0.3, seed=3)
    losses = []

    def cb(it, X, Y):
        C = R.tocoo()
        err = ref.predict(X, Y, C.row, C.col) - C.data
        n_u = np.diff(R.indptr)
        n_i = np.bincount(R.indices, minlength=R.shape[1])
        losses.append(np.sum(err ** 2) + 0.1 * (np.sum(n_u * (X ** 2).sum(1))
                                                + np.sum(n_i * (Y ** 2).sum(1))))

    ref.als(R, 4, 0.1, 6, random_state=0, callback=cb)
    assert all(b <= a * (1 + 1e-12) for a, b in zip(losses, losses[1:]))


def test_singular_system_reported():
    R = random_ratings(10, 10, 0.3, seed=5)
    Y = np.ones((10, 6))
    with pytest.raises(SingularSystemError, match="not positive definite"):
        ref.half_step(R, Y, 0.0)


def test_cg_reference_converges_to_solve():
    rng = np.random.default_rng(0)
    M = rng.normal(size=(5, 6, 6))
    A = M @ np.swapaxes(M, 1, 2) + 6 * np.eye(6)
    b = rng.normal(size=(5, 6))
    x = ref.cg_solve(A, b, np.zeros((5, 6)), 6)
    assert rel_err(x, np.linalg.solve(A, b[..., None])[..., 0]) < 1e-8


def test_start_factors_seeded():
    a = ref.start_factors(5, 4, 3, 7)
    b = ref.start_factors(5, 4, 3, 7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert a[0].dtype == np.float32 and a[0].shape == (5, 3) and a[1].shape == (4, 3)
