"""Backends of a fit: one device's :class:`clmf.engine.Engine` (its rows resident or streamed,
as its memory plan says), or :class:`MultiEngine` (several devices, each running an engine on its
share of the partition plan) behind the same small interface:
``set_factors(side, M, biases=None, adopt=False)``, ``iteration(regularization, weighted)``,
``finish()``, ``squared_error(key, users, items, ratings)``,
``get_factors(side, with_biases=False)``,
``release()``, ``memory`` (dict with a ``total``) and ``configs``.
"""
from __future__ import annotations

import concurrent.futures
import logging
import time

import numpy as np

from ..engine.factors import padded_factors, unpadded_factors
from ..engine.memory import plan_device, plan_split
from ..engine.reduce import pipelined
from ..engine.upload import pins_host
from ..interrupts import deferred_interrupts
from ..tuning.spec import common_ldf, row_width, unknowns
from .layout import Layout, SideLayout, transpose_csr
from .partition import choose_modes, make_plan
from .reducer import SUM_MODES, Reducer
from .worker import SIDES, Exchange, device_engine, other_side

log = logging.getLogger(__name__)

_PIN_LIMIT = 4 << 30          # largest page-locked exchange array

__all__ = ["MultiEngine", "make_backend", "common_ldf", "plan_fit", "partial_layout",
           "fit_modes"]


def fit_modes(shape, fs, ldf, n, config_pairs, modes=None):
    """Per side ``"replicate"`` or ``"reduce"`` for a fit on ``n`` devices: the caller's
    ``modes`` or the rule's (:func:`choose_modes`); one device, or both sides reduced, replicate.
    The reduced systems are solved from their summed hermitians, which the fused CG solver never
    builds: where the rule picked the reduce mode for a side whose configuration on some device
    is the fused CG, that side replicates instead (the rule weighs bytes moved, the fused CG
    saves the hermitians); asked for by the caller, it is refused with an
    :class:`InvalidConfigError` naming the side and the device (``side``, ``device_index``)."""
    from ..errors import InvalidConfigError
    given = modes is not None
    modes = dict(modes) if given else choose_modes(shape, fs, ldf, n)
    if n == 1 or all(mo == "reduce" for mo in modes.values()):
        return {s: "replicate" for s in SIDES}
    for k, s in enumerate(SIDES):
        fused = [d for d, p in enumerate(config_pairs) if p[k].solver == "fusedcg"]
        if modes[s] != "reduce" or not fused:
            continue
        if not given:
            log.info("%s: the fused CG solver builds no normal equations to reduce: the fixed "
                     "factor is replicated", s)
            modes[s] = "replicate"
            continue
        e = InvalidConfigError(
            f"modes={{{s!r}: 'reduce'}} sums the devices' partial normal equations of the {s}, "
            f"which the fused CG solver ({config_pairs[fused[0]][k]}) never builds: use "
            "solver='cg' or 'cholesky' for that side, or the replicate mode", "reduce")
        e.side, e.device_index = s, fused[0]
        raise e
    return modes


def make_backend(devices, R, f, configs, *, implicit_alpha=None, biased=False, offset=0.0,
                 max_device_memory=None, profile=False, force_stream=(), modes=None,
                 item_counts=None, exchange_dtype=None):
    """The backend of a fit, chosen: one device runs one :class:`clmf.engine.Engine` on every
    row (its memory plan keeps the ratings resident, or streams the sides that do not fit, and
    cuts long rows of resident sides); several devices a :class:`MultiEngine` (rows partitioned
    by work, the fixed factors replicated or reduced by :func:`fit_modes`, one engine per
    device on its share).

    Parameters
    ----------
    devices : list of pyopencl.Device
    R : scipy.sparse CSR (users × items) or a :class:`clmf.parallel.layout.Layout`
    f : factors; ``configs``: one ``(users_config, items_config)`` pair per device.
    max_device_memory : bytes, or a fraction (≤ 1) of each device's global memory.
    force_stream : sides to stream even if they fit (tests).
    modes : optional side → "replicate"/"reduce" (several devices; default: the rule's).
    item_counts : optional ratings per item, when already counted (one device).
    exchange_dtype : ``"float16"``: several devices exchange their solved rows in half
        precision (half the bytes; the RMSE within 0.1 % of a float32 exchange).
    """
    from ..engine import Engine
    if len(devices) != len(configs):
        raise ValueError("one configuration pair per device")
    if len(devices) == 1:
        eng = Engine(devices[0], R, f, configs[0], profile=profile,
                     implicit_alpha=implicit_alpha, biased=biased, offset=offset,
                     item_counts=item_counts, max_device_memory=max_device_memory,
                     force_stream=force_stream)
        log.info("backend: one device; memory plan: %s", eng.dplan.describe())
        return eng
    return MultiEngine(devices, R, f, configs, implicit_alpha=implicit_alpha, biased=biased,
                       offset=offset, max_device_memory=max_device_memory, profile=profile,
                       force_stream=force_stream, modes=modes, exchange_dtype=exchange_dtype)


