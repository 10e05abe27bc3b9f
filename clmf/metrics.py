"""Accuracy and top-N ranking metrics.

Rating prediction: :func:`rmse`, :func:`mae`.

Top-N ranking with binary relevance: :func:`precision_at_k`, :func:`recall_at_k`,
:func:`average_precision_at_k` (alias :func:`map_at_k`), :func:`ndcg_at_k` and the helper
:func:`evaluate_ranking`; :func:`ranking_metrics` computes the metrics of the `implicit`
library's ``ranking_metrics_at_k`` (its precision, MAP, nDCG and AUC) from given lists
(:func:`clmf.evaluate` ranks a model's items and calls it).

Conventions of the ranking metrics
----------------------------------
``recommended`` is a 2-D integer array (one row per user, at least ``k`` columns, ``-1``
for padding) or a list of 1-D integer arrays (shorter lists are padded). ``relevant`` is a
list of sets/arrays of relevant item indices per user, a scipy.sparse matrix whose row ``u``
holds user ``u``'s held-out items (stored non-zero entries are relevant), or a
:class:`~clmf.data.Ratings` test set. Both index users the same way, so they must have
the same number of rows.

For a user with relevant set ``R`` and top-``k`` list with hit indicators ``h_1..h_k``
(``h_i = 1`` when the item at rank ``i`` is in ``R``; padding and repeated items are not
hits):

* precision@k = ``sum(h) / k`` (the denominator is always ``k``);
* recall@k = ``sum(h) / |R|``;
* AP@k = ``sum_i h_i * precision@i / min(k, |R|)``;
* nDCG@k = ``DCG / IDCG`` with ``DCG = sum_i h_i / log2(i + 1)`` and ``IDCG`` the DCG of
  ``min(k, |R|)`` hits at the top.

Each metric is the mean over users with at least one relevant item; users without any are
left out (they have no defined recall). With no such user the result is ``nan``.

Two precisions
--------------
:func:`precision_at_k` is the strict precision: hits divided by ``k``, averaged over users. The
``implicit`` library's ``ranking_metrics_at_k`` reports another ``"precision"``: all users' hits
divided by the sum over users of ``min(k, |R|)`` — with two held-out items per user and k = 10
it is five times the strict one. :func:`ranking_metrics` returns both, as ``"precision"``
(implicit's) and ``"strict_precision"``.
"""

from __future__ import annotations

import logging
import numbers
from typing import Any, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from .data.ratings import Ratings

logger = logging.getLogger(__name__)

__all__ = [
    "rmse",
    "mae",
    "precision_at_k",
    "recall_at_k",
    "average_precision_at_k",
    "map_at_k",
    "ndcg_at_k",
    "evaluate_ranking",
    "ranking_metrics",
]


# --------------------------------------------------------------------------------------
# rating prediction
# --------------------------------------------------------------------------------------
def _pair(y_true: Any, y_pred: Any) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(y_true, dtype=np.float64)
    b = np.asarray(y_pred, dtype=np.float64)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("y_true and y_pred must be array-like, not scalars")
    if a.shape != b.shape:
        raise ValueError(f"y_true and y_pred differ in shape: {a.shape} vs {b.shape}")
    a, b = a.reshape(-1), b.reshape(-1)
    if a.size == 0:
        raise ValueError("y_true and y_pred are empty")
    for name, v in (("y_true", a), ("y_pred", b)):
        bad = ~np.isfinite(v)
        if bad.any():
            raise ValueError(
                f"{name} has {int(bad.sum())} non-finite value(s); first at position "
                f"{int(np.flatnonzero(bad)[0])}"
            )
    return a, b


def rmse(y_true: Any, y_pred: Any) -> float:
    """Root mean squared error.

    Parameters
    ----------
    y_true, y_pred : array_like of float
        Same shape, non-empty, finite.

    Returns
    -------
    float
        ``sqrt(mean((y_true - y_pred) ** 2))``, accumulated in float64.

    Raises
    ------
    ValueError
        On different shapes, empty input or NaN/inf values.

    Examples
    --------
    >>> rmse([1, 2, 3], [1, 2, 5])
    1.1547005383792515
    """
    a, b = _pair(y_true, y_pred)
    d = a - b
    return float(np.sqrt(np.dot(d, d) / d.size))


