"""Checking and converting user input (ratings, ids, parameters) before any device work."""
from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp

from .scan import csr_is_canonical, value_range

__all__ = ["check_ratings", "check_index_pairs", "check_params", "check_shape_vs_ratings",
           "check_strengths", "check_memory_cap", "check_sparse_structure", "overflow_limit",
           "precision_limit", "check_float32_range", "SPARSE_ROWS_FLOOR",
           "SPARSE_ROWS_PER_RATING"]

# ids that imply a matrix vastly larger than its ratings are refused before anything is sized by
# them (the CSR's row pointers, the factors): more than SPARSE_ROWS_FLOOR rows (or columns) and
# more than SPARSE_ROWS_PER_RATING of them per stored rating
SPARSE_ROWS_FLOOR = 1 << 21
SPARSE_ROWS_PER_RATING = 32
_F32_MAX = float(np.finfo(np.float32).max)
_F16_MAX = float(np.finfo(np.float16).max)


def overflow_limit(f, max_count, storage="float32"):
    """Largest |rating| whose ALS normal equations stay inside the float32 range (``storage=
    "float16"``: whose factors stay inside float16's) at ``f`` factors and ``max_count`` ratings
    per user/item, with a safety margin. From the first half-step's scale: start factors of
    norm ≈ 1/√3 give factors ≈ r·√f, whose hermitians hold ≈ count·f·r² (float32), and which a
    float16 store holds only below 65504."""
    f, c = max(int(f), 1), max(int(max_count), 1)
    if storage == "float16":
        return _F16_MAX / (2.0 * np.sqrt(f))
    return float(np.sqrt(_F32_MAX / (64.0 * f * c)))


def precision_limit(regularization):
    """Largest |rating| at which ``regularization`` stays above float32 rounding in the normal
    equations of a row with fewer ratings than factors (entries ≈ n·r, regularizer λ·n), with a
    safety margin; None when λ = 0 (such systems are singular at any scale)."""
    if not regularization > 0:
        return None
    return float(regularization) / (64.0 * float(np.finfo(np.float32).eps))


_MAP_IDS_HINT = ("Map raw ids to 0-based indices first with clmf.data.Ratings.from_triples("
                 "users, items, ratings), which keeps the id maps")


def check_shape_vs_ratings(shape, nnz, what="X", ids=True, hint=_MAP_IDS_HINT):
    """Refuse a shape vastly larger than its ratings (before anything is sized by it); ``hint``
    ends the message (what to do instead)."""
    for k, (name, size) in enumerate((("user", shape[0]), ("item", shape[1]))):
        if size > SPARSE_ROWS_FLOOR and size > SPARSE_ROWS_PER_RATING * max(int(nnz), 1):
            how = (f"its largest {name} index is {size - 1}" if ids
                   else f"it has {size} {name} rows/columns")
            raise ValueError(
                f"{what} has {int(nnz)} rating(s) but {how}: a {shape[0]} × {shape[1]} matrix "
                f"would be sized for {size} {name}s, almost all without ratings (factors and "
                f"row pointers of {size} rows before any work). {hint}")


def _is_ratings_obj(X):
    return hasattr(X, "to_csr") and hasattr(X, "user_ids") and hasattr(X, "item_ids")


def check_ids(name, a):
    """``a`` as a 1-D integer index array, refusing fractions, non-finite and negative ids."""
    a = np.asarray(a)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {a.shape}")
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise ValueError(f"{name} must be integers; found non-integer values")
        a = a.astype(np.int64)
    elif a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer indices, not dtype {a.dtype}")
    if a.size and a.min() < 0:
        raise ValueError(f"{name} contains {int((a < 0).sum())} negative index/indices "
                         f"(first {int(a[a < 0][0])}); indices are 0-based and non-negative")
    return a.astype(np.int64)


