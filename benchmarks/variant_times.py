#!/usr/bin/env python3
"""Time per ALS iteration of every S1 code variant on a device (results/variants/).

For each data set (MovieLens 100K ua.base; a synthetic Netflix-shaped set at --scale), each f and
each variant: build, warm up one iteration, then time --iterations iterations; records the
median wall seconds per iteration and the per-stage device times (OpenCL profiling events:
S1 hermitian, S2 right side, S3 solve), with device, driver, date and commit, as CSV.
Each variant is verified against the reference on a small problem on the same device first;
a variant that fails verification is recorded as 'wrong' and not timed.

    python benchmarks/variant_times.py --device gpu --scale 1.0 --out results/variants/gpu.csv
"""
import argparse
import csv
import datetime
import os
import sys
import time

import numpy as np


def variants_for(f, device_type="GPU"):
    """The standard set per f: GPU-shaped work-groups on GPUs; on CPUs small work-groups (one
    work-item per row of the output, vectors along it) and a small S3 work-group, since CPU
    runtimes pay for every barrier."""
    t = min(32, f)
    if device_type == "CPU":
        return [
            "batch:tx=4,ty=4,solve_wg=2",
            "batch+local:tx=4,ty=4,nnz_batch=16,solve_wg=2",
            "batch+reg:tx=8,ty=8,solve_wg=2",
            ("batch+reg+vec8:tx=16,ty=1,solve_wg=2" if f <= 50
             else "batch+reg+vec8:tx=32,ty=2,solve_wg=2"),
            ("batch+reg+local+vec8:tx=16,ty=1,nnz_batch=32,solve_wg=2" if f <= 50
             else "batch+reg+local+vec8:tx=32,ty=2,nnz_batch=32,solve_wg=2"),
            f"batch+reg+vec8+tile:tx=8,ty=1,bx={-(-t // 8) * 8},by={-(-t // 8) * 8},solve_wg=2",
            "batch:solver=fusedcg,solve_wg=2",
        ]
    return [
        "batch",
        "batch+local:tx=8,ty=8,nnz_batch=16",
        "batch+reg:tx=16,ty=16",
        "batch+reg+local:tx=16,ty=16,nnz_batch=32",
        "batch+reg+local+vec4:tx=16,ty=8,nnz_batch=32",
        f"batch+reg+local+tile:tx=8,ty=8,bx={t},by={t},nnz_batch=32",
        f"batch+reg+local+vec4+tile:tx=8,ty=2,bx={-(-t // 4) * 4},by={-(-t // 4) * 4},nnz_batch=32",
        "batch:solver=fusedcg",
        "batch+reg+local:tx=16,ty=16,nnz_batch=32,solver=cg",
        gemm_shape(f),
        gemm_shape(f) + ",solver=cg",
    ]


