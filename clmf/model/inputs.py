"""The estimator's inputs beyond the ratings' own checks (:mod:`clmf.data.validation`): tables of
raw ids (:mod:`clmf.data.frames`) as ratings, held-out ratings of a fit or a score, ids that are
indices or raw ids, and the parameters' repr."""
from __future__ import annotations

import sys

import numpy as np
import scipy.sparse as sp

from ..data import frames
from ..data.validation import check_ratings
from ..inference.raw_ids import codes_in

__all__ = []


def _integral(ids):
    """Whether ``ids`` (a scalar or array) are integers: 0-based indices, not raw ids."""
    return np.asarray(ids).dtype.kind in "iu"


def _check_heldout_shape(X, shape, what):
    """Refuse held-out ratings in a matrix of another shape than the model's, naming the likely
    cause: scikit-learn's ``cv=<int>`` splitting a matrix by its rows (users)."""
    if sp.issparse(X) and X.ndim == 2 and tuple(X.shape) != tuple(shape):
        hint = ""
        if X.shape[1] == shape[1]:
            hint = (": held-out ratings are a matrix of the training shape, not other users' "
                    "rows. scikit-learn's cv=<int> (KFold) splits a matrix by its rows (whole "
                    "users); cross-validate over ratings with "
                    "cv=clmf.data.splits.RatingsKFold(k) on clmf.data.Ratings.from_sparse(X)")
        raise ValueError(f"{what} has shape {X.shape}, expected {tuple(shape)}{hint}")


_CV_FRAMES = 12      # caller frames searched for scikit-learn's fold runner (a Pipeline between)


def _refuse_row_cv(X):
    """Refuse ``X`` (a scipy.sparse matrix or a tuple of arrays) when scikit-learn's
    cross-validation (``GridSearchCV``, ``cross_val_score``, ...) is fitting a fold of it.

    scikit-learn splits a matrix by its rows (whole users) and a tuple by its elements, so the
    held-out part is never ratings of the fitted users, and it turns any error of ``fit`` or
    ``score`` into a NaN score and a warning; only a ``fit`` that fails in every fold reaches
    the caller, as one ``ValueError`` quoting this message. The fold runner is recognised as a
    caller (``sklearn.model_selection``'s ``_fit_and_score``) whose scorer is scikit-learn's own
    (the estimator's ``score`` or a named metric); a user's scoring function is let through.
    """
    if not (sp.issparse(X) or isinstance(X, (tuple, list))):
        return
    frame = sys._getframe(1)
    for _ in range(_CV_FRAMES):
        frame = frame.f_back
        if frame is None:
            return
        if (frame.f_code.co_name == "_fit_and_score"
                and str(frame.f_globals.get("__name__", "")).startswith("sklearn.model_selection")):
            scorer = frame.f_locals.get("scorer")
            # cross_val_score wraps even one scorer in a _MultimetricScorer of named ones
            leaves = getattr(scorer, "_scorers", {"score": scorer})
            if not any(type(s).__module__.startswith("sklearn.") for s in leaves.values()):
                return
            what = "a scipy.sparse matrix" if sp.issparse(X) else "a tuple of arrays"
            raise ValueError(
                f"clmf cannot be cross-validated on {what} with scikit-learn's own splits: "
                "cv=<int> (KFold) splits a matrix by its rows (whole users; a tuple by its "
                "arrays), so no fold holds out ratings of the users it fits. Cross-validate "
                "over ratings with cv=clmf.data.splits.RatingsKFold(k) on "
                "clmf.data.Ratings.from_sparse(X) (or Ratings.from_triples(users, items, "
                "ratings), or a DataFrame of raw ids), e.g. GridSearchCV(clmf.ALS(), grid, "
                "cv=clmf.data.splits.RatingsKFold(3)).fit(Ratings.from_sparse(X))")


def _table_ratings(X, columns):
    """A table of raw-id ratings (:mod:`clmf.data.frames`) as :class:`clmf.data.Ratings`."""
    from ..data.ratings import Ratings
    return Ratings.from_pandas(X, *frames.rating_columns(columns))


def _heldout(data, columns, user_ids, item_ids, shape):
    """Held-out ratings of a fit as ``(COO matrix of the training shape, ratings of ids not in
    the training data)``: a table of raw ids matched through the training id maps (``None``:
    its ids are indices), anything else as ``fit``'s ``X``."""
    if not frames.is_frame(data):
        return check_ratings(data, shape=shape, what="validation").tocoo(), np.zeros(0)
    ucol, icol, rcol = frames.rating_columns(columns)
    what = "the validation data"
    u = codes_in(user_ids, shape[0], frames.column(data, ucol, what), "user")
    i = codes_in(item_ids, shape[1], frames.column(data, icol, what), "item")
    r = frames.column(data, rcol, what)
    known = (u >= 0) & (i >= 0)
    V = check_ratings((u[known], i[known], r[known]), shape=shape, what="validation",
                      allow_empty=True).tocoo()
    return V, np.asarray(r[~known], np.float64)


def _params_repr(name, params, defaults):
    """``name(k=v, ...)`` of the ``params`` that differ from ``defaults`` (plain values compared;
    a numpy dtype or scalar type shown by name, e.g. ``dtype='float32'``)."""
    args = []
    for k, v in params.items():
        d = defaults.get(k)
        if isinstance(d, (np.dtype, type)) or isinstance(v, (np.dtype, type)):
            try:
                dt = np.dtype(v)
            except TypeError:
                dt = None
            if dt is not None:
                if isinstance(d, (np.dtype, type)) and dt == np.dtype(d):
                    continue
                args.append(f"{k}={dt.name!r}")
                continue
        if not (isinstance(v, (int, float, str, bool, type(None))) and k in defaults
                and v == d):
            args.append(f"{k}={v!r}")
    return f"{name}({', '.join(args)})"
