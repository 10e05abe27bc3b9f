"""The client side of a partitioned fit on a Dask cluster (issue 15): ratings prepared on the
workers (raw ids mapped to dense indices there), and :class:`DaskEngine`, which places one
:class:`~clmf.engine.Engine` per Dask worker (the blocks the partition plan gives
it stay resident for the whole fit) and drives the half-steps with Dask tasks pinned to their
workers. Only factor blocks (replicate mode) or partial normal equations (reduce mode) move, as
Dask results between workers. Where the workers share a host and both factors are replicated
(or there is one worker), each worker instead runs whole iterations in one task
(:attr:`DaskEngine.loop`, :func:`~clmf.parallel.dask_tasks.iterate`), exchanging its rows
through shared-memory boards while it computes (:class:`~clmf.parallel.dask_board.Board`):
no scheduler round trip per half-step. Dask is imported lazily: importing :mod:`clmf` never
needs it.

A worker that leaves the cluster during a fit takes its blocks and device state with it: the
engine notices (it watches the scheduler's worker list while it waits) and raises
:class:`WorkerLostError`, whose message says how to resume from the last checkpoint.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import time
import uuid

import numpy as np

from ..engine.core import padded_factors, unpadded_factors
from . import dask_tasks as T
from .dask_board import ENV_LOOP
from .partition import make_plan
from .worker import SIDES, other_side

log = logging.getLogger(__name__)


__all__ = ["WorkerLostError", "DaskEngine", "DistRatings", "EarlySetUp", "prepare",
           "fit_workers", "get_client", "wait_alive", "device_facts", "new_fit_id",
           "shared_set_up"]


class WorkerLostError(RuntimeError):
    """A Dask worker holding blocks of a running fit left the cluster (its ratings and device
    state are gone); the message names the checkpoint to resume from."""


def get_client(client=None):
    """``client``, or the default :class:`distributed.Client` (a clear error when none)."""
    if client is not None:
        return client
    try:
        from distributed import get_client as _get
    except ImportError as e:      # pragma: no cover - the extra is missing
        raise ImportError("clmf.dask needs dask.distributed: pip install 'clmf[dask]'") from e
    try:
        return _get()
    except ValueError:
        raise ValueError("no Dask client: pass client=distributed.Client(...) or create one "
                         "first (see docs/guide/dask.md)") from None


def fit_workers(client, workers=None):
    """``(addresses, ranks)``: the workers of a fit in a fixed order and each one's position
    among the fit's workers on its host (it picks that device of its type)."""
    alive = sorted(client.nthreads())
    addrs = sorted(workers) if workers is not None else alive
    gone = sorted(set(addrs) - set(alive))
    if gone:
        raise ValueError(f"workers {gone} are not in the cluster")
    if not addrs:
        raise ValueError("the Dask cluster has no workers")
    hosts = {}
    ranks = []
    for a in addrs:
        host = a.rsplit(":", 1)[0]
        ranks.append(hosts.get(host, 0))
        hosts[host] = ranks[-1] + 1
    return addrs, ranks


def device_facts(client, addrs, ranks, specs):
    """Futures of every worker's ``(label, DeviceInfo)``
    (:func:`~clmf.parallel.dask_tasks.facts`), first in its queue: a fit submits them before
    preparing the ratings, so a fresh worker opens its device meanwhile."""
    return [client.submit(T.facts, specs[d], ranks[d], workers=[a], allow_other_workers=False,
                          pure=False, priority=10) for d, a in enumerate(addrs)]


def wait_alive(client, addrs, futs, what, phase, poll=1.0):
    """Results of ``futs``; one of the workers ``addrs`` leaving the cluster meanwhile raises
    :class:`WorkerLostError` (tasks pinned to a lost worker would wait for it forever)."""
    from distributed import wait

    def check():
        alive = set(client.nthreads())
        gone = [a for a in addrs if a not in alive]
        if gone:
            raise WorkerLostError(f"Dask worker(s) {gone} holding blocks of {what} left the "
                                  f"cluster during {phase}")

    while True:
        try:
            wait(futs, timeout=poll)
            break
        except Exception:        # noqa: BLE001 - a timeout; its type differs between versions
            pass
        check()
        if all(fu.done() for fu in futs):
            break
    try:
        return [fu.result() for fu in futs]
    except Exception:
        check()                  # a lost worker's tasks fail too: say so first
        raise


def new_fit_id():
    """A fresh fit id (the prefix of the fit's task keys and shared-memory segments)."""
    return f"clmf-{uuid.uuid4().hex[:12]}"


