"""The peers of ``clmf bench``: other ALS implementations run on the same data in the same job.

Every peer is a function ``run(problem, f, regularization, iterations, seed)`` returning a
:class:`PeerRun`. Peers are optional dependencies, imported lazily; one that cannot be imported
comes back with ``status="unavailable: ..."`` and one that fails with ``status="failed: ..."`` —
never silently dropped.

==================  ===============================================================  ==========
peer                what runs                                                        objective
==================  ===============================================================  ==========
``reference``       :func:`clmf.reference.als` (NumPy/SciPy, float64), clmf's start   = clmf
``lenskit``         LensKit ``BiasedMFScorer``'s explicit ALS trainer, ratings not   = clmf
                    centred (bias step replaced), clmf's start factors
``lenskit-biased``  LensKit ``BiasedMFScorer`` as shipped (user/item biases, damping  biased
                    5, its own random start)
``spark``           Spark MLlib ``ALS`` in local mode (``local[N]``), regParam = λ    = clmf
                    (Spark's λ is weighted by the row's count, as ALS-WR), own start
``implicit-cg``     implicit's CPU ALS, conjugate gradient (its default): *speed      implicit
``implicit-chol``   only*, it solves the implicit-feedback (confidence) objective     feedback
``pytorch``         a straightforward PyTorch ALS: rows bucketed by length, gather,   = clmf
                    batched matmul, batched Cholesky, float32, TF32 off; CUDA when
                    available, else CPU; clmf's start factors
==================  ===============================================================  ==========

Timing: seconds per iteration (users then items) for every iteration, measured around the
peer's own iteration (setup such as building its matrices is excluded; Spark cannot be stepped,
so its per-iteration time is ``(T(N iterations) − T(1 iteration)) / (N − 1)`` after a warm-up
fit). Test RMSE is computed here for every peer by one rule: ``x_u·y_i`` (plus the biases for
``lenskit-biased``), the training mean for a user or item without training ratings.
"""
from __future__ import annotations

import dataclasses
import os
import time
import traceback

import numpy as np
import scipy.sparse as sp

__all__ = ["PeerRun", "Problem", "PEERS", "CPU_PEERS", "GPU_PEERS", "run_peer", "rmse_of"]


@dataclasses.dataclass
class Problem:
    """One benchmark problem: train/test as CSR (users × items), float32 ratings."""
    name: str
    train: sp.csr_matrix
    test: sp.csr_matrix

    @property
    def shape(self):
        return self.train.shape

    @property
    def global_mean(self):
        return float(self.train.data.astype(np.float64).mean())

    def counts(self):
        return (np.diff(self.train.indptr),
                np.bincount(self.train.indices, minlength=self.train.shape[1]))


@dataclasses.dataclass
class PeerRun:
    system: str
    status: str = "ok"
    seconds: list = dataclasses.field(default_factory=list)   # per iteration, all of them
    test_rmse: float = float("nan")
    device: str = "host CPU"
    note: str = ""
    factors: tuple | None = None                              # (X, Y) when the objective = clmf's
    whole_s: float | None = None        # the whole fit from the problem's CSR (where measured)

    @property
    def ok(self):
        return self.status == "ok"


def rmse_of(problem, X, Y, user_bias=None, item_bias=None, offset=0.0):
    """Test RMSE of factors (and optional biases) by the common rule (unknown rows → train mean)."""
    T = problem.test.tocoo()
    if T.nnz == 0:
        return float("nan")
    uc, ic = problem.counts()
    u, i = T.row, T.col
    pred = np.einsum("ij,ij->i", np.asarray(X, np.float64)[u],
                     np.asarray(Y, np.float64)[i]) + offset
    if user_bias is not None:
        pred = pred + np.asarray(user_bias, np.float64)[u]
    if item_bias is not None:
        pred = pred + np.asarray(item_bias, np.float64)[i]
    unknown = (uc[u] == 0) | (ic[i] == 0)
    pred[unknown] = problem.global_mean
    err = pred - T.data.astype(np.float64)
    return float(np.sqrt(np.mean(err * err)))


def _start(problem, f, seed):
    from ..reference import start_factors
    return start_factors(*problem.shape, f, seed)


# ----- NumPy reference -------------------------------------------------------------------------
def run_reference(problem, f, lam, iterations, seed):
    from .. import reference
    X0, Y0 = _start(problem, f, seed)
    times = []
    t = [time.perf_counter()]

    def cb(it, X, Y):
        now = time.perf_counter()
        times.append(now - t[0])
        t[0] = now

    X, Y = reference.als(problem.train, f, lam, iterations, weighted=True, init=(X0, Y0),
                         callback=cb)
    return PeerRun("reference", seconds=times, test_rmse=rmse_of(problem, X, Y),
                   note="clmf.reference.als, NumPy/SciPy float64, same start", factors=(X, Y))


