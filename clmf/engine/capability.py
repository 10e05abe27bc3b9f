"""Device capabilities learned by building a tiny kernel in a child process, once per machine.

Some OpenCL runtimes abort the whole process (an ``LLVM ERROR``, not a build error pyopencl could
catch) on code they cannot compile. PyPI's PoCL 3.0 (``pocl-binary-distribution``, a generic
x86-64 build) does so on every ``fma``/``mad`` of 16-wide float vectors (``Cannot select: i64 =
fma``), after 20–155 s of compiler time, while Debian's PoCL and Intel's runtime build them. Such a
fact is a property of the runtime, not of one kernel configuration, so it is checked once with a
kernel of a few lines (about a second) instead of by probing every configuration in turn (minutes):

* :func:`wide_vectors_ok` — 16-wide float vector arithmetic (``fma``, ``mad``, ``vload16``) builds
  and runs. :func:`clmf.engine.kernels.validate` refuses configurations whose widest vector is 16
  lanes (``vec16``, ``solve_vec=16``) where it does not, with reason ``unsupported_device``, so
  neither the tuning lookup nor the tuner ever builds them there.

Verdicts are cached per (platform, device, driver, clmf version) in
``<cache dir>/device-capabilities.json``; ``CLMF_PROBE=off`` skips the check (assumed fine).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading

log = logging.getLogger(__name__)

__all__ = ["wide_vectors_ok", "describe_exit", "CHECK_TIMEOUT"]

CHECK_TIMEOUT = 30.0           # seconds: a runtime that needs longer for a few lines fails it
_lock = threading.Lock()
_known: dict = {}              # (platform, device, driver) -> bool, this process

# 16-wide float arithmetic as the kernels use it: fma of float16 vectors (PyPI's PoCL aborts on it
# at once; with vload16 in the same kernel its compiler spins for minutes instead)
_WIDE_SRC = """
__kernel void clmf_cap_wide(__global float16 *a, __global const float16 *b) {
    const size_t i = get_global_id(0);
    const float16 x = a[i];
    a[i] = fma(x, b[i], x);
}
"""


def describe_exit(rc):
    """A child process's exit status in words (the signal's name when it was killed)."""
    if rc < 0:
        try:
            return f"the child process was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"the child process was killed by signal {-rc}"
    return f"the child process exited with status {rc}"


def _cache_path():
    """The on-disk cache of capability verdicts."""
    from ..cache import cache_dir
    return cache_dir() / "device-capabilities.json"


def _present(info):
    """Whether this process sees an OpenCL device with ``info``'s platform and name."""
    try:
        import pyopencl as cl
        return any(p.name.strip() == info.platform and
                   any(d.name.strip() == info.name for d in p.get_devices())
                   for p in cl.get_platforms())
    except Exception as e:  # noqa: BLE001 - no OpenCL: nothing to check
        log.debug("cannot list OpenCL devices: %s", e)
        return False


def wide_vectors_ok(info):
    """Whether the device's runtime builds and runs 16-wide float vector arithmetic (checked once
    per machine in a child process; True for a device this process cannot see)."""
    from .._version import __version__
    ident = (str(info.platform), str(info.name), str(info.driver))
    with _lock:
        if ident in _known:
            return _known[ident]
    if os.environ.get("CLMF_PROBE", "").strip().lower() == "off" or not _present(info):
        return True
    key = json.dumps(["wide_vectors", *ident, __version__])
    path = _cache_path()
    from ..cache import read_json_object, update_json_object
    hit = read_json_object(path).get(key)
    if isinstance(hit, dict) and isinstance(hit.get("ok"), bool):
        ok = hit["ok"]
    else:
        ok, why = _check_in_child({"platform": ident[0], "device": ident[1]})
        if not ok:
            log.warning("%s | %s (driver %s) cannot compile 16-wide vector arithmetic (%s): "
                        "configurations with 16-lane vectors are not used on it",
                        ident[0], ident[1], ident[2], why)
        update_json_object(path, key, {"ok": ok, "reason": why})
    with _lock:
        _known[ident] = ok
    return ok


def _check_in_child(job):
    """(ok, reason) of building and running the wide-vector kernel in a child process."""
    cmd = [sys.executable, "-m", __spec__.name if __spec__ else "clmf.engine.capability"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        res = subprocess.run(cmd, input=json.dumps(job), capture_output=True, text=True,
                             timeout=CHECK_TIMEOUT, cwd=root)
    except subprocess.TimeoutExpired:
        return False, f"the check did not finish in {CHECK_TIMEOUT:.0f} s"
    except OSError as e:
        log.warning("cannot start a capability check (%s); assumed fine", e)
        return True, None
    if res.returncode == 0:
        return True, None
    lines = [ln.strip() for ln in (res.stderr or "").splitlines() if ln.strip()]
    last = next((ln for ln in lines if ln.startswith("LLVM ERROR")), lines[-1] if lines else "")
    return False, describe_exit(res.returncode) + (f" ({last[:200]})" if last else "")


def _child(job):
    """The check's child: build and run :data:`_WIDE_SRC` on the named device."""
    import numpy as np
    import pyopencl as cl
    dev = next((d for p in cl.get_platforms() if p.name.strip() == job["platform"]
                for d in p.get_devices() if d.name.strip() == job["device"]), None)
    if dev is None:
        raise SystemExit(f"clmf capability check: device {job['platform']} | {job['device']} "
                         "not found")
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    a = np.arange(64, dtype=np.float32)
    b = np.full(64, 2.0, np.float32)
    mf = cl.mem_flags
    da = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=a)
    db = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
    cl.Program(ctx, _WIDE_SRC).build().clmf_cap_wide(q, (4,), None, da, db)
    out = np.empty_like(a)
    cl.enqueue_copy(q, out, da)
    q.finish()
    if not np.allclose(out, a * 2 + a, rtol=1e-6):
        raise SystemExit("clmf capability check: wrong results from 16-wide vector arithmetic")


if __name__ == "__main__":      # python -m clmf.engine.capability < job.json
    _child(json.loads(sys.stdin.read()))
