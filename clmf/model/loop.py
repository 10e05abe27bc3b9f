"""The ALS iteration loop, written once for every backend (one device, several devices, Dask).

An estimator wraps its backend in a :class:`FitSteps` (run one iteration, score it, hand out the
factors; optionally act after an iteration, e.g. write a checkpoint) and calls :func:`run`, which
owns the progress bar, the per-iteration metrics, the callback, early stopping with the best
iteration's factors kept, and the final check of the factors. :func:`run` touches no estimator:
it returns a :class:`FitResult` that the estimator assigns in one step, so a fit that raises
midway (a singular system, a lost worker, a callback raising, Ctrl-C) leaves the model as it was.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from ..data.scan import all_finite

log = logging.getLogger(__name__)

__all__ = ["FitResult", "FitSteps", "run"]


class FitSteps:
    """What :func:`run` needs of a backend ``engine`` (anything with ``get_factors(side,
    with_biases)``: :class:`clmf.engine.Engine`, :class:`clmf.parallel.MultiEngine`, the Dask
    engine): subclasses implement :meth:`iterate`; the other hooks have defaults."""

    def __init__(self, engine):
        """Keep the backend."""
        self.engine = engine

    def iterate(self, it):
        """Run ALS iteration ``it`` (users, then items) to its end on the device(s); return None
        (its seconds are the wall time of this call) or its own seconds, where the backend ran
        it together with others (the Dask workers' groups of iterations)."""
        raise NotImplementedError

    def metrics(self):
        """Metrics of the current factors (``train_rmse``, ``validation_rmse``, ...)."""
        return {}

    def factors(self):
        """The current factors on the host: ``(X, user_biases, Y, item_biases)``."""
        X, bu = self.engine.get_factors("users", True)
        Y, bi = self.engine.get_factors("items", True)
        return X, bu, Y, bi

    def after_iteration(self, it, history):
        """Called after iteration ``it``'s metrics are in ``history``, before the callback."""

    def non_finite_error(self):
        """The exception explaining non-finite final factors, or None (a generic one)."""
        return None


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What a fit learned: per-iteration metrics, the kept iteration and its factors."""

    history: list
    best_iteration: int
    user_factors: np.ndarray
    item_factors: np.ndarray
    user_biases: np.ndarray
    item_biases: np.ndarray
    first_iteration_s: float | None     # clock origin → end of the first iteration run here


def run(steps, iterations, *, start=0, history=(), callback=None, early_stopping_rounds=None,
        monitor=None, higher_is_better=False, show_progress=True, desc="ALS", origin=None):
    """Iterations ``start .. iterations-1`` of ``steps`` (a :class:`FitSteps`).

    Each iteration's metrics (``seconds`` of the iteration, then ``steps.metrics()``) are appended
    to a copy of ``history``; ``callback(it, seconds since origin, metrics)`` follows. With
    ``early_stopping_rounds``, the fit stops when the metric ``monitor`` has not improved for that
    many iterations, and the best iteration's factors are kept (a NaN score never improves).
    ``origin`` is the ``time.perf_counter()`` the callback's seconds count from (default: now).
    Raises the backend's :meth:`FitSteps.non_finite_error` (or :class:`FloatingPointError`) when
    the kept factors are not finite.
    """
    from tqdm.auto import tqdm
    origin = time.perf_counter() if origin is None else origin
    history = list(history)
    best = (np.inf, None, -1)                      # (score, factors, iteration)
    first = None
    # counted by hand after each iteration's metrics: a bar iterating over the range would show
    # its count only at its next refresh (0/10 while the postfix moves)
    bar = tqdm(total=iterations, initial=start, desc=desc, unit="it", disable=not show_progress,
               leave=False)
    try:
        for it in range(start, iterations):
            t0 = time.perf_counter()
            took = steps.iterate(it)
            t1 = time.perf_counter()
            if first is None:
                first = t1 - origin
            metrics = {"seconds": t1 - t0 if took is None else float(took), **steps.metrics()}
            history.append(metrics)
            bar.set_postfix({k: f"{v:.4f}" for k, v in metrics.items()}, refresh=False)
            bar.update(1)
            log.info("iteration %d: %s", it, metrics)
            steps.after_iteration(it, history)
            if callback is not None:
                callback(it, time.perf_counter() - origin, dict(metrics))
            if early_stopping_rounds is not None:
                score = -metrics[monitor] if higher_is_better else metrics[monitor]
                if score < best[0]:
                    best = (score, steps.factors(), it)
                elif it - best[2] >= int(early_stopping_rounds):
                    log.info("early stop at iteration %d; best %d (%s %.5f)", it, best[2],
                             monitor, -best[0] if higher_is_better else best[0])
                    break
    finally:
        bar.close()
    if best[1] is not None:
        (X, bu, Y, bi), kept = best[1], best[2]
    else:
        (X, bu, Y, bi), kept = steps.factors(), len(history) - 1
    if not all(all_finite(a) for a in (X, bu, Y, bi)):
        raise steps.non_finite_error() or FloatingPointError(
            "the fit produced non-finite factors (NaN/inf); the previous state of the model is "
            "kept")
    return FitResult(history, kept, X, Y, bu, bi, first)
