"""Reading clean numeric delimited files with pyarrow's multithreaded CSV reader (when pyarrow is
installed). Whatever it would not read exactly as the line-by-line parser of :mod:`._text` does
(quotes, whitespace-only lines, a field that is not a plain number, NaN or ±inf ratings, a ragged
line, an encoding mark before data) gives None, and the caller takes the line-by-line path, which
names the problem with its line number: same results, same error messages, at the reader's speed
on the files that are fine."""
from __future__ import annotations

import gzip
import logging
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["first_line", "read_numeric"]


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def first_line(path: Path) -> str | None:
    """The first physical line of the file (gzip-aware, UTF-8 with a BOM or latin-1), or None
    when it is blank or the file starts with an encoding mark the reader would keep."""
    opener = gzip.open if _is_gzip(path) else open
    with opener(path, "rb") as fh:
        raw = fh.readline(1 << 16)
    raw = raw.rstrip(b"\r\n")
    if raw.startswith(b"\xef\xbb\xbf") or b"\r" in raw or not raw.strip():
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def read_numeric(path: Path, sep: str, ncols: int, header: bool, types: dict[int, str]):
    """Columns ``types`` ({position: "int" | "float"}) of a file of ``ncols`` fields per line as
    int64 / float64 arrays ({position: array}), or None (see the module docstring)."""
    if len(sep) != 1:
        return None
    try:
        import pyarrow as pa
        import pyarrow.csv as pc
    except ImportError:
        return None
    names = [f"c{k}" for k in range(ncols)]
    kinds = {"int": pa.int64(), "float": pa.float64()}
    try:
        src = (pa.CompressedInputStream(pa.OSFile(str(path)), "gzip") if _is_gzip(path)
               else pa.OSFile(str(path)))
        with src:
            table = pc.read_csv(
                src,
                read_options=pc.ReadOptions(column_names=names, skip_rows=1 if header else 0,
                                            use_threads=True),
                parse_options=pc.ParseOptions(delimiter=sep, quote_char=False,
                                              double_quote=False, escape_char=False,
                                              newlines_in_values=False, ignore_empty_lines=True),
                convert_options=pc.ConvertOptions(
                    column_types={names[k]: kinds[t] for k, t in types.items()},
                    include_columns=[names[k] for k in types], null_values=[],
                    strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowException, OSError, ValueError, EOFError) as exc:
        logger.debug("%s: not read by pyarrow (%s); parsing line by line", path, exc)
        return None
    if table.num_rows == 0:
        return None
    out = {}
    for k, t in types.items():
        col = table.column(names[k])
        if col.null_count:
            return None
        arr = col.to_numpy()
        if t == "float" and not np.isfinite(arr).all():
            return None
        out[k] = arr
    return out
