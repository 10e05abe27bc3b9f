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

from .device import device_label, device_present, find_device

log = logging.getLogger(__name__)

__all__ = ["wide_vectors_ok", "describe_exit", "package_root", "run_child", "PROBE_ENV",
           "CHECK_TIMEOUT"]

# "auto" (default), "always" or "off": the probes of clmf.tuning.fallback and, with "off", the
# checks here too
PROBE_ENV = "CLMF_PROBE"
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


def package_root():
    """The folder that holds the clmf package this module belongs to."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_child(cmd, job, timeout, what):
    """Run ``cmd`` (a ``python -m`` child of this clmf) with ``job`` as JSON on its stdin, in the
    folder that holds this clmf package (so ``-m`` imports this clmf, not a source checkout that
    happens to be the working directory). Returns ``(started, reason)``: ``started`` False when
    no child could be started (logged); ``reason`` None when it exited 0, else the exit status or
    signal and the line that names the cause best (a runtime's ``LLVM ERROR``, a ``clmf ...:``
    message of the child, else the last line that is not a traceback frame); ``what`` names the
    work in a timeout's reason."""
    try:
        res = subprocess.run(cmd, input=json.dumps(job), capture_output=True, text=True,
                             timeout=timeout, cwd=package_root())
    except subprocess.TimeoutExpired:
        return True, f"{what} did not finish in {timeout:.0f} s"
    except OSError as e:
        log.warning("cannot start a child process for %s (%s)", what, e)
        return False, None
    if res.returncode == 0:
        return True, None
    lines = [ln.strip() for ln in (res.stderr or "").splitlines()
             if ln.strip() and not ln.startswith((" ", "\t"))]
    last = next((ln for ln in lines if ln.startswith(("LLVM ERROR", "clmf "))),
                lines[-1] if lines else "")
    return True, describe_exit(res.returncode) + (f" ({last[:300]})" if last else "")


def _cache_path():
    """The on-disk cache of capability verdicts."""
    from ..cache import cache_dir
    return cache_dir() / "device-capabilities.json"


def wide_vectors_ok(info):
    """Whether the device's runtime builds and runs 16-wide float vector arithmetic (checked once
    per machine in a child process; True for a device this process cannot see)."""
    from .._version import __version__
    ident = (str(info.platform), str(info.name), str(info.driver))
    with _lock:
        if ident in _known:
            return _known[ident]
    if os.environ.get(PROBE_ENV, "").strip().lower() == "off" or not device_present(info):
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
            log.warning("%s (driver %s) cannot compile 16-wide vector arithmetic (%s): "
                        "configurations with 16-lane vectors are not used on it",
                        device_label(info), ident[2], why)
        update_json_object(path, key, {"ok": ok, "reason": why})
    with _lock:
        _known[ident] = ok
    return ok


def _check_in_child(job):
    """(ok, reason) of building and running the wide-vector kernel in a child process (ok when
    no child could be started: assumed fine)."""
    cmd = [sys.executable, "-m", __spec__.name if __spec__ else "clmf.engine.capability"]
    started, reason = run_child(cmd, job, CHECK_TIMEOUT, "the check")
    return (reason is None, reason) if started else (True, None)


def _child(job):
    """The check's child: build and run :data:`_WIDE_SRC` on the named device."""
    import numpy as np
    import pyopencl as cl
    dev = find_device(job["platform"], job["device"])
    if dev is None:
        raise SystemExit(f"clmf capability check: device {device_label(job)} "
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