def mae(y_true: Any, y_pred: Any) -> float:
    """Mean absolute error.

    Parameters
    ----------
    y_true, y_pred : array_like of float
        Same shape, non-empty, finite.

    Returns
    -------
    float
        ``mean(abs(y_true - y_pred))``.

    Raises
    ------
    ValueError
        On different shapes, empty input or NaN/inf values.

    Examples
    --------
    >>> mae([1, 2, 3], [1, 2, 5])
    0.6666666666666666
    """
    a, b = _pair(y_true, y_pred)
    return float(np.mean(np.abs(a - b)))


# --------------------------------------------------------------------------------------
# ranking
# --------------------------------------------------------------------------------------
def check_k(k: Any) -> int:
    """``k`` as an int ≥ 1 (a cut-off), else ValueError."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or int(k) < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    return int(k)


def _as_int_row(row: Any, u: int) -> np.ndarray:
    arr = np.asarray(row)
    if arr.ndim != 1:
        raise ValueError(f"recommendation list of user {u} must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"recommendation list of user {u} must hold integer item indices")
    return arr.astype(np.int64, copy=False)


def _recommended_matrix(recommended: Any, k: int) -> np.ndarray:
    """Top-k matrix (n_users, k) of int64 with -1 padding."""
    if isinstance(recommended, np.ndarray) and recommended.ndim == 2:
        rec = recommended
        if rec.size and rec.dtype.kind not in "iu":
            if rec.dtype.kind == "f" and np.all(rec == np.round(rec)):
                rec = rec.astype(np.int64)
            else:
                raise ValueError(f"recommended must hold integer item indices, got {rec.dtype}")
        if rec.shape[1] < k:
            raise ValueError(
                f"recommended has {rec.shape[1]} column(s), fewer than k={k}; ask the model "
                f"for at least {k} items (or pad with -1)"
            )
        return rec[:, :k].astype(np.int64, copy=False)
    if isinstance(recommended, np.ndarray) and recommended.ndim != 1:
        raise ValueError(f"recommended must be 2-D or a list of arrays, got shape {recommended.shape}")
    rows = list(recommended)
    out = np.full((len(rows), k), -1, dtype=np.int64)
    for u, row in enumerate(rows):
        r = _as_int_row(row, u)[:k]
        out[u, : r.size] = r
    return out


def _relevant_csr(relevant: Any, n_users: int | None) -> sp.csr_matrix:
    """Relevant items per user as a binary CSR with sorted, unique column indices."""
    if isinstance(relevant, Ratings):
        relevant = relevant.to_csr()
    if sp.issparse(relevant):
        m = sp.csr_matrix(relevant, copy=True)
        m.sum_duplicates()
        m.eliminate_zeros()
        m.sort_indices()
        return m
    if isinstance(relevant, np.ndarray) and relevant.ndim == 2:
        raise ValueError(
            "relevant as a dense 2-D array is ambiguous; pass a list of sets/arrays or a "
            "scipy.sparse matrix"
        )
    rows = list(relevant)
    lengths = np.zeros(len(rows), dtype=np.int64)
    cols = []
    for u, row in enumerate(rows):
        if isinstance(row, (set, frozenset)):
            row = list(row)
        arr = np.asarray(row if row is not None else [], dtype=np.int64).reshape(-1)
        if arr.size and arr.min() < 0:
            raise ValueError(f"relevant items of user {u} contain a negative index")
        arr = np.unique(arr)
        lengths[u] = arr.size
        cols.append(arr)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate(cols) if cols else np.empty(0, np.int64)
    n_cols = int(indices.max()) + 1 if indices.size else 1
    return sp.csr_matrix(
        (np.ones(indices.size, dtype=np.float32), indices, indptr), shape=(len(rows), n_cols)
    )


def count_hits(recommended: Any, relevant: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Hit matrix (n_users, k) bool and the number of relevant items per user."""
    rec = _recommended_matrix(recommended, k)
    rel = _relevant_csr(relevant, rec.shape[0])
    n_users = rec.shape[0]
    if rel.shape[0] != n_users:
        raise ValueError(
            f"recommended has {n_users} user row(s) but relevant has {rel.shape[0]}; "
            "they must index the same users"
        )
    n_rel = np.diff(rel.indptr).astype(np.int64)
    width = max(int(rel.shape[1]), int(rec.max()) + 1 if rec.size else 1, 1)
    rows = np.arange(n_users, dtype=np.int64)[:, None]
    rel_keys = np.repeat(np.arange(n_users, dtype=np.int64), n_rel) * width + rel.indices
    rec_keys = rows * width + rec
    valid = rec >= 0
    if rel_keys.size:
        pos = np.searchsorted(rel_keys, rec_keys)
        np.minimum(pos, rel_keys.size - 1, out=pos)
        hits = (rel_keys[pos] == rec_keys) & valid
    else:
        hits = np.zeros(rec.shape, dtype=bool)
    if k > 1 and hits.any():
        # an item repeated in a list counts only at its first position
        order = np.argsort(rec_keys, axis=1, kind="stable")
        srt = np.take_along_axis(rec_keys, order, axis=1)
        dup_sorted = np.zeros(rec.shape, dtype=bool)
        dup_sorted[:, 1:] = srt[:, 1:] == srt[:, :-1]
        dup = np.zeros(rec.shape, dtype=bool)
        np.put_along_axis(dup, order, dup_sorted, axis=1)
        hits &= ~dup
    return hits, n_rel


