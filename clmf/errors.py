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
    """The problem does not fit in the device's memory."""


class SingularSystemError(ClmfError, ValueError):
    """A normal-equation system was not positive definite (e.g. regularization=0 with too few ratings)."""
