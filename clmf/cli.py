"""The ``clmf`` command line.

Commands: ``devices``, ``demo``, ``source`` and the user's workflow ``fit`` → ``recommend`` /
``eval``::

    clmf fit ml-latest-small/ratings.csv -f 32 -i 10 --output model.npz
    clmf recommend model.npz --user 1 -n 10 --titles ml-latest-small/movies.csv \
        --train ml-latest-small/ratings.csv
    clmf eval model.npz ml-100k --split ua --k 10

``--json`` (fit, eval, recommend, bench) writes one JSON document on stdout and everything
else (progress, logs, the human-readable report) on stderr. Exit status: 0 on success, 1 when
the work fails (unreadable data, no OpenCL device, a singular system, ...), 2 for usage errors
(bad or missing arguments, from argparse or the commands' own checks); the message is printed as
``clmf <command>: error: ...`` on stderr (and, with ``--json``, as ``{"error": ...}`` on stdout).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import math
import sys
import time

import numpy as np

from . import cli_workflow as workflow
from .argtypes import positive_float, positive_int
from .cli_workflow import UsageError

log = logging.getLogger("clmf.cli")


class _ArgumentError(SystemExit):
    """argparse's own usage error (exit status 2), with its message kept for ``--json``."""

    def __init__(self, message, prog):
        super().__init__(2)
        self.message, self.prog = message, prog


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors keep their message (for the ``--json`` document)
    instead of only printing it."""

    def error(self, message):
        """Print the usage and the error on stderr, as argparse does, then exit with status 2."""
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise _ArgumentError(message, self.prog)


_Formatter = workflow.HelpFormatter        # --help shows every default once
# `clmf demo`'s model, the ALS-WR paper's MovieLens one; the README quotes it (tests/test_cli.py)
DEMO_MODEL = {"factors": 10, "regularization": 0.15, "iterations": 10}


def _als_defaults():
    """:class:`clmf.ALS`'s parameter defaults (the CLI's model defaults are the library's)."""
    from .model import ALS
    return {k: p.default for k, p in inspect.signature(ALS.__init__).parameters.items()
            if k != "self"}


def _add_model_args(p, factors=None, regularization=None, iterations=None):
    """Model options; defaults are clmf.ALS's unless a command (demo) sets its own."""
    d = _als_defaults()
    p.add_argument("--factors", "-f", type=int, default=factors or d["factors"],
                   help="latent factors f")
    p.add_argument("--regularization", "--lambda", dest="regularization", type=float,
                   default=d["regularization"] if regularization is None else regularization,
                   help="λ (weighted by the row's rating count unless --unweighted)")
    p.add_argument("--iterations", "-i", type=int, default=iterations or d["iterations"],
                   help="ALS iterations")
    p.add_argument("--unweighted", action="store_true",
                   help="plain λ·I instead of λ·n·I (implicit feedback: always plain)")
    p.add_argument("--device", "-d", default=d["device"],
                   help="auto | cpu | gpu | P:D | name substring")
    p.add_argument("--variant", default=d["variant"], help="kernel variant name or 'auto' (tuned)")
    p.add_argument("--solver", default=d["solver"], choices=["auto", "cholesky", "cg", "fusedcg"],
                   help="S3 solver ('auto': the tuned choice)")
    p.add_argument("--storage", default=d["storage"], choices=["float32", "float16"],
                   help="factor storage on the device (None: the variant's, float32)")
    p.add_argument("--seed", type=int, default=0,
                   help="random_state of the start factors (and of the random holdout)")
    p.add_argument("--feedback", default=d["feedback"], choices=["explicit", "implicit"],
                   help="explicit ratings or implicit feedback (counts/strengths)")
    p.add_argument("--alpha", type=float, default=d["alpha"],
                   help="implicit feedback: confidence scale")
    p.add_argument("--confidence", default=d["confidence"], choices=["1+alpha*r", "alpha*r"],
                   help="implicit feedback: confidence c of an entry r (1+alpha*r: Hu et al. and "
                        "Spark; alpha*r: the implicit library)")
    p.add_argument("--biases", action="store_true", help="explicit feedback: learn user/item biases")


