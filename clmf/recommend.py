"""Inference on a fitted model: recommend, similar items/users, fold-in (implicit's signatures).

:class:`RecommenderMixin` is mixed into :class:`clmf.ALS`; it relies only on the learned
attributes (``user_factors_``, ``item_factors_``, ``global_mean_``, counts, id maps).
"""
from __future__ import annotations


class RecommenderMixin:
    """Recommendation methods shared by clmf's models (filled in by the workflow issue)."""
