"""What runs inside the Dask workers of a :mod:`clmf.dask` fit (issue 15).

Each worker process holds, per fit id, one :class:`~clmf.engine.Engine` on its
OpenCL device with its row blocks of both sides resident for the whole fit (in ``_STATE``, a
process-global dict: a Dask worker runs a fit's tasks one after another). The client sends only
small tasks; factor blocks move between workers as Dask results — or, when the workers share a
host, through shared memory (:mod:`clmf.parallel.shared_blocks`: the result is then only a
handle to the owner's segment). Nothing here imports dask at
module level (only :func:`get_worker` inside a task); the client side is
:mod:`clmf.parallel.dask_backend`.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import threading
import time

import numpy as np

from ..engine.device import worker_device
from ..engine.upload import wrap_host
from . import dask_board as BD
from . import shared_blocks as shm
from .dask_blocks import _block, _Collector
from .dask_prepare import (  # noqa: F401 - the data preparation's tasks, for the client
    _take,
    all_of,
    encode,
    gather,
    heldout,
    ids_and_counts,
    merge_scans,
    read_parquet_file,
    scan,
    setup_check,
    setup_probe,
    split,
    split_times,
    stable_order,
    sum_tallies,
    tally,
)
from .dask_start import padded_start, upload_start
from .layout import Layout
from .worker import SIDES, Exchange, other_side

log = logging.getLogger(__name__)

_STATE = {}            # fit id → dict (this worker's share of the fit)
_PENDING = {}          # fit id → future of the blocks being built (see blocks)
_WARM = {}             # fit id → future of the context and start factors (see warm_up)
_MERGING = {}          # fit id → _Collector merging the pieces of the blocks (see take)
_RELEASED = collections.deque(maxlen=256)     # the fits released here lately (see _collector)
# "1"/"0": the workers' own rows pass through page-locked staging arrays or not (default
# "auto": where the engine pins its host buffers, i.e. on GPUs; see dask_board.Board)
ENV_STAGING = "CLMF_DASK_PINNED_STAGING"
_LOCK = threading.Lock()


class Rows:
    """A host array of rows ``[r0, r0 + len)`` indexed by global row numbers (what
    :class:`~clmf.engine.Engine` reads and writes through ``host[a:b]``)."""

    def __init__(self, array, r0):
        """Wrap ``array`` whose first row is global row ``r0``."""
        self.array = array
        self.r0 = int(r0)

    def __getitem__(self, key):
        """The array rows of a slice of global rows."""
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("Rows takes a contiguous slice of global rows")
        a, b = key.start - self.r0, key.stop - self.r0
        if a < 0 or b > len(self.array):
            raise IndexError(f"rows {key.start}..{key.stop} are not held here")
        return self.array[a:b]


class Laps:
    """Seconds of a task's named stages, measured one after another (a set-up's breakdown)."""

    def __init__(self):
        """Start the first stage now."""
        self.t = time.perf_counter()
        self.times = {}

    def lap(self, name):
        """End stage ``name`` (seconds added to any earlier ones of that name)."""
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - self.t
        self.t = now
        return self.times


def pick(seq, k):
    """Item ``k`` of a task's result."""
    return seq[k]


def facts(spec, rank):
    """``(label, DeviceInfo)`` of this worker's device (``spec``, ``rank``: as
    :func:`worker_device`): what the client groups the workers' devices by. Out of the
    worker's pool (a fresh worker reads its partitions meanwhile), it also opens the device's
    context (the probe and :func:`warm_up` then find it made) while the worker reads and
    scans, before anything waits for it."""
    from ..engine.device import device_info, device_label, get_context
    _leave_pool()
    dev = worker_device(spec, rank)
    out = device_label(dev), device_info(dev)
    get_context(dev)
    return out