def gemm_shape(f):
    """The gemm variant's shape that the H100 tuning picked at Netflix scale, as a rule of f:
    one tile of f with a work-item per row and column up to f = 16, one tile with 4 × 4
    micro-tiles (float4) up to 64, else tiles of 64 with 8 × 8 micro-tiles."""
    if f <= 16:
        return f"batch+gemm:tx={f},ty={f},nnz_batch=32"
    if f <= 64:
        t = -(-f // 4)
        return f"batch+vec4+gemm:tx={t},ty={t},nnz_batch=16"
    return "batch+vec4+gemm:tx=8,ty=8,bx=64,nnz_batch=8"


def commit():
    from clmf.provenance import commit as clmf_commit
    return clmf_commit()


def verify(dev, variant, f):
    import clmf
    from clmf import reference
    from clmf.engine.config import KernelConfig
    rng = np.random.default_rng(f)
    import scipy.sparse as sp
    R = sp.random(97, 61, density=0.2, random_state=f, format="csr", dtype=np.float32)
    R.data = rng.integers(1, 6, R.nnz).astype(np.float32)
    X0, Y0 = reference.start_factors(97, 61, f, 0)
    m = clmf.ALS(f, 0.1, 1, device=dev, variant=variant).fit(R, init=(X0, Y0), show_progress=False)
    cfg = KernelConfig.parse(variant)
    Xr, Yr = reference.als(R, f, 0.1, 1, init=(X0, Y0), solver=cfg.solver, cg_steps=cfg.cg_steps)
    return max(np.linalg.norm(m.user_factors_ - Xr) / np.linalg.norm(Xr),
               np.linalg.norm(m.item_factors_ - Yr) / np.linalg.norm(Yr))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto")
    p.add_argument("--data", default="../shared/data/ml-100k")
    p.add_argument("--scale", type=float, default=0.05, help="scale of the synthetic Netflix shape")
    p.add_argument("--factors", default="10,50,100")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--variants", default=None,
                   help="';'-separated list (default: the standard set)")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import clmf
    from clmf import data, reference
    from clmf.engine import Engine
    from clmf.engine.config import KernelConfig
    from clmf.engine.device import device_info, select_device
    from clmf.errors import InvalidConfigError

    dev = select_device(a.device)
    info = device_info(dev)
    sets = []
    if a.data and os.path.exists(a.data):
        tr, _ = data.load_movielens_100k_split(a.data)
        sets.append(("ml-100k", tr.to_csr()))
    t0 = time.perf_counter()
    syn = data.synthetic("netflix", scale=a.scale, seed=0)
    print(f"synthetic netflix x{a.scale}: {syn.shape} {len(syn)} ratings in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    sets.append((f"netflix-x{a.scale:g}", syn.to_csr()))
    del syn
    fields = ["date", "commit", "platform", "device", "driver", "dataset", "users", "items", "nnz",
              "f", "variant", "status", "verify_rel_err", "seconds_per_iteration",
              "s1_seconds", "s2_seconds", "s3_seconds", "iterations", "raw_seconds"]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    new = not os.path.exists(a.out)
    with open(a.out, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        if new:
            w.writeheader()
        for f in [int(x) for x in a.factors.split(",")]:
            vlist = a.variants.split(";") if a.variants else variants_for(f, info.type)
            for variant in vlist:
                now = datetime.datetime.now(datetime.timezone.utc)
                base = dict(date=now.isoformat(timespec="seconds"), commit=commit(),
                            platform=info.platform, device=info.name, driver=info.driver, f=f,
                            variant=variant)
                try:
                    err = verify(dev, variant, f)
                except clmf.SingularSystemError as e:
                    err = float("inf")
                    print(f"f={f} {variant}: solve failed ({e})", flush=True)
                except InvalidConfigError as e:
                    for name, R in sets:
                        w.writerow(dict(base, dataset=name, status=f"invalid:{e.reason}"))
                    fh.flush()
                    print(f"f={f} {variant}: invalid ({e})", flush=True)
                    continue
                cfg = KernelConfig.parse(variant)
                tol = (2e-2 if cfg.precision == "tf32"
                       else 1e-2 if cfg.storage == "float16" else 1e-4)
                if err > tol:
                    for name, R in sets:
                        w.writerow(dict(base, dataset=name, status="wrong", verify_rel_err=err))
                    fh.flush()
                    print(f"f={f} {variant}: WRONG ({err:.2e})", flush=True)
                    continue
                cfg = KernelConfig.parse(variant)
                for name, R in sets:
                    eng = Engine(dev, R, f, (cfg, cfg), profile=True)
                    try:
                        X0, Y0 = reference.start_factors(*R.shape, f, 0)
                        eng.set_factors("users", X0)
                        eng.set_factors("items", Y0)
                        eng.iteration(0.05, True)        # warm-up
                        eng.queue.finish()
                        eng.stage_times = {"s1": 0.0, "s2": 0.0, "s3": 0.0}
                        raw = []
                        for _ in range(a.iterations):
                            t = time.perf_counter()
                            eng.iteration(0.05, True)
                            eng.queue.finish()
                            raw.append(time.perf_counter() - t)
                        st = {k: v / a.iterations for k, v in eng.stage_times.items()}
                    finally:
                        eng.release()
                    row = dict(base, dataset=name, users=R.shape[0], items=R.shape[1], nnz=R.nnz,
                               status="ok", verify_rel_err=f"{err:.2e}",
                               seconds_per_iteration=f"{np.median(raw):.6f}",
                               s1_seconds=f"{st['s1']:.6f}", s2_seconds=f"{st['s2']:.6f}",
                               s3_seconds=f"{st['s3']:.6f}", iterations=a.iterations,
                               raw_seconds=" ".join(f"{x:.6f}" for x in raw))
                    w.writerow(row)
                    fh.flush()
                    print(f"{name} f={f} {variant}: {np.median(raw):.4f} s/it  "
                          f"S1 {st['s1']:.4f} S2 {st['s2']:.4f} S3 {st['s3']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
