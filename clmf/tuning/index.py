"""A persistent index of each tuning database as the lookup reads it: its "best" records, and
apart (read only when a lookup reaches the computed default) its measurements reduced to the keys
that rung reads; keyed by the file's path, size and modification time, so that a lookup in a new
process reads a small file instead of parsing every record of a database that grows with each
tuning run.

The index lives in ``$CLMF_CACHE_DIR`` (default ``$XDG_CACHE_HOME/clmf`` or ``~/.cache/clmf``)
and is read and written only through :mod:`clmf.cache` (no links, pipes or devices, bounded
size, exclusive temporary files); a missing, stale, unreadable or refused index is rebuilt from
:func:`~clmf.tuning.database.read_database` (which also reports a corrupted file), and a cache
that cannot be written is only skipped.
"""
from __future__ import annotations

import hashlib
import json
import logging
import pathlib
import threading

from ..cache import MAX_BYTES, cache_dir, read_json, write_atomic
from .database import is_gzip, read_database
from .schema import SCHEMA_VERSION

log = logging.getLogger(__name__)

__all__ = ["best_records", "measurement_records", "model_records"]

_memo: dict = {}
_lock = threading.Lock()


_INDEX_FORMAT = 7              # 2: "topk" records kept beside "best" ones; 3: ok measurements'
                               # whole device keys (they verify a configuration on that device);
                               # 4: their storage, date and data-set shape (the selection model's);
                               # 5: the selection model's own index; 6: the sampled rows/ratings;
                               # 7: wrong measurements (whole device keys) in the model's index
_MEASUREMENT_KEYS = ("kind", "status", "side", "mode", "f", "run_id", "config", "seconds",
                     "storage", "date")
_DEVICE_KEYS = ("platform", "vendor", "type", "device", "driver")


def _slim(r):
    """A record as the lookup reads it: "best" records whole, measurements with only the keys
    of the computed default and their device's type, or, for a measurement that ran (status
    ok), its device's whole key (the probe of :mod:`clmf.tuning.fallback` skips configurations
    that ran on this device and driver) and its data set's shape (the selection model's)."""
    if r.get("kind") == "best":
        return r
    out = {k: r[k] for k in _MEASUREMENT_KEYS if k in r}
    if r.get("status") == "ok":
        from .model import shape_fields
        out.update(shape_fields(r))
    dev = r.get("device")
    # (a wrong one's too: the selection model refuses it on that device, model.refuted)
    keys = _DEVICE_KEYS if r.get("status") in ("ok", "wrong") else ("type",)
    out["device"] = {k: dev[k] for k in keys if k in dev} if isinstance(dev, dict) else dev
    return out


def _paths(path, stamp):
    """(best index, measurement index, the selection model's index, prefix of every version's
    files) of a database."""
    where = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    version = hashlib.sha256(f"{stamp[0]}|{stamp[1]}|{SCHEMA_VERSION}|{_INDEX_FORMAT}"
                             .encode()).hexdigest()[:16]
    d = cache_dir()
    return (d / f"tuning-index-{where}-{version}.json",
            d / f"tuning-index-{where}-{version}-m.json",
            d / f"tuning-index-{where}-{version}-g.json", f"tuning-index-{where}-")


def _stamp(path):
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _read_index(index, path, stamp):
    """The records of one index file, or None when missing, stale or refused (an index is at
    most about twice its database's size, decompressed: gzip shrinks tuning records ~12×)."""
    grow = 32 if is_gzip(path) else 2
    doc = read_json(index, limit=max(MAX_BYTES, grow * stamp[1] + (1 << 20)))
    try:
        if doc.get("path") == str(path.resolve()) and doc.get("stamp") == list(stamp):
            recs = doc["records"]
            return recs if isinstance(recs, list) else None
    except (AttributeError, OSError, KeyError, TypeError):
        pass
    return None


def _build(path, stamp):
    """Both indexes of ``path`` from the full database: (best, measurements) or None."""
    recs = read_database(path)
    if recs is None:                 # unusable: not indexed, read_database warned
        return None
    # the ALS lookup's "best" records and the top-k kernels' "topk" records (each reader keeps
    # its own kind)
    best = [r for r in recs if r.get("kind") in ("best", "topk")]
    meas = [_slim(r) for r in recs if r.get("kind") == "measurement"]
    from .model import top_records, wrong_record
    model = [r for top in top_records(meas).values() for r in top] \
        + [r for r in meas if wrong_record(r)]
    b_idx, m_idx, g_idx, prefix = _paths(path, stamp)
    written = all([write_atomic(index, json.dumps({"path": str(path.resolve()),
                                                  "stamp": list(stamp), "records": part}))
                   for index, part in ((m_idx, meas), (g_idx, model), (b_idx, best))])
    try:
        for old in b_idx.parent.glob(prefix + "*.json") if written else ():
            if old not in (b_idx, m_idx, g_idx):   # earlier versions of the same file
                old.unlink(missing_ok=True)        # (a link is removed, never followed)
    except OSError as e:
        log.debug("old tuning indexes beside %s not removed: %s", b_idx, e)
    return best, meas, model


_reading: dict = {}        # path -> lock held while one thread reads or builds its indexes


def _records(path, which):
    """The ``which`` (0: best, 1: measurements, 2: the selection model's) records of ``path``
    (memoized per version; a thread asking while another reads or builds the same database's
    indexes waits for it: a warm-up and a fit would otherwise parse it twice)."""
    path = pathlib.Path(path)
    stamp = _stamp(path)
    if stamp is None:
        return []
    key = (str(path), which)
    with _lock:
        hit = _memo.get(key)
        reading = _reading.setdefault(str(path), threading.Lock())
    if hit is not None and hit[0] == stamp:
        return hit[1]
    with reading:
        return _records_read(path, which, stamp, key)


def _records_read(path, which, stamp, key):
    """:func:`_records` past the memo, one thread per database at a time."""
    with _lock:
        hit = _memo.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]               # read by the thread this one waited for
    recs = _read_index(_paths(path, stamp)[which], path, stamp)
    if recs is None:
        built = _build(path, stamp)
        if built is None:
            return None
        with _lock:                 # all three parts: each was built
            for k, part in enumerate(built):
                _memo[(str(path), k)] = (stamp, part)
        return built[which]
    with _lock:
        _memo[key] = (stamp, recs)
    return recs


def best_records(path):
    """The "best" records of the database at ``path`` (a list, the same object until the file
    changes), or None when the file is unusable (``read_database`` warns about it)."""
    return _records(path, 0)


def measurement_records(path):
    """The database's measurements reduced to what the computed default reads (see
    :func:`_slim`; read only when a lookup reaches that rung), or None when it is unusable."""
    return _records(path, 1)


def model_records(path):
    """The measurements the selection model reads (:func:`clmf.tuning.model.top_records`: per
    run and side the fastest record of each of its fastest configurations, slim; and the
    measurements of status wrong, :func:`clmf.tuning.model.refuted`), or None when the database
    is unusable: a much smaller index than every measurement's."""
    return _records(path, 2)