def check_ratings(X, shape=None, *, allow_empty=False, what="X"):
    """Validate explicit ratings and return a canonical float32 CSR (users × items).

    Accepts a scipy.sparse matrix/array (csr, csc, coo, ...), a ``(user_idx, item_idx, ratings)``
    tuple of 1-D arrays, or a :class:`clmf.data.Ratings`. Raises ``TypeError``/``ValueError``
    naming the problem: dense input, NaN/inf ratings, negative or non-integer ids, length or shape
    mismatches, duplicate (user, item) entries (with their count), an empty matrix.
    """
    if _is_ratings_obj(X):
        R = X.to_csr()
        if shape is not None and tuple(R.shape) != tuple(shape):
            raise ValueError(f"{what} has shape {R.shape}, expected {tuple(shape)}")
        fast = _canonical_csr(R)
        return fast if fast is not None else _finish(R.tocoo(), allow_empty, what)
    if isinstance(X, np.ndarray) or (hasattr(X, "__array__") and not sp.issparse(X)
                                     and not isinstance(X, tuple) and not hasattr(X, "columns")):
        raise TypeError(
            f"{what} is a dense array: pass a scipy.sparse matrix (stored entries are ratings, "
            "absent ones unknown), e.g. scipy.sparse.csr_matrix(X) if zeros mean 'unknown', or a "
            "(user_idx, item_idx, ratings) tuple")
    if hasattr(X, "columns") and (hasattr(X, "iloc") or hasattr(X, "column_names")):
        raise TypeError(f"{what} is a table (DataFrame): clmf.ALS's fit, predict, rmse and score "
                        "take tables of raw ids directly; here convert it with "
                        "clmf.data.Ratings.from_pandas(df, user=..., item=..., rating=...)")
    if isinstance(X, tuple):
        if len(X) != 3:
            raise ValueError(f"{what} as a tuple must be (user_idx, item_idx, ratings), "
                             f"got {len(X)} elements")
        u = check_ids("user_idx", X[0])
        i = check_ids("item_idx", X[1])
        r = np.asarray(X[2])
        if r.ndim != 1:
            raise ValueError(f"ratings must be a 1-D array, got shape {r.shape}")
        if not (len(u) == len(i) == len(r)):
            raise ValueError(f"user_idx, item_idx and ratings lengths differ: {len(u)}, {len(i)}, {len(r)}")
        if r.dtype.kind not in "fiub":
            raise TypeError(f"ratings must be numeric, not dtype {r.dtype}")
        if shape is None:
            shape = (int(u.max()) + 1 if u.size else 0, int(i.max()) + 1 if i.size else 0)
            check_shape_vs_ratings(shape, len(r), what)
        else:
            if u.size and u.max() >= shape[0]:
                raise ValueError(f"user index {int(u.max())} out of range for {shape[0]} users")
            if i.size and i.max() >= shape[1]:
                raise ValueError(f"item index {int(i.max())} out of range for {shape[1]} items")
        C = sp.coo_matrix((r.astype(np.float64), (u, i)), shape=shape)
        return _finish(C, allow_empty, what)
    if sp.issparse(X):
        if X.ndim != 2:
            raise ValueError(f"{what} must be 2-D, got {X.ndim}-D")
        if shape is not None and tuple(X.shape) != tuple(shape):
            raise ValueError(f"{what} has shape {X.shape}, expected {tuple(shape)}")
        if X.dtype.kind not in "fiub":
            raise TypeError(f"{what} ratings must be numeric, not dtype {X.dtype}")
        check_shape_vs_ratings(X.shape, X.nnz, what, ids=False)
        fast = _canonical_csr(X)
        if fast is not None:
            return fast
        check_sparse_structure(X, what)
        return _finish(sp.coo_matrix(X), allow_empty, what)
    hint = (" (scikit-learn's cross-validation with cv=<int> turns a tuple into a list of some "
            "of its arrays: cross-validate clmf.data.Ratings.from_triples(users, items, "
            "ratings) with cv=clmf.data.splits.RatingsKFold(k))" if isinstance(X, list) else "")
    raise TypeError(f"{what} must be a scipy.sparse matrix, a (user_idx, item_idx, ratings) tuple, "
                    f"a table of raw ids or clmf.data.Ratings, not {type(X).__name__}{hint}")


