#!/usr/bin/env python3
"""Issue 27 on the GPU, in one bounded, resumable command: implicit feedback at explicit speed,
every f, the selection model's coverage, and the `implicit` library's CUDA ALS side by side.

On the Netflix-shaped synthetic set (the generator's ``netflix`` preset: 480,189 × 17,770, 99M
ratings; ``--scale`` for less), in priority order, each result appended to ``$OUT`` as it comes:

1. ``auto.jsonl`` — per mode (explicit, biased, implicit with ``confidence="alpha*r"``) and f
   (16, 32, 64, 100, 128, 256): a fit with ``variant="auto"`` (the rule and configurations the
   lookup chose), the median s/it after the first iteration and the whole fit's wall time;
   implicit fits also precision@10 on held-out positives (one per sampled user);
2. ``peers.jsonl`` — when ``implicit.gpu`` has CUDA: its ALS at f = 64, 128, 256 on the same
   training data, the same model (alpha, λ, iterations), same timing and precision@10;
3. ``coverage.jsonl`` — per cell without a tuning of its own, a short budgeted tuning run
   (``--tune-budget`` s), then ``auto`` (now ``tuned``) and the leave-one-out choice (the cell's
   tunings left out: what the selection model predicts) timed side by side
   (:func:`clmf.autotune.coverage.measure_cell`); ``tuning.jsonl.gz`` holds the tuning records so
   far (a later run reads them back with ``--resume``).

Cells already in ``$OUT`` or in ``--resume DIR`` (an earlier run's files copied into the repo)
are skipped; no work starts after ``--max-seconds`` (default 540: the whole command stays within
10 minutes). ``report.md`` sums up what is there: s/it per mode and f, implicit ÷ explicit, the
peers' ratio, the coverage table and its leave-one-out check.

On the GPU machine (``../shared/tools/gpu-opencl.sh prepare`` and ``prepare-peers`` here first,
so ``.whl`` travels), from the repository root::

    source .whl/gpu-opencl.sh activate && \\
    python3 scripts/gpu_implicit.py --out $OUT --resume results/bench/gpu-implicit

then copy ``$OUT``'s files into ``results/bench/gpu-implicit/`` and run the same command again
until ``report.md`` says nothing is left. A checkout whose ``clmf.cl_kernels`` is not importable
(no installed wheel) is made importable by symbolic links under ``/tmp/clmf-tree``.
Tested on a CPU at a tiny size (``--scale 0.002 --factors 4,8``: tests/test_coverage.py).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
T0 = time.perf_counter()


def log(msg):
    """Progress on stderr (elapsed seconds first)."""
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def ensure_clmf():
    """Import clmf with its kernels and tuner: the installed one, else the checkout through a
    tree of symbolic links (``clmf/cl_kernels`` → ``cl_kernels``, ``clmf/autotune`` → ``tuner``)."""
    try:
        import clmf.autotune  # noqa: F401
        import clmf.cl_kernels  # noqa: F401
        return
    except ImportError:
        pass
    tree = pathlib.Path("/tmp/clmf-tree")
    pkg = tree / "clmf"
    if tree.exists():
        shutil.rmtree(tree)
    pkg.mkdir(parents=True)
    for e in (REPO / "clmf").iterdir():
        if e.name != "__pycache__":
            (pkg / e.name).symlink_to(e)
    (pkg / "cl_kernels").symlink_to(REPO / "cl_kernels")
    (pkg / "autotune").symlink_to(REPO / "tuner")
    for name in [m for m in sys.modules if m == "clmf" or m.startswith("clmf.")]:
        del sys.modules[name]
    sys.path.insert(0, str(tree))
    import clmf.autotune  # noqa: F401,F811
    import clmf.cl_kernels  # noqa: F401,F811


def parse(argv=None):
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--out", default=os.environ.get("OUT"), help="output directory ($OUT)")
    p.add_argument("--resume", default=None, help="an earlier run's files (read only)")
    p.add_argument("--device", default="gpu")
    p.add_argument("--preset", default="netflix")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--factors", default="16,32,64,100,128,256")
    p.add_argument("--modes", default="explicit,biased,implicit")
    p.add_argument("--peer-factors", default="64,128,256")
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--regularization", type=float, default=0.05)
    p.add_argument("--alpha", type=float, default=2.0)
    p.add_argument("--precision-users", type=int, default=20000,
                   help="users with one held-out positive each (precision@10)")
    p.add_argument("--tune-budget", type=float, default=30.0, help="seconds per tuning run")
    p.add_argument("--max-seconds", type=float, default=540.0)
    p.add_argument("--phases", default="auto,peers,coverage",
                   help="auto, peers, coverage (comma-separated), or report: only report.md "
                        "from the files of --resume and --out, no device")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-up-fits", action="store_true",
                   help="before each timed fit (clmf's and the peer's) a one-iteration fit of "
                        "the same model: its programs built and cached, the GPU libraries "
                        "loaded — whole fits as with a warm program cache")
    return p.parse_args(argv)


# ----- files --------------------------------------------------------------------------------------
def rows_of(a, name):
    """The rows of ``name`` in OUT, or copied there from the resume directory."""
    from clmf.autotune.coverage import read_rows
    dst = pathlib.Path(a.out) / name
    if not dst.is_file() and a.resume and (pathlib.Path(a.resume) / name).is_file():
        shutil.copyfile(pathlib.Path(a.resume) / name, dst)
    return read_rows(dst)


def tuning_db(a, work):
    """The tuning database of the run (in ``work``, read back from OUT's or the resume
    directory's ``tuning.jsonl.gz``)."""
    db = work / "tuning.jsonl"
    for d in (a.out, a.resume):
        src = pathlib.Path(d) / "tuning.jsonl.gz" if d else None
        if src is not None and src.is_file() and not db.is_file():
            db.write_bytes(gzip.decompress(src.read_bytes()))
    return db


def save_db(a, db):
    """OUT's compressed copy of the tuning database (what a later run resumes from)."""
    if db.is_file():
        tmp = pathlib.Path(a.out) / "tuning.jsonl.gz.tmp"
        tmp.write_bytes(gzip.compress(db.read_bytes()))
        tmp.replace(pathlib.Path(a.out) / "tuning.jsonl.gz")


def left(a):
    """Seconds left of ``--max-seconds``."""
    return a.max_seconds - (time.perf_counter() - T0)


# ----- data -------------------------------------------------------------------------------------
def load(a):
    """(training CSR, held-out (users, items) for precision@10, data name): the preset's
    ratings with one random rating per sampled user (≥ 5 ratings) held out."""
    import numpy as np
    import scipy.sparse as sp

    import clmf.data
    t = time.perf_counter()
    data = clmf.data.synthetic(a.preset, scale=a.scale, seed=a.seed)
    R = data.to_csr()
    name = a.preset if a.scale == 1 else f"{a.preset}-x{a.scale:g}"
    rng = np.random.default_rng(a.seed)
    counts = np.diff(R.indptr)
    cand = np.flatnonzero(counts >= 5)
    users = np.sort(rng.choice(cand, size=min(a.precision_users, cand.size), replace=False))
    pick = R.indptr[users] + (rng.random(users.size) * counts[users]).astype(np.int64)
    items = R.indices[pick].copy()
    keep = np.ones(R.nnz, bool)
    keep[pick] = False
    # (the CSR minus one entry of each sampled user: still sorted, no COO round trip)
    left_counts = counts.copy()
    left_counts[users] -= 1
    indptr = np.zeros(R.shape[0] + 1, np.int64)
    np.cumsum(left_counts, out=indptr[1:])
    train = sp.csr_matrix((R.data[keep], R.indices[keep], indptr), shape=R.shape)
    log(f"data {name}: {R.shape[0]} × {R.shape[1]}, {train.nnz} training ratings, "
        f"{users.size} held out ({time.perf_counter() - t:.1f} s)")
    return train, (users, items), name


def precision10(X, Y, train, held):
    """precision@10 of one held-out positive per user (unseen items ranked by X·Yᵀ)."""
    import numpy as np
    users, items = held
    hits = 0
    for b0 in range(0, users.size, 2048):
        ub = users[b0:b0 + 2048]
        S = np.asarray(X, np.float32)[ub] @ np.asarray(Y, np.float32).T
        Rb = train[ub]
        S[np.repeat(np.arange(ub.size), np.diff(Rb.indptr)), Rb.indices] = -np.inf
        top = np.argpartition(-S, 9, axis=1)[:, :10]
        hits += int(np.sum(top == items[b0:b0 + 2048, None]))
    return hits / (10.0 * max(1, users.size))


# ----- phases -----------------------------------------------------------------------------------
def fit_clmf(a, dev, train, f, mode, variant="auto", iterations=None):
    """A clmf fit: (model, whole-fit seconds)."""
    import clmf
    from clmf.autotune.coverage import fit_kwargs
    kw = fit_kwargs(mode, a.alpha)
    if mode == "implicit":
        kw["confidence"] = "alpha*r"        # the implicit library's model, same alpha
    t = time.perf_counter()
    m = clmf.ALS(f, a.regularization, iterations or a.iterations, device=dev, variant=variant,
                 random_state=a.seed, **kw)
    m.fit(train, show_progress=False)
    return m, time.perf_counter() - t


def phase_auto(a, dev, info, train, held, name, out_rows):
    """``auto.jsonl``: variant="auto" fits of every mode and f not yet measured."""
    from clmf.autotune.coverage import append_row
    from clmf.engine.device import device_label
    done = {(r["mode"], r["f"]) for r in out_rows}
    for f in a.factor_list:
        for mode in a.mode_list:
            if (mode, f) in done:
                continue
            if left(a) < 20:
                return False
            if a.warm_up_fits:
                fit_clmf(a, dev, train, f, mode, iterations=1)
            m, whole = fit_clmf(a, dev, train, f, mode)
            secs = [h["seconds"] for h in m.history_]
            row = {"mode": mode, "f": f, "data": name, "device": device_label(info),
                   "driver": info.driver, "s_per_it": statistics.median(secs[1:]),
                   "first_s": secs[0], "whole_s": whole, "setup_s": m.timings_["setup"],
                   "warm_up_fit": bool(a.warm_up_fits),
                   "iterations": a.iterations,
                   "rule": {s: c.rule for s, c in m.config_.items()},
                   "config": {s: str(c.config) for s, c in m.config_.items()},
                   "reason": m.config_["users"].reason[:400]}
            if mode == "implicit":
                row["precision_at_10"] = precision10(m.user_factors_, m.item_factors_, train,
                                                     held)
            append_row(pathlib.Path(a.out) / "auto.jsonl", row)
            out_rows.append(row)
            log(f"auto {mode} f={f}: {row['s_per_it']:.4f} s/it, whole {whole:.2f} s "
                f"({row['rule']['users']}: {row['config']['users']})")
    return True


def phase_peers(a, train, held, name, out_rows):
    """``peers.jsonl``: the implicit library's CUDA ALS at the peer factors (skipped with a
    row saying why when it has no CUDA)."""
    from clmf.autotune.coverage import append_row
    path = pathlib.Path(a.out) / "peers.jsonl"
    try:
        import implicit
        import implicit.gpu
        cuda = bool(implicit.gpu.HAS_CUDA)
    except Exception as e:            # not installed, or its CUDA libraries missing
        cuda, why = False, f"{type(e).__name__}: {e}"
    else:
        why = "implicit.gpu.HAS_CUDA is False"
    if not cuda:
        if not any(r.get("status") == "skipped" for r in out_rows):
            row = {"system": "implicit", "status": "skipped", "note": why[:300]}
            append_row(path, row)
            out_rows.append(row)
        log(f"peers skipped: {why}")
        return True
    from implicit.gpu.als import AlternatingLeastSquares
    done = {r["f"] for r in out_rows if r.get("status") == "ok"}
    for f in a.peer_list:
        if f in done:
            continue
        if left(a) < 40:
            return False
        # implicit 0.7.3's GPU fit ignores its alpha (its CPU fit scales the data by it): the
        # confidences alpha·r are given as the data, alpha = 1 (the scaling inside the timing)
        if a.warm_up_fits:
            AlternatingLeastSquares(factors=f, regularization=a.regularization, alpha=1.0,
                                    iterations=1, calculate_training_loss=False,
                                    random_state=a.seed).fit(train * a.alpha,
                                                             show_progress=False)
        model = AlternatingLeastSquares(factors=f, regularization=a.regularization, alpha=1.0,
                                        iterations=a.iterations, calculate_training_loss=False,
                                        random_state=a.seed)
        secs = []
        t = time.perf_counter()
        model.fit(train * a.alpha, show_progress=False,
                  callback=lambda it, el, loss: secs.append(el))
        whole = time.perf_counter() - t
        X, Y = model.user_factors.to_numpy(), model.item_factors.to_numpy()
        row = {"system": f"implicit {implicit.__version__} (GPU)", "status": "ok", "f": f,
               "data": name, "s_per_it": statistics.median(secs[1:]) if len(secs) > 1 else None,
               "whole_s": whole, "iterations": a.iterations,
               "warm_up_fit": bool(a.warm_up_fits),
               "precision_at_10": precision10(X, Y, train, held)}
        append_row(path, row)
        out_rows.append(row)
        log(f"implicit GPU f={f}: {row['s_per_it']} s/it, whole {whole:.2f} s, "
            f"p@10 {row['precision_at_10']:.4f}")
    return True


def coverage_order(a):
    """The coverage cells, most wanted first: implicit feedback before explicit before biased
    (the issue's goals), and f = 64, 128, 256 (the peers' f), then 16, 32, 100, then the rest."""
    first = [64, 128, 256, 16, 32, 100]
    fs = sorted(a.factor_list, key=lambda f: (first.index(f) if f in first else len(first), f))
    modes = sorted(a.mode_list, key=lambda m: ("implicit", "explicit", "biased").index(m)
                   if m in ("implicit", "explicit", "biased") else 3)
    return [(m, f) for m in modes for f in fs]


def phase_coverage(a, dev, train, name, db, work, out_rows):
    """``coverage.jsonl``: tune each cell that has no tuning (short budget), then time auto
    and the leave-one-out choice side by side."""
    from clmf.autotune import coverage as C
    for mode, f in coverage_order(a):
        cell = C.Cell(dev, train, name, f, mode, a.alpha)
        if C.done(out_rows, cell):
            continue
        # a tuning run spends its budget plus calibration, anchors and the final showdown on
        # the whole data; then three fits
        need = (a.tune_budget * 3 + 90) if not C.cell_runs(cell) else 60
        if left(a) < need:
            return False
        log(f"coverage {mode} f={f} (tuning first: {not C.cell_runs(cell)})")
        row = C.measure_cell(cell, "missing", db, a.tune_budget, iterations=a.iterations,
                             rounds=1, state_dir=work / "tune-state")
        C.append_row(pathlib.Path(a.out) / "coverage.jsonl", row)
        out_rows.append(row)
        save_db(a, db)
        log(f"  auto {row.get('auto_s_per_it')} ({row.get('auto_rule')}), loo "
            f"{row.get('loo_s_per_it')} ({row.get('loo_rule')}), best "
            f"{row.get('best_s_per_it')}")
    return True


def report(a, meta, auto, peers, cov, complete):
    """``report.md``: the mode × f table with implicit ÷ explicit, the peers' ratios, the
    coverage table and its leave-one-out check."""
    from clmf.autotune import coverage as C
    by = {(r["mode"], r["f"]): r for r in auto}
    L = [f"# Implicit feedback at explicit speed on the GPU (issue 27) — {meta['data']}", "",
         f"Device: {meta['device']} (driver {meta['driver']}); {meta['date']}; commit "
         f"{meta['commit']}.", "", f"Command: `{meta['command']}`", "",
         "" if complete else "**Incomplete: run the command again (with `--resume`).**", "",
         "## variant=\"auto\": median s/it after the first iteration (whole fit s)", "",
         "| f | explicit | biased | implicit (alpha·r) | implicit ÷ explicit | p@10 | rule "
         "(implicit) |", "|---|---|---|---|---|---|---|"]

    def cell(m, f):
        r = by.get((m, f))
        return "—" if r is None else f"{r['s_per_it']:.4f} ({r['whole_s']:.1f})"
    for f in a.factor_list:
        e, i = by.get(("explicit", f)), by.get(("implicit", f))
        ratio = f"{i['s_per_it'] / e['s_per_it']:.2f}" if e and i else "—"
        p10 = f"{i['precision_at_10']:.4f}" if i and "precision_at_10" in i else "—"
        rule = i["rule"]["users"] if i else "—"
        L.append(f"| {f} | {cell('explicit', f)} | {cell('biased', f)} | {cell('implicit', f)} "
                 f"| {ratio} | {p10} | {rule} |")
    ok = [p for p in peers if p.get("status") == "ok"]
    L += ["", "## The implicit library's CUDA ALS, same data and model", ""]
    if not ok:
        L.append("; ".join(p.get("note", "") for p in peers) or "not run yet")
    else:
        L += ["| f | implicit s/it (whole s) | p@10 | clmf s/it (whole s) | p@10 | "
              "implicit ÷ clmf (s/it) | (whole fit) |", "|---|---|---|---|---|---|---|"]
        for p in ok:
            c = by.get(("implicit", p["f"]))
            if c is None:
                continue
            L.append(f"| {p['f']} | {p['s_per_it']:.4f} ({p['whole_s']:.1f}) | "
                     f"{p['precision_at_10']:.4f} | {c['s_per_it']:.4f} ({c['whole_s']:.1f}) | "
                     f"{c['precision_at_10']:.4f} | {p['s_per_it'] / c['s_per_it']:.2f} | "
                     f"{p['whole_s'] / c['whole_s']:.2f} |")
    L += ["", C.markdown(cov, "Coverage (tuned cells; leave-one-out = the selection model)")
          .replace("# Coverage", "## Coverage", 1)]
    (pathlib.Path(a.out) / "report.md").write_text("\n".join(L) + "\n")


def main(argv=None):
    """Run the phases within the time budget; write the report."""
    global T0
    T0 = time.perf_counter()
    a = parse(argv)
    if not a.out:
        sys.exit("give --out DIR (or set OUT)")
    ensure_clmf()
    import warnings
    warnings.simplefilter("ignore")
    from clmf.engine.device import device_info, device_label, select_device
    from clmf.tuning.database import clmf_commit, now
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="gpu-implicit-"))    # tuning db and journals
    a.factor_list = [int(x) for x in a.factors.split(",")]
    a.mode_list = [m for m in a.modes.split(",") if m]
    a.peer_list = [int(x) for x in a.peer_factors.split(",") if x]
    if a.phases == "report":         # no device: the report of the files in --resume / --out
        auto, peers, cov = rows_of(a, "auto.jsonl"), rows_of(a, "peers.jsonl"), \
            rows_of(a, "coverage.jsonl")
        src = pathlib.Path(a.resume or a.out) / "meta.json"
        report(a, json.loads(src.read_text()), auto, peers, cov, True)
        return 0
    db = tuning_db(a, work)
    os.environ["CLMF_TUNING_DB"] = str(db)
    dev = select_device(a.device)
    info = device_info(dev)
    log(f"device {info}")
    phases = a.phases.split(",")
    auto, peers, cov = rows_of(a, "auto.jsonl"), rows_of(a, "peers.jsonl"), \
        rows_of(a, "coverage.jsonl")
    train, held, name = load(a)
    meta = {"device": device_label(info), "driver": info.driver, "date": now(),
            "commit": clmf_commit(), "data": f"{name} ({train.shape[0]} × {train.shape[1]}, "
                                               f"{train.nnz} training ratings)",
            "command": "python3 scripts/gpu_implicit.py " + " ".join(
                sys.argv[1:] if argv is None else argv)}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    complete = True
    if "auto" in phases:
        complete &= phase_auto(a, dev, info, train, held, name, auto)
    if "peers" in phases and complete:
        complete &= phase_peers(a, train, held, name, peers)
    if "coverage" in phases and complete:
        complete &= phase_coverage(a, dev, train, name, db, work, cov)
    save_db(a, db)
    report(a, meta, auto, peers, cov, complete)
    log(f"done ({'complete' if complete else 'time budget reached: run again with --resume'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
