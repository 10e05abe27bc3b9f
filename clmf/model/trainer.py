"""The fit session, apart from the estimator (as LensKit separates its ALS trainer from the
scorer): :class:`Trainer` holds what every backend's fit shares — the parameters checked and read
once into a :class:`clmf.tuning.FitSpec`, the options' checks, the start factors' rule, the loop
with its metrics, early stopping and history (:func:`clmf.model.loop.run`) and the learned
attributes —; :class:`DeviceTrainer` is the fit on one or several devices of this process (the
counting, the tuning lookup, the memory plan, the start factors drawn during the set-up, the
backend's build, the timings). :class:`clmf.dask.ALS` runs the same :class:`Trainer` over its Dask
backend. A trainer returns the fitted attributes; the estimator assigns them in one step, so a fit
that fails or is interrupted leaves a fitted model exactly as it was.
"""
from __future__ import annotations

import concurrent.futures
import logging
import time

import numpy as np
import scipy.sparse as sp

from .. import reference
from ..data import frames
from ..data.scan import count_columns, value_sum
from ..data.validation import check_params, check_ratings, check_strengths
from ..engine.core import host_factor_rows
from ..errors import SingularSystemError
from ..tuning.fallback import show_progress as probe_progress
from ..tuning.resolver import resolve
from ..tuning.spec import FitSpec, side_stats
from . import loop
from .checks import _check_unregularized, _csr_range, range_error
from .inputs import _heldout, _table_ratings

log = logging.getLogger(__name__)

__all__ = ["Trainer", "DeviceTrainer", "DeviceSteps", "VALIDATION_K", "VALIDATION_METRIC",
           "check_stopping", "id_maps_of"]

VALIDATION_K = 10          # implicit feedback's validation metric: strict precision@10
VALIDATION_METRIC = f"validation_precision@{VALIDATION_K}"


def check_stopping(early_stopping_rounds, has_validation):
    """Refuse early stopping without validation data or with fewer than one round."""
    if early_stopping_rounds is not None:
        if not has_validation:
            raise ValueError("early_stopping_rounds needs validation data")
        if int(early_stopping_rounds) < 1:
            raise ValueError("early_stopping_rounds must be ≥ 1")


def id_maps_of(X):
    """The (user_ids, item_ids) raw-id maps of a Ratings, or (None, None)."""
    if hasattr(X, "user_ids") and hasattr(X, "item_ids"):
        return np.asarray(X.user_ids), np.asarray(X.item_ids)
    return None, None


class Trainer:
    """What every backend's fit shares (module docstring); ``est`` is the estimator whose
    parameters are fitted (read, never written)."""

    desc = "ALS"

    def __init__(self, est):
        """Check the estimator's parameters and read them once into :attr:`spec`."""
        check_params(est)
        self.est = est
        self.spec = FitSpec.of(est)
        self.iterations = int(est.iterations)

    @property
    def monitor(self):
        """The validation metric early stopping watches."""
        return VALIDATION_METRIC if self.spec.implicit else "validation_rmse"

    def check_unregularized(self, user_counts, item_counts):
        """Refuse singular unregularized systems before any device work (explicit feedback)."""
        if self.spec.regularization == 0 and not self.spec.implicit:
            _check_unregularized(user_counts, item_counts, self.spec.f)

    def start(self, init, m, n):
        """``(rule, X0, Y0)``: the start rule to draw with (``X0, Y0`` None), or the caller's
        start factors checked (rule None)."""
        f = self.spec.f
        if init is None or isinstance(init, str):
            rule = reference.default_init(self.spec.feedback) if init is None else init
            reference.start_rule(rule)
            return rule, None, None
        if len(init) != 2:
            raise ValueError("init must be a pair (X0, Y0) or a start rule "
                             f"{sorted(reference.START_RULES)}")
        X0, Y0 = (np.asarray(a, dtype=np.float32) for a in init)
        if X0.shape != (m, f) or Y0.shape != (n, f):
            raise ValueError(f"init shapes must be {(m, f)} and {(n, f)}, got {X0.shape} and "
                             f"{Y0.shape}")
        if not (np.all(np.isfinite(X0)) and np.all(np.isfinite(Y0))):
            raise ValueError("init factors contain NaN/inf")
        return None, X0, Y0

    def run(self, steps, *, callback, early_stopping_rounds, show_progress, origin, start=0,
            history=(), desc=None):
        """The iterations (:func:`clmf.model.loop.run`): metrics, callback, early stopping on
        :attr:`monitor`, the kept iteration's factors."""
        return loop.run(steps, self.iterations, start=start, history=history, callback=callback,
                        early_stopping_rounds=early_stopping_rounds, monitor=self.monitor,
                        higher_is_better=self.spec.implicit, show_progress=show_progress,
                        desc=desc or self.desc, origin=origin)

    def learned(self, res):
        """The fitted attributes of a :class:`~clmf.model.loop.FitResult`."""
        biased = bool(self.est.biases)
        return {"history_": res.history, "best_iteration_": res.best_iteration,
                "user_factors_": res.user_factors, "item_factors_": res.item_factors,
                "user_biases_": res.user_biases if biased else None,
                "item_biases_": res.item_biases if biased else None}


