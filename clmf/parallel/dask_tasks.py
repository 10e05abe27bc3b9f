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

import concurrent.futures
import logging
import os
import threading
import time

import numpy as np

from ..engine.device import worker_device
from . import shared_blocks as shm
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
from .layout import Layout, SideLayout
from .worker import SIDES, Exchange, other_side

log = logging.getLogger(__name__)

_STATE = {}            # fit id → dict (this worker's share of the fit)
_PENDING = {}          # fit id → future of the blocks being built (see blocks)
_WARM = {}             # fit id → future of the context and start factors (see warm_up)
_MERGING = {}          # fit id → _Collector merging the pieces of the blocks (see take)
# "1"/"0": the workers' own rows pass through page-locked staging arrays or not (default
# "auto": where the engine pins its host buffers, i.e. on GPUs; see shared_blocks.Board)
ENV_STAGING = "CLMF_DASK_PINNED_STAGING"
_LOCK = threading.Lock()


class BlockSide(SideLayout):
    """One side's CSR holding only rows ``[r0, r1)`` (a worker's block), with the global row
    pointers so rows keep their global numbering (``entries`` of other rows is an error)."""

    def __init__(self, indptr, r0, r1, indices, data):
        """The block's rows and entries, the side's global row pointers."""
        super().__init__(indptr, indices, data)
        self.r0, self.r1 = int(r0), int(r1)
        self.base = int(indptr[r0])

    def entries(self, r0, r1):
        """``(indptr rebased to 0, indices, data)`` of rows ``[r0, r1)`` inside the block."""
        if not (self.r0 <= r0 <= r1 <= self.r1):
            raise ValueError(f"rows {r0}..{r1} are outside this worker's block "
                             f"{self.r0}..{self.r1}")
        ip = np.asarray(self.indptr[r0:r1 + 1], dtype=np.int64)
        e0, e1 = int(ip[0]) - self.base, int(ip[-1]) - self.base
        return ip - ip[0], self.indices[e0:e1], self.data[e0:e1]


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
def _block(pieces, key, indptr, r0, r1, merged=None):
    """The CSR of rows ``[r0, r1)`` of one side from the triples sent to this worker (sorted by
    row, then column): pieces that each run by row (:func:`~clmf.parallel.dask_prepare.split`
    sorts them) are merged by writing each piece's rows after the earlier pieces' entries of
    the same rows (no sort; ``merged``: that merge's ``(columns, values)`` made already, as
    the pieces came, :class:`RowMerger`); other pieces are sorted by radix passes over the
    row, and rows whose columns are then out of order by passes over the column and the row
    (as files in no order give); duplicate entries are refused."""
    k_rows = 0 if key == "users" else 1
    got = sum(len(p[k_rows]) for p in pieces)
    want = int(indptr[r1] - indptr[r0])
    if got != want:
        raise RuntimeError(f"{key} block {r0}..{r1} received {got} ratings, expected "
                           f"{want} (a partition changed between passes over the data?)")
    counts = np.diff(indptr[r0:r1 + 1])
    if merged is None:
        merged = _merge_rows(pieces, k_rows, counts, r0, r1, key)
    if merged is not None:
        cols, r = merged
    else:
        def cat(k, dt):
            """Field ``k`` of every piece, in order."""
            return np.concatenate([p[k] for p in pieces]) if pieces else np.zeros(0, dt)
        rel = cat(k_rows, np.int32) - np.int32(r0)
        cols, r = cat(1 - k_rows, np.int32), cat(2, np.float32)
        if not np.array_equal(np.bincount(rel, minlength=r1 - r0), counts):
            raise _other_rows(key, r0, r1)
        order = stable_order(rel, max(1, r1 - r0))       # by row, keeping the columns' order
        cols, r = gather(order, cols, r)
    starts = indptr[r0:r1 + 1] - indptr[r0]
    brk = np.zeros(len(cols), bool)                      # where a new row starts
    brk[starts[1:-1][starts[1:-1] < len(cols)]] = True
    if not bool(np.all((cols[1:] > cols[:-1]) | brk[1:])):     # by column, then by row
        rows = np.repeat(np.arange(r0, r1, dtype=np.int32), counts)
        order = stable_order(cols, int(cols.max()) + 1)
        order = order[stable_order(rows[order] - np.int32(r0), max(1, r1 - r0))]
        rows, cols, r = gather(order, rows, cols, r)
        dup = (rows[1:] == rows[:-1]) & (cols[1:] == cols[:-1])
        if dup.any():
            k = int(np.flatnonzero(dup)[0])
            raise ValueError(f"the ratings have {int(dup.sum())} duplicate (user, item) "
                             f"entries (first: {key[:-1]} index {int(rows[k])}, other "
                             f"index {int(cols[k])})")
    return BlockSide(indptr, r0, r1, np.ascontiguousarray(cols, dtype=np.int32),
                     np.ascontiguousarray(r, dtype=np.float32))


