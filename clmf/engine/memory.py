"""The memory plan of a fit: bytes per buffer, host and device, from shapes alone.

A fit asks for its plan before it allocates anything large — the start factors, the CSR copies of
both sides, any device buffer — and refuses with a typed error naming the bytes needed when the
plan does not fit (:class:`clmf.errors.DeviceMemoryError`, :class:`clmf.errors.HostMemoryError`).
The plan is a pure function of the problem's shape (rows, columns, ratings, f), the kernel
configurations and the device's limits, so callers (the engine, a multi-device or out-of-core
partitioner) can ask "does this fit?" for any piece of the problem without touching data.

Every buffer the engine creates is counted: per side the CSR (``indptr`` int64, ``indices``
int32, ``data`` float32), the factor matrix (``rows × ldf`` at the storage's item size), the
batch scratch ``A`` (``batch × f²``) and ``B`` (``batch × f``), the ``G`` buffer (``f²``, the
implicit Gram; allocated on every fit), the implicit Gram's virtual-row CSR, the long rows'
pieces (:func:`plan_split`: the virtual row pointers and the pieces' partial ``A``/``B``), the
status word, and the device metrics' triples (train and validation).
"""
from __future__ import annotations

import dataclasses
import logging
import os

from ..errors import DeviceMemoryError, HostMemoryError
from ..tuning.spec import row_width, unknowns
from .config import SPLIT_NEVER

log = logging.getLogger(__name__)

__all__ = ["MemoryPlan", "SplitPlan", "plan_fit", "plan_split", "split_threshold",
           "choose_batch_rows", "launch_rows", "PUBLISH_LAUNCHES", "available_host_memory",
           "DEVICE_FRACTION", "HOST_FRACTION", "SCRATCH_BUDGET", "MAX_BATCH_ROWS", "SPLIT_FLOOR",
           "SPLIT_WAVES",
           "SPLIT_COMBINE_ENTRIES", "split_pays", "side_buffers", "gram_geometry", "GramGeometry",
           "gram_tiled", "gram_virtual_rows", "GRAM_VIRTUAL_ROWS",
           "DevicePlan", "SideMemory",
           "plan_device", "device_budget", "scratch_rows", "chunk_rows", "MAX_CHUNK_ROWS",
           "packed_width", "PACKED_BATCH_BYTES", "SEGMENT_BYTES"]

SCRATCH_BUDGET = 512 << 20      # default cap on per-side hermitian scratch
MAX_BATCH_ROWS = 1 << 16
# a pipelined reduced side's batch of packed systems, at most: on 4 x H100 (Hugewiki x 0.25,
# f = 100, results/bench/x4-38/) 64 MiB batches (3,258 rows) made S1's long-row launches 27 %
# slower than 256 MiB (13,030 rows, about the hermitian scratch's own cap): 0.659 vs 0.592 s/it
PACKED_BATCH_BYTES = 256 << 20
# a reduced side's segment (the rows summed and handed to their owner at once) of packed systems
# on one device, at most (:func:`clmf.parallel.reducer.segment_rows`)
SEGMENT_BYTES = 8 << 20
DEVICE_FRACTION = 0.9           # of the device's global memory a fit may plan to use
HOST_FRACTION = 0.9             # of the host's available memory
SPLIT_FLOOR = 4096              # automatic split: never pieces shorter than this
SPLIT_WAVES = 8                 # automatic split: work-group slots per compute unit
# automatic split: what routing one row through the pieces' scratch costs, in entries of S1
# work, calibrated on the H100 (results/bench/longrows-h100, Netflix shape, f = 50 and 100):
# the users' side (13K rows per launch, longest ~17K) lost with splitting (S1 70.1 -> 61.2 ms
# but the combine 21.2 ms), the items' side (8.9K rows per launch, longest 233K) gained
# (S1 57.3 -> 46.8 ms, combine 0.8 ms); the first estimate (8 f² bytes per row at ~2 FMA per
# byte: 32 entries) overrated the longest row's tail ~20×; 2048 separates the two with margin
SPLIT_COMBINE_ENTRIES = 2048


def packed_width(fs):
    """Floats of one reduced system packed for the bus and the host sums: the lower triangle of
    its ``fs`` × ``fs`` hermitian (symmetric), then its ``fs`` right-hand side values."""
    return fs * (fs + 1) // 2 + fs


def _gib(b):
    return f"{b / 2**30:.2f} GiB"


