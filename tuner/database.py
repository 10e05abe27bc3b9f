"""Writing tuning databases: JSON Lines, one record per line, atomic appends under a file lock.

Every record has ``schema_version`` (:data:`clmf.tuning.SCHEMA_VERSION`), ``kind``, ``date``
(UTC, ISO 8601), ``commit`` (the clmf source commit, ``+dirty`` when the tree had changes) and
``clmf_version``. Kinds:

``measurement``  one candidate on one side: ``status`` ok with ``seconds`` (estimated full
                 half-step, the median of ``raw`` sampled device times scaled to the side),
                 per-stage times, sample description, ``verify_rel_err``; or ``status``
                 invalid / wrong / failed with a typed ``reason`` (side "both"), which later runs
                 on the same device, driver, f, storage and kernel templates do not retry;
``best``         the chosen configuration of one side for one tuning run (both sides share the
                 ``run_id``), with the baseline and untuned-default times of the same run;
``run``          the run's header: strategy, space, budget, sample, data set.

Records are keyed by the normalised device (platform, vendor, type, device name; the driver is
recorded), side, f, storage and the data-set class (:func:`clmf.tuning.dataset_class`).
The reader is :mod:`clmf.tuning` (which never writes); :meth:`Database.append` refuses to touch
a file that is corrupted or of a foreign schema.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import pathlib

import numpy as np

from clmf import tuning

__all__ = ["Database", "now", "clmf_commit", "base_record"]

log = logging.getLogger(__name__)


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def clmf_commit():
    """The commit of the clmf sources in use (see :func:`clmf.provenance.commit`)."""
    from clmf.provenance import commit
    return commit()


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        v = float(x)
        return v if np.isfinite(v) else None
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def base_record(kind, **fields):
    import clmf
    r = {"schema_version": tuning.SCHEMA_VERSION, "kind": kind, "date": now(),
         "commit": clmf_commit(), "clmf_version": getattr(clmf, "__version__", "?")}
    r.update(fields)
    return _jsonable(r)


def _repair_tail(fd, path):
    """Repair a file that does not end with a newline (the caller holds the file's lock): a last
    line that is a whole JSON record gets its newline, a cut-short one is truncated away.
    Returns the bytes dropped."""
    size = os.fstat(fd).st_size
    if not size:
        return 0
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        pos, chunk = size, 1 << 16
        while pos > 0:
            start = max(0, pos - chunk)
            fh.seek(start)
            block = fh.read(pos - start)
            i = block.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        else:
            keep = 0
        fh.seek(keep)
        tail = fh.read()
    try:
        if isinstance(json.loads(tail), dict):
            os.write(fd, b"\n")            # a whole record that lacks only its newline
            return 0
    except (ValueError, UnicodeDecodeError, RecursionError):
        pass
    os.ftruncate(fd, keep)
    log.warning("tuning database %s: dropped a torn last line (%d bytes, a writer died while "
                "writing it)", path, size - keep)
    return size - keep


class Database:
    """One JSON Lines tuning database file.

    ``append`` writes all its records with a single ``write`` on an ``O_APPEND`` descriptor while
    holding an exclusive ``fcntl.flock`` on the file, then ``fsync``s: concurrent writers (other
    processes, other threads) never interleave or tear lines. Before the first append the file is
        checked: a corrupted or foreign-schema file is refused (``ValueError``), never modified; the
    one repair made is to a torn last line (a writer killed mid-line), which is dropped.
    """

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self._checked = False

    def _check(self):
        if self._checked or not self.path.exists() or self.path.stat().st_size == 0:
            self._checked = True
            return
        tuning.read_database(self.path, strict=True)
        self._checked = True

    def append(self, records):
        if isinstance(records, dict):
            records = [records]
        if not records:
            return
        self._check()
        data = "".join(json.dumps(_jsonable(r), sort_keys=True, separators=(",", ":")) + "\n"
                       for r in records).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                # a torn tail (a writer killed mid-line, a full disk) is repaired: the cut-short
                # record is dropped (it cannot be completed) so that lines never glue together
                _repair_tail(fd, self.path)
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def records(self):
        """All records (raises ``ValueError`` on a corrupted or foreign-schema file)."""
        if not self.path.exists():
            return []
        return list(tuning.read_database(self.path, strict=True))