def _mean_over_users(values: np.ndarray, n_rel: np.ndarray, name: str) -> float:
    users = n_rel > 0
    if not users.any():
        logger.warning("%s: no user has a relevant item; returning nan", name)
        return float("nan")
    return float(np.mean(values[users]))


def _precision(hits: np.ndarray, n_rel: np.ndarray, k: int) -> np.ndarray:
    return hits[:, :k].sum(axis=1) / k


def _recall(hits: np.ndarray, n_rel: np.ndarray, k: int) -> np.ndarray:
    return hits[:, :k].sum(axis=1) / np.maximum(n_rel, 1)


def _ap(hits: np.ndarray, n_rel: np.ndarray, k: int) -> np.ndarray:
    h = hits[:, :k]
    prec_at_i = np.cumsum(h, axis=1) / np.arange(1, k + 1)
    return (prec_at_i * h).sum(axis=1) / np.maximum(np.minimum(n_rel, k), 1)


def _ndcg(hits: np.ndarray, n_rel: np.ndarray, k: int) -> np.ndarray:
    disc = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = hits[:, :k] @ disc
    ideal = np.concatenate([[0.0], np.cumsum(disc)])[np.minimum(n_rel, k)]
    return dcg / np.where(ideal > 0, ideal, 1.0)


_METRICS = {
    "precision": _precision,
    "recall": _recall,
    "map": _ap,
    "ap": _ap,
    "ndcg": _ndcg,
}


def precision_at_k(recommended: Any, relevant: Any, k: int) -> float:
    """Mean precision@k: the share of the top ``k`` that is relevant (denominator ``k``).

    Parameters
    ----------
    recommended : 2-D int array or list of int arrays
        Recommended item indices per user, best first; ``-1`` pads.
    relevant : list of sets/arrays, scipy.sparse matrix or Ratings
        Relevant items per user (same user rows as ``recommended``).
    k : int
        Cut-off, >= 1.

    Returns
    -------
    float
        Mean over users with at least one relevant item (``nan`` if none).

    Examples
    --------
    >>> precision_at_k([[1, 2, 3]], [{2, 9}], k=3)
    0.3333333333333333
    """
    k = check_k(k)
    hits, n_rel = count_hits(recommended, relevant, k)
    return _mean_over_users(_precision(hits, n_rel, k), n_rel, f"precision@{k}")


def recall_at_k(recommended: Any, relevant: Any, k: int) -> float:
    """Mean recall@k: the share of a user's relevant items found in the top ``k``.

    The denominator is the number of relevant items ``|R|`` (so recall@k < 1 when
    ``|R| > k``).

    Parameters
    ----------
    recommended : 2-D int array or list of int arrays
        Recommended item indices per user, best first; ``-1`` pads.
    relevant : list of sets/arrays, scipy.sparse matrix or Ratings
        Relevant items per user.
    k : int
        Cut-off, >= 1.

    Returns
    -------
    float
        Mean over users with at least one relevant item (``nan`` if none).

    Examples
    --------
    >>> recall_at_k([[1, 2, 3]], [{2, 9}], k=3)
    0.5
    """
    k = check_k(k)
    hits, n_rel = count_hits(recommended, relevant, k)
    return _mean_over_users(_recall(hits, n_rel, k), n_rel, f"recall@{k}")


