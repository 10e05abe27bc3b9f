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
   larger reference sample) (:func:`final_showdown`), with the fastest configuration of each
   other kernel form beside them on a sampled side (:func:`challengers`: a sample of rows can
   misrank the forms), and takes the fastest combination: if that is not faster, the record
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
from clmf.tuning.database import base_record

from .measure import SIDES, full_sample, make_sample
from .space import canonical, prune

log = logging.getLogger(__name__)

__all__ = ["lookup_incumbent", "earlier_bests", "reference_samples", "final_showdown",
           "verify_best", "challengers", "kernel_form", "tuned_pair", "form_probes"]


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


# A challenger whose sampled estimate is more than this many times the side's winner's is not
# re-timed: the samples misestimated the forms by at most 3.6x on the H100 (48f)
CHALLENGE_RATIO = 4.0
CHALLENGERS = 2          # per side: the best of each other kernel form, at most this many


def kernel_form(cfg):
    """The kernel form of ``cfg`` whose time a sample of rows can misestimate in its own way: the
    fused CG's dimensions form ("dims": a work-group per row, so a sampled launch waits for the
    longest row the sample keeps), the fused CG over hermitians ("fusedcg") or the S1 hermitian
    kernels with a separate solve ("hermitian")."""
    if cfg.solver == "fusedcg":
        return "dims" if cfg.fused_dims else "fusedcg"
    return "hermitian"


def form_probes(case, probe, exclude_runs=()):
    """One configuration of each kernel form (:func:`kernel_form`) other than ``probe``'s for
    the sample check on a device that runs a work-group per row on many compute units (not a
    CPU): the first of each form among what the user had (:func:`lookup_incumbent`) and this
    device's earlier bests (:func:`earlier_bests`)."""
    if case.info.type == "CPU":
        return []
    seen, out = {kernel_form(probe)}, []
    try:
        inc = lookup_incumbent(case, exclude_runs)
        cands = [inc["users"].config, inc["items"].config]
    except Exception as e:           # (no answer: the earlier bests alone)
        log.debug("form probes: no incumbent (%s)", e)
        cands = []
    for cfg in [*cands, *earlier_bests(case, exclude_runs)]:
        cfg = canonical(cfg.replace(storage=case.storage), case.mode)
        form = kernel_form(cfg)
        if form not in seen:
            seen.add(form)
            out.append(cfg)
    return out


def challengers(session, best, incumbent=None):
    """``{side: [KernelConfig]}``: on each side the search timed on a sample of rows, the fastest
    configuration of each kernel form other than the winner's (:func:`kernel_form`; at most
    :data:`CHALLENGERS`, sampled estimates within :data:`CHALLENGE_RATIO` of the winner's, with
    the factor padding of the winner's or the incumbent's pair). A sample can rank the forms
    wrongly (H100, 48f: the dims form's items side 3.6x and gemm's 1.55x slower per rating on
    1,057 of 17,770 rows than on the whole side), so :func:`final_showdown` times them beside
    the winner where the ranking is decided."""
    w = session.case.width
    ldfs = {best["configs"]["users"].ldf(w)}
    if incumbent is not None:
        ldfs.add(incumbent["configs"]["users"].ldf(w))
    out = {}
    for side in SIDES:
        s = session.samples[side]
        if s.rows >= s.full_rows:
            continue
        top = best["results"][side]
        forms, picks = {kernel_form(top.config)}, []
        for r in session.ranking(side, any_fidelity=False):
            form = kernel_form(r.config)
            if (form in forms or r.config.ldf(w) not in ldfs
                    or r.side_seconds(side) > CHALLENGE_RATIO * top.side_seconds(side)):
                continue
            forms.add(form)
            picks.append(r.config)
            if len(picks) >= CHALLENGERS:
                break
        if picks:
            out[side] = picks
    return out


def _best_combination(session, medians, configs):
    """The (users, items) configurations of least summed median among ``medians`` ({side:
    {config key: seconds}}) whose factor paddings agree (both sides share the buffers)."""
    w = session.case.width
    best = None
    for ku, tu in medians["users"].items():
        for ki, ti in medians["items"].items():
            if configs["users"][ku].ldf(w) != configs["items"][ki].ldf(w):
                continue
            if best is None or tu + ti < best[0]:
                best = (tu + ti, ku, ki)
    return None if best is None else {"users": configs["users"][best[1]],
                                      "items": configs["items"][best[2]]}


