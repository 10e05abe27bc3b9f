"""Generic user/item/rating tables (delimited text, quoted CSV, Parquet), the :func:`load`
dispatcher and :func:`load_titles`."""

from __future__ import annotations

import csv
import gzip
import io
import logging
import os
import re
import time
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import _fastload
from ._csv import Source, first_record, read_columns, split_line
from ._text import _looks_like_header, _read_text, _resolve_column, _sniff_sep, _text_lines
from .movielens import load_movielens_100k, load_movielens_csv, load_movielens_dat
from .netflix import load_netflix
from .ratings import Ratings, import_pandas

logger = logging.getLogger(__name__)


def _load_parquet(path: Path, columns, timestamp_column, **kw) -> Ratings:
    pd = import_pandas(f"reading {path}")
    try:
        df = pd.read_parquet(path)
    except ImportError as exc:  # pragma: no cover - environment dependent
        raise ImportError(
            f"reading {path} needs pyarrow (or fastparquet); install it with `pip install pyarrow`"
        ) from exc
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - Arrow's errors do not name the file
        raise ValueError(f"{path}: not a readable Parquet file ({type(exc).__name__}: "
                         f"{exc})") from None
    names = list(df.columns)

    def name(spec):
        if isinstance(spec, (int, np.integer)):
            return names[int(spec)]
        return spec

    ucol, icol, rcol = (name(c) for c in columns)
    tcol = name(timestamp_column) if timestamp_column is not None else None
    try:
        return Ratings.from_pandas(df, ucol, icol, rcol, tcol, **kw)
    except (ValueError, TypeError) as exc:          # the column is named, the file is not
        raise type(exc)(f"{path}: {exc}") from None
    except KeyError as exc:
        raise KeyError(f"{path}: {exc.args[0] if exc.args else exc}") from None


def load_triples(
    path: str | os.PathLike,
    *,
    sep: str | None = None,
    columns: Sequence[int | str] = (0, 1, 2),
    header: bool | str = "auto",
    timestamp_column: int | str | None = None,
    duplicates: str = "error",
) -> Ratings:
    """Load generic (user, item, rating) triples from a delimited text or parquet file.

    Parameters
    ----------
    path : str or path-like
        A text file (``.csv``, ``.tsv``, ``.txt``, ``.dat``..., optionally gzip-compressed)
        or a ``.parquet`` file (read with pandas + pyarrow, imported lazily).
    sep : str, optional
        Field separator; sniffed when ``None``: ``'::'``, tab, comma, ``';'``, ``'|'``,
        else any whitespace.
    columns : sequence of 3 int or str, default (0, 1, 2)
        User, item and rating columns, by 0-based position or by header name.
    header : {"auto", True, False}, default "auto"
        With "auto", the first line is a header when its rating field is not a number.
    timestamp_column : int or str, optional
        Column of timestamps: integer unix seconds, float seconds or ISO dates.
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        See :meth:`Ratings.from_triples`.

    Returns
    -------
    Ratings
        Ids that are all integers become integer raw ids; otherwise strings.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> r = load_triples("user_artists.dat")  # doctest: +SKIP
    >>> r.shape  # doctest: +SKIP
    (1892, 17632)
    """
    path = Path(path)
    t0 = time.perf_counter()
    columns = tuple(columns)
    if len(columns) != 3:
        raise ValueError(f"columns must name 3 columns (user, item, rating), got {columns!r}")
    if header not in ("auto", True, False):
        raise ValueError(f"header must be 'auto', True or False, got {header!r}")
    if path.suffix.lower() in (".parquet", ".pq"):
        fast = _fastload.parquet(path, columns, timestamp_column, duplicates, t0)
        if fast is not None:
            return fast
        return _load_parquet(path, columns, timestamp_column, duplicates=duplicates)
    if sep == "":
        raise ValueError("sep must be a non-empty string or None")
    src = Source.open(path)
    if sep is None:
        sep = _sniff_sep(path, src.head())
    rec = first_record(src)
    if rec is None:
        raise ValueError(f"{path}: no ratings found (file is empty or has only a header)")
    lineno, line = rec
    fields = split_line(line, sep)
    has_header = _looks_like_header(fields, columns[2]) if header == "auto" else bool(header)
    names = [f.strip().strip('"') for f in fields] if has_header else None
    idx = [_resolve_column(c, names, path, w) for c, w in zip(columns, ("user", "item", "rating"))]
    tcol = None
    if timestamp_column is not None:
        tcol = _resolve_column(timestamp_column, names, path, "timestamp")
    wanted = [(idx[0], "id", "user id"), (idx[1], "id", "item id"), (idx[2], "float", "rating")]
    if tcol is not None:
        wanted.append((tcol, "time", "timestamp"))
    cols = read_columns(src, sep, header_line=lineno if has_header else 0, ncols=len(fields),
                        exact=False, wanted=wanted)
    ts = cols[3] if tcol is not None else None
    return _fastload.finish(path, cols[0], cols[1], cols[2], ts, t0, f"triples, sep={sep!r}",
                            duplicates)


_ML100K_NAME = re.compile(r"^(u\.data|u[a-b1-5]\.(base|test))$")


def _first_line(path: Path) -> str:
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as fh:
                head = fh.read(4096)
        except (EOFError, OSError, zlib.error) as e:
            raise ValueError(f"{path}: truncated or corrupt gzip file ({type(e).__name__}: "
                             f"{e})") from None
    return head.decode("latin-1").split("\n", 1)[0].rstrip("\r")


