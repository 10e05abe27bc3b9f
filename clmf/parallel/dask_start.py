"""A Dask worker's start factors (issue 28): drawn while the splits run
(:func:`~clmf.parallel.dask_tasks.warm_up`, over threads as the in-process fit draws them:
:func:`clmf.reference.start_factors`), laid out in the devices' padded rows while the worker's
blocks still merge (:func:`padded_start`), and uploaded once its engine exists through the
page-locked staging buffers kept per context (:func:`upload_start`), not by a blocking write
from pageable memory."""
from __future__ import annotations

import time

from .worker import SIDES

__all__ = ["padded_start", "upload_start"]


def padded_start(warm, setup):
    """``({side: padded host rows} or None, seconds)``: the start factors drawn by
    :func:`~clmf.parallel.dask_tasks.warm_up` (``warm``: its future) in the fit's padded
    layout (``setup``: as :func:`~clmf.parallel.dask_tasks.build`; None where the fit does not
    draw them), and the seconds spent laying them out."""
    from ..engine.factors import padded_factors  # (imported in the fit, as the engine)
    start, _times = warm.result()
    if start is None:
        return None, 0.0
    t = time.perf_counter()
    hosts = {side: padded_factors(side, M, len(M), setup["f"], setup["ldf"], setup["store"],
                                  setup["biased"])
             for side, M in zip(SIDES, start)}
    return hosts, time.perf_counter() - t


def upload_start(w, hosts):
    """Upload each side's padded start rows ``hosts`` (the rows engine ``w`` holds) through
    the pinned staging buffers of :class:`~clmf.engine.upload.Uploader` (kept per context, the
    host's copies into them overlapping the transfers; written directly on CPU runtimes), and
    wait for the copies."""
    from ..engine import upload as U
    up = U.Uploader(w.ctx, w.queue, U.zero_copy(w.info))
    try:
        for side, host in hosts.items():
            lo, hi = w.frange[side]
            if hi > lo:
                up.write(w.factors[side], host[lo:hi])
    finally:
        up.finish()
