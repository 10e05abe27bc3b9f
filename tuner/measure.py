"""Measuring one candidate configuration: validate, then time on sampled rows.

Per candidate (the same configuration on both sides):

1. **build** through :func:`clmf.kernels.als_program` (pre-build validation and the built
   kernel's limits; :class:`InvalidConfigError` carries the typed reason → record "invalid");
2. **validate** against the NumPy reference (:mod:`clmf.reference`) on a small problem with row
   lengths from 0 to beyond every ``nnz_batch``: one iteration from the same start, relative
   Frobenius error ≤ 1e-4 (float32 storage; 1e-2 for float16 — half precision rounding) on both
   factor matrices, against reference CG with the same steps for the CG solver → else "wrong";
   a singular system or an OpenCL error → "failed";
3. **time** each side's half-step on a *sample* of that side's rows (:class:`Sample`: stratified
   by row length, all columns kept) with OpenCL profiling events: one warm-up, then at least
   ``repeats`` (7) runs and until ``min_time`` seconds have been timed — or, for a slow candidate
   whose runs reach ``max_time`` seconds, 3 runs (the adaptive minimum time); the median of the runs' device
   times is kept with the raw times and the per-stage (S1, S2, S3) medians. The sampled times are
   scaled to the whole side (S1/S2 by nnz, S3 by rows), and the objective is the estimated time
   of a whole ALS iteration (both half-steps).
"""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import scipy.sparse as sp

from clmf import reference
from clmf.config import KernelConfig
from clmf.errors import InvalidConfigError, SingularSystemError

log = logging.getLogger(__name__)

__all__ = ["Sample", "stratified_rows", "make_sample", "Measurer", "Result", "SIDES"]

SIDES = ("users", "items")
VERIFY_TOL = {"float32": 1e-4, "float16": 1e-2}
REG = 0.05


def stratified_rows(lengths, fraction, rng, min_rows=1):
    """Indices of a sample of the non-empty rows, stratified by row length (log2 bins), the same
    fraction from every bin (at least one per bin), the longest row always included."""
    lengths = np.asarray(lengths)
    nz = np.nonzero(lengths > 0)[0]
    if nz.size == 0:
        return nz
    want = max(min_rows, int(round(fraction * nz.size)))
    if want >= nz.size:
        return nz
    frac = want / nz.size
    bins = np.floor(np.log2(lengths[nz])).astype(int)
    picked = [nz[np.argmax(lengths[nz])]]
    for b in np.unique(bins):
        members = nz[bins == b]
        k = max(1, int(round(frac * members.size)))
        picked.extend(rng.choice(members, size=min(k, members.size), replace=False))
    return np.unique(np.asarray(picked))


@dataclasses.dataclass
class Sample:
    """The rows of one side used for timing, as a users × items CSR ready for an Engine."""
    side: str
    R: sp.csr_matrix        # users side: sampled users × all items; items: all users × sampled items
    rows: int               # sampled rows (non-empty)
    nnz: int
    full_rows: int          # non-empty rows of the side
    full_nnz: int
    fraction: float

    @property
    def scale_rows(self):
        return self.full_rows / max(1, self.rows)

    @property
    def scale_nnz(self):
        return self.full_nnz / max(1, self.nnz)

    def describe(self):
        return {"rows": int(self.rows), "nnz": int(self.nnz), "full_rows": int(self.full_rows),
                "full_nnz": int(self.full_nnz), "fraction": round(float(self.fraction), 6)}


def make_sample(R, side, fraction, seed=0, min_rows=32):
    """The sample of ``side``'s rows of ``R`` (users × items CSR) at ``fraction``."""
    R = sp.csr_matrix(R)
    rng = np.random.default_rng(seed)
    if side == "users":
        lengths = np.diff(R.indptr)
        idx = stratified_rows(lengths, fraction, rng, min_rows)
        sub = R[idx]
    else:
        C = R.tocsc()
        lengths = np.diff(C.indptr)
        idx = stratified_rows(lengths, fraction, rng, min_rows)
        sub = sp.csr_matrix(C[:, idx])
    sub.sort_indices()
    full_rows = int(np.count_nonzero(lengths))
    return Sample(side, sub, int(idx.size), int(sub.nnz), full_rows, int(R.nnz),
                  idx.size / max(1, full_rows))


def _verify_problem(seed=12345):
    """A small problem whose row and column lengths range from 0 to beyond 128 (every nnz_batch
    boundary), with empty rows and columns."""
    rng = np.random.default_rng(seed)
    m, n = 61, 173
    lengths = np.concatenate([[0, 1, 2, 3, 7, 8, 9, 16, 17, 31, 33, 64, 65, 129, 150],
                              rng.integers(1, 40, m - 15)])
    rows, cols = [], []
    pcol = np.linspace(1.0, 0.05, n)
    pcol[[5, 77]] = 0.0                 # two empty columns
    pcol /= pcol.sum()
    for u, k in enumerate(lengths):
        c = rng.choice(n, size=min(int(k), n - 2), replace=False, p=pcol)
        rows.extend([u] * c.size)
        cols.extend(c.tolist())
    vals = rng.integers(1, 6, len(rows)).astype(np.float32)
    return sp.csr_matrix((vals, (rows, cols)), shape=(m, n))


