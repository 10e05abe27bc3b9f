"""Ctrl-C at random points of a fit, a save and a recommend (issue 33), run by
tests/test_reliability.py in a child process, so that a crash (a segfault from buffers or host
arrays freed while kernels still run) fails the test instead of killing pytest.

    python tests/interrupt_check.py DEVICE KINDS ROUNDS [SEED] [DATA]

DEVICE: a clmf device spec ("0:0"); KINDS: comma-separated of fit, save, recommend; ROUNDS: how
many operations of each kind to start, each interrupted once, at random, in one of two ways:

* a timer thread calls ``_thread.interrupt_main()`` (what Ctrl-C does: SIGINT's handler runs in
  the main thread at its next bytecode) after a random delay within the operation's duration;
* SIGINT's handler is run on a random entry into a Python function of clmf or pyopencl that
  the operation makes, or of the device code alone (clmf's engine, parallel and inference, and
  pyopencl), by a trace
  function: points a timer rarely meets, such as the launches between enqueuing a half-step's
  first kernels and waiting for them.

DATA: "synthetic" (default) or the path of MovieLens' ``u.data``. After each round the model
fitted before it must be intact (the same factor arrays with the same values, or, after a refit
that completed, wholly new ones); at the end its recommendations are those it gave before and the
saved file is the model. Prints one JSON line per kind and exits 0, else raises.
"""
import _thread
import faulthandler
import json
import os
import signal
import sys
import threading
import time

import numpy as np
import scipy.sparse as sp


