"""Data preparation for a :mod:`clmf.dask` fit, in any worker (issue 15): distinct ids, their
encoding and tallies, the ratings split into the owners' pieces (through shared-memory segments
where the workers share a host), the set-up's shared-memory probes and the held-out split. The
tasks of a fit's blocks and device worker are :mod:`clmf.parallel.dask_tasks`, which re-exports
these for the client (:mod:`clmf.parallel.dask_backend`)."""
from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
import time

import numpy as np

from . import shared_blocks as shm

log = logging.getLogger(__name__)

GATHER_THREADS_FROM = 1 << 20     # entries from which a block's gathers run in threads
# splits a worker runs at once, each in a thread of its own: "auto" (its host's cores shared by
# the fit's workers there, at most SPLIT_THREADS_MAX) or a number (1: in turn, in the worker's
# own thread)
ENV_SPLIT_THREADS = "CLMF_DASK_SPLIT_THREADS"
SPLIT_THREADS_MAX = 4
# threads merging each side's large pieces into a worker's block (two sides at once): "auto"
# (half its share of the host's cores, at most MERGE_THREADS_MAX) or a number (1: one thread)
ENV_MERGE_THREADS = "CLMF_DASK_MERGE_THREADS"
MERGE_THREADS_MAX = 8
_SPLITS = {}              # set-up prefix → [seconds summed, first start, last end] of splits here
_SPLIT_LOCK = threading.Lock()
_SPLIT_SLOTS = []         # the semaphore bounding the splits run at once in this process


# ----- data preparation (any worker) ------------------------------------------------------
ID_SPAN_MIN = 1 << 20     # integer ids spanning up to this many values are tallied by bincount
ID_SPAN_MAX = 1 << 24     # ... or up to 4 × the ratings counted, at most this many


def _span_limit(entries):
    """The widest range of integer ids whose counts are kept as one array (a bin per value)
    for ``entries`` ratings: no more cells than a few times the ratings themselves."""
    return max(ID_SPAN_MIN, min(4 * int(entries), ID_SPAN_MAX))


def id_counts(vals):
    """The distinct values of an id column of a partition and how often each occurs:
    ``("bins", lo, counts, dtype)`` (integer ids within :func:`_span_limit` of each other:
    ``counts[k]`` ratings of id ``lo + k``, by one ``bincount``, no hashing) or ``("values",
    ids, counts)`` (any other ids, in first-seen order as :func:`pandas.unique` gives them;
    missing ids kept, for :func:`clmf.data._ids.check_raw_ids` to refuse)."""
    vals = np.asarray(vals)
    if vals.dtype.kind in "iu" and vals.size:
        lo, hi = int(vals.min()), int(vals.max())
        if hi - lo < _span_limit(vals.size):
            return ("bins", lo, np.bincount(_offsets(vals, lo, hi - lo + 1),
                                            minlength=hi - lo + 1),
                    vals.dtype.str)
    import pandas as pd  # (only here: a fresh worker reading integer ids skips it)
    codes, uniq = pd.factorize(vals, use_na_sentinel=False)
    return ("values", np.asarray(uniq), np.bincount(codes, minlength=len(uniq)))


def _offsets(vals, lo, span=None):
    """``vals - lo`` as array indices, for integer ids ``vals`` from ``lo`` to a modest span
    above it (exact whatever their type: in the column's own type where the ``span`` fits it,
    else 64-bit arithmetic, wrapping where it wraps)."""
    dt = vals.dtype
    if span is not None and dt.itemsize <= 4:
        info = np.iinfo(dt)
        if info.min <= lo <= info.max and span - 1 <= info.max:
            return vals - dt.type(lo)            # the difference fits: exact in this type
    if dt.kind == "u":
        rel = (vals.astype(np.uint64) - np.uint64(lo) if lo >= 0
               else vals.astype(np.uint64) + np.uint64(-lo))
    else:
        rel = vals.astype(np.int64) - np.int64(lo)
    return rel.astype(np.intp, copy=False)


def _in_span(vals, lo, span):
    """Whether every integer id of ``vals`` lies in ``[lo, lo + span)``, else a mask of those
    that do (NumPy 2 compares Python integers of any size exactly)."""
    if not len(vals) or (int(vals.min()) >= lo and int(vals.max()) < lo + span):
        return True
    return (vals >= lo) & (vals < lo + span)


