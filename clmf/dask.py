"""ALS on a Dask cluster: ``clmf.dask.ALS`` (issue 15). Needs ``pip install 'clmf[dask]'``.

The fit is :mod:`clmf.parallel`'s partitioned ALS with Dask as its engine: one
:class:`~clmf.engine.Engine` per Dask worker (one worker per OpenCL device),
rating blocks resident on their worker's device for the whole fit, factor blocks (or partial
normal equations) moved between workers as Dask results. Raw ids are mapped to dense indices on
the workers; the fitted model is a :class:`clmf.ALS` (factors gathered to the client) that keeps
the id maps, scores raw-id frames (:meth:`ALS.rmse`) and recommends for every user on the
workers (:meth:`ALS.recommend_all`). See docs/guide/dask.md.

Devices: each worker takes ``CLMF_DEVICE`` from its environment when ``device="auto"``; with
``device="gpu"`` (or ``"cpu"``) the k-th worker of a host takes that host's k-th device of the
type; a list gives worker k (in address order) ``device[k]``.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from .errors import SingularSystemError
from .model import loop
from .model.checks import range_error
from .model.estimator import ALS as _ALS
from .model.trainer import Trainer, check_stopping
from .parallel.dask_backend import WorkerLostError, get_client
from .tuning.spec import side_stats

log = logging.getLogger(__name__)

__all__ = ["ALS", "WorkerLostError", "load_checkpoint"]

_CKPT_FORMAT = "clmf-dask-checkpoint-1"


class ALS(_ALS):
    """:class:`clmf.ALS` fitted on a Dask cluster; ``client`` (default: the current
    :class:`distributed.Client`), ``workers`` (default: all) and the parameters of
    :class:`clmf.ALS`. ``device`` is per worker (module docstring).

    The fitted object is a :class:`clmf.ALS` in every respect (``save``/``clmf.load`` give a
    plain one), with ``user_ids_`` / ``item_ids_`` the raw ids of the rows (sorted), and
    ``workers_`` (the fit's worker addresses), ``device_`` (their devices), ``plan_`` (the
    :class:`clmf.parallel.Plan`), ``transport_`` (how solved blocks moved between the workers:
    "shared memory" on one host, else "dask comms"; ``CLMF_DASK_SHARED_MEMORY=0`` in the
    workers' environment keeps the comms; on one host each worker then runs the iterations
    itself, a group per task, unless ``CLMF_DASK_WORKER_LOOP=0`` in the client's: see
    :mod:`clmf.parallel.dask_backend`), ``time_to_first_iteration_`` (seconds from ``fit`` to
    the end of the first iteration) and ``fit_times_`` (the set-up's stages in seconds:
    ``prepare_s`` and ``prepare``, the ratings encoded on the workers; ``set_up_s`` and
    ``engine``, the rest as the client saw it; ``probe``, each probed worker's lookup and
    builds, one worker per kind of device; ``workers``, each worker's own stages; ``loop``,
    per iteration run in the workers' own loop each worker's parts of it: ``seconds``,
    ``compute``, ``exchange``, ``take``, ``publish_copy`` and where the half-steps' tails after
    its kernels went, ``publish_tail``, ``peers_tail``, ``fetch_tail``, ``upload_tail``
    (:func:`clmf.parallel.dask_board.tail_parts`); ``board``, each worker's staging and
    host copy rates, :func:`clmf.parallel.dask_tasks.board_connect`).
    """

    _repr_name = "clmf.dask.ALS"

    def __init__(self, factors=64, regularization=0.1, iterations=15, *,
                 weighted_regularization=None, solver="auto", variant="auto", device="auto",
                 dtype=np.float32, random_state=None, storage=None, feedback="explicit",
                 alpha=1.0, confidence="1+alpha*r", biases=False, max_device_memory=None,
                 client=None, workers=None):
        """Keep the parameters (scikit-learn protocol: every one named, defaults as
        :class:`clmf.ALS`'s)."""
        super().__init__(factors, regularization, iterations,
                         weighted_regularization=weighted_regularization, solver=solver,
                         variant=variant, device=device, dtype=dtype, random_state=random_state,
                         storage=storage, feedback=feedback, alpha=alpha, confidence=confidence,
                         biases=biases, max_device_memory=max_device_memory)
        self.client = client
        self.workers = workers

    def __getstate__(self):
        """Picklable state: no client."""
        state = super().__getstate__()
        state["client"] = None
        return state

    # ----- fitting -------------------------------------------------------------------------
    def fit(self, X, y=None, *, columns=None, show_progress=True, callback=None,
            init=None, validation=None, early_stopping_rounds=None, checkpoint=None,
            checkpoint_every=1, resume=None, modes=None, on_worker_lost="raise"):
        """Fit on the cluster.

        Parameters
        ----------
        X : a dask or pandas DataFrame of ``columns`` (raw ids of any type), a parquet path, a
            scipy.sparse matrix or :class:`clmf.data.Ratings` (scattered to the workers).
        y : ignored (scikit-learn's signature).
        columns : the user, item and rating column names (default ``("user", "item",
            "rating")``; the rules of :mod:`clmf.data.frames`, as :meth:`clmf.ALS.fit`).
        show_progress, callback, init, early_stopping_rounds : as :meth:`clmf.ALS.fit`.
        validation : held-out ratings in the same form (raw ids; ids unseen in training are
            predicted as the global mean, as :meth:`clmf.ALS.predict` does); explicit feedback.
        checkpoint : a path or fsspec URL; the factors are written there (atomically) every
            ``checkpoint_every`` iterations and at the end.
        resume : a checkpoint to continue from (same data and parameters): its iterations are
            not run again.
        modes : optional side → "replicate"/"reduce" (default: the partition plan's rule).
        on_worker_lost : "raise" (default) or "resume": when a worker holding blocks leaves the
            cluster, "resume" starts the fit again from the last checkpoint on the workers then
            in the cluster (needs ``checkpoint``; at most 3 times), redoing the lost iterations.

        Raises
        ------
        WorkerLostError
            A worker holding blocks left the cluster; the message names the checkpoint to
            resume from (``fit(X, resume=...)``).
        """
        if on_worker_lost not in ("raise", "resume"):
            raise ValueError("on_worker_lost must be 'raise' or 'resume'")
        if on_worker_lost == "resume" and checkpoint is None:
            raise ValueError("on_worker_lost='resume' needs checkpoint=PATH")
        from .data.frames import rating_columns
        kw = dict(columns=rating_columns(columns), show_progress=show_progress,
                  callback=callback, init=init, validation=validation,
                  early_stopping_rounds=early_stopping_rounds,
                  checkpoint=checkpoint, checkpoint_every=checkpoint_every, modes=modes)
        for attempt in range(4):
            try:
                return self._fit_once(X, resume=resume, **kw)
            except WorkerLostError as e:
                if on_worker_lost == "raise" or attempt == 3 or not _exists(checkpoint):
                    raise
                log.warning("%s; resuming from %s on the workers left", e.__cause__ or e,
                            checkpoint)
                resume = checkpoint
        raise AssertionError("unreachable")

    def _fit_once(self, X, *, columns, show_progress, callback, init, validation,
                  early_stopping_rounds, checkpoint, checkpoint_every, resume, modes):
        """One attempt of :meth:`fit`."""
        new = _DaskTrainer(self).fit(
            X, columns=columns, show_progress=show_progress, callback=callback, init=init,
            validation=validation, early_stopping_rounds=early_stopping_rounds,
            checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume=resume, modes=modes)
        self.__dict__.update(new)          # one step: nothing half-assigned
        self._invalidate_inference()       # the factors uploaded for inference are stale
        return self

    # ----- raw-id scoring and recommending ---------------------------------------------------
    def _state(self):
        """The fitted model as the dict the worker tasks score with."""
        import pandas as pd
        self._check_fitted()
        uids, iids = getattr(self, "user_ids_", None), getattr(self, "item_ids_", None)
        return {"X": self.user_factors_, "Y": self.item_factors_,
                "bu": getattr(self, "user_biases_", None),
                "bi": getattr(self, "item_biases_", None), "mean": self.global_mean_,
                "feedback": self.feedback, "user_counts": self.user_counts_,
                "item_counts": self.item_counts_, "user_ids": uids, "item_ids": iids,
                "user_index": pd.Index(uids) if uids is not None else None,
                "item_index": pd.Index(iids) if iids is not None else None}

    def rmse(self, X_test, columns=None):
        """RMSE on held-out ratings: a dask DataFrame of raw ids (``columns``; ids not seen in
        training are predicted as :meth:`predict` does) scored on the workers, anything else
        (a pandas DataFrame or Arrow table of raw ids included) as :meth:`clmf.ALS.rmse`."""
        from .data.frames import check_columns, is_dask_frame, rating_columns
        from .parallel import dask_tasks as T
        if not is_dask_frame(X_test):
            return super().rmse(X_test, columns)
        columns = check_columns(X_test, rating_columns(columns), "X_test")
        client = get_client(self.client)
        st = client.scatter([self._state()], broadcast=True, hash=False)[0]
        parts = client.compute(X_test[list(columns)].to_delayed())
        res = client.gather(client.map(T.partition_sse, parts, columns=columns, state=st,
                                       pure=False))
        se, cnt = sum(r[0] for r in res), sum(r[1] for r in res)
        if cnt == 0:
            raise ValueError("X_test is empty")
        return float(np.sqrt(se / cnt))

    def recommend_all(self, N=10, *, users_per_task=None):
        """Top-``N`` items for every user as a dask DataFrame ``(user, item, score, rank)``
        (raw ids, rank 1 = best), computed on the workers by :meth:`clmf.ALS.recommend`'s
        scoring without the seen-item filter (Spark's ``recommendForAllUsers``); write it with
        ``to_parquet``. Each task ranks its users on its worker's default device (``CLMF_DEVICE``
        of the worker's environment, else "auto"; the device top-k where the work passes the
        host threshold, else NumPy), the items uploaded per task."""
        import dask.dataframe as dd
        import pandas as pd

        client = get_client(self.client)
        self._check_fitted()
        m = self.user_factors_.shape[0]
        n_workers = max(1, len(client.nthreads()))
        step = int(users_per_task or max(1, min(50_000, -(-m // (4 * n_workers)))))
        st = self._state()
        st.pop("X")
        st.pop("user_index")
        st.pop("item_index")
        sf = client.scatter([st], broadcast=True, hash=False)[0]
        starts = list(range(0, m, step))
        blocks = client.scatter([self.user_factors_[a:a + step] for a in starts], hash=False)
        futs = [client.submit(recommend_block, b, a, sf, int(N), pure=False)
                for b, a in zip(blocks, starts)]
        uids, iids = st["user_ids"], st["item_ids"]
        meta = pd.DataFrame({
            "user": pd.Series([], dtype=(uids.dtype if uids is not None else np.int64)),
            "item": pd.Series([], dtype=(iids.dtype if iids is not None else np.int64)),
            "score": pd.Series([], dtype=np.float32), "rank": pd.Series([], dtype=np.int32)})
        return dd.from_delayed(futs, meta=meta, verify_meta=False)


class _DaskTrainer(Trainer):
    """:class:`clmf.model.trainer.Trainer` over the Dask backend
    (:class:`~clmf.parallel.dask_backend.DaskEngine`): the ratings prepared on the workers, the
    configuration looked up on one worker per kind of device, checkpoints after iterations."""

    desc = "ALS (dask)"

    def fit(self, X, *, columns, show_progress, callback, init, validation,
            early_stopping_rounds, checkpoint, checkpoint_every, resume, modes):
        """The fitted attributes of one attempt of :meth:`ALS.fit`."""
        from .parallel.dask_backend import EarlySetUp, device_facts, fit_workers
        est = self.est
        client = get_client(est.client)
        addrs, ranks = fit_workers(client, est.workers)
        specs = (list(est.device) if isinstance(est.device, (list, tuple))
                 else [est.device] * len(addrs))
        if len(specs) != len(addrs):
            raise ValueError(f"device lists {len(specs)} devices for {len(addrs)} workers")
        t_start = time.perf_counter()
        facts = device_facts(client, addrs, ranks, specs)   # (while the ratings are prepared)
        early = EarlySetUp.start(client, addrs)              # the shared-memory check, likewise
        try:
            return self._fit(X, client, addrs, ranks, specs, facts, early, t_start,
                             columns=columns, show_progress=show_progress, callback=callback,
                             init=init, validation=validation,
                             early_stopping_rounds=early_stopping_rounds,
                             checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                             resume=resume, modes=modes)
        except BaseException:
            if not early.taken:      # failed before the engine took it over (it cleans up)
                early.abandon(client, addrs)
            raise

    def _fit(self, X, client, addrs, ranks, specs, facts, early, t_start, *, columns,
             show_progress, callback, init, validation, early_stopping_rounds, checkpoint,
             checkpoint_every, resume, modes):
        """:meth:`fit` once the workers' facts and the fit's early set-up are submitted."""
        from . import reference
        from .parallel.dask_backend import DaskEngine, prepare
        spec, est = self.spec, self.est
        implicit = spec.implicit
        data = prepare(client, X, columns, shift=spec.shift,     # the kernels' view (confidence)
                       workers=addrs)
        fit_times = {"prepare_s": time.perf_counter() - t_start}
        m, n = data.shape
        f = spec.f
        if implicit and data.minimum < 0:
            raise ValueError("implicit feedback needs non-negative strengths; X has negative "
                             "values")
        self.check_unregularized(data.user_counts, data.item_counts)
        check_stopping(early_stopping_rounds, validation is not None)
        if validation is not None and implicit:
            raise ValueError("clmf.dask scores validation data of explicit feedback only "
                             "(implicit: evaluate the fitted model with clmf.metrics)")
        start, history = 0, []
        if resume is not None:
            ck = load_checkpoint(resume)
            if ck["shape"] != (m, n) or ck["factors"] != f:
                raise ValueError(f"checkpoint {resume} is of a {ck['shape']} fit with "
                                 f"factors={ck['factors']}, not {(m, n)} with factors={f}")
            init = (ck["X"], ck["Y"])
            init_b = (ck["bu"], ck["bi"])
            start, history = ck["iteration"] + 1, list(ck["history"])
        else:
            init_b = (None, None)
        rule, X0, Y0 = self.start(init, m, n)
        stats = {"users": side_stats(data.user_counts, n),
                 "items": side_stats(data.item_counts, m)}
        global_mean = float(data.total / data.nnz)
        seed = est.random_state
        if rule is not None and (seed is None or isinstance(seed, (int, np.integer))):
            # the workers draw the start factors beside their blocks: only the seed is sent
            seed = int(np.random.SeedSequence().entropy) if seed is None else int(seed)
            drawn = (rule, seed)
        elif rule is not None:             # a generator object: drawn here, as in-process
            X0, Y0 = reference.start_factors(m, n, f, seed, init=rule)
            rule, drawn = None, None
        else:
            drawn = None
        t_engine = time.perf_counter()
        try:
            engine = DaskEngine(client, addrs, ranks, specs, data, spec, stats,
                                offset=global_mean if spec.biased else 0.0,
                                max_device_memory=est.max_device_memory, modes=modes,
                                start=drawn, facts=facts, early=early)
        finally:
            data.release()
        fit_times["prepare"] = dict(data.times)
        fit_times["set_up_s"] = time.perf_counter() - t_engine
        fit_times["engine"] = dict(engine.times)
        fit_times["probe"] = dict(engine.probe_times)
        fit_times["workers"] = engine.worker_times
        try:
            v_rest = None
            if validation is not None:
                vd = prepare(client, validation, columns, maps=(data.user_ids, data.item_ids))
                v_rest = engine.set_heldout("validation", vd, global_mean,
                                            to_mean=not spec.biased)
                vd.release()
                if v_rest[2] and spec.biased:
                    raise ValueError(f"the validation data has {v_rest[2]} rating(s) of ids not "
                                     "in the training data; with biases=True drop them first")
            if rule is None:                   # the caller's start, or a checkpoint's
                t_factors = time.perf_counter()
                engine.set_factors("users", X0, init_b[0])
                engine.set_factors("items", Y0, init_b[1])
                fit_times["factors_s"] = time.perf_counter() - t_factors
            steps = _DaskSteps(engine, v_rest, spec.regularization, spec.weighted,
                               train=not implicit,      # history_ as clmf.ALS's, shown or not
                               checkpoint=checkpoint, every=checkpoint_every,
                               iterations=self.iterations,
                               ratings_range=(max(int(data.user_counts.max(initial=0)),
                                                  int(data.item_counts.max(initial=0))),
                                              max(abs(data.minimum), abs(data.maximum))),
                               storage=np.dtype(engine.np_store).name,
                               grouped=early_stopping_rounds is None)
            res = self.run(steps, start=start, history=history, callback=callback,
                           early_stopping_rounds=early_stopping_rounds,
                           show_progress=show_progress, origin=t_start)
            memory = dict(engine.memory)
            if engine.splits:
                fit_times["loop"] = engine.splits
            if getattr(engine, "board_facts", None):
                fit_times["board"] = engine.board_facts
        except WorkerLostError as e:
            raise WorkerLostError(f"{e}. The fit cannot go on without that worker's blocks. "
                                  + _resume_hint(checkpoint)) from e
        finally:
            engine.release()
        return {"fit_times_": fit_times, "global_mean_": global_mean,
                "user_counts_": data.user_counts, "item_counts_": data.item_counts,
                "user_ids_": data.user_ids, "item_ids_": data.item_ids,
                "config_": engine.choices[0], "device_": list(engine.labels),
                "device_configs_": [{"device": lab, **c}
                                    for lab, c in zip(engine.labels, engine.choices)],
                "workers_": list(addrs), "plan_": engine.plan, "memory_": memory,
                "transport_": engine.transport,
                "time_to_first_iteration_": res.first_iteration_s, **self.learned(res)}


def recommend_block(X, r0, state, N):
    """Top-``N`` rows ``(user, item, score, rank)`` of users ``r0 ..`` whose factors are ``X``,
    by the single-host :meth:`clmf.ALS.recommend` (no seen-item filter), raw ids restored (a
    task run on a worker)."""
    import pandas as pd
    m = _ALS(factors=X.shape[1], feedback=state["feedback"])
    m.user_factors_ = X
    m.item_factors_ = state["Y"]
    m.global_mean_ = state["mean"]
    m.user_biases_ = state["bu"][r0:r0 + len(X)] if state["bu"] is not None else None
    m.item_biases_ = state["bi"]
    m.user_counts_ = state["user_counts"][r0:r0 + len(X)]
    m.item_counts_ = state["item_counts"]
    ids, scores = m.recommend(np.arange(len(X)), N=N, filter_already_liked_items=False)
    k = ids.shape[1]
    users = np.repeat(np.arange(r0, r0 + len(X)), k)
    items = ids.reshape(-1)
    keep = items >= 0
    uids, iids = state["user_ids"], state["item_ids"]
    return pd.DataFrame({
        "user": (uids[users[keep]] if uids is not None else users[keep]),
        "item": (iids[items[keep]] if iids is not None else items[keep]),
        "score": scores.reshape(-1)[keep].astype(np.float32),
        "rank": np.tile(np.arange(1, k + 1, dtype=np.int32), len(X))[keep]})


def _exists(path):
    """Whether a checkpoint exists at ``path`` (any fsspec URL)."""
    import fsspec
    if path is None:
        return False
    fs, p = fsspec.core.url_to_fs(str(path))
    return fs.exists(p)


def _resume_hint(checkpoint):
    """The sentence of a :class:`WorkerLostError` that says how to resume."""
    if checkpoint is None:
        return ("No checkpoint was written: fit again with checkpoint=PATH (every "
                "checkpoint_every iterations) to be able to resume.")
    try:
        ck = load_checkpoint(checkpoint)
        done = f"iteration {ck['iteration']}"
    except FileNotFoundError:
        return (f"No checkpoint reached {checkpoint} yet; fit again (from the start) on the "
                "remaining workers.")
    return (f"The factors after {done} are checkpointed at {checkpoint}: resume on the remaining "
            f"workers with clmf.dask.ALS(<same parameters>).fit(<same data>, "
            f"resume={checkpoint!r}, checkpoint={checkpoint!r}).")


class _DaskSteps(loop.FitSteps):
    """:func:`clmf.model.loop.run`'s view of a :class:`~clmf.parallel.dask_backend.DaskEngine`:
    RMSEs summed on the workers, a checkpoint every ``every`` iterations and after the last.

    Where the workers run their own loop (:attr:`DaskEngine.loop`) and ``grouped`` (no early
    stopping: nothing needs the factors of an iteration the workers went past), the iterations
    between two checkpoints run in groups of one task per worker lasting about
    :attr:`GROUP_SECONDS` (the first iteration alone: it measures one), the metrics of each
    computed on the workers after it; each iteration's seconds are its workers' time plus an
    equal share of the group's wall time around them (task round trips), so the history's
    seconds add up to the fit's wall time as before. Progress and callbacks then come a group
    at a time."""

    GROUP_SECONDS = 2.0

    def __init__(self, engine, v_rest, regularization, weighted, *, train, checkpoint, every,
                 iterations, ratings_range=None, storage="float32", grouped=False):
        """Keep the engine, the held-out ratings predicted as the mean (``v_rest``), the
        regularisation, the checkpoint policy and, for diagnosing overflow, ``(largest count
        per user/item, largest |rating|)`` and the factors' storage; ``grouped``: iterations
        may run in groups."""
        super().__init__(engine)
        self.v_rest, self.train = v_rest, train
        self.regularization, self.weighted = regularization, weighted
        self.checkpoint, self.every, self.iterations = checkpoint, max(1, int(every)), iterations
        self.ratings_range, self.storage = ratings_range, storage
        self.grouped = bool(grouped) and bool(getattr(engine, "loop", False))
        self.pending = []            # (seconds, scores) of iterations run ahead in a group
        self.scores = None           # the current iteration's scores from its group
        self.last_seconds = None

    def group_size(self, it):
        """How many iterations from ``it`` run in one task: up to the next checkpoint or the
        last iteration, about :attr:`GROUP_SECONDS` of them (1 until one was timed)."""
        if not self.grouped or self.last_seconds is None:
            return 1
        end = self.iterations - 1
        if self.checkpoint is not None:
            end = min(end, it + (self.every - 1 - it % self.every))
        cap = max(1, int(self.GROUP_SECONDS / max(self.last_seconds, 1e-6)))
        return max(1, min(end - it + 1, cap))

    def _keys(self):
        """The squared errors the workers compute after each iteration of a group."""
        return (("train",) if self.train else ()) + (
            ("validation",) if self.v_rest is not None else ())

    def iterate(self, it):
        """One iteration on every worker, waited for (or taken from the group run ahead);
        a singular system explained by the ratings' range is a :class:`clmf.RatingRangeError`
        (as in-process). Returns the iteration's seconds when it ran in a group."""
        self.scores = None
        if self.pending:
            took, self.scores = self.pending.pop(0)
            return took
        g = self.group_size(it)
        t0 = time.perf_counter()
        try:
            if g == 1:
                self.engine.iteration(self.regularization, self.weighted, it)
                self.last_seconds = time.perf_counter() - t0
                return None
            res = self.engine.iteration(self.regularization, self.weighted, it, count=g,
                                        metrics=self._keys())
        except SingularSystemError as e:
            raise self.non_finite_error() or e from None
        wall = time.perf_counter() - t0
        share = max(0.0, wall - sum(c + m for c, _s, m in res)) / len(res)
        self.pending = [(c + share, s) for c, s, _m in res]
        self.last_seconds = wall / len(res)
        took, self.scores = self.pending.pop(0)
        return took

    def non_finite_error(self):
        """A :class:`clmf.RatingRangeError` when the ratings' magnitude explains the failure
        (the in-process fit's diagnosis, :func:`clmf.model.checks.range_error`)."""
        if self.ratings_range is None:
            return None
        return range_error(self.engine, *self.ratings_range, int(self.engine.f), self.storage,
                           self.regularization)

    def metrics(self):
        """Train RMSE (when wanted) and validation RMSE (the unseen ids' error included)."""
        out = {}
        scores = self.scores or {}
        if self.train:
            se, cnt = scores.get("train") or self.engine.squared_error("train")
            out["train_rmse"] = float(np.sqrt(se / cnt))
        if self.v_rest is not None:
            se, cnt = scores.get("validation") or self.engine.squared_error("validation")
            total = cnt + self.v_rest[1]
            out["validation_rmse"] = (float(np.sqrt((se + self.v_rest[0]) / total))
                                      if total else float("nan"))
        return out

    def after_iteration(self, it, history):
        """Write the checkpoint when one is due."""
        if self.checkpoint is not None and ((it + 1) % self.every == 0
                                            or it == self.iterations - 1):
            save_checkpoint(self.checkpoint, self.engine, it, history)


def save_checkpoint(path, engine, iteration, history):
    """Write both sides' factors after ``iteration`` and the ``history`` of the iterations so
    far to ``path`` (any fsspec URL), atomically (a temporary file moved into place)."""
    import io
    import json

    import fsspec
    X, bu = engine.get_factors("users", True)
    Y, bi = engine.get_factors("items", True)
    meta = {"format": _CKPT_FORMAT, "iteration": int(iteration), "shape": list(engine.shape),
            "factors": int(engine.f), "history": list(history)}
    buf = io.BytesIO()
    np.savez(buf, X=X, Y=Y, bu=bu, bi=bi, meta=np.array(json.dumps(meta)))
    fs, p = fsspec.core.url_to_fs(str(path))
    parent = p.rsplit("/", 1)[0] if "/" in p else ""
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{p}.tmp-{int(time.time() * 1e6)}"
    with fs.open(tmp, "wb") as fh:
        fh.write(buf.getvalue())
    fs.mv(tmp, p)
    log.info("checkpoint of iteration %d written to %s", iteration, path)


def load_checkpoint(path):
    """A checkpoint written by :func:`save_checkpoint`: dict with ``X``, ``Y``, ``bu``, ``bi``,
    ``iteration``, ``shape``, ``factors``, ``history``."""
    import io
    import json

    import fsspec
    fs, p = fsspec.core.url_to_fs(str(path))
    if not fs.exists(p):
        raise FileNotFoundError(f"no checkpoint at {path}")
    with fs.open(p, "rb") as fh:
        z = np.load(io.BytesIO(fh.read()), allow_pickle=False)
    meta = json.loads(str(z["meta"]))
    if meta.get("format") != _CKPT_FORMAT:
        raise ValueError(f"{path} is not a clmf.dask checkpoint")
    return {"X": z["X"], "Y": z["Y"], "bu": z["bu"], "bi": z["bi"],
            "iteration": meta["iteration"], "shape": tuple(meta["shape"]),
            "factors": meta["factors"], "history": meta["history"]}