@dataclasses.dataclass
class Result:
    """The outcome of one candidate at one fidelity."""
    config: KernelConfig
    status: str                     # ok | invalid | wrong | failed
    reason: str = ""
    message: str = ""
    verify_rel_err: float | None = None
    sides: dict = dataclasses.field(default_factory=dict)   # side -> timing dict
    fidelity: str = "full"
    seconds_spent: float = 0.0

    @property
    def ok(self):
        return self.status == "ok"

    def side_seconds(self, side):
        return self.sides[side]["seconds"] if self.ok else float("inf")

    @property
    def iteration_seconds(self):
        return sum(self.side_seconds(s) for s in SIDES) if self.ok else float("inf")


class Measurer:
    """Validates and times configurations of one tuning case (device, data, f, storage).

    Parameters
    ----------
    device : pyopencl.Device
    R : users × items CSR (the data set being tuned for)
    f : factors
    samples : {side: Sample} (see :func:`calibrate_samples`)
    repeats : minimum timed runs at full fidelity (≥ 7)
    min_time : keep timing until this many seconds of device time (full fidelity)
    """

    def __init__(self, device, R, f, samples, storage="float32", repeats=7, min_time=0.05,
                 max_runs=60, low_repeats=3, max_time=2.0):
        from clmf.device import device_info
        self.device = device
        self.info = device_info(device)
        self.R = sp.csr_matrix(R)
        self.f = int(f)
        self.storage = storage
        self.samples = samples
        self.repeats = max(7, int(repeats))
        self.min_time = float(min_time)
        self.max_runs = int(max_runs)
        self.low_repeats = max(1, int(low_repeats))
        self.max_time = float(max_time)
        self._init = {}
        self._verify_R = _verify_problem()
        self._verify_ref = {}
        self._verified = {}

    # ----- starting factors ------------------------------------------------------------------
    def _start(self):
        if "full" not in self._init:
            m, n = self.R.shape
            self._init["full"] = reference.start_factors(m, n, self.f, 0)
        return self._init["full"]

    # ----- validation ------------------------------------------------------------------------
    def _reference(self, cfg):
        key = (cfg.solver, cfg.cg_steps if cfg.solver != "cholesky" else 0)   # both CG solvers
        if key not in self._verify_ref:
            R = self._verify_R
            X0, Y0 = reference.start_factors(*R.shape, self.f, 7)
            Xr, Yr = reference.als(R, self.f, 0.1, 1, init=(X0, Y0), solver=cfg.solver,
                                   cg_steps=cfg.cg_steps)
            self._verify_ref[key] = (X0, Y0, Xr, Yr)
        return self._verify_ref[key]

    def verify(self, cfg):
        """Relative error of one iteration on the validation problem (raises like Engine)."""
        from clmf.engine import Engine
        X0, Y0, Xr, Yr = self._reference(cfg)
        eng = Engine(self.device, self._verify_R, self.f, (cfg, cfg))
        try:
            eng.set_factors("users", X0)
            eng.set_factors("items", Y0)
            eng.iteration(0.1, True)
            X, Y = eng.get_factors("users"), eng.get_factors("items")
        finally:
            eng.release()

        def rel(a, b):
            nb = np.linalg.norm(b)
            return float(np.linalg.norm(a.astype(np.float64) - b) / (nb if nb > 0 else 1.0))
        err = max(rel(X, Xr), rel(Y, Yr))
        return err if np.isfinite(err) else float("inf")

    # ----- timing ----------------------------------------------------------------------------
    def time_side(self, cfg, side, repeats, min_time):
        """Median device time of ``side``'s half-step on its sample (see module docstring)."""
        from clmf.engine import Engine
        s = self.samples[side]
        X0, Y0 = self._start()
        eng = Engine(self.device, s.R, self.f, (cfg, cfg), profile=True)
        try:
            # the sample's own rows start from the full problem's start factors
            if side == "users":
                eng.set_factors("users", np.zeros((s.R.shape[0], self.f), np.float32))
                eng.set_factors("items", Y0)
            else:
                eng.set_factors("users", X0)
                eng.set_factors("items", np.zeros((s.R.shape[1], self.f), np.float32))
            eng.half_step(side, REG, True)          # warm-up (and JIT on lazy runtimes)
            eng.queue.finish()
            raw, wall, stages = [], [], {"s1": [], "s2": [], "s3": []}
            total = 0.0
            # at least `repeats` runs and `min_time` seconds; a slow candidate (one whose runs
            # add up to `max_time`) stops after 3 runs: the adaptive minimum time
            while len(raw) < self.max_runs and (len(raw) < repeats or total < min_time):
                if len(raw) >= min(3, repeats) and total >= self.max_time:
                    break
                eng.stage_times = {"s1": 0.0, "s2": 0.0, "s3": 0.0}
                t0 = time.perf_counter()
                eng.half_step(side, REG, True)
                wall.append(time.perf_counter() - t0)
                st = dict(eng.stage_times)
                dt = st["s1"] + st["s2"] + st["s3"]
                raw.append(dt)
                for k in stages:
                    stages[k].append(st[k])
                total += dt
        finally:
            eng.release()
        med = {k: float(np.median(v)) for k, v in stages.items()}
        sample_seconds = float(np.median(raw))
        # the fused CG's S3 walks the row's entries: it scales with the ratings, not the rows
        s3_scale = s.scale_nnz if cfg.solver == "fusedcg" else s.scale_rows
        est = (med["s1"] + med["s2"]) * s.scale_nnz + med["s3"] * s3_scale
        return {"seconds": est, "sample_seconds": sample_seconds,
                "stages": {k: round(v, 9) for k, v in med.items()},
                "stages_estimated": {"s1": med["s1"] * s.scale_nnz, "s2": med["s2"] * s.scale_nnz,
                                     "s3": med["s3"] * s3_scale},
                "raw": [round(x, 9) for x in raw], "wall": [round(x, 6) for x in wall],
                "runs": len(raw)}

    # ----- one candidate ---------------------------------------------------------------------
    def evaluate(self, cfg, fidelity="full", verified=None):
        """Build, validate (unless ``verified`` gives the earlier error) and time ``cfg``."""
        import pyopencl as cl
        t0 = time.perf_counter()
        res = Result(cfg, "ok", fidelity=fidelity)
        try:
            if verified is None:
                from clmf.kernels import als_program
                from clmf.device import get_context
                ctx, _q = get_context(self.device)
                als_program(ctx, self.device, cfg, self.f, self.info)   # typed invalid reasons
                err = self.verify(cfg)
            else:
                err = verified
            res.verify_rel_err = err
            tol = VERIFY_TOL.get(cfg.storage, 1e-4)
            if not err <= tol:
                res.status, res.reason = "wrong", "reference_mismatch"
                res.message = f"relative error {err:.3g} > {tol:g} after one iteration"
                return res
            reps = self.repeats if fidelity == "full" else self.low_repeats
            mt = self.min_time if fidelity == "full" else 0.0
            for side in SIDES:
                res.sides[side] = self.time_side(cfg, side, reps, mt)
        except InvalidConfigError as e:
            res.status, res.reason, res.message = "invalid", e.reason, str(e)
        except SingularSystemError as e:
            res.status, res.reason, res.message = "failed", "singular", str(e)
        except cl.Error as e:
            res.status, res.reason, res.message = "failed", f"opencl:{type(e).__name__}", str(e)
        except MemoryError as e:
            res.status, res.reason, res.message = "failed", "memory", str(e)
        except (RuntimeError, ValueError) as e:
            res.status, res.reason, res.message = "failed", type(e).__name__, str(e)
        finally:
            res.seconds_spent = time.perf_counter() - t0
        if not res.ok:
            res.sides = {}
        return res


