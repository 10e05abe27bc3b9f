#!/usr/bin/env python3
"""Loaders at speed (issue 16): rows per second of clmf's file loaders on a generated
MovieLens-style data set (Parquet's fast path also against the pandas path it stands in for).

A ``ratings.csv`` (``userId,movieId,rating,timestamp``, sorted by user then movie as MovieLens
ships it, ratings 0.5..5.0 written as ``4.0``, 10-digit timestamps; the ML-25M shape scaled to
``--rows``) and the same table as ``ratings.parquet`` are written to a temporary directory (under
``--tmp``, removed at the end). Then, each in the same process:

- ``load_movielens_csv(ratings.csv)``: pyarrow's CSV reader (:mod:`clmf.data._csv`, the one
  reader of text files since issue 34; the line parser it stood in for is gone);
- ``load_triples(ratings.csv, timestamp_column=3)``: the same reader, ids as dictionary text;
- ``load_triples(ratings.parquet, ...)``: fast path (pyarrow.parquet) vs pandas.

Each loader runs ``--repeats`` times, Parquet's pandas path ``--old-repeats`` times; the tables
give medians (and the first run in the process, which pays the one-time costs: imports, thread
pools, the allocators' first pages), and the Parquet result is checked identical to pandas'
(ids, maps, values).

    python3 -P benchmarks/loader_bench.py OUT --rows 25000000

needs numpy, scipy, pyarrow, pandas and clmf (installed, or this checkout's ``clmf/`` found
through the script's location) and writes OUT/loaders.json and OUT/loaders.md with host facts
(CPU model, cores, memory, versions, date, commit).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def log(msg):
    """Timestamped progress on stderr."""
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", file=sys.stderr,
          flush=True)


def import_clmf():
    """The clmf package: installed, else this checkout's (the script runs with ``python -P``)."""
    try:
        import clmf
    except ImportError:
        sys.path.insert(0, str(REPO))
        import clmf
    return clmf


