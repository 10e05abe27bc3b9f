"""``clmf bench``: clmf against its peers and against the device's own measured limits.

One run = a list of data sets × a list of factor counts f × (the clmf devices × variants, and
the peers of :mod:`clmf.bench.peers`), all on the same train/test split, the same λ (weighted,
ALS-WR) and the same number of iterations, in one process. Before the ALS runs, each OpenCL
device's limits are *measured* in the same job (``clmf/cl_kernels/peak.cl.j2``): an FMA kernel
(independent FMA chains, vector widths 1/4/8/16, the best counts) and a float4 copy kernel, each
timed by OpenCL profiling events, median of several runs.

Figures per (data set, f, system):

* seconds per iteration: median over the iterations after the first (the first is also kept);
* per-stage device times S1 (hermitians), S2 (right-hand sides), S3 (solves), per iteration,
  from profiling events (clmf only);
* test RMSE after the fixed number of iterations (same rule for every system: unknown user or
  item → training mean), and its relative difference to the NumPy reference's;
* achieved GFLOP/s counting only useful work (:func:`useful_flops`) and effective GB/s
  (:func:`useful_bytes`), each also as a fraction of the measured peak of the device it ran on;
* device memory clmf allocated (``Engine.memory['total']``).

Output under ``results/bench/<device-slug>/`` (or ``--out``): ``<name>.csv`` (every row, peaks
included), ``<name>.md`` (tables, ratios clmf ÷ peer, bottlenecks, target check) and, when
matplotlib imports, ``<name>-time-vs-f.png`` and ``<name>-peak-fraction.png``.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import math
import os
import platform as _platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .peaks import measure_peaks, useful_bytes, useful_flops
from .peers import CPU_PEERS, GPU_PEERS, PEERS, PeerRun, Problem, rmse_of, run_peer
from .report import FIELDS, _fmt, _write_csv, make_plots, render_markdown

log = logging.getLogger(__name__)

__all__ = ["useful_flops", "useful_bytes", "measure_peaks", "load_problem", "run_clmf",
           "run_bench", "device_slug", "FIELDS", "main", "configure_parser"]

SYNTHETIC_HOLDOUT = 0.014


# ----- accounting --------------------------------------------------------------------------------
def _find_ml100k(path=None):
    cands = [path, os.environ.get("CLMF_ML100K"), ".data/ml-100k", "../shared/data/ml-100k",
             str(Path(__file__).resolve().parents[2] / ".data" / "ml-100k"),
             str(Path(__file__).resolve().parents[3] / "shared" / "data" / "ml-100k")]
    for c in cands:
        if c and os.path.exists(os.path.join(c, "ua.base")):
            return c
    return None


def load_problem(spec, scale=1.0, seed=0, ml100k=None):
    """A :class:`Problem` from a data-set spec.

    * ``ml-100k``: MovieLens 100K, official ``ua.base`` → ``ua.test`` split (``ml100k`` path, else
      ``$CLMF_ML100K``, ``.data/ml-100k``, ``../shared/data/ml-100k``);
    * ``netflix``, ``yahoomusic-r1``, ``movielens-20m`` (any :func:`clmf.data.list_presets`
      name), optionally ``@SCALE`` (else ``scale``): the synthetic generator in that shape;
    * ``synthetic:USERSxITEMSxRATINGS`` (e.g. ``synthetic:200000x10000x4450000``).

    Synthetic sets hold out 1.4 % of the ratings at random (seeded) as the test set.
    """
    from .. import data
    from ..data import splits
    s = spec.strip()
    if s.lower() in ("ml-100k", "ml100k", "movielens-100k-ua"):
        path = _find_ml100k(ml100k)
        if path is None:
            raise FileNotFoundError("MovieLens 100K not found (give --ml100k PATH or set "
                                    "CLMF_ML100K; looked in .data/ml-100k and ../shared/data/ml-100k)")
        tr, te = data.load_movielens_100k_split(path, split="ua")
        return Problem("ml-100k", *_train_test_csr(tr, te))
    spec_set = data.synthetic_from_spec(s, seed=seed)
    if spec_set is not None:
        ratings, name = spec_set
    else:
        preset, _, sc = s.partition("@")
        sc = float(sc) if sc else float(scale)
        if preset not in data.list_presets():
            raise ValueError(f"unknown data set {spec!r}: ml-100k, synthetic:UxIxN, or a preset "
                             f"({', '.join(sorted(data.list_presets()))})[@scale]")
        ratings = data.synthetic(preset, scale=sc, seed=seed)
        name = preset if sc == 1 else f"{preset}-x{sc:g}"
    tr, te = splits.random_holdout(ratings, test_fraction=SYNTHETIC_HOLDOUT, random_state=seed)
    return Problem(name, *_train_test_csr(tr, te))


def _train_test_csr(tr, te):
    shape = tr.shape
    a = sp.csr_matrix((np.asarray(tr.ratings, np.float32), (tr.users, tr.items)), shape=shape)
    b = sp.csr_matrix((np.asarray(te.ratings, np.float32), (te.users, te.items)), shape=shape)
    a.sort_indices()
    b.sort_indices()
    return a, b


# ----- clmf --------------------------------------------------------------------------------------
@dataclasses.dataclass
class ClmfRun:
    status: str = "ok"
    seconds: list = dataclasses.field(default_factory=list)
    stages: list = dataclasses.field(default_factory=list)      # per iteration {"s1","s2","s3"}
    test_rmse: float = float("nan")
    variant: str = ""
    rule: str = ""
    memory: int = 0
    note: str = ""
    factors: tuple | None = None
    setup_s: float = float("nan")       # validation, tuning lookup, engine (builds, upload)
    whole_s: float = float("nan")       # set-up + iterations + factors back on the host


def run_clmf(device, problem, f, lam, iterations, seed, variant="auto"):
    """Fit with clmf's engine (profiling on) from the reference's start; never raises."""
    from ..data.validation import check_ratings
    from ..engine.core import Engine
    from ..engine.device import device_info
    from ..errors import ClmfError
    from ..reference import start_factors
    from ..tuning import FitSpec, resolve, side_stats
    run = ClmfRun()
    eng = None
    try:
        info = device_info(device)
        t_all = time.perf_counter()       # the whole fit, as ALS.fit runs it from the CSR
        R = check_ratings(problem.train)
        m, n = R.shape
        uc, ic = problem.counts()
        stats = {"users": side_stats(uc, n), "items": side_stats(ic, m)}
        spec = FitSpec.of({"factors": f, "regularization": lam, "variant": variant})
        choices = resolve(spec, info, stats)
        cu, ci = choices["users"], choices["items"]
        run.variant = str(cu.config) if str(cu.config) == str(ci.config) else \
            f"users {cu.config} / items {ci.config}"
        run.rule = cu.rule if cu.rule == ci.rule else f"{cu.rule}/{ci.rule}"
        eng = Engine(device, R, f, (cu.config, ci.config), profile=True)
        run.memory = int(eng.memory["total"])
        X0, Y0 = start_factors(m, n, f, seed)
        eng.set_factors("users", X0)
        eng.set_factors("items", Y0)
        eng.queue.finish()
        run.setup_s = time.perf_counter() - t_all
        for _ in range(iterations):
            before = dict(eng.stage_times)
            t = time.perf_counter()
            eng.iteration(float(lam), True)
            eng.queue.finish()
            run.seconds.append(time.perf_counter() - t)
            d = {k: eng.stage_times.get(k, 0.0) - before.get(k, 0.0)
                 for k in ("s1", "s2", "s3", "combine")}
            # the long rows' combine is part of building the hermitians: counted in S1
            run.stages.append({"s1": d["s1"] + d["combine"], "s2": d["s2"], "s3": d["s3"]})
        X, Y = eng.get_factors("users"), eng.get_factors("items")
        run.whole_s = time.perf_counter() - t_all
        run.test_rmse = rmse_of(problem, X, Y)
        run.factors = (X, Y)
    except ClmfError as e:
        run.status = f"failed: {type(e).__name__}: {e}".splitlines()[0][:240]
    except Exception as e:      # a bench row, not a crash of the whole run
        run.status = f"failed: {type(e).__name__}: {e}".splitlines()[0][:240]
        log.exception("clmf run failed")
    finally:
        if eng is not None:
            eng.release()
    return run


# ----- run metadata ------------------------------------------------------------------------------
def commit():
    c = os.environ.get("CLMF_COMMIT")
    if c:
        return c
    root = Path(__file__).resolve().parents[2]
    try:
        h = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                           text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return h + ("-dirty" if dirty else "")
    except Exception:
        return "unknown"


def device_slug(info):
    """``pocl-amd-epyc``, ``intel-amd-epyc``, ``nvidia-h100-80gb-hbm3``, ..."""
    from ..engine.device import platform_short
    short = platform_short(info.platform)
    name = info.name.strip()
    name = re.sub(r"^pthread-[^-]+(-[^-]*avx[^-]*)?-", "", name, flags=re.I)   # PoCL's prefix
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if slug.startswith(short + "-"):
        slug = slug[len(short) + 1:]
    return f"{short}-{slug}"[:60].strip("-")


def _loadavg():
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return float("nan")


def _host_cpu():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ×{os.cpu_count()}"
    except OSError:
        pass
    return f"{_platform.processor() or _platform.machine()} ×{os.cpu_count()}"


# ----- the run -----------------------------------------------------------------------------------
def _median_after_first(secs):
    if not secs:
        return float("nan")
    return float(np.median(secs[1:] if len(secs) > 1 else secs))


def _figures(row, problem, f, secs_it, stages, flop_counted=True):
    """Fill the GFLOP/s and GB/s columns of a row (absolute figures; see :func:`_fractions`)."""
    uc, ic = problem.counts()
    m_act, n_act = int((uc > 0).sum()), int((ic > 0).sum())
    fl = useful_flops(m_act, n_act, problem.train.nnz, f)
    by = useful_bytes(m_act, n_act, problem.train.nnz, f, *problem.shape)
    row["useful_gflop"] = fl["total"] * 1e-9
    row["effective_gb"] = by["total"] * 1e-9
    if flop_counted and secs_it and math.isfinite(secs_it):
        row["gflops"] = fl["total"] / secs_it * 1e-9
        row["gbps"] = by["total"] / secs_it * 1e-9
    if stages:
        for k in ("s1", "s2", "s3"):
            t = row[f"{k}_s"]
            if t and t > 0:
                row[f"{k}_gflops"] = fl[k] / t * 1e-9
                row[f"{k}_gbps"] = by[k] / t * 1e-9


def _fractions(row, pk):
    """Fractions of the measured peak ``pk`` (a :func:`measure_peaks` dict, or None)."""
    row["_pk"] = pk
    if not pk:
        return
    row["peak_gflops"], row["peak_gbps"] = pk["peak_gflops"], pk["peak_gbps"]
    for pre in ("", "s1_", "s2_", "s3_"):
        g, b = row.get(f"{pre}gflops"), row.get(f"{pre}gbps")
        if isinstance(g, float):
            row[f"{pre}frac_peak_flops"] = g / pk["peak_gflops"]
        if isinstance(b, float):
            row[f"{pre}frac_peak_bw"] = b / pk["peak_gbps"]


def _peak_rows(meta, info, pk, when):
    base = dict(meta, kind="peak", platform=info.platform, device=info.name, driver=info.driver,
                status="ok", peak_gflops=pk["peak_gflops"], peak_gbps=pk["peak_gbps"])
    fma = pk["fma"][pk["fma_width"]]
    return [dict(base, system="peak-fma", gflops=pk["peak_gflops"], variant=f"float{pk['fma_width']}",
                 config_rule=when, raw_seconds=" ".join(f"{x:.6f}" for x in fma["runs_s"]),
                 note="; ".join(f"float{w}: {v['gflops']:.1f}" for w, v in pk["fma"].items())),
            dict(base, system="peak-copy", gbps=pk["peak_gbps"], variant=pk["copy"].get("kernel", ""),
                 config_rule=when, raw_seconds=" ".join(f"{x:.6f}" for x in pk["copy"]["runs_s"]),
                 note=f"{pk['copy']['bytes'] >> 20} MiB float4 buffers")]


def _peer_list(spec, device_types):
    if spec in (None, "auto"):
        names = list(GPU_PEERS) if "GPU" in device_types else list(CPU_PEERS)
    elif spec == "none":
        names = []
    else:
        names = []
        for part in spec.split(","):
            part = part.strip()
            if part == "cpu":
                names += list(CPU_PEERS)
            elif part == "gpu":
                names += list(GPU_PEERS)
            elif part == "all":
                names += list(PEERS)
            elif part:
                names.append(part)
    seen = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return seen


def run_bench(datasets=("ml-100k",), factors=(10, 50, 100), devices=("auto",), variants=("auto",),
              peers="auto", iterations=10, regularization=0.1, scale=1.0, seed=0, out=None,
              name=None, plots=True, ml100k=None, peak_repeats=7, quick_peaks=False,
              peer_max_nnz=None, argv=None, progress=print, peak_at_end=True):
    """Run the benchmark; write CSV, markdown and plots; return ``(rows, paths)``."""
    from ..engine.device import device_info, device_label, select_device
    t_run = time.perf_counter()
    devs = [select_device(d) for d in devices]
    infos = [device_info(d) for d in devs]
    when = datetime.datetime.now(datetime.timezone.utc)
    meta = {"date": when.isoformat(timespec="seconds"), "commit": commit(), "host": _host_cpu()}
    load0 = _loadavg()
    peer_names = _peer_list(peers, {i.type for i in infos})
    peer_max_nnz = dict(peer_max_nnz or {})
    out = Path(out) if out else Path("results") / "bench" / device_slug(infos[0])
    out.mkdir(parents=True, exist_ok=True)
    name = name or f"bench-{when.strftime('%Y%m%dT%H%M%SZ')}"
    rows = []

    # 1. the devices' limits (measured again at the end; the better of the two counts)
    peaks = {}
    for d, info in zip(devs, infos):
        progress(f"peak: measuring {device_label(info)} ...")
        try:
            pk = measure_peaks(d, repeats=peak_repeats, quick=quick_peaks)
            peaks[id(info)] = dict(pk)
            progress(f"peak: {pk['peak_gflops']:.1f} GFLOP/s (float{pk['fma_width']} FMA), "
                     f"{pk['peak_gbps']:.1f} GB/s copy")
            rows.extend(_peak_rows(meta, info, pk, "start"))
        except Exception as e:
            peaks[id(info)] = None
            rows.append(dict(meta, kind="peak", system="peak", platform=info.platform,
                             device=info.name, driver=info.driver,
                             status=f"failed: {type(e).__name__}: {e}".splitlines()[0][:200]))
            progress(f"peak: failed ({e})")
    cpu_peaks = [peaks[id(i)] for i in infos if peaks[id(i)] and i.type == "CPU"]
    gpu_peaks = [peaks[id(i)] for i in infos if peaks[id(i)] and i.type == "GPU"]
    host_peak = max(cpu_peaks, key=lambda p: p["peak_gflops"]) if cpu_peaks else None
    gpu_peak = gpu_peaks[0] if gpu_peaks else None

    # 2. the problems
    for spec in datasets:
        t0 = time.perf_counter()
        try:
            problem = load_problem(spec, scale=scale, seed=seed, ml100k=ml100k)
        except Exception as e:
            progress(f"data {spec}: unavailable ({e})")
            rows.append(dict(meta, dataset=spec, kind="data", system="data",
                             status=f"unavailable: {type(e).__name__}: {e}".splitlines()[0][:240]))
            continue
        m, n = problem.shape
        progress(f"data {problem.name}: {m} × {n}, {problem.train.nnz} train / {problem.test.nnz} "
                 f"test ratings ({time.perf_counter() - t0:.1f} s)")
        dbase = dict(meta, dataset=problem.name, users=m, items=n, nnz_train=problem.train.nnz,
                     nnz_test=problem.test.nnz, regularization=regularization, iterations=iterations)
        for f in factors:
            group = []
            ref_rmse = None
            # peers first: the reference's RMSE is what clmf is compared to
            for pn in peer_names:
                lim = peer_max_nnz.get(pn)
                if lim is not None and problem.train.nnz > lim:
                    pr = PeerRun(pn, status=f"skipped: {problem.train.nnz} ratings > --peer-max-nnz "
                                            f"{pn}={int(lim)}")
                else:
                    progress(f"  {problem.name} f={f} {pn} ...")
                    pr = run_peer(pn, problem, f, regularization, iterations, seed)
                row = dict(dbase, f=f, system=pr.system, kind="peer", device=pr.device,
                           status=pr.status, note=pr.note, variant="")
                if pr.ok:
                    secs = _median_after_first(pr.seconds)
                    row.update(seconds_per_iteration=secs, first_iteration_s=pr.seconds[0],
                               test_rmse=pr.test_rmse,
                               whole_fit_s=pr.whole_s if pr.whole_s is not None else "",
                               raw_seconds=" ".join(f"{x:.6f}" for x in pr.seconds))
                    pk = host_peak if pr.device.startswith("host CPU") else gpu_peak
                    if pk:
                        row["platform"] = f"(peak of {device_label(pk)})"
                    _figures(row, problem, f, secs, False,
                             flop_counted=not pr.system.startswith("implicit"))
                    _fractions(row, pk)
                    if pr.system == "reference":
                        ref_rmse = pr.test_rmse
                    progress(f"    {secs:.4f} s/it, test RMSE {_fmt(pr.test_rmse)}")
                else:
                    progress(f"    {pr.status}")
                group.append(row)
            for d, info in zip(devs, infos):
                pk = peaks.get(id(info))
                for v in variants:
                    progress(f"  {problem.name} f={f} clmf on {device_label(info)}, "
                             f"variant {v} ...")
                    cr = run_clmf(d, problem, f, regularization, iterations, seed, v)
                    row = dict(dbase, f=f, system="clmf", kind="clmf", platform=info.platform,
                               device=info.name, driver=info.driver, variant=cr.variant or v,
                               config_rule=cr.rule, status=cr.status, note=cr.note,
                               device_memory_bytes=cr.memory or "")
                    if cr.status == "ok":
                        secs = _median_after_first(cr.seconds)
                        later = cr.stages[1:] if len(cr.stages) > 1 else cr.stages
                        for k in ("s1", "s2", "s3"):
                            row[f"{k}_s"] = float(np.median([s[k] for s in later]))
                        row.update(seconds_per_iteration=secs, first_iteration_s=cr.seconds[0],
                                   test_rmse=cr.test_rmse, whole_fit_s=cr.whole_s,
                                   setup_s=cr.setup_s, setup_share=cr.setup_s / cr.whole_s,
                                   raw_seconds=" ".join(f"{x:.6f}" for x in cr.seconds))
                        _figures(row, problem, f, secs, True)
                        progress(f"    {secs:.4f} s/it (S1 {row['s1_s']:.4f} S2 {row['s2_s']:.4f} "
                                 f"S3 {row['s3_s']:.4f}), test RMSE {_fmt(cr.test_rmse)}")
                    else:
                        progress(f"    {cr.status}")
                    _fractions(row, pk)
                    group.append(row)
            for row in group:
                if ref_rmse and isinstance(row.get("test_rmse"), float) and math.isfinite(row["test_rmse"]) \
                        and row["system"] != "reference":
                    row["rmse_vs_reference"] = row["test_rmse"] / ref_rmse - 1.0
            rows.extend(group)
            _write_csv(out / f"{name}.csv", rows)      # as we go: a crash or a time-out keeps
            (out / f"{name}.md").write_text(          # what ran
                render_markdown(rows, meta, infos, peaks, argv=argv,
                                elapsed=time.perf_counter() - t_run, load=(load0, _loadavg()))
                + "\n(run in progress: written after each data set and f)\n")
    if peak_at_end:
        for d, info in zip(devs, infos):
            pk0 = peaks.get(id(info))
            if not pk0:
                continue
            progress(f"peak: measuring {device_label(info)} again ...")
            try:
                pk = measure_peaks(d, repeats=peak_repeats, quick=quick_peaks)
            except Exception as e:
                progress(f"peak: failed ({e})")
                continue
            rows.extend(_peak_rows(meta, info, pk, "end"))
            for key in ("peak_gflops", "peak_gbps"):      # in place: rows hold this dict
                pk0[key] = max(pk0[key], pk[key])
        for r in rows:
            if "_pk" in r:
                _fractions(r, r["_pk"])
    paths = {"csv": out / f"{name}.csv"}
    _write_csv(paths["csv"], rows)
    md = render_markdown(rows, meta, infos, peaks, argv=argv, elapsed=time.perf_counter() - t_run,
                         load=(load0, _loadavg()))
    if plots:
        try:
            paths.update(make_plots(rows, out, name))
        except ImportError as e:
            md += f"\n(plots not drawn: {e})\n"
    md += "".join(f"\n![{k}]({p.name})\n" for k, p in paths.items() if k != "csv")
    paths["md"] = out / f"{name}.md"
    paths["md"].write_text(md)
    return rows, paths


def configure_parser(p):
    """Arguments of ``clmf bench`` (used by :mod:`clmf.cli`)."""
    p.add_argument("--data", action="append", default=None, metavar="SPEC",
                   help="data set (repeatable): ml-100k | netflix | yahoomusic-r1 | movielens-20m "
                        "(synthetic, [@SCALE]) | synthetic:USERSxITEMSxRATINGS; default ml-100k")
    from ..argtypes import positive_float, positive_int
    p.add_argument("--scale", type=positive_float, default=1.0,
                   help="scale of the synthetic presets")
    p.add_argument("--factors", "-f", type=positive_int, nargs="+", default=[10, 50, 100])
    p.add_argument("--iterations", "-i", type=int, default=10)
    p.add_argument("--regularization", "--lambda", dest="regularization", type=float, default=0.1,
                   help="λ, weighted by the row's rating count (ALS-WR) for every system")
    p.add_argument("--device", "-d", action="append", default=None,
                   help="clmf device (repeatable): auto | cpu | gpu | P:D | name substring")
    p.add_argument("--variant", action="append", default=None,
                   help="clmf kernel variant (repeatable, compared side by side); default auto")
    p.add_argument("--peers", default="auto",
                   help="comma list of " + ", ".join(PEERS) + ", or cpu | gpu | all | none; "
                        "auto: the CPU peers for CPU devices, pytorch for a GPU")
    p.add_argument("--peer-max-nnz", action="append", default=[], metavar="PEER=N",
                   help="skip PEER (reported as skipped) on data sets with more than N ratings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ml100k", default=None, help="path of the ml-100k folder")
    p.add_argument("--out", default=None, help="output folder (default results/bench/<device-slug>)")
    p.add_argument("--name", default=None, help="file stem of the outputs (default bench-<UTC time>)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--peak-repeats", type=positive_int, default=7)
    p.add_argument("--scaling", default=None, metavar="DEVICES",
                   help="instead of the peers: time each data set and f on the first 1..N of "
                        "DEVICES (gpu:all, cpu:all or a comma list) and write a scaling table "
                        "(devices × s/it × speedup × exchange share)")
    return p


def cmd_bench(args, argv=None):
    if args.scaling:
        from ..parallel.scaling import cmd_scaling
        return cmd_scaling(args, lambda spec: load_problem(spec, args.scale, args.seed,
                                                           args.ml100k).train, argv)
    lim = {}
    for item in args.peer_max_nnz:
        k, _, v = item.partition("=")
        if not v:
            raise ValueError(f"--peer-max-nnz wants PEER=N, not {item!r}")
        lim[k.strip()] = float(v)
    if args.iterations < 1:
        raise ValueError("--iterations must be ≥ 1")
    rows, paths = run_bench(
        datasets=args.data or ["ml-100k"], factors=args.factors, devices=args.device or ["auto"],
        variants=args.variant or ["auto"], peers=args.peers, iterations=args.iterations,
        regularization=args.regularization, scale=args.scale, seed=args.seed, out=args.out,
        name=args.name, plots=not args.no_plots, ml100k=args.ml100k, peak_repeats=args.peak_repeats,
        peer_max_nnz=lim, argv=argv)
    args.bench_rows, args.bench_files = rows, paths       # for `clmf bench --json`
    print("\n".join(f"wrote {p}" for p in paths.values()))
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = configure_parser(argparse.ArgumentParser(prog="clmf bench", description=__doc__,
                                                 formatter_class=argparse.RawDescriptionHelpFormatter))
    return cmd_bench(p.parse_args(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
