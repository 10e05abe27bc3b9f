"""A fit's validation precision counted on the device (``clmf.inference.heldout.HeldoutCounter``):
equal to a full ranking's (:class:`RankingEvaluator` on the host) over changing factors, with
ties, seen held-out items, users with more held-out items than a chunk, half storage and padded
rows; and a fit's ``validation_precision@10`` equal to :func:`clmf.evaluate`'s."""
import numpy as np
import pytest
import scipy.sparse as sp

import clmf
from clmf.inference import heldout
from clmf.inference.evaluation import RankingEvaluator, _csr


def _problem(seed=5, m=150, n=400, f=8):
    """Factors with norms spread over two orders of magnitude, duplicated item rows (equal
    scores: ties by the lower index), a user with many held-out items, seen held-out items."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((m, f)).astype(np.float32)
    Y = (rng.standard_normal((n, f)) * np.exp(rng.uniform(-2.5, 2.5, (n, 1)))).astype(np.float32)
    # user 1 ranks ten copies of item 3 first (equal scores, by index: 3, 10, ..., 19): item 18
    # is the tenth, a hit, and item 19 the eleventh, a miss
    Y[3] = 0
    Y[3, 0] = 100.0
    Y[10:20] = Y[3]
    X[1] = 0
    X[1, 0] = 1.0
    seen = sp.random(m, n, density=0.05, random_state=1, format="lil")
    seen[1, :] = 0
    seen = seen.tocsr()
    test = sp.random(m, n, density=0.02, random_state=2, format="lil")
    test[0, :60] = 1.0                            # more held-out items than a chunk holds
    test[1, :] = 0
    test[1, 18:20] = 1.0
    test = test.tocsr()
    assert test.multiply(seen.astype(bool)).nnz  # some held-out items were seen: never hits
    return X, Y, _csr(test, "test"), _csr(seen, "seen")


def test_counts_equal_a_full_ranking(cl_device):
    X, Y, test, seen = _problem()
    counter = heldout.HeldoutCounter(test, seen, 10, cl_device)
    full = RankingEvaluator(test, seen, 10)             # the host's full ranking
    assert _host_hits(full, X, Y)[np.searchsorted(full.users, 1)] == 1     # the tie: 18, not 19
    rng = np.random.default_rng(0)
    for step in range(4):                               # new factors; chunks regrouped each time
        Xs = X + 0.05 * step * rng.standard_normal(X.shape).astype(np.float32)
        Ys = Y + 0.05 * step * Y * rng.standard_normal(Y.shape).astype(np.float32)
        Xs[1], Ys[3], Ys[10:20] = X[1], Y[3], Y[3]
        want = float(np.mean(_host_hits(full, Xs, Ys) / 10))
        assert counter.precision(Xs, Ys) == want
    for K in (1, 3, 50):
        ev = RankingEvaluator(test, seen, K)
        got = heldout.HeldoutCounter(test, seen, K, cl_device).precision(X, Y)
        assert got == float(np.mean(_host_hits(ev, X, Y) / K))
    # without seen items, and with no test user at all
    assert heldout.HeldoutCounter(test, None, 10, cl_device).precision(X, Y) == float(
        np.mean(_host_hits(RankingEvaluator(test, None, 10), X, Y) / 10))
    empty = sp.csr_matrix(test.shape, dtype=np.float32)
    assert np.isnan(heldout.HeldoutCounter(empty, seen, 10, cl_device).precision(X, Y))


def test_counts_exact_whatever_the_previous_order(cl_device):
    """The items are packed in the order of the previous call's norms, as far as its longest
    scan went: counts stay exact when that order is the reverse of the current one (the blocks'
    bounds are no longer descending: the stop rule must take the largest bound of the blocks
    left, not the next one; the scans run past the packed blocks, scored from Y's rows), and
    with a good order the chunks stop early and fewer blocks are packed."""
    X, Y, test, seen = _problem(seed=11, m=120, n=700, f=6)
    scale = np.exp(np.linspace(-3.0, 2.0, Y.shape[0], dtype=np.float32))[:, None]
    unit = Y / np.linalg.norm(Y, axis=1, keepdims=True).clip(1e-30)
    rising, falling = unit * scale, unit * scale[::-1]         # norms: by index, reversed
    full = RankingEvaluator(test, seen, 10)
    counter = heldout.HeldoutCounter(test, seen, 10, cl_device)
    nb = -(-Y.shape[0] // heldout.BLOCK)

    def steps():
        """Blocks each chunk scanned in the last call."""
        out = np.empty(counter.nchunks, np.int32)
        counter.cl.enqueue_copy(counter.queue, out, counter._buf["steps"])
        return out

    past_packed = 0
    for Ys in (rising, falling, falling, rising):
        packed = counter._npack
        assert counter.precision(X, Ys) == float(np.mean(_host_hits(full, X, Ys) / 10))
        if packed is not None and steps().max() > packed:
            past_packed += 1                       # blocks past the packed ones were scanned
    assert past_packed
    # after two calls on the same factors the order fits them
    counter.precision(X, rising)
    assert np.median(steps()) < nb / 2 and counter._npack < nb, (np.median(steps()), nb)


def _host_hits(ev, X, Y):
    """Hits per test user of a full host ranking."""
    from clmf.metrics import count_hits
    return count_hits(ev.rank(X, Y), ev.relevant, ev.K)[0].sum(axis=1)


@pytest.mark.parametrize("storage", ["float32", "float16"])
def test_counts_read_padded_device_buffers(cl_device, storage):
    """An engine's buffers: rows padded to a leading dimension, half storage read as float."""
    import pyopencl as cl

    from clmf.engine.device import get_context
    X, Y, test, seen = _problem(seed=7, f=5)
    dt = np.float16 if storage == "float16" else np.float32
    X, Y = X.astype(dt).astype(np.float32), Y.astype(dt).astype(np.float32)
    ctx, _ = get_context(cl_device)
    bufs = []
    for A, ld in ((X, 8), (Y, 12)):
        P = np.zeros((A.shape[0], ld), dt)
        P[:, :A.shape[1]] = A
        P[:, A.shape[1]:] = 7                   # padding is never read
        bufs.append(cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                              hostbuf=P))
    counter = heldout.HeldoutCounter(test, seen, 10, cl_device)
    got = counter.precision(buffers=(bufs[0], bufs[1], 5, 8, 12, storage))
    assert got == float(np.mean(_host_hits(RankingEvaluator(test, seen, 10), X, Y) / 10))


