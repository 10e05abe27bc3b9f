"""The clmf autotuner: search space, measurement, strategies, database writing, reports.

It sits on top of ``clmf`` (the library never imports it; ``clmf tune`` reaches it lazily).
After a tuning run, ``clmf.ALS(variant="auto")`` picks the result up from the database with no
argument (see :mod:`clmf.tuning` for the search order and the fallback chain).

>>> from clmf import autotune                               # doctest: +SKIP
>>> autotune.tune(R, factors=[10], device="cpu", strategy="budgeted", budget=60)   # doctest: +SKIP
>>> autotune.tune(P, factors=[64], device="cpu", mode="implicit", alpha=2.0)       # doctest: +SKIP
"""
from __future__ import annotations

import logging
import pathlib

__all__ = ["tune", "load_data"]

log = logging.getLogger(__name__)


LASTFM_FILE = "user_artists.dat"


def load_data(path=None, preset=None, scale=1.0, seed=0, split="ua", log1p=False):
    """(users × items CSR, data-set name) of a ratings path (the ml-100k directory or
    ``ua.base``: its training part; another directory: its ratings file, see
    :func:`clmf.data.load`; the HetRec Last.fm directory: its ``user_artists.dat`` play
    counts) or a synthetic preset. ``log1p`` stores log(1 + r) (implicit strengths, as
    ``benchmarks/lastfm_implicit.py``) and adds ``-log1p`` to the name."""
    import numpy as np
    R, name = _load_data(path, preset, scale, seed, split)
    if log1p:
        if R.nnz and R.data.min() < 0:
            raise ValueError("log1p needs non-negative values")
        R = R.copy()
        R.data = np.log1p(R.data.astype(np.float64)).astype(np.float32)
        name += "-log1p"
    return R, name


def _load_data(path, preset, scale, seed, split):
    import clmf.data
    if preset is not None:
        if path is not None:
            raise ValueError("give either DATA or --preset, not both")
        data = clmf.data.synthetic(preset, scale=scale, seed=seed)
        return data.to_csr(), f"{preset}-x{scale:g}"
    spec_set = clmf.data.synthetic_from_spec(path, seed=seed) if path is not None else None
    if spec_set is not None:                # the bench's synthetic:USERSxITEMSxRATINGS sets
        data, name = spec_set
        return data.to_csr(), name
    if path is None:
        raise ValueError("give a ratings file or directory (DATA) or --preset NAME "
                         f"(one of {', '.join(sorted(clmf.data.list_presets()))})")
    p = pathlib.Path(path)
    if p.is_dir() and (p / LASTFM_FILE).is_file():
        return clmf.data.load(str(p / LASTFM_FILE)).to_csr(), p.name
    if (p.is_dir() and (p / f"{split}.base").is_file()) or p.name.endswith(".base"):
        d = p if p.is_dir() else p.parent
        sp = split if p.is_dir() else p.name[:-len(".base")]
        train, _test = clmf.data.load_movielens_100k_split(d, split=sp)
        return train.to_csr(), d.name
    data = clmf.data.load(str(p))          # a file, or a directory of ratings.csv/.dat, Netflix
    return data.to_csr(), p.name if p.is_dir() else p.stem


def tune(R, factors=(10,), device="auto", strategy="budgeted", budget=60.0, space="default",
         db=None, report_dir=None, dataset="data", storage="float32", seed=0, solvers=None,
         state_dir=None, sample_time=0.03, progress=True, resume=True, plot=True,
         mode="explicit", alpha=1.0, sample="auto", sample_tol=None, check_time=None, starts=(),
         max_wall=None):
    """Tune the kernels of one data set on one device for each f in ``factors``.

    Parameters
    ----------
    R : users × items ratings (scipy.sparse)
    factors : iterable of f
    device : clmf device specification ("auto", "cpu", "P:D", a name substring, ...)
    strategy : "exhaustive" or "budgeted" (``budget`` seconds of measurement per f)
    space : "default" (the shapes that win on the devices we know, CG solvers included),
        "bounded" (a few hundred Cholesky configurations) or "full"
    db : database path (default: the per-user database that ``ALS(variant="auto")`` reads)
    report_dir : write a markdown report and a plot per f here
    mode : "explicit" (ratings), "implicit" (feedback with confidence 1 + ``alpha``·r) or
        "biased" (explicit with user/item biases): what ``ALS(feedback=..., biases=...)`` fits
    sample : "auto" (a calibrated sample of rows, checked against the whole side), "full" (whole
        half-steps, no sampling) or a fraction in (0, 1] (checked too)
    sample_tol : the check's tolerance on the probe's estimate (default 0.2; 0: no check)
    check_time : the check times the whole side when it takes ≤ this (default 1 s), else a
        larger sample
    starts : configurations (strings or KernelConfig) measured first, beside the incumbent (what
        ``variant="auto"`` chose before this run), the baseline, the untuned default and this
        device's earlier best configurations; the search goes on from the best of them all
    max_wall : wall-clock seconds per f for the search, kernel builds and checks included (the
        budget counts measurement only); once spent, no new candidate is tried, and the
        finalists' promotion, the final showdown and the records still are (None: no limit)

    Every run ends with the search's winner and the incumbent re-timed side by side on the whole
    data: the record written holds the faster (``chosen``), never a regression.

    Returns
    -------
    list of run summaries (dicts; see :meth:`clmf.autotune.strategies.Session.finish`)
    """
    from clmf import tuning
    from clmf.engine.device import device_label, select_device

    from . import strategies
    from .measure import CHECK_TIME, SAMPLE_TOL
    from .space import make_space
    dev = select_device(device)
    db = pathlib.Path(db) if db else tuning.user_db_path()
    out = []
    for f in factors:
        case = strategies.Case(dev, R, int(f), dataset, storage, mode, alpha)
        sp = make_space(space, case.kf, case.info, storage, solvers, mode)
        log.info("tuning %s, %s, f=%d, %s: %s over the %s space", device_label(case.info),
                 dataset, f, mode, strategy, space)
        summary = strategies.run(case, sp, strategy, db=db, budget=budget, seed=seed,
                                 state_dir=state_dir, sample_time=sample_time, progress=progress,
                                 resume=resume, sample=sample,
                                 sample_tol=SAMPLE_TOL if sample_tol is None else sample_tol,
                                 check_time=CHECK_TIME if check_time is None else check_time,
                                 starts=starts, max_wall=max_wall)
        summary["database"] = str(db)
        tuning.Database(db).compact()    # a gzip database: the run's members packed into one
        if report_dir:
            from .report import write_run_report
            summary["report"] = str(write_run_report(summary, report_dir, plot=plot))
        out.append(summary)
    return out
