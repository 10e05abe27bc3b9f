"""Choosing an OpenCL platform/device, contexts and queues, and the device key.

``device=`` accepts ``"auto"`` (prefers a GPU, then any accelerator, then a CPU), ``"cpu"``,
``"gpu"``, a case-insensitive substring of ``"platform name | device name"``, ``"P:D"`` indices
(as ``PYOPENCL_CTX`` uses them), or a :class:`pyopencl.Device`. With ``"auto"`` the environment
variable ``CLMF_DEVICE`` (same grammar) and then ``PYOPENCL_CTX`` are honoured first.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading

from ..errors import NoOpenCLError

log = logging.getLogger(__name__)

__all__ = ["DeviceInfo", "devices", "select_device", "pick_device", "get_context", "device_info",
           "device_key"]

INSTALL_HINT = (
    "No OpenCL platform found. Install an OpenCL runtime, e.g. on Debian/Ubuntu "
    "`sudo apt-get install pocl-opencl-icd ocl-icd-libopencl1` (PoCL, runs on any CPU), "
    "or run `make setup` in the clmf source tree; GPU vendors ship their own (NVIDIA driver, ROCm, "
    "Intel compute runtime). `clinfo` lists what the ICD loader sees; OCL_ICD_VENDORS selects "
    "the directory of .icd files it reads.")

_lock = threading.Lock()
_contexts: dict = {}


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What the kernels care about on one OpenCL device (see :func:`devices`)."""

    index: str               # "P:D"
    platform: str
    platform_version: str
    vendor: str
    name: str
    type: str                # "GPU", "CPU", "ACCELERATOR", ...
    driver: str
    opencl_c_version: str
    compute_units: int
    global_mem: int
    max_alloc: int
    local_mem: int
    local_mem_type: str      # "local" (dedicated) or "global" (emulated)
    max_work_group_size: int
    max_work_item_sizes: tuple
    preferred_vector_width_float: int
    native_vector_width_float: int
    clock_mhz: int
    compute_capability: tuple = (0, 0)   # NVIDIA (major, minor); (0, 0) elsewhere

    def __str__(self):
        return (f"[{self.index}] {self.platform} | {self.name} ({self.type}, {self.compute_units} CUs, "
                f"{self.global_mem / 2**30:.1f} GiB, local {self.local_mem // 1024} KiB, "
                f"wg ≤ {self.max_work_group_size}, float vec {self.preferred_vector_width_float}, "
                f"{self.opencl_c_version}, driver {self.driver})")


def _cl():
    try:
        import pyopencl as cl
    except ImportError as e:  # pragma: no cover - dependency of the package
        raise NoOpenCLError("pyopencl is not installed: `pip install pyopencl`. " + INSTALL_HINT) from e
    return cl


def all_devices():
    """``("P:D", platform, device)`` of every OpenCL device (:class:`NoOpenCLError` if none)."""
    cl = _cl()
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:
        raise NoOpenCLError(f"{INSTALL_HINT} (ICD loader said: {e})") from None
    out = []
    for p_i, p in enumerate(platforms):
        try:
            devs = p.get_devices()
        except cl.Error:
            continue
        for d_i, d in enumerate(devs):
            out.append((f"{p_i}:{d_i}", p, d))
    if not out:
        raise NoOpenCLError(INSTALL_HINT)
    return out


def type_name(d):
    """A device's type: ``GPU``, ``CPU``, ``ACCELERATOR`` or ``OTHER``."""
    cl = _cl()
    t = d.type
    for name in ("GPU", "CPU", "ACCELERATOR"):
        if t & getattr(cl.device_type, name):
            return name
    return "OTHER"


def device_info(device, index="?"):
    """:class:`DeviceInfo` of a :class:`pyopencl.Device`."""
    cl = _cl()
    p = device.platform
    return DeviceInfo(
        index=index, platform=p.name.strip(), platform_version=p.version.strip(),
        vendor=device.vendor.strip(), name=device.name.strip(), type=type_name(device),
        driver=device.driver_version.strip(), opencl_c_version=device.opencl_c_version.strip(),
        compute_units=int(device.max_compute_units), global_mem=int(device.global_mem_size),
        max_alloc=int(device.max_mem_alloc_size), local_mem=int(device.local_mem_size),
        local_mem_type="local" if device.local_mem_type == cl.device_local_mem_type.LOCAL else "global",
        max_work_group_size=int(device.max_work_group_size),
        max_work_item_sizes=tuple(int(x) for x in device.max_work_item_sizes),
        preferred_vector_width_float=int(device.preferred_vector_width_float),
        native_vector_width_float=int(device.native_vector_width_float),
        clock_mhz=int(device.max_clock_frequency),
        compute_capability=_compute_capability(device),
    )