def _other_rows(key, r0, r1):
    """The error of a block whose pieces hold other rows than the counts said."""
    return RuntimeError(f"{key} block {r0}..{r1} received other rows than counted (a "
                        "partition changed between passes over the data?)")


def _merge_rows(pieces, k_rows, counts, r0, r1, key):
    """``(columns, values)`` of rows ``[r0, r1)`` (``counts`` entries each) by row, each row's
    entries in piece order, from pieces that each run by row (field ``k_rows``): every piece's
    entries written after the earlier pieces' entries of the same rows (a scatter that runs
    forward, no sort); None when a piece does not run by row (:class:`RowMerger`)."""
    merger = RowMerger(counts, r0, k_rows, key)
    for p in pieces:
        if not merger.add(p):
            return None
    return merger.result()


class RowMerger:
    """One side's block of rows ``[r0, r0 + len(counts))`` merged piece by piece, in piece
    order, from pieces that each run by row (field ``k_rows`` of each triple): each piece's
    entries are written after the earlier pieces' entries of the same rows as it comes (a
    forward scatter into arrays of the block's final size, no sort), so a worker merges its
    pieces while the other splits still run (:class:`_Collector`)."""

    def __init__(self, counts, r0, k_rows, key):
        """A block whose row ``r0 + j`` holds ``counts[j]`` entries."""
        self.counts = np.asarray(counts, np.int64)
        self.r0, self.k_rows, self.key = int(r0), int(k_rows), key
        span = len(self.counts)
        n = int(self.counts.sum())
        self.cols, self.vals = np.empty(n, np.int32), np.empty(n, np.float32)
        self.at = np.zeros(span, np.int64)               # where each row's next entry goes
        np.cumsum(self.counts[:-1], out=self.at[1:])
        self.end = self.at + self.counts                 # where each row's entries end

    def add(self, piece):
        """Merge ``piece`` after the earlier ones; False (nothing written) when it does not
        run by row. A piece with more entries of a row than counted is refused."""
        span = len(self.counts)
        rel = piece[self.k_rows] - np.int32(self.r0)
        if not len(rel):
            return True
        if rel[0] < 0 or rel[-1] >= span or not bool(np.all(rel[1:] >= rel[:-1])):
            return False
        c = np.bincount(rel, minlength=span)
        if bool(np.any(self.at + c > self.end)):
            raise _other_rows(self.key, self.r0, self.r0 + span)
        a, b = int(rel[0]), int(rel[-1]) + 1
        if np.array_equal((self.at + c)[a:b - 1], self.at[a + 1:b]):
            # its rows' places follow one another (e.g. whole rows of a file sorted by them):
            # one slice
            e0 = int(self.at[a])
            self.cols[e0:e0 + len(rel)] = piece[1 - self.k_rows]
            self.vals[e0:e0 + len(rel)] = piece[2]
        else:
            first = np.cumsum(c) - c                     # each row's first entry in the piece
            dest = np.repeat(self.at - first, c) + np.arange(len(rel))
            self.cols[dest] = piece[1 - self.k_rows]
            self.vals[dest] = piece[2]
        self.at += c
        return True

    def result(self):
        """``(columns, values)`` once every piece was added (fewer entries of a row than
        counted are refused)."""
        if not np.array_equal(self.at, self.end):
            raise _other_rows(self.key, self.r0, self.r0 + len(self.counts))
        return self.cols, self.vals


