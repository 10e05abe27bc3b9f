"""The programs a fit builds before its first iteration, built (or loaded from the caches) in
background threads while the ratings upload: each side's ALS program, the training RMSE's
program (explicit feedback) and the device transpose's (``layout.cl.j2``), then each kernel
launched once (:func:`clmf.engine.launch.warm`).

:class:`Builds` runs them for an :class:`clmf.engine.Engine`; :func:`fit_programs` is the list of
what a one-device fit builds, which :meth:`clmf.ALS.warm_up` builds ahead of a fit (a build of the
same program already running is waited for, never started twice: :func:`clmf.engine.kernels.build`).
The ALS programs build one after the other in one thread, the transpose's in another, on every
device: CPU compilers share the cores with the device, and on an H100 (stop 39,
results/bench/setup-h100/) one thread per program saved nothing — a cold build of a fit's
programs took 2.8–3.6 s side by side against 2.8 s in turn (pyopencl's persistent cache
serialises the stores). :data:`BUILD_THREADS` sets more threads (for comparisons).
"""
from __future__ import annotations

import concurrent.futures
import time

from ..errors import InvalidConfigError
from . import kernels as K
from .blocks import SIDES
from .device import thread_safe
from .rotate import may_apply
from .transpose import layout_program

__all__ = ["Builds", "fit_programs", "build_threads", "chains", "BUILD_THREADS",
           "WARM_LAUNCHES"]

# threads building a fit's programs: None chooses (build_threads); 1 builds them one after the
# other as before (for comparisons)
BUILD_THREADS = None
# each kernel launched once on a one-row problem at set-up (launch.warm); False: not (for
# comparisons of the first iteration)
WARM_LAUNCHES = True


def build_threads(info, programs):
    """Threads building ``programs`` programs on the device of ``info``: 1 (the ALS programs in
    turn; see the module docstring), or :data:`BUILD_THREADS` (at most one per program)."""
    if BUILD_THREADS is not None:
        return max(1, min(int(BUILD_THREADS), max(1, programs)))
    return 1


def chains(jobs, threads):
    """``jobs`` (name → callable) grouped into ``threads`` sequences run one after the other,
    the transpose's program alone in the first where there is one (it is needed first)."""
    names = list(jobs)
    if threads <= 1:
        return [names]
    head = [["layout"]] if "layout" in names else []
    rest = [k for k in names if k != "layout"]
    n = max(1, threads - len(head))
    return head + [rest[k::n] for k in range(n) if rest[k::n]]


def fit_programs(ctx, device, info, configs, fs, *, implicit, biased, storage, ldf, layout):
    """``{name: callable}`` building each program a one-device fit of ``configs`` (users,
    items) runs: ``"users"``, ``"items"`` (an :class:`InvalidConfigError` names the side), the
    training RMSE's ``"metrics"`` (explicit feedback) and with ``layout`` the transpose's."""
    def side(s, cfg):
        def run():
            try:
                return K.als_program(ctx, device, cfg, fs, info, implicit, biased, ldf=ldf)
            except InvalidConfigError as e:
                e.side = s                   # which side's configuration failed (fit falls back)
                raise
        return run
    out = {}
    if layout:                               # first: the transpose waits for it
        out["layout"] = lambda: layout_program(ctx)
    out.update({s: side(s, c) for s, c in zip(SIDES, configs)})
    if any(may_apply(implicit, biased, storage, c) for c in configs):
        out["rotate"] = lambda: K.rotate_program(ctx)      # memoized for the Rotation
    if not implicit:                         # the training RMSE's program (explicit fits use it)
        out["metrics"] = lambda: K.metrics_program(ctx, fs, storage, ldf, biased=biased)
    return out


class Builds:
    """An engine's programs being built in background threads (:func:`fit_programs`), then its
    kernels launched once; :meth:`result` waits for them, :meth:`abandon` for a set-up that
    failed."""

    def __init__(self, eng, layout=False):
        """Start building ``eng``'s programs (``layout``: the transpose's too)."""
        from .launch import warm
        self.t0 = time.perf_counter()
        jobs = fit_programs(eng.ctx, eng.device, eng.info, (eng.configs["users"],
                            eng.configs["items"]), eng.fs, implicit=eng.implicit,
                            biased=eng.biased, storage=eng.storage, ldf=eng.ldf, layout=layout)
        safe = thread_safe(eng.device)
        n = build_threads(eng.info, len(jobs)) if safe else 1
        if n == 1 and layout and safe:
            n = 2          # the transpose's beside the ALS programs (as it was built before)
        self.results = {}
        groups = chains(jobs, n)
        # a thread per chain and one waiting for them all, then launching the kernels
        self.pool = concurrent.futures.ThreadPoolExecutor(len(groups) + 1,
                                                          thread_name_prefix="clmf-build")

        def run(names):
            for k in names:
                self.results[k] = jobs[k]()

        self.futures = [self.pool.submit(run, g) for g in groups]

        def finish():
            for fut in self.futures:      # (the first error raised, in the chains' order)
                fut.result()
            programs = {s: self.results[s] for s in SIDES}
            if WARM_LAUNCHES and safe:
                warm(eng, programs)
            return programs, time.perf_counter() - self.t0

        def tagged():
            try:
                return finish()
            except InvalidConfigError as e:
                e.device_index = eng.index   # on which device of the fit
                raise
        self.done = self.pool.submit(tagged)
        self.pool.shutdown(wait=False)

    def result(self):
        """``(programs by side, seconds from the start to the last build)``."""
        return self.done.result()

    def abandon(self):
        """Cancel what has not started and wait for the rest (a failed or interrupted set-up)."""
        for fut in (*self.futures, self.done):
            fut.cancel()
        concurrent.futures.wait([*self.futures, self.done])
