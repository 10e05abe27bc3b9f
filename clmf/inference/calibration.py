"""The measured host/device threshold of the device top-k: where ranking on the device starts
to beat NumPy on the host (:meth:`clmf.inference.topk.DeviceTopK.host_threshold` without a
tuned record)."""
from __future__ import annotations

import logging
import math
import time

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["calibrate"]


_calib_cache: dict = {}


def _median_time(fn, reps=3):
    """Median wall seconds of ``reps`` calls of ``fn``."""
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def calibrate(dtk, sizes=(1, 16, 64), N=10, seed=0):
    """Measure host and device top-``N`` for a few query counts against ``dtk``'s factors and
    return the multiply-adds where the device starts to win (inf if it never does here).

    The crossover ``b*`` is interpolated between the last measured size where the host wins and
    the first where the device does (0 when the device wins at every size; when the host wins
    everywhere, extrapolated from linear models ``t = a + c·b`` of both, inf if they never
    cross); the threshold is ``b* · n · f``."""
    from .host import host_rank
    rng = np.random.default_rng(seed)
    th, td = [], []
    Yh = _host_factors(dtk)
    for b in sizes:
        Q = rng.standard_normal((b, dtk.f)).astype(np.float32)
        dtk.query(Q, N)                                            # build + warm-up
        td.append(_median_time(lambda: dtk.query(Q, N)))
        th.append(_median_time(lambda: host_rank(Q, Yh, None, None, N)))
    b = np.asarray(sizes, np.float64)
    th_, td_ = np.asarray(th), np.asarray(td)
    work = float(dtk.n) * dtk.f
    wins = td_ < th_
    if wins.all():
        bstar = 0.0
    elif wins.any():
        # the first measured size where the device wins, and the one before it: interpolate
        # the time difference linearly between them
        i = int(np.argmax(wins))
        if i == 0:
            bstar = 0.0
        else:
            d0, d1 = td_[i - 1] - th_[i - 1], td_[i] - th_[i]
            bstar = b[i - 1] + (b[i] - b[i - 1]) * d0 / (d0 - d1)
    else:
        # the host wins everywhere measured: extrapolate the linear models t = a + c·b
        ch, ah = np.polyfit(b, th_, 1)
        cd, ad = np.polyfit(b, td_, 1)
        bstar = math.inf if cd >= ch else max(b[-1], (ad - ah) / (ch - cd))
    log.info("topk calibration on %s (%d × %d): queries %s, host %s s, device %s s → device "
             "from %.3g queries", dtk.info.name, dtk.n, dtk.f, list(sizes),
             [round(t, 5) for t in th], [round(t, 5) for t in td], bstar)
    return bstar * work, {"sizes": list(sizes), "host_s": th, "device_s": td}


def _host_factors(dtk):
    """The factors of ``dtk`` as the host path gets them."""
    return dtk._F


def _calibrated(dtk):
    """The measured threshold of ``dtk``, once per device, size class, f and configuration."""
    key = (dtk.device.int_ptr, dtk.n // 1024, dtk.f, str(dtk.config))
    hit = _calib_cache.get(key)
    if hit is None:
        try:
            hit = calibrate(dtk)[0]
        except Exception as e:           # calibration must never break inference
            log.warning("topk calibration failed (%s); using the host below 1e8 multiply-adds", e)
            hit = 1e8
        _calib_cache[key] = hit
    return hit
