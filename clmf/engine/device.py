"""The one home of the device rules: choosing OpenCL devices, contexts and queues, the device key.

``device=`` accepts ``"auto"`` (prefers a GPU, then any accelerator, then a CPU), ``"cpu"``,
``"gpu"``, ``"accelerator"``, a case-insensitive substring of ``"platform name | device name"``,
``"P:D"`` indices (as ``PYOPENCL_CTX`` uses them), or a :class:`pyopencl.Device`
(:func:`select_device`, parsed by :func:`parse_spec`); for several devices also ``"gpu:all"``,
``"cpu:all"``, ``"accelerator:all"`` and lists of any of those (:func:`select_devices`). With
``"auto"`` the environment variable ``CLMF_DEVICE`` (same grammar) and then ``PYOPENCL_CTX`` are
honoured first (:func:`auto_spec`). A Dask worker's device follows :func:`worker_device`; the
``"platform | device"`` label that names a device (and selects it again) is :func:`device_label`;
``CLMF_REQUIRE_PLATFORMS`` (the set-up's check) is :func:`missing_platforms`.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
from collections.abc import Mapping

from ..errors import NoOpenCLError

log = logging.getLogger(__name__)

__all__ = ["DeviceInfo", "devices", "select_device", "pick_device", "get_context", "device_info",
           "device_key", "select_devices", "spec_from_text", "first_device", "worker_device",
           "pick_worker", "find_device", "device_present", "device_label", "label", "platform_short",
           "parse_spec",
           "auto_spec", "missing_platforms", "DEVICE_ENV", "PYOPENCL_ENV",
           "REQUIRE_PLATFORMS_ENV", "TYPES"]

# the environment variables that pick devices: the device of device="auto" (this grammar), then
# pyopencl's own choice ("P:D" or "P"); the platforms the set-up's check requires ("A,B": names
# containing A and B)
DEVICE_ENV = "CLMF_DEVICE"
PYOPENCL_ENV = "PYOPENCL_CTX"
REQUIRE_PLATFORMS_ENV = "CLMF_REQUIRE_PLATFORMS"
# the device types a spec names ("gpu", "cpu:all", ...), in the order "auto" prefers them
TYPES = ("GPU", "ACCELERATOR", "CPU")
_ALL = ":all"

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
        return (f"[{self.index}] {label(self.platform, self.name)} ({self.type}, "
                f"{self.compute_units} CUs, {self.global_mem / 2**30:.1f} GiB, "
                f"local {self.local_mem // 1024} KiB, "
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


_TYPE_ORDER = {t: k for k, t in enumerate((*TYPES, "OTHER"))}


def label(platform, name):
    """``"platform | device"`` of a platform name and a device name: the label that names a
    device in messages, records and ``device_`` and, as a ``device=`` string, selects it again."""
    return f"{platform.strip()} | {name.strip()}"


def device_label(device):
    """:func:`label` of a :class:`pyopencl.Device`, a :class:`DeviceInfo` (or any object with
    ``platform`` and ``name``) or a tuning record's device (a mapping with ``"platform"`` and
    ``"device"`` names)."""
    if isinstance(device, Mapping):
        return label(device["platform"], device["device"])
    platform = device.platform
    return label(platform if isinstance(platform, str) else platform.name, device.name)


def thread_safe(device):
    """Whether ``device``'s runtime takes OpenCL calls from two threads at once (OpenCL 1.1+
    requires it; Oclgrind crashes on it, so background builds and the engine's warm-up work are
    skipped there). By the platform's name only."""
    return "oclgrind" not in device.platform.name.lower()


def platform_short(platform):
    """A platform's short name for file names and test ids (``"pocl"``, ``"intel"``,
    ``"nvidia"``, ``"amd"``, else its first letters and digits), from the platform's name only:
    never the device's (PoCL's holds the CPU's, "pthread-skylake-avx512-Intel(R) Xeon(R) ...")."""
    plat = platform.lower()
    return ("pocl" if "portable" in plat else "intel" if "intel" in plat else
            "nvidia" if "nvidia" in plat else "amd" if ("amd" in plat or "rocm" in plat) else
            re.sub(r"[^a-z0-9]+", "", plat)[:10] or "ocl")


def parse_spec(spec):
    """``(kind, value)`` of a device string, no OpenCL calls: ``("auto", None)``,
    ``("type", "GPU")`` (``"gpu"``, ``"cpu"``, ``"accelerator"``), ``("index", "P:D")``
    (``"P:D"`` or ``"P"``), ``("all", "GPU")`` (``"gpu:all"``, ...; the type unchecked) or
    ``("name", spec)`` (a substring of platform, then device names: :func:`pick_device`)."""
    s = spec.strip()
    low = s.lower()
    if low == "auto":
        return "auto", None
    if low.upper() in TYPES:
        return "type", low.upper()
    if re.fullmatch(r"\d+(:\d+)?", s):
        return "index", s if ":" in s else s + ":0"
    if low.endswith(_ALL):
        return "all", low[:-len(_ALL)].upper()
    return "name", s