def ratings(data):
    """The ratings: ML-100K's ``u.data`` (943 × 1682, 100K ratings) or a random matrix of
    5000 × 1600 with about 60K ratings (factor rows large enough to live in their own pages)."""
    if data != "synthetic":
        a = np.loadtxt(data, dtype=np.int64, usecols=(0, 1, 2))
        return sp.csr_matrix((a[:, 2].astype(np.float32), (a[:, 0] - 1, a[:, 1] - 1)))
    rng = np.random.default_rng(0)
    m, n, nnz = 5000, 1600, 60_000
    key = np.unique(rng.integers(0, m * n, nnz))
    return sp.csr_matrix((rng.integers(1, 6, key.size).astype(np.float32),
                          (key // n, key % n)), shape=(m, n))


def _roots():
    """Folders whose functions the trace counts: clmf's and pyopencl's."""
    import pyopencl

    import clmf
    return tuple(os.path.dirname(m.__file__) + os.sep for m in (clmf, pyopencl))


def _settle():
    """A Python-level call: a pending SIGINT is handled on entering it."""
    return None


def _run(op):
    """``op()``; True when a KeyboardInterrupt ended it (or landed just after it)."""
    hit = False
    try:
        op()
    except KeyboardInterrupt:
        hit = True
    try:                       # an interrupt that fired just as op() ended lands here
        time.sleep(0.0001)
        _settle()
    except KeyboardInterrupt:
        hit = True
    return hit


def by_timer(op, delay):
    """Run ``op()`` with ``_thread.interrupt_main()`` called after ``delay`` seconds (from a
    thread started and joined inside the interruptible part)."""
    done = threading.Event()

    def fire():
        if not done.wait(delay):
            _thread.interrupt_main()

    def body():
        t = threading.Thread(target=fire, daemon=True)
        try:
            t.start()
            op()
        finally:
            done.set()
            if t.ident is not None:
                t.join()
    return _run(body)


def by_trace(op, call, roots, focus=()):
    """Run ``op()`` with SIGINT's handler called on its ``call``-th entry into a Python function
    of clmf or pyopencl (None: count only), counting only functions in files under ``focus``
    when given; returns (interrupted, entries counted).

    A function's entry (its RESUME, also on a generator's resumption) is where CPython checks
    for a pending signal, as at a loop's backward jump and after a call: raising there is what
    Ctrl-C does. (An arbitrary line is not: on leaving a ``with`` block the line event comes
    before ``__exit__`` runs, outside the block's handler, where no signal is ever raised.)"""
    count = [0]

    def enter(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(roots) and (not focus or name.startswith(focus)):
            count[0] += 1
            if count[0] == call:
                handler = signal.getsignal(signal.SIGINT)
                if callable(handler):
                    handler(signal.SIGINT, frame)   # Python's raises KeyboardInterrupt here
        return None

    def body():
        sys.settrace(enter)
        try:
            op()
        finally:
            sys.settrace(None)
    return _run(body), count[0]


def check_kind(model, R, path, kind, rounds, rng, roots):
    """``rounds`` interrupted operations of ``kind`` on ``model``; the model checked after each."""
    op = {"fit": lambda: model.fit(R, show_progress=False),     # a refit of the fitted model
          "save": lambda: model.save(path),
          "recommend": lambda: model.recommend_all(10, R)}[kind]
    op()                                     # warm: programs built, uploads cached
    t = time.perf_counter()
    op()
    span = max(time.perf_counter() - t, 0.005)
    # the device code (where kernels run while the main thread enqueues or waits): clmf's
    # engine, parallel and inference packages and pyopencl
    focus = tuple(os.path.join(roots[0], d, "") for d in ("engine", "parallel", "inference")
                  ) + roots[1:]
    calls = by_trace(op, None, roots)[1]
    focused = by_trace(op, None, roots, focus)[1]
    users = np.arange(min(300, R.shape[0]))
    ids0, sc0 = model.recommend(users, R[users], N=10)
    model.save(path)
    hits = 0
    for k in range(rounds):
        # a hang fails the run with every thread's stack (no round takes a minute)
        faulthandler.dump_traceback_later(max(60.0, 20 * span), exit=True)
        X, Y = model.user_factors_, model.item_factors_
        X0, Y0 = X.copy(), Y.copy()
        if k % 4 == 0:
            hits += by_timer(op, float(rng.uniform(0.0, 1.1 * span)))
        elif k % 4 == 1 or not focused:
            hits += by_trace(op, int(rng.integers(1, calls + 1)), roots)[0]
        else:
            hits += by_trace(op, int(rng.integers(1, focused + 1)), roots, focus)[0]
        if model.user_factors_ is X:         # not refitted: the factors are as they were
            assert model.item_factors_ is Y, kind
            assert np.array_equal(X, X0) and np.array_equal(Y, Y0), kind
        else:                                # a refit that completed replaced them whole
            assert kind == "fit" and model.item_factors_ is not Y
            assert len(model.history_) == model.iterations
            assert np.isfinite(model.user_factors_).all()
            ids0, sc0 = model.recommend(users, R[users], N=10)
            model.save(path)
    faulthandler.cancel_dump_traceback_later()
    ids, sc = model.recommend(users, R[users], N=10)
    assert np.array_equal(ids, ids0) and np.allclose(sc, sc0, rtol=1e-5, atol=1e-6), kind
    import clmf
    saved = clmf.load(path)                  # the file is a whole model: the last one saved
    assert np.array_equal(saved.user_factors_, model.user_factors_), kind
    assert np.array_equal(saved.item_factors_, model.item_factors_), kind
    return {"kind": kind, "rounds": rounds, "interrupted": hits, "span_s": round(span, 4),
            "traced_calls": calls, "device_code_calls": focused}


def main(device, kinds, rounds, seed=0, data="synthetic"):
    """Fit a model, then ``rounds`` interrupted operations of each kind; print one JSON line
    per kind."""
    import tempfile

    import clmf
    rng = np.random.default_rng(seed)
    R = ratings(data)
    model = clmf.ALS(factors=16, iterations=25, regularization=0.1, device=device,
                     random_state=0).fit(R, show_progress=False)
    roots = _roots()
    with tempfile.TemporaryDirectory(prefix="clmf-interrupt-") as tmp:
        path = os.path.join(tmp, "model.npz")
        for kind in kinds.split(","):
            out = check_kind(model, R, path, kind, rounds, rng, roots)
            out.update(device=device, left_behind=sorted(os.listdir(tmp)))
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]) if len(a) > 3 else 0, a[4] if len(a) > 4 else "synthetic")
