"""Several devices for one fit: lists of device specs and ``"gpu:all"`` / ``"cpu:all"``."""
from __future__ import annotations

__all__ = ["select_devices", "device_label"]


def select_devices(spec):
    """Resolve ``ALS(device=...)`` to a list of distinct :class:`pyopencl.Device`.

    ``spec`` is anything :func:`clmf.select_device` accepts (one device), ``"gpu:all"``,
    ``"cpu:all"`` or ``"accelerator:all"`` (every device of that type, in platform order), or a
    list/tuple of those (any mix). A device named twice is an error.
    """
    import pyopencl as cl

    from ..engine.device import all_devices, select_device, type_name
    from ..errors import NoOpenCLError
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise ValueError("device list is empty")
        out = []
        for s in spec:
            out.extend(select_devices(s))
    elif isinstance(spec, str) and spec.strip().lower().endswith(":all"):
        kind = spec.strip().lower()[:-4].upper()
        if kind not in ("GPU", "CPU", "ACCELERATOR"):
            raise ValueError(f"unknown device type in {spec!r}; use gpu:all, cpu:all or "
                             "accelerator:all")
        out = [d for _i, _p, d in all_devices() if type_name(d) == kind]
        if not out:
            raise NoOpenCLError(f"no OpenCL device of type {kind} for device={spec!r}")
    else:
        out = [select_device(spec)]
    seen = set()
    for d in out:
        key = d.int_ptr if isinstance(d, cl.Device) else id(d)
        if key in seen:
            raise ValueError(f"device {device_label(d)!r} is named twice in device={spec!r}")
        seen.add(key)
    return out


def device_label(device):
    """``"platform | device"`` of a device (the string that selects it again)."""
    return f"{device.platform.name.strip()} | {device.name.strip()}"