def shared_set_up(client, addrs, fit_id):
    """A future telling whether the set-up's pieces of fit ``fit_id`` may go through shared
    memory (every worker of ``addrs`` maps every other's probe:
    :func:`~clmf.parallel.dask_tasks.setup_probe`); False with one worker (its pieces never
    leave it). No round trip to the client: the splits wait for it."""
    if len(addrs) < 2:
        return False
    prefix = T.setup_prefix(fit_id)

    def on(a, fn, *args):
        """``fn(*args)`` on worker ``a`` alone, first in its queue."""
        return client.submit(fn, *args, workers=[a], allow_other_workers=False, pure=False,
                             priority=7, key=f"{fn.__name__}-{fit_id}-{uuid.uuid4().hex}")
    probes = [on(a, T.setup_probe, prefix) for a in addrs]
    checks = [on(a, T.setup_check, *probes) for a in addrs]
    return client.submit(T.all_of, *checks, pure=False, priority=7)


@dataclasses.dataclass
class EarlySetUp:
    """What a fit starts on its workers before its ratings are prepared: its id and the
    set-up's shared-memory check (:func:`shared_set_up`, done by the time the splits start
    instead of delaying them). :meth:`abandon` cleans up after a fit that failed before its
    :class:`DaskEngine` took them over."""
    fit_id: str
    shared: object
    taken: bool = False      # a DaskEngine took them over (its release cleans up)

    @classmethod
    def start(cls, client, addrs):
        """Submit a new fit's shared-memory check to the workers ``addrs``."""
        fit_id = new_fit_id()
        return cls(fit_id, shared_set_up(client, addrs, fit_id))

    def abandon(self, client, addrs):
        """Unlink the check's probe segments on the workers (after the check ran: the tasks
        wait for it), best effort."""
        if not hasattr(self.shared, "key"):
            return
        try:
            futs = [client.submit(T.release, self.fit_id, self.shared, workers=[a],
                                  allow_other_workers=False, pure=False) for a in addrs]
            wait_alive(client, addrs, futs, f"fit {self.fit_id}", "cleaning up")
        except Exception as e:        # noqa: BLE001 - the fit's own error matters more
            log.warning("cleaning up fit %s: %s", self.fit_id, e)


@dataclasses.dataclass
class DistRatings:
    """Ratings resident on the cluster as futures of encoded partitions."""
    parts: list              # futures of (users int32, items int32, ratings float32), or of
                             # raw frames where ``encoding`` is set
    shape: tuple
    user_ids: object         # raw id of every user index (None: the indices are the ids)
    item_ids: object
    user_counts: np.ndarray = None
    item_counts: np.ndarray = None
    total: float = 0.0       # sum of the ratings
    minimum: float = np.inf
    maximum: float = -np.inf
    nnz: int = 0
    times: dict = dataclasses.field(default_factory=dict)   # seconds of the stages
    where: list = None       # per part, the workers holding its raw partition (or None)
    encoding: dict = None    # parts are raw frames, encoded by the split with these arguments

    def release(self):
        """Drop the futures (the cluster frees the partitions)."""
        self.parts = []


def _partitions(client, X, columns, n_parts, workers=None):
    """Futures of pandas partitions of ``X`` and ``(shape, user_ids, item_ids)`` when ``X``
    carries dense indices (scipy.sparse, Ratings) — else ``None`` (raw ids). Parquet files of
    numeric columns (a path, or ``dd.read_parquet`` of one left as read: :func:`_parquet_files`)
    are read by the workers as pyarrow Tables, a file a task, the ``k``-th file on
    ``workers[k % len(workers)]`` where given (a loose restriction: the splits then run
    evenly where the files lie)."""
    import pandas as pd
    import scipy.sparse as sp

    from ..data.frames import check_columns, is_dask_frame, is_frame
    from ..data.validation import check_ratings
    ucol, icol, rcol = columns
    if (sp.issparse(X) or hasattr(X, "user_ids") or isinstance(X, (tuple, np.ndarray))
            or (hasattr(X, "__array__") and not hasattr(X, "columns"))):
        # ratings already on the client: checked and made canonical as clmf.ALS does
        C = check_ratings(X).tocoo()
        u, i, r, shape = C.row, C.col, C.data, C.shape
        uids = np.asarray(X.user_ids) if hasattr(X, "user_ids") else None
        iids = np.asarray(X.item_ids) if hasattr(X, "item_ids") else None
        cuts = np.linspace(0, len(r), max(1, n_parts) + 1).astype(np.int64)
        frames = [pd.DataFrame({ucol: np.asarray(u[a:b], np.int32),
                                icol: np.asarray(i[a:b], np.int32),
                                rcol: np.asarray(r[a:b], np.float32)})
                  for a, b in zip(cuts[:-1], cuts[1:])]
        return client.scatter(frames, hash=False), (tuple(int(s) for s in shape), uids, iids)
    files = _parquet_files(X, columns, n_parts)
    if files is not None:      # read by the workers themselves, a file each (no dask.dataframe)
        names, opts = files
        return [client.submit(T.read_parquet_file, f, columns, opts, pure=False,
                              key=f"read_parquet_file-{uuid.uuid4().hex}",
                              **({"workers": [workers[k % len(workers)]],
                                  "allow_other_workers": True} if workers else {}))
                for k, f in enumerate(names)], None
    if isinstance(X, str):
        import dask.dataframe as dd
        X = dd.read_parquet(X, columns=list(columns))
    if is_frame(X) and not isinstance(X, pd.DataFrame):
        X = X.to_pandas()                          # a pyarrow Table or RecordBatch
    if isinstance(X, pd.DataFrame) or is_dask_frame(X):
        check_columns(X, columns)
    if isinstance(X, pd.DataFrame):
        cuts = np.linspace(0, len(X), max(1, n_parts) + 1).astype(np.int64)
        return client.scatter([X.iloc[a:b] for a, b in zip(cuts[:-1], cuts[1:])],
                              hash=False), None
    if hasattr(X, "to_delayed") and hasattr(X, "npartitions"):
        return client.compute(X[list(columns)].to_delayed()), None
    raise TypeError("ratings must be a dask or pandas DataFrame of (user, item, rating), a "
                    f"parquet path, a scipy.sparse matrix, a (user_idx, item_idx, ratings) tuple "
                    f"or clmf.data.Ratings, not {type(X).__name__}")


