"""Recommend through the public API on a GPU (issue 29): first and warm calls against the ranker's
own time and the ``implicit`` library's CUDA ``recommend``, one run (at most about 8 minutes).

1. Netflix-shaped synthetic ratings (``clmf.data.synthetic("netflix")``: 480,189 users ×
   17,770 items, 99 M ratings); for each f (default 64, 100, 128) a brief fit (``--iterations``,
   default 2), then
   * the first ``model.recommend_all(N=10, user_items=R)`` after ``fit`` and the first
     ``model.recommend(np.arange(m), R, N=10)`` after it;
   * warm: medians of ``--reps`` (≥ 3) calls of each;
   * the ranker's own time: the model's resident :class:`~clmf.inference.topk.DeviceTopK` with
     the users and the seen items already on the device (``query_rows(..., exclude="resident")``),
     wall and kernel (profiling events) — single-device models;
   * where the warm ``recommend_all``'s time went, per device of the model
     (``ResidentRanker.split_summary``: its thread's start and end, host enqueue / wait /
     finish seconds, device kernel / copy / busy / idle seconds, and how much the devices
     overlapped), and with several devices each device's share of the users ranked alone;
   * the ``implicit`` library's CUDA model with the same factors (``implicit.gpu``; "unavailable"
     with the reason when it cannot be imported or has no CUDA): ``recommend(all users, R,
     N=10)``, first and warm; and the share of its top-10 ids that clmf's lists hold.
2. A 1M users × 1M items model at f = 128 (random normal factors ×0.1, no seen items): all
   users' top-10 through ``model.recommend_all(N=10, filter_already_liked_items=False)``, first
   and warm, the ranker's own time, and the same per-device split.

Results go to ``OUT/recommend_gpu.json`` and ``OUT/recommend_gpu.md``, rewritten after every
measurement (a run cut short keeps what it measured), with the device, driver, date, commit and
command. ``--small`` runs the same steps at a tiny size (MovieLens-100K shape, 20K × 20K) to
check the script on a CPU device::

    python benchmarks/recommend_gpu.py --out results/bench/recommend-gpu            # H100
    python benchmarks/recommend_gpu.py --out /tmp/rg --small --device cpu           # smoke test
    python benchmarks/recommend_gpu.py --out OUT --device gpu:all                   # all GPUs
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import pathlib
import platform
import statistics
import sys
import time

import numpy as np
from bench_topk import _commit, _now, make_model  # benchmarks/: one copy of each

log = logging.getLogger("recommend_gpu")


def timed(fn):
    """(seconds, result) of one call."""
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def median_of(fn, reps):
    """(median seconds, all seconds, last result) of ``reps`` calls."""
    ts, out = [], None
    for _ in range(reps):
        t, out = timed(fn)
        ts.append(t)
    return statistics.median(ts), ts, out


def overlap(a, b):
    """Mean share of the ids of ``b``'s rows found in ``a``'s (padding ignored)."""
    tot, n = 0.0, 0
    for x, y in zip(a, b):
        y = y[y >= 0]
        if y.size:
            tot += np.isin(y, x).mean()
            n += 1
    return tot / max(1, n)


def ranker_time(model, m, N, reps, resident_seen):
    """The model's own ranker with everything on the device: {wall_s, kernel_s} (medians), or
    a note when the model has several devices or no resident ranker."""
    try:
        res = model._topk_cache["resident"][1]
    except (AttributeError, KeyError):
        return {"note": "no resident ranker (host path)"}
    if len(res.parts) != 1:
        return {"note": f"{len(res.parts)} devices: the public call is the measurement"}
    dtk, excl = res.first, None
    if resident_seen:
        if res.parts[0]["seen"] is None:
            return {"note": "the public calls ranked on the host (work below the host "
                            "threshold)"}
        excl = res.parts[0]["seen"][1]       # the seen items the public calls uploaded
    dtk.query_rows(0, m, N, exclude=excl)
    walls, kernels = [], []
    for _ in range(reps):
        t, _ = timed(lambda: dtk.query_rows(0, m, N, exclude=excl))
        walls.append(t)
        kernels.append(dtk.kernel_seconds)
    return {"wall_s": statistics.median(walls), "kernel_s": statistics.median(kernels),
            "config": str(dtk.config), "config_origin": dtk.config_origin}


def device_split(model, N, reps, R=None):
    """Where the model's last ``recommend_all`` spent its time, per device (see
    ``ResidentRanker.split_summary``), and with several devices each device's users ranked
    alone (median wall of ``reps``), or a note when there is no resident ranker."""
    try:
        res = model._topk_cache["resident"][1]
    except (AttributeError, KeyError):
        return {"note": "no resident ranker (host path)"}
    out = res.split_summary()
    if len(res.parts) > 1:
        seen = None if R is None else res.seen_for(R, 0, None)[0]
        for d, p in zip(out["devices"], res.parts):
            r0, r1 = p["rows"]
            d["alone_s"], _, _ = median_of(
                lambda: sum(1 for _ in res.iter_rank(r0, r1, N, None, seen, 65536)), reps)
    return out


def split_markdown(title, split):
    """A table of :func:`device_split`'s result."""
    if not split or "devices" not in split:
        return []

    def s(v):
        return "—" if v is None else f"{v:.3f}"
    ov = split.get("devices_overlap")
    L = ["", f"{title}: devices overlap {s(ov)} (sum of busy ÷ union; 1 = one at a time)", "",
         "| device | users | alone s | thread start s | thread end s | enqueue s | wait s | "
         "finish s | kernel s | copy s | busy s | idle s | first kernel s | last end s |",
         "|---" * 14 + "|"]
    for d in split["devices"]:
        L.append(f"| {d['device']} | {d['users'][0]}–{d['users'][1]} | " + " | ".join(
            s(d.get(k)) for k in ("alone_s", "thread_start_s", "thread_end_s", "enqueue_s",
                                  "wait_s", "finish_s", "kernel_s", "copy_s", "device_busy_s",
                                  "device_idle_s", "first_start_s", "last_end_s")) + " |")
    return L


