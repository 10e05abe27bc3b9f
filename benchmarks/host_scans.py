#!/usr/bin/env python3
"""The host passes of a fit's set-up (``clmf.data.scan``) on Netflix-sized arrays, by thread
count and chunk size: column counts, the values' range, the finite check of factor-sized arrays
and the CSR's canonical check, each the median of ``--repeats`` runs (issue 27's whole fits:
the GPU host's 16 cores counted 99M column indices in 0.20 s, slower than one core should).

    python benchmarks/host_scans.py OUTDIR [--nnz 99072112] [--threads 1 2 4 8 16]

Writes OUTDIR/host_scans.json and OUTDIR/host_scans.md (machine, date, commit, command).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import numpy as np


def timed(fn, repeats):
    """Median wall seconds of ``repeats`` calls of ``fn``."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main():
    """Time each scan at each thread count and chunk size; write the tables."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--nnz", type=int, default=99_072_112)
    p.add_argument("--cols", type=int, default=17_770)
    p.add_argument("--rows", type=int, default=480_189)
    p.add_argument("--factors", type=int, default=64)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--chunks", type=int, nargs="+", default=[1 << 20, 1 << 18])
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    from clmf.data import scan
    rng = np.random.default_rng(0)
    idx = rng.integers(0, a.cols, a.nnz, dtype=np.int32)
    vals = rng.random(a.nnz, dtype=np.float32)
    indptr = np.linspace(0, a.nnz, a.rows + 1).astype(np.int64)
    for r in range(0, a.rows, 4096):       # sorted rows: the canonical check passes
        lo, hi = indptr[r], indptr[min(a.rows, r + 4096)]
        idx[lo:hi] = np.sort(idx[lo:hi])  # (not per row, but each row's part stays sorted)
    F = rng.random((a.rows, a.factors), dtype=np.float32)
    rows = []
    cases = {
        "count_columns": lambda: scan.count_columns(idx, a.cols),
        "value_range": lambda: scan.value_range(vals),
        "all_finite (factors)": lambda: scan.all_finite(F),
        "bincount, one call": lambda: np.bincount(idx, minlength=a.cols),
    }
    for chunk in a.chunks:
        for t in a.threads:
            scan.CHUNK, scan.THREADS = chunk, t
            scan._pool.cache_clear()
            for name, fn in cases.items():
                if name.startswith("bincount") and (t, chunk) != (a.threads[0], a.chunks[0]):
                    continue
                s = timed(fn, a.repeats)
                rows.append({"scan": name, "threads": t, "chunk": chunk, "seconds": s,
                             "ns_per_entry": s / (F.size if "factors" in name else a.nnz) * 1e9})
                print(f"{name:22s} threads {t:2d} chunk {chunk:8d}: {s:.4f} s", flush=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=pathlib.Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": os.environ.get("CLMF_COMMIT") or commit, "host": platform.node(),
            "cpu_count": os.cpu_count(), "numpy": np.__version__,
            "command": "python " + " ".join(sys.argv)}
    out = pathlib.Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_scans.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    lines = [f"# Host scans: {a.nnz} entries, {a.cols} columns; factors {a.rows} × {a.factors}",
             "", f"{meta['date']}, commit {meta['commit']}, {meta['cpu_count']} CPUs, NumPy "
             f"{meta['numpy']}", "", f"Command: `{meta['command']}`", "",
             "| scan | threads | chunk | s (median) | ns/entry |", "|---|---|---|---|---|"]
    lines += [f"| {r['scan']} | {r['threads']} | {r['chunk']} | {r['seconds']:.4f} | "
              f"{r['ns_per_entry']:.2f} |" for r in rows]
    (out / "host_scans.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