def average_precision_at_k(recommended: Any, relevant: Any, k: int) -> float:
    """Mean average precision at k (MAP@k), normalised by ``min(k, |R|)``.

    ``AP@k = sum_{i<=k} h_i * precision@i / min(k, |R|)``.

    Parameters
    ----------
    recommended : 2-D int array or list of int arrays
        Recommended item indices per user, best first; ``-1`` pads.
    relevant : list of sets/arrays, scipy.sparse matrix or Ratings
        Relevant items per user.
    k : int
        Cut-off, >= 1.

    Returns
    -------
    float
        Mean AP over users with at least one relevant item (``nan`` if none).

    Examples
    --------
    >>> average_precision_at_k([[1, 2, 3]], [{2, 9}], k=3)  # (1/2) / min(3, 2)
    0.25
    """
    k = check_k(k)
    hits, n_rel = count_hits(recommended, relevant, k)
    return _mean_over_users(_ap(hits, n_rel, k), n_rel, f"map@{k}")


map_at_k = average_precision_at_k


def ndcg_at_k(recommended: Any, relevant: Any, k: int) -> float:
    """Mean normalised discounted cumulative gain at k (binary gains).

    ``DCG = sum_{i<=k} h_i / log2(i + 1)``; the ideal DCG puts ``min(k, |R|)`` hits first.

    Parameters
    ----------
    recommended : 2-D int array or list of int arrays
        Recommended item indices per user, best first; ``-1`` pads.
    relevant : list of sets/arrays, scipy.sparse matrix or Ratings
        Relevant items per user.
    k : int
        Cut-off, >= 1.

    Returns
    -------
    float
        Mean nDCG over users with at least one relevant item (``nan`` if none).

    Examples
    --------
    >>> round(ndcg_at_k([[1, 2, 3]], [{2, 9}], k=3), 6)  # (1/log2(3)) / (1 + 1/log2(3))
    0.386853
    """
    k = check_k(k)
    hits, n_rel = count_hits(recommended, relevant, k)
    return _mean_over_users(_ndcg(hits, n_rel, k), n_rel, f"ndcg@{k}")


def evaluate_ranking(
    recommended: Any,
    test: Any,
    ks: Iterable[int] | int = (10,),
    metrics: Sequence[str] = ("precision", "recall", "map", "ndcg"),
    *,
    relevance_threshold: float | None = None,
) -> dict[str, float]:
    """Several ranking metrics at several cut-offs in one pass.

    Parameters
    ----------
    recommended : 2-D int array or list of int arrays
        Recommended item indices per user (row ``u`` = user index ``u``), best first.
    test : Ratings, scipy.sparse matrix or list of sets/arrays
        Held-out items per user; with a :class:`~clmf.data.Ratings` or a sparse matrix,
        every stored test rating is relevant unless ``relevance_threshold`` is given.
    ks : int or iterable of int, default (10,)
        Cut-offs.
    metrics : sequence of str, default ("precision", "recall", "map", "ndcg")
        Any of ``"precision"``, ``"recall"``, ``"map"`` (or ``"ap"``), ``"ndcg"``.
    relevance_threshold : float, optional
        Only test ratings ``>= relevance_threshold`` are relevant (Ratings/sparse ``test``).

    Returns
    -------
    dict
        ``{"precision@10": ..., "recall@10": ..., ...}`` in the order of ``ks`` then
        ``metrics``.

    Raises
    ------
    ValueError
        On unknown metric names, invalid ``ks`` or mismatched user counts.

    Examples
    --------
    >>> evaluate_ranking([[1, 2, 3]], [{2, 9}], ks=(1, 3), metrics=("precision", "recall"))
    {'precision@1': 0.0, 'recall@1': 0.0, 'precision@3': 0.3333333333333333, 'recall@3': 0.5}
    """
    ks = [ks] if isinstance(ks, numbers.Integral) else list(ks)
    if not ks:
        raise ValueError("ks is empty")
    ks = [check_k(k) for k in ks]
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    unknown = [m for m in metrics if m.lower() not in _METRICS]
    if unknown or not metrics:
        raise ValueError(f"unknown metric(s) {unknown}; choose from {sorted(_METRICS)}")
    if relevance_threshold is not None:
        if isinstance(test, Ratings):
            test = test.to_csr()
        if not sp.issparse(test):
            raise ValueError("relevance_threshold needs test as Ratings or a scipy.sparse matrix")
        test = sp.csr_matrix(test, copy=True)
        test.data = (test.data >= relevance_threshold).astype(np.float32)
    kmax = max(ks)
    hits, n_rel = count_hits(recommended, test, kmax)
    out: dict[str, float] = {}
    for k in ks:
        for m in metrics:
            name = f"{m.lower()}@{k}"
            out[name] = _mean_over_users(_METRICS[m.lower()](hits, n_rel, k), n_rel, name)
    return out


