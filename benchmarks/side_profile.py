#!/usr/bin/env python3
"""Per-side, per-stage time of kernel variants on one device: which variant each half-step wants.

A fit's two half-steps differ in shape (Netflix: 480K short user rows against 17.8K long item
rows), so the best variant of one side need not be the other's. For each mode and f this builds
the engine once per variant (the same variant on both sides), runs a warm-up iteration and then
``--iterations`` iterations from the same start, and records per side the median wall seconds of
the half-step and its device stage times (OpenCL profiling events: S1 hermitians, S2 right-hand
sides, S3 solves, the implicit Gram matrix). Every variant's factors after the first iteration are
compared with the first variant's (the lookup's ``auto`` choice): the relative difference says
whether it solved the same systems. Then the best users' variant is paired with the best items'
variant and the pair is timed as whole iterations beside ``auto``.

One JSON line per (mode, f, variant) and per pair goes to ``OUT/side_profile.jsonl`` as it is
measured; ``OUT/side_profile.md`` sums up. No new work starts after ``--max-seconds``.

    python3 benchmarks/side_profile.py --device gpu --out $OUT --factors 64,128,256 \
        --modes explicit,implicit
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

T0 = time.perf_counter()

# per device type: the variants tried besides ``auto`` ({f}-free strings; the engine refuses the
# ones a device or f cannot build, which are recorded as such)
GPU_VARIANTS = (
    "batch+vec4+syrk:bx=8,solver=cg",
    "batch+vec4+syrk:bx=4,ks=4,solver=cg",
    "batch+vec4+gemm:bx=64,nnz_batch=8,solver=cg",
    "batch+vec4+gemm:bx=32,nnz_batch=16,solver=cg",
    "batch+vec4+mma:tx=4,ks=2,solver=cg,precision=tf32",
    "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=32,nnz_batch=4",
    "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=64,nnz_batch=4",
    "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=128,nnz_batch=4",
    "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=128,nnz_batch=8",
    "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=256,nnz_batch=4",
)
CPU_VARIANTS = (
    "batch+vec16:tx=1,ty=1,solve_wg=1,solve_vec=16,solver=fusedcg",
    "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=8,nnz_batch=4",
    "batch+reg+vec8:tx=16,ty=1,solve_wg=2,solver=cg",
)


def log(msg):
    """Progress on stderr, elapsed seconds first."""
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def parse(argv=None):
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="gpu")
    p.add_argument("--data", default="netflix", help="a synthetic preset")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--factors", default="64,128,256")
    p.add_argument("--modes", default="explicit,implicit")
    p.add_argument("--variants", default=None,
                   help="';'-separated variants (default: the device type's list)")
    p.add_argument("--vary", choices=("both", "users", "items"), default="both",
                   help="the side the listed variants run on; the other keeps auto's choice")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--alpha", type=float, default=2.0)
    p.add_argument("--regularization", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=540.0)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def spec_of(a, f, mode, variant):
    """The fit specification of one (f, mode, variant) cell."""
    from clmf.tuning import FitSpec
    params = {"factors": f, "regularization": a.regularization, "variant": variant,
              "alpha": a.alpha}
    if mode == "implicit":
        params.update(feedback="implicit", confidence="alpha*r")
    elif mode == "biased":
        params["biases"] = True
    return FitSpec.of(params)


def engine_for(dev, R, spec, configs):
    """An engine with profiling on for ``spec`` (the kernels' view of ``R``)."""
    from clmf.engine.core import Engine
    from clmf.tuning.spec import kernel_ratings
    Rk = kernel_ratings(R, spec.feedback, spec.confidence, spec.alpha)
    return Engine(dev, Rk, spec.f, configs, profile=True, implicit_alpha=spec.kernel_alpha,
                  biased=spec.biased)


def timed(eng, spec, X0, Y0, iterations):
    """(per-side wall seconds lists, per-side stage seconds lists, factors after iteration 1)."""
    eng.set_factors("users", X0)
    eng.set_factors("items", Y0)
    eng.queue.finish()
    wall = {"users": [], "items": []}
    stages = {"users": [], "items": []}
    first = None
    for it in range(iterations + 1):
        for side in ("users", "items"):
            before = dict(eng.stage_times)
            t = time.perf_counter()
            eng.half_step(side, float(spec.regularization), spec.weighted)
            eng.queue.finish()
            dt = time.perf_counter() - t
            d = {k: round(v - before.get(k, 0.0), 6) for k, v in eng.stage_times.items()
                 if v - before.get(k, 0.0) > 0}
            if it > 0:                      # the first iteration is the warm-up
                wall[side].append(dt)
                stages[side].append(d)
        if it == 0:
            first = (eng.get_factors("users"), eng.get_factors("items"))
    return wall, stages, first


def rel_diff(a, b):
    """Largest row-relative difference between two factor matrices."""
    num = np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64), axis=1)
    den = np.maximum(np.linalg.norm(np.asarray(b, np.float64), axis=1), 1e-12)
    return float(np.max(num / den)) if num.size else 0.0


