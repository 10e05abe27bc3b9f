"""Raw ids → dense indices (``factorize``): the sorted unique raw ids and each entry's position
among them, with large arrays split into chunks over the scan threads (:mod:`.scan`). The results
do not depend on the threads: integer ids in a compact range go through a presence table (O(N)),
other ids through per-chunk :func:`numpy.unique` merged and looked up with
:func:`numpy.searchsorted` — the same uniques and codes as ``numpy.unique(raw,
return_inverse=True)``."""
from __future__ import annotations

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
    (:meth:`clmf.datasets.Ratings.from_triples`) and on a Dask cluster (:mod:`clmf.dask`) —
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
