"""The data work of one worker's share of a ``clmf.dask`` set-up, this checkout's
:mod:`clmf.parallel.dask_prepare` / :mod:`~clmf.parallel.dask_tasks` against a base commit's
(issue 28): no cluster, no device — each stage timed in this process on a parquet folder of
(user, item, rating), the two versions alternating. Stages: ``ids`` (the distinct ids of the
worker's partitions: the base's ``unique_ids``, this checkout's one-pass ``scan``),
``encode_and_counts`` (the base's encoding and tallies; this checkout has none: its split
encodes), ``split`` (the worker's partitions cut by owner, through no shared memory) and
``blocks`` (worker 0's two CSR blocks from every partition's pieces).

    python benchmarks/dask_setup_work.py PARQUET_DIR --workers 2 --base 69dcf02 --rounds 4
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import subprocess
import sys
import tempfile
import time

import numpy as np


def base_modules(rev):
    """The base commit's ``dask_prepare`` and ``dask_tasks`` imported as siblings of this
    checkout's package (``clmf.parallel._base_prepare`` / ``_base_tasks``)."""
    import clmf.parallel
    tmp = tempfile.mkdtemp(prefix="clmf-base-")
    mods = {}
    for name, alias in (("dask_prepare", "_base_prepare"), ("dask_tasks", "_base_tasks")):
        src = subprocess.run(["git", "show", f"{rev}:clmf/parallel/{name}.py"], check=True,
                             capture_output=True, text=True).stdout
        src = src.replace("from .dask_prepare import", "from ._base_prepare import")
        path = f"{tmp}/{alias}.py"
        with open(path, "w") as fh:
            fh.write(src)
        spec = importlib.util.spec_from_file_location(f"clmf.parallel.{alias}", path)
        mod = importlib.util.module_from_spec(spec)
        mod.__package__ = clmf.parallel.__name__
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    return mods["dask_prepare"], mods["dask_tasks"]


def main(argv=None):
    """Time both versions; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parquet")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--base", default="69dcf02")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    import pandas as pd

    from clmf.parallel import dask_prepare as NP
    from clmf.parallel import dask_tasks as NT
    from clmf.parallel.dask_backend import _encoder
    from clmf.parallel.partition import balanced_blocks
    OP, OT = base_modules(args.base)
    frames = [pd.read_parquet(f) for f in sorted(glob.glob(f"{args.parquet}/*.parquet"))]
    cols = ("user", "item", "rating")
    sc = NP.merge_scans(*[NP.scan(d, cols) for d in frames])
    (uids, uc), (iids, ic) = NP.ids_and_counts(sc[0]), NP.ids_and_counts(sc[1])
    ue, ie = _encoder(pd.Index(uids)), _encoder(pd.Index(iids))
    n = args.workers
    bu, bi = balanced_blocks(uc, n, 17), balanced_blocks(ic, n, 17)
    ip = {}
    for side, c in (("users", uc), ("items", ic)):
        ip[side] = np.zeros(len(c) + 1, np.int64)
        np.cumsum(c, out=ip[side][1:])
    mine = frames[::n]                       # this worker's partitions

    def blocks(T, pieces):
        """Worker 0's blocks from every partition's pieces."""
        T._block([p[0] for p in pieces], "users", ip["users"], bu[0], bu[1])
        T._block([p[n] for p in pieces], "items", ip["items"], bi[0], bi[1])

    def base():
        """The base commit's stages."""
        t, t0 = {}, time.perf_counter()
        for d in mine:
            for c in cols[:2]:
                OP.unique_ids(d, c)
        t["ids"], t0 = time.perf_counter() - t0, time.perf_counter()
        codes = [OP.encode(d, cols, ue, ie) for d in mine]
        for c in codes:
            OP.tally(c, len(uc), len(ic))
        t["encode_and_counts"], t0 = time.perf_counter() - t0, time.perf_counter()
        for c in codes:
            OP.split(c, bu, bi)
        t["split"] = time.perf_counter() - t0
        pieces = [OP.split(OP.encode(d, cols, ue, ie), bu, bi) for d in frames]
        t0 = time.perf_counter()
        blocks(OT, pieces)
        t["blocks"] = time.perf_counter() - t0
        return t

    def this():
        """This checkout's stages."""
        t, t0 = {}, time.perf_counter()
        for d in mine:
            NP.scan(d, cols)
        t["ids"], t0 = time.perf_counter() - t0, time.perf_counter()
        t["encode_and_counts"] = 0.0
        for d in mine:
            NP.split(d, bu, bi, columns=cols, user_index=ue, item_index=ie)
        t["split"] = time.perf_counter() - t0
        pieces = [NP.split(d, bu, bi, columns=cols, user_index=ue, item_index=ie)
                  for d in frames]
        t0 = time.perf_counter()
        blocks(NT, pieces)
        t["blocks"] = time.perf_counter() - t0
        return t

    res = {"base": [], "this": []}
    for r in range(args.rounds):
        for name, fn in (("base", base), ("this", this))[::1 if r % 2 == 0 else -1]:
            res[name].append(fn())
    print(f"{len(frames)} partitions, {int(uc.sum()):,} ratings, {n} workers: medians of "
          f"{args.rounds} alternating rounds (s)")
    print(f"| stage | base {args.base} | this checkout |")
    print("|---|---|---|")
    for k in list(res["base"][0]) + ["total"]:
        med = {v: float(np.median([sum(r.values()) if k == "total" else r[k] for r in rs]))
               for v, rs in res.items()}
        print(f"| {k} | {med['base']:.3f} | {med['this']:.3f} |")


if __name__ == "__main__":
    main()
