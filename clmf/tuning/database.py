"""Tuning databases on disk: where they are, reading them (cached by mtime) and writing them.

Databases are JSON Lines files (one record per line, each with ``schema_version``). They are
searched in this order (:func:`database_paths`):

1. ``$CLMF_TUNING_DB`` — a file or a directory of ``*.jsonl`` files (several joined with ``:``);
2. the per-user database, ``platformdirs.user_data_dir("clmf")/tuning.jsonl`` (``clmf tune``
   writes there by default);
3. the shipped tunings (:func:`shipped_paths`): ``results/tuning/*.jsonl`` of the source tree,
   installed as package data ``clmf/tuning/shipped``; ``CLMF_TUNING_NO_SHIPPED=1`` leaves them
   out.

A corrupted or foreign-schema file is reported (``logging`` and ``warnings.warn``) and skipped as a
whole; the file is never modified. Parsed files are cached by (mtime, size), so a lookup costs a
``stat`` per file. :class:`Database` appends records (the tuner writes through it).
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import pathlib
import threading
import warnings

import numpy as np

from .._version import __version__
from ..provenance import commit
from .schema import ENV_DB, ENV_NO_SHIPPED, SCHEMA_VERSION, TuningDatabaseWarning

log = logging.getLogger(__name__)


# ----- where the databases are -------------------------------------------------------------------
def user_db_path():
    """The per-user database ``clmf tune`` writes by default."""
    import platformdirs
    return pathlib.Path(platformdirs.user_data_dir("clmf")) / "tuning.jsonl"


def _jsonl_in(p):
    p = pathlib.Path(p)
    if p.is_dir():
        return sorted(x for x in p.glob("*.jsonl") if x.is_file())
    return [p]


def shipped_paths():
    """The tuning files shipped with clmf: package data ``clmf/tuning/shipped/*.jsonl`` of an
    installed wheel, else ``results/tuning/*.jsonl`` of a source checkout.

    The one place that knows where shipped tunings live.
    """
    if os.environ.get(ENV_NO_SHIPPED, "").strip() not in ("", "0"):
        return []
    out = []
    try:
        import importlib.resources as res
        root = res.files("clmf.tuning.shipped")
        for e in sorted(root.iterdir(), key=lambda e: e.name):
            if e.name.endswith(".jsonl") and e.is_file():
                out.append(pathlib.Path(str(e)))
    except (ImportError, ModuleNotFoundError, OSError, TypeError):
        pass
    if not out:      # a source checkout: results/tuning next to the clmf package
        here = pathlib.Path(__file__).resolve().parents[2] / "results" / "tuning"
        if here.is_dir():
            out = sorted(here.glob("*.jsonl"))
    return out


def database_paths():
    """[(origin, path)] in search order: $CLMF_TUNING_DB, the per-user database, the shipped
    files. Missing paths are left out."""
    out = []
    env = os.environ.get(ENV_DB, "")
    for part in filter(None, (x.strip() for x in env.split(os.pathsep))):
        out += [("env", p) for p in _jsonl_in(part)]
    try:
        out.append(("user", user_db_path()))
    except Exception as e:  # pragma: no cover - platformdirs missing/broken
        log.debug("no per-user tuning database: %s", e)
    out += [("shipped", p) for p in shipped_paths()]
    seen, uniq = set(), []
    for origin, p in out:
        key = os.path.abspath(p)
        if key not in seen and os.path.isfile(p):
            seen.add(key)
            uniq.append((origin, pathlib.Path(p)))
    return uniq


# ----- reading (cached by mtime) -----------------------------------------------------------------
_cache: dict = {}
_warned: set = set()
_clock = threading.Lock()


def _warn(path, stamp, msg):
    key = (str(path), stamp)
    if key in _warned:
        return
    _warned.add(key)
    full = f"tuning database {path} is not used: {msg} (the file is left untouched; clmf falls " \
           "back to the next source and the untuned defaults)"
    log.warning(full)
    warnings.warn(full, TuningDatabaseWarning, stacklevel=4)


def read_database(path, strict=False):
    """The records of one JSON Lines database, or ``None`` (with a warning) when the file is
    corrupted, of a foreign schema or unreadable. ``strict=True`` raises ``ValueError`` instead
    (the tuner uses it before appending)."""
    path = pathlib.Path(path)
    try:
        st = path.stat()
    except OSError:
        return [] if not strict else []
    stamp = (st.st_mtime_ns, st.st_size)
    with _clock:
        hit = _cache.get(str(path))
    if hit is not None and hit[0] == stamp:
        if hit[2] is not None:
            if strict:
                raise ValueError(f"tuning database {path}: {hit[2]}")
            _warn(path, stamp, hit[2])
        return hit[1]
    recs, err = [], None
    try:
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                line = raw.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except (ValueError, UnicodeDecodeError) as e:
                    err = f"line {lineno} is not valid JSON ({e})"
                    break
                if not isinstance(r, dict):
                    err = f"line {lineno} is not a JSON object"
                    break
                v = r.get("schema_version")
                if v != SCHEMA_VERSION:
                    err = (f"line {lineno} has schema_version {v!r}; this clmf reads "
                           f"schema_version {SCHEMA_VERSION}")
                    break
                recs.append(r)
    except OSError as e:
        err = f"cannot read it ({e})"
    if err is not None:
        if strict:
            raise ValueError(f"tuning database {path}: {err}")
        _warn(path, stamp, err)
        recs = None
    with _clock:
        _cache[str(path)] = (stamp, recs, err)
    return recs


# ----- writing (the tuner writes through Database) ----------------------------------------------
def now():
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def clmf_commit():
    """The commit of the clmf sources in use (see :func:`clmf.provenance.commit`)."""
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
    """A record of ``kind`` with the common keys (schema version, date, commit, clmf version)."""
    r = {"schema_version": SCHEMA_VERSION, "kind": kind, "date": now(),
         "commit": clmf_commit(), "clmf_version": __version__}
    r.update(fields)
    return _jsonable(r)


class Database:
    """One JSON Lines tuning database file.

    ``append`` writes all its records with a single ``write`` on an ``O_APPEND`` descriptor while
    holding an exclusive ``fcntl.flock`` on the file, then ``fsync``s: concurrent writers (other
    processes, other threads) never interleave or tear lines. Before the first append the file is
    checked: a corrupted or foreign-schema file is refused (``ValueError``), never modified.
    """

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self._checked = False

    def _check(self):
        if self._checked or not self.path.exists() or self.path.stat().st_size == 0:
            self._checked = True
            return
        read_database(self.path, strict=True)
        self._checked = True

    def append(self, records):
        """Append one record (a dict) or a list of records, atomically under a file lock."""
        if isinstance(records, dict):
            records = [records]
        if not records:
            return
        import fcntl  # POSIX only; imported here so that reading works everywhere

        self._check()
        data = "".join(json.dumps(_jsonable(r), sort_keys=True, separators=(",", ":")) + "\n"
                       for r in records).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                # a torn tail (a writer killed mid-line before this scheme) must not glue lines
                size = os.fstat(fd).st_size
                if size:
                    with open(self.path, "rb") as fh:
                        fh.seek(size - 1)
                        if fh.read(1) != b"\n":
                            data = b"\n" + data
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
        return list(read_database(self.path, strict=True))
