"""The estimator (:class:`ALS`, :mod:`.estimator`), the fit loop every backend shares
(:mod:`.loop`) and saving/loading fitted models (:mod:`.persistence`)."""
from .estimator import ALS
from .persistence import load, save

__all__ = ["ALS", "load", "save"]
