"""Configurations that cannot run on a device: reported once, skipped by the tuning lookup.

A kernel configuration chosen by :func:`clmf.tuning.choose` (a tuned, nearest, vendor or computed
default record, or the heuristic) may still fail on the device at hand: its build fails, the
compiler drops a kernel, a kernel's own work-group or local-memory limit is lower than the
configuration needs, or the runtime's code generator aborts the process when the kernel is first
launched (PyPI's PoCL 3.0 on a CPU without AVX-512 does that on ``vec16`` kernels tuned with
Debian's PoCL). A database must never break a fit, so:

* a configuration that failed is *rejected* for the (device, configuration, f, mode) in this
  process: :func:`reject` issues one :class:`TuningFallbackWarning` naming the configuration, its
  source and the reason, and the lookup falls through to the next rule, down to the plain
  ``batch`` variant;
* a configuration that was never run on this device and driver (a record of another device or
  driver, the computed default) is first *probed* in a child process (:func:`probe`); one that
  a database records as run here — a record of this device name and driver (:func:`ran_here`),
  or the same configuration in the fit's mode in a best record or an ok measurement of this
  device and driver (the shipped tunings included) — was built and run here already and is not
  probed. The child builds the configuration and runs one ALS iteration on a tiny problem, so
  a crash of the runtime kills the child, not the caller. Verdicts are cached on disk per
  (device, driver, clmf version, kernel templates, configuration, f, mode) in clmf's cache
  directory (:func:`clmf.cache.cache_dir`: ``$CLMF_CACHE_DIR``, else the user's cache
  directory), so a probe runs once per machine. ``CLMF_PROBE=off``
  disables probing, ``CLMF_PROBE=always`` probes every configuration taken from a database or
  the computed default, this device's own tunings too.
  The heuristic and the baseline (clmf's own plain kernels) are checked in process only.

Configurations given by the caller (``ALS(variant=...)``) are never replaced: their failures
raise :class:`clmf.InvalidConfigError`.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import math
import os
import sys
import threading
import time
import warnings

from ..cache import cache_dir, read_json_object, update_json_object
from ..engine.capability import PROBE_ENV, package_root, run_child
from ..engine.device import device_label, device_present, find_device

log = logging.getLogger(__name__)

__all__ = ["TuningFallbackWarning", "reject", "rejection", "usable", "ran_here", "probe",
           "probe_cache_path", "probe_timeout", "show_progress", "PROBE_ENV", "PROBE_TIMEOUT",
           "PROBE_TIMEOUT_ENV"]

# Seconds a child may take to build and run one configuration on its tiny problem. A working
# configuration takes 2-5 s on an idle 2-core CPU (PyPI's PoCL: 3.5 s, most of it the build) and
# 20 s on a loaded one; the failures seen on runtimes that cannot compile a kernel were a crash
# after 20-155 s of compiler time (the 16-wide vector ones are now refused at once by
# clmf.engine.capability). A configuration that needs longer is rejected like one that crashed:
# the lookup falls through to the next rule. ``CLMF_PROBE_TIMEOUT`` (seconds) overrides it.
PROBE_TIMEOUT = 45.0
PROBE_TIMEOUT_ENV = "CLMF_PROBE_TIMEOUT"

_lock = threading.Lock()
_rejected: dict = {}              # key -> reason
_probed: dict = {}                # key -> None (ok) or reason, this process
# whether a probe shows a progress line on stderr (the fit's ``show_progress`` sets it for the
# duration of its tuning lookup through :func:`show_progress`)
_progress = contextvars.ContextVar("clmf_probe_progress", default=True)


@contextlib.contextmanager
def show_progress(on):
    """Within the block, probes show (``on``) or hide their progress line."""
    token = _progress.set(bool(on))
    try:
        yield
    finally:
        _progress.reset(token)


def probe_timeout():
    """Seconds a probe's child may run: ``$CLMF_PROBE_TIMEOUT`` or :data:`PROBE_TIMEOUT`."""
    raw = os.environ.get(PROBE_TIMEOUT_ENV, "").strip()
    if raw:
        try:
            v = float(raw)
            if v > 0 and math.isfinite(v):
                return v
        except ValueError:
            pass
        log.warning("ignoring %s=%r: not a positive number of seconds", PROBE_TIMEOUT_ENV, raw)
    return PROBE_TIMEOUT


