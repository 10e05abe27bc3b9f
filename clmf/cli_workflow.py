"""Pieces of the command line (:mod:`clmf.cli`) for its fit → eval / recommend workflow: the
usage error (exit status 2) and help formatter, what a fit prints (per iteration, the summary with
the test's metrics), the holdout ``clmf fit --output MODEL`` records beside the model for ``clmf
eval MODEL``, ratings in a saved model's indices, ``clmf recommend --all --out FILE`` and the
titles check of ``clmf recommend --titles``."""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import tempfile

import numpy as np

log = logging.getLogger("clmf.cli")

__all__ = ["UsageError", "HelpFormatter", "RANKING_K", "HOLDOUT_SUFFIX", "iteration_line",
           "test_summary", "fit_summary", "holdout_path", "save_holdout", "load_holdout",
           "to_model_index", "recommend_all", "titles_for"]

RANKING_K = 10              # cut-off of the ranking metrics fit and demo print
HOLDOUT_SUFFIX = ".holdout.json"
HOLDOUT_FIELDS = ("data", "preset", "scale", "split", "test_fraction", "seed")


class UsageError(ValueError):
    """A bad or missing command-line argument (exit status 2)."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows every default once: argparse's ``(default: ...)``, unless the help text
    states the default itself or there is none to show (None, an off flag)."""

    def _get_help_string(self, action):
        """The help text, with argparse's ``(default: ...)`` only where it adds something."""
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text.lower():
            return text
        return super()._get_help_string(action)


# ----- what a fit prints ----------------------------------------------------------------------
def iteration_line(it, metrics):
    """One line per iteration: the metrics the fit recorded (train/test RMSE for explicit
    feedback, the test's strict precision@10 for implicit feedback) and its seconds."""
    from .model.trainer import VALIDATION_METRIC
    labels = {"train_rmse": "train RMSE", "validation_rmse": "test RMSE",
              VALIDATION_METRIC: "test strict " + VALIDATION_METRIC.split("_", 1)[1]}
    parts = [f"iteration {it + 1:3d}"]
    parts += [f"{label} {metrics[key]:.4f}" for key, label in labels.items() if key in metrics]
    return "  ".join(parts) + f"  {metrics['seconds']:.3f} s"


def test_summary(model, train, test):
    """``(test RMSE, None)`` for explicit feedback; ``(None, ranking)`` for implicit feedback,
    ``ranking`` being :func:`clmf.evaluate` at ``RANKING_K`` (training items left out), printed."""
    if model.feedback != "implicit":
        return model.rmse(test), None
    from .inference.evaluation import evaluate
    ranking = evaluate(model, train, test, K=RANKING_K)
    k = RANKING_K
    print(f"test ranking@{k} (training items left out): precision {ranking['precision']:.4f} "
          f"(hits / min({k}, held-out items), the implicit library's), strict precision "
          f"{ranking['strict_precision']:.4f} (hits / {k}), MAP {ranking['map']:.4f}, "
          f"nDCG {ranking['ndcg']:.4f}, AUC {ranking['auc']:.4f}")
    return None, ranking


def fit_summary(model, args, train, test, seconds):
    """Print the line ending ``clmf fit`` (iterations run, early stopping, the test RMSE) after
    the test's ranking metrics (implicit feedback, :func:`test_summary`); returns ``(test RMSE,
    ranking)`` (None where not measured)."""
    ran = len(model.history_)
    line = f"fitted f={args.factors}, λ={args.regularization}, {ran} iterations in {seconds:.2f} s"
    if args.early_stopping_rounds is not None:
        line += (f" (early stopping: the best, iteration {model.best_iteration_ + 1}, kept"
                 + (f"; stopped before {args.iterations}" if ran < args.iterations else "") + ")")
    rmse, ranking = test_summary(model, train, test) if test is not None else (None, None)
    print(line + (f"; test RMSE {rmse:.4f}" if rmse is not None else ""))
    return rmse, ranking


# ----- the fit's holdout, kept beside the model -----------------------------------------------
def holdout_path(model_path):
    """Where ``clmf fit --output MODEL`` records its holdout: ``MODEL.holdout.json``."""
    return str(model_path) + HOLDOUT_SUFFIX