def implicit_gpu(X, Y, R, N, reps):
    """The implicit library's CUDA recommend for all users on the factors X, Y (filtered by
    R): {first_s, warm_s, ids} or {"status": "unavailable", "why": ...}."""
    try:
        import implicit
        import implicit.gpu
        if not implicit.gpu.HAS_CUDA:
            return {"status": "unavailable", "why": "implicit.gpu.HAS_CUDA is False"}
        from implicit.gpu.als import AlternatingLeastSquares
        model = AlternatingLeastSquares(factors=X.shape[1], iterations=1,
                                        calculate_training_loss=False, random_state=0)
        factors = "clmf's"
        try:
            model.user_factors = implicit.gpu.Matrix(np.ascontiguousarray(X, np.float32))
            model.item_factors = implicit.gpu.Matrix(np.ascontiguousarray(Y, np.float32))
        except Exception as e:         # another implicit API: its own factors of that size
            log.info("implicit: factors not settable (%s); one iteration of its fit", e)
            model.fit(R, show_progress=False)
            factors = "its own (one iteration)"
        users = np.arange(X.shape[0])
        t_first, _ = timed(lambda: model.recommend(users, R, N=N))
        warm, ts, (ids, _) = median_of(lambda: model.recommend(users, R, N=N), reps)
        return {"status": "ok", "version": implicit.__version__, "factors": factors,
                "first_s": t_first, "warm_s": warm, "warm_all_s": ts, "ids": ids}
    except Exception as e:             # not installed, no CUDA, an API change: say why
        return {"status": "unavailable", "why": f"{type(e).__name__}: {e}"[:300]}


