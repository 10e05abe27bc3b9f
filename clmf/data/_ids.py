"""Raw ids → dense indices (``factorize``): the sorted unique raw ids and each entry's position
among them, with large arrays split into chunks over the scan threads (:mod:`.scan`). The results
do not depend on the threads: integer ids in a compact range go through a presence table (O(N)),
other ids through per-chunk :func:`numpy.unique` merged and looked up with
:func:`numpy.searchsorted` — the same uniques and codes as ``numpy.unique(raw,
return_inverse=True)``. Also the id maps of :class:`clmf.data.Ratings`: raw ids checked and
converted into an id map (``_as_id_array``) and the vectorised raw id → index lookup through one
(``_lookup``)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .scan import _PARALLEL_FROM, CHUNK, _map, value_range

__all__ = ["factorize", "take", "check_raw_ids"]

_MISSING_TYPES = ("NoneType", "NAType", "NaTType")     # None, pandas.NA, pandas.NaT


def _is_missing(x) -> bool:
    """Whether one raw id is a missing value: None, pandas' NA/NaT, or a float NaN."""
    if type(x).__name__ in _MISSING_TYPES:
        return True
    return isinstance(x, (float, np.floating)) and x != x


def _offsets(x: np.ndarray, lo: int) -> np.ndarray:
    """``x - lo`` as ``intp`` without overflow in ``x``'s dtype (all of ``x`` is ≥ ``lo`` and
    within a compact span of it): int8/int16/int32 are widened first, uint64 ≥ 2⁶³ stays
    unsigned until the difference is taken."""
    if x.dtype.kind == "u":
        return (x - x.dtype.type(lo)).astype(np.intp, copy=False)
    if x.dtype.itemsize < 8:
        x = x.astype(np.int64)
    return (x - np.int64(lo)).astype(np.intp, copy=False)


def take(table: np.ndarray, index: np.ndarray, dtype=None) -> np.ndarray:
    """``table[index]`` (as ``dtype``) gathered chunk by chunk over the scan threads."""
    out = np.empty(len(index), dtype or table.dtype)

    def part(s, e):
        """Gather one chunk into its slice of ``out``."""
        np.take(table, index[s:e], out=out[s:e])
    _map(part, len(index))
    return out


def check_raw_ids(arr: np.ndarray, what: str) -> None:
    """Refuse raw ids that are missing (None, NaN, pandas' NA) or that mix text and numbers in
    one column (``7`` and ``"7"``): clmf has one rule for both, in-process
    (:meth:`clmf.data.Ratings.from_triples`) and on a Dask cluster (:mod:`clmf.dask`) —
    whether ``7`` and ``"7"`` are one id or two would be a guess, so neither is made. Numbers
    of several types (ints and floats) are one kind; bytes count as text."""
    arr = np.asarray(arr)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            raise ValueError(f"{what}: {int(bad.sum())} id(s) are NaN/inf, i.e. missing (first "
                             f"at position {int(np.flatnonzero(bad)[0])}); drop or fill them "
                             "first")
        return
    if arr.dtype.kind != "O" or not arr.size:
        return
    types = set(map(type, arr.ravel().tolist()))
    if any(t.__name__ in _MISSING_TYPES or issubclass(t, (float, np.floating)) for t in types):
        miss = np.fromiter((_is_missing(x) for x in arr.ravel()), bool, arr.size)
        if miss.any():
            raise ValueError(f"{what}: {int(miss.sum())} id(s) are missing (None/NaN; first at "
                             f"position {int(np.flatnonzero(miss)[0])}); drop or fill them "
                             "first")
    text = {t for t in types if issubclass(t, (str, bytes, np.str_, np.bytes_))}
    if text and len(text) < len(types):
        other = sorted(t.__name__ for t in types)
        first_text = next(x for x in arr.ravel() if isinstance(x, (str, bytes)))
        first_other = next(x for x in arr.ravel() if not isinstance(x, (str, bytes)))
        raise ValueError(
            f"{what}: the ids mix text and numbers ({' and '.join(other)}; e.g. {first_text!r} "
            f"and {first_other!r}): whether 7 and '7' are one id or two is ambiguous, so clmf "
            "refuses the column; make it one type first (e.g. df[col].astype(str), or "
            "pandas.to_numeric)")


def _factorize_compact(raw: np.ndarray, lo: int, span: int, codes_dtype):
    """The presence-table path of :func:`factorize` for integer ids in ``[lo, lo + span)``: the
    table starts at 0 when ``lo`` is small and non-negative (the ids index it as they are, no
    offset array per chunk), else at ``lo``."""
    direct = 0 <= lo <= span and raw.dtype != np.uint64
    base = 0 if direct else lo
    size = span + lo - base

    def where(x):
        """Positions of ids ``x`` in the table."""
        return x if direct else _offsets(x, base)
    present = np.zeros(size, dtype=bool)

    def mark(s, e):
        """Mark one chunk's ids present (concurrent writes store the same True)."""
        present[where(raw[s:e])] = True
    _map(mark, len(raw))
    uniques_off = np.flatnonzero(present)
    table = np.full(size, -1, dtype=codes_dtype)
    table[uniques_off] = np.arange(len(uniques_off), dtype=codes_dtype)
    codes = np.empty(len(raw), dtype=codes_dtype)

    def look(s, e):
        """Codes of one chunk."""
        np.take(table, where(raw[s:e]), out=codes[s:e])
    _map(look, len(raw))
    out_dtype = raw.dtype if raw.dtype.itemsize >= 4 else np.dtype(np.int64)
    uniques = uniques_off.astype(out_dtype) + out_dtype.type(base)
    return uniques, codes


