#!/usr/bin/env python3
"""The Gram rotation of implicit half-steps (:mod:`clmf.engine.rotate`) timed its ways, side by
side: off, serial (the device idle while the host takes the eigendecomposition), overlapped
(the GPU solves the head rows meanwhile; the default) — whole
``variant="auto"`` fits, round-robin, median s/it after the first iteration. Before them, the
rotation kernel alone (``rt_rotate`` on an m × f matrix, OpenCL profiling) and the host's
eigendecomposition (NumPy float64 as clmf takes it, SciPy's float32 drivers) on one thread.

    python3 benchmarks/rotation_modes.py OUT --device gpu --factors 128,256 --rounds 2

Writes OUT/rotation_modes.jsonl (one line per fit or micro-timing, as measured) and
OUT/rotation_modes.md.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np

T0 = time.perf_counter()
SETTINGS = ("0", "serial", "1")


def log(msg):
    """Progress on stderr, elapsed seconds first."""
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def emit(out, row):
    """Append one JSON line to OUT/rotation_modes.jsonl."""
    with open(pathlib.Path(out) / "rotation_modes.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")


def kernel_times(dev, rows, fs, reps=5):
    """Median device seconds of ``rt_rotate`` over ``rows`` × f float32 rows, per f."""
    import pyopencl as cl

    from clmf.engine import kernels as K
    from clmf.engine import rotate as RT
    from clmf.engine.device import device_info
    info = device_info(dev)
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    kern = K.rotate_program(ctx).kernels["rt_rotate"]
    out = {}
    for f in fs:
        if not RT.tile_fits(info, f):
            continue
        (groups, wg), tile = RT.launch_geometry(info, rows), K.ROTATE_ROWS
        X = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=4 * rows * f)
        V = np.linalg.qr(np.random.default_rng(f).standard_normal((f, f)))[0].astype(np.float32)
        vb = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=V)
        cl.enqueue_fill_buffer(q, X, np.float32(0.5), 0, 4 * rows * f)
        secs = []
        for _ in range(reps + 1):
            ev = kern(q, (groups * wg,), (wg,), X, np.int64(rows), np.int32(f), np.int32(f), vb,
                      cl.LocalMemory(4 * tile * f))
            ev.wait()
            secs.append((ev.profile.end - ev.profile.start) * 1e-9)
        out[f] = {"seconds": statistics.median(secs[1:]), "wg": wg, "tile_rows": tile,
                  "gflops": 2.0 * rows * f * f / statistics.median(secs[1:]) * 1e-9}
        X.release()
        vb.release()
    return out


def eigh_times(fs, reps=10):
    """Milliseconds of the host's eigendecompositions per f on one BLAS thread."""
    import scipy.linalg as sl
    from threadpoolctl import threadpool_limits

    from clmf.engine.rotate import eigh

    def t(fn):
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps * 1e3
    out = {}
    for f in fs:
        A = np.random.default_rng(f).random((f, 4 * f), dtype=np.float32)
        G = (A @ A.T).astype(np.float32)
        with threadpool_limits(limits=1, user_api="blas"):
            out[f] = {"clmf_float64": t(lambda: eigh(G)),
                      "scipy_float32_evd": t(lambda: sl.eigh(G, driver="evd",
                                                             check_finite=False)),
                      "scipy_float32_evr": t(lambda: sl.eigh(G, driver="evr",
                                                             check_finite=False))}
    return out


def fit(train, dev, f, iterations, seed):
    """One implicit ``auto`` fit (the `implicit` library's model): (s/it, set-up s, whole s,
    the users' and items' configurations)."""
    import clmf
    t = time.perf_counter()
    m = clmf.ALS(f, 0.05, iterations, device=dev, feedback="implicit", alpha=2.0,
                 confidence="alpha*r", random_state=seed).fit(train, show_progress=False)
    whole = time.perf_counter() - t
    secs = [h["seconds"] for h in m.history_]
    return (statistics.median(secs[1:]), m.timings_["setup"], whole,
            {s: str(c.config) for s, c in m.config_.items()})


def main(argv=None):
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--device", default="gpu")
    p.add_argument("--preset", default="netflix")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--factors", default="128,256")
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-seconds", type=float, default=400.0)
    a = p.parse_args(argv)
    import clmf.data
    from clmf.engine.device import device_info, device_label, select_device
    from clmf.engine.rotate import ENV
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = select_device(a.device)
    info = device_info(dev)
    fs = [int(x) for x in a.factors.split(",")]
    meta = {"device": device_label(info), "driver": info.driver,
            "commit": os.environ.get("CLMF_COMMIT", ""), "command": " ".join(sys.argv),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    data = clmf.data.synthetic(a.preset, scale=a.scale, seed=0)
    train = data.to_csr()
    log(f"data {train.shape} {train.nnz} ratings")
    kt = kernel_times(dev, train.shape[0], fs)
    et = eigh_times(fs)
    emit(out, {**meta, "what": "micro", "rt_rotate": kt, "eigh_ms": et})
    log(f"rt_rotate {kt}; eigh {et}")
    rows = []
    settings = a.settings.split(",")
    for r in range(a.rounds):
        for f in fs:
            for s in settings:
                if time.perf_counter() - T0 > a.max_seconds:
                    break
                os.environ[ENV] = s
                spi, setup, whole, cfg = fit(train, dev, f, a.iterations, 0)
                row = {**meta, "what": "fit", "round": r, "f": f, "setting": s, "s_per_it": spi,
                       "setup_s": setup, "whole_s": whole, "config": cfg}
                emit(out, row)
                rows.append(row)
                log(f"f={f} {ENV}={s}: {spi:.4f} s/it (whole {whole:.2f} s)")
    lines = [f"# Gram rotation ways — {a.preset} {train.shape[0]} × {train.shape[1]}, "
             f"{train.nnz} ratings", "", f"{meta['device']} (driver {meta['driver']}), "
             f"{meta['date']}, commit {meta['commit']}", "", f"`{meta['command']}`", "",
             "rt_rotate over the users' rows: " + ", ".join(
                 f"f = {f}: {v['seconds'] * 1e3:.2f} ms ({v['gflops']:.0f} GFLOP/s, "
                 f"wg {v['wg']})" for f, v in kt.items()), "",
             "host eigendecomposition, one thread (ms): " + "; ".join(
                 f"f = {f}: " + ", ".join(f"{k} {v:.2f}" for k, v in d.items())
                 for f, d in et.items()), "",
             "| f | " + " | ".join(f"`{ENV}={s}` s/it" for s in settings) + " |",
             "|---|" + "---|" * len(settings)]
    for f in fs:
        cells = []
        for s in settings:
            v = [x["s_per_it"] for x in rows if x["f"] == f and x["setting"] == s]
            cells.append(f"{statistics.median(v):.4f}" if v else "–")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    lines += ["", f"Median over {a.rounds} round(s) of each fit's median s/it after the first "
              f"of {a.iterations} iterations (round-robin)."]
    (out / "rotation_modes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
