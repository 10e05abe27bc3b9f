"""Tuning databases on disk: where they are, reading them (cached by mtime) and writing them.

Databases are JSON Lines files (one record per line, each with ``schema_version``), plain or
gzip-compressed (``*.jsonl.gz``, as the raw records of ``results/tuning``; see below). They are
searched in this order (:func:`database_paths`):

1. ``$CLMF_TUNING_DB`` — a file or a directory of ``*.jsonl`` and ``*.jsonl.gz`` files (several
   joined with ``:``);
2. the per-user database, ``platformdirs.user_data_dir("clmf")/tuning.jsonl`` (``clmf tune``
   writes there by default);
3. the shipped tunings (:func:`shipped_paths`): ``results/tuning/shipped/*.jsonl`` of the source
   tree (distilled from the raw ``results/tuning/*.jsonl.gz`` by :mod:`clmf.autotune.distill`),
   installed as package data ``clmf/tuning/shipped``; ``CLMF_TUNING_NO_SHIPPED=1`` leaves them
   out.

Records are untrusted input (:func:`clmf.tuning.schema.check_record`): a line that is not JSON,
of a foreign schema, or whose fields fail the checks is reported (``logging`` and
``warnings.warn``, naming the file and line) and skipped alone; the rest of the file serves. The
reader never modifies a file; the writer repairs only a torn last line. Parsed files are cached
by (mtime, size), so a lookup costs a ``stat`` per file. :class:`Database` appends records (the
tuner writes through it).

A gzip database (a file that starts with the gzip magic, or a new one named ``*.gz``) is a
sequence of gzip members, which gzip and Python's :mod:`gzip` read as one stream: each append
writes one member, with the same lock, single ``write`` and ``fsync`` as a plain append, so a
writer killed mid-append leaves a member cut short, which readers skip (with a warning) and the
next append truncates away, as a torn last line of a plain file. Members of a few records
compress poorly, so :meth:`Database.compact` rewrites the file as one member (the tuner does at
the end of each run); an append that raced with it retries on the new file.
"""
from __future__ import annotations

import datetime
import gzip
import io
import json
import logging
import os
import pathlib
import tempfile
import threading
import warnings
import zlib

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
    """The database files a ``$CLMF_TUNING_DB`` entry names: the file, or a directory's
    ``*.jsonl`` and ``*.jsonl.gz`` files."""
    p = pathlib.Path(p)
    if p.is_dir():
        return sorted(x for pat in ("*.jsonl", "*.jsonl.gz") for x in p.glob(pat) if x.is_file())
    return [p]


def shipped_paths():
    """The tuning files shipped with clmf: package data ``clmf/tuning/shipped/*.jsonl`` of an
    installed wheel, else ``results/tuning/shipped/*.jsonl`` of a source checkout (the compact
    databases :mod:`clmf.autotune.distill` writes from the raw ``results/tuning/*.jsonl.gz``).

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
    if not out:      # a source checkout: results/tuning/shipped next to the clmf package
        here = pathlib.Path(__file__).resolve().parents[2] / "results" / "tuning" / "shipped"
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


def _warn(path, stamp, msg, whole=True):
    key = (str(path), stamp, whole)
    if key in _warned:
        return
    _warned.add(key)
    if whole:
        full = f"tuning database {path} is not used: {msg} (the file is left untouched; clmf " \
               "falls back to the next source and the untuned defaults)"
    else:
        full = f"tuning database {path}: {msg}"
    log.warning(full)
    warnings.warn(full, TuningDatabaseWarning, stacklevel=4)


def _parse_lines(fh, path):
    """(records, skipped, fatal) of an open JSON Lines file: ``skipped`` lists (line, reason,
    torn) of the records left out one by one (``torn``: the last line, cut short by a writer that
    died); ``fatal`` is the first problem that makes the file foreign to a writer (not JSON, not
    an object, another schema) on a line other than a torn tail."""
    from .schema import RecordError, check_record
    recs, skipped, fatal = [], [], None
    for lineno, raw in enumerate(fh, 1):
        line = raw.strip()
        if not line:
            continue
        torn = not raw.endswith(b"\n")
        try:
            r = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            why = f"not valid JSON ({str(e)[:80]})"
            skipped.append((lineno, why, torn))
            if not torn and fatal is None:
                fatal = f"line {lineno} is {why}"
            continue
        if not isinstance(r, dict):
            skipped.append((lineno, "not a JSON object", torn))
            if not torn and fatal is None:
                fatal = f"line {lineno} is not a JSON object"
            continue
        v = r.get("schema_version")
        if v != SCHEMA_VERSION or type(v) is not int:
            why = f"schema_version {v!r}; this clmf reads schema_version {SCHEMA_VERSION}"
            skipped.append((lineno, why, torn))
            if fatal is None:
                fatal = f"line {lineno} has {why}"
            continue
        try:
            check_record(r)
        except RecordError as e:
            skipped.append((lineno, f"record skipped: {e}", torn))
            continue
        recs.append(r)
    return recs, skipped, fatal


GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 16


def is_gzip(path):
    """Whether the database ``path`` is gzip: its first bytes are gzip's magic, or (a missing or
    empty file) its name ends with ``.gz``."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
    except OSError:
        head = b""
    return head == GZIP_MAGIC if head else str(path).endswith(".gz")