def probe(spec, rank, fit, stats):
    """``(label, DeviceInfo, {side: Choice}, seconds per stage)`` of this worker's device
    (``spec``, ``rank``: as :func:`worker_device`) for a fit of ``fit`` (a
    :class:`clmf.tuning.FitSpec`): the configuration looked up and its programs built (a
    configuration the device refuses is rejected and looked up again); run on one worker per
    kind of device, whose choice the others take."""
    from ..engine.device import device_info, device_label, get_context
    from ..engine.kernels import als_program
    from ..errors import InvalidConfigError
    from ..tuning import fallback, resolve
    _leave_pool()          # the worker's splits go on meanwhile (the builds wait on the driver)
    laps = Laps()
    dev = worker_device(spec, rank)
    info = device_info(dev)
    laps.lap("device")
    for _attempt in range(8):
        choices = resolve(fit, info, stats)
        laps.lap("resolve")
        try:
            # built here (then cached for the worker's engine): a looked-up configuration that
            # the device's kernel limits refuse is rejected and the lookup asked again, as an
            # in-process fit does; a caller's own variant is refused
            ldf = fit.ldf((choices["users"].config, choices["items"].config))
            for side in ("users", "items"):
                ch = choices[side]
                cfg = ch.config
                als_program(get_context(dev)[0], dev, cfg, fit.unknowns, info,
                            fit.implicit, fit.biased, ldf=ldf)
        except InvalidConfigError as e:
            if ch.rule == "explicit" or fallback.rejection(info, cfg, fit.f, fit.mode):
                raise
            fallback.reject(info, cfg, fit.f, fit.mode, f"the {ch.rule} rule ({ch.reason})", e)
            continue
        laps.lap("programs")
        return device_label(dev), info, choices, laps.times
    raise InvalidConfigError("no looked-up configuration runs on this worker's device",
                             "kernel_work_group_size")


def _leave_pool():
    """Inside a Dask worker, take this task's thread out of the worker's pool
    (:func:`distributed.secede`): the worker runs its next tasks meanwhile."""
    try:
        from distributed import get_worker, secede
        get_worker()
    except (ImportError, ValueError):
        return
    secede()


# ----- a fit's blocks and device worker (the owning worker) -----------------------------------
def take(fit_id, d, static, n_parts, p, user_piece, item_piece):
    """Hand partition ``p``'s pieces of this worker's blocks (its users rows, its items rows;
    arrays or shared-memory handles, :func:`split`) to the fit's :class:`_Collector` on this
    worker (made by the first piece: ``static`` as for :func:`blocks`, ``n_parts`` the
    partitions), which merges them in partition order, as they come, while the other splits
    still run; returns at once."""
    _collector(fit_id, d, static, n_parts).put(p, user_piece, item_piece)


def _collector(fit_id, d, static, n_parts):
    """This worker's :class:`_Collector` of fit ``fit_id`` (made on first use; a fit released
    here already, whose pieces come late, is an error, not a collector waiting forever)."""
    with _LOCK:
        if fit_id in _RELEASED:
            raise RuntimeError(f"fit {fit_id} was released on this worker")
        col = _MERGING.get(fit_id)
        if col is None:
            col = _MERGING[fit_id] = _Collector(d, static, n_parts)
    return col


def blocks(fit_id, d, static, _warmed, n_parts, *_taken):
    """Start building this worker's blocks in a thread of its own (users rows by the users'
    bounds, items rows by the items'; ``static``: the fit's shape, counts, bounds and start
    rule, see :meth:`~clmf.parallel.dask_backend.DaskEngine`) from the pieces of ``n_parts``
    partitions its :class:`_Collector` merged as they came (``_taken``: the :func:`take`
    tasks' results, which order the two) and return at once: the worker meanwhile resolves
    its device's configuration and builds its programs (:func:`probe`); :func:`build` takes
    the blocks. ``_warmed``: the :func:`warm_up` task's result (it orders the two), whose
    context and start factors (where the fit draws them: only a seed crosses the network) the
    blocks' thread takes."""
    col = _collector(fit_id, d, static, n_parts)
    with _LOCK:
        warm = _WARM.pop(fit_id, None)
    warm = warm or _in_thread("clmf-warm-up", _warm_up, d, static)     # (none submitted)
    fut = _in_thread("clmf-blocks", _blocks, fit_id, d, static, col,
                     split_times(setup_prefix(fit_id)), warm)   # (every split is done by now)
    with _LOCK:
        _PENDING[fit_id] = fut, warm
    return None


