#!/usr/bin/env python3
"""Whole ALS fits from a host CSR, timed as a user sees them (issue 16): set-up (validation,
tuning lookup, program builds, upload, device transpose) in ns per rating and by phase, the first
iteration, the later iterations' s/it and the whole fit's wall time.

The data set is generated once (clmf's synthetic generator, default the Netflix shape
480,189 × 17,770, ~99M ratings) and saved under OUTDIR/data; then each of ``--processes`` fresh
Python processes loads it into memory (not timed) and runs ``--fits`` fits of ``--iterations``
iterations. The first process of a machine with an empty kernel cache shows the cold builds, the
next ones a warm cache; the second fit of a process shows what a process pays only once.

    python benchmarks/whole_fit.py OUTDIR                    # Netflix shape, f=100, 15 iterations
    python benchmarks/whole_fit.py OUTDIR --data synthetic:100000x20000x5000000 --device portable

Issue 30's whole-fit breakdown (first fit in a fresh process with an empty cache, with a warm
cache, a later fit) and before/after comparisons::

    python benchmarks/whole_fit.py OUT --cache empty --processes 2 --fits 2 --profile 25
    python benchmarks/whole_fit.py OUT --cache empty --sites main=/tmp/site-main new=

``--cache empty`` gives processes 0, 2, 4, ... of each site new empty cache directories (clmf's,
pyopencl's, PoCL's, NVIDIA's compute cache) and processes 1, 3, 5, ... the warm ones the process
before them left.
``--sites LABEL=DIR`` runs the processes in turn with ``PYTHONPATH=DIR`` (an installed clmf, e.g.
``pip install --no-deps --target DIR main.whl``; empty: the environment's): one site after the
other, process by process, so that the machine's load is shared alike. ``--profile N`` runs each
fit under cProfile (the main thread; build threads are timed by ``timings_``) and keeps its N
costliest functions by cumulative time; ``--warm-up S`` calls ``ALS.warm_up(R)`` S seconds before
the first fit (the user's other work meanwhile; ``--warm-up-sites``: in those sites' processes
only, e.g. two sites of the same clmf side by side). ``after`` is what the fit spent past its last
iteration (the training RMSE's pass, the factors read back, the ranker's uploads).

Writes OUTDIR/whole_fit.json (every fit, with device, driver, date, commit, command) and
OUTDIR/whole_fit.md (the table).
"""
from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import pathlib
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time


def log(msg):
    """Timestamped progress on stderr."""
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", file=sys.stderr,
          flush=True)


def make_data(spec, out):
    """Generate the data set of ``spec`` ("netflix" or "synthetic:UxIxN") into ``out`` (.npy)."""
    import numpy as np

    import clmf
    out.mkdir(parents=True, exist_ok=True)
    if (out / "meta.json").exists() and json.loads((out / "meta.json").read_text())["spec"] == spec:
        return
    t = time.perf_counter()
    if spec.startswith("synthetic:"):
        r = clmf.data.synthetic_from_spec(spec)[0]
    else:
        r = clmf.data.synthetic(spec)
    R = r.to_csr()
    for name in ("indptr", "indices", "data"):
        np.save(out / f"{name}.npy", getattr(R, name))
    (out / "meta.json").write_text(json.dumps({"spec": spec, "shape": list(R.shape),
                                               "nnz": int(R.nnz)}))
    log(f"data {spec}: {R.shape[0]} × {R.shape[1]}, {R.nnz} ratings "
        f"({time.perf_counter() - t:.1f} s to generate)")