@dataclasses.dataclass
class MemoryPlan:
    """Bytes per buffer of one fit: ``device`` and ``host`` map a buffer's name to its bytes."""
    device: dict
    host: dict

    @property
    def device_total(self):
        """Bytes of all device buffers."""
        return int(sum(self.device.values()))

    @property
    def host_total(self):
        """Bytes of the host arrays the fit allocates at its peak."""
        return int(sum(self.host.values()))

    def device_dict(self):
        """The device buffers with a ``total`` (the form of ``ALS.memory_``)."""
        d = {k: int(v) for k, v in self.device.items()}
        d["total"] = self.device_total
        return d

    def _largest(self, where, n=3):
        items = sorted(where.items(), key=lambda kv: -kv[1])[:n]
        return ", ".join(f"{k} {_gib(v)}" for k, v in items)

    def check_device(self, info, fraction=DEVICE_FRACTION):
        """Raise :class:`DeviceMemoryError` naming the bytes needed when the device buffers do
        not fit ``info`` (a :class:`clmf.device.DeviceInfo`): the total against ``fraction`` of
        its global memory, each buffer against its largest allocation."""
        total = self.device_total
        if total > fraction * info.global_mem:
            raise DeviceMemoryError(
                f"the fit needs {total} bytes ({_gib(total)}) of device memory, {info.name} has "
                f"{_gib(info.global_mem)} (largest buffers: {self._largest(self.device)}); "
                "reduce factors or use a device with more memory", needed=total,
                available=int(info.global_mem))
        for k, v in self.device.items():
            if v > info.max_alloc:
                raise DeviceMemoryError(
                    f"buffer {k} needs {int(v)} bytes ({v / 2**20:.0f} MiB), more than the "
                    f"device's largest allocation ({info.max_alloc / 2**20:.0f} MiB)",
                    needed=int(v), available=int(info.max_alloc))
        return self

    def check_host(self, available=None, fraction=HOST_FRACTION):
        """Raise :class:`HostMemoryError` naming the bytes needed when the host arrays exceed
        ``fraction`` of ``available`` bytes (default: :func:`available_host_memory`; no check
        when that is unknown)."""
        if available is None:
            available = available_host_memory()
        total = self.host_total
        if available is not None and total > fraction * available:
            raise HostMemoryError(
                f"the fit needs {total} bytes ({_gib(total)}) of host memory, {_gib(available)} "
                f"are available (largest arrays: {self._largest(self.host)}); reduce factors or "
                "the number of users/items", needed=total, available=int(available))
        return self


