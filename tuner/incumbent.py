"""What the user already had: the incumbent, the device's earlier tunings, and the final guard.

A tuning run must never make a user's fits slower than before it. So a :class:`Session`
(:mod:`clmf.autotune.strategies`)

1. asks the lookup chain what ``ALS(variant="auto")`` would run for this device, f, data and mode
   without the run's own records (:func:`lookup_incumbent`, through
   :func:`clmf.tuning.incumbent`) and measures that pair first, on the same sample and with the
   same timing as every other candidate;
2. measures the best records of this device from every database (the shipped tunings included:
   :func:`earlier_bests`), nearest mode, f and data set first, in the first round;
3. at the end re-times the search's winner and the incumbent side by side, round-robin, on the
   whole data (or, where a half-step would take longer than ``check_time``, on the sample check's
   larger reference sample) (:func:`final_showdown`): if the winner is not faster, the record
   written holds the incumbent's configuration (``chosen: "incumbent"``), so the lookup keeps
   choosing it. The verdict is journaled: a resumed or repeated run replays it.
"""
from __future__ import annotations

import datetime
import json
import logging
import math
import time

import numpy as np

from clmf import tuning
from clmf.cache import open_lines
from clmf.engine.config import KernelConfig
from clmf.errors import InvalidConfigError

from .measure import SIDES, full_sample, make_sample
from .space import canonical, prune

log = logging.getLogger(__name__)

__all__ = ["lookup_incumbent", "earlier_bests", "reference_samples", "final_showdown",
           "verify_best"]


def lookup_incumbent(case, exclude_runs=()):
    """``{side: Choice}``: what a default fit (``variant="auto"``, ``solver="auto"``) of this
    case's device, f, data set and mode would run, leaving out the records of ``exclude_runs``."""
    stats = {s: case.side_class(s) for s in SIDES}
    return tuning.incumbent(case.info, case.f, stats, case.storage, None, case.mode,
                            exclude_runs=exclude_runs)


def _age(date):
    try:
        return -datetime.datetime.fromisoformat(date).timestamp()
    except (TypeError, ValueError):
        return math.inf


def earlier_bests(case, exclude_runs=(), limit=6):
    """Up to ``limit`` distinct configurations of the ``best`` records of this device in every
    database (env, per-user, shipped), adapted to this case (storage, canonical form of the mode,
    pruned at the kernels' f): this mode's tunings first, then explicit ones, then the others;
    nearest f, then nearest data set, then newest."""
    dev = case.key

    def same(d):
        return tuning.schema.same_device(d, dev)

    runs = {}
    for _origin, path in tuning.database_paths():
        for r in tuning.read_database(path) or []:
            if (r.get("kind") != "best" or r.get("run_id") in exclude_runs
                    or not same(r.get("device") or {})):
                continue
            runs.setdefault(r["run_id"], []).append(r)
    ds = {k: case.dataset_class[k] for k in ("m", "n", "nnz")}

    def key(recs):
        r = recs[0]
        mode = tuning.record_mode(r) or "?"
        try:
            dist = tuning.class_distance({k: int(r["dataset"][k]) for k in ("m", "n", "nnz")}, ds)
            df = abs(math.log(int(r["f"]) / case.f))
        except (KeyError, TypeError, ValueError):
            dist = df = math.inf
        return (mode != case.mode, mode != "explicit", df, dist, _age(r.get("date")))

    out, seen = [], set()
    for recs in sorted(runs.values(), key=key):
        for r in sorted(recs, key=lambda r: r.get("side", "")):
            try:
                c = KernelConfig.from_dict(r["config"]).replace(storage=case.storage)
                c = canonical(c, case.mode)
                try:
                    prune(c, case.kf, case.info)
                except InvalidConfigError:
                    if not c.solve_wg:
                        raise
                    c = prune(c.replace(solve_wg=0), case.kf, case.info)
            except (KeyError, TypeError, ValueError, InvalidConfigError):
                continue
            if c.key() not in seen:
                seen.add(c.key())
                out.append(c)
                if len(out) >= limit:
                    return out
    return out


def reference_samples(session, estimates):
    """Per side, the rows the guard times: the whole side when the session times whole sides, the
    side's half-step is estimated at ≤ ``check_time`` (``estimates[side]``) or the sample check is
    off; else the sample check's larger reference sample (≥ 4× the search's sample)."""
    c, out = session.case, {}
    cal = (session.calibration or {}).get("sides") or {}
    for side in SIDES:
        s = session.samples[side]
        est = estimates.get(side, 0.0)
        if s.rows >= s.full_rows or est <= session.check_time or not session.sample_tol:
            out[side] = full_sample(c.R, side)
            continue
        frac = ((cal.get(side) or {}).get("reference") or {}).get("fraction")
        frac = max(frac or 0.0, min(1.0, 4 * s.fraction))
        out[side] = make_sample(c.R, side, frac, session.seed,
                                (session.calibration or {}).get("min_rows") or 8)
    return out


def verify_best(session, best):
    """The best configuration of each side re-timed alone on :func:`reference_samples`' rows
    (kept for runs with no incumbent to compare with): {side: {estimate_seconds,
    measured_seconds, ratio, whole_side, rows}} (nothing when the whole side was timed anyway or
    the check is off)."""
    if session.sample == "full" or not session.sample_tol:
        return {}
    out = {}
    refs = reference_samples(session, {s: best["results"][s].side_seconds(s) for s in SIDES})
    for side in SIDES:
        s, ref = session.samples[side], refs[side]
        if s.rows >= s.full_rows:
            continue
        r = best["results"][side]
        est = r.side_seconds(side)
        t0 = time.perf_counter()
        try:
            t = session.measurer.time_side(r.config, side, session.repeats, session.min_time,
                                           sample=ref)
        except Exception as e:      # a verification must not lose the run
            log.warning("verifying the best %s configuration failed: %s", side, e)
            continue
        out[side] = _check(r.config, est, t["seconds"], ref, session.sample_tol,
                           time.perf_counter() - t0)
    return out