def _in_thread(name, fn, *args):
    """The future of ``fn(*args)`` run in a thread of its own (named ``name``)."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
    fut = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return fut


def warm_up(fit_id, d, static):
    """Start, in a thread of its own, what this worker's set-up needs besides its blocks: its
    device's context and, where the fit draws them, the start factors (``static``: as for
    :func:`blocks`) — submitted with the splits, which it overlaps; :func:`blocks` takes it."""
    fut = _in_thread("clmf-warm-up", _warm_up, d, static)
    with _LOCK:
        _WARM[fit_id] = fut


def _warm_up(d, static):
    """``(start factors or None, seconds per stage)`` of :func:`warm_up`."""
    from .. import reference
    from ..engine.device import get_context
    laps = Laps()
    get_context(worker_device(*static["devices"][d]))     # (a fresh worker: its context)
    laps.lap("context")
    if static.get("start") is None:
        return None, laps.times
    rule, f, seed = static["start"]
    start = reference.start_factors(*static["shape"], f, seed, init=rule)
    laps.lap("start_factors")
    return start, laps.times


def _blocks(fit_id, d, static, collector, times=None, warm=None):
    """``(Layout of this worker's blocks, start factors or None, seconds per stage)`` (those
    of ``times`` first: the splits'; ``warm``: the future of :func:`warm_up`, else the context
    and start factors are made here) from the pieces ``collector`` (:class:`_Collector`)
    merged; its pieces are unmapped after."""
    laps = Laps()
    laps.times.update(times or {})
    m, nn = static["shape"]
    try:
        # both blocks at once, and the context and start factors unless warm_up makes them
        # (NumPy's sorts, gathers and draws release the GIL: a GPU host gives each worker cores)
        with concurrent.futures.ThreadPoolExecutor(3, thread_name_prefix="clmf-blocks") as pool:
            warm = warm or pool.submit(_warm_up, d, static)
            got = collector.result()
            laps.lap("merge_wait")
            sides = {s: pool.submit(_block, got[s][0], s, collector.indptr[s],
                                    *collector.bounds[s], got[s][1], collector.threads)
                     for s in SIDES}
            users, items = sides["users"].result(), sides["items"].result()
            laps.lap("blocks")
            start, warm_times = warm.result()
            laps.lap("start_wait")
    finally:
        with _LOCK:
            if _MERGING.get(fit_id) is collector:
                del _MERGING[fit_id]
        collector.close()
    return Layout((m, nn), users, items), start, {**laps.times, **collector.times, **warm_times}


def _prebuild(dev, setup, d):
    """A future of the ALS programs of worker ``d``'s configurations, built (or loaded from the
    on-disk cache) in a thread: the engine then finds them built. A configuration that fails
    to build is left to the engine to report (with the side and device it names)."""
    from ..engine.device import device_info, get_context
    from ..engine.kernels import als_program
    from ..tuning.spec import unknowns

    def run():
        """Build both sides' programs; a configuration refused is the engine's to report."""
        info = device_info(dev)
        for cfg in setup["config_pairs"][d]:
            try:
                als_program(get_context(dev)[0], dev, cfg, unknowns(setup["f"], setup["biased"]),
                            info, setup["implicit_alpha"] is not None, setup["biased"],
                            ldf=setup["ldf"])
            except Exception as e:     # noqa: BLE001 - the engine builds it again and reports
                log.debug("prebuilding %s: %s", cfg, e)
    return _in_thread("clmf-programs", run)


def build(fit_id, d, setup, _after=None, shared=False):
    """This worker's memory plan and :class:`~clmf.engine.Engine` on the blocks :func:`blocks`
    built (waited for here) and, where it drew them, its start factors uploaded; returns a
    summary of the memory plan with the seconds of the set-up's stages on this worker
    (``_after``: the :func:`blocks` task's result, which orders the two; ``shared``: whether
    every worker maps every other's segments, :func:`setup_check`: solved blocks then go
    through shared memory)."""
    from ..tuning.spec import unknowns
    from .backend import partial_layout, plan_fit
    from .worker import device_engine
    laps = Laps()
    with _LOCK:
        pending, warm = _PENDING.pop(fit_id, (None, None))
    if pending is None:
        raise RuntimeError(f"this worker holds no blocks of fit {fit_id} (was it restarted?)")
    dev = worker_device(setup["specs"][d], setup["ranks"][d])
    programs = _prebuild(dev, setup, d)       # while the blocks are still being sorted
    padded = _in_thread("clmf-start", padded_start, warm, setup)     # ... and merged
    ahead = _stage_ahead(dev, setup, d, shared)          # the board's staging, likewise
    try:
        layout, start, times = pending.result()
        laps.lap("blocks_wait")
        programs.result()
        laps.lap("programs_wait")
        plan = setup["plan"]
        n = plan.devices
        users, items = layout.users, layout.items
        sources = {}
        for s in SIDES:
            if plan[s].mode == "reduce" and n > 1:
                sources[s] = partial_layout(layout, s, *plan[other_side(s)].block(d))
        all_sources = [{} for _ in range(n)]
        all_sources[d] = sources
        fs = unknowns(setup["f"], setup["biased"])
        dplan = plan_fit(setup["infos"], layout, plan, fs, setup["ldf"], setup["itemsize"],
                         setup["config_pairs"], setup["implicit_alpha"] is not None,
                         setup["max_device_memory"], (), all_sources, pipelined=True)[d]
        laps.lap("memory_plan")
        pair = setup["config_pairs"][d]
        w = device_engine(d, dev, layout, plan, dplan, setup["f"], setup["ldf"],
                         {"users": pair[0], "items": pair[1]}, setup["implicit_alpha"],
                         setup["biased"], setup["offset"], None, False, sources)
        laps.lap("engine")
    except BaseException:
        _free_ahead(ahead)                 # (no engine or board took the staging over)
        raise
    with _LOCK:
        old = _STATE.pop(fit_id, None)
        _STATE[fit_id] = {"worker": w, "layout": layout, "plan": plan, "d": d, "triples": {},
                          "ldf": setup["ldf"], "store": w.np_store,
                          "shm": bool(shared) and plan.devices > 1,
                          "segments": shm.Segments(f"{fit_id}-{d}"), "attached": shm.Attached()}
    if old is not None:
        _release_state(old)
    if ahead is not None:
        _STATE[fit_id]["ahead"] = ahead
    if start is not None:
        hosts, laps.times["start_pad"] = padded.result()     # (laid out while merging)
        laps.lap("start_pad_wait")
        upload_start(w, hosts)
        laps.lap("start_upload")
    log.info("fit %s: worker %d holds %d user and %d item rows (%d + %d ratings); %s", fit_id, d,
             users.r1 - users.r0, items.r1 - items.r0, len(users.indices), len(items.indices),
             dplan.describe())
    times = {**times, **laps.times, **{f"engine_{k}": v for k, v in w.setup_times.items()
                                       if k in ("build", "build_wait", "upload", "buffers")}}
    log.info("fit %s: worker %d set up in %s", fit_id, d,
             ", ".join(f"{k} {v:.3f} s" for k, v in times.items()))
    return {"total": int(dplan.total), "streamed": dplan.streamed, **dplan.bytes,
            "times": times}


def _state(fit_id):
    """This worker's share of a fit (a clear error when the process lost it)."""
    st = _STATE.get(fit_id)
    if st is None:
        raise RuntimeError(f"this worker holds no blocks of fit {fit_id} (was it restarted?)")
    return st