def plan_fit(infos, layout, plan, fs, ldf, itemsize, config_pairs, implicit=False,
             max_device_memory=None, force_stream=(), sources=None, pipelined=False,
             device_sums=False):
    """The memory plan of every device of a fit (a list of
    :class:`~clmf.engine.memory.DevicePlan`, :func:`plan_device` on each device's share: long
    rows of the sides it solves from the whole layout cut as on one device); raises
    DeviceMemoryError before device work. ``sources[d][side]``: the partial layout of a
    reduced side on device ``d``; ``pipelined``: its systems are reduced packed, in a
    pipeline (:func:`clmf.engine.reduce.pipelined`), else in full between two phases;
    ``device_sums``: the pipeline's sums are made on the owner devices (each with a ring of
    its peers' copies)."""
    from .. import engine
    n = len(infos)
    out = []
    for d, info in enumerate(infos):
        blocks, splits = {}, {}
        reduced = [s for s in SIDES if (sources or [{}] * n)[d].get(s) is not None]
        for k, s in enumerate(SIDES):
            src = (sources or [{}] * n)[d].get(s)
            blocks[s] = ((src.indptr, 0, src.rows) if src is not None
                         else (layout[s].indptr, *plan[s].block(d)))
            ip, r0, r1 = blocks[s]
            counts = np.diff(np.asarray(ip[r0:r1 + 1], np.int64))
            rows, nnz = r1 - r0, int(counts.sum())
            # long rows cut into pieces on a solved side and a reduced one alike (the
            # reduce's partial systems: clmf.engine.reduce)
            splits[s] = plan_split(config_pairs[d][k], fs, rows, nnz,
                                   int(counts.max()) if rows > 0 else 0, info)
        frows = {}
        for s in SIDES:
            whole = plan[other_side(s)].mode == "replicate" or n == 1
            a, b_ = (0, layout[s].rows) if whole else plan[s].block(d)
            frows[s] = b_ - a
        out.append(plan_device(
            f"device {d} ({info.name})", info.global_mem, info.max_alloc, f=fs, ldf=ldf,
            itemsize=itemsize, blocks=blocks, factor_rows=frows,
            batch_rows={s: splits[s].batch_rows for s in SIDES}, implicit=implicit,
            splits=splits, skew=engine.upload.host_align(info),
            reduced=reduced,
            packed={s: plan[s].block(d)[1] - plan[s].block(d)[0] for s in reduced
                    if pipelined},
            staged={s: n - 1 for s in reduced} if pipelined and device_sums else None,
            max_device_memory=max_device_memory, force_stream=force_stream))
    return out