PARQUET_EXTENSIONS = (".parq", ".parquet", ".pq")     # the files of a folder read (as dask)


def _parquet_files(X, columns, n_parts):
    """``(file URLs, storage options)`` of parquet data that the workers can read themselves
    (:func:`~clmf.parallel.dask_prepare.read_parquet_file`): a path, or a dask DataFrame that is
    ``dd.read_parquet(path)`` as read (no filters, index or other options that change the
    rows), of at least ``n_parts`` files whose ``columns`` are all integers or floats; else
    None (the data go through dask.dataframe)."""
    if isinstance(X, str):
        path, opts = X, None
    else:
        expr = getattr(X, "expr", None)
        if type(expr).__name__ not in ("ReadParquetFSSpec", "ReadParquetPyarrowFS"):
            return None
        try:
            op = {k: expr.operand(k) for k in ("path", "filters", "index", "categories",
                                                "_partitions", "_series", "kwargs", "engine",
                                                "storage_options", "filesystem",
                                                "parquet_file_extension")}
        except Exception:          # noqa: BLE001 - another dask version: its own reader
            return None
        if (not isinstance(op["path"], str) or op["filters"] or op["index"] is not None
                or op["categories"] or op["_partitions"] is not None or op["_series"]
                or any(v is not None for v in (op["kwargs"] or {}).values())
                or op["engine"] not in (None, "pyarrow")
                or op["filesystem"] not in (None, "fsspec", "arrow")
                or tuple(op["parquet_file_extension"] or ()) != PARQUET_EXTENSIONS):
            return None
        path, opts = op["path"], op["storage_options"]
    try:
        import fsspec
        import pyarrow as pa
        import pyarrow.parquet as pq
        fs, root = fsspec.core.url_to_fs(path, **(opts or {}))
        if any(ch in root for ch in "*?["):       # a glob: as dask expands it
            return None
        if fs.isdir(root):
            names = sorted((f for f in fs.find(root)
                            if f.endswith(PARQUET_EXTENSIONS)
                            and not any(p.startswith(("_", ".")) for p in
                                        f[len(root.rstrip("/")) + 1:].split("/"))),
                           key=lambda f: [int(t) if t.isdigit() else t      # part.2 < part.10
                                          for t in re.split(r"(\d+)", f)])
        else:
            names = [root]
        if len(names) < max(1, n_parts):
            return None
        with fs.open(names[0], "rb") as fh:
            schema = pq.read_schema(fh)
        if not all(c in schema.names and (pa.types.is_integer(schema.field(c).type)
                                          or pa.types.is_floating(schema.field(c).type))
                   for c in columns):
            return None
    except (ImportError, OSError, ValueError, TypeError):
        return None
    local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
    return ([f if local else fs.unstrip_protocol(f) for f in names], opts)


def _sorted_index(ids, what="ids", counts=None):
    """A pandas Index of the distinct raw ids, sorted (and ``counts``, one per id, in the same
    order: ``(index, counts)``); missing ids (None, NaN) and text mixed with numbers are
    refused as :meth:`clmf.data.Ratings.from_triples` refuses them
    (:func:`clmf.data._ids.check_raw_ids`: one rule for both paths)."""
    import pandas as pd

    from ..data._ids import check_raw_ids
    ids = np.asarray(ids)
    check_raw_ids(ids, what)
    try:
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
    except TypeError:          # other unorderable objects: first-seen order
        order = None
    if counts is None:
        return pd.Index(ids)
    return pd.Index(ids), (np.asarray(counts) if order is None else np.asarray(counts)[order])


def _pair(ids_counts, col):
    """:func:`_sorted_index`'s arguments for a column's ``(ids, counts)``."""
    return ids_counts[0], f"column {col!r}", ids_counts[1]


