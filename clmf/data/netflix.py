"""The Netflix Prize loader (``training_set/mv_*.txt`` or one combined file)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np

from ._text import (
    _finish,
    _first_bad,
    _parse_float,
    _parse_int,
    _read_text,
    _Table,
    _text_lines,
)
from .ratings import Ratings

logger = logging.getLogger(__name__)


def _parse_netflix_file(path: Path) -> tuple[np.ndarray, ...]:
    lines = _text_lines(_read_text(path))
    n = len(lines)
    stripped = [ln.strip() for ln in lines]
    is_blank = np.fromiter((not s for s in stripped), dtype=bool, count=n)
    is_hdr = np.fromiter((s.endswith(":") for s in stripped), dtype=bool, count=n)
    hdr_pos = np.flatnonzero(is_hdr)
    data_pos = np.flatnonzero(~is_hdr & ~is_blank)
    if data_pos.size == 0:
        raise ValueError(f"{path}: no ratings found")
    if hdr_pos.size == 0 or data_pos[0] < hdr_pos[0]:
        k = int(data_pos[0])
        raise ValueError(
            f"{path}: line {k + 1}: rating line before any 'movieid:' header: {lines[k][:200]!r}"
        )
    movie_ids = np.empty(hdr_pos.size, dtype=np.int64)
    for j, p in enumerate(hdr_pos):
        try:
            movie_ids[j] = int(stripped[p][:-1])
        except ValueError:
            raise ValueError(
                f"{path}: line {p + 1}: movie header {lines[p][:200]!r} is not '<integer>:'"
            ) from None
    block = np.cumsum(is_hdr) - 1
    items = movie_ids[block[data_pos]]
    data_lines = [stripped[k] for k in data_pos]
    counts = np.fromiter((s.count(",") for s in data_lines), dtype=np.int64, count=len(data_lines))
    bad = np.flatnonzero(counts != 2)
    if bad.size:
        k = int(data_pos[bad[0]])
        raise ValueError(
            f"{path}: line {k + 1}: expected 3 fields 'customer,rating,date', found "
            f"{int(counts[bad[0]]) + 1}: {lines[k][:200]!r}"
        )
    flat = ",".join(data_lines).split(",")
    linenos_table = _Table.__new__(_Table)
    linenos_table.path = path
    linenos_table.linenos = data_pos + 1
    u = _parse_int(linenos_table, flat[0::3], "customer id")
    r = _parse_float(linenos_table, flat[1::3], "rating")
    dates = flat[2::3]
    try:
        ts = np.array(dates, dtype="datetime64[D]").astype(np.int64) * 86400
    except ValueError:
        k = _first_bad(dates, lambda v: np.datetime64(v, "D"))
        raise ValueError(
            f"{linenos_table.where(k)}: date {dates[k]!r} is not YYYY-MM-DD"
        ) from None
    return u, items, r, ts


def load_netflix(path_or_dir: str | os.PathLike, *, duplicates: str = "error") -> Ratings:
    """Load Netflix-prize ratings.

    Accepts a per-movie file (``mv_0000001.txt``: a ``1:`` line, then
    ``customer,rating,YYYY-MM-DD`` lines), a ``combined_data_*.txt`` style file (many
    ``movieid:`` blocks), or a directory holding either kind (``training_set/`` is looked
    into). Dates become unix timestamps (midnight UTC).

    Parameters
    ----------
    path_or_dir : str or path-like
        A file or a directory.
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        See :meth:`Ratings.from_triples`.

    Returns
    -------
    Ratings
        Users are customer ids, items movie ids, with timestamps.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> r = load_netflix("netflix/training_set")  # doctest: +SKIP
    >>> r.shape  # doctest: +SKIP
    (480189, 17770)
    """
    path = Path(path_or_dir)
    t0 = time.perf_counter()
    if path.is_dir():
        root = path / "training_set" if (path / "training_set").is_dir() else path
        files = sorted(root.glob("mv_*.txt")) or sorted(root.glob("combined_data_*.txt"))
        if not files:
            raise ValueError(f"{path}: no mv_*.txt or combined_data_*.txt files found")
    else:
        files = [path]
    parts = [_parse_netflix_file(f) for f in files]
    u, i, r, ts = (np.concatenate([p[k] for p in parts]) for k in range(4))
    return _finish(path, None, u, i, r, ts, t0, f"Netflix, {len(files)} file(s)",
                   duplicates=duplicates)
