"""Saving and loading fitted models (``.npz``, ``allow_pickle=False``).

A model file is an ordinary NumPy ``.npz`` archive that holds no pickled objects, so loading one
cannot run code. Its members:

=================  ==========================================================================
``clmf_format``    the marker ``"clmf.ALS"`` (a file without it is not a clmf model)
``format_version`` int; :func:`load` refuses files newer than :data:`FORMAT_VERSION`
``meta``           a JSON document: ``clmf_version``, ``params`` (``get_params()``, with the
                   device as a string and the dtype as its name), ``config`` (per side: the
                   kernel configuration's string and fields, the rule that chose it and why),
                   ``history``, ``device``, ``best_iteration``, ``memory``, ``has_id_maps``
``user_factors``,  float32 ``(n_users, f)`` and ``(n_items, f)``
``item_factors``
``user_counts``,   training ratings per user / item
``item_counts``
``global_mean``    float64 scalar
``user_ids``,      raw id maps (index → raw id) when the model was fitted on
``item_ids``       :class:`clmf.data.Ratings`: unicode arrays for string ids, integers else
=================  ==========================================================================

Writes are atomic: the archive goes to a temporary file in the target's directory, which then
replaces the target with :func:`os.replace`; a failing save leaves no file behind.
"""
from __future__ import annotations

import errno
import json
import logging
import numbers
import os
import stat
import tempfile
import time

import numpy as np

from .._version import __version__
from ..interrupts import deferred_interrupts

log = logging.getLogger(__name__)

__all__ = ["save", "load", "FORMAT", "FORMAT_VERSION"]

FORMAT = "clmf.ALS"
FORMAT_VERSION = 1

_REQUIRED = ("meta", "user_factors", "item_factors", "user_counts", "item_counts", "global_mean")
_KNOWN = _REQUIRED + ("clmf_format", "format_version", "user_biases", "item_biases", "user_ids",
                      "item_ids")
_STALE_SECONDS = 24 * 3600         # a temp file this old is stale even if its pid is reused
_SMALL = 1 << 12                   # bytes of a scalar member (marker, version, global mean)
_MAX_META = 64 << 20               # bytes of the JSON meta member
_MAX_ID_BYTES = 1024               # bytes per raw id (unicode arrays: 4 per character)


# ----- saving ----------------------------------------------------------------------------------
# The estimator classes load() builds, by format marker.  The estimator module registers itself
# on import (clmf.model imports it before this module can be used), so imports point one way:
# estimator -> persistence.
_ESTIMATORS: dict = {}


def register_estimator(cls, fmt=FORMAT):
    """Make :func:`load` build ``cls`` for files marked ``fmt``; returns ``cls``."""
    _ESTIMATORS[fmt] = cls
    return cls


def estimator_class(fmt=FORMAT):
    """The estimator class registered for the format marker ``fmt``."""
    try:
        return _ESTIMATORS[fmt]
    except KeyError:
        raise RuntimeError(f"no estimator is registered for {fmt!r} model files "
                           "(import clmf.model)") from None


def _device_str(dev):
    if dev is None or isinstance(dev, str):
        return dev
    from ..engine.device import device_label
    try:                              # a pyopencl.Device: its "platform | name" selects it again
        return device_label(dev)
    except (AttributeError, KeyError):
        return str(dev)


def _variant_str(v):
    if isinstance(v, (tuple, list)):
        return [_variant_str(x) for x in v]
    return v if isinstance(v, str) else str(v)


def _params_json(params):
    out = {}
    for k, v in params.items():
        if k == "device":
            v = _device_str(v)
        elif k == "dtype":
            v = np.dtype(v).name
        elif k == "variant":
            v = _variant_str(v)
        elif k == "random_state":
            if isinstance(v, numbers.Integral) and not isinstance(v, bool):
                v = int(v)
            elif v is not None:
                log.warning("random_state %r is not an int: saved as None", type(v).__name__)
                v = None
        elif isinstance(v, (bool, np.bool_)):
            v = bool(v)
        elif isinstance(v, numbers.Integral):
            v = int(v)
        elif isinstance(v, numbers.Real):
            v = float(v)
        elif not isinstance(v, (str, type(None))):
            v = str(v)
        out[k] = v
    return out


