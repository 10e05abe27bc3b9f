#!/usr/bin/env python3
"""Long rows split across S1 work-groups (issue 18): the items half-step on the Netflix shape with
splitting off (``split`` = SPLIT_NEVER) and automatic (``split=0``), per f and variant.

The data set is clmf's synthetic Netflix shape (480,189 × 17,770, ~99M ratings, Zipf items: the
most popular item has ~10⁵ ratings, the average ~5.6K), generated once into OUTDIR/data (as
benchmarks/whole_fit.py does). For each f and variant (``auto``: the tuned choice for the device,
as a fit would make it), two engines with profiling on — the same configurations but for
``split`` — each run one warm-up iteration, then ``--repeats`` items half-steps, each timed by
the host clock (queue finished) and by the OpenCL profiling events of its kernels: S1 (the
hermitians, over the pieces where split), the combine of the pieces, S2, S3. Their item factors
after the same half-step from the same start are compared (relative Frobenius difference: the
split sums in another order, ~1e-6 expected). The users half-step is timed the same way.

    python benchmarks/longrows_bench.py OUTDIR --device gpu                 # f = 10, 50, 100
    python benchmarks/longrows_bench.py OUTDIR --factors 10 --data synthetic:20000x2000x2000000

Writes OUTDIR/longrows.json (every run, with device, driver, date, commit, command) and
OUTDIR/longrows.md (the table).
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from whole_fit import log, make_data  # noqa: E402  (the same data set and its cache)


def time_side(eng, side, repeats, lam):
    """Median host seconds and median per-stage device seconds of ``repeats`` half-steps."""
    walls, stages = [], []
    for _ in range(repeats):
        eng.stage_times = {"s1": 0.0, "s2": 0.0, "s3": 0.0, "combine": 0.0}
        eng.queue.finish()
        t = time.perf_counter()
        eng.half_step(side, lam, True)
        eng.queue.finish()
        walls.append(time.perf_counter() - t)
        stages.append(dict(eng.stage_times))
    med = {k: statistics.median(s[k] for s in stages) for k in stages[0]}
    return statistics.median(walls), med


def run_one(dev, R, f, cfgs, split, repeats, lam, seed):
    """One engine with both sides' ``split`` set: its split plans, times and item factors."""
    import numpy as np

    from clmf.engine.core import Engine
    from clmf.reference import start_factors
    cu, ci = (c.replace(split=split) for c in cfgs)
    eng = Engine(dev, R, f, (cu, ci), profile=True)
    try:
        X0, Y0 = start_factors(*R.shape, f, seed)
        eng.set_factors("users", X0)
        eng.set_factors("items", Y0)
        eng.iteration(lam, True)                    # warm-up (and lazy JIT)
        eng.set_factors("users", X0)
        eng.set_factors("items", Y0)
        eng.half_step("items", lam, True)           # from the same start for both engines
        Y1 = eng.get_factors("items")
        rec = {"split": split, "configs": {"users": str(cu), "items": str(ci)},
               "memory_bytes": int(eng.memory["total"])}
        for side in ("users", "items"):
            sp_ = eng.splits[side]
            ls = eng.launches[side]
            wall, st = time_side(eng, side, repeats, lam)
            rec[side] = {
                "threshold": sp_.threshold, "batch_rows": sp_.batch_rows,
                "virtual_rows": sp_.virtual_rows, "launches": len(ls),
                "split_launches": sum(1 for x in ls if x[3]),
                "rows_cut": int((np.diff(eng.side[side].indptr) > sp_.threshold).sum())
                if sp_.active else 0,
                "wall_s": wall, "s1_s": st["s1"], "combine_s": st["combine"],
                "s2_s": st["s2"], "s3_s": st["s3"],
                "s1_total_s": st["s1"] + st["combine"],
                "kernels_s": st["s1"] + st["combine"] + st["s2"] + st["s3"]}
        return rec, Y1
    finally:
        eng.release()