class MultiEngine:
    """A fit over several devices (or one device out of core), see :mod:`clmf.parallel`.
    ``reduce_sum``: where a reduced side's partial systems are summed, ``"device"`` (each
    owner uploads its peers' copies as they land and sums them as it unpacks, the default)
    or ``"host"`` (host threads)."""

    def __init__(self, devices, R, f, configs, *, implicit_alpha=None, biased=False, offset=0.0,
                 max_device_memory=None, profile=False, force_stream=(), modes=None,
                 shares=None, pinned=None, exchange_dtype=None, reduce_sum=SUM_MODES[0]):
        from ..engine.device import device_info
        if exchange_dtype not in (None, "float32", "float16"):
            raise ValueError(f"exchange_dtype must be None, 'float32' or 'float16', not "
                             f"{exchange_dtype!r}")
        if reduce_sum not in SUM_MODES:
            raise ValueError(f"reduce_sum must be one of {SUM_MODES}, not {reduce_sum!r}")
        self.reduce_sum = reduce_sum
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
        modes = fit_modes(self.shape, self.fs, self.ldf, n, self.config_pairs, modes)
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
                               self.sources, pipelined=True,
                               device_sums=reduce_sum == "device")
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
                    device_engine, d, dev, L, self.plan, self.dplans[d], self.f, self.ldf,
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
        # they are exchanged and not huge; every device copies to and from them at the bus's
        # speed (NVIDIA: 52 GB/s from each of four contexts, benchmarks/host_pin_contexts.py)
        pin = any(pins_host(i) for i in self.infos) if pinned is None else bool(pinned)
        self.pin = pin
        self.host = {}
        for s in SIDES:
            shape = (max(1, L[s].rows), self.ldf)
            exchanged = n > 1 and self.plan[other_side(s)].mode == "replicate"
            # float16: the solved rows cross the bus in half precision (converted on the
            # devices; each device keeps its own rows in the storage's precision)
            dt = np.float16 if exchange_dtype == "float16" and exchanged else self.np_store
            nbytes = shape[0] * shape[1] * np.dtype(dt).itemsize
            pinned_here = pin and exchanged and nbytes <= _PIN_LIMIT
            self.host[s] = (self.workers[0].pinned_array(shape, dt) if pinned_here
                            else np.zeros(shape, dt))
        if any(h.dtype != self.np_store for h in self.host.values()):
            # the float16 exchange's conversion program, built at set-up (not in the first
            # iteration)
            from ..engine.kernels import convert_program
            list(self.pool.map(lambda w: convert_program(w.ctx), self.workers))
        self.reset_times()
        self._metric_cache = {}
        # the reduce mode's host arrays and summing threads, at set-up (a failure frees all)
        self.reducers = {}
        try:
            for s in SIDES:
                if self.plan[s].mode == "reduce" and n > 1:
                    self.reducers[s] = Reducer(s, L[s].rows, self.plan[s].bounds, self.fs,
                                               [w.batch_rows[s] for w in self.workers],
                                               self._host_array, self.pool, reduce_sum)
        except BaseException:
            self.release()
            raise

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
        rd = self.reducers.get(side)
        if rd is not None:
            rd.start()
            self._gather([self.pool.submit(pipelined, w, side, rd.port(d), regularization,
                                           weighted, ex) for d, w in enumerate(self.workers)])
            for k, v in rd.finish().items():
                self.times[f"reduce_{k}"] += v
            return
        if not all(w.dplan.sides[side].resident for w in self.workers):
            self._gather([self.pool.submit(w.half_step, side, regularization, weighted, ex)
                          for w in self.workers])
            return
        # resident sides: this thread enqueues the devices' launches in turn (a launch holds
        # the interpreter's lock: devices launched by their own threads started one after
        # another), each device's thread then waits for its part and takes the others' rows
        live = [w.half_step_steps(side, regularization, weighted, ex) for w in self.workers]
        futs = []
        while live:
            for g in list(live):
                try:
                    if not next(g):
                        continue
                    futs.append(self.pool.submit(_exhaust, g))
                except Exception as e:  # noqa: BLE001 - reported by _gather, as the others'
                    futs.append(_failed(e))
                except BaseException:   # Ctrl-C: no more launches (the exchange has failed)
                    for h in live:
                        h.close()
                    raise
                live.remove(g)
        self._gather(futs)

    def _host_array(self, d, shape):
        """A zeroed float32 host array of device ``d``'s partial systems: page-locked in its
        context when pinning (GPUs) and not huge, else pageable."""
        if self.pin and 4 * int(np.prod(shape)) <= _PIN_LIMIT:
            return self.workers[d].pinned_array(shape, np.float32)
        return np.zeros(shape, np.float32)

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
        for w in getattr(self, "workers", []):
            w.times = {"compute": 0.0, "exchange": 0.0}
            w.stage_times = {k: 0.0 for k in w.stage_times}
        self.times = {"compute": 0.0, "exchange": 0.0, "iterations": 0, "wall": 0.0,
                      "reduce_sum": 0.0, "reduce_wait": 0.0}

    def time_split(self):
        """Seconds per iteration so far: wall, compute and exchange tail (slowest device); the
        reduce mode's host sums (``reduce_sum``: the summing threads' seconds, overlapped with
        the devices' work; 0 with device sums, which the unpack kernels make) and its exposed
        part (``reduce_wait``, also ``reduce``: from the last device's last partial systems on
        the host to the last segment summed, or with device sums to its last copy on its owner
        device); with profiling the devices' busy times (kernels, the reduce's pack / unpack
        kernels among them,
        streamed copies, exchange copies, ``reduce_copies``: the reduced systems' copies to
        the host, back and within the device)."""
        it = max(1, self.times["iterations"])
        out = {"wall": self.times["wall"] / it, "compute": self.times["compute"] / it,
               "exchange": self.times["exchange"] / it,
               "reduce": self.times["reduce_wait"] / it,
               "reduce_wait": self.times["reduce_wait"] / it,
               "reduce_sum": self.times["reduce_sum"] / it}
        for key in ("kernels", "stream_copies", "exchange_copies", "reduce_copies"):
            vals = [w.times.get(key) for w in self.workers if key in w.times]
            if vals:
                out[key] = max(vals) / it
        # with profiling, each kernel stage's seconds on the device where it took longest
        stages = {}
        for w in self.workers:
            for key, v in w.stage_times.items():
                stages[key] = max(stages.get(key, 0.0), v / it)
        if any(stages.values()):
            out["stages"] = stages
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
            return w.squared_error(key, users[sel], items[sel], ratings[sel], offset)[0]

        total = sum(self.pool.map(part, range(len(self.workers))))
        return float(total), int(len(ratings))

    def release(self):
        """Stop the threads, then free every device's buffers: a half-step cut short by Ctrl-C
        in this thread may still run on the devices' threads, so they end first (Ctrl-C held
        back meanwhile), and each worker waits for its queues."""
        with deferred_interrupts():
            self.pool.shutdown(wait=True)
            for rd in getattr(self, "reducers", {}).values():
                rd.close()
            for w in getattr(self, "workers", []):
                w.release()
            self.workers = []


def _exhaust(steps):
    """Run a half-step generator to its end."""
    for _ in steps:
        pass


def _failed(exc):
    """A finished future holding ``exc``."""
    fu = concurrent.futures.Future()
    fu.set_exception(exc)
    return fu


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