def child(a):
    """One process: load the CSR, then ``a.fits`` timed fits; prints one JSON line per fit."""
    t_imp = time.perf_counter()
    import numpy as np
    import scipy.sparse as sp

    import clmf
    from clmf.engine import core, upload
    from clmf.engine.device import device_info, device_label, select_device
    import_s = time.perf_counter() - t_imp
    upload.PINNED = a.upload == "pinned"
    align = a.host_align[a.process % len(a.host_align)] if a.host_align else upload.HOST_ALIGN
    upload.HOST_ALIGN = int(str(align).removeprefix("copy"))
    upload.WRAP_BELOW = not str(align).startswith("copy")
    adopt = a.adopt[a.process % len(a.adopt)] if a.adopt else int(core.ADOPT_FACTORS)
    core.ADOPT_FACTORS = bool(adopt)
    if a.build_threads is not None:
        from clmf.engine import programs
        programs.BUILD_THREADS = a.build_threads
    d = pathlib.Path(a.outdir) / "data"
    meta = json.loads((d / "meta.json").read_text())
    arrs = [np.load(d / f"{k}.npy") for k in ("indptr", "indices", "data")]
    R = sp.csr_matrix((arrs[2], arrs[1], arrs[0]), shape=tuple(meta["shape"]), copy=False)
    warm_s = None
    if a.warm_up is not None and (not a.warm_up_sites or a.site_label in a.warm_up_sites):
        t_w = time.perf_counter()
        clmf.ALS(factors=a.factors, regularization=a.regularization, iterations=a.iterations,
                 device=a.device, random_state=0, feedback=a.feedback,
                 biases=a.biases).warm_up(R)
        warm_s = time.perf_counter() - t_w
        time.sleep(a.warm_up)
    for fit in range(a.fits):
        t_dev = time.perf_counter()
        dev = select_device(a.device)
        info = device_info(dev)
        dev_s = time.perf_counter() - t_dev
        model = clmf.ALS(factors=a.factors, regularization=a.regularization,
                         iterations=a.iterations, device=dev, random_state=0,
                         feedback=a.feedback, biases=a.biases)
        prof = cProfile.Profile() if a.profile else None
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        model.fit(R, show_progress=False)
        if prof is not None:
            prof.disable()
        whole = time.perf_counter() - t0
        secs = [h["seconds"] for h in model.history_]
        rest = secs[1:] or secs
        t = model.timings_
        rec = {
            "site": a.site_label, "cache": a.cache_state, "warm_up_call_s": warm_s,
            "after_s": whole - t["setup"] - sum(secs),
            "profile": top_functions(prof, a.profile) if prof is not None else None,
            "factors_checksum": float(np.sum(model.user_factors_, dtype=np.float64)
                                      + np.sum(model.item_factors_, dtype=np.float64)),
            "process": a.process, "fit": fit, "data": meta["spec"], "shape": meta["shape"],
            "nnz": meta["nnz"], "factors": a.factors, "iterations": a.iterations,
            "feedback": a.feedback, "biases": a.biases, "regularization": a.regularization,
            "upload": a.upload, "host_align": align, "adopt": adopt,
            "build_threads": a.build_threads,
            "device": device_label(info), "driver": info.driver,
            "import_s": import_s if fit == 0 else 0.0, "select_device_s": dev_s,
            "whole_fit_s": whole, "setup_s": t["setup"],
            "setup_ns_per_rating": t["setup"] / meta["nnz"] * 1e9,
            "timings": t, "first_iteration_s": secs[0],
            "s_per_it": statistics.median(rest), "iteration_s": secs,
            "setup_share": t["setup"] / whole,
            "configs": {s: str(c.config) for s, c in model.config_.items()},
        }
        print("RESULT " + json.dumps(rec), flush=True)


def top_functions(prof, n):
    """The ``n`` costliest functions of a cProfile run by cumulative time, as text."""
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(n)
    return out.getvalue()


def kind_of(r):
    """Which of issue 30's cases a fit is: a later fit of its process, or a first fit with an
    empty or a warm cache (or the machine's own, ``--cache keep``)."""
    if r["fit"] > 0:
        return "later fit"
    return {"empty": "first, empty cache", "warm": "first, warm cache"}.get(
        r.get("cache"), "first fit")


