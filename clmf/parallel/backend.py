"""Backends of a fit: the single-device :class:`clmf.engine.Engine`, or :class:`MultiEngine`
(any number of devices, resident or streamed) behind the same small interface:
``set_factors(side, M, biases=None, adopt=False)``, ``iteration(regularization, weighted)``,
``finish()``, ``squared_error(key, users, items, ratings)``,
``get_factors(side, with_biases=False)``,
``release()``, ``memory`` (dict with a ``total``) and ``configs`` (per device and side).
"""
from __future__ import annotations

import concurrent.futures
import logging
import time

import numpy as np

from ..engine.core import padded_factors, unpadded_factors
from ..interrupts import deferred_interrupts
from ..tuning.spec import common_ldf, row_width, unknowns
from .layout import Layout, SideLayout, transpose_csr
from .memory import plan_device
from .partition import choose_modes, make_plan
from .worker import SIDES, DeviceWorker, Exchange, other_side

log = logging.getLogger(__name__)

_PIN_LIMIT = 4 << 30          # largest page-locked exchange array

__all__ = ["MultiEngine", "make_backend", "common_ldf", "plan_fit", "partial_layout"]


def _single_fits(device, R, f, configs, max_device_memory, biased=False, implicit=False):
    """Whether the single-device engine's own memory plan fits the budget (and the engine's own
    check), so that it runs unchanged."""
    from ..engine.device import device_info
    from ..engine.memory import plan_fit as engine_plan
    from ..errors import DeviceMemoryError
    from .memory import device_budget
    info = device_info(device)
    budget, alloc = device_budget(info.global_mem, info.max_alloc, max_device_memory)
    m, n = R.shape
    plan = engine_plan(m, n, R.nnz, f, configs, info, implicit=implicit, biased=biased)
    # (the same plan as the engine's own, metrics buffers included: the engine runs only where
    # its whole plan fits the budget)
    try:
        plan.check_device(info)
    except DeviceMemoryError:
        return False
    big = max(plan.device.values())
    return plan.device_total <= budget and big <= alloc and R.nnz * 4 <= alloc


def make_backend(devices, R, f, configs, *, implicit_alpha=None, biased=False, offset=0.0,
                 max_device_memory=None, profile=False, force_stream=(), modes=None,
                 item_counts=None):
    """The backend of a fit: today's :class:`clmf.engine.Engine` for one device when the data
    fit (same speed), else a :class:`MultiEngine`.

    Parameters
    ----------
    devices : list of pyopencl.Device
    R : scipy.sparse CSR (users × items) or a :class:`clmf.parallel.layout.Layout`
    f : factors; ``configs``: one ``(users_config, items_config)`` pair per device.
    max_device_memory : bytes, or a fraction (≤ 1) of each device's global memory.
    force_stream : sides to stream even if they fit (tests).
    modes : optional side → "replicate"/"reduce" (default: :func:`choose_modes`).
    item_counts : optional ratings per item, when already counted (the single-device engine).
    """
    from ..engine import Engine
    if len(devices) != len(configs):
        raise ValueError("one configuration pair per device")
    if (len(devices) == 1 and not isinstance(R, Layout) and not force_stream and modes is None
            and _single_fits(devices[0], R, f, configs[0], max_device_memory, biased=biased,
                             implicit=implicit_alpha is not None)):
        return Engine(devices[0], R, f, configs[0], profile=profile,
                      implicit_alpha=implicit_alpha, biased=biased, offset=offset,
                      item_counts=item_counts)
    return MultiEngine(devices, R, f, configs, implicit_alpha=implicit_alpha, biased=biased,
                       offset=offset, max_device_memory=max_device_memory, profile=profile,
                       force_stream=force_stream, modes=modes)


def plan_fit(infos, layout, plan, fs, ldf, itemsize, config_pairs, implicit=False,
             max_device_memory=None, force_stream=(), sources=None):
    """The memory plan of every device of a fit (a list of
    :class:`~clmf.parallel.memory.DevicePlan`); raises DeviceMemoryError before device work.
    ``sources[d][side]``: the partial layout of a reduced side on device ``d``."""
    n = len(infos)
    out = []
    for d, info in enumerate(infos):
        blocks = {}
        for s in SIDES:
            src = (sources or [{}] * n)[d].get(s)
            blocks[s] = ((src.indptr, 0, src.rows) if src is not None
                         else (layout[s].indptr, *plan[s].block(d)))
        frows = {}
        for s in SIDES:
            whole = plan[other_side(s)].mode == "replicate" or n == 1
            a, b_ = (0, layout[s].rows) if whole else plan[s].block(d)
            frows[s] = b_ - a
        batch = {s: config_pairs[d][k].batch_rows for k, s in enumerate(SIDES)}
        out.append(plan_device(
            f"device {d} ({info.name})", info.global_mem, info.max_alloc, f=fs, ldf=ldf,
            itemsize=itemsize, blocks=blocks, factor_rows=frows, batch_rows=batch,
            implicit=implicit, max_device_memory=max_device_memory, force_stream=force_stream))
    return out


