"""Measuring one candidate configuration: validate, then time on sampled rows.

Per candidate (the same configuration on both sides), in the tuning *mode* of the case
(``explicit`` ratings, ``implicit`` feedback with confidence ``1 + alpha·r``, or ``biased``:
explicit with user/item biases, f + 1 unknowns per system):

1. **build** through :func:`clmf.engine.kernels.als_program` (pre-build validation and the built
   kernel's limits, for the mode's kernels; :class:`InvalidConfigError` carries the typed reason
   → record "invalid");
2. **validate** against the NumPy reference of the mode (:func:`clmf.reference.als`, with
   ``implicit_alpha`` and λ·I for implicit; :func:`clmf.reference.als_biased` for biased) on a
   small problem with row lengths from 0 to beyond every ``nnz_batch``: one iteration from the
   same start, relative Frobenius error ≤ :func:`verify_tolerance` (1e-4 for float32 storage,
   1e-2 for float16 — half precision rounding; ×50 in implicit mode, where float32 rounding is
   amplified by the dense YᵀY term: ≈ 1e-3 seen for correct CG kernels at f = 64–100) on both
   factor matrices (with biases: [factors | bias]), against reference CG with the same steps for
   the CG solvers → else "wrong"; a singular system or an OpenCL error → "failed";
3. **time** each side's half-step on a *sample* of that side's rows (:class:`Sample`: stratified
   by row length, all columns kept) with OpenCL profiling events: one warm-up, then at least
   ``repeats`` (7) runs and until ``min_time`` seconds have been timed — or, for a slow candidate
   whose runs reach ``max_time`` seconds, 3 runs (the adaptive minimum time); the median of the runs' device
   times is kept with the raw times and the per-stage (S1, S2, S3) medians. The sampled times are
   scaled to the whole side (S1/S2 by nnz, S3 by rows; the fused CG's S3 by nnz), and the
   objective is the estimated time of a whole ALS iteration (both half-steps). In implicit mode
   each half-step also builds the Gram matrix of the other side (``clmf.engine.launch.
   launch_gram``); the engine does not profile those launches, so the measurer
   records the engine's launches (through its own view of the program) and adds the Gram's
   device time unscaled (stage ``gram``: the other side is never sampled).

The sample (:func:`calibrate_samples`) holds enough rows to keep every compute unit busy
(:func:`sample_min_rows`), on a GPU enough ratings that its longest row does not hold a launch
alone (:func:`balanced_sample`), and is *checked* (:func:`check_samples`): one reference configuration is
timed on the sample and on the whole side (or, when that would take longer than ``check_time``,
on a much larger sample); when the sample's scaled estimate is off by more than ``tol`` (20 %)
the sample grows ×2, ×4, … up to the reference. ``sample="full"`` times whole half-steps (no
sampling).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np
import scipy.sparse as sp

from clmf import reference
from clmf.engine.config import KernelConfig
from clmf.errors import InvalidConfigError, SingularSystemError
from clmf.tuning.spec import kernel_factors, weighted_rule

log = logging.getLogger(__name__)

__all__ = ["Sample", "stratified_rows", "make_sample", "full_sample", "Measurer", "Result", "pruned",
           "sample_spec",
           "SIDES", "MODES", "verify_tolerance", "calibrate_samples", "check_samples",
           "sample_min_rows", "balanced_sample", "longest_row", "BALANCE", "BALANCE_SECONDS"]

SIDES = ("users", "items")
MODES = ("explicit", "implicit", "biased")
VERIFY_TOL = {"float32": 1e-4, "float16": 1e-2}
MODE_TOL_FACTOR = {"explicit": 1.0, "biased": 1.0, "implicit": 50.0}
REG = 0.05
VERIFY_REG = 0.1


# A float32 CG stopped after a few steps amplifies rounding differences the float64 reference CG
# does not have: on the validation problem every correct CG configuration lands at 8–9e-5 on the
# items side (Intel CPU) and a kernel summing in another order (split-K) at 1.2e-4 (H100), against
# 4e-7–4e-6 with Cholesky. A wrong kernel is off by far more (≥ 1e-2).
CG_TOL_FACTOR = 10.0


def verify_tolerance(storage="float32", mode="explicit", solver="cholesky"):
    """The relative error a correct kernel stays within on the validation problem."""
    f = MODE_TOL_FACTOR.get(mode, 1.0)
    if solver != "cholesky":
        f = max(f, CG_TOL_FACTOR)
    return VERIFY_TOL.get(storage, 1e-4) * f


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


def full_sample(R, side):
    """The whole side as a "sample" (scale 1): timing it times whole half-steps."""
    R = sp.csr_matrix(R)
    lengths = np.diff(R.indptr) if side == "users" else np.bincount(R.indices,
                                                                      minlength=R.shape[1])
    rows = int(np.count_nonzero(lengths))
    return Sample(side, R, rows, int(R.nnz), rows, int(R.nnz), 1.0)


def make_sample(R, side, fraction, seed=0, min_rows=32):
    """The sample of ``side``'s rows of ``R`` (users × items CSR) at ``fraction`` (the whole side,
    unsampled, at ``fraction`` ≥ 1)."""
    if fraction >= 1.0:
        return full_sample(R, side)
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


class _Recorder:
    """A kernel that appends (name, event) of every launch to a list."""

    def __init__(self, kernel, name, sink):
        self._kernel, self._name, self._sink = kernel, name, sink

    def __call__(self, *args, **kw):
        ev = self._kernel(*args, **kw)
        self._sink.append((self._name, ev))
        return ev

    def __getattr__(self, attr):
        return getattr(self._kernel, attr)


class _RecordingProgram:
    """One engine's view of a (shared, memoised) program whose launches are recorded."""

    def __init__(self, prog, sink):
        self._prog = prog
        self.kernels = {k: _Recorder(v, k, sink) for k, v in prog.kernels.items()}

    def __getattr__(self, attr):
        return getattr(self._prog, attr)


