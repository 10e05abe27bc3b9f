#!/usr/bin/env python3
"""Time a user's *first* fit: every mode at several f on real data sets, each case in a fresh
process with every cache empty (clmf's, the OpenCL runtime's), wall time of the whole process
(import, loading, device choice, tuning lookup with any probe, kernel builds, the fit).

Run by `scripts/pip_only_check.sh` in the pip-only venv (PyPI's PoCL, system runtimes hidden),
where issue 34 asks ≤ 10 s per case; it fails when a case exits non-zero or takes longer than
``--fail-over`` seconds (a stall such as the 3-minute probes it was written for, not a speed
assertion: the table is the measurement).

    python scripts/first_fit_check.py --data-dir ../shared/data [--json out.json]
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

CASES_DATA = {"ml-100k": "ml-100k/ua.base", "lastfm": "hetrec2011-lastfm-2k/user_artists.dat"}
MODES = ("explicit", "biased", "implicit")

CHILD = r"""
import sys, time
import numpy as np
import clmf
path, mode, f = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = clmf.data.load(path)
if "lastfm" in path or "artists" in path:
    data = clmf.data.Ratings(data.users, data.items, np.log1p(data.ratings).astype(np.float32),
                             data.timestamps, data.user_ids, data.item_ids)
R = data.to_csr()
kw = {"explicit": {}, "biased": {"biases": True}, "implicit": {"feedback": "implicit"}}[mode]
t0 = time.perf_counter()
model = clmf.ALS(factors=f, random_state=0, **kw).fit(R, show_progress=False)
fit = time.perf_counter() - t0
t = model.timings_
print("CLMF_RESULT", fit, t.get("tuning", 0.0), t.get("build", 0.0), model.iterations,
      model.config_["users"].rule, model.config_["users"].config, flush=True)
"""


def run_case(path, mode, f, timeout):
    """Wall seconds and the child's report of one first fit in a fresh process and caches."""
    with tempfile.TemporaryDirectory(prefix="clmf-first-fit-") as tmp:
        env = dict(os.environ, CLMF_CACHE_DIR=os.path.join(tmp, "clmf"),
                   XDG_CACHE_HOME=os.path.join(tmp, "xdg"),
                   POCL_CACHE_DIR=os.path.join(tmp, "pocl"),
                   XDG_DATA_HOME=os.path.join(tmp, "data"))
        t0 = time.perf_counter()
        try:
            res = subprocess.run([sys.executable, "-c", CHILD, str(path), mode, str(f)], env=env,
                                 capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"wall": time.perf_counter() - t0, "ok": False, "error": "timed out"}
        wall = time.perf_counter() - t0
    out = {"wall": wall, "ok": res.returncode == 0}
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("CLMF_RESULT")), None)
    if line:
        parts = line.split(maxsplit=6)
        out.update(fit=float(parts[1]), tuning=float(parts[2]), build=float(parts[3]),
                   iterations=int(parts[4]), rule=parts[5], config=parts[6])
    if res.returncode != 0:
        out["error"] = (res.stderr.strip().splitlines() or ["?"])[-1][:300]
    return out


def main():
    """Run every case and print the table; exit 1 when one fails or passes ``--fail-over``."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=str(pathlib.Path(__file__).resolve().parents[2]
                                             / "shared" / "data"))
    p.add_argument("--factors", default="16,64,128")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--data", default=",".join(CASES_DATA))
    p.add_argument("--fail-over", type=float, default=60.0,
                   help="fail when a case takes longer than this many seconds (a stall)")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args()
    rows, bad = [], 0
    print("| data | mode | f | whole process s | fit s | tuning s | builds s | rule |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.data.split(","):
        path = pathlib.Path(a.data_dir) / CASES_DATA[name]
        if not path.exists():
            sys.exit(f"first_fit_check: data file {path} is missing")
        for mode in a.modes.split(","):
            for f in (int(x) for x in a.factors.split(",")):
                r = run_case(path, mode, f, timeout=max(a.fail_over * 2, 30))
                r.update(data=name, mode=mode, f=f)
                rows.append(r)
                slow = r["wall"] > a.fail_over
                bad += (not r["ok"]) or slow
                nan = float("nan")
                print(f"| {name} | {mode} | {f} | {r['wall']:.2f} | {r.get('fit', nan):.2f}"
                      f" | {r.get('tuning', nan):.2f} | {r.get('build', nan):.2f}"
                      f" | {r.get('rule', r.get('error', '?'))} |", flush=True)
    walls = sorted(r["wall"] for r in rows)
    print(f"\n{len(rows)} first fits: median {walls[len(walls) // 2]:.2f} s, max {walls[-1]:.2f} s")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))
    if bad:
        print(f"first_fit_check: {bad} case(s) failed or took longer than {a.fail_over:.0f} s",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