def take(fit_id, d, static, n_parts, p, user_piece, item_piece):
    """Hand partition ``p``'s pieces of this worker's blocks (its users rows, its items rows;
    arrays or shared-memory handles, :func:`split`) to the fit's :class:`_Collector` on this
    worker (made by the first piece: ``static`` as for :func:`blocks`, ``n_parts`` the
    partitions), which merges them in partition order, as they come, while the other splits
    still run; returns at once."""
    _collector(fit_id, d, static, n_parts).put(p, user_piece, item_piece)


def _collector(fit_id, d, static, n_parts):
    """This worker's :class:`_Collector` of fit ``fit_id`` (made on first use)."""
    with _LOCK:
        col = _MERGING.get(fit_id)
        if col is None:
            col = _MERGING[fit_id] = _Collector(d, static, n_parts)
    return col


class _Collector:
    """A worker's pieces of its blocks, merged side by side in threads of their own as they
    come (:class:`RowMerger`), each side's pieces in partition order (the order that gives a
    row's entries in the order of the data); a piece that does not run by row, or whose rows
    differ from the counts, turns the merge of its side off: :func:`_block` then builds that
    side from every piece as before (and reports the error). Pieces in shared memory are
    mapped as they come and their segments unlinked at once (the mapping keeps the memory
    until :meth:`close`)."""

    def __init__(self, d, static, n_parts):
        """The merges of worker ``d``'s blocks of a fit (``static``: see :func:`blocks`) from
        ``n_parts`` partitions' pieces, started."""
        self.n_parts = int(n_parts)
        self.indptr = {}
        self.pieces = {s: [None] * self.n_parts for s in SIDES}
        self.attached = {s: shm.Attached() for s in SIDES}
        self.cond = threading.Condition()
        self.cancelled = False
        self.times = {}
        for s, rows, counts in (("users", static["shape"][0], static["user_counts"]),
                                ("items", static["shape"][1], static["item_counts"])):
            self.indptr[s] = np.zeros(rows + 1, np.int64)
            np.cumsum(counts, out=self.indptr[s][1:])
        self.bounds = {s: tuple(int(x) for x in static["bounds"][s][d:d + 2]) for s in SIDES}
        pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="clmf-merge")
        self.futs = {s: pool.submit(self._merge, s) for s in SIDES}
        pool.shutdown(wait=False)

    def put(self, p, user_piece, item_piece):
        """Partition ``p``'s pieces arrived."""
        with self.cond:
            self.pieces["users"][p] = ("new", user_piece)
            self.pieces["items"][p] = ("new", item_piece)
            self.cond.notify_all()

    def _next(self, side, p):
        """Piece ``p`` of ``side`` once it arrived, mapped where it is in shared memory."""
        with self.cond:
            while self.pieces[side][p] is None and not self.cancelled:
                self.cond.wait()
            if self.cancelled:
                raise concurrent.futures.CancelledError(f"the {side} blocks' merge")
            _tag, piece = self.pieces[side][p]
        names = shm.segment_names(piece)
        piece = shm.resolve(piece, self.attached[side])
        shm.unlink(names)
        self.pieces[side][p] = ("mapped", piece)
        return piece

    def _merge(self, side):
        """``(pieces, (columns, values) or None)`` of ``side``: every piece merged as it came
        (None: the merge turned off, :func:`_block` builds the side from the pieces)."""
        k_rows = 0 if side == "users" else 1
        r0, r1 = self.bounds[side]
        merger = RowMerger(np.diff(self.indptr[side][r0:r1 + 1]), r0, k_rows, side)
        pieces, seconds = [], 0.0
        for p in range(self.n_parts):
            pieces.append(self._next(side, p))
            if merger is None:
                continue
            t = time.perf_counter()
            try:
                if not merger.add(pieces[-1]):
                    merger = None
            except RuntimeError:     # other rows than counted: _block says so
                merger = None
            seconds += time.perf_counter() - t
        self.times[f"merge_{side}"] = seconds
        try:
            return pieces, None if merger is None else merger.result()
        except RuntimeError:
            return pieces, None

    def result(self):
        """``{side: (pieces, merged or None)}`` once every piece is merged."""
        return {s: fu.result() for s, fu in self.futs.items()}

    def close(self):
        """Stop waiting for pieces and unmap them (the blocks are built, or the fit went)."""
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()
        for s, fu in self.futs.items():
            try:
                fu.result()
            except BaseException:    # noqa: BLE001 - cancelled, or reported by the blocks
                pass
            self.attached[s].close()
        for side in SIDES:           # segments of pieces never mapped (a failed set-up)
            shm.unlink(shm.segment_names([x[1] for x in self.pieces[side]
                                          if x is not None and x[0] == "new"]))


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
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="clmf-blocks")
    fut = pool.submit(_blocks, fit_id, d, static, col, split_times(setup_prefix(fit_id)),
                      warm)   # (every split is done by now)
    pool.shutdown(wait=False)
    with _LOCK:
        _PENDING[fit_id] = fut
    return None


