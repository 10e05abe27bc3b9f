"""Pure NumPy/SciPy reference ALS: the ground truth for tests and the tuner.

The maths is identical to the OpenCL path. For one half-step solving the users' factors ``X``
from fixed item factors ``Y`` and a user × item rating matrix ``R`` (CSR)::

    A_u = Σ_{i ∈ I_u} y_i y_iᵀ + λ · n_u · I      (weighted-λ, ALS-WR / cuMF)
    A_u = Σ_{i ∈ I_u} y_i y_iᵀ + λ · I            (``weighted=False``)
    b_u = Σ_{i ∈ I_u} r_ui y_i
    x_u = A_u⁻¹ b_u          (x_u = 0 for a user with no ratings)

The item half-step is the same with ``R.T`` and the roles swapped. Everything is vectorised:
the hermitians of a chunk of rows are one sparse × dense product of the binary pattern with the
table of per-item outer products, the systems are solved by batched Cholesky. Memory stays bounded
by processing rows in chunks.
"""
from __future__ import annotations

import logging

import numpy as np
import scipy.sparse as sp

from .errors import SingularSystemError

log = logging.getLogger(__name__)

__all__ = [
    "START_RULES", "default_init", "start_rule", "initial_factors", "start_factors", "hermitians",
    "right_hand_sides", "solve_cholesky", "cg_solve", "half_step", "als", "predict", "rmse",
]

_CHUNK_BYTES = 64 << 20
_DRAW_THREADS = 8          # threads drawing a large start (each from its point of the stream)
_DRAW_PARALLEL_FROM = 1 << 22   # values from which the draw is split
_STEPS_PER_VALUE = {"uniform": 1.0, "implicit": 0.5}   # 64-bit outputs a draw consumes


def _uniform_start(rng, rows, factors):
    """U[0, 1) / sqrt(f) in float64: a dot product of two start rows is about 1/4."""
    return rng.random((rows, factors), dtype=np.float64) / np.sqrt(factors)


def _implicit_start(rng, rows, factors):
    """0.01 · U[0, 1) drawn in float32: the `implicit` library's start, value for value (its
    ``AlternatingLeastSquares(random_state=s)`` draws users then items from
    ``numpy.random.default_rng(s)`` so; clmf's ``random_state=s`` gives the same factors)."""
    return rng.random((rows, factors), dtype=np.float32) * np.float32(0.01)


# start rules: name → draw(generator, rows, factors); from "implicit", implicit-feedback ALS ranks
# as implicit's does (ML-100K precision@10 about 3% above the uniform start's,
# tests/test_implicit_interop.py)
START_RULES = {"uniform": _uniform_start, "implicit": _implicit_start}


def default_init(feedback="explicit"):
    """The start rule a fit uses by default: ``"implicit"`` for implicit feedback (the
    `implicit` library's start), ``"uniform"`` otherwise."""
    return "implicit" if feedback == "implicit" else "uniform"


def start_rule(init):
    """The drawing function of the start rule ``init`` (checked)."""
    if not isinstance(init, str) or init not in START_RULES:
        raise ValueError(f"init must be one of {sorted(START_RULES)} or a pair (X0, Y0), not "
                         f"{init!r}")
    return START_RULES[init]


def initial_factors(n_rows, factors, random_state=None, dtype=np.float32, out=None,
                    init="uniform"):
    """Random start factors, the same in the OpenCL path and the reference.

    ``U[0, 1)`` draws scaled by the start rule ``init`` (:data:`START_RULES`): ``"uniform"``
    divides by ``sqrt(factors)``, so a dot product starts near 1/4; ``"implicit"`` multiplies
    float32 draws by 0.01, exactly as the `implicit` library does.

    Parameters
    ----------
    n_rows, factors : int
    random_state : None, int or numpy.random.Generator
    dtype : numpy dtype of the result
    out : optional array of that shape and dtype to fill and return, of any strides (memory of
        the caller's choice, e.g. the factor columns of a device's padded rows)
    init : {"uniform", "implicit"}, default "uniform"

    Returns
    -------
    numpy.ndarray of shape (n_rows, factors)

    Examples
    --------
    >>> initial_factors(3, 2, random_state=0).shape
    (3, 2)
    >>> float(initial_factors(1000, 4, random_state=0, init="implicit").max()) < 0.01
    True
    """
    rng = np.random.default_rng(random_state)
    rule = start_rule(init)
    out = np.empty((n_rows, factors), dtype=dtype) if out is None else out
    spans = _draw_spans(rng, n_rows, factors, init)
    if spans is None:
        _draw_rows(rule, rng, out, 0, n_rows, factors)
        return out
    # the same numbers as one draw: each thread draws its rows from a copy of the generator
    # advanced to their place in the stream (PCG64's jump ahead), then the caller's generator
    # is advanced past them all, as one draw would have left it
    import concurrent.futures
    bg, per = rng.bit_generator, _STEPS_PER_VALUE[init]
    state = bg.state

    def part(r0, r1):
        """Rows r0..r1 from their point of the stream."""
        g = np.random.PCG64()
        g.state = state
        g.advance(int(r0 * factors * per))
        _draw_rows(rule, np.random.Generator(g), out, r0, r1, factors)
    with concurrent.futures.ThreadPoolExecutor(len(spans)) as pool:
        list(pool.map(lambda sp_: part(*sp_), spans))
    bg.advance(int(n_rows * factors * per))
    return out