# ----- LensKit ---------------------------------------------------------------------------------
def _lenskit_dataset(problem):
    import pandas as pd
    from lenskit.data import from_interactions_df
    C = problem.train.tocoo()
    df = pd.DataFrame({"user_id": C.row.astype(np.int64), "item_id": C.col.astype(np.int64),
                       "rating": C.data.astype(np.float32)})
    m, n = problem.shape
    return from_interactions_df(df, users=np.arange(m, dtype=np.int64),
                                items=np.arange(n, dtype=np.int64))


def _lenskit(problem, f, lam, iterations, seed, biased):
    t_all = time.perf_counter()
    import lenskit
    from lenskit.als import BiasedMFConfig, BiasedMFScorer
    from lenskit.als._explicit import BiasedMFTrainer
    from lenskit.training import TrainingOptions
    data = _lenskit_dataset(problem)
    scorer = BiasedMFScorer(BiasedMFConfig(embedding_size=f, regularization=lam, epochs=iterations))
    if biased:
        trainer = scorer.create_trainer(data, TrainingOptions(rng=seed))
    else:
        class _Plain(BiasedMFTrainer):       # LensKit's explicit ALS on the raw ratings
            def prepare_matrix(self, data):
                from lenskit.basic import BiasModel
                rmat = data.interactions().matrix().scipy(attribute="rating", layout="coo")
                self.scorer.bias = BiasModel(damping=0.0, global_bias=0.0)
                return rmat.astype(np.float32)
        trainer = _Plain(scorer, data, TrainingOptions(rng=seed))
        X0, Y0 = _start(problem, f, seed)
        # the vocabularies are 0..m-1 and 0..n-1 in order (given above)
        assert np.array_equal(np.asarray(data.users.ids()), np.arange(problem.shape[0]))
        scorer.user_embeddings = np.ascontiguousarray(X0, np.float32)
        scorer.item_embeddings = np.ascontiguousarray(Y0, np.float32)
        trainer._init_contexts()
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        trainer.train_epoch()
        times.append(time.perf_counter() - t)
    trainer.finalize()
    whole = time.perf_counter() - t_all          # data set, trainer, epochs (imports included)
    X, Y = scorer.user_embeddings, scorer.item_embeddings
    ver = getattr(lenskit, "__version__", "?")
    if biased:
        b = scorer.bias
        rm = rmse_of(problem, X, Y, b.user_biases, b.item_biases, offset=b.global_bias)
        return PeerRun("lenskit-biased", seconds=times, test_rmse=rm, whole_s=whole,
                       note=f"lenskit {ver} BiasedMFScorer (biases, damping {b.damping}), "
                            "own start")
    return PeerRun("lenskit", seconds=times, test_rmse=rmse_of(problem, X, Y), whole_s=whole,
                   note=f"lenskit {ver} explicit ALS trainer, raw ratings, same start",
                   factors=(X, Y))


def run_lenskit(problem, f, lam, iterations, seed):
    return _lenskit(problem, f, lam, iterations, seed, biased=False)


def run_lenskit_biased(problem, f, lam, iterations, seed):
    return _lenskit(problem, f, lam, iterations, seed, biased=True)


# ----- Spark MLlib -----------------------------------------------------------------------------
_spark = None


def _spark_session():
    global _spark
    if _spark is None:
        from pyspark.sql import SparkSession
        threads = os.cpu_count() or 1
        mem = os.environ.get("CLMF_BENCH_SPARK_MEMORY", "6g")
        _spark = (SparkSession.builder.master(f"local[{threads}]").appName("clmf-bench")
                  .config("spark.driver.memory", mem)
                  .config("spark.sql.shuffle.partitions", str(2 * threads))
                  .config("spark.ui.enabled", "false")
                  .config("spark.ui.showConsoleProgress", "false")
                  .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                  .getOrCreate())
        _spark.sparkContext.setLogLevel("ERROR")
    return _spark


