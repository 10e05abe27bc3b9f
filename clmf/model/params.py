"""scikit-learn's parameter protocol, written once for every estimator (:class:`clmf.ALS`,
:class:`clmf.dask.ALS`): the parameters are the constructor's explicit keywords
(``BaseEstimator``'s rule: no ``*args``/``**kwargs``), kept as attributes of the same names."""
from __future__ import annotations

import inspect

from .inputs import _params_repr

__all__ = ["ParamsMixin"]


class ParamsMixin:
    """``get_params``/``set_params``/``__repr__`` from the constructor's signature; ``__repr__``
    names the class :attr:`_repr_name` (default: the class name) and shows the parameters that
    differ from the constructor's defaults."""

    _repr_name = None

    @classmethod
    def _get_param_names(cls):
        """The constructor's parameter names (scikit-learn's ``BaseEstimator`` rule: explicit
        keywords only)."""
        params = [p for p in inspect.signature(cls.__init__).parameters.values()
                  if p.name != "self"]
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise RuntimeError(f"{cls.__name__}.__init__ takes *args/**kwargs; scikit-learn "
                                   "estimators name every parameter")
        return [p.name for p in params]

    def get_params(self, deep=True):
        """Parameters of this estimator (scikit-learn protocol)."""
        return {k: getattr(self, k) for k in self._get_param_names()}

    def set_params(self, **params):
        """Set parameters (scikit-learn protocol); returns self."""
        valid = set(self._get_param_names())
        for k, v in params.items():
            if k not in valid:
                raise ValueError(f"invalid parameter {k!r} for {type(self).__name__}; "
                                 f"valid: {sorted(valid)}")
            setattr(self, k, v)
        return self

    @classmethod
    def _repr_defaults(cls):
        """The parameters' defaults that :meth:`__repr__` leaves out."""
        return {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                if k != "self"}

    def __repr__(self):
        """``ALS(...)`` with the parameters that differ from their defaults (a dtype by name:
        ``dtype='float16'``)."""
        return _params_repr(self._repr_name or type(self).__name__, self.get_params(),
                            self._repr_defaults())