def gzip_members(fh, start=0):
    """(data, end, torn, error) of the gzip members in the binary file ``fh`` from offset
    ``start``: the decompressed bytes of the complete members, the offset where the last complete
    one ends, the bytes after it of a member cut short (0: none) and the problem of bytes that
    are not gzip (None: none; ``data``/``end`` then stop before them)."""
    fh.seek(start)
    out, member, d = [], [], None
    end = pos = start
    while chunk := fh.read(_CHUNK):
        while chunk:
            if d is None:
                d, member = zlib.decompressobj(wbits=31), []
            try:
                member.append(d.decompress(chunk))
            except zlib.error as e:
                return b"".join(out), end, 0, f"not gzip data after byte {end} ({e})"
            if not d.eof:
                pos += len(chunk)
                break
            rest = d.unused_data
            pos += len(chunk) - len(rest)
            out += member
            end, d, chunk = pos, None, rest
    return b"".join(out), end, pos - end, None


def records_bytes(path):
    """The JSON Lines bytes of the database file ``path``, decompressed when it is gzip (raises
    :class:`OSError`, or :class:`EOFError` for a gzip member cut short)."""
    data = pathlib.Path(path).read_bytes()
    return gzip.decompress(data) if data[:2] == GZIP_MAGIC else data


def _read_file(path):
    """(records, skipped, fatal) of one database file, plain or gzip (see :func:`_parse_lines`;
    a gzip member cut short is skipped as a torn tail, bytes that are not gzip are fatal)."""
    with open(path, "rb") as fh:
        if fh.read(2) != GZIP_MAGIC:
            fh.seek(0)
            return _parse_lines(fh, path)
        data, _end, torn, error = gzip_members(fh)
    recs, skipped, fatal = _parse_lines(io.BytesIO(data), path)
    after = data.count(b"\n") + 1
    if error is not None:
        skipped.append((after, error, False))
        fatal = fatal or f"line {after} is {error}"
    if torn:
        skipped.append((after, f"a gzip member cut short ({torn} bytes)", True))
    return recs, skipped, fatal


def read_database(path, strict=False):
    """The usable records of one JSON Lines database, or ``None`` (with a warning) when the file
    cannot be read.

    Records are untrusted input: a line that is not JSON, of another schema, or whose fields fail
    :func:`clmf.tuning.schema.check_record` is skipped alone, with one warning per file naming
    the file and the lines; the other records serve. ``strict=True`` (the tuner, before it
    appends) raises ``ValueError`` for a file it must not write to — a line that is not JSON or
    of another schema, anywhere but a torn last line (which :meth:`Database.append`
    repairs) — and otherwise returns the usable records too."""
    path = pathlib.Path(path)
    try:
        st = path.stat()
    except OSError:
        return []
    stamp = (st.st_mtime_ns, st.st_size)
    with _clock:
        hit = _cache.get(str(path))
    if hit is None or hit[0] != stamp:
        recs, skipped, fatal, err = None, [], None, None
        try:
            recs, skipped, fatal = _read_file(path)
        except OSError as e:
            err = f"cannot read it ({e})"
        hit = (stamp, recs, err, skipped, fatal)
        with _clock:
            _cache[str(path)] = hit
    _, recs, err, skipped, fatal = hit
    if err is not None:
        if strict:
            raise ValueError(f"tuning database {path}: {err}")
        _warn(path, stamp, err)
        return None
    if strict and fatal is not None:
        raise ValueError(f"tuning database {path}: {fatal}; clmf does not append to it")
    if skipped:
        first = "; ".join(f"line {n}: {why}" + (" (a torn last line)" if torn else "")
                          for n, why, torn in skipped[:5])
        more = f" (and {len(skipped) - 5} more)" if len(skipped) > 5 else ""
        _warn(path, stamp, f"{len(skipped)} record(s) skipped, {len(recs)} used — {first}{more}",
              whole=False)
    return recs


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


