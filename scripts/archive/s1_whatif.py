"""What-if timings of the syrk S1 kernel: the source with one part removed, S1 timed per side.

Exploration, not a benchmark: the mutated kernels compute wrong results on purpose (the solves
that follow may fail; only S1's profiled time is reported). It shows where S1's time goes:

    python scripts/archive/s1_whatif.py --device gpu --scale 1.0 -f 100 \\
        --variant "batch+vec4+syrk:bx=8,ks=2,nnz_batch=32,solver=cg"

Cuts (``--cut``, any of): ``nogather`` (staged rows are constants instead of gathered factor
rows), ``nowrite`` (the hermitians are not stored), ``noL`` (the write-back loop is skipped),
``noprod`` (the micro-tiles' products dropped).
"""
from __future__ import annotations

import argparse
import re

import numpy as np

CUTS = {
    "nogather": [("GLOAD4(Y, o + 4 * q)", "(float4)(0.01f * (float)q)")],
    "nowrite": [("        Ab[p] = val;", "        if (val == -12345.0f) Ab[p] = val;")],
    "noL": [("    for (int p = lid; p < F * F; p += WG) {",
             "    for (int p = lid; p < 0; p += WG) {")],
    # the products of the off-diagonal micro-tile entries are dropped (one FMA per work-item and
    # entry stays, so the staged loads are still used): what S1 costs without its arithmetic
    "noprod": [(re.compile(r"acc_(\d+)_(\d+) = fma\(xa\d+, y[ab]\d+\.s\d, acc_\d+_\d+\);"),
                lambda m: m.group(0) if m.group(1) == m.group(2) == "0" else "")],
    # the mma variant (batch+vec4+mma)
    "mma_nogather": [("#define PCL_GLOAD4(p, o) (((__global const float4*)(p))[(o) / 4])",
                      "#define PCL_GLOAD4(p, o) ((float4)(0.01f * (float)((o) & 7)))")],
    "mma_nob": [("        if (want_b) {\n            if (lid",
                 "        if (0) {\n            if (lid")],
    "mma_nomma": [("#define PCL_MMA(", "#define PCL_MMA(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1) "
                   "(d0 += as_float((a0) ^ (b1)))\n#define PCL_MMA_CUT(")],
    "mma_noL": [("    for (int p = lid; p < F * F; p += PCL_WG) {",
                 "    for (int p = lid; p < 0; p += PCL_WG) {")],
}


def main(argv=None):
    import clmf.engine.kernels as K
    from clmf import data
    from clmf.engine import Engine
    from clmf.engine.config import KernelConfig
    from clmf.engine.device import select_device

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--scale", type=float, default=0.05, help="Netflix-shaped synthetic set scale")
    ap.add_argument("-f", "--factors", type=int, default=100)
    ap.add_argument("--variant", required=True)
    ap.add_argument("--cut", nargs="*", default=None, choices=list(CUTS),
                    help="default: every cut that applies to the variant's kernel")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)

    orig = K.render_als
    active: list[str] = []

    def render(*args, **kw):
        src = orig(*args, **kw)
        for cut in active:
            for old, new in CUTS[cut]:
                if isinstance(old, re.Pattern):
                    src, n = old.subn(new, src)
                elif old in src:
                    src, n = src.replace(old, new), 1
                else:
                    n = 0
                if not n:
                    raise SystemExit(f"cut {cut!r} does not apply to this kernel source")
        return src

    K.render_als = render
    R = data.synthetic("netflix", scale=a.scale, seed=0).to_csr()
    dev = select_device(a.device)
    cfg = KernelConfig.parse(a.variant)
    if a.cut is None:
        a.cut = [c for c in CUTS if c.startswith("mma_") == cfg.mma]
    rng = np.random.default_rng(0)
    X0 = (rng.standard_normal((R.shape[0], a.factors)) * 0.1).astype(np.float32)
    Y0 = (rng.standard_normal((R.shape[1], a.factors)) * 0.1).astype(np.float32)
    runs = [[]] + [[c] for c in a.cut] + ([list(a.cut)] if len(a.cut) > 1 else [])
    print(f"{dev.name}, {R.shape[0]} x {R.shape[1]}, {R.nnz} ratings, f={a.factors}, {cfg}")
    for cuts in runs:
        active[:] = cuts
        eng = Engine(dev, R, a.factors, (cfg, cfg), profile=True)
        try:
            eng.set_factors("users", X0)
            eng.set_factors("items", Y0)
            s1 = {}
            for side in ("users", "items"):
                eng.stage_times = {"s1": 0.0, "s2": 0.0, "s3": 0.0}
                for _ in range(a.repeats):
                    try:
                        eng.half_step(side, 0.05, True)
                    except Exception:       # a cut kernel's hermitians may not be solvable
                        pass
                s1[side] = eng.stage_times["s1"] / a.repeats
        finally:
            eng.release()
        label = "+".join(cuts) or "as built"
        print(f"{label:>24}: S1 users {s1['users'] * 1e3:8.2f} ms, "
              f"items {s1['items'] * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