def _checked_model(args):
    """The command's :class:`clmf.ALS`, its parameters checked first: bad model options
    (``-f 0``, a bad variant, λ < 0, ...) are usage errors (exit status 2)."""
    from .data.validation import check_params
    model = _model_from(args)
    try:
        check_params(model)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None
    return model


def _model_from(args):
    import clmf
    return clmf.ALS(factors=args.factors, regularization=args.regularization,
                    iterations=args.iterations,
                    weighted_regularization=False if args.unweighted else None,
                    solver=args.solver, variant=args.variant, device=args.device,
                    random_state=args.seed, storage=args.storage, feedback=args.feedback,
                    alpha=args.alpha, confidence=args.confidence, biases=args.biases)


def _choices_json(config):
    return {side: {"config": str(ch.config), "rule": ch.rule, "reason": ch.reason}
            for side, ch in (config or {}).items()}


def _jsonable(obj):
    """``obj`` with NumPy scalars/arrays as Python values and non-finite floats as None."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def cmd_devices(args):
    import clmf
    for d in clmf.devices():
        print(d)
    return 0


def _load_train_test(path, seed, test_fraction=0.1):
    """(train, test, description) from a path or the embedded default."""
    from . import data
    from .data import splits
    if path is None:
        train, test = data.default()
        return train, test, "embedded synthetic MovieLens-100K-shaped set (seed 42), 10% held out"
    import os
    if os.path.isdir(path) or os.path.basename(path) in ("ua.base", "ub.base"):
        d = path if os.path.isdir(path) else os.path.dirname(path)
        train, test = data.load_movielens_100k_split(d, split="ua")
        return train, test, f"{d} (official ua.base/ua.test split)"
    ratings = data.load(path)
    train, test = splits.random_holdout(ratings, test_fraction=test_fraction, random_state=seed)
    return train, test, f"{path} ({int(test_fraction * 100)}% random holdout, seed {seed})"


def cmd_demo(args):
    model = _checked_model(args)
    train, test, what = _load_train_test(args.data, args.seed)
    print(f"data: {what}: {train.shape[0]} users × {train.shape[1]} items, "
          f"{len(train)} train / {len(test)} test ratings")

    def show(it, elapsed, metrics):
        print(workflow.iteration_line(it, metrics))

    t0 = time.perf_counter()
    model.fit(train, validation=test, callback=show, show_progress=False)
    total = time.perf_counter() - t0
    print(f"device: {model.device_}")
    print(f"kernels: users {model.config_['users']}")
    print(f"         items {model.config_['items']}")
    rmse, ranking = workflow.test_summary(model, train, test)
    final = (f"final test RMSE {rmse:.4f}" if ranking is None else
             f"final test precision@{workflow.RANKING_K} {ranking['precision']:.4f}")
    print(f"{final} after {len(model.history_)} iterations "
          f"(f={args.factors}, λ={args.regularization}); {total:.2f} s in all")
    return 0


def cmd_source(args):
    from .engine.config import KernelConfig
    from .engine.kernels import render_als
    try:
        config = KernelConfig.parse(args.variant)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None
    print(render_als(config, args.factors))
    return 0


def cmd_bench(args):
    """``clmf bench``: see :mod:`clmf.bench` (CSV, markdown and plots under results/bench/)."""
    from .bench import runner
    if args.iterations < 1:
        raise UsageError("--iterations must be ≥ 1")
    for item in args.peer_max_nnz:
        k, _, v = item.partition("=")
        try:
            float(v)
        except ValueError:
            raise UsageError(f"--peer-max-nnz wants PEER=N, not {item!r}") from None
    from .engine.config import KernelConfig
    for v in args.variant or ():
        if v != "auto":
            try:
                KernelConfig.parse(v)
            except (ValueError, TypeError) as e:
                raise UsageError(f"--variant {v!r}: {e}") from None
    status = runner.cmd_bench(args, sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "bench"
                              else None)
    args.result = {"command": "bench", "files": getattr(args, "bench_files", None),
                   "rows": getattr(args, "bench_rows", None)}
    return status


# ----- the workflow: fit → recommend / eval --------------------------------------------------
def _check_data_args(args):
    """DATA and --preset: exactly one, and a known preset (usage errors)."""
    from . import data
    presets = sorted(data.list_presets())
    if args.preset is not None and args.data is not None:
        raise UsageError("give either DATA or --preset, not both")
    if args.preset is None and args.data is None:
        raise UsageError("give a ratings file or directory (DATA) or --preset NAME "
                         f"(one of {', '.join(presets)})")
    if args.preset is not None and args.preset not in presets:
        raise UsageError(f"unknown preset {args.preset!r}; choose from {presets}")


def _fit_data(args):
    """(train, test or None, description) for ``clmf fit``."""
    import os

    from . import data
    from .data import splits
    _check_data_args(args)
    if args.preset is not None:
        ratings = data.synthetic(args.preset, scale=args.scale, seed=args.seed)
        what = f"synthetic preset {args.preset!r} (scale {args.scale:g}, seed {args.seed})"
    elif args.split is not None:
        d = args.data if os.path.isdir(args.data) else os.path.dirname(args.data) or "."
        train, test = data.load_movielens_100k_split(d, split=args.split)
        return train, test, f"{d} (official {args.split}.base/{args.split}.test split)"
    else:
        ratings = data.load(args.data)
        what = str(args.data)
    f = args.test_fraction
    if not 0 <= f < 1:
        raise UsageError(f"--test-fraction must be in [0, 1), not {f}")
    if f == 0:
        return ratings, None, f"{what}, no test set"
    train, test = splits.random_holdout(ratings, test_fraction=f, random_state=args.seed)
    return train, test, f"{what}, {f:g} random holdout (seed {args.seed})"


def cmd_fit(args):
    """``clmf fit DATA|--preset NAME``: fit, print per-iteration RMSE, optionally save.

    Parameters
    ----------
    args : argparse.Namespace from :func:`build_parser`

    Returns
    -------
    int — the exit status (0)

    Examples
    --------
    >>> main(["fit", "ratings.csv", "-f", "16", "-i", "5", "-o", "model.npz"])  # doctest: +SKIP
    0
    """
    from tqdm.auto import tqdm

    model = _checked_model(args)             # bad model options are usage errors (exit 2)
    train, test, what = _fit_data(args)
    rounds = args.early_stopping_rounds
    if rounds is not None and (rounds < 1 or test is None):
        raise UsageError("--early-stopping-rounds needs N ≥ 1 and a test set to watch "
                         "(--test-fraction > 0 or --split)")
    print(f"data: {what}: {train.shape[0]} users × {train.shape[1]} items, {len(train)} train"
          + (f" / {len(test)} test" if test is not None else "") + " ratings")

    def show(it, elapsed, metrics):
        tqdm.write(workflow.iteration_line(it, metrics))

    t0 = time.perf_counter()
    model.fit(train, validation=test, callback=show, show_progress=not args.no_progress,
              early_stopping_rounds=rounds)
    total = time.perf_counter() - t0
    print(f"device: {model.device_}")
    print(f"kernels: users {model.config_['users']}")
    print(f"         items {model.config_['items']}")
    test_rmse, ranking = workflow.fit_summary(model, args, train, test, total)
    if args.output:
        model.save(args.output)
        print(f"model written to {args.output}")
        holdout = workflow.save_holdout(args.output, vars(args), test)
        if holdout:
            print(f"holdout recorded in {holdout} ('clmf eval {args.output}' evaluates on it)")
    params = model.get_params()
    params["dtype"] = np.dtype(params["dtype"]).name
    args.result = {"command": "fit", "data": what, "users": train.shape[0],
                   "items": train.shape[1], "train_ratings": len(train),
                   "test_ratings": len(test) if test is not None else 0, "params": params,
                   "device": model.device_, "config": _choices_json(model.config_),
                   "history": model.history_, "best_iteration": model.best_iteration_,
                   "seconds": total, "test_rmse": test_rmse, "test_ranking": ranking,
                   "output": args.output}
    return 0


def _eval_data(args):
    """``(test, train or None, description)`` of ``clmf eval``: DATA (with ``--split``, its
    official split) or, without DATA, the holdout ``clmf fit`` recorded beside the model."""
    import os

    from . import data
    if args.data is None:
        if args.split is not None or args.train is not None:
            raise UsageError("--split and --train need DATA")
        try:
            return workflow.load_holdout(args.model, lambda f: _fit_data(argparse.Namespace(**f)))
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
    if args.split is not None:
        d = args.data if os.path.isdir(args.data) else os.path.dirname(args.data) or "."
        train, test = data.load_movielens_100k_split(d, split=args.split)
        if args.train is not None:
            train = data.load(args.train)
        return test, train, f"{d}/{args.split}.test"
    test = data.load(args.data)
    train = data.load(args.train) if args.train is not None else None
    return test, train, str(args.data)


def cmd_eval(args):
    """``clmf eval MODEL DATA``: RMSE/MAE and precision/recall/MAP/nDCG@k of a saved model.

    Ratings of users or items unknown to the model are skipped (and counted). The ranking
    recommends for every user of DATA, leaving out the items of ``--train``.

    Parameters
    ----------
    args : argparse.Namespace from :func:`build_parser`

    Returns
    -------
    int — the exit status (0)

    Examples
    --------
    >>> main(["eval", "model.npz", "test.csv", "--train", "train.csv"])  # doctest: +SKIP
    0
    """
    import scipy.sparse as sp

    import clmf

    from . import metrics
    model = clmf.load(args.model)
    test, train, what = _eval_data(args)
    u, i, r, dropped = workflow.to_model_index(model, test)
    if u.size == 0:
        raise ValueError(f"{what}: none of its users/items are known to the model")
    print(f"data: {what}: {len(test)} ratings" +
          (f" ({dropped} with users/items unknown to the model skipped)" if dropped else ""))
    pred = model.predict(u, i)
    result = {"command": "eval", "model": args.model, "data": what, "ratings": len(test),
              "skipped": dropped, "rmse": metrics.rmse(r, pred), "mae": metrics.mae(r, pred)}
    print(f"RMSE  {result['rmse']:.4f}")
    print(f"MAE   {result['mae']:.4f}")
    n_items = model.item_factors_.shape[0]
    users, rows = np.unique(u, return_inverse=True)
    # all test ratings are relevant unless a threshold is given (then it needs the values)
    rel_data = r.astype(np.float32) if args.relevance_threshold is not None else \
        np.ones(r.size, np.float32)
    relevant = sp.csr_matrix((rel_data, (rows, i)), shape=(users.size, n_items))
    seen = None
    if train is not None:
        tu, ti, tr, _ = workflow.to_model_index(model, train)
        seen = sp.csr_matrix((np.ones(tu.size, np.float32), (tu, ti)),
                             shape=(model.user_factors_.shape[0], n_items))
        seen = seen[users]
    else:
        print("note: no --train data: training items are not filtered from the recommendations")
    kmax = max(args.k)
    ids, _ = model.recommend(users, seen, N=kmax, filter_already_liked_items=seen is not None)
    res = metrics.evaluate_ranking(ids, relevant, ks=args.k,
                                   relevance_threshold=args.relevance_threshold)
    rel = "all test ratings relevant" if args.relevance_threshold is None else \
        f"test ratings ≥ {args.relevance_threshold:g} relevant"
    print(f"ranking over {users.size} users ({rel}):")
    for name, value in res.items():
        print(f"{name:<14s}{value:.4f}")
    args.result = dict(result, users=int(users.size), train=args.train,
                       relevance_threshold=args.relevance_threshold, ranking=res)
    return 0


def cmd_recommend(args):
    """``clmf recommend MODEL --user RAW_ID``: print rank, item id, score (and title).

    Parameters
    ----------
    args : argparse.Namespace from :func:`build_parser`

    Returns
    -------
    int — the exit status (0)

    Examples
    --------
    >>> main(["recommend", "model.npz", "--user", "1", "--titles", "movies.csv"])  # doctest: +SKIP
    0
    """
    import clmf

    from . import data
    if args.all == (args.user is not None):
        raise UsageError("give either --user RAW_ID or --all (with --out FILE)")
    if args.all:
        return workflow.recommend_all(args)
    if args.out is not None:
        raise UsageError("--out writes the recommendations of --all")
    model = clmf.load(args.model)
    train = data.load(args.train) if args.train is not None else None
    ids, scores = model.recommend_raw(args.user, train, N=args.n,
                                      filter_already_liked_items=train is not None)
    titles = workflow.titles_for(args.titles, ids.tolist()) if args.titles else None
    print(f"top {len(ids)} for user {args.user}"
          + (" (items already rated in the --train data left out)" if train is not None else ""))
    head = f"{'rank':>4}  {'item':>10}  {'score':>8}"
    print(head + ("  title" if titles is not None else ""))
    rows = []
    for rank, (item, score) in enumerate(zip(ids.tolist(), scores.tolist()), 1):
        line = f"{rank:>4}  {str(item):>10}  {score:8.4f}"
        row = {"rank": rank, "item": item, "score": score}
        if titles is not None:
            row["title"] = titles.get(item)
            line += f"  {titles.get(item, '?')}"
        rows.append(row)
        print(line)
    args.result = {"command": "recommend", "model": args.model, "user": args.user,
                   "filtered_by": args.train, "items": rows}
    return 0


def cmd_tune(args):
    """``clmf tune DATA|--preset NAME``: tune the kernels for a device and store the best.

    For each f of ``--factors`` it searches the configuration space (``--space``) with the
    ``--strategy`` (``budgeted``: ``--budget`` seconds per f), appends every measurement and the
    best configuration per side to the database (``--db``, default the per-user database that
    ``ALS(variant="auto")`` reads), and writes a markdown report with a plot per f to ``--report``.
    ``--feedback implicit --alpha A`` tunes implicit-feedback ALS and ``--biases`` explicit ALS with
    biases (what ``ALS(feedback=..., biases=...)`` then looks up first). ``--sample full`` times
    whole half-steps instead of a checked sample of rows. What ``variant="auto"`` ran before (the
    incumbent) is measured first and re-timed side by side with the winner at the end; the record
    keeps the faster, and the output says "× vs what you had" first, "× vs the plain batch
    variant" second.
    The tuner (package ``clmf.autotune``) is imported only here.

    Examples
    --------
    >>> main(["tune", "ml-100k", "--factors", "10,50", "--budget", "120"])  # doctest: +SKIP
    0
    >>> main(["tune", "hetrec2011-lastfm-2k", "--log1p", "--feedback", "implicit",
    ...       "--alpha", "2", "--factors", "64"])                          # doctest: +SKIP
    0
    """
    if args.data is None or args.preset is not None:
        _check_data_args(args)
    try:
        from clmf import autotune
    except ImportError as e:
        raise RuntimeError(f"the tuner is not installed with this clmf ({e})") from None
    try:
        factors = [int(x) for x in str(args.factors).split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--factors must be comma-separated integers, not {args.factors!r}") \
            from None
    if not factors or min(factors) < 1:
        raise UsageError("--factors needs at least one f ≥ 1")
    if args.budget is not None and args.budget <= 0:
        raise UsageError("--budget must be positive (seconds)")
    if args.max_wall is not None and args.max_wall <= 0:
        raise UsageError("--max-wall must be positive (seconds)")
    if args.biases and args.feedback == "implicit":
        raise UsageError("--biases is for explicit feedback")
    if args.feedback == "implicit" and not args.alpha > 0:
        raise UsageError("--alpha must be positive")
    if args.sample_tol < 0:
        raise UsageError("--sample-tol must be ≥ 0 (0: no check)")
    if args.sample not in ("auto", "full"):
        try:
            frac = float(args.sample)
        except ValueError:
            frac = None
        if frac is None or not 0 < frac <= 1:
            raise UsageError(f"--sample must be 'auto', 'full' or a fraction in (0, 1], not "
                             f"{args.sample!r}")
    mode = "implicit" if args.feedback == "implicit" else "biased" if args.biases else "explicit"
    R, name = autotune.load_data(args.data, args.preset, args.scale, args.seed, log1p=args.log1p)
    print(f"data: {name}: {R.shape[0]} users × {R.shape[1]} items, {R.nnz} ratings"
          + ("" if mode == "explicit" else f"; mode {mode}"
             + (f", alpha {args.alpha:g}" if mode == "implicit" else "")))
    solvers = [s.strip() for s in args.solvers.split(",")] if args.solvers else None
    summaries = autotune.tune(R, factors=factors, device=args.device, strategy=args.strategy,
                           budget=args.budget, space=args.space, db=args.db,
                           report_dir=args.report, dataset=name, storage=args.storage,
                           seed=args.seed, solvers=solvers, sample_time=args.sample_time,
                           progress=not args.no_progress, resume=not args.fresh, mode=mode,
                           alpha=args.alpha, sample=args.sample, sample_tol=args.sample_tol,
                           check_time=args.check_time, starts=args.start,
                           max_wall=args.max_wall)
    for s in summaries:
        b = s.get("best")
        head = f"f={s['f']}: {s['evaluated']} configurations in {s['spent_seconds']:.0f} s"
        if s.get("wall_limited"):
            head += f" (search cut at --max-wall {s['max_wall']:g} s)"
        if b is None:
            print(head + ": no configuration ran correctly")
            continue
        print(head + ": " + _tune_outcome(s))
        print(f"  users {b['configs']['users']}")
        print(f"  items {b['configs']['items']}")
        for side, c in sorted(((s.get("calibration") or {}).get("sides") or {}).items()):
            if c.get("checked"):
                print(f"  sample check {side}: {c['steps'][0]['rows']} → {c['final']['rows']} rows, "
                      f"estimate / reference {c['ratio']:.2f}"
                      + (" (grown)" if c.get("grown") else ""))
        if s.get("report"):
            print(f"  report {s['report']}")
    print(f"database: {summaries[0]['database'] if summaries else args.db}")
    return 0


def _tune_outcome(s):
    """One line of a tuning run's outcome: × vs what the user had first, × vs plain batch second."""
    b, inc, fin = s["best"], s.get("incumbent") or {}, s.get("final")
    if fin:
        t, i = fin[b["chosen"]]["iteration_seconds"], fin["incumbent"]["iteration_seconds"]
        cfg = inc["configs"]["users"] + ("" if inc["configs"]["items"] == inc["configs"]["users"]
                                         else " | " + inc["configs"]["items"])
        out = (f"{t:.4g} s/it, ×{i / t:.2f} vs what you had ({inc['rule']}, {cfg}: {i:.4g} s/it, "
               "side by side on " + ("the whole data" if all(fin["whole_side"].values())
                                     else "a large sample") + ")")
        if not b["beats_incumbent"]:
            out += "; the search found nothing faster: kept what you had"
    else:
        out = f"best iteration {b['iteration_seconds']:.4g} s (estimated)"
    if b.get("speedup_vs_baseline"):
        out += f"; ×{b['speedup_vs_baseline']:.2f} vs the plain batch variant (estimated)"
    return out


