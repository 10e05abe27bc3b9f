"""A fit's set-up ahead of it and trimmed (issue 30): ``ALS.warm_up``, programs built once however
many threads ask for them, the tuning lookup's verified set read once per database version, and
the factors of a fit unchanged by any of it (same seed, same factors)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp

import clmf


def _ratings(m=300, n=120, nnz=4000, seed=3):
    """A small random CSR of ratings 1..5 (no empty rows or columns needed)."""
    rng = np.random.default_rng(seed)
    u, i = rng.integers(0, m, nnz), rng.integers(0, n, nnz)
    R = sp.coo_matrix((rng.integers(1, 6, nnz).astype(np.float32), (u, i)), shape=(m, n))
    R.sum_duplicates()
    return R.tocsr()


def _fit(R, device, **kw):
    """A fitted model's factors (f = 8, three iterations, seed 0)."""
    m = clmf.ALS(factors=8, iterations=3, device=device, random_state=0, **kw)
    m.fit(R, show_progress=False)
    return m


def test_build_in_flight_is_waited_for_not_repeated(one_device, monkeypatch):
    """Two threads asking for the same program while it builds: one OpenCL build, one program."""
    import pyopencl as cl

    from clmf.engine import kernels as K
    from clmf.engine.device import get_context
    ctx = get_context(one_device)[0]
    real, calls = cl.Program, []

    def slow_program(context, source):
        calls.append(source)
        time.sleep(0.3)                       # both threads arrive while it builds
        return real(context, source)
    monkeypatch.setattr(cl, "Program", slow_program)
    src = f"__kernel void k(__global float *x) {{ x[0] = {time.time_ns() % 1000}.0f; }}\n"
    out = [None, None]

    def ask(k):
        out[k] = K.build(ctx, src)
    threads = [threading.Thread(target=ask, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert out[0] is out[1] and "k" in out[0].kernels


def test_failed_build_in_flight_fails_its_waiter_too(one_device):
    """A program that does not build raises InvalidConfigError in every thread that asked."""
    from clmf.engine import kernels as K
    from clmf.engine.device import get_context
    ctx = get_context(one_device)[0]
    errors = []

    def ask():
        try:
            K.build(ctx, "__kernel void broken( { syntax error\n")
        except clmf.InvalidConfigError as e:
            errors.append(e)
    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 2
    assert not K._building                     # nothing left marked in flight


def test_verified_set_is_read_once_per_database_version(one_device):
    """The lookup's set of configurations that ran on this device is computed once per record
    lists (the same object while the databases are unchanged) and equals the unmemoized one."""
    from clmf.engine.device import device_info
    from clmf.tuning import lookup as L
    info = device_info(one_device)
    src = L.record_sources()
    first = L._verified_here(info, src)
    assert L._verified_here(info, L.record_sources()) is first
    from clmf.tuning.index import measurement_records
    assert first == L._verified_in(info, [(r, measurement_records(p) or ())
                                          for _o, p, r in src])


def test_warm_up_builds_the_fit_programs_and_changes_no_factor(one_device):
    """``warm_up(R)`` builds what the fit of R builds (the fit finds them memoized: one program
    per side and the metrics one), returns the estimator, and the fit after it learns exactly
    the factors of a fit without it."""
    from clmf.engine import kernels as K
    R = _ratings()
    plain = _fit(R, one_device)
    est = clmf.ALS(factors=8, iterations=3, device=one_device, random_state=0)
    assert est.warm_up(R, wait=True) is est
    built = est._warm_up.result
    assert isinstance(built, list) and {"users", "items", "metrics"} <= set(built), built
    before = len(K._programs)
    est.fit(R, show_progress=False)
    assert len(K._programs) == before          # nothing left to build
    np.testing.assert_array_equal(est.user_factors_, plain.user_factors_)
    np.testing.assert_array_equal(est.item_factors_, plain.item_factors_)
    import pickle
    assert "_warm_up" not in pickle.loads(pickle.dumps(est)).__dict__


def test_warm_up_without_ratings_and_bad_input_never_fails(one_device, monkeypatch):
    """Without ratings the device and the tuning databases are warmed (the lookup's verified set
    of this device computed), no program; ratings the fit would refuse leave the error to the fit
    (the warm-up returns, the fit raises)."""
    from clmf.engine.device import device_info
    from clmf.tuning import lookup as L
    monkeypatch.setattr(L, "_verified_memo", {})
    est = clmf.ALS(factors=4, device=one_device).warm_up(wait=True)
    assert est._warm_up.result == []
    assert len(L._verified_memo) == 1
    memo = next(iter(L._verified_memo.values()))[1]
    assert L._verified_here(device_info(one_device), L.record_sources()) is memo
    bad = clmf.ALS(factors=4, device=one_device).warm_up(np.ones((3, 3)), wait=True)
    assert isinstance(bad._warm_up.result, TypeError)
    with pytest.raises(TypeError):
        bad.fit(np.ones((3, 3)))


@pytest.mark.parametrize("threads", [1, 4])
def test_build_threads_change_no_factor(one_device, threads, monkeypatch):
    """The programs built one after the other or side by side (the transpose's among them), a
    first and a later fit of one process: the same factors."""
    from clmf.engine import core
    from clmf.engine import programs as P
    R = _ratings(seed=5)
    ref = _fit(R, one_device)
    monkeypatch.setattr(P, "BUILD_THREADS", threads)
    monkeypatch.setattr(core, "HOST_TRANSPOSE_MAX_NNZ", -1)     # transposed on the device
    for _ in range(2):
        m = _fit(R, one_device)
        np.testing.assert_array_equal(m.user_factors_, ref.user_factors_)
        np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)


def test_build_chains_put_the_transpose_first_and_alone():
    """One thread: every program in order; several: the transpose's alone first, the others
    spread over the rest; nothing lost or repeated."""
    from clmf.engine.programs import chains
    jobs = dict.fromkeys(["layout", "users", "items", "metrics"])
    assert chains(jobs, 1) == [["layout", "users", "items", "metrics"]]
    assert chains(jobs, 2) == [["layout"], ["users", "items", "metrics"]]
    assert chains(jobs, 4) == [["layout"], ["users"], ["items"], ["metrics"]]
    assert chains(dict.fromkeys(["users", "items"]), 4) == [["users"], ["items"]]


def test_database_index_read_once_by_concurrent_callers(tmp_path, monkeypatch):
    """Two threads asking for a database's records while its index is built (a warm-up and a
    fit): one build, every part memoized, the same lists handed to both."""
    from clmf.tuning import index
    db = tmp_path / "tuning.jsonl"
    db.write_text("{}\n")
    calls = []

    def slow_build(path, stamp):
        calls.append(path)
        time.sleep(0.3)
        return [{"kind": "best"}], [{"kind": "measurement"}], []
    monkeypatch.setattr(index, "_build", slow_build)
    monkeypatch.setattr(index, "_read_index", lambda *a: None)
    out = {}

    def ask(which):
        out[which] = index._records(db, which)
    threads = [threading.Thread(target=ask, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert out[0] == [{"kind": "best"}] and out[1] == [{"kind": "measurement"}]
    assert index.model_records(db) == []        # memoized from the same build
    assert len(calls) == 1