def _check(cfg, est, measured, ref, tol, seconds):
    return {"config": str(cfg), "estimate_seconds": est, "measured_seconds": measured,
            "ratio": est / measured if measured > 0 else None,
            "whole_side": bool(ref.rows >= ref.full_rows), "rows": int(ref.rows),
            "tolerance": tol, "seconds": seconds}


def final_showdown(session, best, incumbent, rounds=3, repeats=3):
    """The search's best pair against the incumbent pair, re-timed side by side.

    ``best``: :meth:`Session.best_pair`'s dict; ``incumbent``: the same form for the incumbent's
    measured pair. Both are timed round-robin (``rounds`` rounds, the order alternating) on
    :func:`reference_samples`' rows (each time at least ``repeats`` runs and the session's
    minimum time); per side the median of the rounds. Returns
    ``{"chosen": "tuned"|"incumbent", "beats_incumbent", "tuned": {...}, "incumbent": {...},
    "rows": {side: rows timed}, "whole_side": {side: bool}, "rounds", "seconds"}``, where each
    pair's entry holds its configurations, per-side medians and rounds and
    ``iteration_seconds``. The tuned pair wins only when strictly faster.
    """
    t0 = time.perf_counter()
    pairs = {"tuned": best["configs"], "incumbent": incumbent["configs"]}
    done = _replayed(session, pairs)
    if done is not None:               # a resumed (or repeated) run: the journal has the verdict
        return done
    same = all(pairs["tuned"][s].key() == pairs["incumbent"][s].key() for s in SIDES)
    est = {s: max(best["results"][s].side_seconds(s), incumbent["results"][s].side_seconds(s))
           for s in SIDES}
    refs = reference_samples(session, est)
    names = ["incumbent"] if same else ["incumbent", "tuned"]
    times = {n: {s: [] for s in SIDES} for n in names}
    for k in range(rounds):
        for n in (names if k % 2 == 0 else names[::-1]):
            for side in SIDES:
                t = session.measurer.time_side(pairs[n][side], side, repeats,
                                               session.min_time, sample=refs[side])
                times[n][side].append(t["seconds"])
    if same:
        times["tuned"] = times["incumbent"]
    out = {"rounds": rounds, "rows": {s: int(refs[s].rows) for s in SIDES},
           "whole_side": {s: bool(refs[s].rows >= refs[s].full_rows) for s in SIDES}}
    for n in ("tuned", "incumbent"):
        med = {s: float(np.median(times[n][s])) for s in SIDES}
        out[n] = {"configs": {s: str(pairs[n][s]) for s in SIDES}, "sides": med,
                  "rounds_seconds": times[n], "iteration_seconds": sum(med.values())}
    win = out["tuned"]["iteration_seconds"] < out["incumbent"]["iteration_seconds"] and not same
    out.update(chosen="tuned" if win else "incumbent", beats_incumbent=bool(win),
               same_configuration=same, seconds=time.perf_counter() - t0)
    inc_t, tun_t = out["incumbent"]["iteration_seconds"], out["tuned"]["iteration_seconds"]
    log.info("side by side: tuned %.4g s/it, incumbent %.4g s/it → %s", tun_t, inc_t,
             out["chosen"])
    session._jwrite({"event": "guard", "final": out})
    return out


def _replayed(session, pairs):
    """The journal's side-by-side verdict on these two pairs (the last one), or None."""
    path, found = getattr(session, "journal", None), None
    fh = None if path is None else open_lines(path)
    if fh is None:
        return None
    with fh:
        for line in fh:
            try:
                e = json.loads(line)
            except ValueError:
                continue                    # a torn last line
            if e.get("event") == "guard":
                found = e.get("final")
    if found and all(found.get(n, {}).get("configs") == {s: str(pairs[n][s]) for s in SIDES}
                     for n in pairs):
        return found
    return None


def verified_from(session, final, pair):
    """The chosen pair's search estimates against its side-by-side times (the report's check of
    the sample): {side: {estimate_seconds, measured_seconds, ratio, whole_side, rows}} for the
    sides the search timed on a sample."""
    name, tol = final["chosen"], session.sample_tol
    out = {}
    for side in SIDES:
        if session.samples[side].rows >= session.samples[side].full_rows:
            continue
        est = pair["results"][side].side_seconds(side)
        meas = final[name]["sides"][side]
        out[side] = {"config": str(pair["configs"][side]), "estimate_seconds": est,
                     "measured_seconds": meas, "ratio": est / meas if meas > 0 else None,
                     "whole_side": final["whole_side"][side], "rows": final["rows"][side],
                     "tolerance": tol, "side_by_side": True}
    return out


def incumbent_summary(choices, pair, final):
    """What the user had, for the summary and the records: the lookup's rule and reason, its
    configurations, the search's estimate and the side-by-side time (None where not measured)."""
    if not choices:
        return None
    return {"rule": choices["users"].rule, "reason": choices["users"].reason,
            "configs": {s: str(choices[s].config) for s in SIDES},
            "status": "ok" if pair is not None else "failed",
            "iteration_seconds": pair["iteration_seconds"] if pair else None,
            "measured_iteration_seconds": final["incumbent"]["iteration_seconds"]
            if final else None}
