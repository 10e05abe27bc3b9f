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
from ..data import frames
from ..data.scan import count_columns, value_sum
from ..data.validation import check_index_pairs, check_params, check_ratings, check_strengths
from ..engine.config import KernelConfig
from ..engine.core import host_factor_rows
from ..errors import InvalidConfigError, SingularSystemError
from ..inference.conventions import confidence_rows
from ..inference.predict import predict_pairs
from ..inference.recommend import RecommenderMixin
from ..tuning.fallback import show_progress as probe_progress
from . import inputs, loop
from .checks import _check_unregularized, _csr_range, _range_error, _side_stats
from .inputs import _check_heldout_shape, _heldout, _integral, _params_repr, _table_ratings
from .persistence import register_estimator

log = logging.getLogger(__name__)

__all__ = ["ALS"]

VALIDATION_K = 10          # implicit feedback's validation metric: strict precision@10
VALIDATION_METRIC = f"validation_precision@{VALIDATION_K}"


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
    max_device_memory : None, int or float — a cap on the device memory the fit plans with; an
        integer is bytes (``1`` is one byte, ``8 << 30`` 8 GiB), a float in (0, 1] a fraction of
        each device's memory (``1.0`` all of it; a float above 1 counts bytes); ratings that do
        not fit are streamed from host memory (see "Multi-device and out-of-core" in
        docs/guide/devices.md).
        Checked by :func:`clmf.data.validation.check_memory_cap`.

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
    history_ : list of dict — per iteration: ``seconds`` (the iteration alone) and its metrics:
        ``train_rmse`` (explicit feedback: every iteration, or only the last when nothing shows
        it: see ``fit``'s ``train_metrics``), ``validation_rmse``
        (explicit) or ``validation_precision@10`` (implicit) with ``validation=``
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
        """``ALS(...)`` with the parameters that differ from their defaults (a dtype by name:
        ``dtype='float16'``)."""
        return _params_repr(type(self).__name__, self.get_params(), self._repr_defaults())

    @classmethod
    def _repr_defaults(cls):
        """The parameters' defaults that :meth:`__repr__` leaves out."""
        return {k: p.default for k, p in inspect.signature(ALS.__init__).parameters.items()
                if k != "self"}

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
    def fit(self, X, y=None, *, columns=None, show_progress=True, callback=None, init=None,
            validation=None, early_stopping_rounds=None, train_metrics=None):
        """Fit the factors to the ratings ``X``.

        Parameters
        ----------
        X : the ratings, one of
            - a scipy.sparse matrix/array (users × items; stored entries are ratings);
            - a ``(user_idx, item_idx, ratings)`` tuple of 1-D arrays of 0-based indices;
            - a :class:`clmf.datasets.Ratings`;
            - a table of raw ids: a pandas DataFrame or a pyarrow Table/RecordBatch with user,
              item and rating columns (``columns``; ids of any type, e.g. strings). As with
              :class:`clmf.dask.ALS` the model keeps the id maps (``user_ids_``/``item_ids_``,
              sorted raw ids), so :meth:`predict`, :meth:`rmse`, :meth:`score`,
              :meth:`recommend` (``user_items``) and :meth:`recommend_raw` take raw ids and
              tables too. Duplicate (user, item) rows are an error: aggregate them first (e.g.
              ``clmf.datasets.Ratings.from_pandas(df, duplicates="mean")``).
        y : ignored (scikit-learn's signature of unsupervised estimators).
        columns : the ``(user, item, rating)`` column names of a table (default
            ``("user", "item", "rating")``; :mod:`clmf.data.frames`), of ``X`` and of a
            ``validation`` table.
        show_progress : bool — a tqdm bar with the per-iteration train (and validation) RMSE.
        callback : ``callback(iteration, elapsed_seconds, metrics_dict)`` after each iteration.
        train_metrics : None, True or False — the training RMSE (explicit feedback; one pass over
            the ratings on the device, 0.3-1× an iteration's time on a CPU): True every
            iteration; None (default) every iteration when a bar or a callback shows it, else for
            the last iteration only (``history_[-1]["train_rmse"]``: the fitted model's, at the
            cost of one pass); False never.
        init : the start factors: a pair ``(X0, Y0)`` of shapes (n_users, f) and (n_items, f), or
            a rule drawing them with ``random_state`` (:data:`clmf.reference.START_RULES`):
            ``"uniform"`` (U[0, 1)/√f) or ``"implicit"`` (0.01·U[0, 1), the `implicit` library's
            start). None (default): ``"implicit"`` for implicit feedback — from it clmf's
            precision@10 matches implicit's at the same parameters (with ``"uniform"`` it is about
            3% lower on MovieLens 100K) —, ``"uniform"`` otherwise.
        validation : optional held-out ratings (same forms as ``X``, same shape; a table of raw
            ids is matched through ``X``'s id maps, and its ids not in ``X`` are predicted as
            :meth:`predict` does — the global mean; with ``biases=True`` they are an error,
            with implicit feedback they are left out) scored each iteration on the device: the
            RMSE (``validation_rmse`` in ``history_``), or for implicit feedback the strict
            precision@10 of the held-out items among each user's top 10, training items left
            out (``validation_precision@10``; as :meth:`score`), counted on the device.
        early_stopping_rounds : stop when the validation metric has not improved for this many
            iterations; the best iteration's factors are kept.

        Returns
        -------
        self

        Examples
        --------
        >>> import pandas as pd                                   # doctest: +SKIP
        >>> df = pd.DataFrame({"user": ["ann", "bob", "ann"], "item": ["m1", "m1", "m2"],
        ...                    "rating": [4.0, 3.0, 5.0]})         # doctest: +SKIP
        >>> model = clmf.ALS(factors=2).fit(df)                   # doctest: +SKIP
        >>> model.predict(["bob"], ["m2"])                        # doctest: +SKIP
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
        inputs._refuse_row_cv(X)
        if frames.is_frame(X):
            X = _table_ratings(X, columns)
        R = check_ratings(X)
        t_valid = time.perf_counter()
        implicit = self.feedback == "implicit"
        if implicit:
            check_strengths(R)
        user_ids, item_ids = _id_maps_of(X)
        m, n = R.shape
        f = int(self.factors)
        user_counts = np.diff(R.indptr)
        item_counts = count_columns(R.indices, n)
        t_counts = time.perf_counter()
        if self.regularization == 0 and not implicit:
            _check_unregularized(user_counts, item_counts, f)
        V, v_unseen = None, np.zeros(0)
        if validation is not None:
            V, v_unseen = _heldout(validation, columns, user_ids, item_ids, R.shape)
            if v_unseen.size and self.biases:
                raise ValueError(f"the validation data has {v_unseen.size} rating(s) of ids not "
                                 "in the training data; with biases=True drop them first")
        if early_stopping_rounds is not None:
            if V is None:
                raise ValueError("early_stopping_rounds needs validation data")
            if int(early_stopping_rounds) < 1:
                raise ValueError("early_stopping_rounds must be ≥ 1")
        rule = None                         # the start rule, when the start is drawn here
        if init is None or isinstance(init, str):
            rule = reference.default_init(self.feedback) if init is None else init
            reference.start_rule(rule)
        else:
            if len(init) != 2:
                raise ValueError("init must be a pair (X0, Y0) or a start rule "
                                 f"{sorted(reference.START_RULES)}")
            X0, Y0 = (np.asarray(a, dtype=np.float32) for a in init)
            if X0.shape != (m, f) or Y0.shape != (n, f):
                raise ValueError(f"init shapes must be {(m, f)} and {(n, f)}, got {X0.shape} and {Y0.shape}")
            if not (np.all(np.isfinite(X0)) and np.all(np.isfinite(Y0))):
                raise ValueError("init factors contain NaN/inf")

        t_checks = time.perf_counter()
        stats = {"users": _side_stats(user_counts, n), "items": _side_stats(item_counts, m)}
        devs = select_devices(self.device)
        info = device_info(devs[0])
        with probe_progress(show_progress):
            choices = self._resolve_configs(info, stats)
        configs = (choices["users"].config, choices["items"].config)
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
        plan = plan_fit(m, n, R.nnz, f, configs, info, implicit=implicit, biased=bool(self.biases),
                        validation_nnz=0 if V is None else V.nnz,
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
            from ..tuning import factor_width, fit_mode
            ldf = configs[0].ldf(factor_width(f, fit_mode(self.feedback, self.biases)))
            start = start_pool.submit(
                reference.start_factors, m, n, f, self.random_state, init=rule,
                empty=lambda shape, dtype: host_factor_rows(shape[0], f, ldf, bool(self.biases)))
            start_pool.shutdown(wait=False)
        global_mean = value_sum(R.data) / R.nnz if R.nnz else float("nan")
        t_prep = time.perf_counter()
        with probe_progress(show_progress):
            engine, per_device = self._build_engine(devs, self._kernel_ratings(R), stats,
                                                    global_mean, item_counts=item_counts)
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
            # (and those of raw ids not in the training data)
            v_unknown_se = float(np.sum((global_mean - np.concatenate(
                [V.data[unk], v_unseen]).astype(np.float64)) ** 2))
            v_total = int(V.nnz) + int(v_unseen.size)
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
                                 train=want_train and train_when, device=devs[0])
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
                           monitor=VALIDATION_METRIC if implicit else "validation_rmse",
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

    def predict(self, user_idx, item_idx=None, *, raw_ids=None, columns=None):
        """Predicted ratings of element-wise (user, item) pairs.

        Parameters
        ----------
        user_idx, item_idx : array_like
            0-based indices, or raw ids of a model fitted on raw ids (a table, a
            :class:`clmf.datasets.Ratings`). Ids that are not integers (e.g. strings) are raw
            ids; integer raw ids need ``raw_ids=True``.
        item_idx : omitted when ``user_idx`` is a table of raw ids (pandas DataFrame, pyarrow
            Table) with user and item columns (``columns``, as :meth:`fit`): one prediction a
            row.
        raw_ids : None (decide by the ids' type), True (raw ids) or False (indices).
        columns : the ``(user, item, rating)`` column names of a table.

        Returns
        -------
        numpy.ndarray of float32

        Notes
        -----
        A user or item with no training ratings, or a raw id the model does not know, predicts
        ``global_mean_`` (with biases: the mean plus the known side's bias; implicit
        feedback: 0). Indices out of range raise ``IndexError``.

        Examples
        --------
        >>> model.predict([0, 1], [10, 3])   # doctest: +SKIP
        array([3.81, 4.02], dtype=float32)
        >>> model.predict(["u1"], ["m1"])    # a model fitted on raw ids  # doctest: +SKIP
        >>> model.predict(test_df)           # one prediction per row    # doctest: +SKIP
        """
        self._check_fitted()
        if item_idx is None:
            if not frames.is_frame(user_idx):
                raise TypeError("predict takes (user ids, item ids), or one table (DataFrame) "
                                "of user and item columns")
            u, i, _ = self._table_codes(user_idx, columns, ratings=False, what="X")
        elif raw_ids or (raw_ids is None and not (_integral(user_idx) and _integral(item_idx))):
            u = np.atleast_1d(self._raw_codes("user", np.ravel(np.asarray(user_idx))))
            i = np.atleast_1d(self._raw_codes("item", np.ravel(np.asarray(item_idx))))
            if u.shape != i.shape:
                raise ValueError(f"user and item ids differ in length: {u.size} vs {i.size}")
        else:
            u, i = check_index_pairs(user_idx, item_idx, *self.shape_)
        return self._predict_codes(u, i)

    def _predict_codes(self, u, i):
        """Predictions of index pairs, -1 for an id unknown to the model
        (:func:`clmf.inference.predict.predict_pairs`)."""
        return predict_pairs(self.user_factors_, self.item_factors_, u, i,
                             global_mean=self.global_mean_, user_counts=self.user_counts_,
                             item_counts=self.item_counts_,
                             user_biases=getattr(self, "user_biases_", None),
                             item_biases=getattr(self, "item_biases_", None),
                             implicit=self.feedback == "implicit")

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

    def rmse(self, X_test, columns=None):
        """Root-mean-square error on held-out ratings: the forms of :meth:`fit`'s ``X`` (a
        table of raw ids through the model's id maps, with ``columns``; its ids the model does
        not know predicted as :meth:`predict` does — the global mean), the model's shape."""
        self._check_fitted()
        if frames.is_frame(X_test):
            u, i, r = self._table_codes(X_test, columns, what="X_test")
        else:
            _check_heldout_shape(X_test, self.shape_, "X_test")
            C = check_ratings(X_test, shape=self.shape_, what="X_test", allow_empty=True).tocoo()
            u, i, r = C.row, C.col, C.data
        if len(r) == 0:
            raise ValueError("X_test holds no ratings: the RMSE of an empty test set is undefined")
        err = self._predict_codes(u, i).astype(np.float64) - r
        return float(np.sqrt(np.mean(err * err)))

    def score(self, X, y=None, *, user_items=None, k=10, columns=None):
        """Higher is better (scikit-learn's ``score``): −RMSE on held-out ratings ``X`` for
        explicit feedback; for implicit feedback the **strict** precision@``k`` (default 10) of
        the held-out items ``X``: each user's hits among its top-``k`` recommendations divided by
        ``k``, averaged over the users with held-out items, the items of ``user_items`` (the
        training matrix) left out of the ranking, ranked on the model's device.

        This is ``clmf.evaluate(model, user_items, X, K=k)["strict_precision"]`` and the
        ``validation_precision@10`` a fit records, not the ``"precision"`` of the ``implicit``
        library's ``ranking_metrics_at_k`` (hits divided by ``min(k, |held-out items|)``; five
        times larger with two held-out items per user): :func:`clmf.evaluate` returns both.

        Parameters
        ----------
        X : held-out ratings, same forms as ``fit``'s ``X`` (a table of raw ids too, with
            ``columns``; implicit: its ids the model does not know are left out) and the
            model's shape
        y : ignored (scikit-learn's signature)
        user_items : optional sparse users × items matrix (or table of raw ids) of items not
            to recommend (implicit)
        k : cut-off of the implicit score
        columns : the ``(user, item, rating)`` column names of tables

        Examples
        --------
        >>> model.score(test)                      # doctest: +SKIP
        -0.9405
        """
        self._check_fitted()
        if self.feedback != "implicit":
            return -self.rmse(X, columns)
        if frames.is_frame(X):
            u, i, r = self._table_codes(X, columns, what="X")
            known = (u >= 0) & (i >= 0)
            X = (u[known], i[known], r[known])
        user_items = self._known_pairs(user_items, "user_items", columns)
        _check_heldout_shape(X, self.shape_, "X")
        V = check_ratings(X, shape=self.shape_, what="X", allow_empty=True)
        if V.nnz == 0:
            raise ValueError("X holds no held-out items: precision@k of an empty test set is "
                             "undefined")
        seen = (None if user_items is None else
                check_ratings(user_items, shape=self.shape_, what="user_items", allow_empty=True))
        from ..inference.evaluation import model_evaluator
        ev, Q, F = model_evaluator(self, seen, V, k)
        return ev.strict_precision(Q, F)


register_estimator(ALS)


def _id_maps_of(X):
    """The (user_ids, item_ids) raw-id maps of a Ratings, or (None, None)."""
    if hasattr(X, "user_ids") and hasattr(X, "item_ids"):
        return np.asarray(X.user_ids), np.asarray(X.item_ids)
    return None, None


class _DeviceSteps(loop.FitSteps):
    """:func:`clmf.model.loop.run`'s view of a fit on one or several devices in this process
    (:class:`clmf.engine.Engine` or :class:`clmf.parallel.MultiEngine`): metrics on the
    devices (train RMSE from their CSR, validation RMSE of triples) or, for implicit feedback,
    validation precision@10 counted on the device (:class:`FitValidation`, built once)."""

    def __init__(self, model, engine, R, V, v_unknown_se, v_total, storage, train, device=None):
        """Keep the backend, the training ratings and the validation triples (implicit feedback:
        a :class:`FitValidation` of them, counting on ``device``)."""
        super().__init__(engine)
        self.R, self.V = R, V
        self.v_unknown_se, self.v_total = v_unknown_se, v_total
        self.storage, self.train = storage, train
        self.f = int(model.factors)
        self.regularization = float(model.regularization)
        self.weighted = model._weighted
        self.implicit = model.feedback == "implicit"
        self.rows = []              # row of each rating, for backends without a CSR metric
        self.it, self.last = -1, int(model.iterations) - 1
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
        return _range_error(self.engine, *_csr_range(self.R), self.f, self.storage,
                            self.regularization)


def _train_squared_error(engine, R, rows):
    """``(sse, count)`` on the training ratings: from the CSR already on the device where the
    backend can, else as triples (the rows expanded once into ``rows``)."""
    if hasattr(engine, "train_squared_error"):
        return engine.train_squared_error()
    if not rows:
        rows.append(np.repeat(np.arange(R.shape[0], dtype=np.int32), np.diff(R.indptr)))
    return engine.squared_error("train", rows[0], R.indices, R.data)