def _bin_values(form):
    """The ids of a ``"bins"`` form of :func:`id_counts` that occur, ascending, and their
    counts."""
    _kind, lo, counts, dt = form
    dt = np.dtype(dt)
    nz = np.flatnonzero(counts)
    ids = (nz.astype(np.uint64) + np.uint64(lo) if dt.kind == "u"
           else nz.astype(np.int64) + np.int64(lo))
    return ids.astype(dt), counts[nz]


def merge_id_counts(*forms):
    """The :func:`id_counts` of several partitions together (counts of the same id summed;
    bins kept where the union's span allows, else values in first-seen order)."""
    forms = [f for f in forms if f is not None]
    if all(f[0] == "bins" for f in forms):
        lo = min(f[1] for f in forms)
        hi = max(f[1] + len(f[2]) for f in forms)
        if hi - lo <= _span_limit(sum(int(f[2].sum()) for f in forms)):
            out = np.zeros(hi - lo, np.int64)
            for _k, a, c, _dt in forms:
                out[a - lo:a - lo + len(c)] += c
            return ("bins", lo, out, np.result_type(*[np.dtype(f[3]) for f in forms]).str)
    import pandas as pd
    pairs = [_bin_values(f) if f[0] == "bins" else f[1:] for f in forms]
    codes, uniq = pd.factorize(np.concatenate([p[0] for p in pairs]), use_na_sentinel=False)
    counts = np.bincount(codes, weights=np.concatenate([p[1] for p in pairs]),
                         minlength=len(uniq))                  # (exact below 2**53)
    return ("values", np.asarray(uniq), counts.astype(np.int64))


def ids_and_counts(form):
    """``(distinct ids, their counts)`` of a (merged) :func:`id_counts` form, in the order
    :func:`id_counts` describes."""
    return _bin_values(form) if form[0] == "bins" else (form[1], form[2])


def read_parquet_file(path, columns, storage_options=None):
    """The ``columns`` of one parquet file (a local path or an fsspec URL) as a pyarrow Table,
    what :func:`scan` and :func:`split` read: a fresh worker then imports neither
    ``dask.dataframe`` nor pandas before its first partition (more than a second of a fit's
    set-up); a pandas DataFrame where a column has missing values (as ``dd.read_parquet``
    gives them, refused later by the same checks)."""
    import pyarrow.parquet as pq
    columns = list(columns)
    if "://" in str(path):
        import fsspec
        with fsspec.open(path, "rb", **(storage_options or {})) as fh:
            table = pq.ParquetFile(fh).read(columns=columns)
    else:
        table = pq.ParquetFile(path).read(columns=columns)
    if any(table.column(c).null_count for c in columns):
        return table.to_pandas()
    return table


def _values(df, column, dtype=None):
    """A column of a partition (a pandas DataFrame, or a pyarrow Table read by
    :func:`read_parquet_file`) as a NumPy array (of ``dtype`` where given)."""
    c = df[column]
    if hasattr(c, "null_count"):                   # pyarrow: no nulls (read_parquet_file)
        return np.asarray(_arrow_values(c), dtype=dtype)
    return c.to_numpy(dtype=dtype)


_ARROW_FLOATS = {"halffloat": np.float16, "float": np.float32, "double": np.float64}


def _arrow_values(c):
    """A pyarrow ChunkedArray of integers or floats without nulls as a NumPy array, read from
    its buffers (pyarrow's own ``to_numpy`` imports pandas, a third of a second on a fresh worker);
    other types by ``to_numpy``."""
    name = str(c.type)
    if name not in _ARROW_FLOATS and not name.startswith(("int", "uint")):
        return c.to_numpy()
    dt = np.dtype(_ARROW_FLOATS.get(name, name))
    parts = [np.frombuffer(k.buffers()[1], dt, len(k), k.offset * dt.itemsize)
             for k in c.chunks if len(k)]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty(0, dt)


def _ratings(df, column, shift):
    """A partition's ratings as float32 plus ``shift`` (added in float64)."""
    r = _values(df, column, np.float64 if shift else np.float32)
    return (r + shift).astype(np.float32) if shift else r


def _stats(r):
    """The ratings' sum (float64), minimum, non-finite count and maximum."""
    return (float(r.astype(np.float64).sum()), float(r.min()) if r.size else np.inf,
            int((~np.isfinite(r)).sum()), float(r.max()) if r.size else -np.inf)


