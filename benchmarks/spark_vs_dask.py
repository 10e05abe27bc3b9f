"""CPU comparison of issue 15: Spark ALS (pyspark, ``local[2]``) against ``clmf.dask`` with 2
workers (one thread each, PoCL, each PoCL device limited to one compute unit) on the same ~1M
rating parquet data, same f, λ and iterations: seconds per iteration and test RMSE side by side.

    python benchmarks/spark_vs_dask.py OUTDIR [--factors 10 --regularization 0.1 --iterations 10]

The data: :func:`clmf.data.synthetic` (20,000 users × 5,000 items, 1M ratings, seed 0),
90/10 random split, test rows of users/items unseen in training dropped (Spark's
``coldStartStrategy="drop"``; clmf would predict them as the mean), written by this script as
parquet under OUTDIR/data. Both use weighted-λ regularisation (Spark scales ``regParam`` by each
row's rating count; clmf's explicit default). Seconds per iteration: Spark has no per-iteration
hook, so it is (fit(1 + k iterations) − fit(1 iteration)) / k after a warm-up fit, the whole fits
also reported;
clmf.dask's from its per-iteration times (median), its whole fit (parquet read, id maps, blocks,
iterations, factors gathered) also reported. Writes OUTDIR/spark_vs_dask.json and summary.md.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import platform
import sys
import time

import numpy as np


def say(msg):
    """A timestamped progress line."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_data(ddir, seed=0):
    """Train/test parquet files of the synthetic set (written once)."""
    import pandas as pd

    import clmf
    train, test = ddir / "train.parquet", ddir / "test.parquet"
    if not train.exists():
        ddir.mkdir(parents=True, exist_ok=True)
        data = clmf.data.synthetic(shape=(20_000, 5_000), nnz=1_000_000, seed=seed)
        C = data.to_coo()
        df = pd.DataFrame({"user": C.row.astype(np.int32), "item": C.col.astype(np.int32),
                           "rating": C.data.astype(np.float32)})
        rng = np.random.default_rng(seed)
        is_test = rng.random(len(df)) < 0.1
        tr, te = df[~is_test], df[is_test]
        te = te[te.user.isin(tr.user.unique()) & te.item.isin(tr.item.unique())]
        tr.to_parquet(train, index=False)
        te.to_parquet(test, index=False)
    return train, test


def run_spark(train, test, f, lam, iters):
    """Spark ALS fits of 1 and 1 + iters iterations: times and the test RMSE of the longer."""
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.recommendation import ALS
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("clmf-spark-vs-dask")
             .config("spark.driver.memory", "4g").config("spark.sql.shuffle.partitions", "4")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        tr = spark.read.parquet(str(train)).cache()
        te = spark.read.parquet(str(test)).cache()
        tr.count()
        te.count()
        out = {"version": spark.version}
        for k in (1, 1, 1 + iters):       # the first fit warms the JVM up (not counted)
            als = ALS(rank=f, regParam=lam, maxIter=k, userCol="user", itemCol="item",
                      ratingCol="rating", coldStartStrategy="drop", seed=0)
            t = time.perf_counter()
            model = als.fit(tr)
            model.userFactors.count()          # the fit is lazy until factors are used
            out[f"fit_{k}_s"] = time.perf_counter() - t
            say(f"spark: {k} iteration(s) in {out[f'fit_{k}_s']:.2f} s")
        out["s_per_it"] = (out[f"fit_{1 + iters}_s"] - out["fit_1_s"]) / iters
        pred = model.transform(te)
        out["test_rmse"] = RegressionEvaluator(metricName="rmse", labelCol="rating",
                                               predictionCol="prediction").evaluate(pred)
        return out
    finally:
        spark.stop()


def run_dask(train, test, f, lam, iters):
    """clmf.dask on a LocalCluster of 2 single-threaded PoCL workers."""
    import dask.dataframe as dd
    import pandas as pd
    from distributed import Client, LocalCluster

    import clmf.dask
    env = {"POCL_CPU_MAX_CU_COUNT": "1"}
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=None, env=env)
    client = Client(cluster)
    try:
        t = time.perf_counter()
        model = clmf.dask.ALS(client=client, factors=f, regularization=lam, iterations=iters,
                              device="Portable", random_state=0).fit(
            dd.read_parquet(str(train)), show_progress=False)
        fit_s = time.perf_counter() - t
        secs = [h["seconds"] for h in model.history_]
        rmse = model.rmse(pd.read_parquet(test))
        return {"fit_s": fit_s, "iter_s": secs, "s_per_it": float(np.median(secs)),
                "time_to_first_iteration_s": model.time_to_first_iteration_,
                "test_rmse": rmse, "devices": model.device_,
                "configs": {s: str(c.config) for s, c in model.config_.items()}}
    finally:
        client.close()
        cluster.close()


def main(argv=None):
    """See the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--factors", type=int, default=10)
    ap.add_argument("--regularization", type=float, default=0.1)
    ap.add_argument("--iterations", type=int, default=10)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from clmf.provenance import commit
    out = pathlib.Path(args.outdir)
    train, test = make_data(out / "data")
    f, lam, k = args.factors, args.regularization, args.iterations
    rec = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "commit": commit(),
           "command": " ".join(["python"] + sys.argv), "host": platform.node(),
           "cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
           "factors": f, "regularization": lam, "iterations": k,
           "train": str(train), "test": str(test)}
    say("clmf.dask ...")
    rec["clmf_dask"] = run_dask(train, test, f, lam, k)
    say(f"clmf.dask: {rec['clmf_dask']['s_per_it']:.3f} s/it, test RMSE "
        f"{rec['clmf_dask']['test_rmse']:.4f}")
    say("spark ...")
    rec["spark"] = run_spark(train, test, f, lam, k)
    say(f"spark: {rec['spark']['s_per_it']:.3f} s/it, test RMSE {rec['spark']['test_rmse']:.4f}")
    (out / "spark_vs_dask.json").write_text(json.dumps(rec, indent=1, default=str))
    d, s = rec["clmf_dask"], rec["spark"]
    (out / "summary.md").write_text(
        f"# Spark ALS vs clmf.dask, {rec['date']}, commit {rec['commit']}\n\n"
        f"`{rec['command']}` on {rec['host']} ({rec['cpus']} CPUs; shared with other work)\n\n"
        f"1M-rating synthetic set (20,000 × 5,000; 90/10 split), f = {f}, λ = {lam} "
        f"(weighted), {k} iterations.\n\n"
        "| | s/it | whole fit (s) | test RMSE |\n|---|---|---|---|\n"
        f"| Spark {s['version']} ALS, local[2] | {s['s_per_it']:.3f} | "
        f"{s[f'fit_{1 + k}_s']:.1f} ({1 + k} it) | {s['test_rmse']:.4f} |\n"
        f"| clmf.dask, 2 workers × 1 thread, PoCL (1 CU each) | {d['s_per_it']:.3f} | "
        f"{d['fit_s']:.1f} ({k} it) | {d['test_rmse']:.4f} |\n")
    say(f"written to {out}")


if __name__ == "__main__":
    main()
