"""clmf: portable, autotuned ALS matrix factorization on any OpenCL device.

Quick start::

    import clmf
    train, test = clmf.data.default()
    model = clmf.ALS(factors=32, regularization=0.05, iterations=10).fit(train)
    print(model.rmse(test))
"""
from __future__ import annotations

from . import errors, reference  # noqa: F401  (pure NumPy ground truth, always importable)
from ._version import __version__
from .errors import (
    ClmfError,
    DeviceMemoryError,
    HostMemoryError,
    InvalidConfigError,
    NoOpenCLError,
    RatingRangeError,
    SingularSystemError,
)

__all__ = [
    "ALS", "load", "evaluate", "devices", "select_device", "KernelConfig", "reference", "data",
    "metrics", "errors", "ClmfError", "NoOpenCLError", "SingularSystemError",
    "DeviceMemoryError", "InvalidConfigError", "NotFittedError", "HostMemoryError",
    "RatingRangeError", "__version__",
]

# Submodules reachable as attributes without an explicit import (imported on first access).
_SUBMODULES = ("data", "metrics", "model", "engine", "tuning", "inference")
# Former modules, {old name: new module}: still attributes of clmf, with a FutureWarning (the old
# modules themselves are gone, so ``import clmf.datasets`` fails).
_RENAMED = {"datasets": "data", "splits": "data.splits"}


def __getattr__(name):  # lazy imports keep `import clmf` cheap and free of OpenCL until needed
    """The public names that need OpenCL or the data stack, imported on first access."""
    if name == "ALS":
        from .model.estimator import ALS
        return ALS
    if name in ("devices", "select_device"):
        from .engine import device
        return getattr(device, name)
    if name == "KernelConfig":
        from .engine.config import KernelConfig
        return KernelConfig
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f".{name}", __name__)
    if name in _RENAMED:
        import importlib
        import warnings
        new = f"clmf.{_RENAMED[name]}"
        warnings.warn(f"clmf.{name} is now {new}: use {new} (clmf.{name} will be removed)",
                      FutureWarning, stacklevel=2)
        return importlib.import_module(new)
    if name == "NotFittedError":
        from .errors import not_fitted_error
        return not_fitted_error()
    if name == "load":
        from .model.persistence import load
        return load
    if name == "evaluate":
        from .inference.evaluation import evaluate
        return evaluate
    raise AttributeError(f"module 'clmf' has no attribute {name!r}")


def __dir__():
    """The public API (what ``__all__`` names) and the lazily imported submodules."""
    return sorted(set(__all__) | set(_SUBMODULES) | set(globals()))