def _canonical_csr(X):
    """``X`` as the float32 CSR the fit reads, sharing its arrays, when it already is a canonical
    CSR (sorted column indices, no duplicates, in range, finite ratings in float32's range, int32
    or int64 index arrays): one pass over the entries, nothing copied when the indices are int32
    and the ratings float32. None for anything else (the general path then converts it and names
    any problem)."""
    if X.format != "csr" or X.nnz == 0 or X.dtype.kind not in "fiub":
        return None
    m, n = X.shape
    indptr, indices, data = X.indptr, X.indices, X.data
    if (indptr.dtype not in (np.int32, np.int64) or indices.dtype not in (np.int32, np.int64)
            or indptr.ndim != 1 or len(indptr) != m + 1 or indptr[0] != 0
            or not (len(indices) == len(data) == indptr[-1]) or n > np.iinfo(np.int32).max):
        return None
    # scipy's check (one pass, no temporaries) on blocks of rows, in threads
    if not csr_is_canonical(indptr, indices, data, n):   # unsorted, duplicates or decreasing
        return None
    counts = np.diff(indptr)
    full = counts > 0
    if indices[indptr[:-1][full]].min() < 0 or indices[indptr[1:][full] - 1].max() >= n:
        return None                          # sorted rows: first/last entries bound them all
    if data.dtype.kind == "f":
        lo, hi = value_range(data)           # NaN propagates; ±inf or beyond float32 fails
        if not (np.isfinite(lo) and np.isfinite(hi) and -_F32_MAX <= lo and hi <= _F32_MAX):
            return None
    # contiguous arrays (a strided view of the caller's is copied): the device uploads them as
    # they are
    R = sp.csr_matrix((np.ascontiguousarray(data, dtype=np.float32),
                       np.ascontiguousarray(indices, dtype=np.int32),
                       np.ascontiguousarray(indptr)), shape=X.shape, copy=False)
    R.has_sorted_indices = True
    R.has_canonical_format = True
    return R


def check_sparse_structure(X, what="X"):
    """Refuse a CSR/CSC matrix whose structure is invalid (SciPy's own ``check_format`` rules,
    checked without touching ``X``): row pointers of the wrong length, not starting at 0, not
    ending at the entry count, or decreasing; index and value arrays of different lengths or
    not 1-D; indices out of range. Converting such a matrix would silently drop or misplace
    ratings."""
    if X.format not in ("csr", "csc"):
        return
    major, minor = X.shape if X.format == "csr" else X.shape[::-1]
    kind = "row" if X.format == "csr" else "column"
    indptr, indices, data = np.asarray(X.indptr), np.asarray(X.indices), np.asarray(X.data)
    name = f"{what} (a {X.format.upper()} matrix)"
    if indptr.ndim != 1 or indices.ndim != 1 or data.ndim != 1:
        raise ValueError(f"{name} has indptr/indices/data that are not all 1-D")
    if indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu":
        raise TypeError(f"{name} has index arrays of dtype {indptr.dtype}/{indices.dtype}, "
                        "not integers")
    if len(indptr) != major + 1:
        raise ValueError(f"{name} has {len(indptr)} {kind} pointers (indptr), not {major + 1} "
                         f"for its {major} {kind}s")
    if len(indices) != len(data):
        raise ValueError(f"{name} has {len(indices)} indices but {len(data)} values")
    if indptr[0] != 0 or indptr[-1] != len(indices):
        raise ValueError(f"{name} has indptr from {int(indptr[0])} to {int(indptr[-1])}, not "
                         f"from 0 to its {len(indices)} stored entries")
    down = np.flatnonzero(np.diff(indptr.astype(np.int64)) < 0)
    if down.size:
        k = int(down[0])
        raise ValueError(f"{name} has a decreasing indptr ({kind} {k}: {int(indptr[k])} → "
                         f"{int(indptr[k + 1])}), which is not a valid sparse matrix (SciPy's "
                         "check_format refuses it): its ratings cannot be read")
    if indices.size and (indices.min() < 0 or indices.max() >= minor):
        bad = int(indices.min()) if indices.min() < 0 else int(indices.max())
        raise ValueError(f"{name} has an index {bad} out of range for {minor} "
                         f"{'columns' if X.format == 'csr' else 'rows'}")