def _config_json(config):
    out = {}
    for side, ch in (config or {}).items():
        cfg = getattr(ch, "config", ch)
        entry = {"config": str(cfg), "rule": getattr(ch, "rule", ""),
                 "reason": getattr(ch, "reason", "")}
        to_dict = getattr(cfg, "to_dict", None)
        if to_dict is not None:
            try:
                fields = to_dict()
                json.dumps(fields)
                entry["fields"] = fields
            except (TypeError, ValueError):
                pass
        out[str(side)] = entry
    return out


def _id_array(ids, what):
    a = np.asarray(ids)
    if a.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {a.shape}")
    if a.dtype.kind in "OSU":
        return np.asarray([x.decode() if isinstance(x, bytes) else str(x) for x in a.tolist()],
                          dtype=str) if a.size else np.zeros(0, dtype="<U1")
    if a.dtype.kind in "iub":
        return a.astype(np.int64)
    if a.dtype.kind == "f":
        return a.astype(np.float64)
    raise ValueError(f"{what}: cannot store ids of dtype {a.dtype}")


def _jsonable(obj):
    try:
        json.dumps(obj)
        return obj
    except (TypeError, ValueError):
        return None


def _arrays_of(model):
    if not hasattr(model, "user_factors_"):
        from ..errors import not_fitted_error
        raise not_fitted_error()(f"this {type(model).__name__} is not fitted yet; nothing to "
                                  "save")
    X = np.asarray(model.user_factors_, dtype=np.float32)
    Y = np.asarray(model.item_factors_, dtype=np.float32)
    uids = getattr(model, "user_ids_", None)
    iids = getattr(model, "item_ids_", None)
    has_maps = uids is not None and iids is not None
    history = [{k: (float(v) if isinstance(v, numbers.Real) else v) for k, v in h.items()}
               for h in getattr(model, "history_", []) or []]
    meta = {
        "clmf_version": __version__,
        "class": type(model).__name__,
        "params": _params_json(model.get_params()),
        "config": _config_json(getattr(model, "config_", None)),
        "history": _jsonable(history) or [],
        "device": getattr(model, "device_", None),
        "best_iteration": int(getattr(model, "best_iteration_", -1)),
        "memory": _jsonable(getattr(model, "memory_", None)),
        "has_id_maps": bool(has_maps),
    }
    _check_consistent(model, X, Y, uids, iids, has_maps)
    arrays = {
        "clmf_format": np.array(FORMAT),
        "format_version": np.array(FORMAT_VERSION, dtype=np.int64),
        "meta": np.array(json.dumps(meta)),
        "user_factors": X,
        "item_factors": Y,
        "user_counts": np.asarray(model.user_counts_, dtype=np.int64),
        "item_counts": np.asarray(model.item_counts_, dtype=np.int64),
        "global_mean": np.array(float(model.global_mean_), dtype=np.float64),
    }
    if getattr(model, "user_biases_", None) is not None:
        arrays["user_biases"] = np.asarray(model.user_biases_, dtype=np.float32)
        arrays["item_biases"] = np.asarray(model.item_biases_, dtype=np.float32)
    if has_maps:
        arrays["user_ids"] = _id_array(uids, "user_ids_")
        arrays["item_ids"] = _id_array(iids, "item_ids_")
    return arrays


