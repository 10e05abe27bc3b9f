"""Shared text-table reading for the file loaders: decoding (UTF-8, latin-1 fallback, gzip),
line splitting, header sniffing, typed column parsing with 1-based line numbers in errors."""

from __future__ import annotations

import gzip
import logging
import math
import re
import time
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

from .ratings import Ratings

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# text parsing
# --------------------------------------------------------------------------------------
def _gunzip(path: Path, data: bytes) -> bytes:
    """Decompress gzip ``data`` read from ``path``; a truncated or corrupt stream is a
    ``ValueError`` naming the file (not a bare ``EOFError``/``zlib.error``)."""
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as e:
        raise ValueError(f"{path}: truncated or corrupt gzip file ({type(e).__name__}: {e})") \
            from None


def _read_text(path: Path) -> str:
    """The text of a (possibly gzip-compressed) file: UTF-8, else latin-1."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(path, data)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        logger.debug("%s is not UTF-8; decoding as latin-1", path)
        return data.decode("latin-1")


def _text_lines(text: str) -> list[str]:
    """Split on LF / CRLF / CR only (never on the Unicode breaks str.splitlines knows)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


class _Table:
    """Non-blank lines of a delimited text file, with 1-based line numbers and header."""

    def __init__(self, path: Path, text: str, sep: str | None, header: bool | str, rating_col):
        self.path = path
        self.sep = sep
        lines = _text_lines(text)
        if sep is not None and len(sep) > 1:
            # multi-character separator such as '::' -> a control character never in data
            lines = [ln.replace(sep, "\x1f") for ln in lines] if lines else lines
            self._split_sep: str | None = "\x1f"
        else:
            self._split_sep = sep
        blank = np.fromiter((not ln or ln.isspace() for ln in lines), dtype=bool, count=len(lines))
        if blank.any():
            keep = np.flatnonzero(~blank)
            self.linenos = keep + 1
            lines = [lines[k] for k in keep]
        else:
            self.linenos = np.arange(1, len(lines) + 1)
        self.header: list[str] | None = None
        self.header_lineno = 0
        if lines:
            first = self._split(lines[0])
            if header == "auto":
                has_header = _looks_like_header(first, rating_col)
            else:
                has_header = bool(header)
            if has_header:
                self.header = [f.strip().strip('"') for f in first]
                self.header_lineno = int(self.linenos[0])
                lines = lines[1:]
                self.linenos = self.linenos[1:]
        self.lines = lines

    def _split(self, line: str) -> list[str]:
        return line.split(self._split_sep) if self._split_sep is not None else line.split()

    def where(self, k: int) -> str:
        return f"{self.path}: line {int(self.linenos[k])}"

    def columns(self, ncols: int | None, min_cols: int) -> list[list[str]]:
        """Split all lines into fields; ``ncols`` exact count or ``None`` for >= min_cols."""
        lines = self.lines
        n = len(lines)
        s = self._split_sep
        if s is not None:
            counts = np.fromiter((ln.count(s) for ln in lines), dtype=np.int64, count=n) + 1
        else:
            counts = np.fromiter((len(ln.split()) for ln in lines), dtype=np.int64, count=n)
        if ncols is not None:
            bad = np.flatnonzero(counts != ncols)
        else:
            bad = np.flatnonzero(counts < min_cols)
        if bad.size:
            k = int(bad[0])
            want = f"{ncols}" if ncols is not None else f"at least {min_cols}"
            sep_name = "whitespace" if self.sep is None else repr(self.sep)
            raise ValueError(
                f"{self.where(k)}: expected {want} fields separated by {sep_name}, found "
                f"{int(counts[k])}: {lines[k][:200]!r}"
                + (f" ({bad.size} malformed line(s) in total)" if bad.size > 1 else "")
            )
        if n and (counts == counts[0]).all():
            width = int(counts[0])
            flat = s.join(lines).split(s) if s is not None else " ".join(lines).split()
            return [flat[j::width] for j in range(width)]
        rows = [self._split(ln) for ln in lines]
        return [[row[j] if j < len(row) else "" for row in rows] for j in range(min_cols)]


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _looks_like_header(fields: list[str], rating_col) -> bool:
    if isinstance(rating_col, str):
        return True
    if rating_col is None:
        return not all(_is_number(f) for f in fields)
    if rating_col >= len(fields):
        return not all(_is_number(f) for f in fields)
    return not _is_number(fields[rating_col].strip().strip('"'))


def _first_bad(values: Sequence[str], conv) -> int:
    for k, v in enumerate(values):
        try:
            x = conv(v)
        except (ValueError, TypeError, OverflowError):
            return k
        if isinstance(x, float) and not math.isfinite(x):
            return k
    return -1  # pragma: no cover - only called after a failure


# int() also reads "１" (full-width and other Unicode digits) and "1_0" (underscores): as ids those
# would merge distinct users ("1", "１" and "1_0" all read 1 or 10). Ids are ASCII digits only;
# an id column that may fall back to strings must also be canonical (no "+", no leading zeros).
_NONCANONICAL = re.compile(r"(?:^|\x00)[ \t]*(?:\+|-0|0[0-9])")


def _ascii_integers(values: list[str], canonical: bool = False) -> bool:
    """Whether every value is written with ASCII digits only (``int()`` then reads nothing else);
    with ``canonical``, also without a ``+`` or leading zeros (distinct texts, distinct ints)."""
    joined = "\x00".join(values)
    if not joined.isascii() or "_" in joined:
        return False
    return not (canonical and _NONCANONICAL.search(joined))


