#!/usr/bin/env python3
"""Implicit feedback against explicit ratings with ``variant="auto"``, for two builds of clmf
side by side (issue 27's "before and after"): per device, f and mode, whole fits in fresh
processes, the builds alternated round by round so both see the same machine load; median s/it
after the first iteration, the rule and configurations the lookup chose.

    python scripts/mode_speed.py OUT --build before=/tmp/site-main --build after=/tmp/site-branch \\
        --data synthetic:20000x10000x1000000 --factors 32,64,100,128 --devices Intel,Portable

Each ``--build NAME=DIR`` is a directory holding an installed clmf (``pip install --no-deps
--target DIR dist/clmf-*.whl``); with none, the clmf this interpreter imports. Writes
OUT/mode_speed.json and OUT/mode_speed.md (devices, drivers, date, commits, command, load).
The per-user tuning database is left out (``XDG_DATA_HOME`` set empty): each build reads its
own shipped tunings only.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import numpy as np
import clmf
from clmf.engine.device import device_info, device_label, select_device
from clmf.provenance import commit
spec, dev, f, mode, iterations, alpha, name = sys.argv[1:8]
import scipy.sparse as sp
R = sp.load_npz(spec).tocsr()
kw = {"implicit": dict(feedback="implicit", alpha=float(alpha)),
      "biased": dict(biases=True)}.get(mode, {})
d = select_device(dev)
info = device_info(d)
t = time.perf_counter()
m = clmf.ALS(int(f), iterations=int(iterations), device=d, random_state=0, **kw)
m.fit(R, show_progress=False)
secs = [h["seconds"] for h in m.history_]
print(json.dumps({"s_per_it": float(np.median(secs[1:])), "first_s": secs[0],
                  "whole_s": time.perf_counter() - t, "setup_s": m.timings_["setup"],
                  "rule": {s: c.rule for s, c in m.config_.items()},
                  "config": {s: str(c.config) for s, c in m.config_.items()},
                  "device": device_label(info), "driver": info.driver,
                  "commit": commit(), "clmf": clmf.__file__, "data": name,
                  "shape": [int(R.shape[0]), int(R.shape[1]), int(R.nnz)]}))
"""


def log(msg):
    """Progress on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_child(site, data, dev, f, mode, iterations, alpha, timeout):
    """One fit in a fresh process with ``site`` first on the path, of ``data`` ((npz path,
    name)): its JSON, or an error."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if site:
        env["PYTHONPATH"] = site
    env["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="clmf-no-user-db-")
    env.pop("CLMF_TUNING_DB", None)
    cmd = [sys.executable, "-c", CHILD, data[0], dev, str(f), mode, str(iterations), str(alpha),
           data[1]]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                           cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout} s"}
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


SEP = " § "          # between the parts of a summary key (device names hold "|")


def summarize(doc, devs):
    """The medians (over rounds) and the choices of each build, device, f and mode."""
    doc["devices"] = [doc["device_names"].get(d, d) for d in devs]
    doc["median"], doc["choice"] = {}, {}
    for b in doc["builds"]:
        for dev in devs:
            name = doc["device_names"].get(dev, dev)
            for f in doc["factors"]:
                for mode in doc["modes"]:
                    rs = [x for x in doc["runs"] if x["build"] == b and x["device_spec"] == dev
                          and x["f"] == f and x["mode"] == mode and "s_per_it" in x]
                    if rs:
                        key = SEP.join((b, name, str(f), mode))
                        doc["median"][key] = statistics.median(x["s_per_it"] for x in rs)
                        doc["choice"][key] = {"rule": rs[0]["rule"], "config": rs[0]["config"]}