def _out_buffer(st, tag, shape, dtype):
    """``(array, what to return)``: a block's host buffer in this worker's shared segment
    ``tag`` (the result is then its :class:`~clmf.parallel.shared_blocks.SharedBlock`) when the
    fit uses shared memory and there is room, else a private array (returned itself)."""
    if st["shm"]:
        got = st["segments"].array(tag, shape, dtype)
        if got is not None:
            return got
    arr = np.empty(shape, dtype)
    return arr, arr


def write(fit_id, side, host):
    """Upload a whole side's padded factors (the rows this device holds)."""
    st = _state(fit_id)
    w = st["worker"]
    w.write_rows(side, host, 0, st["layout"][side].rows, blocking=True)


def solve(fit_id, side, regularization, weighted, needed, *previous):
    """Solve this worker's rows of ``side`` (replicated fixed factor) after installing the
    ``previous`` half-step's blocks (see :func:`install`); returns ``(r0, rows)`` of the solved
    block when the other workers need it, else None."""
    install(fit_id, *previous)
    st = _state(fit_id)
    w = st["worker"]
    r0, r1 = st["plan"][side].block(st["d"])
    shape = (max(0, r1 - r0), st["ldf"])               # every row is copied in
    buf, out = (_out_buffer(st, f"solve-{side}", shape, st["store"]) if needed
                else (np.empty(shape, st["store"]), None))
    ex = Exchange(side, Rows(buf, r0), 1, needed=needed)
    w.half_step(side, float(regularization), bool(weighted), ex)
    return (r0, out) if needed else None


def install(fit_id, side=None, needed=False, *blocks):
    """Upload the blocks of ``side`` that other workers solved (``(r0, rows)`` pairs, rows an
    array or a shared-memory handle; this worker's own block and None are skipped: they only
    order the tasks). Returns once the uploads are done (the owners may then rewrite their
    shared segments)."""
    if side is None or not needed:
        return None
    st = _state(fit_id)
    w = st["worker"]
    own = st["plan"][side].block(st["d"])[0]
    for blk in blocks:
        if blk is None or blk[0] == own:
            continue
        r0, rows = blk
        rows = shm.resolve(rows, st["attached"])
        w.keep(w.write_rows(side, Rows(rows, r0), r0, r0 + len(rows), blocking=False))
    w.q["into"].finish()
    return None


