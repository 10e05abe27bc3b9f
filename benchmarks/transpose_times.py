"""The items' CSR on a CPU device: scipy's host transpose against the device transpose.

For each ratings count (MovieLens-10M-shaped synthetic sets) and each CPU OpenCL device, in a
fresh process with empty kernel caches (``XDG_CACHE_HOME`` pointed at a new directory, so the
first device transpose includes building its program, as a first fit after an install does):
the host transpose (``scipy.sparse`` ``tocsc``, what :func:`clmf.engine.core.host_transpose`
picks up to ``HOST_TRANSPOSE_MAX_NNZ`` ratings) and the device transpose (first call and best of
the later calls), medians over ``--repeats``::

    python -P benchmarks/transpose_times.py OUT --nnz 1000000 4000000 10000000

Writes ``OUT/transpose_times.md`` and ``.json`` (device, driver, date, commit, machine load).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time


def child(spec, nnz, repeats):
    """Times of both transposes of one set on one device (run in a fresh process)."""
    import numpy as np
    import pyopencl as cl

    from clmf import data
    from clmf.data.scan import count_columns
    from clmf.engine.device import device_info, device_label, select_device
    from clmf.engine.transpose import device_transpose

    R = data.synthetic("movielens-10m", scale=nnz / 10_000_054, seed=0).to_csr()
    R.indices = R.indices.astype(np.int32)
    R.data = R.data.astype(np.float32)
    host = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        R.tocsc()
        host.append(time.perf_counter() - t0)
    dev = select_device(spec)
    info = device_info(dev)
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    mf = cl.mem_flags
    ip = R.indptr.astype(np.int64)
    col_ptr = np.zeros(R.shape[1] + 1, np.int64)
    np.cumsum(count_columns(R.indices, R.shape[1]), out=col_ptr[1:])
    bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
            for a in (ip, R.indices, R.data, col_ptr)]
    dev_t = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        outs = device_transpose(ctx, q, info, ip, bufs[0], bufs[1], bufs[2], R.shape[1],
                                bufs[3])
        dev_t.append(time.perf_counter() - t0)
        for b in outs:
            b.release()
    return {"device": device_label(info), "driver": info.driver, "nnz": R.nnz,
            "host_s": float(np.median(host)), "device_first_s": dev_t[0],
            "device_s": float(np.median(dev_t[1:]))}


def main(argv=None):
    """Run every (device, size) in a fresh process with empty caches; write the table."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--nnz", type=int, nargs="+", default=[1_000_000, 4_000_000, 10_000_000])
    ap.add_argument("--devices", nargs="+", default=None,
                    help="device specs (default: every CPU device)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), int(a.child[2]))))
        return
    if not a.out:
        ap.error("OUT is required")
    from clmf.engine.device import devices
    from clmf.provenance import commit
    specs = a.devices or [d.index for d in devices() if d.type == "CPU"]
    load0 = os.getloadavg()[0]
    rows = []
    for spec in specs:
        for nnz in a.nnz:
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, XDG_CACHE_HOME=cache)
                out = subprocess.run([sys.executable, "-P", __file__, "--child", spec, str(nnz),
                                      str(a.repeats)], env=env, check=True, capture_output=True,
                                     text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{r['device'][:40]:40} {r['nnz']:>10}: host {r['host_s'] * 1e3:8.1f} ms, "
                  f"device first {r['device_first_s'] * 1e3:8.1f} ms, "
                  f"later {r['device_s'] * 1e3:8.1f} ms", flush=True)
    meta = {"command": "python -P benchmarks/transpose_times.py " + " ".join(argv or sys.argv[1:]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": commit(),
            "load_start": load0, "load_end": os.getloadavg()[0], "cpus": os.cpu_count()}
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "transpose_times.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    lines = ["# Host (scipy) vs device transpose of the ratings on CPU devices\n",
             f"Command: `{meta['command']}` (commit {meta['commit']}, {meta['date']}, "
             f"{meta['cpus']} CPUs, load average {load0:.2f} → {meta['load_end']:.2f}). Fresh "
             "process and empty kernel caches per row; medians of the repeats.\n",
             "| device | driver | ratings | host tocsc (ms) | device, first incl. build (ms) "
             "| device, later (ms) |", "|---|---|---|---|---|---|"]
    for r in rows:
        name = r["device"].replace(" | ", " / ")
        lines.append(f"| {name} | {r['driver']} | {r['nnz']} | {r['host_s'] * 1e3:.1f} | "
                     f"{r['device_first_s'] * 1e3:.1f} | {r['device_s'] * 1e3:.1f} |")
    (out / "transpose_times.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
