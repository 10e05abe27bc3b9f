"""Exception types raised by clmf."""


class ClmfError(Exception):
    """Base class of clmf's own errors."""


class NoOpenCLError(ClmfError, RuntimeError):
    """No OpenCL platform/device is available (or none matches the request)."""


class InvalidConfigError(ClmfError, ValueError):
    """A kernel configuration is invalid for the device or the problem; ``reason`` says why."""

    def __init__(self, message, reason="invalid"):
        super().__init__(message)
        self.reason = reason


class DeviceMemoryError(ClmfError, MemoryError):
    """The problem does not fit in the device's memory; ``needed`` and ``available`` are bytes
    (None where not known)."""

    def __init__(self, message, needed=None, available=None):
        super().__init__(message)
        self.needed = needed
        self.available = available


class HostMemoryError(ClmfError, MemoryError):
    """The fit's host arrays would not fit in the host's available memory; ``needed`` and
    ``available`` are bytes."""

    def __init__(self, message, needed=None, available=None):
        super().__init__(message)
        self.needed = needed
        self.available = available


class RatingRangeError(ClmfError, ValueError):
    """Ratings outside the range the kernels' float32 (or float16 storage) arithmetic handles:
    the normal equations overflow, or their entries grow so large that the regularization falls
    below float32 precision. The message names the range that works."""


class MissingColumnError(ClmfError, KeyError, ValueError):
    """A table of ratings (a DataFrame, an Arrow table, a file's header) lacks a named column;
    a ``KeyError`` (as pandas' lookup) and a ``ValueError`` (bad input). The message lists the
    columns found."""

    def __str__(self):
        """The message as given (a ``KeyError`` would show it quoted)."""
        return str(self.args[0]) if self.args else ""


class SingularSystemError(ClmfError, ValueError):
    """A normal-equation system was not positive definite (e.g. regularization=0 with too few ratings)."""


_not_fitted = None


def not_fitted_error():
    """The NotFittedError class, made on first use: a subclass of scikit-learn's
    ``sklearn.exceptions.NotFittedError`` when scikit-learn is installed (so scikit-learn's
    tooling catches it), else of ``ValueError`` and ``AttributeError`` as scikit-learn's is;
    ``RuntimeError`` too, which clmf raised before. Made lazily: importing scikit-learn takes
    seconds, and only an unfitted model's error needs it."""
    global _not_fitted
    if _not_fitted is None:
        try:
            from sklearn.exceptions import NotFittedError as sk_not_fitted
            bases = (ClmfError, sk_not_fitted, RuntimeError)
        except ImportError:
            bases = (ClmfError, ValueError, AttributeError, RuntimeError)
        _not_fitted = type("NotFittedError", bases, {
            "__module__": __name__,
            "__doc__": "The model is not fitted yet (scikit-learn's NotFittedError semantics: a "
                       "ValueError and an AttributeError, so ``hasattr`` on a fitted-only "
                       "attribute is False)."})
    return _not_fitted


def __getattr__(name):  # clmf.errors.NotFittedError, created on first access
    if name == "NotFittedError":
        return not_fitted_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
