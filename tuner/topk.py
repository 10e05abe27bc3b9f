"""Tuning the top-k inference kernels (``cl_kernels/topk.cl.j2``).

A small exhaustive search over :class:`clmf.inference.topk.TopKConfig` geometries for one device
and problem shape (items, f, N, seen items per query): every configuration is verified against
the host's NumPy ranking on a sample of queries, timed (median of ``reps`` runs of the whole
query batch), and the fastest is written to the tuning database as one ``topk`` record beside
the measured host/device threshold. The ALS lookup reads only ``best``/``measurement`` records,
so these never reach it; :func:`clmf.inference.topk.lookup_config` reads them.

>>> from clmf.autotune.topk import tune_topk                                   # doctest: +SKIP
>>> tune_topk(device="cpu", n_items=17770, f=100, users=8192)          # doctest: +SKIP
"""
from __future__ import annotations

import logging
import time

import numpy as np
import scipy.sparse as sp

log = logging.getLogger(__name__)

__all__ = ["space", "tune_topk", "synthetic_problem", "verify"]


def space(info):
    """Candidate geometries for a device type (CPUs: one work-item wide groups and wide
    vectors; GPUs: 128–256 work-items with register micro-tiles)."""
    from clmf.inference.topk import TopKConfig as T
    if info.type == "CPU":
        out = [T(wx=wx, wy=wy, rm=rm, rnv=rnv, v=v, tk=16, cap=16, yt=2)
               for wx, wy in ((1, 16), (1, 32), (1, 64), (1, 128), (8, 8))
               for rm, rnv, v in ((4, 2, 8), (2, 2, 16))]
        out += [T(wx=1, wy=64, rm=4, rnv=2, v=8, tk=16, cap=16, yt=1),
                T(wx=1, wy=16, rm=4, rnv=2, v=8, tk=16, cap=16, qres=True, yt=1),
                T(wx=1, wy=16, rm=4, rnv=2, v=8, tk=32, cap=16, qres=True)]
        return out
    out = []
    for wx, wy, rm, rnv, v in ((16, 16, 8, 2, 4), (16, 16, 4, 2, 4), (16, 8, 8, 2, 4),
                               (32, 8, 8, 1, 4), (16, 16, 8, 1, 4), (32, 8, 4, 1, 4),
                               (16, 16, 4, 1, 4), (8, 32, 4, 4, 4)):
        for tk in (8, 20):          # f = 100 pads to 104 / 100
            out.append(T(wx=wx, wy=wy, rm=rm, rnv=rnv, v=v, tk=tk, cap=16))
    out.append(T(wx=16, wy=16, rm=8, rnv=2, v=4, tk=16, cap=16))
    out.append(T(wx=16, wy=16, rm=8, rnv=2, v=4, tk=20, cap=8))
    for wx, wy, rm, rnv in ((16, 8, 8, 2), (32, 8, 4, 1), (16, 16, 4, 2)):
        out.append(T(wx=wx, wy=wy, rm=rm, rnv=rnv, v=4, tk=4, cap=16, yt=2))
    out.append(T(wx=16, wy=8, rm=8, rnv=2, v=4, tk=4, cap=16, yt=1))
    return out


def synthetic_problem(users, n_items, f, seen_per_user, seed=0, scale=0.1):
    """Random factors (normal, ``scale``) and a seen-items CSR with about ``seen_per_user``
    items per user, popularity-skewed (Zipf-like), sorted and duplicate-free."""
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((users, f)) * scale).astype(np.float32)
    Y = (rng.standard_normal((n_items, f)) * scale).astype(np.float32)
    lengths = np.minimum(n_items, np.maximum(
        1, rng.lognormal(np.log(max(seen_per_user, 1)) - 0.5, 1.0, users))).astype(np.int64)
    if seen_per_user <= 0:
        lengths[:] = 0
    nnz = int(lengths.sum())
    p = 1.0 / np.arange(1, n_items + 1) ** 0.8
    p /= p.sum()
    cols = rng.choice(n_items, size=nnz, p=p).astype(np.int32)
    perm = rng.permutation(n_items).astype(np.int32)      # popular items spread over the ids
    cols = perm[cols]
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    R = sp.csr_matrix((np.ones(nnz, np.float32), cols, indptr), shape=(users, n_items))
    R.sum_duplicates()
    return X, Y, R