MEASURE_VERSION = 2      # part of a run's identity: a journal of another method is not resumed


def sample_min_rows(info):
    return max(8, 4 * info.compute_units)


def calibrate_samples(device, R, f, probe, target_seconds=0.03, min_rows=None, seed=0,
                      max_fraction=1.0):
    """Per side, the sample fraction whose half-step with ``probe`` (a KernelConfig) takes about
    ``target_seconds`` of device time (never fewer than ``min_rows`` rows: by default 8 or
    4 per compute unit, whichever is larger). Returns ``{side: Sample}``."""
    from clmf.device import device_info
    info = device_info(device)
    if min_rows is None:
        min_rows = sample_min_rows(info)
    R = sp.csr_matrix(R)
    out = {}
    for side in SIDES:
        lengths = np.diff(R.indptr) if side == "users" else np.bincount(R.indices,
                                                                          minlength=R.shape[1])
        rows, nnz = int(np.count_nonzero(lengths)), int(R.nnz)
        frac = min(max_fraction, 4096 / max(rows, 1), 500_000 / max(nnz, 1))
        for _round in range(3):
            s = make_sample(R, side, frac, seed, min_rows)
            m = Measurer(device, R, f, {side: s}, "float32", repeats=7, min_time=0.0)
            t = m.time_side(probe, side, 1, 0.0)["sample_seconds"]
            log.info("calibrate %s: fraction %.4g (%d rows, %d nnz) takes %.4f s", side, frac,
                     s.rows, s.nnz, t)
            if t <= 0:
                break
            new = min(max_fraction, frac * target_seconds / t)
            if s.rows <= min_rows and new < frac:
                break
            if 0.5 <= new / frac <= 2.0 or (frac >= max_fraction and new >= frac):
                break
            frac = new
        out[side] = s
    return out