def warm_up(fit_id, d, static):
    """Start, in a thread of its own, what this worker's set-up needs besides its blocks: its
    device's context and, where the fit draws them, the start factors (``static``: as for
    :func:`blocks`) — submitted with the splits, which it overlaps; :func:`blocks` takes it."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="clmf-warm-up")
    fut = pool.submit(_warm_up, d, static)
    pool.shutdown(wait=False)
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
                                    *collector.bounds[s], got[s][1]) for s in SIDES}
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
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="clmf-programs")
    fut = pool.submit(run)
    pool.shutdown(wait=False)
    return fut


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
        pending = _PENDING.pop(fit_id, None)
    if pending is None:
        raise RuntimeError(f"this worker holds no blocks of fit {fit_id} (was it restarted?)")
    dev = worker_device(setup["specs"][d], setup["ranks"][d])
    programs = _prebuild(dev, setup, d)       # while the blocks are still being sorted
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
    with _LOCK:
        old = _STATE.pop(fit_id, None)
        _STATE[fit_id] = {"worker": w, "layout": layout, "plan": plan, "d": d, "triples": {},
                          "ldf": setup["ldf"], "store": w.np_store,
                          "shm": bool(shared) and plan.devices > 1,
                          "segments": shm.Segments(f"{fit_id}-{d}"), "attached": shm.Attached()}
    if old is not None:
        _release_state(old)
    _stage_ahead(_STATE[fit_id])
    if start is not None:
        from ..engine.factors import padded_factors
        for side, M in zip(SIDES, start):
            rows = layout[side].rows
            write(fit_id, side, padded_factors(side, M, rows, setup["f"], setup["ldf"],
                                               w.np_store, setup["biased"]))
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
    :func:`clmf.parallel.shared_blocks.board_create`): the handles, or None without room."""
    st = _state(fit_id)
    bounds = {s: st["plan"][s].bounds for s in SIDES}
    return shm.board_create(st["segments"], bounds, st["d"], st["ldf"], st["store"])