def _same_file(fd, path):
    """Whether the open descriptor ``fd`` is still the file at ``path`` (not replaced, e.g. by
    :meth:`Database.compact`, since it was opened)."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class Database:
    """One JSON Lines tuning database file, plain or gzip (``*.gz``: one member per append).

    ``append`` writes all its records with a single ``write`` on an ``O_APPEND`` descriptor while
    holding an exclusive ``fcntl.flock`` on the file, then ``fsync``s: concurrent writers (other
    processes, other threads) never interleave or tear lines. Before the first append the file is
    checked: a corrupted or foreign-schema file is refused (``ValueError``), never modified; the
    one repair made is to a torn last line or gzip member (a writer killed mid-write), which is
    dropped.
    """

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self._checked = False
        self._gzip_checked = None     # ((dev, inode), size) up to which the members are whole

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
        gz = is_gzip(self.path)
        if gz:
            data = gzip.compress(data, compresslevel=9, mtime=0)     # one member
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    if not _same_file(fd, self.path):     # compacted meanwhile: the new file
                        continue
                    # a torn tail (a writer killed mid-line, a full disk) is repaired: the
                    # cut-short record or member is dropped (it cannot be completed) so that lines
                    # never glue together
                    if gz:
                        self._repair_gzip_tail(fd)
                    else:
                        _repair_tail(fd, self.path)
                    view = memoryview(data)
                    while view:
                        n = os.write(fd, view)
                        view = view[n:]
                    os.fsync(fd)
                    if gz:
                        st = os.fstat(fd)
                        self._gzip_checked = ((st.st_dev, st.st_ino), st.st_size)
                    return
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def _repair_gzip_tail(self, fd):
        """Truncate a gzip member cut short at the end of the file (the caller holds its lock);
        the members this object checked or wrote before are not read again, unless what follows
        them is not whole (the file may be another one on a reused inode): then all are."""
        st = os.fstat(fd)
        start = 0
        if self._gzip_checked is not None:
            ident, size = self._gzip_checked
            if ident == (st.st_dev, st.st_ino) and size <= st.st_size:
                start = size
        if start == st.st_size:
            return
        with open(self.path, "rb") as fh:
            _data, end, torn, error = gzip_members(fh, start)
            if start and (torn or error is not None):     # nothing is cut on a guess
                _data, end, torn, error = gzip_members(fh, 0)
        if error is not None:
            raise ValueError(f"tuning database {self.path}: {error}; clmf does not append to it")
        if torn:
            os.ftruncate(fd, end)
            log.warning("tuning database %s: dropped a gzip member cut short (%d bytes, a "
                        "writer died while writing it)", self.path, torn)
        self._gzip_checked = ((st.st_dev, st.st_ino), end)

    def compact(self):
        """Rewrite a gzip database as one gzip member (all its records, the same bytes when
        decompressed, but for a member cut short at the end, which is dropped), atomically
        (a temporary file renamed over it) under the file's lock; a plain file is left as it is.
        Returns the bytes saved."""
        import fcntl

        if not self.path.is_file() or not is_gzip(self.path):
            return 0
        fd = os.open(self.path, os.O_RDONLY)
        tmp = None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if not _same_file(fd, self.path):      # another process compacted it
                    return 0
                with open(self.path, "rb") as fh:
                    data, end, torn, error = gzip_members(fh)
                if error is not None:
                    raise ValueError(f"tuning database {self.path}: {error}; clmf does not "
                                     "rewrite it")
                packed = gzip.compress(data, compresslevel=9, mtime=0)
                size = os.fstat(fd).st_size
                if len(packed) >= size:
                    return 0
                tfd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                            dir=self.path.parent)
                with os.fdopen(tfd, "wb") as fh:
                    fh.write(packed)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.chmod(tmp, os.fstat(fd).st_mode & 0o777)
                os.replace(tmp, self.path)
                tmp = None
                if torn:
                    log.warning("tuning database %s: dropped a gzip member cut short (%d bytes)",
                                self.path, torn)
                return size - len(packed)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            if tmp is not None:
                os.unlink(tmp)

    def records(self):
        """All records (raises ``ValueError`` on a corrupted or foreign-schema file)."""
        if not self.path.exists():
            return []
        return list(read_database(self.path, strict=True))