def render(recs):
    """The markdown table of the fits."""
    lines = ["| site | process | fit | case | whole fit (s) | set-up (s) | set-up ns/rating | "
             "builds (s) | build wait (s) | upload + transpose (s) | iterations (s) | "
             "after (s) | 1st iteration (s) | s/it (later) | set-up share | factors checksum |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        t = r["timings"]
        lines.append(
            f"| {r.get('site') or '–'} | {r['process']} | {r['fit']} | {kind_of(r)} | "
            f"{r['whole_fit_s']:.3f} | {r['setup_s']:.3f} | "
            f"{r['setup_ns_per_rating']:.1f} | {t.get('build', float('nan')):.3f} | "
            f"{t.get('build_wait', float('nan')):.3f} | "
            f"{t.get('upload_transpose', float('nan')):.3f} | {sum(r['iteration_s']):.3f} | "
            f"{r.get('after_s', float('nan')):.3f} | {r['first_iteration_s']:.3f} | "
            f"{r['s_per_it']:.4f} | {100 * r['setup_share']:.0f} % | "
            f"{r.get('factors_checksum', float('nan')):.10g} |")
    lines += ["", "Set-up phases (s; `ALS.timings_`, see its docstring):", "",
              "| site | process | fit | " + " | ".join(PHASES) + " | other |",
              "|---|---|---|" + "---|" * (len(PHASES) + 1)]
    for r in recs:
        t = r["timings"]
        known = sum(t.get(k, 0.0) for k in PHASES if k not in NESTED)
        lines.append(f"| {r.get('site') or '–'} | {r['process']} | {r['fit']} | "
                     + " | ".join(f"{t[k]:.3f}" if k in t else "–" for k in PHASES)
                     + f" | {t['setup'] - known:.3f} |")
    lines += ["", "After the iterations (s; `timings_`: `wrap_up` the last iteration's metrics, "
              "the factors read back and checked; `ranker` the factors and seen items kept on "
              "the device; `rest` the remainder of `after`, e.g. the buffers' release):", "",
              "| site | process | fit | after | wrap_up | ranker | rest |",
              "|---|---|---|---|---|---|---|"]
    for r in recs:
        t = r["timings"]
        if "wrap_up" not in t:
            continue
        lines.append(f"| {r.get('site') or '–'} | {r['process']} | {r['fit']} | "
                     f"{r['after_s']:.3f} | {t['wrap_up']:.3f} | {t.get('ranker', 0.0):.3f} | "
                     f"{r['after_s'] - t['wrap_up'] - t.get('ranker', 0.0):.3f} |")
    return "\n".join(lines)


def ratios(recs):
    """Per case, each site's median whole fit and set-up against the first site's (the
    before/after table of ``--sites``)."""
    sites = list(dict.fromkeys(r.get("site") for r in recs))
    if len(sites) < 2:
        return ""
    lines = ["", "Medians per case and site; ratio to the first site's (" + str(sites[0]) + "):",
             "", "| case | site | fits | whole fit (s) | set-up (s) | after (s) | "
             "whole ratio | set-up ratio |", "|---|---|---|---|---|---|---|---|"]
    for case in dict.fromkeys(kind_of(r) for r in recs):
        base = None
        for site in sites:
            sel = [r for r in recs if r.get("site") == site and kind_of(r) == case]
            if not sel:
                continue
            w = statistics.median(r["whole_fit_s"] for r in sel)
            s = statistics.median(r["setup_s"] for r in sel)
            a = statistics.median(r.get("after_s", float("nan")) for r in sel)
            base = base or (w, s)
            lines.append(f"| {case} | {site} | {len(sel)} | {w:.3f} | {s:.3f} | {a:.3f} | "
                         f"{w / base[0]:.2f} | {s / base[1]:.2f} |")
    return "\n".join(lines)


def cache_env(root):
    """The environment of a process whose caches (clmf's, pyopencl's, PoCL's, NVIDIA's compute
    cache) live under ``root``."""
    return {"CLMF_CACHE_DIR": os.path.join(root, "clmf"),
            "XDG_CACHE_HOME": os.path.join(root, "xdg"),
            "POCL_CACHE_DIR": os.path.join(root, "pocl"),
            "CUDA_CACHE_PATH": os.path.join(root, "nv")}


def site_arg(text):
    """``--sites``'s value: ``LABEL=DIR`` (DIR may be empty: the environment's clmf)."""
    label, sep, path = text.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"{text!r} is not LABEL=DIR")
    return label, path


# set-up phases in order; NESTED ones are parts of the one before (build runs in a thread, its
# build_wait is what the set-up waited for it)
PHASES = ("validation", "counts", "tuning", "plan", "engine_host", "build", "build_wait",
          "upload", "transpose", "buffers", "start_factors", "factors_upload")
NESTED = ("build",)