class TuningFallbackWarning(UserWarning):
    """A chosen kernel configuration cannot run on the device; clmf fell back to the next rule."""


def _device_id(info):
    return (str(info.platform), str(info.name), str(info.driver))


def _key(info, cfg, f, mode):
    return (_device_id(info), cfg.key(), int(f), str(mode))


def rejection(info, cfg, f, mode="explicit"):
    """The reason ``cfg`` was rejected on this device for (f, mode) in this process, or None."""
    with _lock:
        return _rejected.get(_key(info, cfg, f, mode))


def reject(info, cfg, f, mode, source, reason):
    """Record that ``cfg`` cannot run on this device (f, mode) and warn once (log + warning)."""
    key = _key(info, cfg, f, mode)
    with _lock:
        if key in _rejected:
            return
        _rejected[key] = str(reason)
    msg = (f"kernel configuration {cfg} (f={f}, {mode}) from {source} cannot run on "
           f"{device_label(info)} (driver {info.driver}): {reason}; falling back to the "
           "next tuning rule")
    log.info(msg)
    warnings.warn(msg, TuningFallbackWarning, stacklevel=_caller_level())


def _caller_level():
    """The ``stacklevel`` of the first frame outside the clmf package (the user's call)."""
    here = os.path.join(package_root(), "clmf", "")
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame, level = frame.f_back, level + 1
    return level


def _probe_mode():
    v = os.environ.get(PROBE_ENV, "auto").strip().lower() or "auto"
    return v if v in ("auto", "always", "off") else "auto"


def ran_here(info, record_device):
    """Whether a record's device is this device *and* driver (the tuner then built and ran its
    configuration here: no probe needed)."""
    if not record_device:
        return False
    here = (info.platform, info.vendor, info.type, info.name, info.driver)
    there = tuple(record_device.get(k, "") for k in ("platform", "vendor", "type", "device",
                                                      "driver"))
    def norm(t):
        return tuple(" ".join(str(x).split()).lower() for x in t)
    return norm(here) == norm(there)


def usable(info, cfg, f, mode, source, record_device=None):
    """Whether ``cfg`` may be used on this device for (f, mode): not rejected before, and, when it
    was never run on this device and driver (``record_device`` is another device's or None),
    probed successfully in a child process. A failed probe rejects it (one warning)."""
    if rejection(info, cfg, f, mode) is not None:
        return False
    pm = _probe_mode()
    if pm == "off" or (pm == "auto" and ran_here(info, record_device)):
        return True
    reason = probe(info, cfg, f, mode)
    if reason is not None:
        reject(info, cfg, f, mode, source, reason)
        return False
    return True


# ----- the probe in a child process ------------------------------------------------------------
def probe_cache_path():
    """The on-disk cache of probe verdicts (in clmf's cache directory)."""
    return cache_dir() / "config-probes.json"


def _cache_key(info, cfg, f, mode):
    from .._version import __version__
    from ..engine.kernels import template_hash
    return json.dumps([info.platform, info.name, info.driver, __version__, template_hash(),
                       cfg.key(), int(f), mode])


def _read_cache(path):
    """The cached verdicts ({key: verdict}); empty when the file is missing, torn or refused
    (see :mod:`clmf.cache`)."""
    return read_json_object(path)


def _write_cache(path, key, verdict):
    """Add one verdict to the cache file (read, update, atomic replace; errors only logged)."""
    update_json_object(path, key, verdict)


def _device_present(info):
    """Whether this process sees the device (:func:`clmf.engine.capability.device_present`)."""
    return device_present(info)


def _probe_command():
    return [sys.executable, "-m", __spec__.name if __spec__ else "clmf.tuning.fallback"]


