"""Multi-device agreement checks, run by tests/test_parallel.py in a subprocess whose environment
exposes several PoCL devices (``POCL_DEVICES="pthread pthread"``: the variable must be set before
the OpenCL ICD loader starts, hence the subprocess).

    python tests/multidev_check.py SPEC [SPEC...]      (each SPEC: a JSON device list or "cpu:all")

Prints one JSON line per (devices, mode) with the relative Frobenius differences of the factors
after one iteration and of the RMSE after three, against the first PoCL device alone, and the
results of partial_fit_users / recommend on the multi-device model.
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


if __name__ == "__main__":
    main()
