#!/usr/bin/env python3
"""Host ↔ device copy rates by kind of host memory (issue 28: the Dask workers' exchange).

A Dask worker's solved rows reach its peers through a shared-memory segment: copied by the CPU
out of the page-locked staging array its device wrote them into, then by each peer into its own
page-locked mirror before the upload. On 4 × Netflix these host copies were the Dask fit's gap
(`results/bench/dask-h100x4-43/`). This measures, on one device, what each way of reaching a
segment costs, to judge whether a device could copy straight to and from one:

- ``pageable``: an ordinary NumPy array;
- ``pinned``: a mapped ``ALLOC_HOST_PTR`` buffer (what clmf stages through);
- ``shm``: a :mod:`multiprocessing.shared_memory` segment as a plain host array;
- ``shm_use_host_ptr``: a ``USE_HOST_PTR`` buffer over that segment, copied to and from a device
  buffer by ``enqueue_copy`` between buffers (the driver may register the pages and copy by DMA);
- ``cpu_pinned_to_shm``: the CPU copy a worker makes today (NumPy, one thread).

    python3 benchmarks/host_copy_modes.py OUT --device gpu --megabytes 192

Writes OUT/host_copy_modes.json and prints a table (GB/s, best of ``--repeats``).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np


def best_rate(fn, nbytes, repeats):
    """GB/s of the fastest of ``repeats`` calls of ``fn`` (one warm-up first)."""
    fn()
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return nbytes / max(best, 1e-12) / 1e9


def measure(cl, ctx, q, seg, n, repeats):
    """The rates (GB/s) of every kind of host memory against one device buffer of ``n``
    floats; ``seg`` the shared-memory segment (no view of it outlives this call)."""
    mf = cl.mem_flags
    nbytes = 4 * n
    dbuf = cl.Buffer(ctx, mf.READ_WRITE, size=nbytes)
    pageable = np.ones(n, np.float32)
    pbuf = cl.Buffer(ctx, mf.READ_WRITE | mf.ALLOC_HOST_PTR, size=nbytes)
    pinned, _ev = cl.enqueue_map_buffer(q, pbuf, cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                        (n,), np.float32)
    pinned[:] = 1.0
    shm = np.ndarray((n,), np.float32, buffer=seg.buf)
    shm[:] = 1.0
    rates = {}

    def h2d(host):
        return lambda: cl.enqueue_copy(q, dbuf, host, is_blocking=True)

    def d2h(host):
        return lambda: cl.enqueue_copy(q, host, dbuf, is_blocking=True)
    for name, host in (("pageable", pageable), ("pinned", pinned), ("shm", shm)):
        rates[f"{name}_h2d"] = best_rate(h2d(host), nbytes, repeats)
        rates[f"{name}_d2h"] = best_rate(d2h(host), nbytes, repeats)
    try:
        ubuf = cl.Buffer(ctx, mf.READ_WRITE | mf.USE_HOST_PTR, hostbuf=shm)

        def u2d():
            cl.enqueue_copy(q, dbuf, ubuf)
            q.finish()

        def d2u():                         # the rows then readable in the segment
            cl.enqueue_copy(q, ubuf, dbuf)
            ary, _ = cl.enqueue_map_buffer(q, ubuf, cl.map_flags.READ, 0, (n,), np.float32)
            ary.base.release(q)
            q.finish()
        rates["shm_use_host_ptr_h2d"] = best_rate(u2d, nbytes, repeats)
        rates["shm_use_host_ptr_d2h_and_map"] = best_rate(d2u, nbytes, repeats)
        got = np.empty(16, np.float32)
        cl.enqueue_copy(q, got, dbuf)
        rates["shm_use_host_ptr_ok"] = bool(np.all(got == 1.0))
        ubuf.release()
    except cl.Error as e:                  # a runtime that refuses such a buffer says so
        rates["shm_use_host_ptr_error"] = str(e)[:200]
    rates["cpu_pinned_to_shm"] = best_rate(lambda: np.copyto(shm, pinned), nbytes, repeats)
    rates["cpu_shm_to_pinned"] = best_rate(lambda: np.copyto(pinned, shm), nbytes, repeats)
    q.finish()
    return rates


def main(argv=None):
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--device", default="gpu")
    p.add_argument("--megabytes", type=int, default=192)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    from multiprocessing import shared_memory

    import pyopencl as cl

    from clmf.engine.device import device_info, device_label, select_device
    dev = select_device(a.device)
    info = device_info(dev)
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    n = a.megabytes * (1 << 20) // 4
    seg = shared_memory.SharedMemory(create=True, size=4 * n)
    try:
        rates = measure(cl, ctx, q, seg, n, a.repeats)
    finally:
        import gc
        gc.collect()                       # the views of the segment gone before it closes
        seg.close()
        seg.unlink()
    row = {"device": device_label(info), "driver": info.driver, "megabytes": a.megabytes,
           "repeats": a.repeats, "commit": os.environ.get("CLMF_COMMIT", ""),
           "command": " ".join(sys.argv), "rates_gb_s": rates}
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_copy_modes.json").write_text(json.dumps(row, indent=1) + "\n")
    for k, v in rates.items():
        print(f"{k:32s} {v:.2f}" if isinstance(v, float) else f"{k:32s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