def available_host_memory():
    """Bytes of host memory available to a new allocation (Linux ``MemAvailable``, else the
    physical memory), or None when unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def choose_batch_rows(config, f, rows, info, budget=None, split=False):
    """Rows per launch: the config's ``batch_rows`` or what fits the scratch budget, ≥ 1.

    The budget caps each scratch buffer (``A``; with ``split`` also the pieces' scratch, a
    second buffer of as many rows), and both together stay within an eighth of the device's
    memory: a split side gets half the rows only where that eighth, not the budget, binds."""
    per_row = 4 * (f * f + f)
    share = info.global_mem // 8 // (2 if split else 1)
    cap = min(info.max_alloc, budget or SCRATCH_BUDGET, max(per_row, share))
    fit = max(1, cap // per_row)
    want = config.batch_rows or MAX_BATCH_ROWS
    return int(max(1, min(want, fit, rows)))


# launches a device's block of a side runs in at least, where its solved rows go to other devices
# as each launch ends (multi-device fits, Dask workers): the copies of one launch's rows overlap
# the next launches, only the last one's are left after the kernels
PUBLISH_LAUNCHES = 8


def launch_rows(config, batch_rows, rows, published=False):
    """Rows per launch of a resident side whose scratch holds ``batch_rows`` rows (``published``:
    its rows are sent to other devices launch by launch).

    The fused CG's dimensions form keeps nothing per row in global memory (no hermitians, no
    right-hand sides: S1 and S2 are not launched), so the scratch does not bound its launches:
    unless the configuration fixes ``batch_rows`` it launches up to :data:`MAX_BATCH_ROWS` rows
    at once. A launch ends with its longest rows' work-groups alone on the device; in launches
    of the scratch's size (2,040 rows at f = 256) that tail was most of the time — Netflix
    implicit f = 256 on an H100, Nsight Compute (``benchmarks/ncu_replay.py``): the SMs active
    53 % (items) and 58 % (users) of each launch's cycles. A published block keeps at least
    :data:`PUBLISH_LAUNCHES` launches (never fewer rows than the scratch's), so that its copies
    still overlap its kernels."""
    if config.dims and not config.batch_rows:
        most = MAX_BATCH_ROWS
        if published:
            most = min(most, -(-max(int(rows), 1) // PUBLISH_LAUNCHES))
        return int(max(batch_rows, min(most, max(int(rows), 1))))
    return int(batch_rows)


def split_threshold(config, nnz, rows, batch_rows, compute_units):
    """Most entries per piece of a long row of a side with ``nnz`` entries in ``rows`` rows
    launched ``batch_rows`` at a time: ``config.split``, or the automatic rule.

    Automatic rule: T = max(SPLIT_FLOOR, ⌈nnz_launch / (compute_units · SPLIT_WAVES)⌉) with
    nnz_launch = nnz / ⌈rows / batch_rows⌉ the entries of an average S1 launch. A launch is
    balanced when its entries are spread over its ``compute_units · SPLIT_WAVES`` work-group
    slots (SPLIT_WAVES = 8 per compute unit: an estimate, not yet calibrated on a GPU —
    ``benchmarks/longrows_bench.py`` measures it — of how many work-groups a compute unit runs at
    once, so that a lone work-group sums at about 1/slots of the launch's rate), so each slot
    sums about nnz_launch / slots entries; a row beyond that
    holds its compute unit's slot after the others drained, and the launch waits for it alone
    (Netflix items: 232,944 ratings in one row, 5,654 on average). Pieces of at most T entries
    bound that tail by one slot's balanced share. The floor keeps pieces long enough that the
    combine (one f × f read per piece) costs little beside their S1 (f² multiply-adds per entry):
    with a few compute units (CPU devices) and small data no row is long and nothing is split."""
    if config.split:
        return int(config.split)
    launches = max(1, -(-int(rows) // max(1, int(batch_rows))))
    per_launch = -(-int(nnz) // launches)
    return int(max(SPLIT_FLOOR, -(-per_launch // (max(1, int(compute_units)) * SPLIT_WAVES))))


def split_pays(longest, entries, rows, slots):
    """Whether splitting a launch of ``rows`` rows and ``entries`` entries whose longest row has
    ``longest`` entries pays on a device of ``slots`` work-group slots (0: always, a forced
    ``split``): the longest row, summed by one slot, outlasts the launch's balanced share by
    more than its rows' trip through the pieces' scratch costs (SPLIT_COMBINE_ENTRIES each):
    ``longest · slots > entries + SPLIT_COMBINE_ENTRIES · rows``."""
    cost = int(entries) + SPLIT_COMBINE_ENTRIES * int(rows)
    return slots <= 0 or int(longest) * int(slots) > cost


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """How one side's long rows are cut: ``threshold`` entries per piece at most (0: the side is
    not split), ``batch_rows`` real rows per launch, ``virtual_rows`` rows of the pieces' scratch
    (pieces of one launch), ``pieces_bound`` an upper bound on the side's pieces (virtual rows),
    ``slots`` the device's work-group slots that :func:`split_pays` weighs each launch with (0:
    a forced ``split``, every launch with a row over the threshold is split)."""
    threshold: int
    batch_rows: int
    virtual_rows: int = 0
    pieces_bound: int = 0
    slots: int = 0

    @property
    def active(self):
        return self.threshold > 0


def plan_split(config, f, rows, nnz, max_row, info):
    """The :class:`SplitPlan` of a side of ``rows`` rows, ``nnz`` entries and ``max_row``
    entries in its longest row, solved at ``f`` unknowns with ``config`` on the device ``info``.

    The side is split when its longest row has more entries than :func:`split_threshold` and,
    with the automatic threshold, when splitting pays for an average launch holding that row
    (:func:`split_pays`; the engine asks it again of every launch); never with the fused CG
    solver or ``fused_solve``, which build no hermitians. Then a
    launch's rows are cut into ⌈count / T⌉ pieces each (an empty or short row is one piece),
    the pieces' partial hermitians and right-hand sides go to a scratch of ``virtual_rows`` rows
    (as many as a launch's real rows, and at least the pieces of the longest row, so that a
    launch always holds a whole row), and a launch's real rows are cut short where its pieces
    would pass that (:func:`clmf.engine.core.split_rows`); the batch of real rows is what both
    scratches allow (:func:`choose_batch_rows` with ``split``)."""
    plain = choose_batch_rows(config, f, rows, info)
    if (config.solver == "fusedcg" or config.fused_solve or config.split == SPLIT_NEVER
            or rows <= 0):
        return SplitPlan(0, plain)
    t = split_threshold(config, nnz, rows, plain, info.compute_units)
    slots = 0 if config.split else max(1, int(info.compute_units)) * SPLIT_WAVES
    launches = -(-int(rows) // plain)
    if int(max_row) <= t or not split_pays(max_row, -(-int(nnz) // launches),
                                           min(plain, int(rows)), slots):
        return SplitPlan(0, plain)
    bs = choose_batch_rows(config, f, rows, info, split=True)
    most = -(-int(max_row) // t)
    return SplitPlan(t, bs, int(max(bs, most)), int(rows) + int(nnz) // t + 1, slots)



# the implicit Gram G = YᵀY (cl_kernels/gram.cl.j2): a tiled product of the fixed factor with
# itself, the rows cut into at most GRAM_CHUNKS chunks whose partial tiles are summed after.
# 256 chunks of the lower triangle's tiles fill an H100 (132 SMs) at every f; a chunk is never
# shorter than GRAM_MIN_ROWS rows (small sides: fewer chunks, less to sum)
GRAM_CHUNKS = 256
GRAM_MIN_ROWS = 256
# CPUs' Gram instead: the side's S1 variant over at most this many virtual rows of the fixed side
GRAM_VIRTUAL_ROWS = 64


def gram_tiled(device_type):
    """Whether the implicit Gram runs on its own tiled kernels (``gram.cl.j2``) on a device of
    ``device_type`` ("GPU", "CPU", ...), else through the side's S1 variant over
    :func:`gram_virtual_rows` virtual rows of the fixed side. GPUs: tiled (H100, f = 256: the
    fused CG's S1 filler took 0.179 s of its 0.40 s items half-step, the tiled kernels a few
    ms); CPUs: the S1 variant, tuned for them (PoCL, Last.fm implicit f = 128: 0.040 s/it
    against 0.074 with the tiled kernels at 15 GFLOP/s)."""
    return device_type != "CPU"


def gram_virtual_rows(batch_rows, rows):
    """The S1 path's virtual rows: partial Grams over ``rows`` rows, at most the batch scratch's
    ``batch_rows`` and :data:`GRAM_VIRTUAL_ROWS`, at least 1."""
    return int(max(1, min(GRAM_VIRTUAL_ROWS, batch_rows, rows)))


@dataclasses.dataclass(frozen=True)
class GramGeometry:
    """The Gram kernels' geometry: ``lg`` × ``lg`` work-items each summing ``r`` × ``r``
    entries of a ``tile`` × ``tile`` tile (``tile = lg·r``), ``pairs`` tiles of the lower
    triangle, ``chunks`` chunks of ``rows_per_chunk`` rows, one work-group per (chunk, tile)."""

    lg: int
    r: int
    tile: int
    pairs: int
    chunks: int
    rows_per_chunk: int

    @property
    def partial_bytes(self):
        """Bytes of the chunks' partial tiles."""
        return 4 * self.chunks * self.pairs * self.tile * self.tile