def board_connect(fit_id, abort, *handles):
    """Map every worker's board (``handles`` in worker order, :func:`board_make`'s results;
    None where one had no room: then no board here either, None returned); ``abort``: the
    name of the :class:`distributed.Event` that calls the fit off (asked while a peer's rows
    are late). Returns ``{"staged": whether this worker's own rows pass through page-locked
    staging, "publish": how they reach its segment (:func:`~clmf.parallel.shared_blocks.
    publish_mode`), "copy_gbs": host copy rates out of and into page-locked memory and between
    pageable arrays (GB/s; staged only)}``."""
    if any(h is None for h in handles):
        return None
    st = _state(fit_id)
    bounds = {s: st["plan"][s].bounds for s in SIDES}
    w = st["worker"]
    staged = _staged(w)
    mode = shm.publish_mode()
    made, rates = st.pop("ahead").result() if "ahead" in st else ([], None)
    if staged and rates is None:
        rates = shm.copy_rates(w.pinned_array)

    def staging(shape, dtype):
        """The page-locked array of ``shape``: one made ahead (:func:`_stage_ahead`), else a
        new one."""
        for k, a in enumerate(made):
            if a.shape == tuple(max(1, x) for x in shape) and a.dtype == np.dtype(dtype):
                return made.pop(k)         # (as pinned_array makes it: a row at least)
        return w.pinned_array(shape, dtype)
    st["board"] = shm.Board(st["attached"], st["d"], handles, bounds, abort=_event_check(abort),
                            staging=staging if staged else None,
                            reader=_device_reader(w) if staged and mode == "device" else None)
    return {"staged": staged, "publish": mode if staged else "none",
            "copy_gbs": rates if staged else {}}


def _staged(w):
    """Whether engine ``w``'s own rows pass through page-locked staging on a board
    (``CLMF_DASK_PINNED_STAGING``, default: where the engine pins its host buffers)."""
    pin = os.environ.get(ENV_STAGING, "auto").strip().lower()
    return w.pinned if pin == "auto" else pin not in shm.OFF_WORDS


def _stage_ahead(st):
    """Where this worker's share will run the workers' own loop with staging (shared memory,
    several workers, both factors replicated, the loop not switched off), start making its
    board's page-locked arrays and measuring its copy rates in a thread (``st["ahead"]``:
    their future) while the build goes on: :func:`board_connect` then finds them made."""
    from .dask_backend import ENV_LOOP
    plan, w = st["plan"], st["worker"]
    if (not st["shm"] or shm.switched_off(ENV_LOOP) or not _staged(w)
            or any(plan[s].mode != "replicate" for s in SIDES)):
        return
    bounds = {s: plan[s].bounds for s in SIDES}
    specs = shm.staging_specs(bounds, st["d"], st["ldf"], st["store"])

    def make():
        """The staging arrays, then the copy rates."""
        arrays = [w.pinned_array(shape, dt) for shape, dt, _mirror in specs]
        return arrays, shm.copy_rates(w.pinned_array)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="clmf-stage")
    st["ahead"] = pool.submit(make)
    pool.shutdown(wait=False)


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
    kernels went, :func:`~clmf.parallel.shared_blocks.tail_parts`, summed over the
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
                for k, v in shm.tail_parts(ex.marks, th + w.times["compute"] - c0,
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
        pending = _PENDING.pop(fit_id, None)
        warm = _WARM.pop(fit_id, None)
        merging = _MERGING.pop(fit_id, None)
    if merging is not None:       # pieces of a set-up that failed: stop waiting, unmap
        merging.close()
    for fut in (pending, warm):   # blocks never taken by build (the set-up failed)
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
    """Free a fit's device worker and its shared segments (mapped and owned), once the
    staging arrays made ahead for its board (:func:`_stage_ahead`) are made."""
    try:
        ahead = st.pop("ahead", None)
        if ahead is not None:
            concurrent.futures.wait([ahead])     # (its failure: no board was made with them)
        if st.get("board") is not None:
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