def run_spark(problem, f, lam, iterations, seed):
    import pandas as pd
    import pyspark
    from pyspark.ml.recommendation import ALS as SparkALS
    spark = _spark_session()
    threads = spark.sparkContext.defaultParallelism
    C = problem.train.tocoo()
    pdf = pd.DataFrame({"u": C.row.astype(np.int32), "i": C.col.astype(np.int32),
                        "r": C.data.astype(np.float32)})
    df = spark.createDataFrame(pdf).repartition(threads).cache()
    df.count()

    def fit(k):
        als = SparkALS(rank=f, maxIter=k, regParam=lam, userCol="u", itemCol="i", ratingCol="r",
                       seed=seed, nonnegative=False, implicitPrefs=False,
                       numUserBlocks=threads, numItemBlocks=threads, coldStartStrategy="nan")
        t = time.perf_counter()
        model = als.fit(df)
        model.userFactors.count()          # force the lazy parts
        model.itemFactors.count()
        return model, time.perf_counter() - t

    fit(1)                                  # warm-up (JIT, broadcast set-up)
    _, t1 = fit(1)
    model, tn = fit(iterations)
    per = (tn - t1) / (iterations - 1) if iterations > 1 else t1
    m, n = problem.shape
    X = np.zeros((m, f), np.float32)
    Y = np.zeros((n, f), np.float32)
    for frame, M in ((model.userFactors, X), (model.itemFactors, Y)):
        pf = frame.toPandas()
        if len(pf):
            M[pf["id"].to_numpy()] = np.stack(pf["features"].to_numpy()).astype(np.float32)
    df.unpersist()
    seconds = [t1] + [per] * max(0, iterations - 1)
    return PeerRun("spark", seconds=seconds, test_rmse=rmse_of(problem, X, Y),
                   note=f"pyspark {pyspark.__version__} local[{threads}]; "
                        f"s/it = (T({iterations} it) − T(1 it))/{max(1, iterations - 1)}; "
                        "first = T(1 it) incl. set-up; own start",
                   factors=(X, Y))


# ----- implicit (speed only) -------------------------------------------------------------------
def _implicit(problem, f, lam, iterations, seed, use_cg):
    import implicit
    from implicit.cpu.als import AlternatingLeastSquares
    model = AlternatingLeastSquares(factors=f, regularization=lam, iterations=iterations,
                                    use_cg=use_cg, calculate_training_loss=False,
                                    random_state=seed, dtype=np.float32)
    times = []
    t_all = time.perf_counter()
    model.fit(problem.train.astype(np.float32).tocsr(), show_progress=False,
              callback=lambda it, elapsed, loss: times.append(float(elapsed)))
    whole = time.perf_counter() - t_all
    name = "implicit-cg" if use_cg else "implicit-chol"
    return PeerRun(name, seconds=times, whole_s=whole,
                   note=f"implicit {implicit.__version__} CPU ALS "
                        f"({'CG' if use_cg else 'Cholesky'}); "
                        "implicit-feedback objective: speed only, no RMSE")


def run_implicit_cg(problem, f, lam, iterations, seed):
    return _implicit(problem, f, lam, iterations, seed, True)


def run_implicit_chol(problem, f, lam, iterations, seed):
    return _implicit(problem, f, lam, iterations, seed, False)