def build_parser():
    p = _Parser(prog="clmf", formatter_class=_Formatter,
                                description="Autotuned ALS matrix factorization on OpenCL. Exit "
                                            "status: 0 ok, 1 the work failed, 2 usage error.")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="more logging on stderr (-v info, -vv debug)")
    sub = p.add_subparsers(dest="command", required=True)
    _add = sub.add_parser

    def add_parser(name, json_output=False, **kw):       # every command shows its defaults
        q = _add(name, formatter_class=_Formatter, **kw)
        if json_output:
            q.add_argument("--json", action="store_true",
                           help="write one JSON document with the results on stdout (everything "
                                "else goes to stderr)")
        return q
    sub.add_parser = add_parser
    s = sub.add_parser("devices", help="list OpenCL devices and the properties the kernels use")
    s.set_defaults(func=cmd_devices)
    s = sub.add_parser("demo", help="fit the embedded default data set (or --data PATH) and print "
                                    "train/test RMSE per iteration")
    s.add_argument("--data", default=None, help="a MovieLens file or directory instead of the "
                                                "embedded synthetic set")
    _add_model_args(s, **DEMO_MODEL)
    s.set_defaults(func=cmd_demo)
    s = sub.add_parser("source", help="print the rendered OpenCL source of a configuration")
    s.add_argument("variant", nargs="?", default="batch")
    s.add_argument("--factors", "-f", type=positive_int, default=32)
    s.set_defaults(func=cmd_source)
    s = sub.add_parser("bench", json_output=True,
                       help="benchmark clmf against its peers (NumPy reference, LensKit, Spark, "
                            "implicit, PyTorch) and the device's measured peak; writes "
                            "results/bench/<device>/")
    from .bench.runner import configure_parser as _bench_args
    _bench_args(s)
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("fit", json_output=True,
                       help="fit a model to a ratings file (or a synthetic preset), print "
                            "train/test RMSE per iteration, optionally save it")
    s.add_argument("data", nargs="?", default=None, metavar="DATA",
                   help="ratings file or directory (MovieLens, Netflix, CSV/TSV triples, ...)")
    s.add_argument("--preset", default=None, help="fit synthetic data in the shape of this preset "
                                                  "(e.g. movielens-100k) instead of DATA")
    s.add_argument("--scale", type=positive_float, default=1.0,
                   help="scale of the --preset data")
    s.add_argument("--test-fraction", type=float, default=0.1,
                   help="random holdout fraction scored each iteration (0: none)")
    s.add_argument("--split", default=None, help="official MovieLens-100K split of the DATA "
                                                 "directory (ua, ub, u1..u5) instead of a holdout")
    s.add_argument("--output", "-o", default=None,
                   help="write the fitted model here (.npz); with a test set, the holdout is "
                        "recorded beside it (MODEL.holdout.json) for 'clmf eval MODEL'")
    s.add_argument("--early-stopping-rounds", type=int, default=None, metavar="N",
                   help="stop when the test RMSE (implicit: precision@10) has not improved for N "
                        "iterations; keep the best iteration's factors (needs a test set)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_model_args(s)
    s.set_defaults(func=cmd_fit)

    s = sub.add_parser("eval", json_output=True,
                       help="RMSE/MAE and precision/recall/MAP/nDCG@k of a saved model on a "
                            "ratings file")
    s.add_argument("model", metavar="MODEL", help="a model saved by 'clmf fit --output'")
    s.add_argument("data", metavar="DATA", nargs="?", default=None,
                   help="held-out ratings file (or the ml-100k directory with --split); default: "
                        "the holdout 'clmf fit -o MODEL' recorded in MODEL.holdout.json")
    s.add_argument("--split", default=None, help="evaluate on <split>.test of the DATA directory "
                                                 "(its <split>.base filters seen items)")
    s.add_argument("--train", default=None, help="training ratings: their items are left out of "
                                                 "each user's ranking")
    s.add_argument("--k", type=positive_int, nargs="+", default=[10],
                   help="ranking cut-off(s)")
    s.add_argument("--relevance-threshold", type=float, default=None,
                   help="only test ratings ≥ this are relevant (default: all)")
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("recommend", json_output=True,
                       help="top-N items for a user of a saved model")
    s.add_argument("model", metavar="MODEL", help="a model saved by 'clmf fit --output'")
    s.add_argument("--user", default=None, help="the user's raw id, as in the training data")
    s.add_argument("--all", action="store_true", help="every user of the model (with --out)")
    s.add_argument("--out", default=None, help="with --all: write FILE.parquet or FILE.csv "
                                               "(user, rank, item, score), streamed in batches")
    s.add_argument("--batch-size", type=positive_int, default=None,
                   help="with --all: users per batch (default: the device's memory plan)")
    s.add_argument("-n", type=positive_int, default=10, help="number of items")
    s.add_argument("--titles", default=None, help="item titles (movies.csv, u.item, ...)")
    s.add_argument("--train", default=None, help="ratings whose items the user has already seen "
                                                 "(left out)")
    s.set_defaults(func=cmd_recommend)

    s = sub.add_parser("tune", help="tune the kernels for a device and data set; store the best "
                                    "in the tuning database ALS(variant='auto') reads")
    s.add_argument("data", nargs="?", default=None, metavar="DATA",
                   help="ratings file or directory (the ml-100k directory: its ua.base), or "
                        "synthetic:USERSxITEMSxRATINGS (the bench's synthetic sets)")
    s.add_argument("--preset", default=None, help="tune on synthetic data in this preset's shape")
    s.add_argument("--scale", type=positive_float, default=1.0,
                   help="scale of the --preset data")
    s.add_argument("--factors", "-f", default="10,50,100", help="comma-separated f values")
    s.add_argument("--device", "-d", default="auto", help="auto | cpu | gpu | P:D | name substring")
    s.add_argument("--strategy", default="budgeted", choices=["exhaustive", "budgeted"])
    s.add_argument("--budget", type=float, default=120.0,
                   help="seconds of measurement per f (budgeted strategy)")
    s.add_argument("--max-wall", type=float, default=None, metavar="SECONDS",
                   help="wall-clock seconds per f for the search, kernel builds included (the "
                        "budget counts measurement only); then no new candidates, but the "
                        "finalists, the final showdown and the records still run")
    s.add_argument("--space", default="default", choices=["default", "bounded", "full"],
                   help="default: the shapes that win on known devices (CG solvers included); "
                        "bounded: a few hundred Cholesky configurations; full: every grid value")
    s.add_argument("--db", default=None, help="database file (default: the per-user database)")
    s.add_argument("--report", default=None, metavar="DIR", help="write reports and plots here")
    s.add_argument("--storage", default="float32", choices=["float32", "float16"])
    s.add_argument("--solvers", default=None, help="solvers of the full space (cholesky,cg,fusedcg; "
                                                   "default cholesky, all three with implicit)")
    s.add_argument("--feedback", default="explicit", choices=["explicit", "implicit"],
                   help="tune implicit-feedback ALS (confidence 1 + alpha·r) instead of explicit")
    s.add_argument("--alpha", type=float, default=1.0, help="implicit feedback: confidence scale")
    s.add_argument("--biases", action="store_true", help="tune explicit ALS with user/item biases")
    s.add_argument("--log1p", action="store_true", help="use log(1 + r) of the data's values "
                                                        "(implicit strengths from play counts)")
    s.add_argument("--sample", default="auto", metavar="auto|full|FRACTION",
                   help="auto: a calibrated sample of rows, checked against the whole side; full: "
                        "time whole half-steps (no sampling); a fraction: that sample (checked)")
    s.add_argument("--sample-tol", type=float, default=0.2,
                   help="the sample check's tolerance: grow the sample while the reference "
                        "configuration's estimate is off by more than this (0: no check)")
    s.add_argument("--check-time", type=float, default=1.0,
                   help="the check times the whole side when it takes ≤ this many seconds, else a "
                        "larger sample")
    s.add_argument("--sample-time", type=float, default=0.03,
                   help="target device seconds of one sampled half-step")
    s.add_argument("--start", action="append", default=[], metavar="VARIANT",
                   help="a configuration to measure first (repeatable), e.g. "
                        "'batch+vec4+gemm:tx=8,ty=8,bx=64,nnz_batch=8'; the search goes on from "
                        "the best measured")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--fresh", action="store_true", help="ignore the journal of an interrupted "
                                                        "identical run (default: resume it)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_tune)
    return p


def main(argv=None):
    """Run the command line; returns the exit status (0 ok, 1 failure, 2 usage error)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)        # usage errors: argparse exits with status 2
    except _ArgumentError as e:               # (printed on stderr); --json: the document too
        if "--json" in argv:
            command = next((a for a in argv if not a.startswith("-")), None)
            print(json.dumps({"command": command, "error": e.message, "exit_status": 2}))
        raise
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    as_json = bool(getattr(args, "json", False))
    stdout = sys.stdout
    args.result = None
    try:
        # with --json the human-readable report goes to stderr, the document alone to stdout
        with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
            status = args.func(args)
    except KeyboardInterrupt:
        again = (" (run the same command again to resume; the measurement cut short is measured "
                 "again)" if args.command == "tune" else "")
        print(f"clmf {args.command}: interrupted{again}", file=sys.stderr)
        if as_json:
            print(json.dumps({"command": args.command, "error": "interrupted",
                              "exit_status": 130}), file=stdout)
        return 130
    except Exception as e:  # noqa: BLE001 - every failure becomes a message and an exit status
        status = 2 if isinstance(e, UsageError) else 1
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        log.debug("clmf %s failed", args.command, exc_info=True)
        print(f"clmf {args.command}: error: {msg}", file=sys.stderr)
        if as_json:
            print(json.dumps({"command": args.command, "error": str(msg),
                              "exit_status": status}), file=stdout)
        return status
    if as_json:
        print(json.dumps(_jsonable(args.result or {"command": args.command})), file=stdout)
    return status


if __name__ == "__main__":
    sys.exit(main())
