"""clmf: portable, autotuned ALS matrix factorization on any OpenCL device.

Quick start::

    import clmf
    train, test = clmf.datasets.default()
    model = clmf.ALS(factors=32, regularization=0.05, iterations=10).fit(train)
    print(model.rmse(test))
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import reference  # noqa: F401  (pure NumPy ground truth, always importable)
from .errors import (ClmfError, NoOpenCLError, SingularSystemError, DeviceMemoryError,
                     InvalidConfigError, HostMemoryError, RatingRangeError)

__all__ = [
    "ALS", "devices", "select_device", "KernelConfig", "reference", "datasets",
    "ClmfError", "NoOpenCLError", "SingularSystemError", "DeviceMemoryError", "InvalidConfigError",
    "HostMemoryError", "RatingRangeError",
    "__version__",
]


def __getattr__(name):  # lazy imports keep `import clmf` cheap and free of OpenCL until needed
    if name == "ALS":
        from .model import ALS
        return ALS
    if name in ("devices", "select_device"):
        from . import device
        return getattr(device, name)
    if name == "KernelConfig":
        from .config import KernelConfig
        return KernelConfig
    if name in ("datasets", "metrics", "splits", "model", "engine", "kernels", "device", "config"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    if name == "load":
        from .model import load
        return load
    raise AttributeError(f"module 'clmf' has no attribute {name!r}")
