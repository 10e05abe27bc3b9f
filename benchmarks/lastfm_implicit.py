#!/usr/bin/env python3
"""clmf's implicit-feedback ALS against the `implicit` library's CPU ALS on Last.fm play counts.

Same data (HetRec 2011 Last.fm 2K, strengths log1p(plays)), the same leave-k-out split, factors,
λ, alpha and iterations; both models' factors are ranked by the same code (seen items filtered)
and scored with clmf.metrics (precision@10, nDCG@10); fit times are wall-clock seconds in this one
run. Writes a markdown table and JSON with device, driver, date and commit.

    python benchmarks/lastfm_implicit.py \\
        --data ../shared/data/hetrec2011-lastfm-2k/user_artists.dat \\
        --out results/bench/lastfm_implicit
"""
import argparse
import datetime
import json
import os
import sys
import time

import numpy as np


def commit():
    from clmf.provenance import commit as clmf_commit
    return clmf_commit()


def lastfm_split(path, k_out, seed):
    """Last.fm play counts as log1p strengths, split leave-``k_out``-out: ``(train, held)``
    Ratings (the split every Last.fm benchmark here uses)."""
    import clmf.data
    from clmf.data import splits
    data = clmf.data.load(path)
    data = clmf.data.Ratings(data.users, data.items, np.log1p(data.ratings).astype(np.float32),
                            data.timestamps, data.user_ids, data.item_ids)
    return splits.leave_k_out(data, k=k_out, random_state=seed, min_train=k_out)


def top_n(X, Y, train_csr, users, k=10):
    S = X[users] @ Y.T
    R = train_csr[users]
    rr = np.repeat(np.arange(len(users)), np.diff(R.indptr))
    S[rr, R.indices] = -np.inf
    top = np.argpartition(-S, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(S, top, 1), axis=1, kind="stable")
    return np.take_along_axis(top, order, 1)


def lastfm_arguments(p):
    """The options of the Last.fm implicit runs (data, model, split, output) on parser ``p``
    (also :mod:`validation_overhead`'s)."""
    p.add_argument("--data", default="../shared/data/hetrec2011-lastfm-2k/user_artists.dat")
    p.add_argument("--factors", type=int, default=64)
    p.add_argument("--regularization", type=float, default=0.05)
    p.add_argument("--alpha", type=float, default=2.0)
    p.add_argument("--iterations", type=int, default=15)
    p.add_argument("--k-out", type=int, default=2, help="held-out items per user (leave-k-out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="path prefix for .md and .json")
    return p


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    lastfm_arguments(p)
    p.add_argument("--device", default="auto")
    a = p.parse_args()

    import clmf
    from clmf import metrics
    from clmf.engine.device import device_info, device_label, select_device

    train, test = lastfm_split(a.data, a.k_out, a.seed)
    R = train.to_csr()
    T = test.to_csr()
    users = np.flatnonzero(np.diff(T.indptr) > 0)
    relevant = [T.indices[T.indptr[u]:T.indptr[u + 1]] for u in users]
    dev = select_device(a.device)
    info = device_info(dev)
    rows = []

    def score(name, X, Y, secs, extra):
        rec = top_n(np.asarray(X, np.float32), np.asarray(Y, np.float32), R, users)
        res = dict(system=name, seconds=secs,
                   precision_at_10=float(metrics.precision_at_k(rec, relevant, 10)),
                   ndcg_at_10=float(metrics.ndcg_at_k(rec, relevant, 10)), **extra)
        rows.append(res)
        print(json.dumps(res), flush=True)

    m = clmf.ALS(a.factors, a.regularization, a.iterations, feedback="implicit", alpha=a.alpha,
                 device=dev, random_state=a.seed)
    m.fit(R, show_progress=False)      # warm-up: kernel builds are not part of the timing
    t = time.perf_counter()
    m = clmf.ALS(a.factors, a.regularization, a.iterations, feedback="implicit", alpha=a.alpha,
                 device=dev, random_state=a.seed).fit(R, show_progress=False)
    score("clmf", m.user_factors_, m.item_factors_, time.perf_counter() - t,
          dict(device=device_label(info), driver=info.driver,
               config=str(m.config_["users"].config)))
    try:
        import implicit
        from implicit.cpu.als import AlternatingLeastSquares
        from threadpoolctl import threadpool_limits
        with threadpool_limits(1, "blas"):
            im = AlternatingLeastSquares(factors=a.factors, regularization=a.regularization,
                                         alpha=a.alpha, iterations=a.iterations,
                                         random_state=a.seed, calculate_training_loss=False)
            # implicit ≥ 0.5 takes confidence C = alpha·data (not 1 + alpha·r): data = r + 1/alpha
            # makes it fit the same model as clmf at the same alpha
            Ri = R.copy()
            Ri.data = Ri.data + 1.0 / a.alpha
            t = time.perf_counter()
            im.fit(Ri, show_progress=False)
            secs = time.perf_counter() - t
        score("implicit (CPU, CG)", im.user_factors, im.item_factors, secs,
              dict(version=implicit.__version__))
    except Exception as e:  # reported, never dropped silently
        rows.append(dict(system="implicit", status=f"unavailable: {type(e).__name__}: {e}"))
        print(rows[-1])
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                commit=commit(), data=os.path.basename(a.data), users=int(R.shape[0]),
                items=int(R.shape[1]), train_nnz=int(R.nnz), test_nnz=int(T.nnz),
                factors=a.factors, regularization=a.regularization, alpha=a.alpha,
                iterations=a.iterations, k_out=a.k_out, strengths="log1p(plays)")
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out + ".json", "w") as fh:
            json.dump(dict(meta=meta, rows=rows), fh, indent=1)
        lines = ["# Implicit-feedback ALS on Last.fm (HetRec 2011): clmf vs implicit", "",
                 f"`python benchmarks/lastfm_implicit.py` — {meta['date']}, "
                 f"commit {meta['commit'][:10]}; "
                 f"{meta['users']} users × {meta['items']} artists, {meta['train_nnz']} train / "
                 f"{meta['test_nnz']} held-out (leave-{a.k_out}-out), strengths log1p(plays), "
                 f"f={a.factors}, λ={a.regularization}, alpha={a.alpha}, "
                 f"{a.iterations} iterations.", "",
                 "| system | precision@10 | nDCG@10 | fit seconds | notes |",
                 "|---|---|---|---|---|"]
        for r in rows:
            if "status" in r:
                lines.append(f"| {r['system']} | — | — | — | {r['status']} |")
            else:
                note = (r.get("device", "").replace(" | ", " / ")
                        + (f", {r['config']}" if "config" in r else "")
                        + (f"version {r['version']}, 1 BLAS thread" if "version" in r else ""))
                lines.append(f"| {r['system']} | {r['precision_at_10']:.4f} | "
                             f"{r['ndcg_at_10']:.4f} | {r['seconds']:.2f} | {note} |")
        with open(a.out + ".md", "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
