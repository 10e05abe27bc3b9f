"""``clmf bench``: clmf against its peers and against the device's own measured limits.

One run = a list of data sets × a list of factor counts f × (the clmf devices × variants, and
the peers of :mod:`clmf.bench_peers`), all on the same train/test split, the same λ (weighted,
ALS-WR) and the same number of iterations, in one process. Before the ALS runs, each OpenCL
device's limits are *measured* in the same job (``cl_kernels/peak.cl.j2``): an FMA kernel
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
import csv
import dataclasses
import datetime
import logging
import math
import os
import platform as _platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .bench_peers import CPU_PEERS, GPU_PEERS, PEERS, PeerRun, Problem, rmse_of, run_peer

log = logging.getLogger(__name__)

__all__ = ["useful_flops", "useful_bytes", "measure_peaks", "load_problem", "run_clmf",
           "run_bench", "device_slug", "FIELDS", "main", "configure_parser"]

SYNTHETIC_HOLDOUT = 0.014

FIELDS = [
    "date", "commit", "host", "dataset", "users", "items", "nnz_train", "nnz_test", "f",
    "regularization", "iterations", "system", "kind", "platform", "device", "driver", "variant",
    "config_rule", "status", "seconds_per_iteration", "first_iteration_s", "s1_s", "s2_s", "s3_s",
    "test_rmse", "rmse_vs_reference", "useful_gflop", "gflops", "frac_peak_flops",
    "effective_gb", "gbps", "frac_peak_bw",
    "s1_gflops", "s1_frac_peak_flops", "s1_gbps", "s1_frac_peak_bw",
    "s2_gflops", "s2_frac_peak_flops", "s2_gbps", "s2_frac_peak_bw",
    "s3_gflops", "s3_frac_peak_flops", "s3_gbps", "s3_frac_peak_bw",
    "device_memory_bytes", "peak_gflops", "peak_gbps", "raw_seconds", "note",
]


# ----- accounting --------------------------------------------------------------------------------
def useful_flops(m, n, nnz, f):
    """Useful floating-point operations of one ALS iteration (both half-steps).

    ``m``, ``n``: rows solved on the users / items side (rows with at least one rating);
    ``nnz``: ratings. Counted, as the performance issue asks, only what the maths needs:

    * S1, the hermitians' lower triangles: ``nnz·f·(f+1)`` per side (f(f+1)/2 multiply-adds per
      rating), so ``2·nnz·f·(f+1)`` — a kernel computing the full Gram gets no credit for it;
    * S2, the right-hand sides: ``2·nnz·f`` per side, ``4·nnz·f``;
    * S3, the Cholesky factorisations: ``(m+n)·f³/3`` (the triangular solves are not counted).

    Returns a dict with ``s1``, ``s2``, ``s3`` and ``total`` (floats).

    >>> useful_flops(2, 3, 4, 2)["total"]
    93.33333333333333
    """
    s1 = 2.0 * nnz * f * (f + 1)
    s2 = 4.0 * nnz * f
    s3 = (m + n) * f ** 3 / 3.0
    return {"s1": s1, "s2": s2, "s3": s3, "total": s1 + s2 + s3}


def useful_bytes(m, n, nnz, f, rows_users=None, rows_items=None):
    """Bytes a stage must move at least (4-byte floats and indices, 8-byte row pointers).

    Per side with ``r`` rows (``rows_*``, default ``m``/``n``), ``s`` rows solved and ``z = nnz``:

    * S1: row pointers ``8(r+1)`` + column indices ``4z`` + gathered factors ``4fz`` + the
      hermitians' triangles written ``4s·f(f+1)/2``;
    * S2: ``8(r+1)`` + indices and ratings ``8z`` + gathered factors ``4fz`` + ``b`` written ``4sf``;
    * S3: triangles and ``b`` read, factors written: ``4s·f(f+1)/2 + 8sf``;
    * the iteration, as one fused pass would need it: ``8(r+1) + 8z + 4fz + 4sf`` per side
      (CSR read once, each rating's factor row gathered once, the new factors written).

    Gathers are counted at full cost although caches may serve them, so on a CPU the "effective"
    GB/s can exceed the copy bandwidth. Returns a dict ``s1``, ``s2``, ``s3``, ``total``.

    >>> useful_bytes(2, 3, 4, 2)["total"]
    224.0
    """
    ru = m if rows_users is None else rows_users
    ri = n if rows_items is None else rows_items
    tri = f * (f + 1) / 2.0
    s1 = s2 = s3 = tot = 0.0
    for r, s in ((ru, m), (ri, n)):
        s1 += 8 * (r + 1) + 4 * nnz + 4 * f * nnz + 4 * s * tri
        s2 += 8 * (r + 1) + 8 * nnz + 4 * f * nnz + 4 * s * f
        s3 += 4 * s * tri + 8 * s * f
        tot += 8 * (r + 1) + 8 * nnz + 4 * f * nnz + 4 * s * f
    return {"s1": s1, "s2": s2, "s3": s3, "total": tot}


# ----- the device's limits -----------------------------------------------------------------------
def _median_event_seconds(launch, repeats):
    out = []
    for _ in range(repeats):
        ev = launch()
        ev.wait()
        out.append((ev.profile.end - ev.profile.start) * 1e-9)
    return float(np.median(out)), out


def measure_peaks(device, repeats=7, quick=False, widths=(1, 4, 8, 16), chains=8, unroll=8):
    """Measured fp32 FMA throughput (GFLOP/s) and copy bandwidth (GB/s) of an OpenCL device.

    FMA: for each vector width, a calibration launch sets the loop count so one launch takes
    about 50 ms (GPU) / 150 ms (CPU) (5 ms with ``quick``); the median of ``repeats`` launches
    counts; the best width is the peak. Copy: ``dst[i] = src[i]`` over float4 buffers of
    min(512 MiB, max_alloc/4) (GPU) / 256 MiB (CPU) (16 MiB with ``quick``), 2 bytes moved per
    byte copied. Returns a dict.
    """
    import pyopencl as cl
    from . import kernels as K
    from .device import device_info, get_context
    info = device_info(device)
    ctx, queue = get_context(device)
    gpu = info.type == "GPU"
    target = 0.005 if quick else (0.05 if gpu else 0.15)
    local = max(1, min(256 if gpu else 64, info.max_work_group_size))
    groups = info.compute_units * (16 if gpu else 4)
    gsize = groups * local
    out_buf = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, size=4 * gsize)
    res = {"device": info.name, "platform": info.platform, "driver": info.driver,
           "type": info.type, "fma": {}}
    best = (0.0, None)
    for w in widths:
        src = K.render("peak.cl.j2", width=w, chains=chains, unroll=unroll)
        prog = K.build(ctx, src, options=())
        kern = prog.kernels["fma_peak"]

        def launch(iters):
            return kern(queue, (gsize,), (local,), out_buf, np.float32(0.9999), np.float32(1e-4),
                        np.int32(iters))
        iters = 16
        for _ in range(12):                        # calibrate the loop count
            t, _x = _median_event_seconds(lambda: launch(iters), 1)
            if t >= target / 4 or iters >= 1 << 24:
                break
            iters *= 4
        iters = max(1, int(iters * target / max(t, 1e-6)))
        launch(iters).wait()                       # warm
        med, runs = _median_event_seconds(lambda: launch(iters), repeats)
        flop = 2.0 * w * chains * unroll * iters * gsize
        g = flop / med * 1e-9
        res["fma"][w] = {"gflops": g, "iters": iters, "runs_s": runs}
        if g > best[0]:
            best = (g, w)
    res["peak_gflops"], res["fma_width"] = best
    # copy
    if quick:
        size = 16 << 20
    elif gpu:
        size = min(512 << 20, info.max_alloc // 4)
    else:
        size = min(256 << 20, info.max_alloc // 4)
    size -= size % (16 * local)
    n4 = size // 16
    a = cl.Buffer(ctx, cl.mem_flags.READ_ONLY, size=size)
    b = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, size=size)
    cl.enqueue_fill_buffer(queue, a, np.float32(1.0), 0, size).wait()
    cl.enqueue_fill_buffer(queue, b, np.float32(0.0), 0, size).wait()
    prog = K.build(ctx, K.render("peak.cl.j2", width=1, chains=1, unroll=1), options=())
    ck = prog.kernels["copy_peak"]
    fk = prog.kernels["copy_peak_flat"]
    cg = min(n4, (info.compute_units * 2048) if gpu else info.compute_units * local * 64)
    cg -= cg % local
    cg = max(local, cg)
    launches = {"grid-stride": lambda: ck(queue, (cg,), (local,), a, b, np.int64(n4)),
                "flat": lambda: fk(queue, (n4,), (local,), a, b)}
    med, runs, how = float("inf"), [], ""
    for kname, copy in launches.items():       # the better of the two kernels counts
        copy().wait()
        m_, r_ = _median_event_seconds(copy, repeats)
        if m_ < med:
            med, runs, how = m_, r_, kname
    res["peak_gbps"] = 2.0 * size / med * 1e-9
    res["copy"] = {"bytes": size, "runs_s": runs, "kernel": how}
    for buf in (a, b, out_buf):
        buf.release()
    return res


# ----- data --------------------------------------------------------------------------------------
def _find_ml100k(path=None):
    cands = [path, os.environ.get("CLMF_ML100K"), ".data/ml-100k", "../shared/data/ml-100k",
             str(Path(__file__).resolve().parents[1] / ".data" / "ml-100k"),
             str(Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-100k")]
    for c in cands:
        if c and os.path.exists(os.path.join(c, "ua.base")):
            return c
    return None


def load_problem(spec, scale=1.0, seed=0, ml100k=None):
    """A :class:`Problem` from a data-set spec.

    * ``ml-100k``: MovieLens 100K, official ``ua.base`` → ``ua.test`` split (``ml100k`` path, else
      ``$CLMF_ML100K``, ``.data/ml-100k``, ``../shared/data/ml-100k``);
    * ``netflix``, ``yahoomusic-r1``, ``movielens-20m`` (any :func:`clmf.datasets.list_presets`
      name), optionally ``@SCALE`` (else ``scale``): the synthetic generator in that shape;
    * ``synthetic:USERSxITEMSxRATINGS`` (e.g. ``synthetic:200000x10000x4450000``).

    Synthetic sets hold out 1.4 % of the ratings at random (seeded) as the test set.
    """
    from . import datasets, splits
    s = spec.strip()
    if s.lower() in ("ml-100k", "ml100k", "movielens-100k-ua"):
        path = _find_ml100k(ml100k)
        if path is None:
            raise FileNotFoundError("MovieLens 100K not found (give --ml100k PATH or set "
                                    "CLMF_ML100K; looked in .data/ml-100k and ../shared/data/ml-100k)")
        tr, te = datasets.load_movielens_100k_split(path, split="ua")
        return Problem("ml-100k", *_train_test_csr(tr, te))
    spec_set = datasets.synthetic_from_spec(s, seed=seed)
    if spec_set is not None:
        data, name = spec_set
    else:
        preset, _, sc = s.partition("@")
        sc = float(sc) if sc else float(scale)
        if preset not in datasets.list_presets():
            raise ValueError(f"unknown data set {spec!r}: ml-100k, synthetic:UxIxN, or a preset "
                             f"({', '.join(sorted(datasets.list_presets()))})[@scale]")
        data = datasets.synthetic(preset, scale=sc, seed=seed)
        name = preset if sc == 1 else f"{preset}-x{sc:g}"
    tr, te = splits.random_holdout(data, test_fraction=SYNTHETIC_HOLDOUT, random_state=seed)
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


def run_clmf(device, problem, f, lam, iterations, seed, variant="auto"):
    """Fit with clmf's engine (profiling on) from the reference's start; never raises."""
    from .device import device_info
    from .engine import Engine
    from .errors import ClmfError
    from .model import ALS, _side_stats
    from .reference import start_factors
    from .validation import check_ratings
    run = ClmfRun()
    eng = None
    try:
        info = device_info(device)
        R = getattr(problem, "_canonical", None)
        if R is None:                 # validated once per problem (seconds at 99M ratings)
            R = problem._canonical = check_ratings(problem.train)
        m, n = R.shape
        uc, ic = problem.counts()
        stats = {"users": _side_stats(uc, n), "items": _side_stats(ic, m)}
        model = ALS(factors=f, regularization=lam, iterations=iterations, variant=variant,
                    device=device)
        choices = model._resolve_configs(info, stats)
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
        for _ in range(iterations):
            before = dict(eng.stage_times)
            t = time.perf_counter()
            eng.iteration(float(lam), True)
            eng.queue.finish()
            run.seconds.append(time.perf_counter() - t)
            run.stages.append({k: eng.stage_times[k] - before[k] for k in ("s1", "s2", "s3")})
        X, Y = eng.get_factors("users"), eng.get_factors("items")
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
    root = Path(__file__).resolve().parents[1]
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
    plat = info.platform.lower()
    short = ("pocl" if "portable" in plat else "intel" if "intel" in plat else
             "nvidia" if "nvidia" in plat else "amd" if ("amd" in plat or "rocm" in plat) else
             re.sub(r"[^a-z0-9]+", "", plat)[:10] or "ocl")
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
def _fmt(x, nd=4):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    if isinstance(x, float):
        return f"{x:.{nd}g}" if abs(x) < 1e-3 or abs(x) >= 1e5 else f"{x:.{nd}f}".rstrip("0").rstrip(".")
    return str(x)


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
    from .device import device_info, select_device
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
        progress(f"peak: measuring {info.platform} | {info.name} ...")
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
                               raw_seconds=" ".join(f"{x:.6f}" for x in pr.seconds))
                    pk = host_peak if pr.device.startswith("host CPU") else gpu_peak
                    if pk:
                        row["platform"] = f"(peak of {pk['platform']} | {pk['device']})"
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
                    progress(f"  {problem.name} f={f} clmf on {info.platform} | {info.name}, "
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
                                   test_rmse=cr.test_rmse,
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
            progress(f"peak: measuring {info.platform} | {info.name} again ...")
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


def _write_csv(path, rows):
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else
                            "" if isinstance(v, float) else v) for k, v in r.items()})
    os.replace(tmp, path)


# ----- report ------------------------------------------------------------------------------------
def _pct(x):
    return "" if x is None or x == "" or not math.isfinite(x) else f"{100 * x:.1f}%"


def _sys_label(r):
    if r["kind"] == "clmf":
        plat = r.get("platform", "")
        short = "PoCL" if "Portable" in plat else "Intel" if "Intel" in plat else \
            "NVIDIA" if "NVIDIA" in plat else plat
        v = r.get("variant", "")
        return f"clmf {short} `{v}`" if v else f"clmf {short}"
    return r["system"]


# Targets of the performance issue (s / iteration), checked where the data match.
GPU_TARGETS = {10: 0.02, 50: 0.06, 100: 0.12}


def render_markdown(rows, meta, infos, peaks, argv=None, elapsed=None, load=None):
    L = []
    devs = "; ".join(f"{i.platform} | {i.name} (driver {i.driver})" for i in infos)
    L.append(f"# clmf bench — {devs}\n")
    L.append(f"- date: {meta['date']}  \n- commit: {meta['commit']}  \n- host: {meta['host']}  ")
    if argv is not None:
        L.append(f"- command: `clmf bench {' '.join(shlex.quote(a) for a in argv)}`  ")
    if elapsed is not None:
        L.append(f"- run took {elapsed:.0f} s  ")
    if load is not None:
        L.append(f"- host load average (1 min) at start / end: {load[0]:.2f} / {load[1]:.2f} on "
                 f"{os.cpu_count()} CPUs (other work on the machine slows the CPU figures)  ")
    L.append("- s/it: median over the iterations after the first; GFLOP/s count useful work only "
             "(2·nnz·f(f+1) + 4·nnz·f + (m+n)f³/3 per iteration); GB/s: minimal traffic of a fused "
             "iteration (CSR once, one gather per rating, factors written); % of the *measured* peak "
             "of the device it ran on (CPU peers: the host CPU's peak as measured through OpenCL). "
             "Ratios are clmf ÷ peer in s/it: below 1, clmf is faster.\n")
    L.append("## Measured device limits\n")
    L.append("| device | when | FMA GFLOP/s (best width) | per width | copy GB/s (kernel) |")
    L.append("|---|---|---|---|---|")
    for r in rows:
        if r["kind"] == "peak" and r["system"] == "peak-fma":
            cp = next((x for x in rows if x["kind"] == "peak" and x["system"] == "peak-copy"
                       and x["device"] == r["device"] and x["platform"] == r["platform"]
                       and x.get("config_rule") == r.get("config_rule")), {})
            L.append(f"| {r['platform']} \\| {r['device']} | {r.get('config_rule', '')} | "
                     f"{r['gflops']:.1f} ({r['variant']}) | {r['note']} | "
                     f"{_fmt(cp.get('gbps'), 4)} ({cp.get('variant', '')}) |")
        elif r["kind"] == "peak" and r["system"] == "peak":
            L.append(f"| {r['platform']} \\| {r['device']} | | {r['status']} | | |")
    for info in infos:
        pk = peaks.get(id(info))
        if pk:
            L.append(f"| {info.platform} \\| {info.name} | **used** (best of the runs) | "
                     f"**{pk['peak_gflops']:.1f}** | | **{pk['peak_gbps']:.1f}** |")
    L.append("")
    groups = {}
    for r in rows:
        if r["kind"] in ("clmf", "peer"):
            groups.setdefault((r["dataset"], r["f"]), []).append(r)
        elif r["kind"] == "data":
            L.append(f"- data set `{r['dataset']}`: {r['status']}")
    for (ds, f), g in groups.items():
        r0 = g[0]
        L.append(f"## {ds}, f = {f}\n")
        L.append(f"{r0['users']} × {r0['items']}, {r0['nnz_train']} train / {r0['nnz_test']} test "
                 f"ratings, λ = {r0['regularization']} (weighted), {r0['iterations']} iterations.\n")
        L.append("| system | status | s/it | 1st it | S1 s | S2 s | S3 s | test RMSE | vs ref | GFLOP/s | "
                 "% peak | GB/s | % BW | S1 % peak | memory MiB |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in g:
            mem = r.get("device_memory_bytes")
            L.append("| " + " | ".join([
                _sys_label(r), r["status"], _fmt(r.get("seconds_per_iteration")),
                _fmt(r.get("first_iteration_s")), _fmt(r.get("s1_s")), _fmt(r.get("s2_s")),
                _fmt(r.get("s3_s")), _fmt(r.get("test_rmse")),
                _pct(r.get("rmse_vs_reference")) if r.get("rmse_vs_reference") not in (None, "") else "",
                _fmt(r.get("gflops"), 3), _pct(r.get("frac_peak_flops")), _fmt(r.get("gbps"), 3),
                _pct(r.get("frac_peak_bw")), _pct(r.get("s1_frac_peak_flops")),
                f"{mem / 2**20:.1f}" if isinstance(mem, int) and mem else ""]) + " |")
        notes = [f"{r['system']}: {r['note']}" for r in g if r.get("note") and r["kind"] == "peer"]
        if notes:
            L.append("\n" + "  \n".join(notes))
        peers_ok = [r for r in g if r["kind"] == "peer" and r["status"] == "ok"]
        clmfs = [r for r in g if r["kind"] == "clmf" and r["status"] == "ok"]
        if clmfs and peers_ok:
            L.append("\n**Ratios clmf ÷ peer (s/it)**\n")
            L.append("| clmf | " + " | ".join(p["system"] for p in peers_ok) + " |")
            L.append("|---|" + "---|" * len(peers_ok))
            for c in clmfs:
                L.append(f"| {_sys_label(c)} | " + " | ".join(
                    f"{c['seconds_per_iteration'] / p['seconds_per_iteration']:.3f}"
                    for p in peers_ok) + " |")
        for c in clmfs:
            st = {k: c.get(f"{k}_s") or 0.0 for k in ("s1", "s2", "s3")}
            tot = sum(st.values())
            if tot <= 0:
                continue
            k = max(st, key=st.get)
            share = st[k] / c["seconds_per_iteration"]
            dev_total = tot / c["seconds_per_iteration"]
            what = {"s1": "hermitians", "s2": "right-hand sides", "s3": "solves"}[k]
            L.append(f"\n- bottleneck of {_sys_label(c)}: {k.upper()} ({what}) {share:.0%} of the "
                     f"iteration at {_pct(c.get(f'{k}_frac_peak_flops'))} of FMA peak / "
                     f"{_pct(c.get(f'{k}_frac_peak_bw'))} of copy bandwidth; kernels {dev_total:.0%} "
                     f"of the wall time (the rest: launches, host waits)")
        # targets
        lk = next((p for p in peers_ok if p["system"] == "lenskit"), None)
        for c in clmfs:
            if lk is not None and f >= 50:
                ratio = c["seconds_per_iteration"] / lk["seconds_per_iteration"]
                verdict = "met" if ratio <= 0.5 else f"missed by {ratio / 0.5:.2f}×"
                L.append(f"- target ≥ 2× faster than LensKit ({_sys_label(c)}): "
                         f"{1 / ratio:.2f}× → {verdict}")
            if "GPU" in c.get("platform", "") or "NVIDIA" in c.get("platform", ""):
                if ds == "netflix" and f in GPU_TARGETS:
                    tgt = GPU_TARGETS[f]
                    s = c["seconds_per_iteration"]
                    verdict = "met" if s <= tgt else f"missed by {s / tgt:.1f}×"
                    L.append(f"- target ≤ {tgt} s/it on the full Netflix shape ({_sys_label(c)}): "
                             f"{s:.3f} s → {verdict}")
        L.append("")
    return "\n".join(L) + "\n"


def make_plots(rows, out, name):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = {}
    ok = [r for r in rows if r["kind"] in ("clmf", "peer") and r["status"] == "ok"
          and isinstance(r.get("seconds_per_iteration"), float)]
    dsets = list(dict.fromkeys(r["dataset"] for r in ok))
    if ok:
        fig, axes = plt.subplots(1, len(dsets), figsize=(5.5 * len(dsets), 4.2), squeeze=False)
        for ax, ds in zip(axes[0], dsets):
            systems = {}
            for r in ok:
                if r["dataset"] == ds:
                    systems.setdefault(_sys_label(r).replace("`", ""), []).append(
                        (r["f"], r["seconds_per_iteration"]))
            for lab, pts in systems.items():
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        linestyle="-" if lab.startswith("clmf") else "--", label=lab[:48])
            ax.set_yscale("log")
            ax.set_xlabel("f")
            ax.set_ylabel("s / iteration")
            ax.set_title(ds)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        p = out / f"{name}-time-vs-f.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths["time-vs-f"] = p
    cl_rows = [r for r in ok if r["kind"] == "clmf" and r.get("frac_peak_flops") not in (None, "")]
    if cl_rows:
        labels = [f"{r['dataset']} f={r['f']}\n{_sys_label(r).replace('`', '')[:40]}" for r in cl_rows]
        keys = [("s1_frac_peak_flops", "S1 of FMA peak"), ("s3_frac_peak_flops", "S3 of FMA peak"),
                ("frac_peak_flops", "iteration of FMA peak"), ("s2_frac_peak_bw", "S2 of copy BW"),
                ("frac_peak_bw", "iteration of copy BW")]
        fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cl_rows) + 2), 4.8))
        x = np.arange(len(cl_rows))
        wdt = 0.8 / len(keys)
        for j, (k, lab) in enumerate(keys):
            vals = [float(r.get(k) or 0.0) for r in cl_rows]
            ax.bar(x + (j - len(keys) / 2 + 0.5) * wdt, vals, wdt, label=lab)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=6, rotation=60, ha="right")
        ax.set_ylabel("fraction of measured peak")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        p = out / f"{name}-peak-fraction.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths["peak-fraction"] = p
    return paths


# ----- command line ------------------------------------------------------------------------------
def configure_parser(p):
    """Arguments of ``clmf bench`` (used by :mod:`clmf.cli`)."""
    p.add_argument("--data", action="append", default=None, metavar="SPEC",
                   help="data set (repeatable): ml-100k | netflix | yahoomusic-r1 | movielens-20m "
                        "(synthetic, [@SCALE]) | synthetic:USERSxITEMSxRATINGS; default ml-100k")
    p.add_argument("--scale", type=float, default=1.0, help="scale of the synthetic presets")
    p.add_argument("--factors", "-f", type=int, nargs="+", default=[10, 50, 100])
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
    p.add_argument("--peak-repeats", type=int, default=7)
    return p


def cmd_bench(args, argv=None):
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