def check_strengths(R, what="X"):
    """Refuse negative implicit-feedback strengths in the CSR ``R`` (the fit and the fold-in of
    an implicit model read the same rule)."""
    if R.nnz and value_range(R.data)[0] < 0:
        raise ValueError(f"implicit feedback needs non-negative strengths; {what} has "
                         f"{int((R.data < 0).sum())} negative value(s)")


def _finish(C, allow_empty, what):
    """The last checks of a ratings matrix ``C`` (``what`` in errors): not empty, finite, in range."""
    if C.shape[0] == 0 or C.shape[1] == 0 or (C.nnz == 0 and not allow_empty):
        raise ValueError(f"{what} is empty (shape {C.shape}, {C.nnz} ratings): nothing to fit")
    data = np.asarray(C.data)
    bad = ~np.isfinite(data)
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"{what} has {int(bad.sum())} NaN/inf rating(s) (first at user {int(C.row[k])}, "
                         f"item {int(C.col[k])})")
    if data.size:
        big = np.abs(data) > _F32_MAX
        if big.any():
            from ..errors import RatingRangeError
            k = int(np.argmax(big))
            raise RatingRangeError(
                f"{what} has {int(big.sum())} rating(s) beyond the float32 range (±{_F32_MAX:.3g}; "
                f"first {float(data[k]):.3g} at user {int(C.row[k])}, item {int(C.col[k])}), "
                "which become inf in the kernels' float32 arithmetic; ratings up to about "
                f"{overflow_limit(64, 1000):.0e} work (the bound shrinks with factors and ratings "
                "per user/item): scale the ratings down")
    if C.nnz:
        keys = C.row.astype(np.int64) * C.shape[1] + C.col.astype(np.int64)
        order = np.argsort(keys, kind="stable")
        ks = keys[order]
        dup = ks[1:] == ks[:-1]
        if dup.any():
            first = int(ks[1:][dup][0])
            raise ValueError(
                f"{what} has {int(dup.sum())} duplicate (user, item) entries (first: user "
                f"{first // C.shape[1]}, item {first % C.shape[1]}); aggregate them first, e.g. "
                "clmf.data.Ratings.from_triples(..., duplicates='mean')")
        rows, cols, vals = C.row[order], C.col[order], data[order]
    else:
        rows = cols = np.zeros(0, np.int64)
        vals = np.zeros(0)
    R = sp.csr_matrix((vals.astype(np.float32), (rows, cols)), shape=C.shape)
    R.has_sorted_indices = True
    return R


def check_index_pairs(user_idx, item_idx, n_users, n_items):
    """Validate element-wise (user, item) index arrays for predict."""
    u = np.atleast_1d(check_ids("user_idx", np.asarray(user_idx).ravel()))
    i = np.atleast_1d(check_ids("item_idx", np.asarray(item_idx).ravel()))
    if u.shape != i.shape:
        raise ValueError(f"user_idx and item_idx lengths differ: {u.size} vs {i.size}")
    if u.size and u.max() >= n_users:
        raise IndexError(f"user index {int(u.max())} out of range for {n_users} users")
    if i.size and i.max() >= n_items:
        raise IndexError(f"item index {int(i.max())} out of range for {n_items} items")
    return u, i