def load(path: str | os.PathLike, **kwargs: Any) -> Ratings:
    """Load ratings, choosing the loader by the file's name, extension and first line.

    ``u.data`` / ``ua.base`` / ``u1.test`` / ``*.base`` / ``*.test`` go to
    :func:`load_movielens_100k`; ``ratings.csv`` (or a CSV whose header starts with
    ``userId,movieId``) to :func:`load_movielens_csv`; ``*.dat`` with ``::`` separators to
    :func:`load_movielens_dat`; ``mv_*.txt`` / ``combined_data*.txt`` to :func:`load_netflix`;
    ``.parquet`` and everything else to :func:`load_triples`. A directory is searched for
    ``u.data``, ``ratings.csv``, ``ratings.dat`` or Netflix files, in that order.

    Parameters
    ----------
    path : str or path-like
        A file or a directory.
    **kwargs
        Passed to the chosen loader.

    Returns
    -------
    Ratings

    Examples
    --------
    >>> load("ml-latest-small/ratings.csv").shape  # doctest: +SKIP
    (610, 9724)
    """
    path = Path(path)
    if path.is_dir():
        for name in ("u.data", "ratings.csv", "ratings.dat"):
            if (path / name).is_file():
                return load(path / name, **kwargs)
        if any(path.glob("mv_*.txt")) or (path / "training_set").is_dir() or any(
            path.glob("combined_data_*.txt")
        ):
            return load_netflix(path, **kwargs)
        raise ValueError(f"{path}: no known ratings file (u.data, ratings.csv, ratings.dat, mv_*.txt)")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = Path(name).suffix
    if _ML100K_NAME.match(name) or suffix in (".base", ".test"):
        return load_movielens_100k(path, **kwargs)
    if suffix in (".parquet", ".pq"):
        return load_triples(path, **kwargs)
    first = _first_line(path)
    if name == "ratings.csv" or (suffix == ".csv" and first.lower().startswith("userid,movieid")):
        return load_movielens_csv(path, **kwargs)
    if suffix == ".dat" and "::" in first:
        return load_movielens_dat(path, **kwargs)
    if name.startswith("mv_") or name.startswith("combined_data") or re.fullmatch(r"\d+:", first.strip()):
        return load_netflix(path, **kwargs)
    return load_triples(path, **kwargs)


def load_titles(path: str | os.PathLike) -> dict[Any, str]:
    """Read movie titles: ``u.item``, ``movies.csv``, ``movies.dat`` or ``movie_titles.txt``.

    Parameters
    ----------
    path : str or path-like
        ``u.item`` (``|``-separated, latin-1), ``movies.csv`` (quoted CSV with header
        ``movieId,title,genres``), ``movies.dat`` (``::``) or Netflix ``movie_titles.txt``
        (``id,year,title``).

    Returns
    -------
    dict
        Raw item id (int where numeric) -> title.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> titles = load_titles("ml-100k/u.item")  # doctest: +SKIP
    >>> titles[1]  # doctest: +SKIP
    'Toy Story (1995)'
    """
    path = Path(path)
    text = _read_text(path)
    lines = _text_lines(text)
    first = next((ln for ln in lines if ln.strip()), "")
    name = path.name.lower()

    def key(v: str, lineno: int):
        v = v.strip()
        try:
            if not v.isascii() or "_" in v:      # "１" and "1_0" are not the id 1 or 10
                raise ValueError(v)
            return int(v)
        except ValueError:
            if not v:
                raise ValueError(f"{path}: line {lineno}: empty movie id") from None
            return v

    titles: dict[Any, str] = {}
    if "::" in first:
        for k, ln in enumerate(lines, 1):
            if not ln.strip():
                continue
            f = ln.split("::")
            if len(f) < 2:
                raise ValueError(f"{path}: line {k}: expected 'id::title::genres': {ln[:200]!r}")
            titles[key(f[0], k)] = f[1]
        return titles
    if "|" in first and first.split("|", 1)[0].strip().isdigit():
        for k, ln in enumerate(lines, 1):
            if not ln.strip():
                continue
            f = ln.split("|")
            if len(f) < 2:
                raise ValueError(f"{path}: line {k}: expected 'id|title|...': {ln[:200]!r}")
            titles[key(f[0], k)] = f[1]
        return titles
    if name.startswith("movie_titles") or re.match(r"^\d+,(\d{4}|NULL),", first):
        for k, ln in enumerate(lines, 1):
            if not ln.strip():
                continue
            f = ln.split(",", 2)
            if len(f) < 3:
                raise ValueError(f"{path}: line {k}: expected 'id,year,title': {ln[:200]!r}")
            titles[key(f[0], k)] = f[2]
        return titles
    reader = csv.reader(io.StringIO("\n".join(lines)))
    header = None
    for row in reader:
        k = reader.line_num
        if not row or not any(c.strip() for c in row):
            continue
        if header is None:
            lowered = [c.strip().lower() for c in row]
            if "title" in lowered:
                header = lowered
                continue
            header = ["movieid", "title"]
        id_col = next((header.index(c) for c in ("movieid", "itemid", "id") if c in header), 0)
        t_col = header.index("title") if "title" in header else 1
        if len(row) <= max(id_col, t_col):
            raise ValueError(f"{path}: line {k}: expected {len(header)} fields, found {len(row)}")
        titles[key(row[id_col], k)] = row[t_col]
    return titles