def ranking_metrics(recommended: Any, relevant: Any, k: int = 10,
                    n_items: int | None = None) -> dict[str, float]:
    """The metrics of the ``implicit`` library's ``ranking_metrics_at_k`` from given top-k lists,
    and the strict precision.

    Over the users with at least one relevant item, with ``h_i`` the hit at rank ``i`` of a
    user's top-``k`` list (padding ``-1`` is a miss) and ``R`` the user's relevant items:

    * ``"precision"`` — implicit's: ``Σ_users Σ h / Σ_users min(k, |R|)`` (so a user with fewer
      than ``k`` relevant items can reach 1);
    * ``"map"`` — mean of ``AP@k = Σ_i h_i · precision@i / min(k, |R|)``;
    * ``"ndcg"`` — mean nDCG@k with binary gains;
    * ``"auc"`` — implicit's AUC of the top-``k`` list: each miss in the list counts the hits
      ranked above it, and the items outside the list count as tied halfway, i.e.
      ``(Σ_{misses i} hits_before(i) + (hits + |R|)/2 · (n_items − |R| − misses)) /
      (|R| · (n_items − |R|))``;
    * ``"strict_precision"`` — mean of ``Σ h / k`` (:func:`precision_at_k`).

    Parameters
    ----------
    recommended : 2-D int array or list of int arrays
        Recommended item indices per user, best first; ``-1`` pads (shorter lists are padded).
    relevant : list of sets/arrays, scipy.sparse matrix or Ratings
        Relevant items per user (same user rows as ``recommended``).
    k : int, default 10
        Cut-off, >= 1.
    n_items : int, optional
        Number of items for the AUC (default: the column count of a sparse ``relevant``, else one
        more than the largest item index seen).

    Returns
    -------
    dict
        ``{"precision", "map", "ndcg", "auc", "strict_precision"}``; ``nan`` everywhere when no
        user has a relevant item.

    Examples
    --------
    >>> r = ranking_metrics([[1, 2, 3]], [{2, 9}], k=3, n_items=10)
    >>> r["precision"], r["strict_precision"]          # 1 hit / min(3, 2), 1 hit / 3
    (0.5, 0.3333333333333333)
    """
    k = check_k(k)
    rec = _recommended_matrix(recommended, k)
    rel = _relevant_csr(relevant, rec.shape[0])
    hits, n_rel = count_hits(rec, rel, k)
    if n_items is None:
        n_items = rel.shape[1] if sp.issparse(relevant) or isinstance(relevant, Ratings) else \
            max(rel.shape[1], int(rec.max(initial=-1)) + 1)
    users = n_rel > 0
    names = ("precision", "map", "ndcg", "auc", "strict_precision")
    if not users.any():
        logger.warning("ranking metrics@%d: no user has a relevant item; returning nan", k)
        return dict.fromkeys(names, float("nan"))
    h, nr = hits[users], n_rel[users]
    n_hits = h.sum(axis=1)
    npos = nr.astype(np.float64)
    nneg = float(n_items) - npos
    misses = k - n_hits
    hits_above = np.cumsum(h, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        auc = (((~h) * hits_above).sum(axis=1) + (n_hits + npos) / 2.0 * (nneg - misses)) \
            / (npos * nneg)
    return {"precision": float(n_hits.sum() / np.minimum(nr, k).sum()),
            "map": float(np.mean(_ap(h, nr, k))),
            "ndcg": float(np.mean(_ndcg(h, nr, k))),
            "auc": float(np.mean(auc)),
            "strict_precision": float(np.mean(_precision(h, nr, k)))}