def test_fit_validation_counts_equal_evaluate(cl_device, monkeypatch):
    """Each iteration's validation_precision@10 is clmf.evaluate's strict precision of the model
    stopped there, counted on the device: neither the host ranking nor a top-k is used."""
    from clmf.data import splits
    from clmf.inference import host, topk
    data = clmf.data.synthetic("movielens-100k", scale=0.1, seed=3)
    train, val = splits.leave_k_out(data, k=2, random_state=0, min_train=2)
    made = []
    real_init = topk.DeviceTopK.__init__

    def init(self, *a, **kw):
        made.append(1)
        real_init(self, *a, **kw)

    def no_host(*a, **kw):
        raise AssertionError("validation ranked on the host")

    history = []
    with monkeypatch.context() as mp:
        mp.setattr(topk.DeviceTopK, "__init__", init)
        mp.setattr(host, "host_rank", no_host)
        clmf.ALS(12, 0.01, 1, feedback="implicit", alpha=5.0, device=cl_device,
                 random_state=0).fit(train, show_progress=False)
        plain = len(made)           # the rankers a fit keeps for recommend, validated or not
        made.clear()
        for its in (1, 3):
            m = clmf.ALS(12, 0.01, its, feedback="implicit", alpha=5.0, device=cl_device,
                         random_state=0).fit(train, validation=val, show_progress=False)
            history.append(m.history_[-1]["validation_precision@10"])
    assert len(made) == 2 * plain   # validation itself made none
    for its, got in zip((1, 3), history):
        m = clmf.ALS(12, 0.01, its, feedback="implicit", alpha=5.0, device=cl_device,
                     random_state=0).fit(train, show_progress=False)
        assert got == clmf.evaluate(m, train, val, K=10)["strict_precision"]