def board_make(fit_id):
    """Make this worker's board for its own iteration loop (see
    :func:`clmf.parallel.dask_board.board_create`): the handles, or None without room."""
    st = _state(fit_id)
    bounds = {s: st["plan"][s].bounds for s in SIDES}
    return BD.board_create(st["segments"], bounds, st["d"], st["ldf"], st["store"])


def board_connect(fit_id, abort, *handles):
    """Map every worker's board (``handles`` in worker order, :func:`board_make`'s results;
    None where one had no room: then no board here either, None returned); ``abort``: the
    name of the :class:`distributed.Event` that calls the fit off (asked while a peer's rows
    are late). Returns ``{"staged": whether this worker's own rows pass through page-locked
    staging, "publish": how they reach its segment
    (:func:`~clmf.parallel.dask_board.publish_mode`), "copy_gbs": host copy rates out of and
    into page-locked memory and between pageable arrays (GB/s; staged only), "ahead_wait_s":
    seconds waited here for the staging arrays made during the build}``."""
    if any(h is None for h in handles):
        return None
    st = _state(fit_id)
    bounds, w = {s: st["plan"][s].bounds for s in SIDES}, st["worker"]
    staged, mode, t = _staged(w.pinned), BD.publish_mode(w.info), time.perf_counter()
    reg, staged = staged and mode == "register", staged and mode != "register"
    made, rates = [], None
    if "ahead" in st:
        made, rates, pairs = st.pop("ahead").result()
        w.adopt_staging(pairs)
    waited = time.perf_counter() - t            # (for the staging made during the build)
    if staged and rates is None:                # (not registered: no host copies to rate)
        rates = BD.copy_rates(w.pinned_array)

    def staging(shape, dtype):
        """The page-locked array of ``shape``: one made ahead (:func:`_stage_ahead`), else a
        new one."""
        for k, a in enumerate(made):
            if a.shape == tuple(max(1, x) for x in shape) and a.dtype == np.dtype(dtype):
                return made.pop(k)         # (as pinned_array makes it: a row at least)
        return w.pinned_array(shape, dtype)
    st["board"] = BD.Board(st["attached"], st["d"], handles, bounds, abort=_event_check(abort),
                            staging=staging if staged else None,
                            reader=(_device_reader(w) if mode == "device" else
                                    _SegmentReader(w, st) if mode == "dma" else None)
                            if staged else None, context=w.ctx if reg else None)
    return {"staged": staged, "publish": mode if staged or reg else "none",
            "copy_gbs": rates if staged else {}, "ahead_wait_s": waited}


def _staged(pinned):
    """Whether a worker's own rows pass through page-locked staging on a board
    (``CLMF_DASK_PINNED_STAGING``, default: where its engine pins its host buffers,
    ``pinned``: :attr:`clmf.engine.Engine.pinned`, a GPU's by default)."""
    pin = os.environ.get(ENV_STAGING, "auto").strip().lower()
    return pinned if pin == "auto" else pin not in shm.OFF_WORDS


def _stage_ahead(dev, setup, d, shared):
    """Where worker ``d``'s share will run the workers' own loop with staging (shared memory,
    several workers, both factors replicated, the loop not switched off, a device whose engine
    pins its host buffers, the rows not registered instead), start making its board's
    page-locked arrays on the device's context and measuring its copy rates in a thread,
    before its blocks are merged: the future of ``(arrays, copy rates, (buffer, array)
    pairs)`` (:func:`board_connect` takes the arrays, the engine frees the pairs), else None."""
    from ..engine.device import device_info, get_context
    from ..engine.upload import pinned_array, pins_host
    plan = setup["plan"]
    if (not (shared and plan.devices > 1) or shm.switched_off(BD.ENV_LOOP)
            or not _staged(pins_host(device_info(dev)))      # (the engine's default)
            or BD.publish_mode(device_info(dev)) == "register"
            or any(plan[s].mode != "replicate" for s in SIDES)):
        return None
    specs = BD.staging_specs({s: plan[s].bounds for s in SIDES}, d, setup["ldf"],
                             setup["store"])

    def make():
        """The staging arrays, then the copy rates."""
        import pyopencl as cl
        ctx = get_context(dev)[0]
        q = cl.CommandQueue(ctx, dev)
        pairs = []

        def pinned(shape, dtype):
            """A zeroed page-locked array in the device's context."""
            pairs.append(pinned_array(ctx, q, shape, dtype))
            return pairs[-1][1]
        arrays = [pinned(shape, dt) for shape, dt, _mirror in specs]
        return arrays, BD.copy_rates(pinned), pairs
    return _in_thread("clmf-stage", make)


