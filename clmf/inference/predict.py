"""Predicted ratings of (user, item) pairs: the one rule :meth:`clmf.ALS.predict`, the raw-id
scoring of tables (:meth:`clmf.ALS.rmse`) and the Dask workers (:mod:`clmf.parallel.dask_tasks`)
share."""
from __future__ import annotations

import numpy as np

__all__ = ["predict_pairs"]


def predict_pairs(X, Y, u, i, *, global_mean, user_counts, item_counts, user_biases=None,
                  item_biases=None, implicit=False):
    """float32 predictions ``x_u·y_i`` for index pairs ``(u, i)``, where -1 marks an id unknown
    to the model. With biases: ``μ + b_u + b_i + x_u·y_i``, an unknown side contributing
    nothing (so ``μ`` plus the known side's bias); implicit feedback: the preference score,
    0 for an unknown side; otherwise a pair with an unknown side, or a user or item without
    training ratings, predicts ``global_mean``."""
    u, i = np.asarray(u), np.asarray(i)
    ku, ki = u >= 0, i >= 0
    uu, ii = np.where(ku, u, 0), np.where(ki, i, 0)
    p = np.einsum("ij,ij->i", X[uu], Y[ii]).astype(np.float64)
    p[~(ku & ki)] = 0.0
    if user_biases is not None:
        bu = np.where(ku, user_biases[uu], 0.0)
        bi = np.where(ki, item_biases[ii], 0.0)
        return (p + global_mean + bu + bi).astype(np.float32)
    if implicit:
        return p.astype(np.float32)
    unknown = ~(ku & ki) | (user_counts[uu] == 0) | (item_counts[ii] == 0)
    p[unknown] = global_mean
    return p.astype(np.float32)
