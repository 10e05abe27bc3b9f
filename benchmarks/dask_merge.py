"""A Dask worker's merge of its pieces (issue 28): :class:`clmf.parallel.dask_blocks.RowMerger`
adding Netflix-shaped pieces at several thread counts, and whether the NumPy operations a
merging thread runs release the GIL (the longest a ticking Python thread waits while one runs:
about the operation's whole time where it holds the GIL).

    python benchmarks/dask_merge.py --threads 1 2 4 8 --pieces 12 --entries 2000000

Pieces of the items side (rows interleaved across pieces: the scatter) and of the users side
(whole rows of a user-sorted file: one slice each); every thread count's arrays are checked
equal to one thread's.
"""
from __future__ import annotations

import argparse
import logging
import threading
import time

import numpy as np

from clmf.parallel.dask_blocks import RowMerger

log = logging.getLogger("dask_merge")


def pieces(rng, n_pieces, entries, rows, whole):
    """Pieces sorted by row (field 0) of ``rows`` rows: each of its own rows (``whole``) or of
    rows drawn from all of them."""
    out = []
    for p in range(n_pieces):
        lo, hi = (rows * p // n_pieces, rows * (p + 1) // n_pieces) if whole else (0, rows)
        r = np.sort(rng.integers(lo, hi, entries)).astype(np.int32)
        out.append((r, rng.integers(0, 1 << 20, entries).astype(np.int32),
                    rng.random(entries, dtype=np.float32)))
    return out


def merge(ps, rows, threads):
    """``(seconds of the adds, merged arrays)`` of the pieces by a merger of ``threads``."""
    counts = sum(np.bincount(p[0], minlength=rows) for p in ps)
    m = RowMerger(counts, 0, 0, "users", threads)
    t = time.perf_counter()
    for p in ps:
        assert m.add(p)
    return time.perf_counter() - t, m.result()


def gil_waits(n):
    """``{operation: (seconds, longest wait of a ticking thread)}`` of a merge's operations."""
    rng = np.random.default_rng(0)
    rows = np.sort(rng.integers(0, 4000, n)).astype(np.int32)
    dest, vals, out = rng.permutation(n), rng.random(n, np.float32), np.empty(n, np.float32)
    c = np.bincount(rows, minlength=4000)
    ops = {"bincount": lambda: np.bincount(rows), "repeat": lambda: np.repeat(c, c),
           "searchsorted": lambda: np.searchsorted(rows, np.arange(4001, dtype=np.int32)),
           "cumsum": lambda: np.cumsum(dest), "fancy assignment": lambda: out.__setitem__(
               dest, vals), "compare + all": lambda: bool(np.all(rows[1:] >= rows[:-1]))}
    got = {}
    for name, op in ops.items():
        stop, worst = [False], [0.0]

        def tick(stop=stop, worst=worst):
            """Sleep briefly again and again, keeping the longest wait."""
            while not stop[0]:
                t = time.perf_counter()
                time.sleep(0.0005)
                worst[0] = max(worst[0], time.perf_counter() - t)
        th = threading.Thread(target=tick)
        th.start()
        time.sleep(0.01)
        t = time.perf_counter()
        op()
        got[name] = (time.perf_counter() - t, worst[0])
        stop[0] = True
        th.join()
    return got


def main():
    """Time the merges, check them equal, then the GIL waits."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--pieces", type=int, default=4)
    ap.add_argument("--entries", type=int, default=2_000_000, help="entries per piece")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rng = np.random.default_rng(1)
    for label, rows, whole in (("items (scatter)", 4_443, False),
                               ("users (slices)", 120_000, True)):
        ps = pieces(rng, args.pieces, args.entries, rows, whole)
        first = None
        for k in args.threads:
            times = []
            for _ in range(args.repeats):
                dt, out = merge(ps, rows, k)
                times.append(dt)
            first = first or out
            assert all(np.array_equal(a, b) for a, b in zip(first, out))
            log.info("%-16s %d thread(s): median %.1f ms, best %.1f ms (%d pieces x %d)", label,
                     k, 1e3 * np.median(times), 1e3 * min(times), args.pieces, args.entries)
    for name, (sec, wait) in gil_waits(4 * args.entries).items():
        log.info("%-18s %.1f ms, a ticking thread waited at most %.1f ms", name, 1e3 * sec,
                 1e3 * wait)


if __name__ == "__main__":
    main()