class Report:
    """The run's results, written to OUT as JSON and markdown after every measurement."""

    def __init__(self, out, meta):
        """Start the report in ``out`` with the run's metadata."""
        self.out = pathlib.Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.data = {"meta": meta, "netflix": [], "million": None}
        self.write()

    def write(self):
        """Rewrite ``recommend_gpu.json`` and ``recommend_gpu.md``."""
        (self.out / "recommend_gpu.json").write_text(json.dumps(self.data, indent=1) + "\n")
        (self.out / "recommend_gpu.md").write_text(self.markdown())

    def markdown(self):
        """The tables."""
        m = self.data["meta"]

        def s(v):
            return "—" if v is None else f"{v:.3f}"
        L = ["# recommend through the public API (issue 29)", "",
             f"Device: {m['device']} (driver {m['driver']}); {m['date']}; commit {m['commit']}; "
             f"host {m['host']}.", "", f"Command: `{m['command']}`", "",
             f"Data: {m['data']}. N = {m['N']}, seen items filtered; warm = median of "
             f"{m['reps']} calls.", "",
             "| f | fit s | first recommend_all s | warm recommend_all s | first recommend s | "
             "warm recommend s | ranker wall s | ranker kernel s | implicit first s | "
             "implicit warm s | implicit ÷ clmf (warm recommend_all) | overlap with implicit |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in self.data["netflix"]:
            rk, im = r.get("ranker", {}), r.get("implicit", {})
            ratio = (im["warm_s"] / r["warm_recommend_all_s"]
                     if im.get("status") == "ok" and r.get("warm_recommend_all_s") else None)
            L.append(f"| {r['f']} | {s(r.get('fit_s'))} | {s(r.get('first_recommend_all_s'))} | "
                     f"{s(r.get('warm_recommend_all_s'))} | {s(r.get('first_recommend_s'))} | "
                     f"{s(r.get('warm_recommend_s'))} | {s(rk.get('wall_s'))} | "
                     f"{s(rk.get('kernel_s'))} | "
                     f"{s(im.get('first_s')) if im.get('status') == 'ok' else 'unavailable'} | "
                     f"{s(im.get('warm_s'))} | {s(ratio)} | {s(r.get('overlap_implicit'))} |")
        for r in self.data["netflix"]:
            L += split_markdown(f"f = {r['f']}, warm recommend_all per device",
                                r.get("split"))
        why = [r["implicit"].get("why") for r in self.data["netflix"]
               if r.get("implicit", {}).get("status") == "unavailable"]
        if why:
            L += ["", f"implicit unavailable: {why[0]}"]
        mm = self.data["million"]
        if mm:
            L += ["", f"## {mm['users']:,} users × {mm['items']:,} items, f = {mm['f']}, "
                  "top-10, no filter", "",
                  "| first recommend_all s | warm recommend_all s | ranker wall s | "
                  "ranker kernel s |", "|---|---|---|---|",
                  f"| {s(mm.get('first_s'))} | {s(mm.get('warm_s'))} | "
                  f"{s(mm.get('ranker', {}).get('wall_s'))} | "
                  f"{s(mm.get('ranker', {}).get('kernel_s'))} |"]
            L += split_markdown("warm recommend_all per device", mm.get("split"))
            if mm.get("error"):
                L += ["", f"error: {mm['error']}"]
        return "\n".join(L) + "\n"


def bench_netflix(a, rep, R, fs):
    """Fit each f briefly, then the first and warm public calls, the ranker, implicit."""
    import clmf
    m, _n = R.shape
    users = np.arange(m)
    for f in fs:
        row = {"f": f}
        rep.data["netflix"].append(row)
        gc.collect()
        try:
            model = clmf.ALS(factors=f, iterations=a.iterations, device=a.device,
                             random_state=0)
            row["fit_s"], _ = timed(lambda: model.fit(R, show_progress=False))
            row["first_recommend_all_s"], (ids_all, _) = timed(
                lambda: model.recommend_all(N=a.N, user_items=R))
            row["first_recommend_s"], (ids_rec, _) = timed(
                lambda: model.recommend(users, R, N=a.N))
            rep.write()
            row["warm_recommend_all_s"], row["warm_recommend_all_runs"], _ = median_of(
                lambda: model.recommend_all(N=a.N, user_items=R), a.reps)
            row["split"] = device_split(model, a.N, a.reps, R)
            row["warm_recommend_s"], row["warm_recommend_runs"], _ = median_of(
                lambda: model.recommend(users, R, N=a.N), a.reps)
            row["same_ids"] = bool(np.array_equal(ids_all, ids_rec))
            row["ranker"] = ranker_time(model, m, a.N, a.reps, resident_seen=True)
            rep.write()
            log.info("f=%d: %s", f, {k: v for k, v in row.items() if not k.endswith("runs")})
            if not a.skip_implicit:
                im = implicit_gpu(model.user_factors_, model.item_factors_, R, a.N, a.reps)
                ids_im = im.pop("ids", None)
                row["implicit"] = im
                if ids_im is not None:
                    row["overlap_implicit"] = overlap(ids_all, ids_im)
                log.info("implicit f=%d: %s", f, im)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:500]
            log.exception("f=%d failed", f)
        rep.write()
        model = None