def scan(df, columns, shift=0.0, owners=None):
    """One pass over a partition of raw-id ratings: both id columns' :func:`id_counts` and the
    ratings' (plus ``shift``) sum, minimum, non-finite count and maximum — what the id maps,
    the per-row counts and the checks of a fit need, before any encoding. Run out of the
    worker's pool where its host has the cores (as the splits: :func:`_split_slot`, ``owners``
    the fit's workers), so that the worker reads its next partition meanwhile."""
    from ..data.frames import check_columns
    with _split_slot(owners):
        ucol, icol, rcol = check_columns(df, columns)
        return (id_counts(_values(df, ucol)), id_counts(_values(df, icol)),
                *_stats(_ratings(df, rcol, shift)))


def merge_scans(*parts):
    """The :func:`scan` of several partitions together (the sums added in order, as
    :func:`sum_tallies`)."""
    s, lo, bad, hi = parts[0][2:]
    for p in parts[1:]:
        s += p[2]
        lo = min(lo, p[3])
        bad += p[4]
        hi = max(hi, p[5])
    return (merge_id_counts(*[p[0] for p in parts]), merge_id_counts(*[p[1] for p in parts]),
            s, lo, bad, hi)


class IdTable:
    """The map of integer raw ids within a modest span to dense indices as an array (a cell per
    value in the span, -1 where no id): the workers' lookup is an index, no hash table."""

    def __init__(self, ids):
        """The table of the sorted distinct integer ``ids``."""
        ids = np.asarray(ids)
        self.dtype = ids.dtype
        self.lo = int(ids[0])
        span = int(ids[-1]) - self.lo + 1
        self.table = np.full(span, -1, np.int32 if len(ids) < 2**31 else np.int64)
        self.table[_offsets(ids, self.lo)] = np.arange(len(ids))

    def __len__(self):
        """The span of the table."""
        return len(self.table)

    def codes(self, vals):
        """Dense indices of the raw ids ``vals`` (-1: not a known id)."""
        vals = np.asarray(vals)
        if vals.dtype.kind not in "iu":
            import pandas as pd
            return pd.Index(self.ids()).get_indexer(vals)
        span = len(self.table)
        ok = _in_span(vals, self.lo, span)
        if ok is True:
            return self.table[_offsets(vals, self.lo, span)]
        out = np.full(len(vals), -1, np.int64)
        if ok.any():
            out[ok] = self.table[_offsets(vals[ok], self.lo, span)]
        return out

    def ids(self):
        """The distinct ids, ascending."""
        return _bin_values(("bins", self.lo, (self.table >= 0).astype(np.int64),
                            self.dtype.str))[0]


def encode(df, columns, user_index, item_index, shift=0.0):
    """A partition's ``(users, items, ratings)`` as int32 dense indices (-1: an id not in the
    training maps) and float32 values plus ``shift`` (the kernels' view of implicit
    ``confidence="alpha*r"``); ``*_index`` None: the column holds indices already."""
    from ..data.frames import check_columns
    ucol, icol, rcol = check_columns(df, columns)
    out = []
    for col, index in ((ucol, user_index), (icol, item_index)):
        vals = _values(df, col)
        if index is None:
            codes = np.asarray(vals, dtype=np.int64)
        else:
            codes = _codes(index, vals)
        out.append(codes.astype(np.int32, copy=False))
    return out[0], out[1], _ratings(df, rcol, shift)


class IdRange:
    """The map of the consecutive integer raw ids ``start .. stop - 1`` to dense indices: a
    subtraction and a range check, several times faster than a :class:`pandas.RangeIndex`'s
    ``get_indexer`` (and a worker needs no pandas to unpickle it)."""

    def __init__(self, start, stop):
        """The ids ``start`` to ``stop - 1``."""
        self.start, self.stop = int(start), int(stop)

    def __len__(self):
        """How many ids."""
        return self.stop - self.start

    def codes(self, vals):
        """Dense indices of the raw ids ``vals`` (-1: not in the range)."""
        vals = np.asarray(vals)
        if vals.dtype.kind not in "iu":
            import pandas as pd
            return pd.RangeIndex(self.start, self.stop).get_indexer(vals)
        return _range_codes(vals, self.start, len(self))


