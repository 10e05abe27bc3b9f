"""What the file loaders share beyond reading (:mod:`._csv` reads): decoding a whole small text
(titles), the separator sniffer, header detection, columns by name or position, and building the
:class:`Ratings` with errors that name the file."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from ._csv import _gunzip, text_lines
from .ratings import Ratings

logger = logging.getLogger(__name__)

_text_lines = text_lines


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


def _resolve_column(spec: int | str, header: list[str] | None, path: Path, what: str) -> int:
    """0-based position of a column given by position or by name in ``header`` (None: the file
    has none)."""
    if isinstance(spec, (int, np.integer)):
        if spec < 0:
            raise ValueError(f"{what} column index must be >= 0, got {spec}")
        return int(spec)
    if header is None:
        raise ValueError(f"{path}: column {spec!r} given by name but the file has no header")
    if spec in header:
        return header.index(spec)
    lowered = [h.lower() for h in header]
    if spec.lower() in lowered:
        return lowered.index(spec.lower())
    raise ValueError(f"{path}: column {spec!r} not in header {header}")


def _finish(path: Path, u, i, r, ts, t0: float, what: str, **kw) -> Ratings:
    """:meth:`Ratings.from_triples` of parsed columns, its errors prefixed with the file."""
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