def _digest(test):
    """A digest of the held-out ratings (indices in the data's id order, and values)."""
    h = hashlib.sha256()
    for a in (test.users, test.items, test.ratings):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def save_holdout(model_path, spec, test):
    """Record how the fit split its data beside the model: ``spec`` (the :data:`HOLDOUT_FIELDS`:
    data path, preset and scale, official split, holdout fraction and seed), the held-out
    ratings' count and digest; written atomically. Without a test set, remove a stale record.
    Returns the record's path, or None."""
    path = holdout_path(model_path)
    if test is None:
        if os.path.exists(path):
            os.remove(path)
        return None
    record = {"format": "clmf-holdout/1", **{k: spec[k] for k in HOLDOUT_FIELDS},
              "test_ratings": len(test), "sha256": _digest(test)}
    if record["data"] is not None:
        record["data"] = os.path.abspath(record["data"])
    fd, tmp = tempfile.mkstemp(prefix=".holdout-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return path


def load_holdout(model_path, make_split):
    """``(test, train, description)``: the split recorded beside the model, made again by
    ``make_split(fields)`` (→ ``(train, test, description)``) and checked against the recorded
    digest. Raises FileNotFoundError without a record (a usage error of ``clmf eval``), ValueError
    for a bad record or data that no longer give the same holdout."""
    path = holdout_path(model_path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no DATA given and {model_path} has no recorded holdout ({path}, "
                                "written by 'clmf fit --output' with a test set): give the "
                                "held-out ratings as DATA")
    try:
        with open(path) as fh:
            record = json.load(fh)
        fields = {k: record[k] for k in HOLDOUT_FIELDS}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a holdout record of 'clmf fit' ({e})") from None
    train, test, what = make_split(fields)
    if test is None or len(test) != record.get("test_ratings") or \
            _digest(test) != record.get("sha256"):
        raise ValueError(f"{path}: the data ({what}) no longer gives the holdout the model was "
                         "fitted with (it changed since the fit); give the held-out ratings as "
                         "DATA")
    return test, train, f"the fit's holdout: {what}"


# ----- eval / recommend: a saved model's indices, every user's top-N -----------------------
def to_model_index(model, data):
    """(users, items, ratings, dropped) of ``data`` in the model's indices (unknown ids dropped)."""
    u = model.user_index(np.asarray(data.user_ids)[np.asarray(data.users)], missing="ignore")
    i = model.item_index(np.asarray(data.item_ids)[np.asarray(data.items)], missing="ignore")
    ok = (u >= 0) & (i >= 0)
    return u[ok], i[ok], np.asarray(data.ratings)[ok], int((~ok).sum())


def recommend_all(args):
    """``clmf recommend MODEL --all --out FILE``: every user's top-N streamed to a .parquet or
    .csv file (columns user, rank, item, score; raw ids when the model has them), batch by
    batch with a progress bar; written to a temporary file that replaces FILE at the end, so
    an error leaves nothing half-written."""
    import scipy.sparse as sp

    import clmf

    from . import data
    if args.out is None:
        raise UsageError("--all needs --out FILE.parquet or FILE.csv")
    out = str(args.out)
    fmt = "parquet" if out.endswith(".parquet") else "csv" if out.endswith(".csv") else None
    if fmt is None:
        raise UsageError(f"--out {out}: the file name must end in .parquet or .csv")
    if fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as e:
            raise UsageError("writing .parquet needs pyarrow (pip install pyarrow), or use .csv") \
                from e
    model = clmf.load(args.model)
    n_users, n_items = model.user_factors_.shape[0], model.item_factors_.shape[0]
    seen = None
    if args.train is not None:
        tu, ti, _r, _ = to_model_index(model, data.load(args.train))
        seen = sp.csr_matrix((np.ones(tu.size, np.float32), (tu, ti)), shape=(n_users, n_items))
    umap = getattr(model, "user_ids_", None)
    imap = getattr(model, "item_ids_", None)
    d = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(out) + ".", suffix=".tmp", dir=d)
    os.close(fd)
    writer = fh = None
    rows = 0
    try:
        for users, ids, scores in model.iter_recommend_all(
                args.n, seen, filter_already_liked_items=seen is not None,
                batch_size=args.batch_size, show_progress=True):
            keep = ids >= 0
            u = np.repeat(users, keep.sum(axis=1))
            rank = (np.cumsum(keep, axis=1))[keep]
            it, sc = ids[keep], scores[keep]
            u_out = umap[u] if umap is not None else u
            i_out = imap[it] if imap is not None else it
            rows += u.size
            if fmt == "parquet":
                table = pa.table({"user": u_out, "rank": rank.astype(np.int32), "item": i_out,
                                  "score": sc.astype(np.float32)})
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
            else:
                if fh is None:
                    fh = open(tmp, "w", encoding="utf-8", newline="")
                    fh.write("user,rank,item,score\n")
                fh.write("".join(f"{a},{b},{c},{s:.6g}\n" for a, b, c, s in
                                 zip(u_out.tolist(), rank.tolist(), i_out.tolist(), sc.tolist())))
        if fmt == "parquet":
            if writer is None:                   # no users: an empty table with the schema
                pq.write_table(pa.table({"user": np.zeros(0, np.int64),
                                         "rank": np.zeros(0, np.int32),
                                         "item": np.zeros(0, np.int64),
                                         "score": np.zeros(0, np.float32)}), tmp)
            else:
                writer.close()
                writer = None
        else:
            if fh is None:
                fh = open(tmp, "w", encoding="utf-8", newline="")
                fh.write("user,rank,item,score\n")
            fh.close()
            fh = None
        os.replace(tmp, out)
    except BaseException:
        if writer is not None:
            writer.close()
        if fh is not None:
            fh.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    print(f"wrote {rows} recommendations for {n_users} users to {out}"
          + (" (items of --train left out)" if seen is not None else ""))
    args.result = {"command": "recommend", "model": args.model, "all": True, "out": out,
                   "format": fmt, "users": int(n_users), "rows": int(rows),
                   "filtered_by": args.train}
    return 0


# ----- recommend --titles -----------------------------------------------------------------------
def titles_for(path, items):
    """The titles of ``path`` (:func:`clmf.data.load_titles`) for the recommended ``items``,
    with a warning where they are missing: None (no title column) when the file holds numbers in
    place of titles (a ratings file given as ``--titles``)."""
    from . import data
    titles = data.load_titles(path)
    sample = list(titles.values())[:1000]
    if 2 * sum(map(_is_number, sample)) >= len(sample):     # empty, or mostly numbers
        log.warning("--titles %s holds no titles (%s): is it a ratings file? Titles come from "
                    "movies.csv, u.item, movies.dat or movie_titles.txt; no titles shown", path,
                    "it is empty" if not sample else "numbers where the titles should be")
        return None
    missing = sum(item not in titles for item in items)
    if missing:
        log.warning("--titles %s: %d of the %d recommended items have no title there (shown "
                    "as '?'); is it the titles file of the data the model was fitted on?", path,
                    missing, len(items))
    return titles


def _is_number(text):
    """Whether ``text`` reads as a number (a ratings file's column, not a title)."""
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True
