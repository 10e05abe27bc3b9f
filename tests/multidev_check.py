"""Multi-device agreement checks, run by tests/test_parallel.py in a subprocess whose environment
exposes several PoCL devices (``POCL_DEVICES="pthread pthread"``: the variable must be set before
the OpenCL ICD loader starts, hence the subprocess).

    python tests/multidev_check.py SPEC [SPEC...]      (each SPEC: a JSON device list or "cpu:all")

Prints one JSON line per (devices, mode) with the relative Frobenius differences of the factors
after one iteration and of the RMSE after three, against the first PoCL device alone, and the
results of partial_fit_users / recommend on the multi-device model; then one per (devices, mode,
reduced side, way of summing) of a :class:`MultiEngine` that reduces that side (``"reduce"``: the
side; ``"sums"``: on the owner devices or the host; f = 7, batches of 16 rows, segments cutting
them; the device sums also with a ring smaller than the blocks, ``"ring"``), two iterations
against the first PoCL device's engine (``"vs_host"``: the device sums against the host's).
"""
import json
import sys

import numpy as np
import scipy.sparse as sp


def ratings(m, n, density, seed):
    """Random explicit ratings 1..5 with an empty user and an empty item."""
    rng = np.random.default_rng(seed)
    mask = rng.random((m, n)) < density
    mask[3, :] = False
    mask[:, 5] = False
    r, c = np.nonzero(mask)
    return sp.csr_matrix((rng.integers(1, 6, r.size).astype(np.float32), (r, c)), shape=(m, n))


def rel(a, b):
    """‖a − b‖ / ‖b‖ (Frobenius)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def fit(R, device, mode, iterations, **kw):
    """An ALS fit in one of the three modes with the exact solver."""
    import clmf
    extra = {"implicit": dict(feedback="implicit", alpha=2.0),
             "biased": dict(biases=True), "explicit": {}}[mode]
    return clmf.ALS(factors=8, regularization=0.1, iterations=iterations, solver="cholesky",
                    device=device, random_state=0, **extra, **kw).fit(R, show_progress=False)


def reduce_rows(R, base, spec):
    """The reduce mode of each side on the devices of ``spec`` against one device (JSON rows)."""
    from clmf import reference
    from clmf.engine import memory
    from clmf.engine.config import KernelConfig
    from clmf.engine.device import select_devices
    from clmf.parallel import MultiEngine, make_backend
    devs = select_devices(spec)
    cfg = KernelConfig.parse("batch+reg:solver=cholesky,batch_rows=16")
    X0, Y0 = reference.start_factors(*R.shape, 7, 0)
    budget = memory.SCRATCH_BUDGET
    for mode, kw in (("explicit", {}), ("implicit", dict(implicit_alpha=2.0)),
                     ("biased", dict(biased=True, offset=3.0))):
        fs = 8 if mode == "biased" else 7
        for side in ("users", "items"):
            got = {}
            for key in ("one", "host", "device", "ring"):
                # "ring": a scratch cap leaves each device a ring smaller than its block
                memory.SCRATCH_BUDGET = 8 * 4 * (fs * fs + fs) if key == "ring" else budget
                e = (make_backend(select_devices(base), R, 7, [(cfg, cfg)], **kw)
                     if key == "one" else
                     MultiEngine(devs, R, 7, [(cfg, cfg)] * len(devs), **kw,
                                 modes={side: "reduce", ("items" if side == "users"
                                                         else "users"): "replicate"},
                                 reduce_sum="host" if key == "host" else "device"))
                try:
                    if key == "ring":
                        assert any(w.buf[side]["ring"] < w.share.blocks[side][1]
                                   - w.share.blocks[side][0] for w in e.workers)
                    e.set_factors("users", X0)
                    e.set_factors("items", Y0)
                    for _ in range(2):
                        e.iteration(0.1, mode != "implicit")
                    got[key] = (e.get_factors("users", True), e.get_factors("items", True))
                finally:
                    e.release()
                    memory.SCRATCH_BUDGET = budget
            (x1, b1), (y1, c1) = got["one"]
            for key in ("host", "device", "ring"):
                (x2, b2), (y2, c2) = got[key]
                out = {"spec": spec, "mode": mode, "reduce": side, "sums": key,
                       "devices": len(devs), "x": rel(x2, x1), "y": rel(y2, y1)}
                if mode == "biased":
                    out["bias"] = max(rel(b2, b1), rel(c2, c1))
                if key == "device":
                    (x3, _), (y3, _) = got["host"]
                    out["vs_host"] = max(rel(x2, x3), rel(y2, y3))
                print(json.dumps(out), flush=True)


def main():
    import clmf
    R = ratings(160, 90, 0.12, seed=3)
    pocl = [i for i, d in ((d.index, d) for d in clmf.devices()) if "Portable" in d.platform]
    base_dev = pocl[0]
    for spec_text in sys.argv[1:]:
        spec = json.loads(spec_text) if spec_text.startswith("[") else spec_text
        for mode in ("explicit", "implicit", "biased"):
            one = fit(R, base_dev, mode, 1)
            many = fit(R, spec, mode, 1)
            one3 = fit(R, base_dev, mode, 3)
            many3 = fit(R, spec, mode, 3)
            out = {"spec": spec, "mode": mode, "devices": many.device_,
                   "x": rel(many.user_factors_, one.user_factors_),
                   "y": rel(many.item_factors_, one.item_factors_)}
            if mode != "implicit":
                r1, r2 = one3.rmse(R), many3.rmse(R)
                out["rmse_rel"] = abs(r2 - r1) / r1
            if mode == "biased":
                out["bias"] = rel(many.user_biases_, one.user_biases_)
            # the multi-device model is an ordinary model
            u = sp.csr_matrix(R[[0, 7]])
            many3.partial_fit_users([0, 7], u)
            ids, _scores = many3.recommend(1, sp.csr_matrix(R[1]), N=5)
            out["recommend"] = len(ids)
            import os
            import tempfile
            with tempfile.TemporaryDirectory() as tmp:
                path = many3.save(os.path.join(tmp, "m.npz"))
                back = clmf.load(path)
                out["saved"] = bool(np.allclose(back.predict([0, 1], [2, 3]),
                                                many3.predict([0, 1], [2, 3])))
            out["configs"] = [str(c["users"].config) for c in many.device_configs_]
            print(json.dumps(out), flush=True)
        reduce_rows(R, base_dev, spec)


if __name__ == "__main__":
    main()
