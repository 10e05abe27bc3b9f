"""Top-k inference benchmark (issue 17): clmf's device top-k against its peers, one run.

CPU mode (default), on this machine's OpenCL CPU devices (PoCL, Intel):
  * recommend for USERS users × ITEMS items at f, seen items filtered, top-N, through the model
    API (``model.recommend(users, R)`` and ``model.recommend_all``), against ``implicit``'s CPU
    ``recommend`` on the same factors, and clmf's host NumPy path; top-N agreement checked;
  * similar_items for every item of ml-latest-small (a model fitted here), clmf device / host
    against implicit's ``similar_items`` on the same factors.
GPU mode (``--gpu``), on the first OpenCL GPU:
  * a short search of the top-k geometries (``clmf.autotune.topk``; record written to OUTDIR),
    then all 480,189 Netflix-shaped users × 17,770 items at f = 100, seen items filtered,
    top-10: factors and the seen CSR resident, timed wall-clock and by the kernels' profiling
    events; the model API's ``recommend_all`` end to end; a PyTorch ``topk`` peer (GEMM per 64K
    users, a mask, ``topk``) and FAISS GPU exact inner-product search (unfiltered) when importable.

Writes ``OUTDIR/bench_topk_{cpu,gpu}.json`` and ``.md``. Factors are random normal (×0.1),
the seen items popularity-skewed (``clmf.autotune.topk.synthetic_problem``); every peer ranks
the same arrays.

    python benchmarks/bench_topk.py results/bench/topk-cpu
    python benchmarks/bench_topk.py OUTDIR --gpu
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import pathlib
import platform
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]

log = logging.getLogger("bench_topk")


def _now():
    """UTC now, ISO 8601."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _commit():
    """The clmf source commit (provenance)."""
    try:
        from clmf.provenance import commit
        return commit()
    except Exception:
        return "?"


def agreement(a, b):
    """Mean fraction of shared items between two (users, k) id lists (padding ignored)."""
    tot = 0.0
    for x, y in zip(a, b):
        sx, sy = set(x[x >= 0].tolist()), set(y[y >= 0].tolist())
        tot += len(sx & sy) / max(1, max(len(sx), len(sy)))
    return tot / max(1, len(a))


def make_model(X, Y, device):
    """A clmf ALS holding the given factors (no fit)."""
    import clmf
    m = clmf.ALS(factors=X.shape[1], device=device)
    m.user_factors_, m.item_factors_ = X, Y
    m.user_counts_ = np.ones(X.shape[0], np.int64)
    m.item_counts_ = np.ones(Y.shape[0], np.int64)
    m.global_mean_ = 0.0
    m.user_ids_ = m.item_ids_ = None
    return m


def timed(fn, reps=1):
    """(best seconds, last result) over ``reps`` runs."""
    best, out = float("inf"), None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


# ----- CPU ---------------------------------------------------------------------------------------
def cpu_devices():
    """The OpenCL CPU devices (Oclgrind left out)."""
    import pyopencl as cl
    out = []
    for p in cl.get_platforms():
        if "oclgrind" in p.name.lower():
            continue
        for d in p.get_devices():
            if d.type & cl.device_type.CPU:
                out.append(d)
    return out


def dev_name(d):
    """``platform | device`` of a pyopencl device."""
    from clmf.engine.device import device_label
    return device_label(d)