def _draw_rows(rule, rng, out, r0, r1, factors):
    """Rows ``r0..r1`` of ``out`` drawn by ``rule`` from ``rng``, in chunks of rows (the same
    stream as one draw): no float64 copy of the whole matrix."""
    step = max(1, _CHUNK_BYTES // (8 * max(factors, 1)))
    for a in range(r0, r1, step):
        b = min(r1, a + step)
        out[a:b] = rule(rng, b - a, factors)


def _draw_spans(rng, n_rows, factors, init):
    """Row spans ``[(r0, r1), ...]`` for a draw split over threads, or None (a small draw, one
    core, or a generator whose jump ahead is not exactly one draw's: only NumPy's default
    PCG64 with no half-used 64-bit output, and for float32 draws (two per output) spans of an
    even count of values)."""
    import os
    bg = rng.bit_generator
    n = n_rows * factors
    threads = min(_DRAW_THREADS, os.cpu_count() or 1)
    if (n < _DRAW_PARALLEL_FROM or threads < 2 or type(bg) is not np.random.PCG64
            or bg.state.get("has_uint32", 0)):
        return None
    per = _STEPS_PER_VALUE[init]
    if per != 1.0 and n % 2:
        return None
    grain = 1 if per == 1.0 or factors % 2 == 0 else 2     # rows whose values start even
    step = -(-n_rows // threads)
    step = -(-step // grain) * grain
    return [(r0, min(n_rows, r0 + step)) for r0 in range(0, n_rows, step)]


def start_factors(n_users, n_items, factors, random_state=None, dtype=np.float32, empty=None,
                  init="uniform"):
    """The (X0, Y0) start of a fit: :func:`initial_factors` under the start rule ``init`` for
    users then items, one generator; ``empty(shape, dtype)`` allocates the arrays (default
    ``np.empty``)."""
    start_rule(init)                              # a bad rule fails before any allocation
    rng = np.random.default_rng(random_state)
    empty = empty or np.empty
    return tuple(initial_factors(rows, factors, rng, dtype, out=empty((rows, factors), dtype),
                                 init=init)
                 for rows in (n_users, n_items))


def _as_csr(R):
    R = sp.csr_matrix(R)
    R.sum_duplicates()
    return R


def hermitians(R, Y, regularization, weighted=True, rows=None, dtype=np.float64,
               implicit_alpha=None):
    """Return ``A[k] = Σ_{i∈I_r} y_i y_iᵀ + λ·(n_r or 1)·I`` for the rows ``r`` in ``rows``.

    Parameters
    ----------
    R : scipy.sparse matrix (rows × cols); only its pattern is used
    Y : ndarray (cols × f)
    regularization : float λ ≥ 0
    weighted : bool, weighted-λ (λ·n_r) or plain λ
    rows : slice or index array of rows (default: all)

    Returns
    -------
    ndarray (len(rows), f, f)
    """
    R = _as_csr(R)
    if rows is not None:
        R = R[rows]
    f = Y.shape[1]
    Y = np.asarray(Y, dtype=dtype)
    P = R.copy().astype(dtype)
    if implicit_alpha is None:
        P.data = np.ones_like(P.data, dtype=dtype)
    else:   # implicit feedback: Σ (c − 1) y yᵀ with c = 1 + α r, plus YᵀY for every row
        P.data = implicit_alpha * P.data
    counts = np.diff(R.indptr)
    out = np.empty((R.shape[0], f, f), dtype=dtype)
    # Outer-product table per column, computed in column chunks to bound memory.
    col_chunk = max(1, _CHUNK_BYTES // max(1, 8 * f * f))
    out[:] = 0
    for c0 in range(0, Y.shape[0], col_chunk):
        c1 = min(Y.shape[0], c0 + col_chunk)
        Z = np.einsum("ij,ik->ijk", Y[c0:c1], Y[c0:c1]).reshape(c1 - c0, f * f)
        out += (P[:, c0:c1] @ Z).reshape(-1, f, f)
    if implicit_alpha is not None:
        out += (Y.T @ Y)[None]
    diag = regularization * (counts if weighted else np.ones_like(counts))
    idx = np.arange(f)
    out[:, idx, idx] += diag[:, None].astype(dtype)
    return out


def right_hand_sides(R, Y, rows=None, dtype=np.float64, implicit_alpha=None):
    """Return ``b[r] = Σ_i r_ri y_i`` (rows × f); implicit: ``Σ_i (1 + α r_ri) y_i``."""
    R = _as_csr(R)
    if rows is not None:
        R = R[rows]
    R = R.astype(dtype)
    if implicit_alpha is not None:
        R.data = 1.0 + implicit_alpha * R.data
    return np.asarray(R @ np.asarray(Y, dtype=dtype))


def solve_cholesky(A, b, row_ids=None):
    """Solve the batch ``A[k] x[k] = b[k]`` by Cholesky; raise :class:`SingularSystemError` naming
    the first row whose system is not positive definite."""
    try:
        L = np.linalg.cholesky(A)
    except np.linalg.LinAlgError:
        bad = [k for k in range(A.shape[0]) if not _is_pd(A[k])]
        first = bad[0] if row_ids is None else int(np.asarray(row_ids)[bad[0]])
        raise SingularSystemError(
            f"{len(bad)} normal-equation system(s) are not positive definite (first: row "
            f"{first}); use regularization > 0") from None
    z = np.linalg.solve(L, b[..., None])
    return np.linalg.solve(np.swapaxes(L, -1, -2), z)[..., 0]


def _is_pd(a):
    try:
        np.linalg.cholesky(a)
        return True
    except np.linalg.LinAlgError:
        return False


def cg_solve(A, b, x0, steps):
    """Batched conjugate gradient: ``steps`` iterations from ``x0`` (cuMF's warm-started solver).

    Stops a system early when its residual is exactly zero. Returns the iterate after ``steps``.
    """
    A = np.asarray(A, dtype=np.float64)
    x = np.array(x0, dtype=np.float64, copy=True)
    r = b - np.einsum("kij,kj->ki", A, x)
    p = r.copy()
    rs = np.einsum("ki,ki->k", r, r)
    for _ in range(steps):
        Ap = np.einsum("kij,kj->ki", A, p)
        pAp = np.einsum("ki,ki->k", p, Ap)
        active = (rs > 0) & (pAp > 0)
        alpha = np.where(active, rs / np.where(active, pAp, 1.0), 0.0)
        x += alpha[:, None] * p
        r -= alpha[:, None] * Ap
        rs_new = np.einsum("ki,ki->k", r, r)
        beta = np.where(active, rs_new / np.where(rs > 0, rs, 1.0), 0.0)
        p = r + beta[:, None] * p
        rs = rs_new
    return x


def half_step(R, Y, regularization, weighted=True, solver="cholesky", X0=None, cg_steps=3,
              dtype=np.float64, implicit_alpha=None):
    """One ALS half-step: solve every row of ``R`` for its factors given ``Y``.

    Rows with no stored entries get zero factors. Returns an ndarray (rows × f) of ``dtype``.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> R = sp.csr_matrix(np.array([[5.0, 0, 3], [0, 4, 0]]))
    >>> Y = np.eye(3)[:, :2] + 0.5
    >>> half_step(R, Y, 0.1).shape
    (2, 2)
    """
    R = _as_csr(R)
    m, f = R.shape[0], Y.shape[1]
    counts = np.diff(R.indptr)
    X = np.zeros((m, f), dtype=dtype)
    chunk = max(1, _CHUNK_BYTES // max(1, 8 * f * f))
    for r0 in range(0, m, chunk):
        r1 = min(m, r0 + chunk)
        nz = np.nonzero(counts[r0:r1])[0]
        if nz.size == 0:
            continue
        rows = r0 + nz
        A = hermitians(R, Y, regularization, weighted, rows=rows, implicit_alpha=implicit_alpha)
        b = right_hand_sides(R, Y, rows=rows, implicit_alpha=implicit_alpha)
        if solver == "cholesky":
            X[rows] = solve_cholesky(A, b, row_ids=rows)
        elif solver in ("cg", "fusedcg"):     # the same CG; fused only applies A differently
            start = np.zeros((rows.size, f)) if X0 is None else np.asarray(X0, np.float64)[rows]
            X[rows] = cg_solve(A, b, start, cg_steps)
        else:
            raise ValueError(f"unknown solver {solver!r}")
    return X


def als(R, factors, regularization, iterations, weighted=True, init=None, random_state=None,
        solver="cholesky", cg_steps=3, callback=None, implicit_alpha=None):
    """Reference ALS: users first, then items, ``iterations`` times.

    Parameters
    ----------
    R : scipy.sparse matrix (users × items) of explicit ratings
    factors, regularization, iterations, weighted : as in :class:`clmf.ALS`
    init : optional (X0, Y0) start factors, or a start rule (:data:`START_RULES`); by default the
        fit's (:func:`default_init`: ``"implicit"`` with ``implicit_alpha``, else ``"uniform"``)
        drawn with ``random_state``
    callback : optional ``callback(iteration, X, Y)``

    Returns
    -------
    (X, Y) float64 arrays

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> R = sp.random(20, 15, density=0.3, random_state=0, format="csr") * 4 + 1
    >>> X, Y = als(R, 3, 0.1, 2, random_state=0)
    >>> X.shape, Y.shape
    ((20, 3), (15, 3))
    """
    R = _as_csr(R)
    m, n = R.shape
    if init is None or isinstance(init, str):
        rule = init or default_init("implicit" if implicit_alpha is not None else "explicit")
        X, Y = (a.astype(np.float64) for a in start_factors(m, n, factors, random_state,
                                                            init=rule))
    else:
        X, Y = (np.asarray(a, dtype=np.float64).copy() for a in init)
    RT = R.T.tocsr()
    for it in range(iterations):
        X = half_step(R, Y, regularization, weighted, solver, X0=X, cg_steps=cg_steps,
                      implicit_alpha=implicit_alpha)
        Y = half_step(RT, X, regularization, weighted, solver, X0=Y, cg_steps=cg_steps,
                      implicit_alpha=implicit_alpha)
        if callback is not None:
            callback(it, X, Y)
    return X, Y


def predict(X, Y, users, items):
    """Element-wise predictions ``X[u]·Y[i]``."""
    users = np.asarray(users)
    items = np.asarray(items)
    return np.einsum("ij,ij->i", np.asarray(X)[users], np.asarray(Y)[items])


def rmse(X, Y, R_test):
    """Root-mean-square error of ``X·Yᵀ`` on the stored entries of ``R_test``."""
    C = sp.coo_matrix(R_test)
    err = predict(X, Y, C.row, C.col) - C.data
    return float(np.sqrt(np.mean(err * err)))


def als_biased(R, factors, regularization, iterations, weighted=True, init=None,
               random_state=None, solver="cholesky", cg_steps=3):
    """Reference biased MF by ALS: ``r̂ = μ + b_u + b_i + x_uᵀy_i``.

    Each half-step solves the augmented unknowns ``[x_u, b_u]`` against the features ``[y_i, 1]``
    and the targets ``r_ui − μ − b_i`` (biases regularised like the factors). Start biases are 0.

    Returns
    -------
    (X, Y, user_biases, item_biases, mu)
    """
    R = _as_csr(R)
    m, n = R.shape
    mu = float(R.data.mean())
    if init is None:
        X, Y = (a.astype(np.float64) for a in start_factors(m, n, factors, random_state))
    else:
        X, Y = (np.asarray(a, dtype=np.float64).copy() for a in init)
    bu, bi = np.zeros(m), np.zeros(n)
    RT = R.T.tocsr()
    for _ in range(iterations):
        T = R.copy().astype(np.float64)
        T.data = T.data - mu - bi[T.indices]
        Z = half_step(T, np.hstack([Y, np.ones((n, 1))]), regularization, weighted, solver,
                      X0=np.hstack([X, bu[:, None]]), cg_steps=cg_steps)
        X, bu = Z[:, :-1], Z[:, -1]
        T = RT.copy().astype(np.float64)
        T.data = T.data - mu - bu[T.indices]
        Z = half_step(T, np.hstack([X, np.ones((m, 1))]), regularization, weighted, solver,
                      X0=np.hstack([Y, bi[:, None]]), cg_steps=cg_steps)
        Y, bi = Z[:, :-1], Z[:, -1]
    return X, Y, bu, bi, mu
