"""From parsed columns to :class:`Ratings` at speed (:func:`finish`: ratings cast and checked,
duplicate pairs looked for over the scan threads, :mod:`._ids`, :mod:`.scan`) for the text
loaders (:mod:`._csv` reads), and Parquet through ``pyarrow.parquet`` (:func:`parquet`, or None
for a file it does not read exactly as pandas + :meth:`Ratings.from_triples` would; the caller
then takes that path)."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from ._csv import _dictionary_column
from ._ids import factorize, take
from .ratings import Ratings, _handle_duplicates
from .scan import _map, _pool, value_range

logger = logging.getLogger(__name__)

__all__ = ["finish", "parquet"]

_F32_MAX = float(np.finfo(np.float32).max)


def _ratings32(r: np.ndarray) -> np.ndarray | None:
    """float32 ratings, or None where :meth:`Ratings.from_triples` would refuse them (NaN, ±inf,
    beyond float32) or where its checks are not the ones made here (other dtypes)."""
    if r.dtype.kind == "f" and r.dtype.itemsize in (4, 8):
        lo, hi = value_range(r)
        if not (np.isfinite(lo) and np.isfinite(hi)) or max(-lo, hi) > _F32_MAX:
            return None
    elif r.dtype.kind not in "iu":
        return None
    out = np.empty(len(r), np.float32)

    def cast(s, e):
        """Cast one chunk."""
        out[s:e] = r[s:e]
    _map(cast, len(r))
    return out


def _timestamps(ts: np.ndarray | None) -> np.ndarray | None | bool:
    """int64 seconds as :meth:`Ratings.from_triples` makes them, or False for dtypes left to it."""
    if ts is None:
        return None
    if ts.dtype.kind in "iu":
        return ts.astype(np.int64, copy=False)
    if ts.dtype.kind == "M":
        return ts.astype("datetime64[s]").astype(np.int64)
    return False


def finish(path: Path, users, items, r, ts, t0: float, what: str, duplicates: str,
           name_file: bool = True) -> Ratings:
    """The :class:`Ratings` of factorized ids ``users``/``items`` (``(uniques, int32 codes)``),
    ratings and timestamps, as :meth:`Ratings.from_triples` builds it (ratings or timestamps it
    treats otherwise, or would refuse, go through it: the same result or error). Errors are
    prefixed with the file when ``name_file``, as the text loaders do."""
    (umap, u), (imap, i) = users, items
    r32 = _ratings32(r)
    tsc = _timestamps(ts)
    try:
        if r32 is None or tsc is False:
            out = Ratings.from_triples(take(umap, u), take(imap, i), r, ts,
                                       duplicates=duplicates)
        else:
            u, i, r32, tsc = _handle_duplicates(u, i, r32, tsc, len(imap), duplicates)
            out = Ratings._new(u, i, r32, tsc, umap, imap)
    except ValueError as exc:
        if name_file:
            raise type(exc)(f"{path}: {exc}") from None
        raise
    logger.info("loaded %s (%s): %d ratings, %d users, %d items in %.2f s",
                path, what, len(out), out.shape[0], out.shape[1], time.perf_counter() - t0)
    return out


def _parquet_names(schema) -> list[str] | None:
    """The columns pandas would show for a Parquet schema, or None where pandas' metadata could
    make them differ (stored index columns, names that are not the fields' strings — integer
    column labels are stored as text —, repeats)."""
    names = list(schema.names)
    if len(set(names)) != len(names):
        return None
    meta = schema.pandas_metadata
    if meta:
        if any(isinstance(c, str) for c in meta.get("index_columns", [])):
            return None
        labels = meta.get("column_indexes", [])
        if len(labels) > 1 or any(c.get("pandas_type") != "unicode" for c in labels):
            return None
        for c in meta.get("columns", []):
            if c.get("field_name") in names and c.get("name") != c.get("field_name"):
                return None
    return names


def _parquet_ids(col, what: str):
    """``(uniques, int32 codes)`` of a Parquet id column as pandas + :meth:`Ratings.from_triples`
    would make them (integers as they are, texts as numpy strings), or None for other types."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if pa.types.is_integer(col.type):
        return factorize(col.to_numpy(), np.int32)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return None
    chunks = [c for c in col.chunks if len(c)]
    encoded = _map_list(lambda c: pc.dictionary_encode(c), chunks)
    values, index = _dictionary_column(pa.chunked_array(encoded,
                                                        pa.dictionary(pa.int32(), col.type)))
    uniques, codes = factorize(np.array(values, dtype=object).astype(str), np.int32)
    return uniques, take(codes, index)


def _map_list(fn, items):
    """``fn`` over ``items`` on the scan threads, in order."""
    return list(_pool().map(fn, items)) if len(items) > 1 else [fn(x) for x in items]


def parquet(path: Path, columns, timestamp_column, duplicates: str, t0: float) -> Ratings | None:
    """A Parquet file read by ``pyarrow.parquet`` (only the needed columns, threaded), or None
    (then pandas reads it): integer or text ids, numeric ratings, integer or naive timestamp
    timestamps, no nulls."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    try:
        names = _parquet_names(pq.read_schema(path))
        if names is None:
            return None
        specs = list(columns) + ([timestamp_column] if timestamp_column is not None else [])
        wanted = [names[int(s)] if isinstance(s, (int, np.integer)) else s for s in specs]
        if any(w not in names for w in wanted):
            return None
        table = pq.read_table(path, columns=list(dict.fromkeys(wanted)), use_threads=True)
    except (pa.ArrowException, OSError, ValueError, IndexError, TypeError) as exc:
        logger.debug("%s: not read by pyarrow.parquet (%s); reading with pandas", path, exc)
        return None
    cols = [table.column(w) for w in wanted]
    if table.num_rows == 0 or any(c.null_count for c in cols):
        return None
    ok_value = (pa.types.is_integer, pa.types.is_float32, pa.types.is_float64)
    if not any(f(cols[2].type) for f in ok_value):
        return None
    ts = None
    if timestamp_column is not None:
        t = cols[3].type
        if not (pa.types.is_integer(t) or (pa.types.is_timestamp(t) and t.tz is None)):
            return None
        ts = cols[3].to_numpy()
    users = _parquet_ids(cols[0], "user")
    items = _parquet_ids(cols[1], "item")
    r = cols[2].to_numpy()
    if users is None or items is None or _ratings32(r) is None or _timestamps(ts) is False:
        return None              # pandas + Ratings.from_triples say what they make of it
    return finish(path, users, items, r, ts, t0, "Parquet", duplicates)