def _encoder(index):
    """The index that maps a column's raw ids to dense indices on the workers: a sorted run of
    consecutive integers (ids that are dense indices already, or an offset of them) as a
    :class:`~clmf.parallel.dask_prepare.IdRange`, whose lookup is a subtraction (no hash table
    to ship and probe, no pandas on the workers); other sorted integers of a modest span
    (:func:`~clmf.parallel.dask_prepare._span_limit`) as an
    :class:`~clmf.parallel.dask_prepare.IdTable` (an array lookup); any other ``index``
    itself."""
    from .dask_prepare import IdRange, IdTable, _span_limit
    if not (len(index) and index.dtype.kind in "iu" and index.is_monotonic_increasing):
        return index
    span = int(index[-1]) - int(index[0]) + 1
    if span == len(index) and int(index[-1]) < 2**63:
        return IdRange(int(index[0]), int(index[-1]) + 1)
    if span <= _span_limit(len(index)):
        return IdTable(np.asarray(index))
    return index


def _map_where(client, fn, futs, where, **kwargs):
    """``client.map(fn, futs, **kwargs)``, each task placed with the worker(s) ``where[k]``
    holding its part where known (a loose restriction: anywhere if they leave). Dask treats
    a group of tasks sharing broadcast arguments as root tasks, placed without regard to
    where their data lies; a partition moving between workers costs more than the task."""
    if not where or not all(where):
        return client.map(fn, futs, pure=False, **kwargs)
    return [client.submit(fn, fu, workers=list(w), allow_other_workers=True, pure=False,
                          **kwargs) for fu, w in zip(futs, where)]


def _tree(client, fn, futs, width=8):
    """A future of ``fn`` over ``futs`` reduced on the workers, ``width`` at a time."""
    while len(futs) > width:
        futs = [client.submit(fn, *futs[k:k + width]) for k in range(0, len(futs), width)]
    return client.submit(fn, *futs)


def prepare(client, X, columns=("user", "item", "rating"), maps=None, n_parts=None, shift=0.0,
            workers=None):
    """Encode ratings on the cluster. Raw ids of a fit (``maps`` None): one pass over the
    partitions where they lie (:func:`~clmf.parallel.dask_prepare.scan`: each id column's
    distinct values with their counts, by a ``bincount`` for integer ids of a modest span, and
    the ratings' sums), reduced on the workers into the sorted id maps and the per-row counts;
    the partitions are then encoded to dense indices by the blocks' split, on the workers
    holding them (:attr:`DistRatings.encoding`, :attr:`DistRatings.where`). Ids of a fitted
    model (``maps``): encoded at once, ids unknown to it become -1.
    Nothing but ids and counts comes to the client. ``shift`` is added to the ratings on the
    workers (``total`` and ``minimum`` are of the ratings as given); ``workers``: the fit's
    workers, over which parquet files are spread (:func:`_partitions`). Returns a
    :class:`DistRatings` (counts filled when ``maps`` is None)."""
    laps = T.Laps()
    n_parts = n_parts or len(client.nthreads())
    parts, known = _partitions(client, X, tuple(columns), n_parts, workers)
    counted = where = encoding = None
    if known is not None and maps is None:
        shape, uids, iids = known
        codes = client.map(T.encode, parts, columns=tuple(columns), user_index=None,
                           item_index=None, shift=shift)
    else:
        if maps is None:
            scanned = _tree(client, T.merge_scans,
                            client.map(T.scan, parts, columns=tuple(columns), shift=shift,
                                       owners=tuple(workers) if workers else None))
            uform, iform, *counted = scanned.result()
            (uidx, uc), (iidx, ic) = (_sorted_index(*_pair(T.ids_and_counts(form), col))
                                      for form, col in zip((uform, iform), columns[:2]))
            del scanned
            counted = [uc, ic, *counted]
            laps.lap("ids_and_counts")
        else:
            import pandas as pd
            uidx, iidx = (m if isinstance(m, pd.Index) else pd.Index(m) for m in maps)
        uf, if_ = client.scatter([_encoder(uidx), _encoder(iidx)], broadcast=True, hash=False)
        if counted is not None:      # in memory: encoded by the blocks' split where they lie
            held = client.who_has(parts)
            where = [held.get(fu.key) for fu in parts]
            encoding = {"columns": tuple(columns), "user_index": uf, "item_index": if_,
                        "shift": shift}
            codes = parts
        else:
            codes = client.map(T.encode, parts, columns=tuple(columns), user_index=uf,
                               item_index=if_, shift=shift)
        shape = (len(uidx), len(iidx))
        uids, iids = np.asarray(uidx), np.asarray(iidx)
    out = DistRatings(codes, shape, uids, iids, times=laps.times, where=where,
                      encoding=encoding)
    if maps is None:
        if counted is None:            # dense indices given: counted from the encoded parts
            counted = list(_tree(client, T.sum_tallies,
                                 client.map(T.tally, codes, m=shape[0], n=shape[1])).result())
            laps.lap("encode_and_counts")
        uc, ic, s, lo, bad, hi = counted
        if bad:
            raise ValueError(f"the ratings contain {bad} NaN/inf value(s)")
        out.user_counts, out.item_counts = uc, ic
        out.nnz = int(uc.sum())
        out.total, out.minimum, out.maximum = s - shift * out.nnz, lo - shift, hi - shift
        if out.nnz == 0:
            raise ValueError("the ratings are empty")
    return out