def render(doc):
    """The markdown report."""
    L = [f"# Implicit vs explicit s/it with variant=\"auto\" — {doc['date']}", "",
         f"- command: `{doc['command']}`", "- builds: " + ", ".join(
             f"{b} ({doc['commits'].get(b, '?')})" for b in doc["builds"]),
         f"- data: {doc['data']}; {doc['iterations']} iterations per fit, median s/it after "
         f"the first, median over {doc['rounds']} rounds (builds alternated within a round)",
         f"- load average (1 min) at start / end: {doc['load'][0]:.2f} / {doc['load'][1]:.2f} "
         "(2-core machine shared with other work: compare within a row)", ""]
    builds = doc["builds"]
    head = "| device | f | " + " | ".join(
        f"{b} explicit | {b} implicit | {b} implicit ÷ explicit" for b in builds)
    if len(builds) == 2:
        head += f" | implicit {builds[0]} ÷ {builds[1]}"
    L += [head + " |", "|" + "---|" * (2 + 3 * len(builds) + (len(builds) == 2)) ]
    for dev in doc["devices"]:
        for f in doc["factors"]:
            cells, imp = [], {}
            for b in builds:
                e = doc["median"].get(SEP.join((b, dev, str(f), "explicit")))
                i = doc["median"].get(SEP.join((b, dev, str(f), "implicit")))
                imp[b] = i
                cells += [_f(e), _f(i), _f(i / e if e and i else None, 2)]
            if len(builds) == 2:
                a, c = imp[builds[0]], imp[builds[1]]
                cells.append(_f(a / c if a and c else None, 2))
            L.append(f"| {dev.replace('|', '/')} | {f} | " + " | ".join(cells) + " |")
    L += ["", "## Choices (users / items, rule)", "", "| build | device | f | mode | rule | "
          "configuration |", "|---|---|---|---|---|---|"]
    for k, r in sorted(doc["choice"].items(), key=lambda kv: (kv[0].split(SEP)[1],
                                                               int(kv[0].split(SEP)[2]),
                                                               kv[0].split(SEP)[3],
                                                               kv[0].split(SEP)[0])):
        b, dev, f, mode = k.split(SEP)
        cfg = r["config"]
        c = cfg["users"] if cfg["users"] == cfg["items"] else f"{cfg['users']} / {cfg['items']}"
        rule = r["rule"]["users"] if r["rule"]["users"] == r["rule"]["items"] else \
            f"{r['rule']['users']}/{r['rule']['items']}"
        L.append(f"| {b} | {dev.replace('|', '/')} | {f} | {mode} | {rule} | `{c}` |")
    return "\n".join(L) + "\n"


def _f(x, nd=4):
    return "—" if x is None else f"{x:.{nd}f}"


def main(argv=None):
    """Alternate the builds over rounds of (device, f, mode) fits; write the report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--build", action="append", default=[],
                   help="NAME=SITE_DIR[@COMMIT] (repeatable; the commit it was built from)")
    p.add_argument("--data", default="synthetic:20000x10000x1000000")
    p.add_argument("--factors", default="32,64,100,128")
    p.add_argument("--modes", default="explicit,implicit")
    p.add_argument("--devices", default="Intel,Portable")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--alpha", type=float, default=2.0)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--render", action="store_true",
                   help="only summarize OUT/mode_speed.json again (no fits)")
    a = p.parse_args(argv)
    if a.render:
        out = pathlib.Path(a.out)
        doc = json.loads((out / "mode_speed.json").read_text())
        summarize(doc, a.devices.split(","))
        (out / "mode_speed.json").write_text(json.dumps(doc, indent=1))
        (out / "mode_speed.md").write_text(render(doc))
        print(render(doc))
        return 0
    builds, commits = {}, {}
    for b in a.build:                       # NAME=DIR or NAME=DIR@COMMIT
        name, _, rest = b.partition("=")
        site, _, sha = rest.partition("@")
        builds[name] = site
        if sha:
            commits[name] = sha
    builds = builds or {"current": ""}
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    factors = [int(x) for x in a.factors.split(",")]
    modes = a.modes.split(",")
    devs = a.devices.split(",")
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "builds": list(builds),
           "command": "python scripts/mode_speed.py " + " ".join(sys.argv[1:] if argv is None
                                                                else argv),
           "data": a.data, "factors": factors, "modes": modes, "iterations": a.iterations,
           "rounds": a.rounds, "runs": [], "commits": dict(commits), "device_names": {}}
    load0 = os.getloadavg()[0]
    import scipy.sparse as sp

    from clmf import autotune
    R, name = autotune.load_data(a.data)          # generated once, read by every child
    npz = out.resolve() / "data.npz"           # (children run elsewhere: an absolute path)
    sp.save_npz(npz, R)
    data = (str(npz), name)
    doc["data"] = f"{name} ({R.shape[0]} × {R.shape[1]}, {R.nnz} ratings)"
    for r in range(a.rounds):
        for dev in devs:
            for f in factors:
                for mode in modes:
                    for b, site in builds.items():
                        res = run_child(site, data, dev, f, mode, a.iterations, a.alpha,
                                        a.timeout)
                        res.update(build=b, device_spec=dev, f=f, mode=mode, round=r)
                        doc["runs"].append(res)
                        if "device" in res:
                            doc["device_names"][dev] = f"{res['device']} ({res['driver']})"
                            doc["commits"].setdefault(b, res["commit"])
                        log(f"round {r} {dev} f={f} {mode} {b}: {res.get('s_per_it')} "
                            f"{res.get('rule', {}).get('users')} {res.get('error', '')}")
                        (out / "mode_speed.json").write_text(json.dumps(doc, indent=1))
    doc["load"] = [load0, os.getloadavg()[0]]
    summarize(doc, devs)
    (out / "mode_speed.json").write_text(json.dumps(doc, indent=1))
    (out / "mode_speed.md").write_text(render(doc))
    npz.unlink()
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