def bench_recommend_cpu(a, res):
    """Top-N for every synthetic user: implicit, clmf per CPU device, clmf host."""
    from clmf.autotune.topk import synthetic_problem
    from clmf.inference.topk import inference_options
    X, Y, R = synthetic_problem(a.users, a.items, a.f, a.seen, seed=0)
    users = np.arange(a.users)
    out = res["recommend"] = {"users": a.users, "items": a.items, "f": a.f, "N": a.N,
                              "seen_nnz": int(R.nnz), "runs": []}
    ref = None
    if not a.skip_implicit:
        try:
            from implicit.cpu.als import AlternatingLeastSquares
            im = AlternatingLeastSquares(factors=a.f)
            im.user_factors, im.item_factors = X, Y
            im.recommend(users[:1000], R[:1000], N=a.N)                  # warm-up
            t, (iids, _) = timed(lambda: im.recommend(users, R, N=a.N))
            out["runs"].append({"engine": "implicit (CPU)", "seconds": t,
                                "users_per_s": a.users / t})
            ref = iids
            log.info("implicit: %.2f s (%.0f users/s)", t, a.users / t)
        except ImportError as e:
            out["implicit_error"] = str(e)
    for d in cpu_devices():
        m = make_model(X, Y, d)
        with inference_options(device=d):
            m.recommend(users[:2048], R[:2048], N=a.N)                   # build, calibrate
            dtk = m.__dict__.get("_topk_cache", {}).get("items", (None, None))[1]
            t, (ids, sc) = timed(lambda: m.recommend(users, R, N=a.N))
            t_all, (ids2, _) = timed(lambda: m.recommend_all(a.N, R))
        run = {"engine": f"clmf device top-k ({dev_name(d)})", "seconds": t,
               "users_per_s": a.users / t, "recommend_all_seconds": t_all,
               "config": str(dtk.config) if dtk else "host path",
               "config_origin": dtk.config_origin if dtk else None,
               "host_threshold_madds": dtk.host_threshold() if dtk else None,
               "same_as_recommend_all": bool(np.array_equal(ids, ids2))}
        if ref is not None:
            run["agreement_with_implicit"] = agreement(ids, ref)
            run["speedup_vs_implicit"] = out["runs"][0]["seconds"] / t
        out["runs"].append(run)
        log.info("%s", run)
    if not a.skip_host:
        m = make_model(X, Y, "cpu")
        with inference_options(enabled=False):
            t, (hids, _) = timed(lambda: m.recommend(users, R, N=a.N))
        run = {"engine": "clmf host (NumPy)", "seconds": t, "users_per_s": a.users / t}
        if ref is not None:
            run["agreement_with_implicit"] = agreement(hids, ref)
        out["runs"].append(run)
        log.info("%s", run)


def bench_similar_cpu(a, res):
    """similar_items of every ml-latest-small item: implicit, clmf per CPU device, host."""
    import clmf
    from clmf.inference.topk import inference_options
    path = REPO.parent / "shared" / "data" / "ml-latest-small" / "ratings.csv"
    if not path.exists():
        res["similar_items"] = {"skipped": f"{path} missing"}
        return
    data = clmf.data.load(str(path))
    model = clmf.ALS(factors=a.sim_f, iterations=5, random_state=0).fit(data, show_progress=False)
    Y = model.item_factors_
    items = np.arange(Y.shape[0])
    out = res["similar_items"] = {"data": "ml-latest-small", "items": int(Y.shape[0]),
                                  "f": a.sim_f, "N": a.N, "runs": []}
    ref = None
    if not a.skip_implicit:
        try:
            from implicit.cpu.als import AlternatingLeastSquares
            im = AlternatingLeastSquares(factors=a.sim_f)
            im.user_factors, im.item_factors = model.user_factors_, Y
            im.similar_items(items[:100], N=a.N)
            t, (ref, _) = timed(lambda: im.similar_items(items, N=a.N), reps=3)
            out["runs"].append({"engine": "implicit (CPU)", "seconds": t})
        except ImportError as e:
            out["implicit_error"] = str(e)
    for d in cpu_devices():
        with inference_options(device=d):
            model.similar_items(items[:100], N=a.N)
            model.similar_items(items, N=a.N)                   # build, calibrate
            t, (ids, _) = timed(lambda: model.similar_items(items, N=a.N), reps=3)
        dtk = model.__dict__.get("_topk_cache", {}).get("items_cosine", (None, None))[1]
        run = {"engine": f"clmf ({dev_name(d)})", "seconds": t,
               "device_path": bool(dtk is not None and dtk.host_threshold()
                                   <= float(len(items)) * len(items) * a.sim_f)}
        if ref is not None:
            run["agreement_with_implicit"] = agreement(ids, ref)
            run["speedup_vs_implicit"] = out["runs"][0]["seconds"] / t
        out["runs"].append(run)
        log.info("%s", run)
    with inference_options(enabled=False):
        t, (hids, _) = timed(lambda: model.similar_items(items, N=a.N), reps=3)
    run = {"engine": "clmf host (NumPy)", "seconds": t}
    if ref is not None:
        run["agreement_with_implicit"] = agreement(hids, ref)
    out["runs"].append(run)


# ----- GPU ---------------------------------------------------------------------------------------
def gpu_device(spec=None):
    """The first OpenCL GPU (or the device ``spec`` names: smoke tests of this mode)."""
    import pyopencl as cl
    if spec:
        from clmf.engine.device import select_device
        return select_device(spec)
    for p in cl.get_platforms():
        for d in p.get_devices():
            if d.type & cl.device_type.GPU:
                return d
    raise SystemExit("no OpenCL GPU found")