def _free_ahead(ahead):
    """Unmap and free the staging arrays of :func:`_stage_ahead` (its future, or None)."""
    if ahead is not None and ahead.exception() is None:     # (waits for it)
        for buf, arr in ahead.result()[2]:
            arr.base.release()             # (on the queue that mapped it)
            buf.release()


class _SegmentReader:
    """``read(side, dst, r0, r1)``: rows ``[r0, r1)`` of ``side`` (held by engine ``w``) copied
    by the device into ``dst``, a part of this worker's row segment of ``side``, through a
    buffer wrapping the whole segment (``USE_HOST_PTR``, made once per side: a driver that
    registers the pages copies by DMA, at the pinned rate) and mapped for reading, which by
    OpenCL's rule leaves the segment holding the buffer's bits; on a queue of its own,
    blocking (the publishing thread's). :meth:`close` frees the wrapping buffers (before the
    segments are unmapped)."""

    def __init__(self, w, st):
        """Keep the engine and the fit's state (its board, made after this)."""
        self.w, self.st = w, st
        self.q = None                  # its queue, made at the first copy
        self.wraps = {}

    def __call__(self, side, dst, r0, r1):
        """Copy rows ``[r0, r1)`` of ``side`` into ``dst`` (blocking)."""
        w, cl = self.w, self.w.cl
        if self.q is None:
            self.q = cl.CommandQueue(w.ctx, w.device)
        seg = self.st["board"].segment[side]
        buf = self.wraps.get(side)
        if buf is None:
            buf = self.wraps[side] = wrap_host(w.ctx, seg)
        off, n = dst.ctypes.data - seg.ctypes.data, dst.nbytes
        if not n:
            return
        lo = w.frange[side][0]
        cl.enqueue_copy(self.q, buf, w.factors[side], byte_count=n, dst_offset=off,
                        src_offset=(r0 - lo) * w.ldf * w.itemsize)
        view, ev = cl.enqueue_map_buffer(self.q, buf, cl.map_flags.READ, off, (n,), np.uint8)
        ev.wait()
        view.base.release(self.q)

    def close(self):
        """Wait for the queue and free the wrapping buffers."""
        if self.q is not None:
            self.q.finish()
        for buf in self.wraps.values():
            buf.release()
        self.wraps = {}


def _device_reader(w):
    """``read(side, dst, r0, r1)``: rows ``[r0, r1)`` of ``side`` (held by engine ``w``) copied
    from its device into ``dst`` on a queue of their own, blocking (the publishing thread's:
    the engine's queues hold its copies of later batches)."""
    q = w.cl.CommandQueue(w.ctx, w.device)

    def read(side, dst, r0, r1):
        """Copy rows ``[r0, r1)`` of ``side`` into ``dst``, blocking."""
        lo = w.frange[side][0]
        w.cl.enqueue_copy(q, dst, w.factors[side], src_offset=(r0 - lo) * w.ldf * w.itemsize,
                          is_blocking=True)
    return read


def _event_check(name):
    """A function telling whether the :class:`distributed.Event` ``name`` is set (False when
    the scheduler cannot be asked)."""
    def check():
        try:
            from distributed import Event
            return Event(name).is_set()
        except Exception as e:       # noqa: BLE001 - the peers' liveness is checked anyway
            log.debug("abort event %s not readable: %s", name, e)
            return False
    return check


def iterate(fit_id, regularization, weighted, count=1, metrics=()):
    """Run ``count`` whole ALS iterations (users, then items) on this worker, the solved rows
    exchanged with the other workers of the fit through their boards while the kernels run
    (one task for a group of iterations instead of one per half-step and an install), with
    the squared errors of the keys ``metrics`` (:func:`squared_error`) after each; returns per
    iteration ``(seconds, {key: (sse, count)}, seconds of the metrics, {part: seconds})``
    measured here (the parts: :func:`_loop_parts`, and where the tails after this worker's
    kernels went, :func:`~clmf.parallel.dask_board.tail_parts`, summed over the
    half-steps)."""
    st = _state(fit_id)
    w, board = st["worker"], st.get("board")
    if board is None and st["plan"].devices > 1:
        raise RuntimeError(f"fit {fit_id} has no board on this worker (board_connect first)")
    out = []
    for _ in range(int(count)):
        before = _loop_parts(w, board)
        tails = {}
        t0 = time.perf_counter()
        for side in SIDES:
            ex = board.exchange(side) if board is not None else None
            th, c0 = time.perf_counter(), w.times["compute"]
            w.half_step(side, float(regularization), bool(weighted), ex)
            if ex is not None:
                end = time.perf_counter()
                for k, v in BD.tail_parts(ex.marks, th + w.times["compute"] - c0,
                                           end).items():
                    tails[k] = tails.get(k, 0.0) + v
        t1 = time.perf_counter()
        parts = {k: v - before[k] for k, v in _loop_parts(w, board).items()}
        parts.update(tails)
        scores = {key: squared_error(fit_id, key) for key in metrics}
        out.append((t1 - t0, scores, time.perf_counter() - t1, parts))
    return out