class DeviceTrainer(Trainer):
    """The fit on one or several OpenCL devices of this process (:class:`clmf.engine.Engine`
    or :class:`clmf.parallel.MultiEngine`); :meth:`fit` returns the fitted attributes."""

    def fit(self, X, *, columns=None, show_progress=True, callback=None, init=None,
            validation=None, early_stopping_rounds=None, train_metrics=None, t_fit=None,
            c_fit=None, on_iterate=None):
        """The fitted attributes of :meth:`clmf.ALS.fit` (same arguments; ``t_fit``/``c_fit``:
        the wall and CPU clocks the fit started at, for its timings; ``on_iterate()``: called
        once the set-up is done, when the iterations start)."""
        from ..engine.device import device_info, device_label, select_devices
        from ..engine.memory import plan_fit
        spec, est = self.spec, self.est
        if frames.is_frame(X):
            X = _table_ratings(X, columns)
        R = check_ratings(X)
        t_valid = time.perf_counter()
        implicit = spec.implicit
        if implicit:
            check_strengths(R)
        user_ids, item_ids = id_maps_of(X)
        m, n = R.shape
        f = spec.f
        user_counts = np.diff(R.indptr)
        item_counts = count_columns(R.indices, n)
        t_counts = time.perf_counter()
        self.check_unregularized(user_counts, item_counts)
        V, v_unseen = None, np.zeros(0)
        if validation is not None:
            V, v_unseen = _heldout(validation, columns, user_ids, item_ids, R.shape)
            if v_unseen.size and est.biases:
                raise ValueError(f"the validation data has {v_unseen.size} rating(s) of ids not "
                                 "in the training data; with biases=True drop them first")
        check_stopping(early_stopping_rounds, V is not None)
        rule, X0, Y0 = self.start(init, m, n)      # rule: the start is drawn here

        t_checks = time.perf_counter()
        stats = {"users": side_stats(user_counts, n), "items": side_stats(item_counts, m)}
        devs = select_devices(est.device)
        infos = [device_info(d) for d in devs]
        with probe_progress(show_progress):
            # looked up once per device (the backend's build falls through on a rejection)
            per_device = [resolve(spec, i, stats) for i in infos]
        configs = (per_device[0]["users"].config, per_device[0]["items"].config)
        t_tuning = time.perf_counter()
        # the training RMSE (explicit feedback; one pass over the ratings on the device): every
        # iteration when shown or asked for, else the last one's only (see train_metrics)
        if train_metrics not in (None, True, False):
            raise ValueError(f"train_metrics must be None, True or False, not {train_metrics!r}")
        want_train = not implicit and train_metrics is not False
        train_when = ("every" if train_metrics or (train_metrics is None and (
            show_progress or callback is not None)) else "last")
        # the memory plan, from shapes alone, before any large allocation: the host's here; the
        # devices' in the backend (one device's engine, or the multi-device/streamed planner,
        # which streams what does not fit), both before any buffer exists
        plan = plan_fit(m, n, R.nnz, f, configs, infos[0], implicit=implicit,
                        biased=spec.biased, validation_nnz=0 if V is None else V.nnz,
                        train_metrics=want_train,
                        early_stopping=early_stopping_rounds is not None)
        plan.check_host()
        t_plan = time.perf_counter()
        start = None
        if rule is not None:
            # drawn in a thread while the device is set up (the generator releases the GIL):
            # (m + n)·f numbers are a large part of the set-up at Netflix scale; the host's plan
            # above covers them
            start_pool = concurrent.futures.ThreadPoolExecutor(1)
            # (into page-aligned host rows in the devices' layout, which a CPU device's factor
            # buffers then wrap in place)
            ldf = spec.ldf(configs)
            start = start_pool.submit(
                reference.start_factors, m, n, f, est.random_state, init=rule,
                empty=lambda shape, dtype: host_factor_rows(shape[0], f, ldf, spec.biased))
            start_pool.shutdown(wait=False)
        global_mean = value_sum(R.data) / R.nnz if R.nnz else float("nan")
        t_prep = time.perf_counter()
        with probe_progress(show_progress):
            engine, per_device = self.build_engine(devs, infos, per_device,
                                                   spec.kernel_ratings(R), stats, global_mean,
                                                   item_counts=item_counts)
        choices = per_device[0]
        configs = (choices["users"].config, choices["items"].config)
        t_engine = time.perf_counter()
        labels = [device_label(d) for d in devs]
        V, v_unknown_se, v_total = _heldout_split(V, v_unseen, user_counts, item_counts,
                                                  global_mean, est.biases or implicit)
        try:
            t_wait = time.perf_counter()
            if start is not None:
                X0, Y0 = start.result()
            t_start_factors = time.perf_counter()
            # drawn here, the start factors are the engine's to keep and overwrite
            engine.set_factors("users", X0, adopt=start is not None)
            engine.set_factors("items", Y0, adopt=start is not None)
            del X0, Y0
            engine.finish()
            steps = DeviceSteps(spec, self.iterations, engine, R, V, v_unknown_se, v_total,
                                configs[0].storage, train=want_train and train_when,
                                device=devs[0])
            t_start = time.perf_counter()
            timings = {"validation": t_valid - t_fit, "preparation": t_prep - t_valid,
                       "counts": t_counts - t_valid, "checks": t_checks - t_counts,
                       "tuning": t_tuning - t_checks, "plan": t_plan - t_tuning,
                       "start_factors": t_start_factors - t_wait,
                       "factors_upload": t_start - t_start_factors,
                       "engine": t_engine - t_prep, "setup": t_start - t_fit,
                       # CPU seconds of the process (all threads, OpenCL runtimes' included)
                       "setup_cpu": time.process_time() - c_fit,
                       **getattr(engine, "setup_times", {})}
            if on_iterate is not None:
                on_iterate()               # host work that overlaps the iterations
            res = self.run(steps, callback=callback, early_stopping_rounds=early_stopping_rounds,
                           show_progress=show_progress, origin=t_start)
            memory = dict(engine.memory)
            t_kept = time.perf_counter()
            # the last iteration's factors, kept: its factor buffers go to the model's ranker
            handed = _hand_over(engine) if res.best_iteration == len(res.history) - 1 else None
            # past the last iteration: its metrics, the factors read back and checked
            timings["wrap_up"] = t_kept - steps.t_last
            timings["fit"] = time.perf_counter() - t_fit
        finally:
            engine.release()
        return {
            "user_ids_": user_ids, "item_ids_": item_ids, "global_mean_": global_mean,
            "user_counts_": user_counts, "item_counts_": item_counts, "config_": choices,
            "device_": labels[0] if len(devs) == 1 else labels,
            "device_configs_": [{"device": lab, **c} for lab, c in zip(labels, per_device)],
            "memory_": memory, "timings_": timings, **self.learned(res),
            "_handed": handed,
        }

    def build_engine(self, devs, infos, per_device, R, stats, global_mean, item_counts=None):
        """The fit's backend (one device's :class:`Engine` or a multi-device one) and the
        configurations per device (``per_device``: :func:`clmf.tuning.resolve`'s per device,
        looked up once): a chosen configuration that fails to build, lacks a kernel or exceeds
        a kernel's limits is rejected (one warning, see :mod:`clmf.tuning.fallback`) and the
        choices are looked up again, falling through to the next rule; a configuration given by
        the caller raises :class:`clmf.InvalidConfigError`."""
        from ..errors import InvalidConfigError
        from ..parallel import make_backend
        from ..tuning import fallback
        spec = self.spec
        mode, f = spec.mode, spec.f
        while True:
            try:
                engine = make_backend(devs, R, f, [(c["users"].config, c["items"].config)
                                                   for c in per_device],
                                      implicit_alpha=spec.kernel_alpha,
                                      biased=spec.biased,
                                      offset=global_mean if spec.biased else 0.0,
                                      max_device_memory=self.est.max_device_memory,
                                      item_counts=item_counts)
                return engine, per_device
            except InvalidConfigError as e:
                k = int(getattr(e, "device_index", 0) or 0)
                ch = per_device[k].get(getattr(e, "side", None))
                if ch is None or ch.rule == "explicit" or \
                        fallback.rejection(infos[k], ch.config, f, mode) is not None:
                    raise                    # the caller's own variant, or nothing left to try
                fallback.reject(infos[k], ch.config, f, mode,
                                f"the {ch.rule} rule ({ch.reason})", e)
                # (every device again: the rejection holds for each device of that kind)
                per_device = [resolve(spec, info, stats) for info in infos]


