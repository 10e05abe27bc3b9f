"""The loaders' fast paths: MovieLens ``ratings.csv`` and delimited triples through pyarrow's CSV
reader (:mod:`._fastcsv`), Parquet through ``pyarrow.parquet``, then ids factorized, ratings cast
and checked and duplicate pairs looked for over the scan threads (:mod:`._ids`, :mod:`.scan`).

Each returns the :class:`Ratings` the line-by-line parser (or, for Parquet, pandas) would build
from the same file, or None for anything it does not read exactly as that path does; the caller
then takes that path, which builds the result or names the problem (same messages: file, line).
Only the duplicate-pair error is raised here, with the message :meth:`Ratings.from_triples` gives,
since it depends on nothing but the pairs, which are the same on both paths."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from ._fastcsv import _dictionary_column, read_columns, read_raw
from ._ids import factorize, take
from ._text import _looks_like_header, _named_columns, _parse_id, _resolve_column, _sniff_sep
from .ratings import Ratings, _handle_duplicates
from .scan import _map, _pool, value_range

logger = logging.getLogger(__name__)

__all__ = ["movielens_csv", "triples_csv", "parquet"]

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


def finish(path: Path, users, items, r, ts, t0: float, what: str,
           duplicates: str) -> Ratings | None:
    """The :class:`Ratings` of factorized ids ``users``/``items`` (``(uniques, int32 codes)``),
    ratings and timestamps, as :meth:`Ratings.from_triples` builds it; None where that would
    refuse the ratings or timestamps (the slow path then says why). Duplicate pairs raise its
    error, prefixed with the file (as the text and Parquet loaders do)."""
    (umap, u), (imap, i) = users, items
    r32 = _ratings32(r)
    ts = _timestamps(ts)
    if r32 is None or ts is False:
        return None
    try:
        u, i, r32, ts = _handle_duplicates(u, i, r32, ts, len(imap), duplicates)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    out = Ratings._new(u, i, r32, ts, umap, imap)
    logger.info("loaded %s (%s): %d ratings, %d users, %d items in %.2f s",
                path, what, len(out), out.shape[0], out.shape[1], time.perf_counter() - t0)
    return out


def _ids_of_texts(column, what: str):
    """``(uniques, int32 codes)`` of an id column read as ``(distinct texts, index)``: the texts
    parsed by the line parser's own :func:`._text._parse_id` (so ``01``, ``0x1f``, ``1e5`` are what
    it makes of them), factorized, and the codes gathered per row."""
    values, index = column
    parsed = _parse_id(None, values, what)
    uniques, codes = factorize(parsed, np.int32)
    return uniques, take(codes, index)


def _movielens_layout(line: str):
    """``(column of each field, ncols, has_header)`` of a ratings.csv from its first line, as the
    line parser finds them, or None where it would refuse the file."""
    fields = line.split(",")
    if not _looks_like_header(fields, 2):
        if len(fields) not in (3, 4):
            return None
        idx = {"user": 0, "item": 1, "rating": 2, **({"timestamp": 3} if len(fields) == 4 else {})}
        return idx, len(fields), False
    header = [f.strip().strip('"') for f in fields]
    idx = _named_columns(header)
    if any(k not in idx for k in ("user", "item", "rating")):
        return None
    return idx, len(header), True


def movielens_csv(path: Path, duplicates: str, t0: float) -> Ratings | None:
    """A MovieLens ``ratings.csv`` read by pyarrow (integer ids and timestamps, float ratings), or
    None (then the line parser reads it)."""
    raw = read_raw(path)
    line = raw.first_line() if raw is not None else None
    layout = _movielens_layout(line) if line is not None else None
    if layout is None:
        return None
    idx, ncols, has_header = layout
    kinds = {idx["user"]: "int", idx["item"]: "int", idx["rating"]: "float"}
    if "timestamp" in idx:
        kinds[idx["timestamp"]] = "int"
    if len(kinds) != len(idx):                 # one column named twice: the careful path
        return None
    cols = read_columns(raw, ",", ncols, has_header, kinds)
    del raw
    if cols is None:
        return None
    ts = cols[idx["timestamp"]] if "timestamp" in idx else None
    users = factorize(cols[idx["user"]], np.int32)
    items = factorize(cols[idx["item"]], np.int32)
    return finish(path, users, items, cols[idx["rating"]], ts, t0, "MovieLens CSV", duplicates)


class _Header:
    """The header fields, where :func:`.triples._resolve_column` looks for them."""

    def __init__(self, header):
        """Hold ``header`` (a list of names, or None)."""
        self.header = header


def triples_csv(path: Path, sep, columns, header, timestamp_column, duplicates,
                t0: float) -> Ratings | None:
    """Delimited (user, item, rating[, timestamp]) triples read by pyarrow: ids as the line parser
    reads them (integers when all are canonical ASCII integers, else stripped texts), or None
    (whitespace or multi-character separators, quoted CSV, and whatever :func:`._fastcsv.
    read_columns` leaves to the line parser)."""
    raw = read_raw(path)
    if raw is None:
        return None
    if sep is None:
        sep = _sniff_sep(path, raw.head())
    if sep is None or len(sep) != 1 or (sep == "," and raw.has(b'"')):
        return None
    line = raw.first_line()
    if line is None:
        return None
    fields = line.split(sep)
    has_header = _looks_like_header(fields, columns[2]) if header == "auto" else bool(header)
    hdr = _Header([f.strip().strip('"') for f in fields] if has_header else None)
    try:
        idx = [_resolve_column(c, hdr, path, w)
               for c, w in zip(columns, ("user", "item", "rating"))]
        tcol = (None if timestamp_column is None
                else _resolve_column(timestamp_column, hdr, path, "timestamp"))
    except ValueError:
        return None
    kinds = {idx[0]: "id", idx[1]: "id", idx[2]: "float"}
    if tcol is not None:
        kinds[tcol] = "int"
    if len(kinds) != 3 + (tcol is not None) or max(kinds) >= len(fields):
        return None
    cols = read_columns(raw, sep, len(fields), has_header, kinds)
    del raw
    if cols is None:
        return None
    users = _ids_of_texts(cols[idx[0]], "user id")
    items = _ids_of_texts(cols[idx[1]], "item id")
    ts = cols[tcol] if tcol is not None else None
    return finish(path, users, items, cols[idx[2]], ts, t0, f"triples, sep={sep!r}", duplicates)


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
    if users is None or items is None:
        return None
    return finish(path, users, items, cols[2].to_numpy(), ts, t0, "Parquet", duplicates)

