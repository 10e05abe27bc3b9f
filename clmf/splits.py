"""Train/test splits of rating data (public entry point; implemented in :mod:`clmf.data.splits`).

:class:`RatingsKFold` is scikit-learn's cross-validation over ratings (``GridSearchCV``,
``cross_val_score``). Every other split takes a :class:`~clmf.datasets.Ratings` (or a
scipy.sparse matrix, converted with :meth:`Ratings.from_sparse`) and returns ``(train, test)``:
two ``Ratings`` that share the input's id maps and shape, are disjoint, and together hold every
rating once. Within each part the input order of ratings is kept.

``random_state`` accepts an int, a :class:`numpy.random.Generator`, a
:class:`numpy.random.SeedSequence` or ``None`` (fresh entropy), as
:func:`numpy.random.default_rng` does.
"""

from __future__ import annotations

from .data.splits import RatingsKFold, leave_k_out, random_holdout, time_split

__all__ = ["random_holdout", "leave_k_out", "time_split", "RatingsKFold"]
