"""Data preparation for a :mod:`clmf.dask` fit, in any worker (issue 15): distinct ids, their
encoding and tallies, the ratings split into the owners' pieces (through shared-memory segments
where the workers share a host), the set-up's shared-memory probes and the held-out split. The
tasks of a fit's blocks and device worker are :mod:`clmf.parallel.dask_tasks`, which re-exports
these for the client (:mod:`clmf.parallel.dask_backend`)."""
from __future__ import annotations

import concurrent.futures
import logging
import os

import numpy as np

from . import shared_blocks as shm

log = logging.getLogger(__name__)

GATHER_THREADS_FROM = 1 << 20     # entries from which a block's gathers run in threads


# ----- data preparation (any worker) ------------------------------------------------------
def unique_ids(df, column):
    """The distinct values of one column of a partition (a NumPy array)."""
    import pandas as pd
    return pd.unique(df[column].to_numpy())


def union_ids(*parts):
    """The distinct values of several partitions' distinct values."""
    import pandas as pd
    if not parts:
        return np.zeros(0)
    return pd.unique(np.concatenate([np.asarray(p) for p in parts]))


def encode(df, columns, user_index, item_index, shift=0.0):
    """A partition's ``(users, items, ratings)`` as int32 dense indices (-1: an id not in the
    training maps) and float32 values plus ``shift`` (the kernels' view of implicit
    ``confidence="alpha*r"``); ``*_index`` None: the column holds indices already."""
    from ..data.frames import check_columns
    ucol, icol, rcol = check_columns(df, columns)
    out = []
    for col, index in ((ucol, user_index), (icol, item_index)):
        vals = df[col].to_numpy()
        if index is None:
            codes = np.asarray(vals, dtype=np.int64)
        else:
            codes = _codes(index, vals)
        out.append(codes.astype(np.int32))
    r = df[rcol].to_numpy(dtype=np.float64 if shift else np.float32)
    if shift:
        r = (r + shift).astype(np.float32)
    return out[0], out[1], r


def _codes(index, vals):
    """Dense indices of the raw ids ``vals`` in ``index`` (-1: not in it); a
    :class:`pandas.RangeIndex` of step 1 over integer ids (:func:`~clmf.parallel.dask_backend.
    _encoder`) by a subtraction and a range check, several times faster than its
    ``get_indexer``."""
    import pandas as pd
    if not (isinstance(index, pd.RangeIndex) and index.step == 1
            and getattr(vals, "dtype", np.dtype(object)).kind in "iu"):
        return index.get_indexer(vals)
    codes = np.subtract(vals, index.start, dtype=np.int64)
    bad = (codes < 0) | (codes >= len(index))
    if bad.any():
        codes[bad] = -1
    return codes


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
            np.bincount(i, minlength=n).astype(np.int64),
            float(r.astype(np.float64).sum()), float(r.min()) if r.size else np.inf,
            int((~np.isfinite(r)).sum()), float(r.max()) if r.size else -np.inf)


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


def split(codes, bounds_u, bounds_i, prefix=None, shared=False, owners=None):
    """A partition's triples split by owning worker: ``2n`` triples, first by the users' blocks
    then by the items' blocks (unknown ids, -1, are dropped); each worker's triples keep their
    order in the partition. ``shared`` (the workers share a host: :func:`setup_check`): each
    triple for another worker than this one (``owners``: the workers' addresses) is written
    into a shared-memory segment named ``prefix-...`` (gathered straight into it) and its
    handles returned instead (:func:`clmf.parallel.shared_blocks.share_arrays`; the arrays
    where there is no room), which the owner reads and unlinks (:func:`blocks`)."""
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
    """``out[k][...] = arrays[k][order[a:b]]`` (``order`` None: ``arrays[k][a:b]``), each array
    in a thread of its own where there are :data:`GATHER_THREADS_FROM` entries or more (NumPy
    releases the GIL: a worker's cores gather its pieces and blocks together)."""
    def one(k):
        """Array ``k``."""
        if order is None:
            np.copyto(out[k], arrays[k][a:b])
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
    side already in owner order), one order array per side."""
    u, i, r = codes
    ok = (u >= 0) & (i >= 0)
    if not ok.all():
        u, i, r = u[ok], i[ok], r[ok]
    out = []
    for key, bounds in ((u, bounds_u), (i, bounds_i)):
        n = len(bounds) - 1
        owner = (np.searchsorted(bounds, key, side="right") - 1).astype(np.int32)
        if len(owner) < 2 or bool(np.all(owner[1:] >= owner[:-1])):
            cuts = np.searchsorted(owner, np.arange(n + 1))        # already in owner order
            out += [(None, a, b) for a, b in zip(cuts[:-1], cuts[1:])]
            continue
        order = stable_order(owner, n)
        cuts = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(owner, minlength=n), out=cuts[1:])
        out += [(order, a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    return (u, i, r), out


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
    """``[a[order] for a in arrays]`` (in threads where long: :func:`_take`)."""
    out = [np.empty(len(order), a.dtype) for a in arrays]
    _take(arrays, order, 0, len(order), out)
    return out