def _range_codes(vals, start, span):
    """Dense indices of integer ids ``vals`` in ``start .. start + span - 1`` (-1: outside)."""
    ok = _in_span(vals, start, span)
    if ok is True:
        return _offsets(vals, start, span)
    codes = np.full(len(vals), -1, np.int64)
    codes[ok] = _offsets(vals[ok], start, span)
    return codes


def _codes(index, vals):
    """Dense indices of the raw ids ``vals`` in ``index`` (-1: not in it): an :class:`IdRange`
    or :class:`IdTable` (:func:`~clmf.parallel.dask_backend._encoder`), a
    :class:`pandas.RangeIndex` of step 1 over integer ids by a subtraction, else the index's
    ``get_indexer``."""
    if isinstance(index, (IdTable, IdRange)):
        return index.codes(vals)
    import pandas as pd
    if not (isinstance(index, pd.RangeIndex) and index.step == 1
            and getattr(vals, "dtype", np.dtype(object)).kind in "iu"):
        return index.get_indexer(vals)
    return _range_codes(vals, index.start, len(index))


def tally(codes, m, n):
    """Per-row counts of both sides, the ratings' sum, minimum, any non-finite count and
    maximum."""
    u, i, r = codes
    ok = (u >= 0) & (i >= 0)
    if not ok.all():
        u, i = u[ok], i[ok]
    if u.size and (int(u.max()) >= m or int(i.max()) >= n):
        raise ValueError("an index lies outside the matrix shape")
    return (np.bincount(u, minlength=m).astype(np.int64),
            np.bincount(i, minlength=n).astype(np.int64), *_stats(r))


def sum_tallies(*parts):
    """The sum of :func:`tally` results."""
    uc, ic, s, lo, bad, hi = parts[0]
    uc, ic = uc.copy(), ic.copy()
    for p in parts[1:]:
        uc += p[0]
        ic += p[1]
        s += p[2]
        lo = min(lo, p[3])
        bad += p[4]
        hi = max(hi, p[5])
    return uc, ic, s, lo, bad, hi


def stable_order(keys, span):
    """The stable sorting permutation of non-negative integer ``keys`` below ``span``, by
    numpy's radix sort on 8- or 16-bit digits (least significant first): O(n) per digit, several
    times faster than a comparison sort of 32- or 64-bit keys."""
    keys = np.asarray(keys)
    if span <= 1 << 8:
        return np.argsort(keys.astype(np.uint8), kind="stable")
    if span <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    return order[stable_order(keys[order] >> 16, (int(span) >> 16) + 1)]


def split(codes, bounds_u, bounds_i, prefix=None, shared=False, owners=None, columns=None,
          user_index=None, item_index=None, shift=0.0):
    """A partition's triples split by owning worker: ``2n`` triples, first by the users' blocks
    then by the items' blocks (unknown ids, -1, are dropped); each worker's triples sorted by
    the side's row, stably (a row's triples keep their order in the partition). ``columns``
    given: ``codes`` is the raw partition, encoded here first (:func:`encode` with the
    ``*_index`` and ``shift``). ``shared`` (the workers share a host: :func:`setup_check`):
    each triple for another worker than this one (``owners``: the workers' addresses) is
    written into a shared-memory segment named ``prefix-...`` (gathered straight into it) and
    its handles returned instead (:func:`clmf.parallel.shared_blocks.share_arrays`; the arrays
    where there is no room), which the owner reads and unlinks (:func:`blocks`). A worker runs
    several splits at once where its host has the cores (:func:`split_threads`); the seconds
    they took are kept for the blocks' stages (:func:`split_times`)."""
    with _split_slot(owners):
        t0 = time.perf_counter()
        if columns is not None:
            codes = encode(codes, columns, user_index, item_index, shift)
        out = _split_into(codes, bounds_u, bounds_i, prefix, shared, owners)
        t1 = time.perf_counter()
        with _SPLIT_LOCK:
            rec = _SPLITS.setdefault(prefix, [0.0, t0, t1])
            rec[0] += t1 - t0
            rec[1], rec[2] = min(rec[1], t0), max(rec[2], t1)
    return out


def split_times(prefix):
    """``{"split": seconds summed, "split_wall": first start to last end}`` of this process's
    splits of the set-up ``prefix`` (forgotten here), or ``{}``."""
    with _SPLIT_LOCK:
        rec = _SPLITS.pop(prefix, None)
    return {} if rec is None else {"split": rec[0], "split_wall": rec[2] - rec[1]}