def bench_million(a, rep):
    """Random factors, all users' top-10 of a large catalog, no filter."""
    users, items, f = a.million_users, a.million_items, 128
    row = rep.data["million"] = {"users": users, "items": items, "f": f}
    gc.collect()
    try:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((users, f), dtype=np.float32)
        X *= 0.1
        Y = rng.standard_normal((items, f), dtype=np.float32)
        Y *= 0.1
        model = make_model(X, Y, a.device)
        row["first_s"], (ids, _) = timed(
            lambda: model.recommend_all(N=a.N, filter_already_liked_items=False))
        rep.write()
        row["warm_s"], row["warm_runs"], _ = median_of(
            lambda: model.recommend_all(N=a.N, filter_already_liked_items=False), a.reps)
        row["split"] = device_split(model, a.N, a.reps)
        row["ranker"] = ranker_time(model, users, a.N, a.reps, resident_seen=False)
        if a.check:
            from clmf.inference.host import host_rank
            h, _ = host_rank(X[:200], Y, None, None, a.N)
            row["overlap_host_200"] = overlap(ids[:200], h)
        log.info("million: %s", row)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:500]
        log.exception("the million-item run failed")
    rep.write()


def main(argv=None):
    """Parse the arguments and run the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--device", default="gpu", help='clmf device spec ("gpu", "gpu:all", ...)')
    p.add_argument("--factors", default="64,100,128")
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--N", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--small", action="store_true", help="tiny sizes (a CPU smoke test)")
    p.add_argument("--skip-implicit", action="store_true")
    p.add_argument("--skip-million", action="store_true")
    p.add_argument("--million-users", type=int, default=1_000_000)
    p.add_argument("--million-items", type=int, default=1_000_000)
    p.add_argument("--check", action="store_true",
                   help="check 200 users of the large catalog against the host ranking")
    a = p.parse_args(argv)
    a.reps = max(3, a.reps)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    import clmf
    from clmf.engine.device import device_label, select_devices
    if a.small:
        if a.million_users == 1_000_000:
            a.million_users = 20_000
        if a.million_items == 1_000_000:
            a.million_items = 20_000
    devs = select_devices(a.device)
    t0 = time.perf_counter()
    if a.small:
        data, name = clmf.data.synthetic("movielens-100k", seed=0), "synthetic movielens-100k"
    else:
        data, name = clmf.data.synthetic("netflix", seed=0), "synthetic netflix"
    R = data.to_csr()
    del data
    meta = {"device": " + ".join(device_label(d) for d in devs),
            "driver": " + ".join(d.driver_version for d in devs), "date": _now(),
            "commit": _commit(), "host": platform.node(), "command": " ".join(sys.argv),
            "data": f"{name}: {R.shape[0]:,} users × {R.shape[1]:,} items, {R.nnz:,} ratings "
                    f"(generated in {time.perf_counter() - t0:.1f} s)",
            "N": a.N, "reps": a.reps, "clmf": clmf.__version__}
    rep = Report(a.out, meta)
    log.info("%s", meta)
    bench_netflix(a, rep, R, [int(x) for x in a.factors.split(",") if x])
    del R
    if not a.skip_million:
        bench_million(a, rep)
    log.info("done in %.1f s; %s", time.perf_counter() - t0, rep.out / "recommend_gpu.md")


if __name__ == "__main__":
    main()