def final_showdown(session, best, incumbent, rounds=3, repeats=3, others=None):
    """The search's best pair against the incumbent pair, re-timed side by side.

    ``best``: :meth:`Session.best_pair`'s dict; ``incumbent``: the same form for the incumbent's
    measured pair; ``others``: {side: [KernelConfig]} timed beside them (:func:`challengers`).
    Every distinct configuration of a side is timed round-robin (``rounds`` rounds, the order
    alternating) on :func:`reference_samples`' rows (each time at least ``repeats`` runs and
    the session's minimum time); per configuration the median of the rounds, written as a
    measurement of fidelity ``reference``. The tuned pair is then the fastest combination of the
    timed configurations (the search's pair unless a challenger beat it where it counts).
    Returns ``{"chosen": "tuned"|"incumbent", "beats_incumbent", "tuned": {...},
    "incumbent": {...}, "searched_configs", "candidates": {side: {config: seconds}}, "rows":
    {side: rows timed}, "whole_side": {side: bool}, "rounds", "seconds"}``, where each pair's
    entry holds its configurations, per-side medians and rounds and ``iteration_seconds``. The
    tuned pair wins only when strictly faster.
    """
    t0 = time.perf_counter()
    others = others or {}
    pairs = {"tuned": best["configs"], "incumbent": incumbent["configs"]}
    done = _replayed(session, pairs, others)
    if done is not None:               # a resumed (or repeated) run: the journal has the verdict
        return done
    configs = {s: {} for s in SIDES}
    for side in SIDES:
        for c in [pairs["incumbent"][side], pairs["tuned"][side], *others.get(side, ())]:
            configs[side].setdefault(c.key(), c)
    est = {s: max(best["results"][s].side_seconds(s), incumbent["results"][s].side_seconds(s))
           for s in SIDES}
    refs = reference_samples(session, est)
    times = {s: {k: [] for k in configs[s]} for s in SIDES}
    last = {s: {} for s in SIDES}
    pinned = {c.key() for pair in pairs.values() for c in pair.values()}
    for k in range(rounds):
        for side in SIDES:
            keys = list(configs[side])
            for key in (keys if k % 2 == 0 else keys[::-1]):
                try:
                    t = session.measurer.time_side(configs[side][key], side, repeats,
                                                   session.min_time, sample=refs[side])
                except Exception as e:
                    if key in pinned:
                        raise
                    # a challenger that cannot run on the reference rows (their memory plan,
                    # say) is left out; an error of the search's pair or the incumbent's stops
                    # the run, as it did before challengers
                    log.warning("challenger %s (%s) left out: %s", configs[side][key], side, e)
                    del configs[side][key], times[side][key]
                    continue
                times[side][key].append(t["seconds"])
                last[side][key] = t
    med = {s: {k: float(np.median(v)) for k, v in times[s].items()} for s in SIDES}
    _record_reference(session, configs, med, times, last, refs)
    combo = _best_combination(session, med, configs) or pairs["tuned"]
    out = {"rounds": rounds, "rows": {s: int(refs[s].rows) for s in SIDES},
           "whole_side": {s: bool(refs[s].rows >= refs[s].full_rows) for s in SIDES},
           "searched_configs": {s: str(pairs["tuned"][s]) for s in SIDES},
           "candidates": {s: {str(configs[s][k]): med[s][k] for k in configs[s]} for s in SIDES}}
    for n, pair in (("tuned", combo), ("incumbent", pairs["incumbent"])):
        sides = {s: med[s][pair[s].key()] for s in SIDES}
        out[n] = {"configs": {s: str(pair[s]) for s in SIDES}, "sides": sides,
                  "rounds_seconds": {s: times[s][pair[s].key()] for s in SIDES},
                  "iteration_seconds": sum(sides.values())}
    same = all(pairs["tuned"][s].key() == pairs["incumbent"][s].key() for s in SIDES)
    kept = all(combo[s].key() == pairs["incumbent"][s].key() for s in SIDES)
    win = out["tuned"]["iteration_seconds"] < out["incumbent"]["iteration_seconds"] and not kept
    out.update(chosen="tuned" if win else "incumbent", beats_incumbent=bool(win),
               same_configuration=same, seconds=time.perf_counter() - t0)
    inc_t, tun_t = out["incumbent"]["iteration_seconds"], out["tuned"]["iteration_seconds"]
    log.info("side by side: tuned %.4g s/it, incumbent %.4g s/it → %s", tun_t, inc_t,
             out["chosen"])
    session._jwrite({"event": "guard", "final": out})
    return out


def tuned_pair(session, final, best):
    """The showdown's tuned pair in :meth:`Session.best_pair`'s form: ``best`` itself unless a
    challenger took a side (its result then the search's own, at the highest fidelity)."""
    want = final["tuned"]["configs"]
    if want == {s: str(best["configs"][s]) for s in SIDES}:
        return best
    res = {str(r.config): r for r in session.ok_results().values()}
    results = {s: res[want[s]] for s in SIDES}
    return {"iteration_seconds": sum(results[s].side_seconds(s) for s in SIDES),
            "results": results, "configs": {s: results[s].config for s in SIDES}}


def _record_reference(session, configs, med, times, last, refs):
    """Each configuration the showdown timed, as a measurement of fidelity ``reference``: its
    median over the rounds on the reference rows (the whole side where affordable), so the
    records (and the model reading them) hold the time where the ranking was decided."""
    recs = []
    for side in SIDES:
        for key, cfg in configs[side].items():
            t = last[side][key]
            recs.append(base_record(
                "measurement", status="ok", side=side, config=cfg.to_dict(), variant=str(cfg),
                dataset=session.case.side_class(side), seconds=med[side][key],
                sample_seconds=t["sample_seconds"], stages=t["stages"],
                stages_estimated=t["stages_estimated"], raw=times[side][key],
                runs=len(times[side][key]), fidelity="reference", verify_rel_err=None,
                sample=refs[side].describe(), **session._common()))
    session.db.append(recs)


def _replayed(session, pairs, others=None):
    """The journal's side-by-side verdict on these two pairs and challengers (the last one), or
    None."""
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
    if not found:
        return None
    # the tuned entry may be a combination with a challenger: the search's pair is kept apart
    searched = found.get("searched_configs") or found.get("tuned", {}).get("configs")
    want = {str(c) for s in SIDES for c in (others or {}).get(s, ())}
    have = {c for s in SIDES for c in (found.get("candidates") or {}).get(s, {})}
    if (searched == {s: str(pairs["tuned"][s]) for s in SIDES} and want <= have
            and found.get("incumbent", {}).get("configs")
            == {s: str(pairs["incumbent"][s]) for s in SIDES}):
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