def verify(ids, scores, ref_ids, ref_scores, rtol=1e-4):
    """Device vs host lists: scores equal to ``rtol`` (of the row's largest magnitude) slot by
    slot, ids equal except where neighbouring scores are that close (float summation order).
    Returns the fraction of differing ids (0 when exact); raises AssertionError otherwise."""
    if ids.shape != ref_ids.shape:
        raise AssertionError(f"shapes differ: {ids.shape} vs {ref_ids.shape}")
    fin = np.isfinite(ref_scores)
    if not np.array_equal(fin, np.isfinite(scores)):
        raise AssertionError("different numbers of results per row")
    scale = np.maximum(np.abs(np.where(fin, ref_scores, 0)).max(axis=1, keepdims=True), 1e-30)
    if np.any(np.abs(np.where(fin, scores - ref_scores, 0)) > rtol * scale):
        raise AssertionError("scores differ beyond tolerance")
    diff = (ids != ref_ids) & fin
    return float(diff.mean()) if diff.size else 0.0


def tune_topk(device="auto", n_items=17770, f=100, users=8192, N=10, seen_per_user=200,
              configs=None, reps=3, db=None, write=True, seed=0, progress=True,
              calibrate_threshold=True):
    """Time each configuration of :func:`space` (or ``configs``) on a synthetic problem of
    ``users`` queries × ``n_items`` items at ``f`` with seen items filtered, top-``N``; verify
    each against the host; append a ``topk`` record of the fastest (with the measured host
    threshold) to ``db`` (default: the per-user database). Returns the summary dict."""
    from clmf import tuning
    from clmf.engine.device import device_info, select_device
    from clmf.errors import InvalidConfigError
    from clmf.inference import topk as T
    from clmf.inference.host import host_rank
    from clmf.tuning import Database, base_record
    dev = select_device(device)
    info = device_info(dev)
    X, Y, R = synthetic_problem(users, n_items, f, seen_per_user, seed)
    ns = min(users, 256)
    ref = host_rank(X[:ns], Y, None, R[:ns], N)
    cands = list(configs) if configs is not None else space(info)
    rows = []
    it = cands
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(cands, desc=f"topk {info.name[:20]}", unit="cfg")
    for cfg in it:
        row = {"config": cfg.to_dict(), "config_str": str(cfg)}
        try:
            dtk = T.DeviceTopK(Y, dev, config=cfg)
            T.validate(T._shrink_to_fit(cfg, f, N, info), f, N, info)
            dtk.set_queries(X)
            dtk.set_exclude(R)
            ids, sc = dtk.query_rows(0, ns, N, exclude="resident")
            row["id_mismatch"] = verify(ids, sc, *ref)
            times, ktimes = [], []
            for _ in range(reps):
                t = time.perf_counter()
                dtk.query_rows(0, users, N, exclude="resident")
                times.append(time.perf_counter() - t)
                ktimes.append(dtk.kernel_seconds)
            row.update(status="ok", seconds=float(np.median(times)),
                       kernel_seconds=float(np.median(ktimes)))
            row["queries_per_s"] = users / row["seconds"]
        except InvalidConfigError as e:
            row.update(status="invalid", reason=e.reason, error=str(e))
        except AssertionError as e:
            row.update(status="wrong", error=str(e))
        except Exception as e:                      # a failing build/launch is a result
            row.update(status="failed", error=f"{type(e).__name__}: {e}")
        log.info("topk %s: %s", cfg, {k: v for k, v in row.items() if k != "config"})
        rows.append(row)
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        raise RuntimeError(f"no top-k configuration worked on {info.name}: "
                           f"{[r.get('error') for r in rows]}")
    best = min(ok, key=lambda r: r["seconds"])
    best_cfg = T.TopKConfig.from_dict(best["config"])
    summary = {"device": tuning.device_record(info), "f": f, "n_items": n_items, "users": users,
               "N": N, "seen_per_user": seen_per_user, "config": best["config"],
               "seconds": best["seconds"], "kernel_seconds": best["kernel_seconds"],
               "queries_per_s": best["queries_per_s"], "candidates": rows}
    if calibrate_threshold:
        thr, detail = T.calibrate(T.DeviceTopK(Y, dev, config=best_cfg), N=N)
        summary["host_threshold"] = thr if np.isfinite(thr) else 1e30
        summary["calibration"] = detail
    if write:
        path = db or tuning.user_db_path()
        rec = base_record("topk", **summary)
        Database(path).append(rec)
        summary["database"] = str(path)
    return summary


if __name__ == "__main__":                         # pragma: no cover - manual runs
    import argparse
    import json
    ap = argparse.ArgumentParser(description="tune the top-k kernels on one device")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--items", type=int, default=17770)
    ap.add_argument("-f", type=int, default=100)
    ap.add_argument("--users", type=int, default=8192)
    ap.add_argument("-N", type=int, default=10)
    ap.add_argument("--db", default=None)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    s = tune_topk(a.device, a.items, a.f, a.users, a.N, db=a.db, write=not a.no_write)
    print(json.dumps({k: v for k, v in s.items() if k != "candidates"}, indent=1))
