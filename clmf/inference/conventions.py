"""The implicit library's conventions that clmf follows: id dtype, the score of already-liked
items kept by ``recommend(items=...)``, and implicit's confidence c = alpha·r."""
from __future__ import annotations

import numpy as np

__all__ = ["LIKED_SCORE", "ids_dtype", "confidence_rows"]

# score of an already-liked item kept by recommend(items=...): ranked last, as implicit's -FLT_MAX
LIKED_SCORE = np.finfo(np.float32).min


def ids_dtype(ids, n):
    """Returned ids as int32 (what implicit returns and its evaluation functions read), int64
    only for more than 2³¹ − 1 rows."""
    return ids.astype(np.int32, copy=False) if n < np.iinfo(np.int32).max else ids


def confidence_rows(R, est):
    """``R`` as the kernels and the reference read it for the estimator ``est``: they weight an
    implicit entry by c = 1 + alpha·r, so ``confidence="alpha*r"`` (implicit's c = alpha·r) gets a
    float64 copy holding r − 1/alpha (1 + alpha·(r − 1/alpha) = alpha·r); else ``R`` itself."""
    from ..tuning.spec import kernel_ratings
    return kernel_ratings(R, getattr(est, "feedback", "explicit"),
                          getattr(est, "confidence", "1+alpha*r"), getattr(est, "alpha", 1.0))
