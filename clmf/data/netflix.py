"""The Netflix Prize loader (``training_set/mv_*.txt`` or one combined file)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np

from ._csv import Converter, Source
from ._fastload import finish
from ._ids import factorize
from .ratings import Ratings

logger = logging.getLogger(__name__)


def _parse_netflix_file(path: Path) -> tuple[np.ndarray, ...]:
    """``(customers, movies, ratings, timestamps)`` of one file: ``movieid:`` lines, each
    followed by ``customer,rating,YYYY-MM-DD`` lines (read by pyarrow, :mod:`._csv`)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    src = Source.open(path)
    lines = src.lines()
    stripped = pc.utf8_trim_whitespace(lines)
    blank = pc.equal(pc.utf8_length(stripped), 0).to_numpy(zero_copy_only=False)
    is_hdr = pc.ends_with(stripped, ":").to_numpy(zero_copy_only=False)
    hdr_pos = np.flatnonzero(is_hdr)
    data_pos = np.flatnonzero(~is_hdr & ~blank)
    if data_pos.size == 0:
        raise ValueError(f"{path}: no ratings found")
    if hdr_pos.size == 0 or data_pos[0] < hdr_pos[0]:
        k = int(data_pos[0])
        raise ValueError(f"{path}: line {k + 1}: rating line before any 'movieid:' header: "
                         f"{lines[k].as_py()[:200]!r}")
    headers = pc.utf8_slice_codeunits(stripped.take(pa.array(hdr_pos)), 0, -1)
    try:
        movie_ids = pc.cast(pc.utf8_trim_whitespace(headers), pa.int64()).to_numpy()
    except pa.ArrowInvalid:
        k = Converter._first_refused(headers, lambda c: pc.cast(pc.utf8_trim_whitespace(c),
                                                                pa.int64()))
        p = int(hdr_pos[k])
        raise ValueError(f"{path}: line {p + 1}: movie header {lines[p].as_py()[:200]!r} is not "
                         "'<integer>:'") from None
    items = movie_ids[(np.cumsum(is_hdr) - 1)[data_pos]]
    fields = pc.split_pattern(stripped.take(pa.array(data_pos)), ",")
    counts = pc.list_value_length(fields).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(counts != 3)
    if bad.size:
        k = int(data_pos[bad[0]])
        raise ValueError(f"{path}: line {k + 1}: expected 3 fields 'customer,rating,date', found "
                         f"{int(counts[bad[0]])}: {lines[k].as_py()[:200]!r}")
    conv = Converter(lambda k: f"{path}: line {int(data_pos[k]) + 1}")
    u = conv.ints(pc.list_element(fields, 0), "customer id")
    r = conv.floats(pc.list_element(fields, 1), "rating")
    dates = pc.utf8_trim_whitespace(pc.list_element(fields, 2))
    try:
        days = pc.cast(pc.cast(dates, pa.date32()), pa.int32()).to_numpy()
    except pa.ArrowInvalid:
        k = Converter._first_refused(dates, lambda c: pc.cast(c, pa.date32()))
        raise conv._fail(dates, k, "date", "is not YYYY-MM-DD") from None
    return u, items, r, days.astype(np.int64) * 86400


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
    return finish(path, factorize(u, np.int32), factorize(i, np.int32), r, ts, t0,
                  f"Netflix, {len(files)} file(s)", duplicates)