def _check_consistent(model, X, Y, uids, iids, has_maps):
    """Refuse to save a model whose learned attributes do not agree (nothing is written)."""
    problems = []
    if X.ndim != 2 or Y.ndim != 2 or X.shape[1] != Y.shape[1]:
        problems.append(f"factor shapes {X.shape} and {Y.shape} do not match")
    else:
        m, n = X.shape[0], Y.shape[0]
        for name, a, k in (("user_counts_", model.user_counts_, m),
                           ("item_counts_", model.item_counts_, n),
                           ("user_ids_", uids if has_maps else None, m),
                           ("item_ids_", iids if has_maps else None, n),
                           ("user_biases_", getattr(model, "user_biases_", None), m),
                           ("item_biases_", getattr(model, "item_biases_", None), n)):
            if a is not None and np.shape(a) != (k,):
                problems.append(f"{name} has shape {np.shape(a)}, the factors have {k} rows")
        if getattr(model, "factors", X.shape[1]) != X.shape[1]:     # load() refuses it too
            problems.append(f"factors={model.factors!r}, but the factor matrices are "
                            f"{X.shape[1]} wide")
    if not (np.isfinite(X).all() and np.isfinite(Y).all()):
        problems.append("the factors hold NaN/inf")
    gm = getattr(model, "global_mean_", None)
    if not isinstance(gm, numbers.Real) or not np.isfinite(gm):
        problems.append(f"global_mean_ is {gm!r}")
    if problems:
        raise ValueError(f"this {type(model).__name__} is not consistent, so it is not saved "
                         f"(the file is left as it was): {'; '.join(problems)}")


def _clean_stale_temps(directory, base):
    """Remove temporary files of earlier saves of ``base`` whose writer is gone (killed)."""
    prefix = "." + base + "."
    try:
        names = os.listdir(directory)
    except OSError:
        return
    now = time.time()
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        full = os.path.join(directory, name)
        parts = name[len(prefix):-len(".tmp")].split(".")
        pid = int(parts[0]) if parts and parts[0].isdigit() and parts[0].isascii() else None
        try:
            if pid is not None and pid != os.getpid():
                try:
                    os.kill(pid, 0)
                    alive = True
                except ProcessLookupError:
                    alive = False
                except OSError:
                    alive = True
            else:
                alive = pid == os.getpid()
            if alive and now - os.stat(full).st_mtime < _STALE_SECONDS:
                continue
            os.unlink(full)
            log.info("removed %s, left by an interrupted save", full)
        except OSError:
            continue