class DaskEngine:
    """One fit's blocks and device workers on a Dask cluster (see the module docstring)."""

    def __init__(self, client, addrs, ranks, specs, data, fit, stats, *, offset=0.0,
                 max_device_memory=None, modes=None, start=None, facts=None, poll=1.0,
                 early=None):
        """Set the fit up on the workers ``addrs`` (``ranks``, ``specs``: their device picks,
        :func:`fit_workers`) for the prepared ``data`` (:class:`DistRatings`) of a fit of
        ``fit`` (a :class:`clmf.tuning.FitSpec`; ``stats``: its side statistics). The blocks
        are routed and built (in a thread of each worker) from the row bounds, which the
        counts alone decide, while one worker per kind of device resolves the configuration
        and builds its programs (:func:`~clmf.parallel.dask_tasks.probe`); the others take its
        choice. ``start``: ``(rule, seed)`` when the fit draws its start factors (each worker
        draws them while its splits run, :func:`clmf.reference.start_factors`: nothing but the
        seed is sent), else None (:meth:`set_factors` then). ``facts``: the futures of
        :func:`device_facts`, where the caller submitted them already; ``early``: the fit's
        :class:`EarlySetUp` (its id and shared-memory check), where the caller started it."""
        from ..tuning.spec import unknowns
        from .partition import balanced_blocks
        self.client = client
        self.addrs = list(addrs)
        self.n = len(self.addrs)
        self.fit_id = early.fit_id if early is not None else new_fit_id()
        if early is not None:
            early.taken = True
        self.shape = tuple(data.shape)
        self.f = int(fit.f)
        self.biased = bool(fit.biased)
        self.implicit = fit.kernel_alpha is not None
        self.fs = unknowns(self.f, self.biased)
        self.poll = float(poll)
        self.phase = "set-up"
        self.user_counts, self.item_counts = data.user_counts, data.item_counts
        self.started = start is not None
        self.splits = []       # per iteration of the workers' loop, each worker's parts (s)
        # the row bounds: the counts alone decide them (make_plan below cuts the same)
        bounds = {"users": balanced_blocks(data.user_counts, self.n, self.fs),
                  "items": balanced_blocks(data.item_counts, self.n, self.fs)}
        static = {"shape": self.shape, "devices": list(zip(specs, ranks)),
                  "user_counts": data.user_counts,
                  "item_counts": data.item_counts, "bounds": bounds, "owners": self.addrs,
                  "start": (start[0], self.f, start[1]) if start is not None else None}
        t0 = time.perf_counter()
        self.times = {}
        built = False
        try:
            # worker 0 (the first of its kind) resolves at once; the others' facts say whether
            # they are of its kind, meanwhile the blocks are routed and built (a thread)
            first = self._on(0, T.probe, specs[0], ranks[0], fit, stats, priority=2)
            # the splits wait for the shared-memory check (made at the fit's start: early)
            self._shared = (early.shared if early is not None
                            else shared_set_up(client, self.addrs, self.fit_id))
            if facts is None:
                facts = device_facts(client, self.addrs, ranks, specs)
            sfut = client.scatter([static], broadcast=True, workers=self.addrs, hash=False)[0]
            # each worker's context and start factors in a thread, while the splits run
            warm = [self._on(d, T.warm_up, self.fit_id, d, sfut, priority=6)
                    for d in range(self.n)]
            pieces = self._route(data.parts, bounds, shared=self._shared, where=data.where,
                                 encoding=data.encoding)
            # each partition's pieces handed to their owner as its split ends: the owner
            # merges them (threads) while the other splits run
            taken = [[self._on(d, T.take, self.fit_id, d, sfut, len(pieces), p, pieces[p][d],
                               pieces[p][self.n + d], priority=5) for p in range(len(pieces))]
                     for d in range(self.n)]
            blocks = [self._on(d, T.blocks, self.fit_id, d, sfut, warm[d], len(pieces),
                               *taken[d]) for d in range(self.n)]
            self._setup_futs = blocks + warm + [t for per in taken for t in per]
            self.phase = "the device probe"
            facts = self._wait(facts)
            self.times["facts"] = time.perf_counter() - t0
            self._probe(specs, ranks, facts, fit, stats, first)
            self.times["probe"] = time.perf_counter() - t0 - self.times["facts"]
            self._plan(data, fit, modes, bounds)
            self.phase = "set-up"
            setup = {"plan": self.plan, "f": self.f, "biased": self.biased, "ldf": self.ldf,
                     "itemsize": np.dtype(self.np_store).itemsize, "store": self.np_store,
                     "config_pairs": self.config_pairs, "implicit_alpha": fit.kernel_alpha,
                     "max_device_memory": max_device_memory, "infos": self.infos,
                     "specs": list(specs), "ranks": list(ranks), "offset": float(offset)}
            sfut = client.scatter([setup], broadcast=True, workers=self.addrs, hash=False)[0]
            # (each after its worker's blocks task: it takes the blocks that task started)
            futs = [self._on(d, T.build, self.fit_id, d, sfut, blocks[d], self._shared)
                    for d in range(self.n)]
            self.memory_plans = self._wait(futs)
            self._setup_futs = []
            t1 = time.perf_counter()
            self.times["blocks_and_engines"] = t1 - t0 - self.times["facts"] - self.times["probe"]
            self.transport = self._transport()
            t2 = time.perf_counter()
            self.times["transport"] = t2 - t1
            self.loop = self._board()
            self.times["board"] = time.perf_counter() - t2
            built = True
        finally:
            if not built:
                self.release()
        self.memory = {"total": max(p["total"] for p in self.memory_plans),
                       "per_device": self.memory_plans}
        self.worker_times = [p.pop("times", {}) for p in self.memory_plans]
        self.times["build"] = time.perf_counter() - t0
        log.info("fit %s: blocks built on %d workers in %.2f s (modes %s, blocks through %s, "
                 "%s)", self.fit_id, self.n, self.times["build"],
                 {s: self.plan[s].mode for s in SIDES}, self.transport,
                 "the workers' own loop" if self.loop else "tasks per half-step")

    def _probe(self, specs, ranks, facts, fit, stats, first):
        """Resolve the configuration of each kind of device on its first worker (its programs
        built there; ``first``: worker 0's probe, submitted already) and give it to every worker
        of that kind: :attr:`labels`, :attr:`infos`, :attr:`choices` per worker,
        :attr:`probe_times` per kind."""
        reps = {}
        for d, (_label, info) in enumerate(facts):
            reps.setdefault(info, d)
        probes = dict(zip(reps, self._wait([
            first if d == 0 else self._on(d, T.probe, specs[d], ranks[d], fit, stats,
                                          priority=2)
            for d in reps.values()])))
        self.labels = [label for label, _info in facts]
        self.infos = [info for _label, info in facts]
        self.choices = [probes[info][2] for info in self.infos]
        self.probe_times = {reps[info]: p[3] for info, p in probes.items()}
        log.info("fit %s: %d kind(s) of device among %d workers, probed on worker(s) %s",
                 self.fit_id, len(reps), self.n, sorted(reps.values()))

    def _plan(self, data, fit, modes, bounds):
        """The fit's storage, leading dimension, modes and :class:`~clmf.parallel.Plan` from
        the workers' configurations (its bounds those the blocks were cut by)."""
        from ..tuning.spec import common_ldf, row_width
        from .backend import fit_modes
        pairs = [(c["users"].config, c["items"].config) for c in self.choices]
        storages = {c.storage for p in pairs for c in p}
        if len(storages) != 1:
            raise ValueError(f"every device must store factors alike, got {sorted(storages)}")
        self.np_store = np.float16 if storages.pop() == "float16" else np.float32
        self.ldf = common_ldf(pairs, row_width(self.f, self.biased))
        modes = fit_modes(self.shape, self.fs, self.ldf, self.n, pairs, modes)
        self.config_pairs = pairs
        self.plan = make_plan(data.user_counts, data.item_counts, self.n, self.fs, self.ldf,
                              modes=modes)
        for s in SIDES:
            if not np.array_equal(self.plan[s].bounds, bounds[s]):
                raise AssertionError(f"the plan's {s} bounds differ from the blocks'")
        self.metric_by = T.metric_side(self.plan)

    def _transport(self):
        """How solved blocks move: "shared memory" when every worker mapped every other
        worker's set-up probe segment (one host, :func:`shared_set_up`; the workers' build
        took the same answer), else "dask comms"."""
        if self.n < 2:
            return "none"
        self.phase = "checking shared memory"
        on = self._wait([self._shared])[0] if hasattr(self._shared, "key") else self._shared
        return "shared memory" if on else "dask comms"

    def _board(self):
        """Whether the workers run each iteration in one task of their own (the solved rows
        exchanged through their boards while the kernels run, :mod:`clmf.parallel.shared_blocks`):
        one worker, or workers of one host with both factors replicated, and
        ``CLMF_DASK_WORKER_LOOP`` not "0"; else tasks per half-step (Dask orders them)."""
        from .shared_blocks import switched_off
        if switched_off(ENV_LOOP):
            return False
        if self.n == 1:
            return True
        if (self.transport != "shared memory"
                or any(self.plan[s].mode != "replicate" for s in SIDES)):
            return False
        self.phase = "making the workers' boards"
        handles = [self._on(d, T.board_make, self.fit_id) for d in range(self.n)]
        staged = self._wait([self._on(d, T.board_connect, self.fit_id, self._abort_name(),
                                      *handles) for d in range(self.n)])
        if any(x is None for x in staged):       # a worker without room: no board anywhere
            return False
        log.info("fit %s: workers' own rows through page-locked staging on %d of %d workers "
                 "(published by %s)%s", self.fit_id, sum(x["staged"] for x in staged), self.n,
                 staged[0]["publish"], "".join(
                     f"; worker {d} host copies (GB/s): " + ", ".join(
                         f"{k} {v:.1f}" for k, v in x["copy_gbs"].items())
                     for d, x in enumerate(staged) if x["copy_gbs"]))
        self.board_facts = staged
        return True

    def _abort_name(self):
        """The name of the :class:`distributed.Event` that calls the workers' loop off."""
        return f"{self.fit_id}-abort"

    # ----- task plumbing -------------------------------------------------------------------
    def _on(self, d, fn, *args, priority=0):
        """Run ``fn(*args)`` on worker ``d`` only (``priority``: Dask's, higher first)."""
        return self.client.submit(fn, *args, workers=[self.addrs[d]], allow_other_workers=False,
                                  pure=False, priority=priority,
                                  key=f"{fn.__name__}-{self.fit_id}-{uuid.uuid4().hex}")

    def _route(self, parts, bounds=None, shared=False, where=None, encoding=None):
        """Per partition, futures of its ``2n`` pieces (users blocks, then items blocks) by the
        row ``bounds`` (side → bounds; default: the plan's); ``shared``: whether (or a future
        of whether) they go through shared memory (:func:`shared_set_up`); ``where``: per
        partition, the workers holding it (:attr:`DistRatings.where`: split there);
        ``encoding``: the split's arguments that encode raw partitions
        (:attr:`DistRatings.encoding`)."""
        bounds = bounds or {s: self.plan[s].bounds for s in SIDES}
        bu, bi = bounds["users"], bounds["items"]
        splits = _map_where(self.client, T.split, parts, where, bounds_u=bu, bounds_i=bi,
                            prefix=T.setup_prefix(self.fit_id), shared=shared,
                            owners=self.addrs, **(encoding or {}))
        # (ahead of the splits still queued: each piece reaches its owner as its split ends)
        return [[self.client.submit(T.pick, s, k, pure=False, priority=5)
                 for k in range(2 * self.n)] for s in splits]

    def _wait(self, futs):
        """Results of ``futs`` (see :func:`wait_alive`)."""
        return wait_alive(self.client, self.addrs, futs, f"fit {self.fit_id}", self.phase,
                          self.poll)

    # ----- factors -------------------------------------------------------------------------
    def padded(self, side, M, biases=None):
        """A side's factors (n_rows × f) as the devices' padded rows."""
        rows = self.shape[0 if side == "users" else 1]
        return padded_factors(side, M, rows, self.f, self.ldf, self.np_store, self.biased, biases)

    def set_factors(self, side, M, biases=None, adopt=False):
        """Upload a side's factors to every worker (the rows each device holds; ``adopt``, the
        engine's in-place hint, is moot: the workers get copies)."""
        self.phase = f"uploading the {side} factors"
        fut = self.client.scatter([self.padded(side, M, biases)], broadcast=True,
                                  workers=self.addrs, hash=False)[0]
        self._wait([self._on(d, T.write, self.fit_id, side, fut) for d in range(self.n)])

    def get_factors(self, side, with_biases=False):
        """A side's factors gathered from the workers solving them."""
        self.phase = f"gathering the {side} factors"
        rows = self.shape[0 if side == "users" else 1]
        host = np.zeros((max(1, rows), self.ldf), dtype=self.np_store)
        for r0, blk in self._wait([self._on(d, T.read, self.fit_id, side)
                                   for d in range(self.n)]):
            host[r0:r0 + len(blk)] = blk
        return unpadded_factors(host, rows, self.f, self.biased, with_biases)

    # ----- iterations ----------------------------------------------------------------------
    def half_step(self, side, regularization, weighted, previous=()):
        """Submit the half-step of ``side`` on every worker (no wait): each worker first installs
        the ``previous`` half-step's blocks (``(side, needed, *futures)``), then solves its rows
        (reduce mode: partial systems, reduced on their owners, solved). Returns the next
        half-step's ``previous``."""
        n = self.n
        needed = n > 1 and self.plan[other_side(side)].mode == "replicate"
        if self.plan[side].mode == "reduce":
            parts = [self._on(d, T.partials, self.fit_id, side, *previous) for d in range(n)]
            picks = [[self._on(d, T.pick, parts[d], e) for e in range(n + 1)] for d in range(n)]
            solved = [self._on(e, T.reduce_solve, self.fit_id, side, regularization, weighted,
                               needed, n, *[picks[d][e] for d in range(n)],
                               *[picks[d][n] for d in range(n)]) for e in range(n)]
        else:
            solved = [self._on(d, T.solve, self.fit_id, side, regularization, weighted, needed,
                               *previous) for d in range(n)]
        return (side, needed, *solved)

    def iteration(self, regularization, weighted, it=None, count=1, metrics=()):
        """ALS iteration ``it`` (users, then items) on every worker — or ``count`` iterations
        from it, with the squared errors of the ``metrics`` keys after each — in one task per
        worker that runs them whole (:func:`~clmf.parallel.dask_tasks.iterate`, where
        :meth:`_board` allowed it: :attr:`loop`); returns per iteration ``(seconds, {key:
        (sse, count)}, seconds of the metrics)``, the slowest worker's seconds and the workers'
        sums (each worker's parts of each iteration appended to :attr:`splits`). Else (one
        iteration, None returned) the half-steps' tasks are submitted at once
        (Dask orders them by their dependencies; the solved blocks go straight from worker to
        worker) and waited for once, for the last blocks installed everywhere."""
        count = int(count)
        if self.loop:
            self.phase = (f"iteration {it}" if count == 1
                          else f"iterations {it}..{None if it is None else it + count - 1}")
            res = self._wait_loop([self._on(d, T.iterate, self.fit_id, float(regularization),
                                            bool(weighted), count, tuple(metrics))
                                   for d in range(self.n)])
            out = []
            for per in zip(*res):
                scores = {k: (float(sum(p[1][k][0] for p in per)),
                              int(sum(p[1][k][1] for p in per))) for k in metrics}
                out.append((max(p[0] for p in per), scores, max(p[2] for p in per)))
                self.splits.append([{"seconds": p[0], **p[3]} for p in per])
            return out
        if count != 1 or metrics:
            raise ValueError("several iterations in one call need the workers' own loop "
                             "(DaskEngine.loop)")
        self.phase = f"iteration {it}"
        previous = ()
        for side in SIDES:
            previous = self.half_step(side, float(regularization), bool(weighted), previous)
        self._wait([self._on(d, T.install, self.fit_id, *previous) for d in range(self.n)])
        return None

    def _wait_loop(self, futs):
        """Results of the workers' loop tasks; when some failed (the peers of a failed worker
        stop too), a singular system is the error reported, as in-process."""
        from ..errors import SingularSystemError
        try:
            return self._wait(futs)
        except Exception:
            for fu in futs:
                if fu.status == "error" and isinstance(fu.exception(), SingularSystemError):
                    raise fu.exception() from None
            raise

    # ----- metrics -------------------------------------------------------------------------
    def set_heldout(self, key, data, mean, to_mean):
        """Keep held-out encoded ratings on the workers holding their rows (by
        :func:`~clmf.parallel.dask_tasks.metric_side`); returns ``(sse, count, unknown ids)`` of
        those predicted on the host side as the mean (:func:`~clmf.parallel.dask_tasks.heldout`).
        """
        self.phase = f"routing the {key} ratings"
        uc, ic = self.client.scatter([self.user_counts, self.item_counts], broadcast=True,
                                     hash=False, workers=self.addrs)
        split = self.client.map(T.heldout, data.parts, mean=mean, user_counts=uc,
                                item_counts=ic, to_mean=bool(to_mean), pure=False)
        kept = [self.client.submit(T.pick, s, 0, pure=False) for s in split]
        rest = self._wait([self.client.submit(lambda x: x[1:], s, pure=False) for s in split])
        pieces = self._route(kept)
        k0 = 0 if self.metric_by == "users" else self.n
        self._wait([self._on(d, T.set_triples, self.fit_id, key,
                             *[p[k0 + d] for p in pieces]) for d in range(self.n)])
        return (float(sum(x[0] for x in rest)), int(sum(x[1] for x in rest)),
                int(sum(x[2] for x in rest)))

    def squared_error(self, key):
        """``(sum of squared errors, count)`` over the workers' blocks of ``key``."""
        self.phase = f"scoring {key}"
        res = self._wait([self._on(d, T.squared_error, self.fit_id, key) for d in range(self.n)])
        return float(sum(r[0] for r in res)), int(sum(r[1] for r in res))

    def release(self):
        """Free every worker's share of the fit (the workers still there); workers still in
        their own loop are called off first, set-up tasks not yet run are cancelled."""
        try:
            self.client.cancel(getattr(self, "_setup_futs", []))
        except Exception as e:        # noqa: BLE001 - best effort while failing
            log.warning("cancelling the set-up of fit %s: %s", self.fit_id, e)
        if getattr(self, "loop", False) and self.n > 1:
            try:
                from distributed import Event
                Event(self._abort_name(), client=self.client).set()
            except Exception as e:    # noqa: BLE001 - the peers' liveness is checked anyway
                log.warning("calling off fit %s: %s", self.fit_id, e)
        try:
            alive = set(self.client.nthreads())
            futs = [self._on(d, T.release, self.fit_id) for d in range(self.n)
                    if self.addrs[d] in alive]
            from distributed import wait
            wait(futs, timeout=60)
        except Exception as e:        # noqa: BLE001 - best effort while failing
            log.warning("releasing fit %s: %s", self.fit_id, e)
        if getattr(self, "loop", False) and self.n > 1:
            try:
                from distributed import Event
                Event(self._abort_name(), client=self.client).clear()
            except Exception:         # noqa: BLE001, S110 - a name left on the scheduler
                pass
        from .shared_blocks import unlink_fit
        if getattr(self, "transport", None) == "shared memory":
            unlink_fit(self.fit_id)   # a client on the workers' host: what lost workers left
        else:
            unlink_fit(T.setup_prefix(self.fit_id))     # (the set-up's, likewise)