def check_params(est):
    """Validate an estimator's hyper-parameters (raises ValueError/TypeError naming the problem)."""
    f = est.factors
    if not isinstance(f, numbers.Integral) or isinstance(f, bool) or f < 1:
        raise ValueError(f"factors must be an integer ≥ 1, not {f!r}")
    lam = est.regularization
    if not isinstance(lam, numbers.Real) or not np.isfinite(lam) or lam < 0:
        raise ValueError(f"regularization must be a finite number ≥ 0, not {lam!r}")
    it = est.iterations
    if not isinstance(it, numbers.Integral) or isinstance(it, bool) or it < 1:
        raise ValueError(f"iterations must be an integer ≥ 1, not {it!r}")
    if np.dtype(est.dtype) != np.float32:
        raise ValueError(f"dtype must be float32 (compute precision); got {np.dtype(est.dtype)}. "
                         "For half-precision storage use storage='float16'")
    if est.storage not in (None, "float32", "float16"):
        raise ValueError(f"storage must be 'float32' or 'float16', not {est.storage!r}")
    if est.feedback not in ("explicit", "implicit"):
        raise ValueError(f"feedback must be 'explicit' or 'implicit', not {est.feedback!r}")
    if est.feedback == "implicit":
        a = est.alpha
        if not isinstance(a, numbers.Real) or not np.isfinite(a) or a < 0:
            raise ValueError(f"alpha must be a finite number ≥ 0, not {a!r}")
        if est.biases:
            raise ValueError("biases=True is for explicit feedback")
        conf = getattr(est, "confidence", "1+alpha*r")
        if conf not in ("1+alpha*r", "alpha*r"):
            raise ValueError(f"confidence must be '1+alpha*r' or 'alpha*r', not {conf!r}")
        if conf == "alpha*r" and a == 0:
            raise ValueError("confidence='alpha*r' needs alpha > 0 (every confidence would be 0)")
    if est.weighted_regularization not in (None, True, False):
        raise ValueError("weighted_regularization must be True, False or None")
    if est.solver not in ("auto", "cholesky", "cg", "fusedcg"):
        raise ValueError(f"unknown solver {est.solver!r}; choose 'auto', 'cholesky', 'cg' or 'fusedcg'")
    check_memory_cap(getattr(est, "max_device_memory", None))
    _check_variant(est.variant)


def check_memory_cap(cap, global_mem=None):
    """The rule of ``max_device_memory``, in one place: None (no cap), an integer (bytes, ≥ 1;
    ``1`` is one byte), or a float in (0, 1] (a fraction of each device's global memory; a float
    above 1 is a byte count, e.g. ``8e9``). Returns the cap in bytes for a device of
    ``global_mem`` bytes (None without a cap or without ``global_mem``); raises ValueError or
    TypeError naming the parameter for anything else (text such as ``"1MB"``, NaN, bools,
    values ≤ 0)."""
    if cap is None:
        return None
    name = "max_device_memory"
    rule = ("an integer number of bytes (≥ 1) or a float in (0, 1] (a fraction of each "
            "device's memory)")
    if isinstance(cap, (bool, np.bool_)) or not isinstance(cap, numbers.Real):
        raise TypeError(f"{name} must be None, {rule}; not {cap!r}"
                        + (" (write bytes as a number, e.g. 8 << 30)" if isinstance(cap, str)
                           else ""))
    if isinstance(cap, numbers.Integral):
        if cap < 1:
            raise ValueError(f"{name} must be None, {rule}; not {cap!r}")
        return None if global_mem is None else int(cap)
    cap = float(cap)
    if not np.isfinite(cap) or cap <= 0:
        raise ValueError(f"{name} must be None, {rule}; not {cap!r}")
    if global_mem is None:
        return None
    return int(cap * global_mem) if cap <= 1 else int(cap)


def _check_variant(variant):
    """A variant parameter: "auto", a variant string or KernelConfig, or a pair of those; strings
    are parsed (and their fields checked) here, before any device work."""
    from ..engine.config import KernelConfig
    pair = variant if isinstance(variant, (tuple, list)) else (variant,)
    if isinstance(variant, (tuple, list)) and len(variant) != 2:
        raise ValueError("variant as a pair must be (users_variant, items_variant)")
    for v in pair:
        if isinstance(v, str) and v == "auto":
            continue
        KernelConfig.parse(v)          # raises InvalidConfigError / TypeError naming the problem


def check_float32_range(values, what):
    """Refuse finite values that the float32 cast turns into inf (naming the range)."""
    if values.dtype.kind != "f" or values.dtype.itemsize <= 4 or not values.size:
        return
    with np.errstate(invalid="ignore"):
        big = np.isfinite(values) & (np.abs(values) > np.finfo(np.float32).max)
    if big.any():
        from ..errors import RatingRangeError
        first = int(np.flatnonzero(big)[0])
        raise RatingRangeError(
            f"{int(big.sum())} {what} value(s) beyond the float32 range (±3.4e38; first at "
            f"position {first}: {float(values[first]):.3g}) would become non-finite (inf) in "
            "float32; scale them down (ALS fits need far smaller magnitudes: see clmf.ALS.fit)")