def gram_geometry(fs, rows, max_work_group=256):
    """The :class:`GramGeometry` of a Gram over ``rows`` rows of ``fs`` unknowns on a device
    whose work-groups hold at most ``max_work_group`` work-items (16 × 16 where allowed)."""
    lg = 16 if max_work_group >= 256 else 8 if max_work_group >= 64 else 4
    r = max(1, min(4, -(-int(fs) // lg)))
    tile = lg * r
    nt = -(-int(fs) // tile)
    rows = max(1, int(rows))
    chunks = max(1, min(GRAM_CHUNKS, rows // GRAM_MIN_ROWS))
    per = -(-rows // chunks)
    return GramGeometry(lg, r, tile, nt * (nt + 1) // 2, -(-rows // per), per)


def side_buffers(side, fs, batch, rows, gram_rows=None, split=None):
    """Bytes of a solved side's device buffers beside its ratings and factors (the one count
    both plans use): the batch scratch ``A``/``B``, ``G``, with ``gram_rows`` (implicit: rows
    of the fixed factor) the Gram's partial tiles (16 × 16 work-groups: the largest) or virtual
    rows' CSR (:func:`clmf.engine.launch.gram_buffers`), whichever is larger, with an
    active ``split`` the pieces' partial ``A``/``B``, their row pointers and the ``rows`` + 1
    rows' first pieces."""
    out = {f"scratch_{side}": 4 * fs * fs * batch + 4 * fs * batch,          # A and B
           f"gram_{side}": 4 * fs * fs}                                      # G
    if gram_rows is not None:       # the tiled kernels' partial tiles or the S1 path's CSR
        out[f"implicit_{side}"] = max(gram_geometry(fs, gram_rows).partial_bytes,
                                      8 * (gram_virtual_rows(batch, gram_rows) + 1)
                                      + 8 * int(gram_rows))
    if split is not None and split.active:
        out[f"split_{side}"] = (4 * (fs * fs + fs) * split.virtual_rows
                                + 8 * (split.pieces_bound + 1) + 8 * (int(rows) + 1))
    return out

def plan_fit(m, n, nnz, f, configs, info, *, implicit=False, biased=False, batch_rows=None,
             validation_nnz=0, train_metrics=True, early_stopping=False, splits=None):
    """The :class:`MemoryPlan` of an ALS fit of an ``m × n`` matrix with ``nnz`` ratings.

    Parameters
    ----------
    m, n, nnz : rows (users), columns (items) and stored ratings
    f : factors (the model's f; the kernels solve f + 1 unknowns with ``biased``)
    configs : (users_config, items_config) :class:`clmf.config.KernelConfig` pair
    info : :class:`clmf.device.DeviceInfo` (its limits size the batches)
    implicit, biased : the fit's mode
    batch_rows : {"users": b, "items": b} or None (chosen as the engine does)
    splits : {"users": SplitPlan, "items": SplitPlan} or None (no long rows split); the pieces'
        scratch and row pointers are counted, and the batches default to the plans'
    validation_nnz : held-out ratings scored on the device each iteration
    train_metrics : whether the training RMSE is computed on the device (its triples uploaded)
    early_stopping : whether the best iteration's factors are kept on the host
    """
    m, n, nnz, f = int(m), int(n), int(nnz), int(f)
    fs = unknowns(f, biased)                      # unknowns per system
    width = row_width(f, biased)                  # [factors | 1 | bias] with biases
    rows = {"users": m, "items": n}
    splits = splits or {}
    if batch_rows is None:
        batch_rows = {s: splits[s].batch_rows if s in splits else
                      choose_batch_rows(c, fs, rows[s], info)
                      for s, c in zip(("users", "items"), configs)}
    dev = {}
    csr = 0
    # a runtime that reads host arrays in place only from aligned starts gets the indices and
    # values wrapped from the boundary below them: up to ``align`` bytes more each
    from .upload import host_align
    skew = host_align(info) if info is not None else 0
    for side, cfg in zip(("users", "items"), configs):
        r, other = rows[side], rows["items" if side == "users" else "users"]
        csr += 8 * (r + 1) + 4 * max(nnz, 1) + 4 * max(nnz, 1) + 2 * skew
        item = 2 if cfg.storage == "float16" else 4
        dev[f"factors_{side}"] = max(1, r) * cfg.ldf(width) * item
        dev.update(side_buffers(side, fs, batch_rows[side], r, other if implicit else None,
                                splits.get(side)))
    dev["csr"] = csr
    metrics = 0
    if train_metrics and not implicit:
        metrics += 12 * nnz + 4 * max(1, -(-nnz // 128))
    if validation_nnz:
        metrics += 12 * int(validation_nnz) + 4 * max(1, -(-int(validation_nnz) // 128))
    if metrics:
        dev["metrics"] = metrics
    dev["status"] = 16
    # host arrays at the fit's peak (beyond the caller's input and its canonical CSR)
    f4 = 4 * f
    host = {
        # X0, Y0 (float32), drawn into rows of the devices' padded layout (host_factor_rows)
        "start_factors": (max(1, m) + max(1, n)) * 4 * configs[0].ldf(width),
        "side_csr": 2 * (8 * (m + n + 2) + 8 * nnz),                   # both sides' CSR copies
        "transpose": 8 * (n + 1) + 8 * nnz,                            # the items' CSR
        "coo": 12 * nnz if train_metrics else 0,                       # training triples
        "factor_transfer": max(m, n) * max(f, width) * 4 * 2,          # padded copy + result
        "result_factors": (m + n) * f4,
    }
    if early_stopping:
        host["best_factors"] = (m + n) * (f4 + 4)
    for side, sp_ in splits.items():
        if sp_.active:      # the pieces' row pointers, built once on the host
            host[f"split_{side}"] = 3 * 8 * (sp_.pieces_bound + 1) + 8 * (rows[side] + 1)
    return MemoryPlan(dev, {k: int(v) for k, v in host.items() if v})


# ----- one device's plan: what is resident, what is streamed ---------------------------------
# A side whose rating block does not fit is streamed in chunks of rows, double-buffered (two
# chunk buffers: the upload of chunk k+1 overlaps the kernels of chunk k); the factor buffers
# stay resident. Only when even one chunk (the longest row) cannot fit next to the factors and
# the scratch does :func:`plan_device` raise :class:`DeviceMemoryError`. A one-device fit and
# every device of a multi-device one are planned here.
MAX_CHUNK_ROWS = 1 << 20        # rows per streamed chunk (its indptr buffer)
_ENTRY = 8                      # bytes per rating on the device: int32 index + float32 value


def chunk_rows(indptr, r0, r1, max_nnz, max_rows):
    """Cut rows ``[r0, r1)`` of a CSR ``indptr`` (int64) into chunks of at most ``max_nnz``
    entries and ``max_rows`` rows (a single row longer than ``max_nnz`` is a chunk of its own);
    returns a list of ``(row_start, row_end)``."""
    import numpy as np
    indptr = np.asarray(indptr)
    out = []
    r = int(r0)
    max_nnz = max(1, int(max_nnz))
    max_rows = max(1, int(max_rows))
    while r < r1:
        limit = int(indptr[r]) + max_nnz
        e = int(np.searchsorted(indptr[r:r1 + 1], limit, side="right")) - 1 + r
        e = min(max(e, r + 1), r1, r + max_rows)
        out.append((r, e))
        r = e
    return out


def device_budget(global_mem, max_alloc, max_device_memory=None):
    """``(budget, max_alloc)`` in bytes: :data:`DEVICE_FRACTION` of global memory, or the user's
    cap (read by :func:`clmf.data.validation.check_memory_cap`: an int is bytes, a float in
    (0, 1] a fraction of global memory)."""
    from ..data.validation import check_memory_cap
    budget = int(DEVICE_FRACTION * global_mem)
    if max_device_memory is not None:
        budget = min(budget, check_memory_cap(max_device_memory, global_mem))
    return budget, int(min(max_alloc, budget))


def scratch_rows(f, rows, batch_rows, cap):
    """Rows per launch given the config's ``batch_rows`` and a byte cap on the scratch."""
    per_row = 4 * (f * f + f)
    fit = max(1, int(cap) // per_row)
    want = batch_rows or MAX_BATCH_ROWS
    return int(max(1, min(want, fit, max(rows, 1))))


@dataclasses.dataclass
class SideMemory:
    """One solved side on one device: rows ``[r0, r1)``, chunks of rows, resident or streamed;
    ``split`` the long rows' pieces of a resident side (None: not split)."""
    side: str
    r0: int
    r1: int
    nnz: int
    batch_rows: int
    resident: bool
    chunks: list                  # [(row_start, row_end)] global rows
    chunk_nnz: int                # capacity of a chunk buffer (entries)
    chunk_rows: int               # capacity of a chunk's indptr (rows)
    split: SplitPlan | None = None

    @property
    def buffers(self):
        """Chunk buffer sets on the device: 1 resident, 2 streamed (double-buffered)."""
        return 1 if self.resident else 2

    def data_bytes(self):
        """Bytes of the rating buffers on the device."""
        return self.buffers * (self.chunk_nnz * _ENTRY + (self.chunk_rows + 1) * 8)


@dataclasses.dataclass
class DevicePlan:
    """The memory plan of one device (bytes per buffer in ``bytes``)."""
    device: str
    budget: int
    max_alloc: int
    sides: dict                   # side -> SideMemory
    bytes: dict

    @property
    def total(self):
        """Bytes allocated on the device."""
        return int(sum(self.bytes.values()))

    @property
    def streamed(self):
        """Sides streamed from host memory."""
        return [s for s, m in self.sides.items() if not m.resident]

    def describe(self):
        """A one-line summary."""
        parts = [f"{self.device}: {self.total / 2**20:.0f} of {self.budget / 2**20:.0f} MiB"]
        for s, m in self.sides.items():
            how = "resident" if m.resident else f"streamed in {len(m.chunks)} chunks"
            parts.append(f"{s} rows {m.r0}..{m.r1} ({m.nnz} ratings) {how}")
        return "; ".join(parts)


def _mib(x):
    """Bytes for a message: exact below 1 MiB, else MiB/GiB."""
    x = int(x)
    if x < 1 << 20:
        return f"{x:,} bytes"
    if x < 1 << 30:
        return f"{x / 2**20:,.1f} MiB"
    return f"{x / 2**30:,.2f} GiB"


def plan_device(name, global_mem, max_alloc, *, f, ldf, itemsize, blocks, factor_rows,
                batch_rows=None, implicit=False, other_rows=None, splits=None, skew=0,
                reduced=(), packed=None, staged=None, max_device_memory=None, force_stream=()):
    """Plan one device's memory.

    Parameters
    ----------
    name : the device's name (messages).
    global_mem, max_alloc : the device's global memory and largest single allocation (bytes).
    f : unknowns per system (factors, + 1 with biases); ldf, itemsize : factor row layout.
    blocks : side -> ``(indptr, r0, r1)``: the solved rows of each side on this device and the
        int64 indptr they index (global offsets; only ``indptr[r0..r1]`` is read).
    factor_rows : side -> rows of that side's factor held on the device (whole or a block).
    batch_rows : side -> the rows per launch (None: fit the scratch cap).
    implicit : the Gram matrix buffers of implicit feedback.
    other_rows : side -> rows of the fixed factor read by the Gram (implicit), default the
        factor rows of the other side.
    splits : side -> :class:`SplitPlan` of a side whose long rows are cut (counted, and used,
        while the side is resident; its ``batch_rows`` are the side's).
    skew : bytes a resident side's indices and values may each be wrapped from below their
        start (:func:`clmf.engine.upload.host_align`).
    reduced : sides whose partial normal equations are summed over the devices: a second
        scratch pair (``scratch2_``), so that a batch's copies overlap the next one's kernels.
    packed : reduced side -> the rows this device solves of it, for sides reduced through packed
        systems in a pipeline (:func:`clmf.engine.reduce.pipelined`): instead of the second
        pair, two batch buffers of packed systems (``packed_``) and a ring of the summed
        systems of its own rows (``sums_``: all of them, up to the scratch's size); batches of
        at most :data:`PACKED_BATCH_BYTES` of packed systems.
    staged : packed side -> the number of its peers (the other devices), for sides whose sums
        are made on this device (:func:`clmf.engine.reduce.pipelined` with device sums: the
        peers' copies of its rows uploaded as they land, summed by its unpack): a ring of each
        peer's copies as large as its own (``staging_``: peers × ``sums_``).
    max_device_memory : the user's cap (bytes, or fraction ≤ 1 of global memory).
    force_stream : sides to stream even when they fit (tests).

    Raises
    ------
    DeviceMemoryError when the factors, the scratch and one chunk of the longest row cannot fit.
    """
    budget, alloc = device_budget(global_mem, max_alloc, max_device_memory)
    full, _ = device_budget(global_mem, max_alloc)
    # the scratch the uncapped device would use (a cap streams ratings first); smaller scratch
    # (more launches, no long rows cut) only when even streaming does not fit
    per_row = 4 * (f * f + f)
    caps = [min(SCRATCH_BUDGET, max(per_row, full // 8), alloc)]
    caps += [c for c in (budget // 8, budget // 32, per_row) if c < caps[-1]]
    splits = {s: p for s, p in (splits or {}).items() if p is not None and p.active}
    for k, scratch_cap in enumerate(caps):
        try:
            return _plan(name, budget, alloc, scratch_cap, f=f, ldf=ldf, itemsize=itemsize,
                         blocks=blocks, factor_rows=factor_rows, batch_rows=batch_rows,
                         implicit=implicit, other_rows=other_rows, force_stream=force_stream,
                         splits=splits if k == 0 else {}, skew=skew, reduced=reduced,
                         packed=packed or {}, staged=staged or {})
        except DeviceMemoryError:
            if k == len(caps) - 1:
                raise


def _plan(name, budget, alloc, scratch_cap, *, f, ldf, itemsize, blocks, factor_rows,
          batch_rows, implicit, other_rows, force_stream, splits, skew, reduced=(), packed=None,
          staged=None):
    """:func:`plan_device` at one scratch size."""
    import numpy as np
    batch_rows = batch_rows or {}
    fixed = {}
    for s, rows in factor_rows.items():
        fixed[f"factors_{s}"] = max(1, int(rows)) * ldf * itemsize
        if fixed[f"factors_{s}"] > alloc:
            raise DeviceMemoryError(
                f"the {s} factors need {_mib(fixed[f'factors_{s}'])} in one buffer, more than "
                f"{name}'s largest allocation ({_mib(alloc)}); use more devices (the reduce mode "
                "keeps only a block of a huge factor per device), fewer factors or a larger "
                "max_device_memory")
    rows_per = {}
    for s, (indptr, r0, r1) in blocks.items():
        sp_ = splits.get(s)
        br = scratch_rows(f, r1 - r0, sp_.batch_rows if sp_ else batch_rows.get(s), scratch_cap)
        if s in (packed or {}):      # a finer pipeline: the last batch's copy is exposed
            br = min(br, max(1, PACKED_BATCH_BYTES // (4 * packed_width(f))))
        rows_per[s] = br
        o = (other_rows or {}).get(s)
        if o is None:
            o = factor_rows["items" if s == "users" else "users"]
        fixed.update(side_buffers(s, f, br, r1 - r0, o if implicit else None))
        if s in (packed or {}):
            w = 4 * packed_width(f)
            fixed[f"packed_{s}"] = 2 * w * br
            fixed[f"sums_{s}"] = w * max(1, min(int(packed[s]), max(br, scratch_cap // w)))
            if (staged or {}).get(s):
                fixed[f"staging_{s}"] = int(staged[s]) * fixed[f"sums_{s}"]
                if fixed[f"staging_{s}"] > alloc:     # a smaller scratch cap: a smaller ring
                    raise DeviceMemoryError(
                        f"{name}: the {s}' peers' ring needs {_mib(fixed[f'staging_{s}'])} in "
                        f"one buffer, more than the largest allocation ({_mib(alloc)})",
                        needed=fixed[f"staging_{s}"], available=int(alloc))
        elif s in reduced:
            fixed[f"scratch2_{s}"] = fixed[f"scratch_{s}"]
    fixed["status"] = 16
    sides = {}
    lengths = {}
    for s, (indptr, r0, r1) in blocks.items():
        ip = np.asarray(indptr[r0:r1 + 1], dtype=np.int64)
        nnz = int(ip[-1] - ip[0]) if ip.size else 0
        longest = int(np.max(np.diff(ip))) if ip.size > 1 else 0
        lengths[s] = (ip, nnz, longest)
        sides[s] = SideMemory(s, int(r0), int(r1), nnz, rows_per[s], True, [(int(r0), int(r1))],
                              max(1, nnz), max(1, r1 - r0), splits.get(s))

    # stream the largest sides until the rest fits; each streamed side needs at least two
    # chunk buffers of its longest row (and cuts no long rows)
    def resident_bytes(s):
        r0, r1 = sides[s].r0, sides[s].r1
        extra = side_buffers(s, f, rows_per[s], r1 - r0, None, splits.get(s)).get(
            f"split_{s}", 0)
        return lengths[s][1] * _ENTRY + (r1 - r0 + 1) * 8 + 2 * int(skew) + extra

    def min_stream(s):
        return 2 * (max(lengths[s][2], 1) * _ENTRY + 2 * 8)

    streamed = [s for s in blocks if s in force_stream]
    streamed += [s for s in blocks if s not in streamed
                 and max(lengths[s][1] * 4, (sides[s].r1 - sides[s].r0 + 1) * 8) > alloc]
    order = sorted(blocks, key=lambda s: -lengths[s][1])
    while True:
        need = sum(fixed.values()) + sum(min_stream(s) if s in streamed else resident_bytes(s)
                                         for s in blocks)
        if need <= budget:
            break
        rest = [s for s in order if s not in streamed]
        if not rest:
            longest = {s: lengths[s][2] for s in blocks}
            raise DeviceMemoryError(
                f"{name}: the fit needs at least {_mib(need)} of device memory, the budget is "
                f"{_mib(budget)}: factors and scratch {_mib(sum(fixed.values()))}, two chunks "
                f"of the longest rows ({longest} ratings) streamed; raise max_device_memory "
                "(or use a device with more memory), fewer factors or more devices",
                needed=int(need), available=int(budget))
        streamed.append(rest[0])
    room = budget - sum(fixed.values()) - sum(resident_bytes(s) for s in blocks
                                              if s not in streamed)
    weight = sum(max(lengths[s][1], 1) for s in streamed)
    spare = room - sum(min_stream(s) for s in streamed)
    for s in streamed:
        ip, nnz, longest = lengths[s]
        r0, r1 = sides[s].r0, sides[s].r1
        share = min_stream(s) + spare * max(nnz, 1) // max(weight, 1)
        # two buffer sets, each of entries (8 bytes) and row pointers (8 bytes per row)
        cap_nnz = min(max(share // 2 // (_ENTRY + 8), longest, 1), alloc // 4)
        if s in force_stream:
            cap_nnz = min(cap_nnz, max(longest, 1, -(-nnz // 3)))   # tests: several chunks
        cap_rows = min(MAX_CHUNK_ROWS, alloc // 8 - 1, max(1, r1 - r0), max(1, cap_nnz))
        chunks = chunk_rows(ip - ip[0], 0, r1 - r0, cap_nnz, cap_rows)
        chunks = [(a + r0, b + r0) for a, b in chunks]
        c_nnz = max(int(ip[b - r0] - ip[a - r0]) for a, b in chunks) if chunks else 1
        c_rows = max(b - a for a, b in chunks) if chunks else 1
        sides[s] = SideMemory(s, r0, r1, nnz, rows_per[s], False, chunks, max(1, c_nnz),
                              max(1, c_rows))
    data = {f"ratings_{s}": m.data_bytes() + (0 if not m.resident else 2 * int(skew))
            for s, m in sides.items()}
    for s, m in sides.items():
        if m.split is not None:         # the pieces' scratch and row pointers
            data[f"split_{s}"] = side_buffers(s, f, m.batch_rows, m.r1 - m.r0, None,
                                              m.split)[f"split_{s}"]
    plan = DevicePlan(name, budget, alloc, sides, {**fixed, **data})
    if plan.total > budget:
        raise DeviceMemoryError(
            f"{name}: the plan needs {_mib(plan.total)} of device memory, the budget is "
            f"{_mib(budget)} "
            f"({plan.bytes}); raise max_device_memory, use fewer factors or more devices",
            needed=plan.total, available=int(budget))
    return plan