def test_fit_validation_on_the_host_and_after_a_device_failure(cl_device, monkeypatch):
    """Without the device path (CLMF_INFERENCE=host) or when the counter fails, the host ranks:
    the same values, and the fit goes on."""
    from clmf.data import splits
    from clmf.inference import topk
    data = clmf.data.synthetic("movielens-100k", scale=0.1, seed=4)
    train, val = splits.leave_k_out(data, k=2, random_state=0, min_train=2)

    def fit():
        return clmf.ALS(8, 0.01, 3, feedback="implicit", alpha=5.0, device=cl_device,
                        random_state=0).fit(train, validation=val, show_progress=False)
    want = [h["validation_precision@10"] for h in fit().history_]
    with topk.inference_options(enabled=False):      # the host's hits / (K·users): to rounding
        assert [h["validation_precision@10"] for h in fit().history_] == pytest.approx(want,
                                                                                    rel=1e-12)

    def broken(self, *a, **kw):
        raise RuntimeError("planted")
    monkeypatch.setattr(heldout.HeldoutCounter, "_counts", broken)
    assert [h["validation_precision@10"] for h in fit().history_] == pytest.approx(want,
                                                                                rel=1e-12)


_OCLGRIND_SCRIPT = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import pyopencl as cl
from clmf.inference import heldout
from clmf.inference.evaluation import RankingEvaluator
from test_validation_counts import _host_hits, _problem
dev = cl.get_platforms()[0].get_devices()[0]
X, Y, test, seen = _problem(m=20, n=40, f=5)
test, seen = test[:20], seen[:20]
keep = []          # counters stay alive: Oclgrind's shadow of a released, reused allocation
for K in (3, 10):  # reads as uninitialised in the next counter's buffers
    c = heldout.HeldoutCounter(test, seen, K, dev)
    keep.append(c)
    want = float(np.mean(_host_hits(RankingEvaluator(test, seen, K), X, Y) / K))
    assert c.precision(X, Y) == want and c.precision(X, Y) == want, K
print("HELDOUT_OK")
"""


def test_counts_clean_under_oclgrind(tmp_path):
    """The counting kernels run clean under Oclgrind (races, uninitialised values, API misuse,
    out-of-bounds accesses) on a small problem with ties, seen held-out items and padding."""
    import os
    import pathlib
    import subprocess
    import sys

    from test_oclgrind import find_oclgrind_icd
    lib = find_oclgrind_icd()
    if lib is None:
        pytest.skip("Oclgrind is not installed")
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "oclgrind.icd").write_text(lib + "\n")
    log = tmp_path / "oclgrind.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCLGRIND_")}
    env.update(OCL_ICD_VENDORS=str(vendors), OCLGRIND_DATA_RACES="1",
               OCLGRIND_UNINITIALIZED="1", OCLGRIND_CHECK_API="1",
               OCLGRIND_BUILD_OPTIONS="-cl-opt-disable", PYOPENCL_NO_CACHE="1",
               OCLGRIND_LOG=str(log), CLMF_CACHE_DIR=str(tmp_path / "cache"))
    here = str(pathlib.Path(__file__).resolve().parent)
    proc = subprocess.run([sys.executable, "-c", _OCLGRIND_SCRIPT, here], env=env,
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0 and "HELDOUT_OK" in proc.stdout, proc.stdout + proc.stderr
    text = log.read_text(errors="replace") if log.exists() else ""
    assert not text.strip(), "Oclgrind reported:\n" + text[:4000]