def split_threads(owners):
    """How many splits this worker runs at once: ``CLMF_DASK_SPLIT_THREADS``, else its host's
    cores over the fit's workers on the host (``owners``: their addresses), at most
    :data:`SPLIT_THREADS_MAX`; 1 outside a Dask worker."""
    return _threads_here(owners, ENV_SPLIT_THREADS, SPLIT_THREADS_MAX, 1)


def merge_threads(owners):
    """How many threads merge each side's large pieces into this worker's blocks
    (:class:`~clmf.parallel.dask_blocks.RowMerger`): ``CLMF_DASK_MERGE_THREADS``, else half of
    its host's cores over the fit's workers on the host (the two sides merge at once;
    ``owners``: their addresses), at most :data:`MERGE_THREADS_MAX`; 1 outside a Dask
    worker."""
    return _threads_here(owners, ENV_MERGE_THREADS, MERGE_THREADS_MAX, 2)


def _threads_here(owners, env, most, per):
    """The threads of one kind this Dask worker runs: the number in the variable ``env``, else
    ("auto") its share of its host's cores (the host's cores over the fit's workers there,
    ``owners`` their addresses) over ``per``, at most ``most``; 1 outside a Dask worker."""
    here = _address()
    if here is None:
        return 1
    want = os.environ.get(env, "auto").strip().lower()
    if want not in ("", "auto"):
        return max(1, int(want))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                 # pragma: no cover - not on this platform
        cores = os.cpu_count() or 1
    host = here.rsplit(":", 1)[0]
    local = sum(1 for o in owners or () if o.rsplit(":", 1)[0] == host) or 1
    return max(1, min(most, cores // local // per))


@contextlib.contextmanager
def _split_slot(owners):
    """Run the enclosed split (or scan) out of the worker's pool (:func:`distributed.secede`:
    the worker starts its next task meanwhile) holding one of :func:`split_threads` slots of
    this process; in the worker's own thread where that is 1."""
    k = split_threads(owners)
    if k <= 1:
        yield
        return
    from distributed import secede
    with _SPLIT_LOCK:
        if not _SPLIT_SLOTS:
            _SPLIT_SLOTS.append(threading.BoundedSemaphore(k))
        slots = _SPLIT_SLOTS[0]
    secede()
    with slots:
        yield


def _split_into(codes, bounds_u, bounds_i, prefix, shared, owners):
    """:func:`split` of encoded triples."""
    uir, pieces = _split(codes, bounds_u, bounds_i)
    n = len(bounds_u) - 1
    here = _address() if shared and owners else None
    out, gathered = [], {}
    for j, (order, a, b) in enumerate(pieces):
        if shared and (owners is None or owners[j % n] != here):
            got = shm.share_arrays(prefix, [(b - a, x.dtype) for x in uir],
                                   lambda views, o=order, a=a, b=b: _take(uir, o, a, b, views))
            if got is not None:
                out.append(got)
                continue
        if order is None:
            out.append(tuple(x[a:b] for x in uir))
        else:                         # one gather of the side, sliced
            if id(order) not in gathered:
                gathered[id(order)] = gather(order, *uir)
            out.append(tuple(x[a:b] for x in gathered[id(order)]))
    return out


def _address():
    """This Dask worker's address (None outside a worker)."""
    try:
        from distributed import get_worker
        return get_worker().address
    except (ImportError, ValueError):
        return None


def _take(arrays, order, a, b, out):
    """``out[k][...] = arrays[k][order[a:b]]`` (``order`` None: ``arrays[k][a:b]``; a
    :class:`_Sorted`: its permutation, its sorted field copied), each array in a thread of its
    own where there are :data:`GATHER_THREADS_FROM` entries or more (NumPy releases the GIL: a
    worker's cores gather its pieces and blocks together)."""
    def one(k):
        """Array ``k``."""
        if order is None:
            np.copyto(out[k], arrays[k][a:b])
        elif isinstance(order, _Sorted):
            if k == order.field:
                np.copyto(out[k], order.keys[a:b])
            else:
                np.take(arrays[k], order.perm[a:b], out=out[k])
        else:
            np.take(arrays[k], order[a:b], out=out[k])
    if len(arrays) < 2 or b - a < GATHER_THREADS_FROM:
        for k in range(len(arrays)):
            one(k)
        return
    with concurrent.futures.ThreadPoolExecutor(len(arrays),
                                               thread_name_prefix="clmf-gather") as pool:
        list(pool.map(one, range(len(arrays))))


def setup_probe(prefix):
    """This worker's probe segment for the set-up's shared pieces (``prefix-probe-...``,
    unlinked with the fit's segments at :func:`release`): ``(SharedBlock, token)``, or None
    where shared memory is off or unavailable."""
    if not shm.enabled():
        return None
    token = os.urandom(16)
    try:
        got = shm.share_arrays(f"{prefix}-probe", [((16,), np.uint8)],
                               lambda views: np.copyto(views[0], np.frombuffer(token, np.uint8)))
    except OSError as e:
        log.info("shared memory unavailable (%s): the ratings go through Dask's comms", e)
        return None
    return None if got is None else (got[0], token)


def setup_check(*probes):
    """Whether every worker's set-up probe maps here with its token."""
    att = shm.Attached()
    try:
        return shm.probe_check(att, probes)
    finally:
        att.close()


def all_of(*flags):
    """Whether every flag is true."""
    return all(flags)


def _split(codes, bounds_u, bounds_i):
    """``((u, i, r), pieces)``: the partition's known triples and, per piece of :func:`split`,
    ``(order, a, b)``: entries ``order[a:b]`` of the triples (``order`` None: ``a:b``, the
    side already in row order), one order per side (a :class:`_Sorted`): the stable order by
    the side's row (a radix sort), so that each piece runs by row and its owner merges them
    without sorting (:func:`clmf.parallel.dask_tasks._block`)."""
    u, i, r = codes
    if len(u) and (u.min() < 0 or i.min() < 0):
        ok = (u >= 0) & (i >= 0)
        u, i, r = u[ok], i[ok], r[ok]
    out = []
    for field, (key, bounds) in enumerate(((u, bounds_u), (i, bounds_i))):
        bounds = np.asarray(bounds, np.int64)
        if len(key) < 2 or bool(np.all(key[1:] >= key[:-1])):
            cuts = np.searchsorted(key, bounds)              # already in row order
            out += [(None, a, b) for a, b in zip(cuts[:-1], cuts[1:])]
            continue
        span = max(1, int(bounds[-1]))
        counts = np.bincount(key, minlength=span)
        ends = np.zeros(span + 1, np.int64)
        np.cumsum(counts, out=ends[1:])
        order = _Sorted(stable_order(key, span), field,
                        np.repeat(np.arange(span, dtype=key.dtype), counts))
        cuts = ends[bounds]
        out += [(order, a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    return (u, i, r), out


class _Sorted:
    """A side's sorting permutation ``perm`` of the triples, with the sorted keys (field
    ``field``) written out from their counts: the gathers then read only the other fields at
    random (:func:`_take`)."""

    def __init__(self, perm, field, keys):
        """Keep the permutation, which field it sorts and that field sorted."""
        self.perm, self.field, self.keys = perm, field, keys


def heldout(codes, mean, user_counts, item_counts, to_mean):
    """Held-out encoded triples split into those scored on the devices and the rest: ids unknown
    to the model (-1), and with ``to_mean`` (explicit, no biases) users/items without training
    ratings, which are predicted as the global ``mean`` (as :meth:`clmf.ALS.predict`). Returns
    ``(device triples, sum of squared errors of the rest, its count, unknown-id count)``."""
    u, i, r = codes
    unknown = (u < 0) | (i < 0)
    rest = unknown.copy()
    if to_mean:
        rest |= (user_counts[np.where(u < 0, 0, u)] == 0) | (item_counts[np.where(i < 0, 0, i)]
                                                              == 0)
    err = mean - r[rest].astype(np.float64)
    keep = ~rest
    return ((u[keep], i[keep], r[keep]), float(np.sum(err * err)), int(rest.sum()),
            int(unknown.sum()))


def gather(order, *arrays):
    """``[a[order] for a in arrays]`` (in threads where long: :func:`_take`; ``order`` may be
    a :class:`_Sorted`)."""
    size = len(order.perm if isinstance(order, _Sorted) else order)
    out = [np.empty(size, a.dtype) for a in arrays]
    _take(arrays, order, 0, size, out)
    return out
