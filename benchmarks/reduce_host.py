#!/usr/bin/env python3
"""The reduce mode's host work at f = 100 (issue 28), without devices: summing the devices'
partial systems of a reduced side, the former way and the pipelined one, alternately in one
process (this machine's host threads; no OpenCL).

    python benchmarks/reduce_host.py OUTDIR [--rows 4000] [--devices 4] [--factors 100]
        [--repeats 5] [--threads N]

``full`` (clmf before the pipeline, 9be68d9's ``MultiEngine._reduce``): every device's rows ×
(f² + f) floats, summed after the last device finished, into each owner's rows in 64 MiB steps
on a thread pool, the diagonal's λ added on the host. ``packed``
(:class:`clmf.parallel.reducer.Reducer`): rows × (f(f+1)/2 + f) floats, segment by segment as
the landings are reported (here all at once, in row order, from one thread as the devices'
threads do), the λ and Gram added on the device. Reported: wall seconds from the first landing
to the last sum, the summing threads' seconds, and the bytes a device sends and receives.
Written to ``OUTDIR/reduce_host.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import time

import numpy as np


def full_sum(A, B, bounds, fs, threads, lam=0.05):
    """The former host reduce: each owner's rows += every other device's, then λ on the
    diagonal (64 MiB steps in threads)."""
    n = len(A)
    diag = np.arange(fs)
    step = max(1, (64 << 20) // (4 * fs * fs))
    jobs = [(d, a, min(a + step, bounds[d + 1])) for d in range(n)
            for a in range(bounds[d], bounds[d + 1], step)]
    spent = []

    def work(job):
        t = time.perf_counter()
        d, a, b = job
        Ad, Bd = A[d][a:b], B[d][a:b]
        for e in range(n):
            if e != d:
                Ad += A[e][a:b]
                Bd += B[e][a:b]
        Ad[:, diag, diag] += np.float32(lam)
        spent.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    list(threads.map(work, jobs))
    return time.perf_counter() - t0, sum(spent)


def packed_sum(rd):
    """The pipelined host reduce: every device reports every segment landed (row order), the
    owners take their summed segments; wall and the threads' seconds."""
    rd.start()
    t0 = time.perf_counter()
    for k in range(len(rd.segments)):
        for d in range(rd.n):
            rd.landed(d, k)
    for d in range(rd.n):
        while rd.take(d, block=True) is not None:
            pass
    return time.perf_counter() - t0, rd.finish()["sum"]


def main(argv=None):
    """Time both reduces alternately; write the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--rows", type=int, default=4000, help="rows of the reduced side")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--factors", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="summing threads (default: the "
                    "reducer's own, min(32, cores))")
    args = ap.parse_args(argv)
    from clmf.engine.memory import packed_width
    from clmf.parallel.partition import balanced_blocks
    from clmf.parallel.reducer import Reducer
    from clmf.provenance import commit
    n, rows, fs = args.devices, args.rows, args.factors
    bounds = [int(x) for x in balanced_blocks(np.ones(rows, np.int64), n)]
    rng = np.random.default_rng(0)
    A = [rng.random((rows, fs, fs), np.float32) for _ in range(n)]
    B = [rng.random((rows, fs), np.float32) for _ in range(n)]
    rd = Reducer("items", rows, bounds, fs, [rows], lambda d, shape: np.zeros(shape, np.float32),
                 sums="host")
    if args.threads:
        rd.threads.shutdown()
        rd.threads = concurrent.futures.ThreadPoolExecutor(args.threads)
    for h in rd.host:
        h[...] = rng.random(h.shape, np.float32)
    cores = os.cpu_count()
    threads = concurrent.futures.ThreadPoolExecutor(min(32, cores or 1))
    out = {"full": [], "packed": []}
    try:
        for _ in range(args.repeats):
            out["full"].append(full_sum(A, B, bounds, fs, threads))
            out["packed"].append(packed_sum(rd))
    finally:
        rd.close()
        threads.shutdown()
    w = packed_width(fs)
    res = {"rows": rows, "devices": n, "f": fs, "cores": cores, "commit": commit(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "segment_rows": rd.seg, "segments": len(rd.segments),
           "bytes_per_device": {"full": 4 * (fs * fs + fs) * (rows + rows // n),
                                "packed": 4 * w * (rows + rows // n)}}
    for k, v in out.items():
        res[k] = {"wall_s": float(np.median([x[0] for x in v])),
                  "threads_s": float(np.median([x[1] for x in v])), "runs": v}
    pathlib.Path(args.outdir).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(args.outdir) / "reduce_host.json").write_text(json.dumps(res, indent=1))
    md = [f"# reduce host sums, {rows} rows x {n} devices, f = {fs} ({cores} cores; "
          f"commit {res['commit']}, {res['date']})", "",
          "| form | wall s (median) | threads s | bytes a device moves |", "|---|---|---|---|"]
    for k in ("full", "packed"):
        md.append(f"| {k} | {res[k]['wall_s']:.4f} | {res[k]['threads_s']:.4f} | "
                  f"{res['bytes_per_device'][k] / 2**20:,.1f} MiB |")
    md.append(f"\npacked / full wall: {res['packed']['wall_s'] / res['full']['wall_s']:.2f}; "
              f"{len(rd.segments)} segments of {rd.seg} rows")
    (pathlib.Path(args.outdir) / "reduce_host.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