def _gram_seconds(launches):
    """Device seconds of an implicit half-step's Gram matrix: its launches up to the last
    ``gr_sum`` or ``sum_partials`` (the partial tiles or the S1 path's partial sums, then their
    sum: :func:`clmf.engine.launch.launch_gram`), which precede every batch."""
    last = max((i for i, (name, _e) in enumerate(launches)
                if name in ("gr_sum", "sum_partials")), default=-1)
    t = 0.0
    for _name, ev in launches[:last + 1]:
        ev.wait()
        t += (ev.profile.end - ev.profile.start) * 1e-9
    return t


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


def sample_spec(sample):
    """A session's ``sample=``: "auto", "full" or a fraction in (0, 1] (1 → "full")."""
    if sample is None:
        return "auto"
    if isinstance(sample, str) and sample.strip().lower() in ("auto", "full"):
        return sample.strip().lower()
    try:
        x = float(sample)
    except (TypeError, ValueError):
        raise ValueError(f"sample must be 'auto', 'full' or a fraction in (0, 1], not {sample!r}") \
            from None
    if not 0 < x <= 1:
        raise ValueError(f"a sample fraction must be in (0, 1], not {x}")
    return "full" if x == 1 else x


def pruned(cfg, mode, kf, info, fidelity="full"):
    """An ``invalid`` :class:`Result` (the typed reason of :func:`clmf.engine.kernels.validate`:
    work-group and work-item limits, local memory, register blocks, geometry) when ``cfg``
    cannot be built at the kernels' f ``kf`` on the device ``info``, else None: a configuration
    from outside the space (the incumbent, earlier bests, starts) is then never built or timed.
    (The space's own candidates are pruned harder by :func:`clmf.autotune.space.prune`, which also
    drops shapes that could run but waste work-items.)"""
    from clmf.engine.kernels import validate
    try:
        validate(cfg, kf, info)
        return None
    except InvalidConfigError as e:
        return Result(cfg, "invalid", e.reason, f"pruned before building: {e}", None, {},
                      fidelity, 0.0)


def _result_to_json(r: Result):
    """A Result as a JSON object (journal, summary)."""
    return {"config": r.config.to_dict(), "status": r.status, "reason": r.reason,
            "message": r.message, "verify_rel_err": r.verify_rel_err, "sides": r.sides,
            "fidelity": r.fidelity, "seconds_spent": r.seconds_spent}