def probe(info, cfg, f, mode="explicit", timeout=None):
    """Build ``cfg`` and run one ALS iteration on a tiny problem in a child process.

    Returns None when it ran (or when no child could be started: the in-process checks remain),
    else the reason it failed (the child's exit status or signal and the last line it wrote).
    """
    key = _cache_key(info, cfg, f, mode)
    with _lock:
        if key in _probed:
            return _probed[key]
    if not _device_present(info):
        return None                  # a made-up DeviceInfo (tests) or a vanished device
    path = None
    try:
        path = probe_cache_path()
        hit = _read_cache(path).get(key)
    except Exception as e:  # pragma: no cover - platformdirs missing/broken
        log.debug("no probe cache: %s", e)
        hit = None
    if isinstance(hit, dict) and "ok" in hit:
        reason = None if hit["ok"] else str(hit.get("reason", "failed its probe"))
        with _lock:
            _probed[key] = reason
        return reason
    job = {"platform": info.platform, "device": info.name, "config": cfg.to_dict(), "f": int(f),
           "mode": mode}
    t0 = time.perf_counter()
    limit = timeout or probe_timeout()
    log.info("probing kernel configuration %s (f=%d, %s) on %s in a child process",
             cfg, f, mode, device_label(info))
    with _progress_line(f"clmf: first use of a kernel configuration on {info.name}: "
                        f"checking it in a child process (once per machine, ≤ {limit:.0f} s)"):
        started, reason = run_child(_probe_command(), job, limit, "the probe")
    if not started:
        log.warning("%s is used unprobed", cfg)
        return None
    log.info("probe of %s: %s in %.1f s", cfg, reason or "ok", time.perf_counter() - t0)
    with _lock:
        _probed[key] = reason
    if path is not None:
        _write_cache(path, key, {"ok": reason is None, "reason": reason,
                                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return reason


@contextlib.contextmanager
def _progress_line(desc):
    """A tqdm line on stderr with the seconds elapsed while the block runs (when progress is
    shown: :func:`show_progress`)."""
    if not _progress.get():
        yield
        return
    from tqdm.auto import tqdm
    tty = sys.stderr.isatty()
    # on a terminal the elapsed time ticks in place; in a log one line before and one after
    bar = tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed}", leave=not tty,
               mininterval=0.5 if tty else 3600)
    stop = threading.Event()

    def tick():
        while not stop.wait(0.5):
            bar.refresh()
    th = threading.Thread(target=tick, name="clmf-probe-progress", daemon=True)
    if tty:
        th.start()
    try:
        yield
    finally:
        stop.set()
        if tty:
            th.join()
        else:
            bar.refresh()
        bar.close()


def _child(job):
    """The probe's child: build ``job['config']`` on the named device and run one iteration."""
    import numpy as np
    import scipy.sparse as sp

    from ..engine.config import KernelConfig
    from ..engine.core import Engine
    from ..errors import InvalidConfigError
    dev = find_device(job["platform"], job["device"])
    if dev is None:
        raise SystemExit(f"clmf probe: device {device_label(job)} not found")
    cfg = KernelConfig.from_dict(job["config"])
    f, mode = int(job["f"]), job["mode"]
    rng = np.random.default_rng(0)
    m, n = 53, 41
    R = sp.random(m, n, density=0.3, format="csr", random_state=rng, dtype=np.float32)
    R.data = np.ceil(R.data * 5).astype(np.float32)
    R.sort_indices()
    mean = float(R.data.mean())
    try:
        eng = Engine(dev, R, f, (cfg, cfg), implicit_alpha=1.0 if mode == "implicit" else None,
                     biased=mode == "biased", offset=mean if mode == "biased" else 0.0)
        try:
            eng.set_factors("users", rng.standard_normal((m, f)).astype(np.float32) * 0.1)
            eng.set_factors("items", rng.standard_normal((n, f)).astype(np.float32) * 0.1)
            eng.iteration(0.1, mode != "implicit")
            eng.queue.finish()
            X = eng.get_factors("users")
            Y = eng.get_factors("items")
        finally:
            eng.release()
    except InvalidConfigError as e:
        raise SystemExit(f"clmf probe: {e}")
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Y))):
        raise SystemExit("clmf probe: the iteration produced NaN/inf factors")
    print(json.dumps({"ok": True}))


if __name__ == "__main__":      # python -m clmf.tuning.fallback < job.json (see probe())
    _child(json.loads(sys.stdin.read()))
