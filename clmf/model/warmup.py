"""A fit's set-up work started ahead of it in a background thread (issue 30): the devices and their
contexts, the device transpose's program, the tuning databases' indexes, and — given the
ratings — the tuning lookup and the
ALS programs a one-device fit of them builds (:func:`clmf.engine.programs.fit_programs`), so that
a first fit in a fresh process finds its programs built or building. A fit never waits for a
warm-up: a program it needs that a warm-up is still building is waited for in
:func:`clmf.engine.kernels.build`, not built twice, and whatever a warm-up did not reach the fit
does itself. A warm-up never fails (it only logs): the fit reports every problem.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["start", "warm_devices", "warm_programs", "warm_tuning"]


def warm_devices(spec):
    """The devices of ``spec`` (``ALS(device=...)``), their contexts created and, where a fit
    transposes on the device (GPUs), the transpose's program built; returns the devices."""
    from ..engine.device import device_info, get_context, select_devices, thread_safe
    from ..engine.transpose import layout_program
    devs = select_devices(spec)
    for d in devs:
        ctx = get_context(d)[0]
        if device_info(d).type == "GPU" and thread_safe(d):
            layout_program(ctx)
    warm_tuning([device_info(d) for d in devs])
    return devs


def warm_tuning(infos):
    """Read the tuning databases' indexes into this process's memo (building them where the
    cache is empty) and what a lookup for each device of ``infos`` derives from them
    (:func:`clmf.tuning.lookup.preload`): what a first fit's lookup reads before it chooses
    (0.3–2.5 s on the development machine, most of it with an empty cache)."""
    from ..tuning.lookup import preload
    preload(infos)


def warm_programs(est, X, columns=None, devs=None):
    """Build the programs a one-device fit of ``X`` by ``est`` builds (the tuning lookup's
    configurations for these ratings; several devices: only their contexts and the transpose's
    program, :func:`warm_devices`). Returns the names of the programs built."""
    from ..data import frames
    from ..data.scan import count_columns
    from ..data.validation import check_params, check_ratings
    from ..engine.device import device_info, get_context, select_devices, thread_safe
    from ..engine.programs import build_threads, fit_programs
    from ..tuning.fallback import show_progress
    from ..tuning.resolver import resolve
    from ..tuning.spec import FitSpec, row_width, side_stats, unknowns
    from .inputs import _table_ratings
    devs = devs if devs is not None else select_devices(est.device)
    if X is None or len(devs) != 1 or not thread_safe(devs[0]):
        return []       # (Oclgrind crashes on calls from two threads)
    check_params(est)
    spec = FitSpec.of(est)
    R = check_ratings(_table_ratings(X, columns) if frames.is_frame(X) else X)
    m, n = R.shape
    stats = {"users": side_stats(np.diff(R.indptr), n),
             "items": side_stats(count_columns(R.indices, n), m)}
    dev = devs[0]
    info = device_info(dev)
    with show_progress(False):
        choice = resolve(spec, info, stats)
    configs = (choice["users"].config, choice["items"].config)
    ldf = configs[0].ldf(row_width(spec.f, spec.biased))
    from ..engine.core import host_transpose
    jobs = fit_programs(get_context(dev)[0], dev, info, configs, unknowns(spec.f, spec.biased),
                        implicit=spec.kernel_alpha is not None, biased=spec.biased,
                        storage=configs[0].storage, ldf=ldf,
                        layout=not host_transpose(info, R.nnz))
    n = build_threads(info, len(jobs))
    with concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="clmf-warm-up") as pool:
        futures = {k: pool.submit(fn) for k, fn in jobs.items()}
    built = []
    for k, fut in futures.items():
        try:
            fut.result()
            built.append(k)
        except Exception as e:  # noqa: BLE001 - the fit reports (and falls back from) it
            log.debug("warm-up: program %s not built (%s)", k, e)
    return built


def start(est, X=None, columns=None):
    """Start :func:`warm_devices` and, with ``X``, :func:`warm_programs` in a daemon thread;
    returns the thread (its ``result``: the names of the programs built, or the error)."""
    spec = est.device

    def run():
        try:
            devs = warm_devices(spec)
            thread.result = warm_programs(est, X, columns, devs)
        except Exception as e:  # noqa: BLE001 - a warm-up never fails; the fit reports
            log.debug("warm-up stopped: %s", e)
            thread.result = e
    thread = threading.Thread(target=run, name="clmf-warm-up", daemon=True)
    thread.result = None
    thread.start()
    return thread
