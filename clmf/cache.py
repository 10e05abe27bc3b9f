"""Where clmf keeps its on-disk caches (tuning indexes, probe verdicts, tuning journals), and the
only way the library reads and writes files there.

A cache file is untrusted input: another of the user's processes, or anyone who can write a
shared ``$CLMF_CACHE_DIR``, may have put it there. So no cache holds anything that is executed
or unpickled (the kernel templates are compiled in the process only, see
:mod:`clmf.engine.kernels`), and every file is

* opened without following a symbolic link and without blocking (a named pipe would hang the
  reader), then required to be a regular file of bounded size (a link to ``/dev/zero`` would
  grow memory without bound);
* written through a temporary file created exclusively, with a random name, in the same
  directory (:func:`tempfile.mkstemp`), which then replaces it (:func:`os.replace`).

A file that fails these checks is refused with one :class:`CacheWarning` and the cache is
bypassed (read as missing, not written); a cache that cannot be read or written is only logged:
a cache never breaks or hangs a fit.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import pathlib
import stat
import tempfile
import threading
import warnings

from .interrupts import deferred_interrupts

log = logging.getLogger(__name__)

__all__ = ["cache_dir", "CacheWarning", "MAX_BYTES", "read_bytes", "read_json", "open_lines",
           "write_atomic", "open_append"]

MAX_BYTES = 64 << 20            # default cap on a cache file read whole (bytes)

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_warned: set = set()
_lock = threading.Lock()


class CacheWarning(UserWarning):
    """A file in clmf's cache directory was refused (a link, a pipe, a device, too large); the
    cache was bypassed."""


def cache_dir():
    """Directory of clmf's on-disk caches: ``$CLMF_CACHE_DIR``, else the platform's user cache
    directory for clmf (``~/.cache/clmf`` on Linux). The one answer to "where is the cache"."""
    env = os.environ.get("CLMF_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    import platformdirs
    return pathlib.Path(platformdirs.user_cache_dir("clmf"))


def _kind(mode):
    """What a non-regular file is, in words."""
    return ("a symbolic link" if stat.S_ISLNK(mode) else
            "a directory" if stat.S_ISDIR(mode) else
            "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else
            "a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def _refuse(path, why):
    """Warn (once per file and reason in this process) that ``path`` is bypassed."""
    key = (str(path), why)
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    msg = f"clmf cache file {path} is {why}: refused, the cache is bypassed"
    log.info(msg)
    warnings.warn(msg, CacheWarning, stacklevel=3)


def _open(path, flags, create_mode=0o600, strict=False):
    """A file descriptor of ``path`` opened with ``flags`` (plus no-follow, non-blocking,
    close-on-exec) that is a regular file, or None (missing, refused or unreadable; with
    ``strict`` an error other than a refusal is raised)."""
    path = os.fspath(path)
    try:                     # a device is never opened (that alone may act: a tape, a tty)
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        if strict:
            raise
        log.debug("cache file %s not examined: %s", path, e)
        return None
    if st is not None and not stat.S_ISREG(st.st_mode):
        _refuse(path, _kind(st.st_mode))
        return None
    try:                     # and no-follow, non-blocking, fstat: it may change meanwhile
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, create_mode)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):        # O_NOFOLLOW met a link
            _refuse(path, "a symbolic link")
        elif e.errno == errno.ENXIO:                      # a FIFO without a reader, a socket
            _refuse(path, "a named pipe or a socket")
        elif strict:
            raise
        else:
            log.debug("cache file %s not opened: %s", path, e)
        return None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        log.debug("cache file %s not examined: %s", path, e)
        return None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        _refuse(path, _kind(st.st_mode))
        return None
    return fd


def read_bytes(path, limit=MAX_BYTES):
    """The contents of the regular file ``path``, or None when it is missing, unreadable or
    refused (a link, a pipe, a device, more than ``limit`` bytes)."""
    fd = _open(path, os.O_RDONLY)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as e:
            log.debug("cache file %s not read: %s", path, e)
            return None
    if len(data) > limit:
        _refuse(path, f"larger than {limit} bytes")
        return None
    return data


def read_json(path, limit=MAX_BYTES):
    """The JSON document in ``path`` (see :func:`read_bytes`), or None when it is missing,
    refused or not valid JSON (a torn or foreign file: only logged)."""
    data = read_bytes(path, limit)
    if data is None:
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        log.debug("cache file %s is not valid JSON: %s", path, e)
        return None


def read_json_object(path, limit=MAX_BYTES):
    """The JSON object in ``path`` as a dict: empty when it is missing, refused, torn or not an
    object (see :func:`read_json`)."""
    d = read_json(path, limit)
    return d if isinstance(d, dict) else {}


def update_json_object(path, key, value):
    """Set ``key`` of the JSON object in ``path`` to ``value`` (read, update, atomic replace
    through :func:`write_atomic`); returns whether it was written."""
    d = read_json_object(path)
    d[key] = value
    return write_atomic(path, json.dumps(d, indent=0, sort_keys=True))


def open_lines(path):
    """``path`` opened for reading text line by line (a journal), or None when it is missing,
    unreadable or refused (a link, a pipe, a device)."""
    fd = _open(path, os.O_RDONLY)
    return None if fd is None else os.fdopen(fd, encoding="utf-8", errors="replace")


def open_append(path):
    """``path`` opened for appending text, created (0600, its directory 0700) when missing, or
    None when it is refused (a link, a pipe, a device); an unwritable directory raises
    :class:`OSError` (a journal that cannot be kept is the caller's to report)."""
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, strict=True)
    return None if fd is None else os.fdopen(fd, "a", encoding="utf-8")


def write_atomic(path, data):
    """Replace ``path`` with ``data`` (str as UTF-8, or bytes): written to an exclusively created
    temporary file with a random name beside it, then renamed over it. Returns False, having
    written nothing, when the directory cannot be written (logged) or ``path`` is not a regular
    file (refused: a link, a pipe, a device is neither followed nor replaced)."""
    path = pathlib.Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(st.st_mode):
                _refuse(path, _kind(st.st_mode))
                return False
        with deferred_interrupts():     # Ctrl-C inside mkstemp would leave its file unnamed
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError as e:
        log.debug("cache file %s not written: %s", path, e)
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