def _hand_over(engine):
    """A one-device engine's factor buffers given away for the ranker
    (:func:`clmf.engine.factors.hand_over`), or None (several devices, another layout, or a
    failure: the ranker then uploads the factors, as it always may)."""
    from ..engine.core import Engine
    from ..engine.factors import hand_over
    if not isinstance(engine, Engine):
        return None
    try:
        return hand_over(engine)
    except Exception as e:  # noqa: BLE001 - the ranker uploads them instead
        log.debug("the factor buffers were not handed over (%s)", e)
        return None


def _heldout_split(V, v_unseen, user_counts, item_counts, global_mean, on_device):
    """``(V, sse, total)``: the held-out ratings scored on the device, the squared error of those
    predicted as the global mean on the host (users/items without training ratings, ids not in
    the training data) and the count the RMSE divides by. ``on_device`` (biases, implicit
    feedback): the kernels predict every rating themselves."""
    if V is None:
        return None, 0.0, 0
    if on_device:
        return V, 0.0, int(V.nnz)      # biases: the kernel predicts them itself
    # ratings of users/items with no training ratings are predicted as global_mean_ (as
    # predict() does): their error is constant, computed once on the host
    unk = (user_counts[V.row] == 0) | (item_counts[V.col] == 0)
    # (and those of raw ids not in the training data)
    sse = float(np.sum((global_mean - np.concatenate(
        [V.data[unk], v_unseen]).astype(np.float64)) ** 2))
    total = int(V.nnz) + int(v_unseen.size)
    V = sp.coo_matrix((V.data[~unk], (V.row[~unk], V.col[~unk])), shape=V.shape)
    return V, sse, total


