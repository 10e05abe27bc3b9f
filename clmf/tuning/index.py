"""A persistent index of each tuning database as the lookup reads it (its "best" records, and its
measurements reduced to the keys of the computed default), keyed by the file's path, size and
modification time: a lookup in a new process reads a small file instead of parsing every full
record of a database that grows with each tuning run.

The index lives in ``$CLMF_CACHE_DIR`` (default ``$XDG_CACHE_HOME/clmf`` or ``~/.cache/clmf``);
a missing, stale or unreadable index is rebuilt from :func:`~clmf.tuning.database.read_database`
(which also reports a corrupted file), and a cache that cannot be written is only skipped.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import threading

from ..cache import cache_dir
from .database import read_database
from .schema import SCHEMA_VERSION

log = logging.getLogger(__name__)

__all__ = ["best_records"]

_memo: dict = {}
_lock = threading.Lock()


_MEASUREMENT_KEYS = ("kind", "status", "side", "mode", "f", "run_id", "config", "seconds")


def _slim(r):
    """A record as the lookup reads it: "best" records whole, measurements with only the keys
    of the computed default (and their device's type)."""
    if r.get("kind") == "best":
        return r
    out = {k: r[k] for k in _MEASUREMENT_KEYS if k in r}
    dev = r.get("device")
    out["device"] = {"type": dev.get("type")} if isinstance(dev, dict) else dev
    return out


def best_records(path):
    """The records of the database at ``path`` the lookup reads (see :func:`_slim`; a list, the
    same object until the file changes), or None when the file is unusable (``read_database``
    warns about it)."""
    path = pathlib.Path(path)
    try:
        st = path.stat()
    except OSError:
        return []
    stamp = (st.st_mtime_ns, st.st_size)
    with _lock:
        hit = _memo.get(str(path))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    where = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    version = hashlib.sha256(f"{stamp[0]}|{stamp[1]}|{SCHEMA_VERSION}".encode()).hexdigest()[:16]
    index = cache_dir() / f"tuning-index-{where}-{version}.json"
    best = None
    try:
        doc = json.loads(index.read_text())
        if doc.get("path") == str(path.resolve()) and doc.get("stamp") == list(stamp):
            best = doc["best"]
    except (OSError, ValueError, KeyError, TypeError):
        best = None
    if best is None:
        recs = read_database(path)
        if recs is None:             # unusable: not indexed, read_database warned
            return None
        best = [_slim(r) for r in recs if r.get("kind") in ("best", "measurement")]
        try:
            index.parent.mkdir(parents=True, exist_ok=True)
            tmp = index.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"path": str(path.resolve()), "stamp": list(stamp),
                                       "best": best}))
            os.replace(tmp, index)
            for old in index.parent.glob(f"tuning-index-{where}-*.json"):
                if old != index:                  # earlier versions of the same file
                    old.unlink(missing_ok=True)
        except OSError as e:
            log.debug("tuning index %s not written: %s", index, e)
    with _lock:
        _memo[str(path)] = (stamp, best)
    return best