def bench_gpu(a, res, outdir):
    """The GPU run: a geometry search, the Netflix-shaped problem, its peers."""
    from clmf.autotune.topk import synthetic_problem, tune_topk
    from clmf.engine.device import device_info
    from clmf.inference import topk as T
    from clmf.inference.host import host_rank
    from clmf.inference.topk import inference_options
    dev = gpu_device(a.device)
    info = device_info(dev)
    res["device"] = str(info)
    # 1. a short search of the geometries on 65,536 users (record into OUTDIR)
    t0 = time.perf_counter()
    tuned = tune_topk(dev, n_items=a.items, f=a.f, users=min(a.tune_users, a.users), N=a.N,
                      seen_per_user=a.seen, db=str(outdir / "topk-tuning.jsonl"),
                      progress=False)
    res["tuning"] = {"seconds": time.perf_counter() - t0, "best": tuned["config"],
                     "host_threshold": tuned.get("host_threshold"),
                     "candidates": [{k: r.get(k) for k in ("config_str", "status", "seconds",
                                                           "kernel_seconds", "error")}
                                    for r in tuned["candidates"]]}
    cfg = T.TopKConfig.from_dict(tuned["config"])
    os.environ["CLMF_TUNING_DB"] = str(outdir / "topk-tuning.jsonl")   # the model API finds it
    log.info("best geometry %s: %.4f s for %d users", cfg, tuned["seconds"],
             min(a.tune_users, a.users))
    # 2. the whole problem
    t0 = time.perf_counter()
    X, Y, R = synthetic_problem(a.users, a.items, a.f, a.seen, seed=0)
    res["problem"] = {"users": a.users, "items": a.items, "f": a.f, "N": a.N,
                      "seen_nnz": int(R.nnz), "generate_seconds": time.perf_counter() - t0}
    t_up, dtk = timed(lambda: T.DeviceTopK(Y, dev, config=cfg).set_queries(X))
    t_ex, _ = timed(lambda: dtk.set_exclude(R))
    dtk.query_rows(0, min(a.users, 4096), a.N, exclude="resident")             # warm-up
    runs = []
    for _ in range(a.reps):
        t, (ids, sc) = timed(lambda: dtk.query_rows(0, a.users, a.N, exclude="resident"))
        runs.append((t, dtk.kernel_seconds))
    t_nf = []
    for _ in range(a.reps):
        t, (ids_nf, _) = timed(lambda: dtk.query_rows(0, a.users, a.N))
        t_nf.append((t, dtk.kernel_seconds))
    ns = 2000
    hid, hsc = host_rank(X[:ns], Y, None, R[:ns], a.N)
    res["clmf"] = {
        "config": str(cfg), "upload_factors_s": t_up, "upload_seen_csr_s": t_ex,
        "filtered_wall_s": min(r[0] for r in runs), "filtered_kernel_s": min(r[1] for r in runs),
        "unfiltered_wall_s": min(r[0] for r in t_nf),
        "unfiltered_kernel_s": min(r[1] for r in t_nf),
        "agreement_with_host_2000": agreement(ids[:ns], hid),
        "max_score_diff_2000": float(np.nanmax(np.abs(np.where(np.isfinite(hsc), sc[:ns] - hsc,
                                                                 0)))),
    }
    log.info("clmf: %s", res["clmf"])
    # the model API end to end (uploads the seen rows per batch)
    m = make_model(X, Y, dev)
    with inference_options(device=dev):
        m.recommend_all(a.N, R)                                                    # warm-up
        t, (ids_m, _) = timed(lambda: m.recommend_all(a.N, R))
    res["clmf"]["model_recommend_all_s"] = t
    res["clmf"]["model_same_as_resident"] = float(np.mean(ids_m == ids))
    # 3. PyTorch
    res["torch"] = bench_torch(X, Y, R, a, ids)
    # 4. FAISS (unfiltered exact inner product)
    res["faiss"] = bench_faiss(X, Y, a, ids_nf)