def generate(rows, directory, seed=0):
    """Write ``ratings.csv`` and ``ratings.parquet`` of ``rows`` MovieLens-style ratings (the
    ML-25M shape: 162,541 users and 59,047 movies at 25M rows, scaled; small sets get more users
    and movies so that at most a quarter of the matrix is rated) into ``directory``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    rng = np.random.default_rng(seed)
    n_users = max(2, round(rows * 162541 / 25_000_095))
    n_items = max(2, round(rows * 59047 / 25_000_095))
    grow = max(1.0, (4 * rows / (n_users * n_items)) ** 0.5)   # small sets: at most 1/4 dense
    n_users, n_items = math.ceil(n_users * grow), math.ceil(n_items * grow)
    cells = n_users * n_items
    keys = np.unique(rng.integers(0, cells, int(rows * 1.05) + 100, dtype=np.int64))
    while len(keys) < rows:
        keys = np.unique(np.concatenate([keys, rng.integers(0, cells, rows, dtype=np.int64)]))
    keys = keys[np.sort(rng.permutation(len(keys))[:rows])]
    users = (keys // n_items + 1).astype(np.int64)
    items = (keys % n_items + 1).astype(np.int64)
    del keys
    halves = rng.integers(1, 11, rows).astype(np.int32)
    stamps = rng.integers(789_652_009, 1_574_327_703, rows, dtype=np.int64)
    text = pa.DictionaryArray.from_arrays(pa.array(halves - 1),
                                          pa.array([f"{k / 2:.1f}" for k in range(1, 11)]))
    csv = directory / "ratings.csv"
    with open(csv, "wb") as fh:
        fh.write(b"userId,movieId,rating,timestamp\n")
        pacsv.write_csv(pa.table({"u": users, "i": items, "r": text.cast(pa.string()),
                                  "t": stamps}), fh,
                        pacsv.WriteOptions(include_header=False, quoting_style="none"))
    parquet = directory / "ratings.parquet"
    pq.write_table(pa.table({"userId": users, "movieId": items, "rating": halves / 2.0,
                             "timestamp": stamps}), parquet)
    return csv, parquet


def cases(clmf, csv, parquet):
    """(name, file, call, name of the fast path in clmf.data._fastload or None, what the old path
    is)."""
    ds = clmf.data
    return [
        ("MovieLens CSV", csv, lambda: ds.load_movielens_csv(csv), None, "—"),
        ("triples CSV", csv, lambda: ds.load_triples(csv, timestamp_column=3), None, "—"),
        ("Parquet", parquet, lambda: ds.load_triples(parquet, columns=("userId", "movieId",
                                                                       "rating"),
                                                     timestamp_column="timestamp"),
         "parquet", "pandas"),
    ]


def timed(call, repeats):
    """``(seconds of each run, last result)``."""
    secs, out = [], None
    for _ in range(repeats):
        out = None
        t = time.perf_counter()
        out = call()
        secs.append(time.perf_counter() - t)
    return secs, out


def identical(a, b):
    """Whether two Ratings hold the same indices, values, timestamps and id maps (and dtypes)."""
    import numpy as np
    for f in ("users", "items", "ratings", "timestamps", "user_ids", "item_ids"):
        x, y = getattr(a, f), getattr(b, f)
        if (x is None) != (y is None):
            return False
        if x is not None and (x.dtype != y.dtype or not np.array_equal(x, y)):
            return False
    return True


def commit():
    """The commit measured: ``$CLMF_COMMIT``, else this checkout's HEAD, else clmf's own idea."""
    if os.environ.get("CLMF_COMMIT"):
        return os.environ["CLMF_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        try:
            from clmf.provenance import commit as clmf_commit
            return clmf_commit()
        except ImportError:
            return "unknown"


def host():
    """Device-independent facts of this host and its software."""
    import numpy
    import pandas
    import pyarrow
    import scipy
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh
                          if ln.startswith("model name")), model)
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem = float("nan")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cores": os.cpu_count(), "cores_usable": usable,
            "memory_gib": round(mem, 1), "os": platform.platform(),
            "python": platform.python_version(), "numpy": numpy.__version__,
            "scipy": scipy.__version__, "pyarrow": pyarrow.__version__,
            "pandas": pandas.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit(), "loadavg_1min": round(os.getloadavg()[0], 2)}


def markdown(doc):
    """The report as a Markdown table with the host facts."""
    h = doc["host"]
    lines = [f"# Loaders at speed: {doc['rows']:,} MovieLens-style rows", "",
             f"`{doc['command']}`", "",
             f"{h['cpu']}, {h['cores']} cores ({h['cores_usable']} usable), "
             f"{h['memory_gib']} GiB; Python {h['python']}, numpy {h['numpy']}, "
             f"pyarrow {h['pyarrow']}, pandas {h['pandas']}; {h['date']}, commit "
             f"`{h['commit']}`, load average {h['loadavg_1min']} at the start.", "",
             f"CSV {doc['csv_mib']:.0f} MiB, Parquet {doc['parquet_mib']:.0f} MiB; medians of "
             f"{doc['repeats']} fast and {doc['old_repeats']} old run(s).", "",
             "| loader | old path | old s | old rows/s | fast s | fast rows/s | fast 1st run s "
             "| speed-up | identical |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for c in doc["cases"]:
        old = c.get("old_s")
        lines.append(
            f"| {c['name']} | {c['old_path']} | "
            + (f"{old:.2f} | {c['old_rows_per_s'] / 1e6:.2f}M" if old else "— | —")
            + f" | {c['fast_s']:.2f} | {c['fast_rows_per_s'] / 1e6:.2f}M"
            + f" | {c['fast_runs_s'][0]:.2f} | "
            + (f"{old / c['fast_s']:.1f}×" if old else "—")
            + f" | {c.get('identical', '—')} |")
    return "\n".join(lines) + "\n"


def write_atomic(path, text):
    """Write ``text`` to ``path`` through a temporary file renamed over it (never half-written)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv=None):
    """Generate the files, time the loaders, write the report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=pathlib.Path, help="output directory (loaders.md, loaders.json)")
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each fast path")
    ap.add_argument("--old-repeats", type=int, default=1, help="runs of each old path (0: none)")
    ap.add_argument("--tmp", default=None, help="where the temporary data directory goes")
    ap.add_argument("--rewrite-md", action="store_true",
                    help="only write OUT/loaders.md again from OUT/loaders.json")
    args = ap.parse_args(argv)
    if args.rewrite_md:
        write_atomic(args.out / "loaders.md",
                     markdown(json.loads((args.out / "loaders.json").read_text())))
        return 0
    clmf = import_clmf()
    from clmf.data import _fastload
    doc = {"command": "python3 -P benchmarks/loader_bench.py "
                      + " ".join(sys.argv[1:] if argv is None else argv),
           "rows": args.rows, "repeats": args.repeats, "old_repeats": args.old_repeats,
           "host": host(), "cases": []}
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="clmf-loader-bench-", dir=args.tmp))
    try:
        log(f"generating {args.rows:,} rows in {tmp}")
        csv, parquet = generate(args.rows, tmp)
        doc["csv_mib"] = csv.stat().st_size / 2**20
        doc["parquet_mib"] = parquet.stat().st_size / 2**20
        for name, path, call, fast_name, old_path in cases(clmf, csv, parquet):
            secs, fast = timed(call, args.repeats)
            med = statistics.median(secs)
            log(f"{name}: fast {secs} s")
            row = {"name": name, "file": path.name, "old_path": old_path, "fast_runs_s": secs,
                   "fast_s": med, "fast_rows_per_s": len(fast) / med, "rows": len(fast)}
            if args.old_repeats and fast_name is not None:
                real = getattr(_fastload, fast_name)
                setattr(_fastload, fast_name, lambda *a, **k: None)
                try:
                    old_secs, old = timed(call, args.old_repeats)
                finally:
                    setattr(_fastload, fast_name, real)
                old_med = statistics.median(old_secs)
                log(f"{name}: old {old_secs} s")
                row.update(old_runs_s=old_secs, old_s=old_med,
                           old_rows_per_s=len(old) / old_med, speedup=old_med / med,
                           identical=identical(fast, old))
                del old
            del fast
            doc["cases"].append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "loaders.json", json.dumps(doc, indent=1) + "\n")
    write_atomic(args.out / "loaders.md", markdown(doc))
    sys.stdout.write(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
