"""The Dask workers' row exchange alone (issue 28): the shared-memory boards of
:mod:`clmf.parallel.dask_board` between worker processes, with the engine's side of a
half-step simulated — no device, no Dask — so that what the exchange adds to a half-step on
GPUs (copies through page-locked staging, waits) can be timed on any host.

Each of ``--workers`` processes owns a block of ``--rows`` rows × ``--width`` float32 and, per
half-step: its "kernels" finish a batch of its rows every ``--compute / --batches`` ms (a
thread sleeps until then), the batch is "copied off the device" into its staging array (a
memcpy from a private array, as the device's copy into page-locked memory) and published; the
driving thread meanwhile takes the peers' chunks (:meth:`BoardExchange.take`) and "uploads"
each (``host[a:b]`` read in the driving thread, as :meth:`clmf.engine.Engine.write_rows` does,
then a memcpy into a private array in an upload thread, as the device's copy). A half-step ends
when the worker's own batches are published and every peer's rows are uploaded; the processes
start each half-step together. Prints and writes (``--json``) the median of the slowest
worker's half-step seconds beyond ``--compute`` (the exchange's tail) and the parts.

    python benchmarks/dask_exchange.py --workers 2 --rows 240000 --width 100 --compute 20 \\
        --batches 8 --halfsteps 30

Runs the :mod:`clmf` on ``sys.path`` (``PYTHONPATH`` picks a version to compare).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import threading
import time

import numpy as np


def worker(d, args, handles_q, all_handles, barrier, out_q):
    """Worker ``d``: make its board, map the others', run the half-steps, report seconds."""
    from clmf.parallel import dask_board as BD
    from clmf.parallel import shared_blocks as shm
    n, rows, width = args.workers, args.rows, args.width
    bounds = {"users": np.arange(n + 1, dtype=np.int64) * rows}
    segs = shm.Segments(f"clmf-xbench-{args.tag}-{d}")
    atts = shm.Attached()
    handles_q.put((d, BD.board_create(segs, bounds, d, width, np.float32)))
    handles = all_handles.get()

    def staging(shape, dtype):
        """A plain array standing for a page-locked one."""
        return np.zeros(shape, dtype)
    board = BD.Board(atts, d, handles, bounds, staging=staging if args.staging else None)
    device = np.random.default_rng(d).random((rows, width), dtype=np.float32)   # own rows
    dev_all = np.zeros((n * rows, width), np.float32)      # the "device" buffer of the side
    cuts = np.linspace(0, rows, args.batches + 1).astype(np.int64)
    r_own = d * rows
    per = args.compute / 1e3 / args.batches
    results, parts = [], []
    for k in range(args.halfsteps):
        ex = board.exchange("users")
        barrier.wait()
        t0 = time.perf_counter()

        def publish(ex=ex, t0=t0):
            """The device's batches: done every ``per`` seconds, copied off, published."""
            for b in range(args.batches):
                wait = t0 + (b + 1) * per - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                a, z = int(cuts[b]), int(cuts[b + 1])
                np.copyto(ex.host[r_own + a:r_own + z], device[a:z])
                ex.publish(d, r_own + a, r_own + z)
            ex.finish(d)
        pub = threading.Thread(target=publish)
        pub.start()
        uploads = queue.Queue()

        def upload():
            """The device's uploads, in order."""
            while (item := uploads.get()) is not None:
                a, src = item
                np.copyto(dev_all[a:a + len(src)], src)
        up = threading.Thread(target=upload)
        up.start()
        while True:
            new, _seen, done = ex.take(d, 0)
            for _e, a, z in new:
                uploads.put((a, ex.host[a:z]))
            if done:
                break
        t_take = time.perf_counter() - t0
        uploads.put(None)
        up.join()
        t_up = time.perf_counter() - t0
        pub.join()
        t = time.perf_counter() - t0
        parts.append((t_take, t_up, t))
        if k:
            results.append(t)
        for e in range(n):                      # every peer's rows arrived intact
            if e != d:
                got = dev_all[e * rows:(e + 1) * rows]
                want = np.random.default_rng(e).random((rows, width), dtype=np.float32)
                if k == 1 and not np.array_equal(got, want):
                    raise AssertionError(f"worker {d}: rows of worker {e} differ")
        barrier.wait()          # nobody rewrites a bank before everyone read it
    med = np.median(np.array(parts[1:]), axis=0) * 1e3
    out_q.put((d, results, {**getattr(board, "times", {}),
                            "take_upload_end_ms": [float(x) for x in med]}))
    board.close()
    atts.close()
    segs.close()


def main(argv=None):
    """Run the simulation; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=240_000, help="rows of each worker's block")
    ap.add_argument("--width", type=int, default=100, help="floats per row (ldf)")
    ap.add_argument("--compute", type=float, default=20.0, help="ms of kernels per half-step")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--halfsteps", type=int, default=30)
    ap.add_argument("--no-staging", dest="staging", action="store_false",
                    help="rows read where they lie (CPU devices) instead of a mirror (GPUs)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.tag = f"{time.time_ns() & 0xFFFFFF:x}"
    ctx = mp.get_context("fork")
    handles_q, barrier, out_q = ctx.Queue(), ctx.Barrier(args.workers), ctx.Queue()
    all_q = [ctx.Queue() for _ in range(args.workers)]
    procs = [ctx.Process(target=worker, args=(d, args, handles_q, all_q[d], barrier, out_q))
             for d in range(args.workers)]
    for p in procs:
        p.start()
    got = dict(handles_q.get() for _ in procs)
    for q in all_q:
        q.put([got[d] for d in range(args.workers)])
    res = dict((d, (r, t)) for d, r, t in (out_q.get() for _ in procs))
    for p in procs:
        p.join()
    slowest = np.max([res[d][0] for d in res], axis=0)
    import clmf
    rec = {"args": {k: v for k, v in vars(args).items() if k != "tag"},
           "clmf": clmf.__file__,
           "median_halfstep_ms": 1e3 * float(np.median(slowest)),
           "median_beyond_compute_ms": 1e3 * float(np.median(slowest)) - args.compute,
           "worker_times_s": {d: res[d][1] for d in res}}
    print(f"{clmf.__file__}: half-step {rec['median_halfstep_ms']:.2f} ms, "
          f"{rec['median_beyond_compute_ms']:.2f} ms beyond the kernels' {args.compute} ms "
          f"({args.workers} workers × {args.rows} rows × {args.width}, "
          f"{'staged' if args.staging else 'unstaged'})", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rec, fh, indent=1)


if __name__ == "__main__":
    main()
