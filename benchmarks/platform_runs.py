#!/usr/bin/env python3
"""Run the core check on every OpenCL device visible and record it (results/runs/).

For each device: MovieLens 100K (official ua.base / ua.test split), f=10, λ=0.15 (weighted),
10 iterations from the seeded start; records test RMSE, the reference's RMSE, median seconds
per iteration, device, platform, driver, date and commit (JSON Lines), and saves the factors
after ONE iteration from the shared start so runs on different implementations can be compared
(`--compare` checks ‖ΔX‖/‖X‖ ≤ 1e-4 between every pair of saved runs and RMSE within 0.1%).

    python benchmarks/platform_runs.py --data ../shared/data/ml-100k --out results/runs
    python benchmarks/platform_runs.py --compare results/runs
"""
import argparse
import datetime
import glob
import json
import os
import re
import sys

import numpy as np


def commit():
    from clmf.provenance import commit as clmf_commit
    return clmf_commit()


def run(args):
    import clmf
    from clmf import data, reference
    from clmf.engine.device import select_device, select_devices, spec_from_text
    train, test = data.load_movielens_100k_split(args.data)
    R = train.to_csr()
    f, lam, iters = args.factors, args.regularization, args.iterations
    X0, Y0 = reference.start_factors(*R.shape, f, 0)
    Xr, Yr = reference.als(R, f, lam, iters, init=(X0, Y0))
    ref_rmse = reference.rmse(Xr, Yr, test.to_csr())
    X1, Y1 = reference.als(R, f, lam, 1, init=(X0, Y0))
    os.makedirs(args.out, exist_ok=True)
    # the device grammar (a platform's name selects it, never a device-name substring: PoCL's
    # device is named after the CPU)
    wanted = ({w.int_ptr for w in select_devices(spec_from_text(args.device))}
              if args.device else None)
    for d in clmf.devices():
        dev = select_device(d.index)
        if wanted is not None and dev.int_ptr not in wanted:
            continue
        one = clmf.ALS(f, lam, 1, device=dev).fit(R, init=(X0, Y0), show_progress=False)
        m = clmf.ALS(f, lam, iters, device=dev).fit(R, init=(X0, Y0), show_progress=False)
        secs = [h["seconds"] for h in m.history_]
        rmse = m.rmse(test)
        slug = re.sub(r"[^a-z0-9]+", "-", f"{d.platform}-{d.name}".lower()).strip("-")[:60]
        np.savez_compressed(os.path.join(args.out, f"factors1_{slug}.npz"),
                            X=one.user_factors_, Y=one.item_factors_)
        rec = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit(), "platform": d.platform, "platform_version": d.platform_version,
            "device": d.name, "driver": d.driver, "type": d.type, "data": "ml-100k ua.base/ua.test",
            "factors": f, "regularization": lam, "weighted": True, "iterations": iters,
            "test_rmse": rmse, "reference_test_rmse": ref_rmse,
            "rmse_rel_diff_vs_reference": abs(rmse - ref_rmse) / ref_rmse,
            "one_iteration_rel_err_X": float(np.linalg.norm(one.user_factors_ - X1)
                                             / np.linalg.norm(X1)),
            "one_iteration_rel_err_Y": float(np.linalg.norm(one.item_factors_ - Y1)
                                             / np.linalg.norm(Y1)),
            "seconds_per_iteration_median": float(np.median(secs[1:] if len(secs) > 1 else secs)),
            "seconds_per_iteration": secs, "config_users": str(m.config_["users"].config),
            "config_items": str(m.config_["items"].config), "factors_file": f"factors1_{slug}.npz",
        }
        with open(os.path.join(args.out, "ml100k.jsonl"), "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        print(json.dumps(rec, indent=1))


def compare(args):
    files = sorted(glob.glob(os.path.join(args.compare, "factors1_*.npz")))
    ok = True
    for i, a in enumerate(files):
        for b in files[i + 1:]:
            A, B = np.load(a), np.load(b)
            ex = np.linalg.norm(A["X"] - B["X"]) / np.linalg.norm(B["X"])
            ey = np.linalg.norm(A["Y"] - B["Y"]) / np.linalg.norm(B["Y"])
            good = ex <= 1e-4 and ey <= 1e-4
            ok &= good
            print(f"{os.path.basename(a)} vs {os.path.basename(b)}: X {ex:.2e}  Y {ey:.2e}  "
                  f"{'ok' if good else 'DIFFER'}")
    recs = [json.loads(line) for line in open(os.path.join(args.compare, "ml100k.jsonl"))]
    latest = {}
    for r in recs:
        latest[(r["platform"], r["device"])] = r
    rm = [r["test_rmse"] for r in latest.values()]
    spread = (max(rm) - min(rm)) / min(rm)
    print(f"test RMSE over {len(rm)} devices: {min(rm):.5f} .. {max(rm):.5f} (spread {spread:.2e})")
    ok &= spread <= 1e-3
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="../shared/data/ml-100k")
    p.add_argument("--out", default="results/runs")
    p.add_argument("--device", default=None,
                   help="the devices to run on (device=, or a comma list; default: all)")
    p.add_argument("--factors", type=int, default=10)
    p.add_argument("--regularization", type=float, default=0.15)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--compare", default=None, help="compare saved runs in this folder")
    a = p.parse_args()
    if a.compare:
        return compare(a)
    run(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