def bench_torch(X, Y, R, a, ref):
    """PyTorch peer: a GEMM per 64K users, the seen items masked, ``topk``."""
    try:
        import torch
    except ImportError as e:
        return {"skipped": f"torch not importable: {e}"}
    if not torch.cuda.is_available():
        return {"skipped": "torch has no CUDA device"}
    dev = torch.device("cuda")
    Xt, Yt = torch.from_numpy(X).to(dev), torch.from_numpy(Y).to(dev)
    indptr = torch.from_numpy(R.indptr.astype(np.int64)).to(dev)
    cols = torch.from_numpy(R.indices.astype(np.int64)).to(dev)
    counts = indptr[1:] - indptr[:-1]
    B = 65536

    def run():
        """One pass over all users; the top-N ids on the host."""
        out_i, out_s = [], []
        for b0 in range(0, X.shape[0], B):
            b1 = min(X.shape[0], b0 + B)
            S = Xt[b0:b1] @ Yt.T
            e0, e1 = int(R.indptr[b0]), int(R.indptr[b1])
            rows = torch.repeat_interleave(torch.arange(b1 - b0, device=dev), counts[b0:b1])
            S[rows, cols[e0:e1]] = -float("inf")
            s, i = torch.topk(S, a.N, dim=1)
            out_i.append(i)
            out_s.append(s)
        ids = torch.cat(out_i).cpu().numpy()
        torch.cuda.synchronize()
        return ids

    run()
    best = float("inf")
    for _ in range(a.reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        ids = run()
        best = min(best, time.perf_counter() - t)
    return {"seconds": best, "batch": B, "agreement_with_clmf": agreement(ids, ref),
            "version": torch.__version__}


def bench_faiss(X, Y, a, ref_unfiltered):
    """FAISS GPU exact inner-product search (no seen-item filter)."""
    try:
        import faiss
    except ImportError as e:
        return {"skipped": f"faiss not importable: {e}"}
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
        return {"skipped": "faiss has no GPU support here"}
    res = faiss.StandardGpuResources()
    index = faiss.GpuIndexFlatIP(res, X.shape[1])
    index.add(Y)
    index.search(X[:1024], a.N)
    best = float("inf")
    for _ in range(a.reps):
        t = time.perf_counter()
        _, found = index.search(X, a.N)
        best = min(best, time.perf_counter() - t)
    return {"seconds_unfiltered": best, "agreement_with_clmf_unfiltered":
            agreement(found, ref_unfiltered), "version": getattr(faiss, "__version__", "?"),
            "note": "no seen-item filtering (FAISS has none); compare clmf's unfiltered time"}


# ----- report ------------------------------------------------------------------------------------
def write(outdir, name, res):
    """Write ``OUTDIR/<name>.json`` and a markdown summary."""
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / f"{name}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    lines = [f"# {name}", "", f"date {res['date']}, commit {res['commit']}, host "
             f"{res['host']}, load average at start {res['loadavg_start']}, at end "
             f"{res.get('loadavg_end')}", "", f"command: `{res['command']}`", ""]
    for key in ("recommend", "similar_items"):
        sec = res.get(key)
        if not sec or "runs" not in sec:
            continue
        lines += [f"## {key}", "", ", ".join(f"{k}={v}" for k, v in sec.items() if k != "runs"),
                  "", "| engine | seconds | users/s | vs implicit | agreement w/ implicit |",
                  "|---|---|---|---|---|"]
        for r in sec["runs"]:
            lines.append(f"| {r['engine']} | {r['seconds']:.3f} | "
                         f"{r.get('users_per_s', float('nan')):.0f} | "
                         f"{r.get('speedup_vs_implicit', float('nan')):.2f}× | "
                         f"{r.get('agreement_with_implicit', float('nan')):.4f} |")
        lines.append("")
    for key in ("problem", "tuning", "clmf", "torch", "faiss"):
        if key in res:
            sec = res[key]
            if key == "tuning":
                sec = {k: v for k, v in sec.items() if k != "candidates"}
            lines += [f"## {key}", "", "```", json.dumps(sec, indent=1, default=str), "```", ""]
    (outdir / f"{name}.md").write_text("\n".join(lines))


def main(argv=None):
    """Command line entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--gpu", action="store_true", help="the H100 run (Netflix-shaped)")
    ap.add_argument("--users", type=int, default=None,
                    help="users (default 100,000 on CPUs, 480,189 with --gpu)")
    ap.add_argument("--items", type=int, default=17770)
    ap.add_argument("-f", type=int, default=100)
    ap.add_argument("-N", type=int, default=10)
    ap.add_argument("--seen", type=float, default=209.0, help="mean seen items per user")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sim-f", type=int, default=64, help="factors of the ml-latest-small fit")
    ap.add_argument("--device", default=None, help="--gpu mode on this device instead of the "
                                                   "first GPU (smoke tests)")
    ap.add_argument("--tune-users", type=int, default=65536, help="users of the --gpu search")
    ap.add_argument("--skip-implicit", action="store_true")
    ap.add_argument("--skip-host", action="store_true")
    ap.add_argument("--skip-similar", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if a.users is None:
        a.users = 480189 if a.gpu else 100000
    outdir = pathlib.Path(a.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    res = {"date": _now(), "commit": _commit(), "host": platform.node(),
           "cpus": os.cpu_count(), "command": " ".join(["python"] + sys.argv),
           "loadavg_start": os.getloadavg()}
    if a.gpu:
        bench_gpu(a, res, outdir)
        res["loadavg_end"] = os.getloadavg()
        write(outdir, "bench_topk_gpu", res)
    else:
        bench_recommend_cpu(a, res)
        if not a.skip_similar:
            bench_similar_cpu(a, res)
        res["loadavg_end"] = os.getloadavg()
        write(outdir, "bench_topk_cpu", res)
    print(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