def _current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save(model, path):
    """Write a fitted model to ``path`` as a ``.npz`` archive, atomically.

    Parameters
    ----------
    model : clmf.ALS
        A fitted model.
    path : str, path-like or binary file object
        Target file, written exactly there (no ``.npz`` is appended); an existing file is
        replaced only once the new one is complete. A file object (anything with ``write``:
        ``open(p, "wb")``, ``io.BytesIO``) is written at its position and left open.

    Returns
    -------
    str or file object
        The path written, or the file object.

    Raises
    ------
    clmf.NotFittedError
        If the model is not fitted (a ``RuntimeError`` too).
    OSError
        If the directory does not exist or is not writable (nothing is left behind), or
        ``path`` is a directory, a named pipe, a device node or another file that is not a
        regular file (``IsADirectoryError``/``FileExistsError``; it is left as it was).

    Examples
    --------
    >>> clmf.model.persistence.save(model, "model.npz")                   # doctest: +SKIP
    'model.npz'
    >>> model.save("model.npz")                                     # doctest: +SKIP
    """
    arrays = _arrays_of(model)          # everything converted before any file is touched
    if _is_file(path, "write"):
        np.savez_compressed(path, allow_pickle=False, **arrays)
        log.info("saved model (%d users × %d items) to %s", arrays["user_factors"].shape[0],
                 arrays["item_factors"].shape[0], _name(path))
        return path
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    try:                                  # an existing file keeps its permissions
        st = os.stat(path)
    except OSError:
        mode = 0o666 & ~_current_umask()
    else:
        _check_replaceable(path, st)
        mode = stat.S_IMODE(st.st_mode)
    _clean_stale_temps(directory, base)
    tmp = None
    try:                                # tmp is named here before a Ctrl-C can leave it behind
        try:
            with deferred_interrupts():     # Ctrl-C inside mkstemp would leave its file unnamed
                fd, tmp = tempfile.mkstemp(prefix=f".{base}.{os.getpid()}.", suffix=".tmp",
                                           dir=directory)
        except OSError as e:            # name the directory, not the temporary file
            why = ("no such directory" if not os.path.isdir(directory)
                   else e.strerror or type(e).__name__)
            raise type(e)(e.errno, f"cannot write {base} into its directory ({why})",
                          directory) from None
        os.chmod(tmp, mode)               # before any data: a 0600 model is never world-readable
        with os.fdopen(fd, "wb") as fh:
            np.savez_compressed(fh, allow_pickle=False, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise
    log.info("saved model (%d users × %d items, f=%d) to %s", arrays["user_factors"].shape[0],
             arrays["item_factors"].shape[0], arrays["user_factors"].shape[1], path)
    return path


def _check_replaceable(path, st):
    """Refuse to save over anything but a regular file (``st``: ``os.stat`` of ``path``): the
    atomic save would swap a named pipe, a device node (``/dev/null``) or a socket for a regular
    file, and cannot replace a directory."""
    if stat.S_ISREG(st.st_mode):
        return
    kind = ("a directory" if stat.S_ISDIR(st.st_mode) else
            "a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode) else
            "a character device" if stat.S_ISCHR(st.st_mode) else
            "a block device" if stat.S_ISBLK(st.st_mode) else
            "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
    err = IsADirectoryError if stat.S_ISDIR(st.st_mode) else FileExistsError
    raise err(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EEXIST,
              f"cannot save the model to {path}: it is {kind}, which a save would replace with a "
              "regular file; save to a regular file or a new path (or pass an open file object "
              "to write into it)")


def _is_file(obj, method):
    """Whether ``obj`` is a file object (has ``method``, "read" or "write") rather than a path."""
    return hasattr(obj, method) and not isinstance(obj, (str, bytes, os.PathLike))


def _name(fileobj):
    """The file object's name, or ``<BytesIO>``-style for one without."""
    return str(getattr(fileobj, "name", None) or f"<{type(fileobj).__name__}>")


def _left_to_read(fileobj):
    """``(position, size)`` of a seekable file object, or None (not seekable)."""
    try:
        pos = fileobj.tell()
        end = fileobj.seek(0, os.SEEK_END)
        fileobj.seek(pos)
    except (AttributeError, OSError, ValueError):
        return None
    return int(pos), int(end)


# ----- loading ---------------------------------------------------------------------------------
def _restore_params(params, cls):
    import inspect
    valid = {p for p in inspect.signature(cls.__init__).parameters if p != "self"}
    out = {}
    for k, v in params.items():
        if k not in valid:
            log.warning("ignoring unknown saved parameter %r=%r", k, v)
            continue
        if k == "dtype" and isinstance(v, str):
            v = np.dtype(v).type
        elif k == "variant" and isinstance(v, list):
            v = tuple(v)
        out[k] = v
    return out


def _restore_config(entries):
    from ..engine.config import KernelConfig
    from ..tuning import Choice
    out = {}
    for side, e in entries.items():
        cfg = None
        if "fields" in e:
            try:
                cfg = KernelConfig.from_dict(e["fields"])
            except (TypeError, ValueError):
                cfg = None
        if cfg is None:
            try:
                cfg = KernelConfig.parse(e["config"])
            except (TypeError, ValueError):
                log.warning("saved %s configuration %r is not understood by this clmf; kept as "
                            "text", side, e["config"])
                cfg = e["config"]
        out[side] = Choice(cfg, e.get("rule", ""), e.get("reason", ""))
    return out


def load(path):
    """Read a model written by :func:`save` (or ``ALS.save``).

    No pickled data is read (``allow_pickle=False``); the model recommends and predicts on the
    host without an OpenCL device. Its ``device`` parameter is the saved string, used only if
    the model is fitted again.

    Parameters
    ----------
    path : str, path-like or binary file object
        The ``.npz`` file, or an open binary file (anything with ``read`` and ``seek``: ``open(p,
        "rb")``, ``io.BytesIO``), read from its position.

    Returns
    -------
    clmf.ALS
        A fitted model with the saved factors, counts, global mean, id maps, parameters,
        ``config_``, ``history_``, ``device_`` and ``best_iteration_``.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        Naming the file, if it is a directory, not an ``.npz`` archive, corrupted, not a clmf
        model (no format marker), or written in a newer format version than this clmf reads.

    Examples
    --------
    >>> model = clmf.load("model.npz")                              # doctest: +SKIP
    >>> model.recommend(0, train, N=5)                              # doctest: +SKIP
    """
    ALS = estimator_class()
    source = path
    if _is_file(path, "read"):
        path = _name(source)
        where = _left_to_read(source)
        if where is not None and where[0] >= where[1]:
            pos, end = where
            hint = (f"the file object is at its end (position {pos} of {end} bytes): rewind it "
                    "with seek(0) first, e.g. buf.seek(0) after model.save(buf)" if end else
                    "the file object is empty")
            raise ValueError(f"{path}: not a clmf model file (nothing left to read: {hint})")
    else:
        path = source = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, "no such clmf model file", path)
        if os.path.isdir(path):
            raise ValueError(f"{path}: is a directory, not a clmf model file")
    head = _head(source)
    if not head.startswith((b"PK\x03\x04", b"PK\x05\x06", b"\x93NUMPY")):
        # np.load would take anything else for a pickle (and suggest allow_pickle=True)
        raise ValueError(f"{path}: not a clmf model file (not an .npz archive: it starts with "
                         f"{head[:16]!r})")
    try:
        archive = np.load(source, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any failure to parse means "not an npz we can read"
        raise ValueError(f"{path}: not a clmf model file (not a readable .npz archive: "
                         f"{type(e).__name__}: {e})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: not a clmf model file (a single .npy array, not an .npz "
                         "archive)")
    with archive:
        try:
            data, meta, version = _read_members(archive, path)
        except _NotAModel as e:
            raise ValueError(str(e)) from None
        except Exception as e:  # noqa: BLE001 - zip CRC/zlib/JSON errors all mean corruption
            raise ValueError(f"{path}: corrupted clmf model file ({type(e).__name__}: {e})") \
                from None
    if data is None:
        raise ValueError(f"{path}: written in clmf model format {version}, newer than this clmf "
                         f"({__import__('clmf').__version__}) reads (≤ {FORMAT_VERSION}); "
                         "upgrade clmf")
    try:
        model = _build_model(data, meta, ALS)
    except ValueError as e:
        raise ValueError(f"{path}: corrupted clmf model file ({e})") from None
    except Exception as e:  # noqa: BLE001 - malformed meta/params of any type
        raise ValueError(f"{path}: corrupted clmf model file ({type(e).__name__}: {e})") from None
    log.info("loaded model (%d users × %d items, f=%d, saved by clmf %s) from %s",
             model.user_factors_.shape[0], model.item_factors_.shape[0],
             model.user_factors_.shape[1], meta.get("clmf_version"), path)
    return model


def _head(source, n=64):
    """The first ``n`` bytes of a path or a readable file object (put back to its position)."""
    if _is_file(source, "read"):
        pos = source.tell()
        try:
            return bytes(source.read(n) or b"")
        finally:
            source.seek(pos)
    with open(source, "rb") as fh:
        return fh.read(n)


class _NotAModel(ValueError):
    """An archive without the clmf marker."""


def _member_header(archive, name):
    """(shape, dtype, declared bytes) of an .npz member, from its zip entry and .npy header
    alone (nothing of the data is decompressed)."""
    zf = archive.zip
    info = zf.getinfo(name + ".npy")
    with zf.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    return tuple(int(x) for x in shape), np.dtype(dtype), int(info.file_size)


def _read_members(archive, path):
    """(members, meta, version) of an open archive; only the known members are read, each
    within a size limit derived from the factors' shapes (their headers are read first)."""
    files = set(archive.files)
    heads = {}
    for k in ("clmf_format", "format_version"):
        if k in files:
            heads[k] = _member_header(archive, k)
            if heads[k][2] > _SMALL:
                raise ValueError(f"member {k} is {heads[k][2]} bytes")
    marker = str(archive["clmf_format"][()]) if "clmf_format" in files else None
    if marker != FORMAT:
        raise _NotAModel(f"{path}: not a clmf model file (no {FORMAT!r} format marker; "
                         f"members: {sorted(files)[:8]})")
    version = int(archive["format_version"][()])
    if version > FORMAT_VERSION:
        return None, None, version
    missing = [k for k in _REQUIRED if k not in files]
    if missing:
        raise ValueError(f"missing members {missing}")
    unknown = sorted(files - set(_KNOWN))
    if unknown:
        log.warning("%s: ignoring unknown members %s (not read)", path, unknown[:8])
    for k in _KNOWN:
        if k in files and k not in heads:
            heads[k] = _member_header(archive, k)
    (xs, xd, _), (ys, yd, _) = heads["user_factors"], heads["item_factors"]
    if len(xs) != 2 or len(ys) != 2 or xs[1] != ys[1]:
        raise ValueError(f"factor shapes {xs} and {ys} do not match")
    if xd.kind != "f" or yd.kind != "f":
        raise ValueError(f"factors of dtype {xd} / {yd}, not floating point")
    m, n = xs[0], ys[0]
    limits = {"meta": _MAX_META, "global_mean": _SMALL,
              "user_factors": m * xs[1] * xd.itemsize, "item_factors": n * ys[1] * yd.itemsize,
              "user_counts": 8 * m, "item_counts": 8 * n, "user_biases": 8 * m,
              "item_biases": 8 * n, "user_ids": _MAX_ID_BYTES * m, "item_ids": _MAX_ID_BYTES * n}
    for k, lim in limits.items():
        if k in heads and heads[k][2] > lim + _SMALL:
            raise ValueError(f"member {k} declares {heads[k][2]} bytes, more than its "
                             f"{lim + _SMALL} for {m} users × {n} items")
        if k in heads and heads[k][1].hasobject:
            raise ValueError(f"member {k} holds Python objects")
    data = {k: archive[k] for k in _KNOWN if k in files}
    meta = json.loads(str(data["meta"][()]))
    if not isinstance(meta, dict):
        raise ValueError("meta is not a JSON object")
    return data, meta, version


def _id_map_problem(ids, what):
    """What is wrong with a saved raw-id map (index → raw id), or None: ids must be integers,
    finite floats or text, and distinct (a repeated raw id could not be looked up)."""
    if ids.dtype.kind not in "iufU":
        return f"{what} has dtype {ids.dtype}, not integers, floats or text"
    if ids.dtype.kind == "f" and not np.isfinite(ids).all():
        return f"{what} holds {int((~np.isfinite(ids)).sum())} NaN/inf id(s)"
    if ids.size:
        s = np.sort(ids)
        dup = s[1:] == s[:-1]
        if dup.any():
            return (f"{what} holds {int(dup.sum())} repeated id(s) (first "
                    f"{s[1:][dup][0].item()!r}): each index needs its own raw id")
    return None


def _as_dict(v, what):
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"meta {what} is {type(v).__name__}, not an object")
    return v


def _build_model(data, meta, ALS):
    """A fitted ALS from checked members and meta (raises ValueError naming the problem)."""
    from ..data.validation import check_params
    X, Y = data["user_factors"], data["item_factors"]
    uc, ic = data["user_counts"], data["item_counts"]
    problems = []
    i64 = np.iinfo(np.int64).max
    if uc.shape != (X.shape[0],) or ic.shape != (Y.shape[0],):
        problems.append(f"count shapes {uc.shape}, {ic.shape} do not match the factors")
    elif uc.dtype.kind not in "iu" or ic.dtype.kind not in "iu" or (uc.size and uc.min() < 0) \
            or (ic.size and ic.min() < 0):
        problems.append("counts are not non-negative integers")
    elif (uc.size and int(uc.max()) > i64) or (ic.size and int(ic.max()) > i64):
        problems.append("counts exceed the int64 range (they would wrap negative)")
    # checked as the model will hold them: float32 (a float64 1e300 is inf there)
    with np.errstate(over="ignore", invalid="ignore"):
        X, Y = X.astype(np.float32), Y.astype(np.float32)
    if not (np.isfinite(X).all() and np.isfinite(Y).all()):
        problems.append("the factors hold NaN/inf (as float32)")
    gm = data["global_mean"]
    if gm.shape != () or gm.dtype.kind not in "fiu" or not np.isfinite(gm) or \
            abs(float(gm[()])) > float(np.finfo(np.float32).max):
        problems.append(f"global_mean is not a finite float32 number (shape {gm.shape}, dtype "
                        f"{gm.dtype})")
    has_maps = meta.get("has_id_maps", False)
    if type(has_maps) is not bool:
        problems.append(f"meta has_id_maps is {has_maps!r}")
    elif has_maps:
        if "user_ids" not in data or "item_ids" not in data:
            problems.append("id maps announced but missing")
        elif data["user_ids"].shape != (X.shape[0],) or data["item_ids"].shape != (Y.shape[0],):
            problems.append("id map lengths do not match the factors")
        else:
            problems += [p for p in (_id_map_problem(data["user_ids"], "user_ids"),
                                     _id_map_problem(data["item_ids"], "item_ids")) if p]
    biases = None
    if "user_biases" in data and "item_biases" in data:
        ub, ib = np.asarray(data["user_biases"]), np.asarray(data["item_biases"])
        if ub.shape != (X.shape[0],) or ib.shape != (Y.shape[0],):
            problems.append("bias lengths do not match the factors")
        elif ub.dtype.kind != "f" or ib.dtype.kind != "f":
            problems.append("biases are not floats")
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                biases = (ub.astype(np.float32), ib.astype(np.float32))
            if not (np.isfinite(biases[0]).all() and np.isfinite(biases[1]).all()):
                problems.append("biases are not finite (as float32)")
    if problems:
        raise ValueError("; ".join(problems))
    params = _restore_params(_as_dict(meta.get("params"), "params"), ALS)
    model = ALS(**{"factors": X.shape[1], **params})
    try:
        check_params(model)
    except (TypeError, ValueError) as e:
        raise ValueError(f"saved parameters: {e}") from None
    if model.factors != X.shape[1]:
        raise ValueError(f"saved parameters: factors={model.factors}, but the factor matrices "
                         f"are {X.shape[1]} wide")
    history = meta.get("history", [])
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise ValueError("meta history is not a list of objects")
    best = meta.get("best_iteration", len(history) - 1)
    if type(best) is not int:
        raise ValueError(f"meta best_iteration is {best!r}")
    device = meta.get("device")
    if device is not None and not isinstance(device, str) and not (
            isinstance(device, list) and all(isinstance(d, str) for d in device)):
        # a list: a fit over several devices (clmf.parallel, clmf.dask)
        raise ValueError(f"meta device is {type(device).__name__}, not a string or a list of "
                         "strings")
    model.user_factors_ = np.ascontiguousarray(X, dtype=np.float32)
    model.item_factors_ = np.ascontiguousarray(Y, dtype=np.float32)
    model.user_counts_ = uc.astype(np.int64)
    model.item_counts_ = ic.astype(np.int64)
    model.global_mean_ = float(gm[()])
    model.user_biases_, model.item_biases_ = biases if biases is not None else (None, None)
    model.user_ids_ = data["user_ids"] if has_maps else None
    model.item_ids_ = data["item_ids"] if has_maps else None
    model.config_ = _restore_config(_as_dict(meta.get("config"), "config"))
    model.history_ = list(history)
    model.device_ = device
    model.best_iteration_ = best
    if meta.get("memory") is not None:
        model.memory_ = meta["memory"]
    return model