def host_align_arg(text):
    """``--host-align``'s value: bytes, or ``copy`` and bytes."""
    if not text.removeprefix("copy").isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not N or copyN (N bytes)")
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--data", default="netflix",
                   help="a synthetic preset name or synthetic:USERSxITEMSxRATINGS")
    p.add_argument("--device", default="auto")
    p.add_argument("--factors", type=int, default=100)
    p.add_argument("--iterations", type=int, default=15)
    p.add_argument("--regularization", type=float, default=0.05)
    p.add_argument("--feedback", default="explicit", choices=("explicit", "implicit"))
    p.add_argument("--biases", action="store_true")
    p.add_argument("--upload", default="pinned", choices=("pinned", "direct"),
                   help="GPU uploads through pinned staging buffers (the library's way) or "
                        "straight from the host arrays (before issue 16's pinned uploads)")
    p.add_argument("--host-align", nargs="+", default=None, type=host_align_arg,
                   help="bytes at which host arrays must start to be wrapped in place on Intel's "
                        "CPU runtime (clmf.engine.upload.HOST_ALIGN; 0: never copied; copyN: N, "
                        "misaligned arrays copied, never wrapped from below: WRAP_BELOW off), "
                        "one per process in turn (e.g. 128 copy128 0: side by side; default the "
                        "library's)")
    p.add_argument("--adopt", type=int, nargs="+", default=None, choices=(0, 1),
                   help="1: a CPU runtime's factor buffers wrap the start factors in place "
                        "(clmf.engine.core.ADOPT_FACTORS), 0: copied into the engine's buffers; "
                        "one per process in turn (e.g. 1 0; default the library's)")
    p.add_argument("--processes", type=int, default=2,
                   help="fresh processes, one after another (per site with --sites)")
    p.add_argument("--cache", default="keep", choices=("keep", "empty"),
                   help="keep: the machine's caches; empty: even processes start from new "
                        "empty cache directories, odd ones find the previous process's warm")
    p.add_argument("--sites", nargs="+", type=site_arg, default=None,
                   help="LABEL=DIR: processes in turn with PYTHONPATH=DIR (an installed clmf; "
                        "empty DIR: the environment's), e.g. main=/tmp/site-main new=")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="cProfile each fit (main thread), keep its N costliest functions")
    p.add_argument("--warm-up", type=float, default=None, metavar="S",
                   help="call ALS.warm_up(R) S seconds before the first fit of each process")
    p.add_argument("--warm-up-sites", nargs="+", default=None, metavar="LABEL",
                   help="the sites (--sites) whose processes call warm_up (default all): e.g. "
                        "--sites plain= warm= --warm-up 3 --warm-up-sites warm")
    p.add_argument("--build-threads", type=int, default=None,
                   help="threads building a fit's programs (clmf.engine.programs.BUILD_THREADS;"
                        " default the library's choice; 1: one after the other)")
    p.add_argument("--site-label", default=None, help=argparse.SUPPRESS)
    p.add_argument("--cache-state", default=None, help=argparse.SUPPRESS)
    p.add_argument("--fits", type=int, default=2, help="fits per process")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--process", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a)
    out = pathlib.Path(a.outdir)
    make_data(a.data, out / "data")
    load0 = os.getloadavg()[0]
    recs = []
    sites = a.sites or [(None, None)]
    caches = tempfile.TemporaryDirectory(prefix="whole-fit-caches-")
    for k in range(a.processes):
        for label, path in sites:
            cmd = [sys.executable, __file__, *sys.argv[1:], "--child", "--process", str(k)]
            env = dict(os.environ)
            if label is not None:
                cmd += ["--site-label", label]
                if path:
                    env["PYTHONPATH"] = os.pathsep.join(
                        [path] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
            if a.cache == "empty":
                # even processes start from new empty caches, odd ones find the previous' warm
                env.update(cache_env(os.path.join(caches.name, f"{label or 'run'}-{k // 2}")))
                cmd += ["--cache-state", "empty" if k % 2 == 0 else "warm"]
            log(f"process {k}{'' if label is None else ' (' + label + ')'}: {a.fits} fit(s) "
                f"of {a.iterations} iterations at f={a.factors}")
            res = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if res.returncode != 0:
                log(res.stderr[-4000:])
                raise SystemExit(f"process {k} failed ({res.returncode})")
            for line in res.stdout.splitlines():
                if line.startswith("RESULT "):
                    r = json.loads(line[7:])
                    recs.append(r)
                    log(f"  fit {r['fit']}: whole {r['whole_fit_s']:.3f} s, set-up "
                        f"{r['setup_s']:.3f} s ({r['setup_ns_per_rating']:.1f} ns/rating), "
                        f"first iteration {r['first_iteration_s']:.3f} s, "
                        f"{r['s_per_it']:.4f} s/it, after {r['after_s']:.3f} s")
            write(out, a, recs, load0)
    caches.cleanup()
    print(write(out, a, recs, load0))


def write(out, a, recs, load0):
    """Write the JSON and the markdown table of the fits so far (a cut run keeps them); returns
    the markdown."""
    from clmf.provenance import commit
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": commit(), "host": platform.node(), "cpu_count": os.cpu_count(),
           "sites": [list(s) for s in a.sites or ()], "cache": a.cache,
           "command": "python benchmarks/whole_fit.py " + " ".join(sys.argv[1:]),
           "load_start": load0, "load_end": os.getloadavg()[0], "fits": recs}
    (out / "whole_fit.json").write_text(json.dumps(doc, indent=1))
    head = (f"# Whole fits: {recs[0]['data']} ({recs[0]['shape'][0]} × {recs[0]['shape'][1]}, "
            f"{recs[0]['nnz']} ratings), f={a.factors}, {a.iterations} iterations\n\n"
            f"Device: {recs[0]['device']} (driver {recs[0]['driver']}); {doc['date']}; "
            f"commit {doc['commit']}; uploads: {a.upload}; load average (1 min) "
            f"{doc['load_start']:.2f} at start / {doc['load_end']:.2f} at end\n\n"
            f"Command: `{doc['command']}`\n\n")
    text = head + render(recs) + "\n" + ratios(recs) + "\n"
    profiles = [(r, r["profile"]) for r in recs if r.get("profile")]
    if profiles:
        text += "\n## Host profiles (cProfile, main thread, by cumulative time)\n"
        for r, p in profiles:
            text += (f"\n### site {r.get('site') or '–'}, process {r['process']}, fit "
                     f"{r['fit']} ({kind_of(r)})\n\n```\n" + p.strip() + "\n```\n")
    (out / "whole_fit.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