class DeviceSteps(loop.FitSteps):
    """:func:`clmf.model.loop.run`'s view of a fit on one or several devices in this process
    (:class:`clmf.engine.Engine` or :class:`clmf.parallel.MultiEngine`): metrics on the
    devices (train RMSE from their CSR, validation RMSE of triples) or, for implicit feedback,
    validation precision@10 counted on the device (:class:`FitValidation`, built once)."""

    def __init__(self, spec, iterations, engine, R, V, v_unknown_se, v_total, storage, train,
                 device=None):
        """Keep the backend, the training ratings and the validation triples (implicit feedback:
        a :class:`FitValidation` of them, counting on ``device``)."""
        super().__init__(engine)
        self.R, self.V = R, V
        self.v_unknown_se, self.v_total = v_unknown_se, v_total
        self.storage, self.train = storage, train
        self.f = spec.f
        self.regularization = spec.regularization
        self.weighted = spec.weighted
        self.implicit = spec.implicit
        self.rows = []              # row of each rating, for backends without a CSR metric
        self.it, self.last = -1, int(iterations) - 1
        self.t_last = time.perf_counter()          # when the last iteration ended
        self.evaluator = None
        if V is not None and self.implicit:
            from ..inference.heldout import FitValidation
            self.evaluator = FitValidation(V, R, VALIDATION_K, device)

    def iterate(self, it):
        """One iteration, waited for; a singular system explained by the ratings' range is a
        :class:`RatingRangeError`."""
        self.it = it
        try:
            self.engine.iteration(self.regularization, self.weighted)
        except SingularSystemError as e:
            raise self.non_finite_error() or e from None
        self.engine.finish()
        self.t_last = time.perf_counter()

    def metrics(self):
        """Train RMSE (explicit; every iteration or the last, as ``train`` says) and the
        validation metric."""
        out = {}
        engine, V = self.engine, self.V
        if self.train == "every" or (self.train == "last" and self.it == self.last):
            se, cnt = _train_squared_error(engine, self.R, self.rows)
            out["train_rmse"] = float(np.sqrt(se / cnt))
        if self.evaluator is not None:
            out[VALIDATION_METRIC] = self.evaluator.precision(engine, self.f)
        elif V is not None:
            se = engine.squared_error("validation", V.row, V.col, V.data)[0] if V.nnz else 0.0
            out["validation_rmse"] = (float(np.sqrt((se + self.v_unknown_se) / self.v_total))
                                      if self.v_total else float("nan"))
        return out

    def non_finite_error(self):
        """A :class:`RatingRangeError` when the ratings' magnitude explains the failure."""
        return range_error(self.engine, *_csr_range(self.R), self.f, self.storage,
                            self.regularization)


def _train_squared_error(engine, R, rows):
    """``(sse, count)`` on the training ratings: from the CSR already on the device where the
    backend can, else as triples (the rows expanded once into ``rows``)."""
    if hasattr(engine, "train_squared_error"):
        return engine.train_squared_error()
    if not rows:
        rows.append(np.repeat(np.arange(R.shape[0], dtype=np.int32), np.diff(R.indptr)))
    return engine.squared_error("train", rows[0], R.indices, R.data)