# ----- PyTorch ---------------------------------------------------------------------------------
class TorchALS:
    """Straightforward explicit ALS-WR in PyTorch: for each side, rows sorted by their number of
    ratings are cut into buckets; per bucket the other side's factors are gathered into a
    zero-padded (rows × longest × f) block, ``A = GᵀG + λ·n·I`` and ``b = Gᵀr`` by batched
    matmul, then a batched Cholesky solve. float32, TF32 off unless ``tf32`` (the matmuls on
    the tensor cores). The bucket layout (index tensors) is built once, on the device, before
    timing."""

    def __init__(self, R, f, lam, device, budget=1 << 28, tf32=False):
        import torch
        self.torch = torch
        torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
        torch.backends.cudnn.allow_tf32 = bool(tf32)
        self.device = device
        self.f, self.lam = f, lam
        R = sp.csr_matrix(R)
        self.sides = {"users": self._buckets(R, f, budget),
                      "items": self._buckets(R.T.tocsr(), f, budget)}
        self.shape = R.shape

    def _buckets(self, R, f, budget):
        torch = self.torch
        counts = np.diff(R.indptr)
        order = np.argsort(-counts, kind="stable")
        order = order[counts[order] > 0]
        out = []
        k = 0
        pad_col = R.shape[1]                       # gathers the appended zero row
        while k < order.size:
            longest = int(counts[order[k]])
            rows = max(1, min(order.size - k, budget // max(1, 4 * f * (longest + f))))
            sel = order[k:k + rows]
            lens = counts[sel]
            # host-side layout, once: row j of the bucket holds row sel[j]'s ratings, zero-padded
            starts = R.indptr[sel]
            total = int(lens.sum())
            rowpos = np.repeat(np.arange(sel.size), lens)
            colpos = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
            src = np.repeat(starts, lens) + colpos
            idx = np.full((sel.size, longest), pad_col, np.int64)
            val = np.zeros((sel.size, longest), np.float32)
            idx[rowpos, colpos] = R.indices[src]
            val[rowpos, colpos] = R.data[src]
            out.append((torch.as_tensor(sel, device=self.device),
                        torch.as_tensor(idx, device=self.device),
                        torch.as_tensor(val, device=self.device),
                        torch.as_tensor(lens.astype(np.float32), device=self.device)))
            k += sel.size
        return out

    def half_step(self, side, other_factors, out):
        torch = self.torch
        f = self.f
        ext = torch.cat([other_factors, torch.zeros(1, f, device=self.device)], 0)
        eye = torch.eye(f, device=self.device)
        for sel, idx, val, lens in self.sides[side]:
            G = ext[idx]                                            # rows × L × f
            A = torch.bmm(G.transpose(1, 2), G) + (self.lam * lens)[:, None, None] * eye
            b = torch.bmm(G.transpose(1, 2), val[:, :, None])       # rows × f × 1
            L, info = torch.linalg.cholesky_ex(A)
            out[sel] = torch.cholesky_solve(b, L)[:, :, 0]
        return out

    def iteration(self, X, Y):
        self.half_step("users", Y, X)
        self.half_step("items", X, Y)


class PeerSkipped(Exception):
    """Raised by a peer that will not run on this problem (reported as ``skipped: ...``)."""


TORCH_CPU_MAX_NNZ = 20_000_000


def run_pytorch(problem, f, lam, iterations, seed, tf32=False):
    """The PyTorch peer (TF32 matmuls with ``tf32``)."""
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and problem.train.nnz > TORCH_CPU_MAX_NNZ:
        raise PeerSkipped(f"no CUDA device, and {problem.train.nnz} ratings > {TORCH_CPU_MAX_NNZ} "
                          "is too many for the CPU fallback")
    X0, Y0 = _start(problem, f, seed)
    model = TorchALS(problem.train, f, lam, dev, budget=(1 << 30) if dev == "cuda" else (1 << 28),
                     tf32=tf32)
    X = torch.as_tensor(X0, device=dev).clone()
    Y = torch.as_tensor(Y0, device=dev).clone()
    times = []
    for _ in range(iterations):
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        model.iteration(X, Y)
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    Xh, Yh = X.cpu().numpy(), Y.cpu().numpy()
    del model, X, Y
    if dev == "cuda":
        torch.cuda.empty_cache()          # give the memory back before clmf's OpenCL runs
    name = (torch.cuda.get_device_name(0) if dev == "cuda"
            else f"host CPU ({torch.get_num_threads()} threads)")
    torch.backends.cuda.matmul.allow_tf32 = False     # back to the default for what runs next
    return PeerRun("pytorch-tf32" if tf32 else "pytorch", seconds=times,
                   test_rmse=rmse_of(problem, Xh, Yh), device=name,
                   note=f"torch {torch.__version__} on {dev}: bucketed gather + bmm + batched "
                        f"Cholesky, float32, TF32 {'on' if tf32 else 'off'}, same start",
                   factors=(Xh, Yh))


def run_pytorch_tf32(problem, f, lam, iterations, seed):
    """The PyTorch peer with TF32 matmuls (tensor cores) allowed."""
    return run_pytorch(problem, f, lam, iterations, seed, tf32=True)


PEERS = {
    "reference": run_reference,
    "lenskit": run_lenskit,
    "lenskit-biased": run_lenskit_biased,
    "spark": run_spark,
    "implicit-cg": run_implicit_cg,
    "implicit-chol": run_implicit_chol,
    "pytorch": run_pytorch,
    "pytorch-tf32": run_pytorch_tf32,
}
CPU_PEERS = ("reference", "lenskit", "lenskit-biased", "spark", "implicit-cg", "implicit-chol")
GPU_PEERS = ("pytorch", "pytorch-tf32")
_NEEDS = {"lenskit": "lenskit", "lenskit-biased": "lenskit", "spark": "pyspark",
          "implicit-cg": "implicit", "implicit-chol": "implicit", "pytorch": "torch",
          "pytorch-tf32": "torch"}


def available(name):
    """None when the peer's package imports, else the reason it does not."""
    mod = _NEEDS.get(name)
    if mod is None:
        return None
    try:
        __import__(mod)
    except Exception as e:     # ImportError, or a broken install raising something else
        return f"{type(e).__name__}: {e}".splitlines()[0][:200]
    return None


def run_peer(name, problem, f, lam, iterations, seed):
    """Run one peer; never raises: problems come back as the status."""
    if name not in PEERS:
        return PeerRun(name, status=f"unavailable: unknown peer (known: {', '.join(PEERS)})")
    why = available(name)
    if why is not None:
        return PeerRun(name, status=f"unavailable: {why}")
    try:
        return PEERS[name](problem, f, lam, iterations, seed)
    except PeerSkipped as e:
        return PeerRun(name, status=f"skipped: {e}")
    except Exception as e:
        tb = traceback.format_exc(limit=3).strip().splitlines()
        where = tb[-3].strip() if len(tb) >= 3 else ""
        msg = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        return PeerRun(name, status=f"failed: {msg}", note=where[:200])