def _result_from_json(d):
    """The Result of :func:`_result_to_json`."""
    return Result(KernelConfig.from_dict(d["config"]), d["status"], d.get("reason", ""),
                  d.get("message", ""), d.get("verify_rel_err"), d.get("sides") or {},
                  d.get("fidelity", "full"), float(d.get("seconds_spent", 0.0)))


class Measurer:
    """Validates and times configurations of one tuning case (device, data, f, storage, mode).

    Parameters
    ----------
    device : pyopencl.Device
    R : users × items CSR (the data set being tuned for)
    f : factors
    samples : {side: Sample} (see :func:`calibrate_samples`)
    repeats : minimum timed runs at full fidelity (≥ 7)
    min_time : keep timing until this many seconds of device time (full fidelity)
    mode : "explicit", "implicit" (with ``alpha``) or "biased"
    """

    def __init__(self, device, R, f, samples, storage="float32", repeats=7, min_time=0.05,
                 max_runs=60, low_repeats=3, max_time=2.0, mode="explicit", alpha=1.0):
        from clmf.engine.device import device_info
        if mode not in MODES:
            raise ValueError(f"unknown tuning mode {mode!r}; choose from {MODES}")
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
        self.mode = mode
        self.alpha = float(alpha)
        self.kf = kernel_factors(self.f, mode)                     # unknowns per system
        self.weighted = weighted_rule(None, "implicit" if mode == "implicit" else "explicit")
        self.offset = float(self.R.data.astype(np.float64).mean()) if (
            mode == "biased" and self.R.nnz) else 0.0
        self._init = {}
        self._verify_R = _verify_problem()
        self._verify_ref = {}
        self._verified = {}
        self._counts = {}        # id(matrix) -> (matrix, its column counts): see engine()
        # {side: seconds}: a candidate whose warm-up half-step takes longer is timed by it alone
        # (the session sets it from the incumbent's times: SLOW_CAP)
        self.slow_cap = {}

    def engine(self, R, cfg, profile=False, offset=None):
        """An :class:`clmf.engine.Engine` of this mode on ``R`` with ``cfg`` on both sides."""
        from clmf.data.scan import count_columns
        from clmf.engine.core import Engine
        # the items' counts of a matrix timed again (every candidate, every showdown round: a
        # whole side is 99M ratings on the Netflix shape) are scanned once
        held = self._counts.get(id(R))
        if held is None or held[0] is not R:
            held = self._counts[id(R)] = (R, count_columns(R.indices, R.shape[1]))
        return Engine(self.device, R, self.f, (cfg, cfg), profile=profile,
                      implicit_alpha=self.alpha if self.mode == "implicit" else None,
                      biased=self.mode == "biased", item_counts=held[1],
                      offset=self.offset if offset is None else offset)

    # ----- starting factors ------------------------------------------------------------------
    def _start(self):
        if "full" not in self._init:
            m, n = self.R.shape
            self._init["full"] = reference.start_factors(m, n, self.f, 0)
        return self._init["full"]

    # ----- validation ------------------------------------------------------------------------
    def _reference(self, cfg):
        """(X0, Y0, X, Y[, extra]) of one reference iteration of this mode on the validation
        problem (biased: extra = (user biases, item biases, μ))."""
        key = (cfg.solver, cfg.cg_steps if cfg.solver != "cholesky" else 0)   # both CG solvers
        if key not in self._verify_ref:
            R = self._verify_R
            X0, Y0 = reference.start_factors(*R.shape, self.f, 7)
            if self.mode == "biased":
                Xr, Yr, bu, bi, mu = reference.als_biased(R, self.f, VERIFY_REG, 1, init=(X0, Y0),
                                                          solver=cfg.solver, cg_steps=cfg.cg_steps)
                self._verify_ref[key] = (X0, Y0, Xr, Yr, (bu, bi, mu))
            else:
                alpha = self.alpha if self.mode == "implicit" else None
                Xr, Yr = reference.als(R, self.f, VERIFY_REG, 1, weighted=self.weighted,
                                       init=(X0, Y0), solver=cfg.solver, cg_steps=cfg.cg_steps,
                                       implicit_alpha=alpha)
                self._verify_ref[key] = (X0, Y0, Xr, Yr)
        return self._verify_ref[key]

    def verify(self, cfg):
        """Relative error of one iteration on the validation problem (raises like Engine)."""
        ref = self._reference(cfg)
        X0, Y0, Xr, Yr = ref[:4]
        extra = ref[4] if len(ref) > 4 else None
        if self.mode == "biased":
            mu = extra[2] if extra is not None else float(self._verify_R.data.mean())
            eng = self.engine(self._verify_R, cfg, offset=mu)
        else:
            eng = self.engine(self._verify_R, cfg)
        try:
            eng.set_factors("users", X0)
            eng.set_factors("items", Y0)
            eng.iteration(VERIFY_REG, self.weighted)
            if self.mode == "biased":
                (X, bu), (Y, bi) = (eng.get_factors("users", with_biases=True),
                                    eng.get_factors("items", with_biases=True))
            else:
                X, Y = eng.get_factors("users"), eng.get_factors("items")
        finally:
            eng.release()

        def rel(a, b):
            nb = np.linalg.norm(b)
            return float(np.linalg.norm(a.astype(np.float64) - b) / (nb if nb > 0 else 1.0))
        if self.mode == "biased" and extra is not None:
            # the augmented unknowns [x_u, b_u] are one solution vector
            X, Xr = np.column_stack([X, bu]), np.column_stack([Xr, extra[0]])
            Y, Yr = np.column_stack([Y, bi]), np.column_stack([Yr, extra[1]])
        err = max(rel(X, Xr), rel(Y, Yr))
        return err if np.isfinite(err) else float("inf")

    # ----- timing ----------------------------------------------------------------------------
    def time_side(self, cfg, side, repeats, min_time, sample=None):
        """Median device time of ``side``'s half-step on its sample (see module docstring)."""
        s = sample if sample is not None else self.samples[side]
        X0, Y0 = self._start()
        eng = self.engine(s.R, cfg, profile=True)
        launches = None
        if self.mode == "implicit":
            # the engine profiles S1/S2/S3 of its batches, not the Gram launches that precede
            # them: record this engine's launches (its own view of the shared program)
            launches = []
            eng.programs[side] = _RecordingProgram(eng.programs[side], launches)
        try:
            # the sample's own rows start from the full problem's start factors
            if side == "users":
                eng.set_factors("users", np.zeros((s.R.shape[0], self.f), np.float32))
                eng.set_factors("items", Y0)
            else:
                eng.set_factors("users", X0)
                eng.set_factors("items", np.zeros((s.R.shape[1], self.f), np.float32))
            raw, wall, stages = [], [], {"s1": [], "s2": [], "s3": []}
            grams = []

            def run():
                """One profiled half-step, appended to the timings; its device seconds."""
                eng.stage_times = {"s1": 0.0, "s2": 0.0, "s3": 0.0, "combine": 0.0}
                if launches is not None:
                    launches.clear()
                t0 = time.perf_counter()
                eng.half_step(side, REG, self.weighted)
                eng.queue.finish()
                wall.append(time.perf_counter() - t0)
                st = dict(eng.stage_times)
                # the long rows' combine (split configurations) belongs to building S1's hermitians
                st["s1"] += st.get("combine", 0.0)
                dt = st["s1"] + st["s2"] + st["s3"]
                if launches is not None:
                    grams.append(_gram_seconds(launches))
                    dt += grams[-1]
                raw.append(dt)
                for k in stages:
                    stages[k].append(st[k])
                return dt

            run()                                       # warm-up (and JIT on lazy runtimes)
            if sample is None and wall[0] > self.slow_cap.get(side, math.inf):
                # hopeless (far slower than the incumbent): its warm-up is its one timing, not
                # worth 4 half-steps of a whole side (H100 f = 128: minutes a candidate)
                log.info("%s %s: warm-up %.3g s > %.3g s, timed once", cfg, side, wall[0],
                         self.slow_cap[side])
            else:
                for v in (raw, wall, grams, *stages.values()):
                    v.clear()
                total = 0.0
                # at least `repeats` runs and `min_time` seconds; a slow candidate (one whose
                # runs add up to `max_time`) stops after 3 runs: the adaptive minimum time
                while len(raw) < self.max_runs and (len(raw) < repeats or total < min_time):
                    if len(raw) >= min(3, repeats) and total >= self.max_time:
                        break
                    total += run()
        finally:
            eng.release()
        med = {k: float(np.median(v)) for k, v in stages.items()}
        gram = float(np.median(grams)) if grams else 0.0
        sample_seconds = float(np.median(raw))
        # the fused CG's S3 walks the row's entries: it scales with the ratings, not the rows
        s3_scale = s.scale_nnz if cfg.solver == "fusedcg" else s.scale_rows
        est = (med["s1"] + med["s2"]) * s.scale_nnz + med["s3"] * s3_scale + gram
        out = {"seconds": est, "sample_seconds": sample_seconds,
               "stages": {k: round(v, 9) for k, v in med.items()},
               "stages_estimated": {"s1": med["s1"] * s.scale_nnz, "s2": med["s2"] * s.scale_nnz,
                                    "s3": med["s3"] * s3_scale},
               "raw": [round(x, 9) for x in raw], "wall": [round(x, 6) for x in wall],
               "runs": len(raw)}
        if launches is not None:
            # the Gram is the other side's whole YᵀY (never sampled): not scaled
            out["stages"]["gram"] = round(gram, 9)
            out["stages_estimated"]["gram"] = gram
        return out

    # ----- one candidate ---------------------------------------------------------------------
    def evaluate(self, cfg, fidelity="full", verified=None):
        """Build, validate (unless ``verified`` gives the earlier error) and time ``cfg``."""
        import pyopencl as cl
        t0 = time.perf_counter()
        res = Result(cfg, "ok", fidelity=fidelity)
        try:
            if verified is None:
                from clmf.engine.device import get_context
                from clmf.engine.kernels import als_program
                ctx, _q = get_context(self.device)
                als_program(ctx, self.device, cfg, self.kf, self.info,        # typed invalid
                            self.mode == "implicit", self.mode == "biased")   # reasons
                err = self.verify(cfg)
            else:
                err = verified
            res.verify_rel_err = err
            tol = verify_tolerance(cfg.storage, self.mode, cfg.solver)
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