def median_stages(stage_list):
    """Per-stage medians over iterations."""
    keys = sorted({k for d in stage_list for k in d})
    return {k: round(statistics.median(d.get(k, 0.0) for d in stage_list), 6) for k in keys}


def measure(row, dev, R, spec, cfgs, X0, Y0, iterations, ref):
    """Time one (users, items) configuration pair into ``row`` (status, differences from
    ``ref``'s factors after iteration 1, or the reason it failed); :func:`timed`'s result or
    None. A refused or failing configuration is a result too."""
    eng = None
    try:
        eng = engine_for(dev, R, spec, cfgs)
        got = timed(eng, spec, X0, Y0, iterations)
        first = got[2]
        ref = ref or first
        row.update(status="ok", diff_users=rel_diff(first[0], ref[0]),
                   diff_items=rel_diff(first[1], ref[1]))
        return got
    except Exception as e:
        row.update(status=f"{type(e).__name__}: {e}".splitlines()[0][:200])
        return None
    finally:
        if eng is not None:
            eng.release()


def main(argv=None):
    """Run every cell and write the results as they come."""
    a = parse(argv)
    os.makedirs(a.out, exist_ok=True)
    import scipy.sparse as sp

    from clmf.data import synthetic
    from clmf.engine.config import KernelConfig
    from clmf.engine.device import device_info, device_label, select_devices
    from clmf.reference import start_factors
    from clmf.tuning import resolve, side_stats
    dev = select_devices(a.device)[0]
    info = device_info(dev)
    label = device_label(dev)
    t = time.perf_counter()
    data = synthetic(a.data, scale=a.scale, seed=a.seed)
    R = sp.csr_matrix(data.to_csr(), dtype=np.float32)
    m, n = R.shape
    import clmf
    log(f"clmf from {os.path.dirname(clmf.__file__)}")
    log(f"{label}: {a.data} x{a.scale:g} {m} x {n}, {R.nnz} ratings "
        f"({time.perf_counter() - t:.1f} s)")
    uc = np.diff(R.indptr)
    ic = np.bincount(R.indices, minlength=n)
    stats = {"users": side_stats(uc, n), "items": side_stats(ic, m)}
    extra = ([v for v in a.variants.split(";") if v] if a.variants is not None else
             (CPU_VARIANTS if info.type == "CPU" else GPU_VARIANTS))
    path = os.path.join(a.out, "side_profile.jsonl")
    meta = {"device": label, "driver": info.driver, "data": f"{a.data} x{a.scale:g}",
            "shape": [m, n, int(R.nnz)], "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": os.environ.get("CLMF_COMMIT", "unknown"), "command": " ".join(sys.argv)}
    with open(os.path.join(a.out, "side_profile_meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    rows = []

    def emit(row):
        rows.append(row)
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    for mode in a.modes.split(","):
        for f in (int(x) for x in a.factors.split(",")):
            if time.perf_counter() - T0 > a.max_seconds:
                log("time budget spent: stopping")
                break
            X0, Y0 = start_factors(m, n, f, a.seed)
            spec = spec_of(a, f, mode, "auto")
            ch = resolve(spec, info, stats)
            auto = (ch["users"].config, ch["items"].config)
            cells = [("auto", auto)] + [(v, v) for v in extra]
            ref = None
            per_side = {"users": [], "items": []}
            for name, cfgs in cells:
                if time.perf_counter() - T0 > a.max_seconds:
                    break
                if isinstance(cfgs, str):           # a variant string: parsed here, so a
                    try:                            # malformed one is a row, not a crash
                        c = KernelConfig.parse(cfgs)
                        cfgs = {"both": (c, c), "users": (c, auto[1]),
                                "items": (auto[0], c)}[a.vary]
                    except Exception as e:
                        emit({"mode": mode, "f": f, "variant": name, "configs": [name, name],
                              "status": f"{type(e).__name__}: {e}".splitlines()[0][:200]})
                        continue
                row = {"mode": mode, "f": f, "variant": name,
                       "configs": [str(cfgs[0]), str(cfgs[1])]}
                got = measure(row, dev, R, spec, cfgs, X0, Y0, a.iterations, ref)
                if got is not None:
                    wall, stages, first = got
                    ref = ref or first
                    row.update(users_s=statistics.median(wall["users"]),
                               items_s=statistics.median(wall["items"]),
                               users_stages=median_stages(stages["users"]),
                               items_stages=median_stages(stages["items"]))
                    for i, side in enumerate(("users", "items")):
                        if name == "auto" or a.vary in ("both", side):
                            per_side[side].append((row[side + "_s"], cfgs[i]))
                emit(row)
                log(f"{mode} f={f} {name}: {row.get('status')} users "
                    f"{row.get('users_s', float('nan')):.4f} items "
                    f"{row.get('items_s', float('nan')):.4f} "
                    f"diff {row.get('diff_users', float('nan')):.1e}/"
                    f"{row.get('diff_items', float('nan')):.1e}")
            # the best per side, paired (when the two can share factor buffers), beside auto
            ok = {s: sorted(v, key=lambda x: x[0]) for s, v in per_side.items() if v}
            if len(ok) == 2 and time.perf_counter() - T0 < a.max_seconds:
                for pair_name, pair in (("best pair", (ok["users"][0][1], ok["items"][0][1])),
                                        ("auto", auto)):
                    row = {"mode": mode, "f": f, "variant": pair_name, "pair": True,
                           "configs": [str(pair[0]), str(pair[1])]}
                    got = measure(row, dev, R, spec, pair, X0, Y0, a.iterations, ref)
                    if got is not None:
                        wall = got[0]
                        its = [u + i for u, i in zip(wall["users"], wall["items"])]
                        row["s_per_it"] = statistics.median(its)
                    emit(row)
                    log(f"{mode} f={f} {pair_name} {row['configs']}: "
                        f"{row.get('s_per_it', row['status'])}")
    write_report(a.out, meta, rows)


def write_report(out, meta, rows):
    """``side_profile.md``: per mode and f, each variant's per-side seconds, and the pairs."""
    lines = [f"# Per-side variant times — {meta['data']} {meta['shape']}", "",
             f"Device: {meta['device']}; {meta['date']}; commit {meta['commit']}.", "",
             f"Command: `{meta['command']}`", "",
             "| mode | f | variant | users s | items s | users stages | items stages | "
             "diff vs auto (users/items) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("pair"):
            continue
        if r["status"] != "ok":
            lines.append(f"| {r['mode']} | {r['f']} | `{r['variant']}` | {r['status']} | | | | |")
            continue
        lines.append(f"| {r['mode']} | {r['f']} | `{r['variant']}` | {r['users_s']:.4f} | "
                     f"{r['items_s']:.4f} | {r['users_stages']} | {r['items_stages']} | "
                     f"{r['diff_users']:.1e} / {r['diff_items']:.1e} |")
    lines += ["", "| mode | f | pair | users / items | s/it |", "|---|---|---|---|---|"]
    for r in rows:
        if r.get("pair"):
            s = f"{r['s_per_it']:.4f}" if r["status"] == "ok" else r["status"]
            lines.append(f"| {r['mode']} | {r['f']} | {r['variant']} | `{r['configs'][0]}` / "
                         f"`{r['configs'][1]}` | {s} |")
    with open(os.path.join(out, "side_profile.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