def _parse_int(table: _Table, values: list[str], what: str) -> np.ndarray:
    """Integers written with ASCII digits (a ``ValueError`` naming the line otherwise)."""
    if not _ascii_integers(values):
        k = next(k for k, v in enumerate(values) if not v.isascii() or "_" in v)
        raise ValueError(f"{table.where(k)}: {what} {values[k]!r} is not an integer "
                         "(ASCII digits only)")
    try:
        return np.fromiter(map(int, values), dtype=np.int64, count=len(values))
    except (ValueError, OverflowError):
        k = _first_bad(values, int)
        raise ValueError(
            f"{table.where(k)}: {what} {values[k]!r} is not an integer"
        ) from None


def _parse_float(table: _Table, values: list[str], what: str) -> np.ndarray:
    try:
        arr = np.fromiter(map(float, values), dtype=np.float64, count=len(values))
    except ValueError:
        k = _first_bad(values, float)
        raise ValueError(f"{table.where(k)}: {what} {values[k]!r} is not a number") from None
    bad = ~np.isfinite(arr)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{table.where(k)}: {what} {values[k]!r} is not finite "
            f"({int(bad.sum())} non-finite value(s) in total)"
        )
    return arr


def _parse_id(table: _Table, values: list[str], what: str) -> np.ndarray:
    """Integer ids when every value is a canonical ASCII integer, else stripped strings (so that
    distinct texts are distinct ids)."""
    if _ascii_integers(values, canonical=True):
        try:
            return np.fromiter(map(int, values), dtype=np.int64, count=len(values))
        except (ValueError, OverflowError):
            pass
    return np.array([v.strip().strip('"') for v in values], dtype=str)


def _parse_time(table: _Table, values: list[str], what: str) -> np.ndarray:
    """Integer unix timestamps, float seconds, or ISO dates / datetimes."""
    try:
        return np.fromiter(map(int, values), dtype=np.int64, count=len(values))
    except (ValueError, OverflowError):
        pass
    try:
        return _parse_float(table, values, what).astype(np.int64)
    except ValueError:
        pass
    try:
        stripped = [v.strip().strip('"').replace(" ", "T") for v in values]
        return np.array(stripped, dtype="datetime64[s]").astype(np.int64)
    except ValueError:
        k = _first_bad(values, lambda v: np.datetime64(v.strip().strip('"').replace(" ", "T"), "s"))
        raise ValueError(
            f"{table.where(k)}: {what} {values[k]!r} is neither a unix time nor an ISO date"
        ) from None


def _sniff_sep(path: Path, text: str) -> str | None:
    """The separator of a delimited text (from its first 20 non-blank lines), or None for
    whitespace."""
    sample = [ln for ln in _text_lines(text[:65536]) if ln.strip()][:20]
    if not sample:
        return None
    if all("::" in ln for ln in sample):
        return "::"
    for cand in ("\t", ",", ";", "|"):
        counts = {ln.count(cand) for ln in sample}
        if len(counts) == 1 and counts.pop() >= 1:
            return cand
    for cand in ("\t", ",", ";"):
        if all(cand in ln for ln in sample):
            return cand
    return None


def _resolve_column(spec: int | str, table: _Table, path: Path, what: str) -> int:
    """0-based position of a column given by position or by header name."""
    if isinstance(spec, (int, np.integer)):
        if spec < 0:
            raise ValueError(f"{what} column index must be >= 0, got {spec}")
        return int(spec)
    if table.header is None:
        raise ValueError(f"{path}: column {spec!r} given by name but the file has no header")
    if spec in table.header:
        return table.header.index(spec)
    lowered = [h.lower() for h in table.header]
    if spec.lower() in lowered:
        return lowered.index(spec.lower())
    raise ValueError(f"{path}: column {spec!r} not in header {table.header}")


def _empty(path: Path, table: _Table) -> None:
    if not table.lines:
        raise ValueError(f"{path}: no ratings found (file is empty or has only a header)")


def _finish(path: Path, table: _Table, u, i, r, ts, t0: float, what: str, **kw) -> Ratings:
    try:
        out = Ratings.from_triples(u, i, r, ts, **kw)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    logger.info(
        "loaded %s (%s): %d ratings, %d users, %d items in %.2f s",
        path, what, len(out), out.shape[0], out.shape[1], time.perf_counter() - t0,
    )
    return out


# --------------------------------------------------------------------------------------
# loaders
# --------------------------------------------------------------------------------------


# ratings.csv's logical columns and the header names each may go by (case-insensitive)
MOVIELENS_COLUMNS = {"user": ("userId", "user_id", "user"),
                     "item": ("movieId", "movie_id", "item", "itemId"),
                     "rating": ("rating",), "timestamp": ("timestamp", "time")}


def _named_columns(header, wanted=MOVIELENS_COLUMNS) -> dict[str, int]:
    """Positions in ``header`` of the logical columns ``wanted`` (the first alternative name
    present, case-insensitive); keys not found are absent."""
    lowered = [h.lower() for h in header]
    out = {}
    for key, alternatives in wanted.items():
        for alt in alternatives:
            if alt.lower() in lowered:
                out[key] = lowered.index(alt.lower())
                break
    return out
