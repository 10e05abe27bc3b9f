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


class SingularSystemError(ClmfError, ValueError):
    """A normal-equation system was not positive definite (e.g. regularization=0 with too few ratings)."""
