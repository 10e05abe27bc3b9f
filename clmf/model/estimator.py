"""The ``ALS`` estimator: explicit-feedback alternating least squares on an OpenCL device."""
from __future__ import annotations

import concurrent.futures
import inspect
import logging
import re
import time

import numpy as np
import scipy.sparse as sp

from .. import reference
from ..data.scan import count_columns, value_range, value_sum
from ..data.validation import check_index_pairs, check_params, check_ratings
from ..engine.config import KernelConfig
from ..engine.core import host_factor_rows
from ..errors import InvalidConfigError, SingularSystemError
from ..inference.conventions import confidence_rows
from ..inference.recommend import RecommenderMixin
from . import loop
from .persistence import register_estimator

log = logging.getLogger(__name__)

__all__ = ["ALS"]

_SCORE_BLOCK_BYTES = 64 << 20   # scores of a block of users in the host's precision@k


class ALS(RecommenderMixin):
    """Alternating least squares matrix factorization (ALS-WR) on any OpenCL device.

    For a user × item matrix of explicit ratings ``R`` it finds user factors ``X`` and item
    factors ``Y`` minimising ``Σ_(u,i)∈R (r_ui − x_uᵀy_i)² + λ(Σ_u n_u‖x_u‖² + Σ_i n_i‖y_i‖²)``
    (weighted-λ; plain ``λ(‖X‖² + ‖Y‖²)`` with ``weighted_regularization=False``) by solving, in
    turn, every user's and every item's normal equations with tuned OpenCL kernels.

    Parameters
    ----------
    factors : int, default 64
        Latent dimension f (≥ 1).
    regularization : float, default 0.1
        λ ≥ 0. With λ = 0, a user or item with fewer ratings than ``factors`` has a singular
        system: :class:`clmf.SingularSystemError` is raised (before any device work).
    iterations : int, default 15
        ALS iterations (each solves users, then items).
    weighted_regularization : bool or None, default None
        λ·n_u·I (ALS-WR, as cuMF) or λ·I; None means True for explicit feedback and False for
        implicit feedback (as the implicit library does).
    solver : {"auto", "cholesky", "cg", "fusedcg"}
        "auto" uses the tuned choice for the device (the CG solver where the tuning chose it:
        3 warm-started steps per half-step, approximate per iteration), else Cholesky (implicit
        feedback: the fused CG where no tuning answers); with ``regularization=0`` (explicit
        feedback) always Cholesky, which reports singular systems. "cholesky" solves every
        system exactly.
    variant : "auto", a variant name (``"batch+reg+local:tx=8,ty=8"``), a
        :class:`clmf.KernelConfig`, or a pair (users side, items side) of those. With "auto",
        a configuration that cannot run on the device (build failure, missing kernel, a kernel
        limit, a probe that crashed) is reported once as a
        :class:`clmf.tuning.fallback.TuningFallbackWarning` and the next rule's is used; a variant
        given here is used as is, in every mode (a solver or storage it names is kept; one that
        contradicts ``solver``/``storage`` raises :class:`clmf.InvalidConfigError` with reason
        ``"conflict"``; what it leaves open comes from those parameters, else the mode's
        default, and ``config_`` says so), and such failures raise
        :class:`clmf.InvalidConfigError`.
    device : "auto", "cpu", "gpu", "P:D", a name substring or a ``pyopencl.Device``
        (see :func:`clmf.select_device`; ``CLMF_DEVICE`` is honoured with "auto"); a list of
        those, or ``"gpu:all"`` / ``"cpu:all"``, fits on several devices at once (users and items
        split into blocks balanced by ratings, see :mod:`clmf.parallel`). Give strings where the
        estimator is cloned (scikit-learn's ``clone`` deep-copies parameters; a
        ``pyopencl.Device`` cannot be copied).
    dtype : numpy dtype, default float32 — the compute precision (float32 only).
    random_state : None, int or numpy.random.Generator — seeds the start factors.
    feedback : {"explicit", "implicit"}
        Explicit ratings, or implicit feedback (Hu, Koren & Volinsky 2008): stored entries are
        counts/strengths r ≥ 0 with confidence ``c = 1 + alpha·r`` and preference 1;
        ``A_u = YᵀY + Σ (c − 1) y yᵀ + λI``, built by the same S1 kernels as explicit ratings
        (YᵀY once per half-step) and solved by Cholesky or CG, or applied from the row's entries
        and YᵀY by the fused CG: ``solver="auto"`` takes the tuned choice (the fused CG where
        no tuning answers).
    alpha : float, default 1.0 — confidence scale of implicit feedback.
    confidence : {"1+alpha*r", "alpha*r"}, default "1+alpha*r"
        Implicit feedback's confidence of a stored entry r: ``c = 1 + alpha·r`` (Hu, Koren &
        Volinsky; Spark's ``ALS(implicitPrefs=True)``), or ``c = alpha·r`` (the ``implicit``
        library's: it weights the entries by ``alpha·r``, so an entry with ``alpha·r < 1`` counts
        less than an absent one). In both, ``A_u = YᵀY + Σ (c − 1) y yᵀ + λI`` and
        ``b_u = Σ c y``; the same ``alpha`` fits different models under the two. With
        ``"alpha*r"``, ``factors``, ``regularization``, ``iterations``, ``alpha`` and
        ``weighted_regularization=False`` (the implicit-feedback default) fit the model that
        ``implicit.als.AlternatingLeastSquares`` fits with the same parameters.
    biases : bool, default False — explicit feedback only: learn a global mean, user and item
        biases within ALS (``r̂ = μ + b_u + b_i + x_uᵀy_i``; each half-step solves ``[x_u, b_u]``
        against ``[y_i, 1]`` and the targets ``r − μ − b_i``).
    storage : None, "float32" or "float16" — storage of the factors on the device (compute stays
        float32); None keeps the variant's own (float32 unless a variant string sets
        ``storage=float16``).
    max_device_memory : None, int (bytes) or float ≤ 1 (fraction of each device's memory) — a cap
        on the device memory the fit plans with; ratings that do not fit are streamed from host
        memory (see "Multi-device and out-of-core" in the README).

    Attributes
    ----------
    user_factors_ : ndarray (n_users, factors), float32
    item_factors_ : ndarray (n_items, factors), float32
    global_mean_ : float — mean training rating, predicted for users/items with no ratings
    user_counts_, item_counts_ : ndarray — training ratings per user / item
    user_biases_, item_biases_ : ndarray or None — learned biases (``biases=True``)
    config_ : dict side → :class:`clmf.tuning.Choice` — the kernel configuration used per side
        ("users", "items"), with the rule that chose it and why (the first device's with several)
    device_ : str — the device the fit ran on (a list of str with several devices)
    device_configs_ : list of dict — per device: ``{"device": str, "users": Choice, "items":
        Choice}`` (each device its own tuning lookup)
    history_ : list of dict — per-iteration seconds and metrics
    timings_ : dict — wall seconds of the fit's parts: ``validation`` (the input checked and
        converted), ``preparation`` (from validation to the backend: ``counts`` of ratings per
        user/item, ``checks`` of the other arguments, ``tuning`` (device selection and tuning
        lookup), ``plan`` (host memory plan), the global mean), ``engine`` (the backend's set-up:
        on one device ``engine_host`` (host CSR arrays), ``build`` of the programs (in a thread;
        ``build_wait``: the part not hidden by the uploads), ``upload`` of the ratings,
        ``transpose`` (the items' CSR: on the device; on the host for a CPU device's small
        fits), ``upload_transpose`` their sum, ``buffers`` (scratch)),
        ``start_factors`` (waiting for the start factors drawn in a thread), ``factors_upload``,
        ``setup`` (all before the first iteration; ``setup_cpu``: its CPU seconds, all threads)
        and ``fit`` (the whole call)
    best_iteration_ : int — iteration whose factors were kept (0-based)

    Examples
    --------
    >>> import clmf
    >>> train, test = clmf.datasets.default()              # doctest: +SKIP
    >>> model = clmf.ALS(factors=32, iterations=10, random_state=0).fit(train)  # doctest: +SKIP
    >>> round(model.rmse(test), 2)                         # doctest: +SKIP
    0.93
    """

    def __init__(self, factors=64, regularization=0.1, iterations=15, *,
                 weighted_regularization=None, solver="auto", variant="auto", device="auto",
                 dtype=np.float32, random_state=None, storage=None, feedback="explicit",
                 alpha=1.0, confidence="1+alpha*r", biases=False, max_device_memory=None):
        self.factors = factors
        self.regularization = regularization
        self.iterations = iterations
        self.weighted_regularization = weighted_regularization
        self.solver = solver
        self.variant = variant
        self.device = device
        self.dtype = dtype
        self.random_state = random_state
        self.storage = storage
        self.feedback = feedback
        self.alpha = alpha
        self.confidence = confidence
        self.biases = biases
        self.max_device_memory = max_device_memory

    # ----- scikit-learn protocol -----------------------------------------------------------
    @classmethod
    def _get_param_names(cls):
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values() if p.name != "self"]

    def get_params(self, deep=True):
        """Parameters of this estimator (scikit-learn protocol)."""
        return {k: getattr(self, k) for k in self._get_param_names()}

    def set_params(self, **params):
        """Set parameters (scikit-learn protocol); returns self."""
        valid = set(self._get_param_names())
        for k, v in params.items():
            if k not in valid:
                raise ValueError(f"invalid parameter {k!r} for {type(self).__name__}; "
                                 f"valid: {sorted(valid)}")
            setattr(self, k, v)
        return self

    def __repr__(self):
        default = {k: p.default for k, p in inspect.signature(type(self).__init__).parameters.items()}
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items()
                         if not (isinstance(v, (int, float, str, bool, type(None)))
                                 and v == default.get(k)))
        return f"{type(self).__name__}({args})"

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_engine", None)      # no OpenCL objects in a pickle; reconnect lazily
        state.pop("_topk_cache", None)  # the inference uploads, likewise
        dev = state.get("device")
        if isinstance(dev, (list, tuple)):            # pyopencl.Devices → their names
            state["device"] = [d if isinstance(d, (str, type(None))) else
                               f"{d.platform.name.strip()} | {d.name.strip()}" for d in dev]
        elif not isinstance(dev, (str, type(None))):  # a pyopencl.Device → its name, which
            state["device"] = f"{dev.platform.name.strip()} | {dev.name.strip()}"  # selects it again
        return state

    # ----- configuration -------------------------------------------------------------------
    def _resolve_configs(self, info, stats):
        """``{side: Choice}``: the tuning lookup's choice per side (``variant="auto"``), or the
        caller's variant as given (:meth:`_given_config`)."""
        from .. import tuning
        f = self.factors
        variant = self.variant
        solver = None if self.solver == "auto" else self.solver
        mode = tuning.fit_mode(self.feedback, self.biases)        # tunings of the fit's mode first
        if solver is None and self.regularization == 0 and mode != "implicit":
            # unregularized systems may be singular, which only the Cholesky solve detects (a CG
            # returns some solution of a singular system): a tuned CG gives way
            solver = "cholesky"
        if isinstance(variant, (tuple, list)):
            if len(variant) != 2:
                raise ValueError("variant as a pair must be (users_variant, items_variant)")
            pair = tuple(variant)
        else:
            pair = (variant, variant)
        out = {}
        for side, v in zip(("users", "items"), pair):
            if isinstance(v, str) and v == "auto":
                out[side] = tuning.choose(info, f, side, stats[side], self.storage or "float32",
                                          solver, mode=mode)
            else:
                out[side] = self._given_config(v, mode)
        return out

    def _given_config(self, v, mode):
        """The caller's variant ``v`` as a :class:`Choice` (rule ``explicit``), used as given:
        a solver or storage it names is kept, and one that contradicts the ``solver`` /
        ``storage`` parameter is refused (:class:`InvalidConfigError`, reason ``"conflict"``),
        never replaced. What it leaves open is filled in and said in the reason: the ``solver``
        parameter, else the mode's untuned default (:data:`clmf.tuning.MODE_DEFAULT_SOLVER`:
        the fused CG for implicit feedback, Cholesky otherwise); the ``storage`` parameter."""
        from .. import tuning
        cfg = KernelConfig.parse(v)
        text = v if isinstance(v, str) else None           # a KernelConfig names every field

        def names(k):           # whether the variant names parameter k
            return text is None or re.search(rf"[:,]\s*{k}\s*=", text) is not None
        notes = []
        given = None if self.solver == "auto" else self.solver
        if names("solver"):
            if given is not None and given != cfg.solver:
                raise InvalidConfigError(
                    f"variant {str(v)!r} names solver={cfg.solver} but solver={given!r} was "
                    "given: drop one of them (a given variant is used as is, never changed)",
                    "conflict")
        else:
            s = given or tuning.MODE_DEFAULT_SOLVER.get(mode, KernelConfig.solver)
            if s != cfg.solver:
                cfg = cfg.replace(solver=s)
            notes.append(f"solver={s} (" + ("the solver parameter" if given else
                                            f"the {mode} default: the variant names none") + ")")
        if self.storage is not None and cfg.storage != self.storage:
            if names("storage"):
                raise InvalidConfigError(
                    f"variant {str(v)!r} names storage={cfg.storage} but storage="
                    f"{self.storage!r} was given: drop one of them", "conflict")
            cfg = cfg.replace(storage=self.storage)
            notes.append(f"storage={self.storage} (the storage parameter)")
        return tuning.Choice(cfg, "explicit", "variant given by the caller"
                      + ("; " + ", ".join(notes) if notes else ""))

    def _build_engine(self, devs, R, stats, global_mean, item_counts=None):
        """The fit's backend (one device's :class:`Engine` or a multi-device one) and the
        configurations per device: a chosen configuration that fails to build, lacks a kernel or
        exceeds a kernel's limits is rejected (one warning, see :mod:`clmf.tuning.fallback`) and
        that device's choice falls through to the next rule; a configuration given by the caller
        raises :class:`clmf.InvalidConfigError`."""
        from .. import tuning
        from ..engine.device import device_info
        from ..errors import InvalidConfigError
        from ..parallel import make_backend
        from ..tuning import fallback
        mode = tuning.fit_mode(self.feedback, self.biases)
        f = int(self.factors)
        infos = [device_info(d) for d in devs]
        while True:
            per_device = [self._resolve_configs(info, stats) for info in infos]
            try:
                engine = make_backend(devs, R, f, [(c["users"].config, c["items"].config)
                                                   for c in per_device],
                                      implicit_alpha=self._kernel_alpha(),
                                      biased=bool(self.biases),
                                      offset=global_mean if self.biases else 0.0,
                                      max_device_memory=self.max_device_memory,
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

    def _kernel_alpha(self):
        """The alpha the kernels weight implicit entries with (None: explicit feedback)."""
        return float(self.alpha) if self.feedback == "implicit" else None

    def _kernel_ratings(self, R):
        """``R`` as the kernels read it: the kernels weight an implicit entry by 1 + alpha·r, so
        ``confidence="alpha*r"`` passes r − 1/alpha (1 + alpha·(r − 1/alpha) = alpha·r)."""
        return confidence_rows(R, self)

    @property
    def _weighted(self):
        if self.weighted_regularization is None:
            return self.feedback != "implicit"
        return bool(self.weighted_regularization)

    # ----- fitting -------------------------------------------------------------------------
    def fit(self, X, y=None, *, show_progress=True, callback=None, init=None, validation=None,
            early_stopping_rounds=None):
        """Fit the factors to the explicit ratings ``X``.

        Parameters
        ----------
        X : scipy.sparse matrix/array (users × items; stored entries are ratings), a
            ``(user_idx, item_idx, ratings)`` tuple of 1-D arrays, or :class:`clmf.datasets.Ratings`.
        y : ignored (scikit-learn's signature of unsupervised estimators).
        show_progress : bool — a tqdm bar with the per-iteration train (and validation) RMSE.
        callback : ``callback(iteration, elapsed_seconds, metrics_dict)`` after each iteration.
        init : optional ``(X0, Y0)`` start factors of shapes (n_users, f) and (n_items, f).
        validation : optional held-out ratings (same forms as ``X``, same shape) scored each
            iteration on the device.
        early_stopping_rounds : stop when validation RMSE has not improved for this many
            iterations; the best iteration's factors are kept.

        Returns
        -------
        self
        """
        from ..engine.device import device_info
        from ..engine.memory import plan_fit
        from ..parallel import select_devices
        from ..parallel.devices import device_label

        # all-or-nothing: the new state is built in locals and assigned in one step at the end,
        # so a fit that fails or is interrupted (KeyboardInterrupt included) leaves a fitted
        # model exactly as it was
        t_fit, c_fit = time.perf_counter(), time.process_time()
        check_params(self)
        R = check_ratings(X)
        t_valid = time.perf_counter()
        implicit = self.feedback == "implicit"
        if implicit and R.nnz and value_range(R.data)[0] < 0:
            raise ValueError(f"implicit feedback needs non-negative strengths; X has "
                             f"{int((R.data < 0).sum())} negative value(s)")
        user_ids, item_ids = _id_maps_of(X)
        m, n = R.shape
        f = int(self.factors)
        user_counts = np.diff(R.indptr)
        item_counts = count_columns(R.indices, n)
        t_counts = time.perf_counter()
        if self.regularization == 0 and not implicit:
            _check_unregularized(user_counts, item_counts, f)
        V = None
        if validation is not None:
            V = check_ratings(validation, shape=R.shape, what="validation").tocoo()
        if early_stopping_rounds is not None:
            if V is None:
                raise ValueError("early_stopping_rounds needs validation data")
            if int(early_stopping_rounds) < 1:
                raise ValueError("early_stopping_rounds must be ≥ 1")
        if init is not None:
            if len(init) != 2:
                raise ValueError("init must be a pair (X0, Y0)")
            X0, Y0 = (np.asarray(a, dtype=np.float32) for a in init)
            if X0.shape != (m, f) or Y0.shape != (n, f):
                raise ValueError(f"init shapes must be {(m, f)} and {(n, f)}, got {X0.shape} and {Y0.shape}")
            if not (np.all(np.isfinite(X0)) and np.all(np.isfinite(Y0))):
                raise ValueError("init factors contain NaN/inf")

        t_checks = time.perf_counter()
        stats = {"users": _side_stats(user_counts, n), "items": _side_stats(item_counts, m)}
        devs = select_devices(self.device)
        info = device_info(devs[0])
        choices = self._resolve_configs(info, stats)
        configs = (choices["users"].config, choices["items"].config)
        t_tuning = time.perf_counter()
        want_train = bool(show_progress or callback is not None)
        # the memory plan, from shapes alone, before any large allocation: the host's here; the
        # devices' in the backend (one device's engine, or the multi-device/streamed planner,
        # which streams what does not fit), both before any buffer exists
        plan = plan_fit(m, n, R.nnz, f, configs, info, implicit=implicit, biased=bool(self.biases),
                        validation_nnz=0 if V is None else V.nnz,
                        train_metrics=want_train and not implicit,
                        early_stopping=early_stopping_rounds is not None)
        plan.check_host()
        t_plan = time.perf_counter()
        start = None
        if init is None:
            # drawn in a thread while the device is set up (the generator releases the GIL):
            # (m + n)·f numbers are a large part of the set-up at Netflix scale; the host's plan
            # above covers them
            start_pool = concurrent.futures.ThreadPoolExecutor(1)
            # (into page-aligned host rows in the devices' layout, which a CPU device's factor
            # buffers then wrap in place)
            from ..tuning import factor_width, fit_mode
            ldf = configs[0].ldf(factor_width(f, fit_mode(self.feedback, self.biases)))
            start = start_pool.submit(
                reference.start_factors, m, n, f, self.random_state,
                empty=lambda shape, dtype: host_factor_rows(shape[0], f, ldf, bool(self.biases)))
            start_pool.shutdown(wait=False)
        global_mean = value_sum(R.data) / R.nnz if R.nnz else float("nan")
        t_prep = time.perf_counter()
        engine, per_device = self._build_engine(devs, self._kernel_ratings(R), stats, global_mean,
                                                item_counts=item_counts)
        choices = per_device[0]
        configs = (choices["users"].config, choices["items"].config)
        t_engine = time.perf_counter()
        labels = [device_label(d) for d in devs]
        v_unknown_se, v_total = 0.0, 0
        if V is not None and (self.biases or implicit):
            v_unknown_se, v_total = 0.0, int(V.nnz)      # biases: the kernel predicts them itself
        elif V is not None:
            # ratings of users/items with no training ratings are predicted as global_mean_
            # (as predict() does): their error is constant, computed once on the host
            unk = (user_counts[V.row] == 0) | (item_counts[V.col] == 0)
            v_unknown_se = float(np.sum((global_mean - V.data[unk].astype(np.float64)) ** 2))
            v_total = int(V.nnz)
            V = sp.coo_matrix((V.data[~unk], (V.row[~unk], V.col[~unk])), shape=V.shape)
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
            steps = _DeviceSteps(self, engine, R, V, v_unknown_se, v_total, configs[0].storage,
                                 train=want_train and not implicit)
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
            res = loop.run(steps, int(self.iterations), callback=callback,
                           early_stopping_rounds=early_stopping_rounds,
                           monitor="validation_precision@10" if implicit else "validation_rmse",
                           higher_is_better=implicit, show_progress=show_progress, desc="ALS",
                           origin=t_start)
            memory = dict(engine.memory)
            timings["fit"] = time.perf_counter() - t_fit
        finally:
            engine.release()
        new = {
            "user_ids_": user_ids, "item_ids_": item_ids, "global_mean_": global_mean,
            "user_counts_": user_counts, "item_counts_": item_counts, "config_": choices,
            "device_": labels[0] if len(devs) == 1 else labels,
            "device_configs_": [{"device": lab, **c} for lab, c in zip(labels, per_device)],
            "memory_": memory, "timings_": timings, **self._learned(res),
        }
        self.__dict__.update(new)          # one step: nothing half-assigned
        self._invalidate_inference()       # the factors uploaded for inference are stale
        return self

    def _learned(self, res):
        """The fitted attributes of a :class:`~clmf.model.loop.FitResult`."""
        return {"history_": res.history, "best_iteration_": res.best_iteration,
                "user_factors_": res.user_factors, "item_factors_": res.item_factors,
                "user_biases_": res.user_biases if self.biases else None,
                "item_biases_": res.item_biases if self.biases else None}

    def _id_maps_from(self, X):
        """Set the raw-id maps of ``X`` (a Ratings) or None."""
        self.user_ids_, self.item_ids_ = _id_maps_of(X)

    # ----- inference -----------------------------------------------------------------------
    def _check_fitted(self):
        """Raise :class:`clmf.NotFittedError` (scikit-learn's, when installed) if not fitted."""
        if not self.__sklearn_is_fitted__():
            from ..errors import _not_fitted_error
            raise _not_fitted_error()(f"this {type(self).__name__} is not fitted yet; call "
                                      "fit() first")

    def __sklearn_is_fitted__(self):
        """Whether the model has learned factors (``sklearn.utils.validation.check_is_fitted``)."""
        return "user_factors_" in self.__dict__

    def __sklearn_tags__(self):
        """scikit-learn's estimator tags (≥ 1.6): an unsupervised estimator of sparse rating
        matrices that needs ``fit``. Only scikit-learn calls it, so it imports scikit-learn."""
        from sklearn.utils import InputTags, Tags, TargetTags
        return Tags(estimator_type=None, target_tags=TargetTags(required=False),
                    input_tags=InputTags(two_d_array=False, sparse=True), requires_fit=True)

    @classmethod
    def load(cls, file):
        """Read a model written by :meth:`save` (a path or a binary file object); see
        :func:`clmf.load`."""
        from .persistence import load
        model = load(file)
        if not isinstance(model, cls):
            raise TypeError(f"the file holds a {type(model).__name__}, not a {cls.__name__}")
        return model

    def predict(self, user_idx, item_idx):
        """Predicted ratings for element-wise pairs of 0-based indices.

        A user or item with no training ratings predicts ``global_mean_``.

        Examples
        --------
        >>> model.predict([0, 1], [10, 3])   # doctest: +SKIP
        array([3.81, 4.02], dtype=float32)
        """
        self._check_fitted()
        u, i = check_index_pairs(user_idx, item_idx, *self.shape_)
        p = np.einsum("ij,ij->i", self.user_factors_[u], self.item_factors_[i])
        if getattr(self, "user_biases_", None) is not None:
            # biased MF: unseen rows have zero factors and bias, so μ + the known side's bias
            return (p + self.global_mean_ + self.user_biases_[u] + self.item_biases_[i]).astype(np.float32)
        if self.feedback == "implicit":
            return p.astype(np.float32)          # preference scores; unseen rows score 0
        unknown = (self.user_counts_[u] == 0) | (self.item_counts_[i] == 0)
        p[unknown] = self.global_mean_
        return p.astype(np.float32)

    def save(self, path):
        """Write the fitted model to ``path`` (``.npz``, no pickle); see
        :mod:`clmf.model.persistence`.

        Parameters
        ----------
        path : str, path-like or a binary file object
            The target file (written exactly there, atomically), or an open file (anything
            with ``write``, e.g. ``open(p, "wb")`` or ``io.BytesIO()``), written at its position.

        Returns
        -------
        str or file object
            What was written to.

        Examples
        --------
        >>> model.save("model.npz")                          # doctest: +SKIP
        >>> same = clmf.load("model.npz")                    # doctest: +SKIP
        """
        from .persistence import save
        return save(self, path)

    @property
    def shape_(self):
        self._check_fitted()
        return (self.user_factors_.shape[0], self.item_factors_.shape[0])

    def rmse(self, X_test):
        """Root-mean-square error on held-out ratings (same forms as ``fit``'s ``X``)."""
        self._check_fitted()
        C = check_ratings(X_test, shape=self.shape_, what="X_test", allow_empty=True).tocoo()
        if C.nnz == 0:
            raise ValueError("X_test holds no ratings: the RMSE of an empty test set is undefined")
        err = self.predict(C.row, C.col).astype(np.float64) - C.data
        return float(np.sqrt(np.mean(err * err)))

    def score(self, X, y=None, *, user_items=None, k=10):
        """Higher is better (scikit-learn's ``score``): −RMSE on held-out ratings ``X`` for
        explicit feedback; for implicit feedback, precision@``k`` (default 10) of the held-out
        items ``X`` among each user's top-k recommendations, the items of ``user_items`` (the
        training matrix, recommended) left out of the ranking.

        Parameters
        ----------
        X : held-out ratings, same forms as ``fit``'s ``X`` and the model's shape
        y : ignored (scikit-learn's signature)
        user_items : optional sparse users × items matrix of items not to recommend (implicit)
        k : cut-off of the implicit score

        Examples
        --------
        >>> model.score(test)                      # doctest: +SKIP
        -0.9405
        """
        self._check_fitted()
        if self.feedback != "implicit":
            return -self.rmse(X)
        V = check_ratings(X, shape=self.shape_, what="X", allow_empty=True).tocoo()
        if V.nnz == 0:
            raise ValueError("X holds no held-out items: precision@k of an empty test set is "
                             "undefined")
        seen = (sp.csr_matrix(self.shape_, dtype=np.float32) if user_items is None else
                check_ratings(user_items, shape=self.shape_, what="user_items", allow_empty=True))
        return _precision_at_10(self.user_factors_, self.item_factors_, seen, V, k)


register_estimator(ALS)


def _id_maps_of(X):
    """The (user_ids, item_ids) raw-id maps of a Ratings, or (None, None)."""
    if hasattr(X, "user_ids") and hasattr(X, "item_ids"):
        return np.asarray(X.user_ids), np.asarray(X.item_ids)
    return None, None


def _range_error(engine, R, f, storage, regularization):
    """A :class:`RatingRangeError` when a failed or non-finite fit is explained by the ratings'
    magnitude — float overflow of the normal equations (or of float16 factors), or a
    regularization below float32 precision — else None (the original error stands)."""
    from ..data.validation import overflow_limit, precision_limit
    from ..errors import RatingRangeError
    counts = max(int(np.diff(R.indptr).max(initial=0)),
                 int(count_columns(R.indices, R.shape[1]).max(initial=0)), 1)
    rmax = float(np.abs(R.data).max(initial=0.0))
    big = 0.0
    try:
        for M in (engine.get_factors("users"), engine.get_factors("items")):
            with np.errstate(all="ignore"):
                a = np.abs(M.astype(np.float64))
            big = max(big, float(a.max(initial=0.0))) if np.isfinite(a).all() else np.inf
    except Exception:  # noqa: BLE001 - the diagnosis must not hide the original error
        pass
    fmax = float(np.finfo(np.float32).max)
    limit = overflow_limit(f, counts, storage)
    scale = 10.0 ** np.ceil(np.log10(max(rmax, 1e-30) / limit)) if rmax > limit else None
    if rmax > limit or big == np.inf or big * big * counts * max(f, 1) >= 0.01 * fmax:
        what = "float16 factor storage" if storage == "float16" else "float32"
        fix = (f"scale the ratings into that range (e.g. divide them by {scale:.0e}, and "
               "multiply predictions back)" if scale else "scale the ratings down")
        if storage == "float16":
            fix += (f", or use storage='float32' (ratings up to about "
                    f"{overflow_limit(f, counts):.1e})")
        return RatingRangeError(
            f"the normal equations overflowed the {what} range (largest |rating| {rmax:.3g}, "
            f"factors reached {big:.3g}): ratings up to about {limit:.1e} work at factors={f} "
            f"with up to {counts} ratings per user/item; {fix}")
    plimit = precision_limit(regularization)
    if plimit is not None and rmax > plimit:
        scale = 10.0 ** np.ceil(np.log10(rmax / plimit))
        return RatingRangeError(
            f"ratings up to |r| = {rmax:.3g} make the normal equations' entries so large that "
            f"regularization={regularization} falls below float32 precision (users/items with "
            f"fewer ratings than factors then have singular systems): ratings up to about "
            f"{plimit:.1e} work at this regularization; divide the ratings by {scale:.0e} (and "
            "multiply predictions back), or raise regularization in proportion to the scale")
    return None


def _check_unregularized(user_counts, item_counts, f):
    """Raise :class:`SingularSystemError` when, without regularization, a user or item with
    ratings has fewer of them than factors (its normal equations are singular)."""
    for side, counts in (("user", user_counts), ("item", item_counts)):
        bad = np.nonzero((counts > 0) & (counts < f))[0]
        if bad.size:
            raise SingularSystemError(
                f"regularization=0 with {bad.size} {side}(s) having fewer ratings than "
                f"factors={f} (first: {side} {int(bad[0])} with {int(counts[bad[0]])}): "
                "their normal equations are singular; use regularization > 0")


def _precision_at_10(X, Y, R, V, k=10):
    """precision@k (10) of held-out items V among items not in R (host; for implicit early
    stopping and ``score``)."""
    from ..inference.recommend import _top_n
    from ..metrics import precision_at_k
    users = np.unique(V.row)
    if users.size == 0:
        return float("nan")
    # the ranking recommend() uses (ties by item index), a block of users at a time (all users'
    # scores at once would be users × items floats)
    block = max(1, _SCORE_BLOCK_BYTES // (4 * max(1, Y.shape[0])))
    tops = []
    for b0 in range(0, users.size, block):
        ub = users[b0:b0 + block]
        S = X[ub] @ Y.T
        Rr = R[ub]
        S[np.repeat(np.arange(ub.size), np.diff(Rr.indptr)), Rr.indices] = -np.inf
        tops.append(_top_n(S, k)[0])
    top = np.concatenate(tops)
    Vc = sp.csr_matrix((np.ones_like(V.data), (V.row, V.col)), shape=V.shape)[users]
    relevant = [Vc.indices[Vc.indptr[j]:Vc.indptr[j + 1]] for j in range(users.size)]
    return float(precision_at_k(top, relevant, k))


class _DeviceSteps(loop.FitSteps):
    """:func:`clmf.model.loop.run`'s view of a fit on one or several devices in this process
    (:class:`clmf.engine.Engine` or :class:`clmf.parallel.MultiEngine`): metrics on the
    devices (train RMSE from their CSR, validation RMSE of triples) or, for implicit feedback,
    validation precision@10 on the host."""

    def __init__(self, model, engine, R, V, v_unknown_se, v_total, storage, train):
        """Keep the backend, the training ratings and the validation triples."""
        super().__init__(engine)
        self.R, self.V = R, V
        self.v_unknown_se, self.v_total = v_unknown_se, v_total
        self.storage, self.train = storage, train
        self.f = int(model.factors)
        self.regularization = float(model.regularization)
        self.weighted = model._weighted
        self.implicit = model.feedback == "implicit"
        self.rows = []              # row of each rating, for backends without a CSR metric

    def iterate(self, it):
        """One iteration, waited for; a singular system explained by the ratings' range is a
        :class:`RatingRangeError`."""
        try:
            self.engine.iteration(self.regularization, self.weighted)
        except SingularSystemError as e:
            raise self.non_finite_error() or e from None
        self.engine.finish()

    def metrics(self):
        """Train RMSE (explicit, when wanted) and the validation metric."""
        out = {}
        engine, V = self.engine, self.V
        if self.train:
            se, cnt = _train_squared_error(engine, self.R, self.rows)
            out["train_rmse"] = float(np.sqrt(se / cnt))
        if V is not None and self.implicit:
            out["validation_precision@10"] = _precision_at_10(
                engine.get_factors("users"), engine.get_factors("items"), self.R, V)
        elif V is not None:
            se = engine.squared_error("validation", V.row, V.col, V.data)[0] if V.nnz else 0.0
            out["validation_rmse"] = (float(np.sqrt((se + self.v_unknown_se) / self.v_total))
                                      if self.v_total else float("nan"))
        return out

    def non_finite_error(self):
        """A :class:`RatingRangeError` when the ratings' magnitude explains the failure."""
        return _range_error(self.engine, self.R, self.f, self.storage, self.regularization)


def _train_squared_error(engine, R, rows):
    """``(sse, count)`` on the training ratings: from the CSR already on the device where the
    backend can, else as triples (the rows expanded once into ``rows``)."""
    if hasattr(engine, "train_squared_error"):
        return engine.train_squared_error()
    if not rows:
        rows.append(np.repeat(np.arange(R.shape[0], dtype=np.int32), np.diff(R.indptr)))
    return engine.squared_error("train", rows[0], R.indices, R.data)


def _side_stats(counts, other):
    counts = np.asarray(counts)
    nz = counts[counts > 0]
    return {"rows": int(counts.size), "cols": int(other), "nnz": int(counts.sum()),
            "mean": float(nz.mean()) if nz.size else 0.0, "max": int(counts.max()) if counts.size else 0}
