#!/usr/bin/env python3
"""Where the time of a multi-device iteration goes: kernels, host, exchange, reduce.

    python benchmarks/multidev_profile.py --devices "0:0;0:1" --data ml-100k --out OUTDIR
    python benchmarks/multidev_profile.py --devices gpu:all --preset netflix --f 100 --out OUTDIR
    python benchmarks/multidev_profile.py --devices 4 --preset hugewiki --fraction 0.25 --f 100 \
        --modes users=replicate,items=reduce --solver cg --out OUTDIR

Builds the backend of a fit the way :func:`clmf.parallel.make_backend` does (``--multi``: the
multi-device backend even for one device), runs ``--iterations`` iterations (the first is the
warm-up) with profiling on and prints, per iteration, the wall and its split:

* ``kernels`` — the slowest device's kernel busy time (profiling events);
* ``host``    — the rest of the compute wall (compute − kernels): Python per batch, launches,
  host waits, synchronous copies;
* ``exchange`` — the tail after the slowest device's last kernel (solved rows all-gathered);
* ``reduce``  — the host's sum of the partial normal equations (the reduce mode);
* ``other``   — wall − compute − exchange − reduce (thread hand-offs, the reduce mode's
  partials/solve phases' waits).

A one-device :class:`clmf.engine.Engine` without a ``time_split`` reports its stage times as
``kernels`` and the rest of the wall as ``host``. Writes ``OUTDIR/multidev_profile.json``
(per-iteration splits, medians of the steady iterations, the warm-up, set-up seconds, device,
commit, command). ``--devices``: specs separated by ``;`` (anything ``ALS(device=...)`` takes:
``cpu:all``, ``gpu:all``, ``P:D``, a name), or a number N: the first N of ``gpu:all``.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

KEYS = ("wall", "kernels", "host", "exchange", "reduce", "other")


def devices_of(spec):
    """The pyopencl devices of ``--devices``."""
    from clmf.parallel import select_devices
    if spec.strip().isdigit():
        return select_devices("gpu:all")[:int(spec)]
    parts = [s.strip() for s in spec.split(";") if s.strip()]
    return select_devices(parts if len(parts) > 1 else parts[0])


def load(args):
    """``(name, scipy CSR or Layout)`` of ``--data`` / ``--preset``."""
    if args.preset:
        from clmf.parallel import synthetic_layout
        return f"{args.preset}x{args.fraction:g}", synthetic_layout(args.preset, args.fraction)
    from clmf.bench.runner import load_problem
    p = load_problem(args.data)
    return p.name, p.train


def split_of(eng, wall, before):
    """One iteration's split from the backend's accounting (``before``: the one-device stage
    times at its start)."""
    if hasattr(eng, "time_split") and hasattr(eng, "reset_times"):
        s = eng.time_split()
        kernels = s.get("kernels", float("nan"))
        out = {"wall": wall, "kernels": kernels, "host": s["compute"] - kernels,
               "exchange": s["exchange"], "reduce": s.get("reduce", 0.0)}
        # the pipelined reduce (reduce_wait) runs inside the devices' compute wall, the former
        # one between two of its phases
        outside = 0.0 if "reduce_wait" in s else out["reduce"]
        out["other"] = wall - s["compute"] - s["exchange"] - outside
        for k in ("stream_copies", "exchange_copies", "reduce_sum", "reduce_copies"):
            if k in s:
                out[k] = s[k]
        return out
    st = getattr(eng, "stage_times", {})
    kernels = sum(st.values()) - sum(before.values())
    return {"wall": wall, "kernels": kernels, "host": wall - kernels, "exchange": 0.0,
            "reduce": 0.0, "other": 0.0}


def main(argv=None):
    """Run the profile and write its JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", default="cpu:all")
    ap.add_argument("--data", default="ml-100k", help="a bench data spec (ml-100k, "
                    "synthetic:UxIxN, PRESET[@scale])")
    ap.add_argument("--preset", help="a large synthetic preset as a Layout (netflix, hugewiki, "
                    "netflix-4x); overrides --data")
    ap.add_argument("--fraction", type=float, default=1.0, help="of --preset's ratings")
    ap.add_argument("--f", type=int, default=32)
    ap.add_argument("--iterations", type=int, default=6, help="including the warm-up")
    ap.add_argument("--regularization", type=float, default=0.05)
    ap.add_argument("--solver", default="auto", help="the solver of the tuned configurations "
                    "(cg or cholesky for the reduce mode, which the fused CG cannot run)")
    ap.add_argument("--modes", help="users=replicate,items=reduce (default: the rule's)")
    ap.add_argument("--multi", action="store_true", help="the multi-device backend for one "
                    "device too")
    ap.add_argument("--exchange-dtype", default=None, help="float16: the factor exchange in "
                    "half precision, where the backend offers it")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import numpy as np
    import scipy.sparse as sp

    from clmf import reference
    from clmf.parallel import Layout, MultiEngine, make_backend
    from clmf.parallel.scaling import configs_for

    devices = devices_of(args.devices)
    name, data = load(args)
    layout = data if isinstance(data, Layout) else Layout.from_csr(data)
    cfgs = configs_for(devices, layout, args.f, solver=args.solver,
                       regularization=args.regularization)
    modes = dict(kv.split("=") for kv in args.modes.split(",")) if args.modes else None
    kw = {"exchange_dtype": args.exchange_dtype} if args.exchange_dtype else {}
    t0 = time.perf_counter()
    if args.multi or modes:
        eng = MultiEngine(devices, layout, args.f, cfgs, profile=True, modes=modes, **kw)
    else:
        eng = make_backend(devices, data if sp.issparse(data) else layout, args.f, cfgs,
                           profile=True, **kw)
    setup_s = time.perf_counter() - t0
    rows = []
    try:
        m, n = layout.shape
        X0, Y0 = reference.start_factors(m, n, args.f, 0)
        eng.set_factors("users", X0)
        eng.set_factors("items", Y0)
        eng.finish()
        for it in range(args.iterations):
            if hasattr(eng, "reset_times"):
                eng.reset_times()
            before = dict(getattr(eng, "stage_times", {}))
            t = time.perf_counter()
            eng.iteration(args.regularization, True)
            eng.finish()
            row = split_of(eng, time.perf_counter() - t, before)
            rows.append(row)
            print(f"iteration {it}{' (warm-up)' if it == 0 else ''}: "
                  + " ".join(f"{k} {row[k] * 1e3:8.2f}" for k in KEYS) + " ms", flush=True)
        u = np.repeat(np.arange(m, dtype=np.int32), np.diff(layout.users.indptr))
        se, cnt = eng.squared_error("train", u, np.asarray(layout.users.indices),
                                    np.asarray(layout.users.data))
        rmse = float(np.sqrt(se / cnt))
    finally:
        eng.release()
    steady = rows[1:] or rows
    med = {k: statistics.median(r[k] for r in steady) for k in KEYS}
    print("median of steady iterations: " + " ".join(f"{k} {med[k] * 1e3:.2f}" for k in KEYS)
          + f" ms; warm-up {rows[0]['wall'] * 1e3:.1f} ms; set-up {setup_s:.2f} s; "
          f"train RMSE {rmse:.5f}")
    from clmf.engine.device import device_info
    try:
        from clmf.provenance import commit
        rev = commit()
    except Exception:  # noqa: BLE001 - provenance is best effort
        rev = None
    out = {"command": " ".join([os.path.basename(sys.argv[0]), *(argv or sys.argv[1:])]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": rev, "data": name, "shape": list(layout.shape), "nnz": int(layout.nnz),
           "f": args.f, "backend": type(eng).__name__,
           "devices": [f"{i.platform} | {i.name}" for i in map(device_info, devices)],
           "configs": [[str(a), str(b)] for a, b in cfgs], "setup_s": setup_s,
           "warmup": rows[0], "median": med, "iterations": rows, "train_rmse": rmse}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "multidev_profile.json")
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
