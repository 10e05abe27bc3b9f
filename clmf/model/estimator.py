"""The ``ALS`` estimator: explicit-feedback alternating least squares on an OpenCL device."""
from __future__ import annotations

import logging
import time

import numpy as np

from ..data import frames
from ..data.validation import check_index_pairs, check_ratings
from ..engine.device import device_label
from ..inference.predict import predict_pairs
from ..inference.recommend import RecommenderMixin
from .inputs import _check_heldout_shape, _integral, _refuse_row_cv
from .params import ParamsMixin
from .persistence import register_estimator
from .trainer import DeviceTrainer

log = logging.getLogger(__name__)

__all__ = ["ALS"]


class ALS(ParamsMixin, RecommenderMixin):
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
        on one device ``engine_host`` (host CSR arrays), ``build`` of the programs (in threads;
        ``build_wait``: the part not hidden by the uploads), ``upload`` of the ratings,
        ``transpose`` (the items' CSR: on the device; on the host for a CPU device's small
        fits), ``upload_transpose`` their sum, ``buffers`` (scratch)),
        ``start_factors`` (waiting for the start factors drawn in a thread), ``factors_upload``,
        ``setup`` (all before the first iteration; ``setup_cpu``: its CPU seconds, all threads),
        ``wrap_up`` (past the last iteration: its metrics, the factors read back and checked),
        ``ranker`` (the factors and seen items kept on the device for ``recommend``) and
        ``fit`` (the whole call)
    best_iteration_ : int — iteration whose factors were kept (0-based)

    Examples
    --------
    >>> import clmf
    >>> train, test = clmf.data.default()              # doctest: +SKIP
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

    # ----- scikit-learn protocol: clmf.model.params.ParamsMixin ---------------------------
    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_engine", None)      # no OpenCL objects in a pickle; reconnect lazily
        state.pop("_topk_cache", None)  # the inference uploads, likewise
        state.pop("_warm_up", None)     # a warm-up's thread
        dev = state.get("device")
        if isinstance(dev, (list, tuple)):            # pyopencl.Devices → their names
            state["device"] = [d if isinstance(d, (str, type(None))) else device_label(d)
                               for d in dev]
        elif not isinstance(dev, (str, type(None))):  # a pyopencl.Device → its name, which
            state["device"] = device_label(dev)         # selects it again
        return state

    # ----- fitting -------------------------------------------------------------------------
    def warm_up(self, X=None, *, columns=None, wait=False):
        """Start a fit's set-up work in a background thread, ahead of :meth:`fit` (nothing is
        fitted; the parameters are read when the thread runs).

        The device(s) of ``device`` are selected and their contexts created, and a GPU's
        transpose program built; given the ratings ``X`` (the forms of :meth:`fit`), the tuning
        lookup runs for them and the programs a one-device fit of them runs are built (or loaded
        from the caches). A :meth:`fit` started meanwhile waits for a program still building
        instead of building it twice; one started later finds them built. Worth it for a first
        fit in a fresh process: an H100's cold builds took 2.0 s of a Netflix fit's set-up.

        Parameters
        ----------
        X : optional ratings, as :meth:`fit` takes them (``columns`` for a table).
        wait : bool — return only once the warm-up has ended (else at once).

        Returns
        -------
        self

        Examples
        --------
        >>> model = clmf.ALS(factors=100).warm_up(R)   # doctest: +SKIP
        >>> ...                                         # other work meanwhile
        >>> model.fit(R)                                # doctest: +SKIP
        """
        from . import warmup
        thread = warmup.start(self, X, columns)
        self._warm_up = thread
        if wait:
            thread.join()
        return self

    def fit(self, X, y=None, *, columns=None, show_progress=True, callback=None, init=None,
            validation=None, early_stopping_rounds=None, train_metrics=None):
        """Fit the factors to the ratings ``X``.

        Parameters
        ----------
        X : the ratings, one of
            - a scipy.sparse matrix/array (users × items; stored entries are ratings);
            - a ``(user_idx, item_idx, ratings)`` tuple of 1-D arrays of 0-based indices;
            - a :class:`clmf.data.Ratings`;
            - a table of raw ids: a pandas DataFrame or a pyarrow Table/RecordBatch with user,
              item and rating columns (``columns``; ids of any type, e.g. strings). As with
              :class:`clmf.dask.ALS` the model keeps the id maps (``user_ids_``/``item_ids_``,
              sorted raw ids), so :meth:`predict`, :meth:`rmse`, :meth:`score`,
              :meth:`recommend` (``user_items``) and :meth:`recommend_raw` take raw ids and
              tables too. Duplicate (user, item) rows are an error: aggregate them first (e.g.
              ``clmf.data.Ratings.from_pandas(df, duplicates="mean")``).
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
        # all-or-nothing: the trainer builds the new state and it is assigned in one step, so
        # a fit that fails or is interrupted (KeyboardInterrupt included) leaves a fitted model
        # exactly as it was
        t_fit, c_fit = time.perf_counter(), time.process_time()
        _refuse_row_cv(X)                  # scikit-learn's row folds: one clear error
        self._warm_inference()             # frees the ranking buffers, builds the GPU ranker
        # a training CSR's seen items, prepared in a thread while the fit iterates, uploaded
        # with the factors: recommend_all(user_items=X) right after finds them
        seen = self._prepare_seen(X)
        try:
            new = DeviceTrainer(self).fit(X, columns=columns, show_progress=show_progress,
                                          callback=callback, init=init, validation=validation,
                                          early_stopping_rounds=early_stopping_rounds,
                                          train_metrics=train_metrics, t_fit=t_fit,
                                          c_fit=c_fit,
                                          on_iterate=None if seen is None else seen.start)
            handed = new.pop("_handed", None)
            self.__dict__.update(new)      # one step: nothing half-assigned
            t_kept = time.perf_counter()
            # the new factors replace the old on the device (the fit's own buffers where the
            # ranker's layout is theirs)
            self._keep_on_device(seen, handed)
            t_end = time.perf_counter()
            self.timings_.update(ranker=t_end - t_kept, fit=t_end - t_fit)
        finally:
            if seen is not None:
                seen.close()               # no thread outlives the fit, failed or not
        return self

    # ----- inference -----------------------------------------------------------------------
    def _check_fitted(self):
        """Raise :class:`clmf.NotFittedError` (scikit-learn's, when installed) if not fitted."""
        if not self.__sklearn_is_fitted__():
            from ..errors import not_fitted_error
            raise not_fitted_error()(f"this {type(self).__name__} is not fitted yet; call "
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
            :class:`clmf.data.Ratings`). Ids that are not integers (e.g. strings) are raw
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