class MultiEngine:
    """A fit over several devices (or one device out of core), see :mod:`clmf.parallel`."""

    def __init__(self, devices, R, f, configs, *, implicit_alpha=None, biased=False, offset=0.0,
                 max_device_memory=None, profile=False, force_stream=(), modes=None,
                 shares=None, pinned=None):
        from ..engine.device import device_info
        self.layout = R if isinstance(R, Layout) else Layout.from_csr(R)
        self.shape = self.layout.shape
        self.f = int(f)
        self.biased = bool(biased)
        self.implicit = implicit_alpha is not None
        self.offset = float(offset)
        self.fs = unknowns(self.f, self.biased)
        width = row_width(self.f, self.biased)
        self.devices = list(devices)
        n = len(self.devices)
        self.infos = [device_info(d) for d in self.devices]
        self.config_pairs = [tuple(c) for c in configs]
        storages = {c.storage for pair in self.config_pairs for c in pair}
        if len(storages) != 1:
            raise ValueError(f"every device must store factors alike, got {sorted(storages)}")
        self.storage = storages.pop()
        self.np_store = np.float16 if self.storage == "float16" else np.float32
        itemsize = np.dtype(self.np_store).itemsize
        self.ldf = common_ldf(self.config_pairs, width)
        if self.implicit and self.biased:
            raise ValueError("biases are for explicit feedback")
        L = self.layout
        m, nn = self.shape
        if modes is None:
            modes = choose_modes(self.shape, self.fs, self.ldf, n)
        if n == 1 or all(mo == "reduce" for mo in modes.values()):
            modes = {s: "replicate" for s in SIDES}
        for k, s in enumerate(SIDES):
            if modes[s] == "reduce":
                # the reduced systems are solved from A: no fused CG there
                self.config_pairs = [tuple(c.replace(solver="cg") if j == k and
                                           c.solver == "fusedcg" else c
                                           for j, c in enumerate(p)) for p in self.config_pairs]
        self.plan = make_plan(L.users.counts(), L.items.counts(), n, self.fs, self.ldf,
                              shares=shares, modes=modes)
        # the reduced sides' partial layouts (host work, before any device work)
        self.sources = [{} for _ in range(n)]
        for s in SIDES:
            if self.plan[s].mode == "reduce":
                o = other_side(s)
                for d in range(n):
                    self.sources[d][s] = partial_layout(L, s, *self.plan[o].block(d))
        # memory plans of every device before any device work
        self.dplans = plan_fit(self.infos, L, self.plan, self.fs, self.ldf, itemsize,
                               self.config_pairs, self.implicit, max_device_memory, force_stream,
                               self.sources)
        for p in self.dplans:
            log.info("memory plan: %s", p.describe())
        self.memory = {"total": max(p.total for p in self.dplans),
                       "per_device": [dict(p.bytes, total=p.total) for p in self.dplans],
                       "streamed": [p.streamed for p in self.dplans]}
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=n)
        contexts = _shared_contexts(self.devices)
        futs = []
        try:
            for d, dev in enumerate(self.devices):
                futs.append(self.pool.submit(
                    DeviceWorker, d, dev, L, self.plan, self.dplans[d], self.f, self.ldf,
                    {"users": self.config_pairs[d][0], "items": self.config_pairs[d][1]},
                    implicit_alpha, biased, offset, contexts[d], profile, self.sources[d],
                    pinned))
            self.workers = [fu.result() for fu in futs]
        except BaseException:
            with deferred_interrupts():      # every set-up ends, then the built ones are freed
                self.pool.shutdown(wait=True)
                for fu in futs:
                    if not fu.cancelled() and fu.exception() is None:
                        fu.result().release()
            raise
        self.configs = [{"users": p[0], "items": p[1]} for p in self.config_pairs]
        # the exchange's host arrays: page-locked (in the first device's context) on GPUs when
        # they are exchanged and not huge, which speeds up that device's copies at least
        pin = any(i.type == "GPU" for i in self.infos) if pinned is None else bool(pinned)
        self.pin = pin
        self.host = {}
        for s in SIDES:
            shape = (max(1, L[s].rows), self.ldf)
            exchanged = n > 1 and self.plan[other_side(s)].mode == "replicate"
            nbytes = shape[0] * shape[1] * itemsize
            self.host[s] = (self.workers[0].pinned_array(shape, self.np_store)
                            if pin and exchanged and nbytes <= _PIN_LIMIT
                            else np.zeros(shape, self.np_store))
        self.times = {"compute": 0.0, "exchange": 0.0, "iterations": 0, "wall": 0.0,
                      "reduce": 0.0}
        self._metric_cache = {}
        self._partials = {}

    # ----- factors -------------------------------------------------------------------------
    def _padded(self, side, M, biases):
        rows = self.layout[side].rows
        return padded_factors(side, M, rows, self.f, self.ldf, self.np_store, self.biased, biases)

    def set_factors(self, side, M, biases=None, adopt=False):
        """Upload a side's factors (n_rows × f) to every device (the rows each holds); the
        devices' blocks are always copies (``adopt``, the engine's in-place hint, is moot)."""
        host = self._padded(side, M, biases)
        self.host[side][...] = host
        for w in self.workers:
            w.write_rows(side, host, 0, self.layout[side].rows, blocking=True)

    def get_factors(self, side, with_biases=False):
        """A side's factors gathered from the devices solving them."""
        rows = self.layout[side].rows
        host = np.empty((max(1, rows), self.ldf), dtype=self.np_store)
        for d, w in enumerate(self.workers):
            r0, r1 = self.plan[side].block(d)
            w.read_rows(side, host, r0, r1, blocking=True)
        return unpadded_factors(host, rows, self.f, self.biased, with_biases)

    # ----- iterations ----------------------------------------------------------------------
    def half_step(self, side, regularization, weighted):
        """Solve ``side`` on every device concurrently, exchanging the solved rows (or reducing
        the partial normal equations first, in the reduce mode)."""
        needed = len(self.workers) > 1 and self.plan[other_side(side)].mode == "replicate"
        ex = Exchange(side, self.host[side], len(self.workers), needed=needed)
        if self.plan[side].mode == "reduce":
            A, B, G = self._partial_arrays(side)
            self._gather([self.pool.submit(w.partials, side, A[d], B[d], G[d])
                          for d, w in enumerate(self.workers)])
            t = time.perf_counter()
            self._reduce(side, regularization, weighted)
            self.times["reduce"] += time.perf_counter() - t
            self._gather([self.pool.submit(w.solve_reduced, side, A[d], B[d], regularization,
                                           weighted, ex) for d, w in enumerate(self.workers)])
            return
        self._gather([self.pool.submit(w.half_step, side, regularization, weighted, ex)
                      for w in self.workers])

    def _partial_arrays(self, side):
        """Host arrays of every device's partial systems of ``side`` (allocated once)."""
        if side not in self._partials:
            rows, fs = max(1, self.layout[side].rows), self.fs
            n = len(self.workers)
            def host(d, shape):
                # page-locked in the device's own context when pinning (GPUs), else pageable
                if self.pin and 4 * int(np.prod(shape)) <= _PIN_LIMIT:
                    return self.workers[d].pinned_array(shape, np.float32)
                return np.zeros(shape, np.float32)

            self._partials[side] = ([host(d, (rows, fs, fs)) for d in range(n)],
                                    [host(d, (rows, fs)) for d in range(n)],
                                    [np.zeros((fs, fs), np.float32) for _ in range(n)])
        return self._partials[side]

    def _reduce(self, side, regularization, weighted):
        """Sum the devices' partial systems of each device's own rows into that device's
        arrays, with the Gram matrix (implicit) and the regularisation added, in threads."""
        A, B, G = self._partials[side]
        counts = self.layout[side].counts()
        n = len(self.workers)
        Gs = np.sum(G, axis=0) if self.implicit else None
        diag = np.arange(self.fs)
        step = max(1, (64 << 20) // (4 * self.fs * self.fs))
        jobs = [(d, a, min(a + step, self.plan[side].block(d)[1]))
                for d in range(n) for a in range(*self.plan[side].block(d), step)]

        def work(job):
            d, a, b = job
            Ad, Bd = A[d][a:b], B[d][a:b]
            for e in range(n):
                if e != d:
                    Ad += A[e][a:b]
                    Bd += B[e][a:b]
            if Gs is not None:
                Ad += Gs
            lam = (regularization * counts[a:b] if weighted
                   else np.full(b - a, regularization))
            Ad[:, diag, diag] += lam.astype(np.float32)[:, None]

        _map_threads(work, jobs)

    def _gather(self, futs):
        """Wait for every device's task; re-raise the first error (a singular system first)."""
        errors = []
        for fu in futs:
            try:
                fu.result()
            except BaseException as e:      # noqa: PERF203 - first error re-raised below
                errors.append(e)
        if errors:
            # a singular system is the user's error; report it rather than a follower's
            from ..errors import SingularSystemError
            first = next((e for e in errors if isinstance(e, SingularSystemError)), errors[0])
            raise first

    def iteration(self, regularization, weighted):
        """One ALS iteration on every device: users, then items."""
        t0 = time.perf_counter()
        self.half_step("users", regularization, weighted)
        self.half_step("items", regularization, weighted)
        self.times["wall"] += time.perf_counter() - t0
        self.times["iterations"] += 1
        self.times["compute"] = max(w.times["compute"] for w in self.workers)
        self.times["exchange"] = max(w.times["exchange"] for w in self.workers)

    def finish(self):
        """Wait for every device."""
        for w in self.workers:
            w.finish()

    def reset_times(self):
        """Start the time accounting afresh (after a warm-up iteration)."""
        for w in self.workers:
            w.times = {"compute": 0.0, "exchange": 0.0}
        self.times = {"compute": 0.0, "exchange": 0.0, "iterations": 0, "wall": 0.0,
                      "reduce": 0.0}

    def time_split(self):
        """Seconds per iteration so far: wall, compute and exchange tail (slowest device), and
        with profiling the devices' busy times (kernels, streamed copies, exchange copies)."""
        it = max(1, self.times["iterations"])
        out = {"wall": self.times["wall"] / it, "compute": self.times["compute"] / it,
               "exchange": self.times["exchange"] / it, "reduce": self.times["reduce"] / it}
        for key in ("kernels", "stream_copies", "exchange_copies"):
            vals = [w.times.get(key) for w in self.workers if key in w.times]
            if vals:
                out[key] = max(vals) / it
        return out

    # ----- metrics -------------------------------------------------------------------------
    def squared_error(self, key, users, items, ratings, offset=0.0):
        """Sum of squared errors on triples, split over the devices by the blocks of the side
        whose factor is partitioned (users when both are replicated)."""
        users = np.asarray(users)
        items = np.asarray(items)
        if key not in self._metric_cache:
            by = "items" if self.plan["users"].mode == "reduce" else "users"
            bounds = self.plan[by].bounds
            owner = np.searchsorted(bounds, users if by == "users" else items, side="right") - 1
            order = np.argsort(owner, kind="stable")
            cuts = np.searchsorted(owner[order], np.arange(len(self.workers) + 1))
            self._metric_cache[key] = (order, cuts)
        order, cuts = self._metric_cache[key]
        ratings = np.asarray(ratings)

        def part(d):
            w = self.workers[d]
            hit = w.cached_squared_error(key, int(cuts[d + 1] - cuts[d]), offset)
            if hit is not None:      # the triples are still on the device
                return hit
            sel = order[cuts[d]:cuts[d + 1]]
            return w.squared_error(users[sel], items[sel], ratings[sel], offset, key=key)

        total = sum(self.pool.map(part, range(len(self.workers))))
        return float(total), int(len(ratings))

    def release(self):
        """Stop the threads, then free every device's buffers: a half-step cut short by Ctrl-C
        in this thread may still run on the devices' threads, so they end first (Ctrl-C held
        back meanwhile), and each worker waits for its queues."""
        with deferred_interrupts():
            self.pool.shutdown(wait=True)
            for w in getattr(self, "workers", []):
                w.release()
            self.workers = []


def _map_threads(fn, jobs):
    """``fn`` over ``jobs`` on a pool of host threads (NumPy releases the GIL)."""
    import os
    with concurrent.futures.ThreadPoolExecutor(min(len(jobs) or 1, os.cpu_count() or 1, 32)) as p:
        return list(p.map(fn, jobs))


def partial_layout(layout, side, r0, r1):
    """Every row of ``side`` restricted to the entries of the other side's rows ``[r0, r1)``,
    indices rebased to that block: a device's share of the partial normal equations of
    ``side`` in the reduce mode (the transpose of the other side's block)."""
    o = other_side(side)
    ip, idx, val = layout[o].entries(r0, r1)
    return transpose_csr(SideLayout(ip, idx, val), layout[side].rows)


def _shared_contexts(devices):
    """One context per device (clmf's memoized one; a device named again — several workers on
    one device — gets a fresh context, so no two threads share a program's kernel objects,
    which are not thread-safe)."""
    import pyopencl as cl

    from ..engine.device import get_context
    seen = set()
    out = []
    for d in devices:
        if d.int_ptr in seen:
            out.append(cl.Context([d]))
        else:
            seen.add(d.int_ptr)
            out.append(get_context(d)[0])
    return out