def factorize(raw: np.ndarray, codes_dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """Map raw ids to contiguous indices sorted by raw id: ``(uniques, codes)`` with
    ``uniques[codes] == raw``. Integer ids whose range is at most about four times their count
    take an O(n) table path (uniques as int64 for 8/16-bit ids, else in the ids' dtype); other
    ids the sorted path (uniques in the ids' dtype)."""
    raw = np.asarray(raw)
    if raw.dtype.kind in "iu" and len(raw) > 0:
        lo, hi = (int(v) for v in value_range(raw))
        span = hi - lo + 1
        if span <= 4 * len(raw) + 4096:
            return _factorize_compact(raw, lo, span, codes_dtype)
    if raw.dtype.kind in "iuU" and len(_chunk_bounds(len(raw))) > 1:
        parts = _map(lambda s, e: np.unique(raw[s:e]), len(raw))
        uniques = np.unique(np.concatenate(parts))
        del parts
        codes = np.empty(len(raw), dtype=codes_dtype)

        def look(s, e):
            """Positions of one chunk's ids among the uniques."""
            codes[s:e] = np.searchsorted(uniques, raw[s:e])
        _map(look, len(raw))
        return uniques, codes
    uniques, codes = np.unique(raw, return_inverse=True)
    return uniques, codes.reshape(-1).astype(codes_dtype, copy=False)


def _chunk_bounds(n: int):
    """The chunks :func:`.scan._map` would split ``n`` entries into when it uses threads
    (one chunk below its threshold: then the plain sorted path is as fast)."""
    if n < _PARALLEL_FROM:
        return [(0, n)]
    return [(s, min(n, s + CHUNK)) for s in range(0, n, CHUNK)]


# ----- id maps of :class:`clmf.data.Ratings`: raw ids as an id map, raw id → index ------
def _as_id_array(raw: Any, what: str) -> np.ndarray:
    """Convert raw ids to a 1-D numpy array usable as an id map (ints, floats or str)."""
    arr = np.asarray(raw)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    check_raw_ids(arr, what)          # no missing ids, no text mixed with numbers
    if arr.dtype.kind == "O":
        # python objects: all text (strings) or all numbers (check_raw_ids)
        if len(arr) == 0 or isinstance(arr[0], (str, bytes)):
            arr = arr.astype(str)
        else:
            if isinstance(arr[0], (list, tuple, dict, set, np.ndarray)):
                raise ValueError(f"{what}: ids must be integers or strings, not "
                                 f"{type(arr[0]).__name__}s (first {arr[0]!r}); a list column "
                                 "is not an id column")
            try:
                arr = np.asarray(arr.tolist())
            except (TypeError, ValueError) as exc:  # pragma: no cover - exotic objects
                raise ValueError(f"{what}: ids must be integers or strings") from exc
            if arr.ndim != 1:
                raise ValueError(f"{what}: ids must be integers or strings, not sequences")
            if arr.dtype.kind == "O":
                arr = arr.astype(str)
    if arr.dtype.kind == "S":
        arr = arr.astype(str)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int64)
    if arr.dtype.kind == "f":
        check_raw_ids(arr, what)      # (object arrays of numbers come out as floats)
    if arr.dtype.kind not in "iufU":
        raise ValueError(f"{what}: unsupported id dtype {arr.dtype}")
    return arr


def _compatible(map_kind: str, query_kind: str) -> bool:
    """Whether ids of dtype kind ``query_kind`` can be looked up in a map of ``map_kind``."""
    numeric = "iuf"
    if map_kind in numeric and query_kind in numeric:
        return True
    return map_kind == query_kind == "U"


def _lookup(
    id_map: np.ndarray,
    sorter: np.ndarray | None,
    raw: Any,
    missing: str,
    what: str,
) -> Any:
    """Vectorised raw id -> index lookup in ``id_map`` (sorted through ``sorter``)."""
    if missing not in ("raise", "ignore"):
        raise ValueError(f"missing must be 'raise' or 'ignore', got {missing!r}")
    q = np.asarray(raw)
    scalar = q.ndim == 0
    q = np.atleast_1d(q).reshape(-1)
    if q.dtype.kind == "O":
        try:
            q = _as_id_array(q, what)
        except ValueError:
            q = q.astype(str)
    if q.dtype.kind == "S":
        q = q.astype(str)
    out = np.full(len(q), -1, dtype=np.int64)
    if len(q) and len(id_map) and _compatible(id_map.dtype.kind, q.dtype.kind):
        sorted_map = id_map if sorter is None else id_map[sorter]
        pos = np.searchsorted(sorted_map, q)
        pos_c = np.minimum(pos, len(sorted_map) - 1)
        found = sorted_map[pos_c] == q
        idx = pos_c if sorter is None else sorter[pos_c]
        out[found] = idx[found]
    bad = out < 0
    if missing == "raise" and bad.any():
        unknown = np.unique(q[bad])
        shown = ", ".join(repr(x.item() if hasattr(x, "item") else x) for x in unknown[:10])
        more = f" (and {len(unknown) - 10} more)" if len(unknown) > 10 else ""
        raise KeyError(f"{len(unknown)} unknown {what} id(s): {shown}{more}")
    if scalar:
        return int(out[0])
    return out


def _sorter_of(ids: np.ndarray) -> np.ndarray | None:
    """The argsort of ``ids`` for :func:`_lookup`, or None when they are already sorted."""
    if len(ids) > 1 and not np.all(ids[1:] > ids[:-1]):
        return np.argsort(ids, kind="stable")
    return None