MEASURE_VERSION = 3      # part of a run's identity: a journal of another method is not resumed
SAMPLE_TOL = 0.2         # the sample's scaled estimate of the probe within 20 % of the reference
CHECK_TIME = 1.0         # the reference timing: the whole side when it takes ≤ this (device s)


def sample_min_rows(info, probe=None, f=None):
    """Rows a sample keeps at least so one launch fills the device: on a CPU 4 per compute unit
    (at least 8); on a GPU/accelerator as many work-groups as every compute unit holds at once
    (≈ 2 × the work-group limit in work-items per unit, e.g. 2048 on NVIDIA: 4–32 rows per unit
    with the S1 work-group of ``probe``)."""
    if info.type == "CPU":
        return max(8, 4 * info.compute_units)
    if probe is not None and (f is not None or not probe.syrk):
        local = max(1, probe.s1_local_size(f))
    else:
        local = 256
    per_cu = min(32, max(4, -(-2 * info.max_work_group_size // local)))
    return max(8, info.compute_units * per_cu)


# a GPU's sample keeps its ratings ≥ BALANCE × compute units × its longest row (the stratified
# sample always holds the side's longest row), grown up to BALANCE_SECONDS of sampled time: a
# work-group per row leaves a launch waiting for its longest row's work-group once the others
# drained, so a sample where that row outweighs a compute unit's share times that tail, not the
# kernel (H100, Netflix items at explicit f = 128: 1,057 of 17,770 rows with the 209,617-rating
# row ran the dims form 3.6x and gemm 1.55x slower per rating than the whole side, and the
# tuner kept gemm, 1.47x slower there: results/bench/gpu-implicit/run-48/)
BALANCE = 4
# a candidate whose warm-up half-step on the search's sample takes this many times the
# incumbent's (and at least SLOW_MIN seconds: a CPU runtime may compile in the warm-up; a GPU's
# programs are built before it, SLOW_MIN_GPU) is timed once
SLOW_CAP = 20.0
SLOW_MIN = 10.0
SLOW_MIN_GPU = 2.0
BALANCE_SECONDS = 0.5


def longest_row(sample):
    """Ratings of the longest row of a sample's side."""
    R = sample.R
    if not R.nnz:
        return 0
    if sample.side == "users":
        return int(np.diff(R.indptr).max())
    return int(np.bincount(R.indices, minlength=R.shape[1]).max())


def slow_caps(results, minimum=SLOW_MIN):
    """``{side: seconds}``: the warm-up time beyond which a candidate counts as hopeless on the
    search's sample — :data:`SLOW_CAP` × the slowest median wall time of ``results`` (the
    incumbent's) on the side, at least ``minimum``."""
    out = {}
    for side in SIDES:
        walls = [float(np.median(r.sides[side]["wall"])) for r in results
                 if r.ok and r.sides.get(side, {}).get("wall")]
        if walls:
            out[side] = max(minimum, SLOW_CAP * max(walls))
    return out


def balanced_sample(R, side, s, compute_units, seed=0, min_rows=32, max_fraction=1.0,
                    max_growth=float("inf")):
    """``s`` grown (a larger fraction of ``side``'s rows of ``R``) until its ratings are at least
    :data:`BALANCE` × ``compute_units`` × its longest row, the whole side, ``max_fraction`` or
    ``max_growth`` × its ratings; ``s`` itself where it already is."""
    while s.fraction < max_fraction:
        need = BALANCE * max(1, int(compute_units)) * longest_row(s)
        if s.nnz >= need:
            break
        grow = min(max_growth, max(1.25, need / max(1, s.nnz)))
        if grow < 1.25:
            break
        max_growth /= grow
        s = make_sample(R, side, min(max_fraction, s.fraction * grow), seed, min_rows)
    return s


def calibrate_samples(device, R, f, probe, target_seconds=0.03, min_rows=None, seed=0,
                      max_fraction=1.0, storage="float32", mode="explicit", alpha=1.0):
    """Per side, the sample fraction whose half-step with ``probe`` (a KernelConfig) takes about
    ``target_seconds`` of device time (never fewer than ``min_rows`` rows: by default
    :func:`sample_min_rows`). Returns ``{side: Sample}`` (check them with :func:`check_samples`)."""
    from clmf.engine.device import device_info
    info = device_info(device)
    if min_rows is None:
        min_rows = sample_min_rows(info, probe, f)
    R = sp.csr_matrix(R)
    out = {}
    for side in SIDES:
        lengths = np.diff(R.indptr) if side == "users" else np.bincount(R.indices,
                                                                          minlength=R.shape[1])
        rows, nnz = int(np.count_nonzero(lengths)), int(R.nnz)
        frac = min(max_fraction, max(4096, min_rows) / max(rows, 1), 500_000 / max(nnz, 1))
        for _round in range(3):
            s = make_sample(R, side, frac, seed, min_rows)
            m = Measurer(device, R, f, {side: s}, storage, repeats=7, min_time=0.0, mode=mode,
                         alpha=alpha)
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
        if info.type != "CPU" and t > 0:
            b = balanced_sample(R, side, s, info.compute_units, seed, min_rows, max_fraction,
                                max_growth=BALANCE_SECONDS / t)
            if b is not s:
                log.info("balance %s: %d -> %d rows (%d -> %d ratings; longest row %d)", side,
                         s.rows, b.rows, s.nnz, b.nnz, longest_row(b))
            s = b
        out[side] = s
    return out


def _step(s, t, ref_seconds=None):
    d = {"fraction": round(float(s.fraction), 6), "rows": int(s.rows), "nnz": int(s.nnz),
         "sample_seconds": t["sample_seconds"], "estimate_seconds": t["seconds"]}
    if ref_seconds:
        d["ratio"] = t["seconds"] / ref_seconds
    return d


def check_samples(device, R, f, probe, samples, tol=SAMPLE_TOL, check_time=CHECK_TIME, seed=0,
                  min_rows=None, storage="float32", mode="explicit", alpha=1.0, repeats=3,
                  forms=()):
    """The calibration check: per side, ``probe`` timed on the sample (scaled to the whole side)
    and on a reference — the whole side when the estimate is ≤ ``check_time`` seconds, else a
    sample ≥ 4× larger (as large as ``check_time`` allows); while the estimate is off by more than
    ``tol`` (relative), the sample grows ×2, ×4, … up to the reference. Then the same for each
    configuration of ``forms`` (one per other kernel form: a sample can estimate the forms
    unequally — H100, 48f/49b: the dims form's items side 3x too slow where gemm's was right),
    from the sample the checks before it left (a probe that cannot run is left out, logged).

    Returns ``(samples, calibration)``: the (possibly grown) samples and, per side, a dict with the
    reference (whole side or not, rows, ratings, time), every sample tried (fraction, rows,
    ratings, sampled and estimated time, estimate / reference ratio), the final ratio and whether
    the sample grew; with ``forms``, ``"forms"``: the same dict of each form's check."""
    from clmf.engine.device import device_info
    info = device_info(device)
    if min_rows is None:
        min_rows = sample_min_rows(info, probe, f)
    R = sp.csr_matrix(R)
    samples = dict(samples)
    cal = {}
    for side in SIDES:
        m = Measurer(device, R, f, {side: samples[side]}, storage, repeats=7, min_time=0.0,
                     mode=mode, alpha=alpha)
        args = (m, R, side, tol, check_time, seed, min_rows, repeats)
        samples[side], cal[side] = _check_side(samples[side], probe, *args)
        done = []
        for p in forms:
            try:
                samples[side], c = _check_side(samples[side], p, *args)
            except Exception as e:          # (a form this device cannot run: not checked)
                log.warning("sample check %s with %s left out: %s", side, p, e)
                continue
            done.append(c)
        if done:
            cal[side]["forms"] = done
            cal[side]["final"] = done[-1]["final"]
    return samples, cal


def _check_side(s, probe, m, R, side, tol, check_time, seed, min_rows, repeats):
    """One side's check of ``probe`` from sample ``s`` (see :func:`check_samples`): (the sample
    to use, the check's dict)."""
    t0 = time.perf_counter()
    c = {"probe": str(probe), "tolerance": tol, "check_time": check_time}
    if s.rows >= s.full_rows:
        c.update(checked=False, note="the whole side is timed: nothing to check",
                 ratio=1.0, grown=False, final={"fraction": 1.0, "rows": int(s.rows)})
        return s, c
    t = m.time_side(probe, side, repeats, 0.0, sample=s)
    if t["seconds"] <= check_time:
        ref = full_sample(R, side)
    else:
        grow = max(4.0, check_time / max(t["sample_seconds"], 1e-9))
        ref = make_sample(R, side, min(1.0, s.fraction * grow), seed, min_rows)
    tr = m.time_side(probe, side, repeats, 0.0, sample=ref)
    if ref.rows < ref.full_rows and tr["seconds"] <= check_time:
        # the sample overestimated (as a GPU sample that leaves the device idle does): the
        # larger sample says the whole side is affordable after all, so it is the reference
        ref = full_sample(R, side)
        tr = m.time_side(probe, side, repeats, 0.0, sample=ref)
    ref_s = tr["seconds"]
    c["reference"] = dict(_step(ref, tr), whole_side=bool(ref.rows >= ref.full_rows))
    steps = [_step(s, t, ref_s)]
    ratio = t["seconds"] / ref_s if ref_s > 0 else 1.0
    while abs(ratio - 1.0) > tol:
        frac = s.fraction * 2.0
        if frac >= ref.fraction or frac >= 1.0:
            s, ratio = ref, 1.0
            steps.append(dict(_step(ref, tr, ref_s), reference=True))
            break
        s = make_sample(R, side, frac, seed, min_rows)
        t = m.time_side(probe, side, repeats, 0.0, sample=s)
        ratio = t["seconds"] / ref_s if ref_s > 0 else 1.0
        steps.append(_step(s, t, ref_s))
    log.info("sample check %s (%s): %d → %d rows, estimate / reference %.3f (%s)", side, probe,
             steps[0]["rows"], s.rows, ratio,
             "whole side" if c["reference"]["whole_side"] else "larger sample")
    c.update(checked=True, steps=steps, ratio=ratio, grown=len(steps) > 1,
             first_ratio=steps[0]["ratio"], ok=abs(ratio - 1.0) <= tol,
             final={"fraction": round(float(s.fraction), 6), "rows": int(s.rows),
                    "nnz": int(s.nnz)},
             seconds=time.perf_counter() - t0)
    return s, c
