"""The estimator (:class:`ALS`, :mod:`.estimator`) and saving/loading fitted models
(:mod:`.persistence`)."""
from .estimator import ALS
from .persistence import load, save

__all__ = ["ALS", "load", "save"]