def auto_spec():
    """``(spec, origin)`` that ``device="auto"`` stands for: ``CLMF_DEVICE``, else
    ``PYOPENCL_CTX`` (``"P"`` meaning ``"P:0"``), else ``"auto"`` itself."""
    env = os.environ.get(DEVICE_ENV)
    if env:
        return env, f"{DEVICE_ENV}="
    ctx = os.environ.get(PYOPENCL_ENV)
    if ctx:
        return (ctx + ":0" if ":" not in ctx and ctx.isdigit() else ctx), f"{PYOPENCL_ENV}="
    return "auto", "device="


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
        spec, origin = auto_spec()
    found = all_devices()
    return found[pick_device(spec, _entries(found), origin)][2]


def _entries(found):
    """``(index "P:D", platform name, device name, type)`` of each device of :func:`all_devices`
    (what :func:`pick_device` reads)."""
    return [(i, p.name.strip(), d.name.strip(), type_name(d)) for i, p, d in found]


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
    kind, value = parse_spec(spec)
    low = spec.strip().lower()
    if kind == "auto":
        return min(range(len(entries)), key=lambda k: (_TYPE_ORDER.get(entries[k][3], 3),
                                                       entries[k][0]))
    if kind == "type":
        tiers = [[k for k, e in enumerate(entries) if e[3] == value]]
    elif kind == "index":
        tiers = [[k for k, e in enumerate(entries) if e[0] == value]]
    else:                   # a name ("gpu:all" too, which names no one device: no match)
        tiers = [[k for k, e in enumerate(entries) if low in e[1].lower()],
                 [k for k, e in enumerate(entries) if low in e[2].lower()],
                 [k for k, e in enumerate(entries) if low in label(e[1], e[2]).lower()]]
    for match in tiers:
        if match:
            return match[0]
    avail = "; ".join(f"[{i}] {label(p, d)}" for i, p, d, _t in entries)
    raise NoOpenCLError(f"no OpenCL device matches {origin}{spec!r}; available: {avail}")


def select_devices(spec):
    """Resolve ``ALS(device=...)`` to a list of distinct :class:`pyopencl.Device`.

    ``spec`` is anything :func:`select_device` accepts (one device), ``"gpu:all"``,
    ``"cpu:all"`` or ``"accelerator:all"`` (every device of that type, in platform order), or a
    list/tuple of those (any mix). A device named twice is an error.
    """
    cl = _cl()
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise ValueError("device list is empty")
        out = []
        for s in spec:
            out.extend(select_devices(s))
    elif isinstance(spec, str) and parse_spec(spec)[0] == "all":
        kind = parse_spec(spec)[1]
        if kind not in TYPES:
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


def spec_from_text(text):
    """The device spec a command line's text stands for: a comma-separated list of specs becomes
    a list (``"0:0,0:1"``), anything else stays one spec (``"gpu:all"``)."""
    return [s for s in text.split(",") if s] if "," in text else text


def first_device(spec):
    """The first device of ``spec`` in the grammar of :func:`select_devices` (a model fitted on
    several devices ranks on all of them: :mod:`clmf.inference.resident`)."""
    return select_devices(spec)[0]


def worker_device(spec, rank):
    """A Dask worker's OpenCL device: ``CLMF_DEVICE`` in its environment when ``spec`` is "auto",
    else ``spec`` itself when it names one device, else (``"gpu"``, ``"cpu"``, ``"accelerator"``,
    ``"auto"``) the ``rank``-th device (modulo their number) of that type on this host (rank: the
    worker's position among the fit's workers on the host)."""
    if spec == "auto" and os.environ.get(DEVICE_ENV):
        return select_device("auto")
    if isinstance(spec, str) and parse_spec(spec)[0] in ("auto", "type"):
        spec, origin = auto_spec() if spec == "auto" else (spec, "device=")
        found = all_devices()
        return found[pick_worker(spec, rank, _entries(found), origin)][2]
    return select_device(spec)


def pick_worker(spec, rank, entries, origin="device="):
    """The position in ``entries`` (as :func:`pick_device` takes them) of worker ``rank``'s
    device for a ``spec`` that names a type or ``"auto"``: the type of the device ``spec``
    selects, and of the devices of that type the ``rank``-th (modulo their number)."""
    kind = entries[pick_device(spec, entries, origin)][3]
    same = [k for k, e in enumerate(entries) if e[3] == kind]
    return same[rank % len(same)]


def find_device(platform, name):
    """The pyopencl device of this platform and device name (exact, stripped), or None (not seen,
    or no OpenCL at all): how a child process finds its parent's device."""
    try:
        return next((d for _i, p, d in all_devices()
                     if p.name.strip() == platform and d.name.strip() == name), None)
    except Exception as e:  # noqa: BLE001 - no OpenCL: no device
        log.debug("cannot list OpenCL devices: %s", e)
        return None


def device_present(info):
    """Whether this process sees an OpenCL device with ``info``'s platform and name."""
    return find_device(info.platform, info.name) is not None


def missing_platforms(names, required=None):
    """The required platforms (``required``, default ``CLMF_REQUIRE_PLATFORMS``: comma-separated)
    that no platform in ``names`` contains; platform names only, never device names (PoCL's
    device name holds the CPU's, "Intel(R) Xeon(R) ...")."""
    if required is None:
        required = os.environ.get(REQUIRE_PLATFORMS_ENV, "")
    if isinstance(required, str):
        required = required.split(",")
    return [r.strip() for r in required
            if r.strip() and not any(r.strip() in n for n in names)]


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