def _loop_parts(w, board):
    """The running sums of an iteration's parts on this worker: the engine's ``compute`` (to
    its own kernels' end) and ``exchange`` (after it, the peers' last rows), the board's
    ``take`` (the driving thread waiting for the peers' rows and their copies) and
    ``publish_copy`` (its own rows into its segment) — seconds."""
    out = {k: float(w.times.get(k, 0.0)) for k in ("compute", "exchange")}
    if board is not None:
        out.update(board.times)
    return out


def partials(fit_id, side, *previous):
    """Reduce mode, first phase: the packed partial systems (the hermitian's lower triangle and
    the right side, :func:`clmf.engine.memory.packed_width`) of every row of ``side`` over this
    worker's block of the fixed side (after installing the ``previous`` half-step's blocks), by
    the pipeline of the in-process fit (:func:`clmf.engine.reduce.pipelined`), cut by owning
    worker: a list of the rows of each worker, then the Gram ``G``."""
    from ..engine.memory import packed_width
    from ..engine.reduce import pipelined
    from .reducer import PartialsPort
    install(fit_id, *previous)
    st = _state(fit_id)
    w = st["worker"]
    rows, fs = max(1, st["layout"][side].rows), w.fs
    P, p_out = _out_buffer(st, f"partials-{side}-P", (rows, packed_width(fs)), np.float32)
    G, g_out = _out_buffer(st, f"partials-{side}-G", (fs, fs), np.float32)
    G[...] = 0
    pipelined(w, side, PartialsPort(P, G), 0.0, False, Exchange(side, None, 1, needed=False))
    bounds = st["plan"][side].bounds
    return [_rows_of(p_out, P, bounds[e], bounds[e + 1])
            for e in range(len(bounds) - 1)] + [g_out]


def _rows_of(out, arr, a, b):
    """Rows ``[a, b)`` of a partials buffer as returned to their owner: a handle into the
    shared segment, or a copy (only those rows travel through the comms)."""
    if isinstance(out, shm.SharedBlock):
        row = int(np.prod(out.shape[1:], dtype=np.int64)) * np.dtype(out.dtype).itemsize
        return shm.SharedBlock(out.name, out.offset + a * row, (b - a, *out.shape[1:]),
                               out.dtype)
    return arr[a:b].copy()


def reduce_solve(fit_id, side, regularization, weighted, needed, n, *parts):
    """Reduce mode, second phase: sum the ``n`` workers' packed partial systems of this
    worker's rows (``parts``: n arrays, then n Gram matrices) and solve them by the pipeline
    (unpacked on the device with the regularisation and the Gram matrix added); returns
    ``(r0, rows)`` as :func:`solve`."""
    from ..engine.reduce import pipelined
    from .reducer import SummedPort, segment_rows
    st = _state(fit_id)
    w = st["worker"]
    r0, r1 = st["plan"][side].block(st["d"])
    parts = shm.resolve(list(parts), st["attached"])
    P = parts[0].copy()
    for p in parts[1:n]:
        P += p
    G = np.sum(parts[n:2 * n], axis=0, dtype=np.float32)
    shape = (max(0, r1 - r0), st["ldf"])               # every row is copied in
    buf, out = (_out_buffer(st, f"solve-{side}", shape, st["store"]) if needed
                else (np.empty(shape, st["store"]), None))
    ex = Exchange(side, Rows(buf, r0), 1, needed=needed)
    seg = segment_rows(st["layout"][side].rows, n, w.fs, [w.batch_rows[side]])
    pipelined(w, side, SummedPort(Rows(P, r0), G, r0, r1, seg), float(regularization),
              bool(weighted), ex, partials=False)
    return (r0, out) if needed else None