def _compute_capability(device):
    """(major, minor) of an NVIDIA device (``cl_nv_device_attribute_query``), else (0, 0)."""
    cl = _cl()
    if "cl_nv_device_attribute_query" not in (device.extensions or ""):
        return (0, 0)
    try:
        return (int(device.get_info(cl.device_info.COMPUTE_CAPABILITY_MAJOR_NV)),
                int(device.get_info(cl.device_info.COMPUTE_CAPABILITY_MINOR_NV)))
    except (cl.Error, AttributeError):
        return (0, 0)


def devices():
    """List every OpenCL device visible, with the properties the kernels care about.

    Returns
    -------
    list of :class:`DeviceInfo`

    Examples
    --------
    >>> for d in clmf.devices():  # doctest: +SKIP
    ...     print(d)
    """
    return [device_info(d, idx) for idx, _p, d in all_devices()]


_TYPE_ORDER = {"GPU": 0, "ACCELERATOR": 1, "CPU": 2, "OTHER": 3}


def select_device(spec="auto"):
    """Resolve a device specification to a :class:`pyopencl.Device`.

    Parameters
    ----------
    spec : "auto" | "cpu" | "gpu" | "P:D" | name substring | pyopencl.Device
        A name substring matches platform names before device names (see :func:`pick_device`).

    Raises
    ------
    NoOpenCLError if no platform exists or nothing matches ``spec``.

    Examples
    --------
    >>> select_device("cpu")  # doctest: +SKIP
    <pyopencl.Device 'pthread-...' on 'Portable Computing Language'>
    """
    cl = _cl()
    if isinstance(spec, cl.Device):
        return spec
    if spec is None:
        spec = "auto"
    if not isinstance(spec, str):
        raise TypeError(f"device must be a string or pyopencl.Device, not {type(spec).__name__}")
    origin = "device="
    if spec == "auto":
        env = os.environ.get("CLMF_DEVICE")
        if env:
            spec, origin = env, "CLMF_DEVICE="
        elif os.environ.get("PYOPENCL_CTX"):
            spec, origin = os.environ["PYOPENCL_CTX"], "PYOPENCL_CTX="
            if ":" not in spec and spec.isdigit():
                spec = spec + ":0"
    found = all_devices()
    entries = [(i, p.name.strip(), d.name.strip(), type_name(d)) for i, p, d in found]
    return found[pick_device(spec, entries, origin)][2]


def pick_device(spec, entries, origin="device="):
    """The position in ``entries`` — ``(index "P:D", platform name, device name, type)`` per
    device, in platform order — of the device a string ``spec`` selects (the grammar of
    :func:`select_device`; no OpenCL calls, so it is testable on any host's device list).

    A name substring matches platform names first: on an Intel host PoCL's device name contains
    the CPU's ("pthread-skylake-avx512-Intel(R) Xeon(R) ..."), so ``"Intel"`` must select Intel's
    platform, not PoCL. Only when no platform name contains it are device names searched, then
    ``"platform | device"`` as a whole. Within a tier the first device in platform order wins.
    Raises :class:`NoOpenCLError` when nothing matches.
    """
    s = spec.strip()
    low = s.lower()
    if low == "auto":
        return min(range(len(entries)), key=lambda k: (_TYPE_ORDER.get(entries[k][3], 3),
                                                       entries[k][0]))
    if low in ("cpu", "gpu", "accelerator"):
        tiers = [[k for k, e in enumerate(entries) if e[3] == low.upper()]]
    elif re.fullmatch(r"\d+(:\d+)?", s):
        key = s if ":" in s else s + ":0"
        tiers = [[k for k, e in enumerate(entries) if e[0] == key]]
    else:
        tiers = [[k for k, e in enumerate(entries) if low in e[1].lower()],
                 [k for k, e in enumerate(entries) if low in e[2].lower()],
                 [k for k, e in enumerate(entries) if low in f"{e[1]} | {e[2]}".lower()]]
    for match in tiers:
        if match:
            return match[0]
    avail = "; ".join(f"[{i}] {p} | {d}" for i, p, d, _t in entries)
    raise NoOpenCLError(f"no OpenCL device matches {origin}{spec!r}; available: {avail}")


def get_context(device):
    """A memoized (context, profiling queue) pair for one device; safe to call repeatedly."""
    cl = _cl()
    key = device.int_ptr
    with _lock:
        hit = _contexts.get(key)
        if hit is None:
            ctx = cl.Context([device])
            queue = cl.CommandQueue(ctx, device,
                                    properties=cl.command_queue_properties.PROFILING_ENABLE)
            hit = _contexts[key] = (ctx, queue)
        return hit


def _norm(s):
    return re.sub(r"\s+", " ", s.strip())


def device_key(device):
    """Normalised identity used by the tuning database: platform, vendor, type, device name,
    plus the driver (recorded, not matched exactly)."""
    info = device_info(device)
    return {"platform": _norm(info.platform), "vendor": _norm(info.vendor), "type": info.type,
            "device": _norm(info.name), "driver": info.driver}
