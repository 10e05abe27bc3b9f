#!/usr/bin/env python
"""Time the tuning lookup of the first fit of a fresh process (issue 13: ≤ 50 ms).

Each measurement runs in its own fresh Python process: it imports clmf, loads the data set, wraps
``clmf.tuning.choose`` (what ``ALS.fit`` calls, once per side) with a timer and fits ``ALS``
(``variant="auto"``) for one iteration; the time spent inside ``choose`` (wall, and CPU time of
the calling thread, which a loaded machine inflates less) is the lookup's cost, reading and
parsing the databases included (the per-user database is left out). Sources: ``shipped`` (the
compact databases installed with clmf) and ``raw`` (the raw ``results/tuning/*.jsonl`` given with
``--raw``, through ``$CLMF_TUNING_DB``, the shipped files off), for comparison. Writes
``lookup_time.json`` to ``OUT`` and prints a table.

    PYTHONPATH=.devsite OCL_ICD_VENDORS=/work/main/.icd python scripts/archive/lookup_time.py \\
        ../shared/data/ml-100k OUT --device Intel --raw results/tuning
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import clmf
from clmf import tuning
spent, cpu, calls = [], [], []
real = tuning.choose
def timed(*a, **k):
    t, c = time.perf_counter(), time.thread_time()
    try:
        ch = real(*a, **k)
    finally:
        spent.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
    calls.append([ch.rule, str(ch.config)])
    return ch
tuning.choose = timed
data = clmf.data.load(sys.argv[1])
t1 = time.perf_counter()
model = clmf.ALS(factors=int(sys.argv[3]), iterations=1, device=sys.argv[2] or None)
model.fit(data)
t2 = time.perf_counter()
print(json.dumps({"lookup_s": sum(spent), "per_call_s": spent, "choices": calls,
                  "lookup_cpu_s": sum(cpu), "per_call_cpu_s": cpu,
                  "import_s": t1 - t0, "fit_s": t2 - t1,
                  "shipped": [str(p) for p in tuning.shipped_paths()]}))
"""


def run_once(data, device, f, env, cwd):
    """One fresh process (run in ``cwd``: not a source checkout's root, whose ``clmf`` would shadow
    the installed one): the child's JSON report."""
    data = str(pathlib.Path(data).resolve())
    out = subprocess.run([sys.executable, "-c", CHILD, data, device or "", str(f)], env=env,
                         cwd=cwd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the measuring process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    """Measure and write OUT/lookup_time.json."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="data set (e.g. ../shared/data/ml-100k)")
    p.add_argument("out", help="output directory")
    p.add_argument("--device", default="", help="clmf device selector (default: clmf's default)")
    p.add_argument("-f", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3, help="fresh processes per source")
    p.add_argument("--raw", help="directory of raw databases to compare with (results/tuning)")
    a = p.parse_args(argv)
    base = dict(os.environ)
    base.pop("CLMF_TUNING_DB", None)
    base.pop("CLMF_TUNING_NO_SHIPPED", None)
    # no per-user database: platformdirs looks under an empty $XDG_DATA_HOME
    base["XDG_DATA_HOME"] = str((pathlib.Path(a.out) / "xdg-empty").resolve())
    sources = {"shipped": dict(base)}
    if a.raw:
        sources["raw"] = dict(base, CLMF_TUNING_DB=str(pathlib.Path(a.raw).resolve()),
                              CLMF_TUNING_NO_SHIPPED="1")
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"data": a.data, "device": a.device, "f": a.f, "runs": {}}
    for name, env in sources.items():
        report["runs"][name] = [run_once(a.data, a.device, a.f, env, out) for _ in range(a.repeat)]
    (out / "lookup_time.json").write_text(json.dumps(report, indent=1))
    for name, runs in report["runs"].items():
        ms = sorted(r["lookup_s"] * 1e3 for r in runs)
        cpu = sorted(r["lookup_cpu_s"] * 1e3 for r in runs)
        print(f"{name:8s} lookup in the first fit: wall {', '.join(f'{x:.1f}' for x in ms)} ms "
              f"(median {ms[len(ms) // 2]:.1f}), CPU of the calling thread median "
              f"{cpu[len(cpu) // 2]:.1f} ms; choices {runs[0]['choices']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