def read(fit_id, side):
    """This worker's solved block of ``side``: ``(r0, padded rows)``."""
    st = _state(fit_id)
    r0, r1 = st["plan"][side].block(st["d"])
    buf = np.zeros((max(0, r1 - r0), st["ldf"]), st["store"])
    st["worker"].read_rows(side, Rows(buf, r0), r0, r1, blocking=True)
    return r0, buf


def metric_side(plan):
    """The side whose blocks split the squared-error sums (the one whose factor is partitioned;
    users when both are replicated) — as :meth:`MultiEngine.squared_error`."""
    return "items" if plan["users"].mode == "reduce" else "users"


def set_triples(fit_id, key, *pieces):
    """Keep held-out triples (already routed to this worker's block) under ``key``."""
    st = _state(fit_id)
    u = np.concatenate([p[0] for p in pieces]) if pieces else np.zeros(0, np.int32)
    i = np.concatenate([p[1] for p in pieces]) if pieces else np.zeros(0, np.int32)
    r = np.concatenate([p[2] for p in pieces]) if pieces else np.zeros(0, np.float32)
    st["triples"][key] = (u, i, r)
    return len(r)


def squared_error(fit_id, key):
    """Sum of squared errors and count on this worker's training block (``key`` "train") or on
    the held-out triples kept under ``key``."""
    st = _state(fit_id)
    w = st["worker"]
    if key == "train":
        by = metric_side(st["plan"])
        if "train" not in st["triples"]:
            r0, r1 = st["plan"][by].block(st["d"])
            ip, idx, val = st["layout"][by].entries(r0, r1)
            rows = np.repeat(np.arange(r0, r1, dtype=np.int32), np.diff(ip))
            u, i = (rows, np.asarray(idx)) if by == "users" else (np.asarray(idx), rows)
            st["triples"]["train"] = (u, i, np.asarray(val))
    u, i, r = st["triples"][key]
    return w.squared_error(key, u, i, r, 0.0)


def release(fit_id, *_after):
    """Free this worker's share of a fit (no error when it holds none; ``_after``: results of
    tasks that must run first)."""
    with _LOCK:
        st = _STATE.pop(fit_id, None)
        pending, warm_b = _PENDING.pop(fit_id, (None, None))
        warm = _WARM.pop(fit_id, None)
        merging = _MERGING.pop(fit_id, None)
        _RELEASED.append(fit_id)
    if merging is not None:       # pieces of a set-up that failed: stop waiting, unmap
        merging.close()
    for fut in (pending, warm, warm_b):   # blocks never taken by build (a failed set-up)
        if fut is not None:
            fut.cancel()
    if st is not None:
        shared = st["shm"]
        _release_state(st)
        if shared:                # the segments of workers that died with the fit
            shm.unlink_fit(fit_id)
    shm.unlink_fit(setup_prefix(fit_id))     # probes, and pieces a failed set-up left
    split_times(setup_prefix(fit_id))        # (the held-out ratings' splits)
    return st is not None or pending is not None


def setup_prefix(fit_id):
    """The start of the names of a fit's set-up segments (probes and pieces)."""
    return f"{fit_id}-set-up"


def _release_state(st):
    """Free a fit's device worker (its copies ended first) and its shared segments (mapped
    and owned), once the staging arrays made ahead for its board are made."""
    try:
        _free_ahead(st.pop("ahead", None))      # (made ahead, no board took them)
        if st.get("board") is not None:
            st["worker"].drain()
            st["board"].close()
        st["worker"].release()
    finally:
        st["attached"].close()
        st["segments"].close()


# ----- scoring and recommending on the workers ------------------------------------------------
def partition_sse(df, columns, state):
    """``(sum of squared errors, count)`` of a partition of raw-id ratings under a fitted model's
    ``state`` (dict of factors, biases, counts, mean, id indices)."""
    u, i, r = encode(df, columns, state["user_index"], state["item_index"])
    p = predict_codes(state, u, i)
    err = p.astype(np.float64) - r
    return float(np.sum(err * err)), int(len(r))


def predict_codes(state, u, i):
    """Predictions for dense indices (-1: an id unknown to the model) as :meth:`clmf.ALS.predict`
    makes them (:func:`clmf.inference.predict.predict_pairs`)."""
    from ..inference.predict import predict_pairs
    return predict_pairs(state["X"], state["Y"], u, i, global_mean=state["mean"],
                         user_counts=state["user_counts"], item_counts=state["item_counts"],
                         user_biases=state["bu"], item_biases=state["bi"],
                         implicit=state["feedback"] == "implicit")