def render(recs):
    """The markdown table: per f, variant and side, off vs automatic."""
    lines = ["| f | variant (items) | side | split | T | launches (split) | rows cut | "
             "S1 (s) | combine (s) | S1 + combine (s) | S2 (s) | S3 (s) | half-step wall (s) | "
             "Δ factors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        for side in ("items", "users"):
            s = r[side]
            mode = "off" if r["split"] == r["split_never"] else \
                "auto" if r["split"] == 0 else r["split"]
            lines.append(
                f"| {r['f']} | `{r['configs']['items']}` | {side} | "
                f"{mode} | "
                f"{s['threshold'] or '–'} | {s['launches']} ({s['split_launches']}) | "
                f"{s['rows_cut']} | {s['s1_s']:.5f} | {s['combine_s']:.5f} | "
                f"{s['s1_total_s']:.5f} | {s['s2_s']:.5f} | {s['s3_s']:.5f} | "
                f"{s['wall_s']:.5f} | {r.get('items_rel_diff', float('nan')):.1e} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--data", default="netflix",
                   help="a synthetic preset name or synthetic:USERSxITEMSxRATINGS")
    p.add_argument("--device", default="auto")
    p.add_argument("--factors", type=int, nargs="+", default=[10, 50, 100])
    p.add_argument("--variant", action="append",
                   help="a variant string (repeatable); default: auto (the tuned choice)")
    p.add_argument("--splits", type=int, nargs="+", default=None,
                   help="split values to compare (default: never, 0 = automatic)")
    p.add_argument("--repeats", type=int, default=5, help="timed half-steps per side")
    p.add_argument("--regularization", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    import numpy as np
    import scipy.sparse as sp

    import clmf
    from clmf.engine.config import SPLIT_NEVER
    from clmf.engine.device import device_info, device_label, select_device
    from clmf.provenance import commit
    from clmf.tuning import FitSpec, resolve, side_stats

    out = pathlib.Path(a.outdir)
    make_data(a.data, out / "data")
    d = out / "data"
    meta = json.loads((d / "meta.json").read_text())
    arrs = [np.load(d / f"{k}.npy") for k in ("indptr", "indices", "data")]
    R = sp.csr_matrix((arrs[2], arrs[1], arrs[0]), shape=tuple(meta["shape"]), copy=False)
    uc, ic = np.diff(R.indptr), np.bincount(R.indices, minlength=R.shape[1])
    log(f"{meta['spec']}: {R.shape[0]} × {R.shape[1]}, {R.nnz} ratings; longest user "
        f"{int(uc.max())}, longest item {int(ic.max())} (mean {R.nnz / max(1, R.shape[1]):.0f})")
    stats = {"users": side_stats(uc, R.shape[1]), "items": side_stats(ic, R.shape[0])}
    dev = select_device(a.device)
    info = device_info(dev)
    splits = a.splits if a.splits is not None else [SPLIT_NEVER, 0]
    recs = []
    for f in a.factors:
        for variant in a.variant or ["auto"]:
            spec = FitSpec.of({"factors": f, "regularization": a.regularization,
                               "variant": variant})
            ch = resolve(spec, info, stats)
            cfgs = (ch["users"].config, ch["items"].config)
            ref_y = None
            for split in splits:
                t0 = time.perf_counter()
                try:
                    rec, Y1 = run_one(dev, R, f, cfgs, split, a.repeats, a.regularization,
                                      a.seed)
                except clmf.ClmfError as e:
                    log(f"f={f} {variant} split={split}: {type(e).__name__}: {e}")
                    continue
                if ref_y is None:
                    ref_y = Y1
                else:
                    nb = float(np.linalg.norm(ref_y))
                    rec["items_rel_diff"] = float(np.linalg.norm(Y1 - ref_y) / (nb or 1.0))
                rec.update(f=f, variant=variant, split_never=SPLIT_NEVER, data=meta["spec"],
                           shape=meta["shape"], nnz=meta["nnz"],
                           longest={"users": int(uc.max()), "items": int(ic.max())},
                           device=device_label(info), driver=info.driver,
                           compute_units=info.compute_units, commit=commit(),
                           date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                           command=" ".join([pathlib.Path(sys.argv[0]).name] + sys.argv[1:]),
                           seconds=time.perf_counter() - t0)
                it = rec["items"]
                log(f"f={f} {variant} split={split}: items T={it['threshold']} S1 "
                    f"{it['s1_s']:.5f} + combine {it['combine_s']:.5f} s, half-step "
                    f"{it['wall_s']:.5f} s ({it['split_launches']}/{it['launches']} launches "
                    f"split)")
                recs.append(rec)
                (out / "longrows.json").write_text(json.dumps(recs, indent=1))
    (out / "longrows.md").write_text(
        f"# Long rows split: items half-step, {meta['spec']} on {info.name}\n\n"
        f"Command: `python benchmarks/longrows_bench.py {' '.join(sys.argv[1:])}` "
        f"(commit {commit()})\n\n{render(recs)}\n")
    print(render(recs))


if __name__ == "__main__":
    main()
