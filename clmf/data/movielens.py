"""MovieLens loaders: ``u.data`` (100K, with its canonical u1..u5 splits), ``ratings.csv``
and ``ratings.dat``."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np

from ._csv import Source, first_record, read_columns, split_line
from ._fastload import finish
from ._ids import factorize
from ._text import _looks_like_header, _named_columns
from .ratings import Ratings, _factorize

logger = logging.getLogger(__name__)


def _no_ratings(path: Path) -> ValueError:
    """The error of a file without ratings."""
    return ValueError(f"{path}: no ratings found (file is empty or has only a header)")


def _read_ml100k(path: Path) -> tuple[np.ndarray, ...]:
    """``(users, items, ratings, timestamps)`` of a 100K file: 4 fields a line, tab-separated
    (whitespace-separated when its first line has no tab)."""
    src = Source.open(path)
    rec = first_record(src)
    if rec is None:
        raise _no_ratings(path)
    sep = "\t" if "\t" in rec[1] else None
    return tuple(read_columns(src, sep, header_line=0, ncols=4, exact=True, wanted=[
        (0, "int", "user id"), (1, "int", "item id"), (2, "float", "rating"),
        (3, "int", "timestamp")]))


def load_movielens_100k(path: str | os.PathLike, *, duplicates: str = "error") -> Ratings:
    """Load a MovieLens 100K ratings file (``u.data``, ``ua.base``, ``u1.test``, ...).

    The format is ``user item rating timestamp`` separated by tabs, without a header.

    Parameters
    ----------
    path : str or path-like
        The file.
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        See :meth:`Ratings.from_triples`.

    Returns
    -------
    Ratings
        With timestamps; id maps hold the raw MovieLens ids.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> r = load_movielens_100k("ml-100k/u.data")  # doctest: +SKIP
    >>> r.shape  # doctest: +SKIP
    (943, 1682)
    """
    path = Path(path)
    t0 = time.perf_counter()
    u, i, r, ts = _read_ml100k(path)
    return finish(path, factorize(u, np.int32), factorize(i, np.int32), r, ts, t0,
                  "MovieLens 100K", duplicates)


def load_movielens_100k_split(
    directory: str | os.PathLike, split: str = "ua"
) -> tuple[Ratings, Ratings]:
    """Load an official MovieLens 100K split (``ua``, ``ub``, ``u1`` ... ``u5``).

    Train (``<split>.base``) and test (``<split>.test``) share one pair of id maps built over
    the union of both files, so an index means the same user/item in both.

    Parameters
    ----------
    directory : str or path-like
        The ``ml-100k`` directory.
    split : {"ua", "ub", "u1", "u2", "u3", "u4", "u5"}, default "ua"
        Which split.

    Returns
    -------
    (Ratings, Ratings)
        ``(train, test)`` with identical ``user_ids``, ``item_ids`` and ``shape``.

    Raises
    ------
    ValueError
        On an unknown split name, a malformed line, or a (user, item) pair that occurs in
        both files.

    Examples
    --------
    >>> train, test = load_movielens_100k_split("ml-100k", "ua")  # doctest: +SKIP
    >>> len(train), len(test), train.shape == test.shape  # doctest: +SKIP
    (90570, 9430, True)
    """
    valid = ("ua", "ub", "u1", "u2", "u3", "u4", "u5")
    if split not in valid:
        raise ValueError(f"split must be one of {valid}, got {split!r}")
    directory = Path(directory)
    t0 = time.perf_counter()
    base_path, test_path = directory / f"{split}.base", directory / f"{split}.test"
    for p in (base_path, test_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} not found")
    bu, bi, br, bt = _read_ml100k(base_path)
    tu, ti, tr, tt = _read_ml100k(test_path)
    umap, _ = _factorize(np.concatenate([bu, tu]))
    imap, _ = _factorize(np.concatenate([bi, ti]))
    parts = []
    for p, (u, i, r, t) in ((base_path, (bu, bi, br, bt)), (test_path, (tu, ti, tr, tt))):
        try:
            parts.append(Ratings.from_triples(u, i, r, t, user_ids=umap, item_ids=imap))
        except ValueError as exc:
            raise ValueError(f"{p}: {exc}") from None
    train, test = parts
    n = train.shape[1]
    overlap = np.intersect1d(
        train.users.astype(np.int64) * n + train.items, test.users.astype(np.int64) * n + test.items
    )
    if overlap.size:
        raise ValueError(
            f"{base_path} and {test_path} share {overlap.size} (user, item) pair(s)"
        )
    # share the exact same map objects
    test = Ratings._new(test.users, test.items, test.ratings, test.timestamps,
                        train.user_ids, train.item_ids)
    logger.info("loaded MovieLens 100K split %r from %s: %d train / %d test in %.2f s",
                split, directory, len(train), len(test), time.perf_counter() - t0)
    return train, test


def load_movielens_csv(path: str | os.PathLike, *, duplicates: str = "error") -> Ratings:
    """Load a MovieLens ``ratings.csv`` (latest, latest-small, 20M, 25M, 32M).

    Header ``userId,movieId,rating,timestamp`` (columns are found by name; a file without
    a header is read in that order; the timestamp column is optional).

    Parameters
    ----------
    path : str or path-like
        The CSV file (LF or CRLF, UTF-8 or latin-1, optionally gzip-compressed).
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        See :meth:`Ratings.from_triples`.

    Returns
    -------
    Ratings
        With timestamps when the file has them.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> r = load_movielens_csv("ml-latest-small/ratings.csv")  # doctest: +SKIP
    >>> len(r), r.shape  # doctest: +SKIP
    (100836, (610, 9724))
    """
    path = Path(path)
    t0 = time.perf_counter()
    src = Source.open(path)
    rec = first_record(src)
    if rec is None:
        raise _no_ratings(path)
    lineno, line = rec
    fields = split_line(line, ",")
    if _looks_like_header(fields, 2):
        header = [f.strip().strip('"') for f in fields]
        idx = _named_columns(header)
        missing = [k for k in ("user", "item", "rating") if k not in idx]
        if missing:
            raise ValueError(
                f"{path}: line {lineno}: header {header} lacks column(s) for {missing} "
                "(expected userId,movieId,rating,timestamp)")
    else:
        header = None
        if len(fields) not in (3, 4):
            raise ValueError(f"{path}: line {lineno}: expected 3 or 4 fields, found "
                             f"{len(fields)}")
        idx = {"user": 0, "item": 1, "rating": 2, **({"timestamp": 3} if len(fields) == 4
                                                     else {})}
    names = {"user": ("int", "userId"), "item": ("int", "movieId"),
             "rating": ("float", "rating"), "timestamp": ("int", "timestamp")}
    keys = list(idx)
    cols = dict(zip(keys, read_columns(src, ",", header_line=lineno if header else 0,
                                       ncols=len(fields), exact=True,
                                       wanted=[(idx[k], *names[k]) for k in keys])))
    return finish(path, factorize(cols["user"], np.int32), factorize(cols["item"], np.int32),
                  cols["rating"], cols.get("timestamp"), t0, "MovieLens CSV", duplicates)


def load_movielens_dat(path: str | os.PathLike, *, duplicates: str = "error") -> Ratings:
    """Load a MovieLens 1M / 10M ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``).

    Parameters
    ----------
    path : str or path-like
        The file.
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        See :meth:`Ratings.from_triples`.

    Returns
    -------
    Ratings
        With timestamps.

    Raises
    ------
    ValueError
        On a malformed line (message names the file and the 1-based line number).

    Examples
    --------
    >>> r = load_movielens_dat("ml-1m/ratings.dat")  # doctest: +SKIP
    >>> r.shape  # doctest: +SKIP
    (6040, 3706)
    """
    path = Path(path)
    t0 = time.perf_counter()
    src = Source.open(path)
    if first_record(src) is None:
        raise _no_ratings(path)
    cols = read_columns(src, "::", header_line=0, ncols=4, exact=True, wanted=[
        (0, "int", "UserID"), (1, "int", "MovieID"), (2, "float", "Rating"),
        (3, "int", "Timestamp")])
    return finish(path, factorize(cols[0], np.int32), factorize(cols[1], np.int32), cols[2],
                  cols[3], t0, "MovieLens .dat", duplicates)
