"""Search strategies over a :class:`clmf.autotune.space.Space`, and the tuning session that runs them.

A :class:`Session` is one tuning case (device, data set, f, storage) under one strategy. It
measures candidates through :class:`clmf.autotune.measure.Measurer`, appends every outcome to the
database, and keeps a *journal* (``<state_dir>/<run_id>.jsonl``, one line per event) so that a
crashed run resumes where it stopped: the run id hashes everything that defines the run (device
and driver, data-set class, f, storage, space, strategy, budget, seed, kernel templates), a
resumed run reuses the journal's sample and results (replaying the strategy's decisions
deterministically: the budget is the sum of the candidates' measurement times, so the replay
spends it exactly as the first attempt did); an interrupted measurement is measured again
(:mod:`.journal`).

Strategies (both measure first, at full fidelity, the *incumbent* — what ``variant="auto"``
chose before this run —, the baseline ``batch``, the untuned default, this device's earlier best
configurations, see :mod:`clmf.autotune.incumbent`, and on CPUs the :data:`CPU_ANCHORS`):

``exhaustive``  every configuration of an enumerable space at full fidelity;
``budgeted``    within ``budget`` seconds, at low fidelity (3 runs): local search around those
                anchors (20% of the budget), random exploration stratified by variant family
                (to 50%), stage-composed candidates (the best S1/S2 configuration with the best
                S3 settings), then local search around the current top of each side until the
                final re-timing's share is left; every candidate entering a side's top 3 is
                promoted to full fidelity (≥ 7 runs and a minimum time) at once.

Modes: a :class:`Case` tunes explicit ALS (default), implicit feedback (``mode="implicit"``,
``alpha``: the half-step includes the Gram YᵀY) or explicit ALS with biases (``mode="biased"``:
f + 1 unknowns per system); every candidate is validated against that mode's reference and timed
in that mode, and the records carry ``mode`` (and ``alpha``).

Sampling (``sample=``): ``"auto"`` calibrates the sample to ``sample_time`` and checks it against
the whole side (:func:`clmf.autotune.measure.check_samples`, growing it while the probe's estimate is off
by more than ``sample_tol``); a number forces that fraction (still checked); ``"full"`` times
whole half-steps. The check is recorded in the run record, the journal header and the summary.

Both end with a *showdown* (the top 2 of each side re-measured round-robin, so the final choice
compares them under the same machine conditions) and the *guard*: the winner and the incumbent
re-timed side by side on the whole data (:func:`clmf.autotune.incumbent.final_showdown`); the records
written hold the faster of the two (``chosen``), so a run never makes a default fit slower.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import time

import numpy as np

from clmf import tuning
from clmf.cache import open_append
from clmf.engine.config import KernelConfig
from clmf.errors import InvalidConfigError
from clmf.tuning.database import Database, base_record

from . import journal
from .case import Case, default_state_dir
from .measure import (CHECK_TIME, MEASURE_VERSION, SAMPLE_TOL, SIDES, SLOW_MIN, SLOW_MIN_GPU,
                      Measurer, Result, _result_from_json, _result_to_json, calibrate_samples,
                      check_samples, full_sample, make_sample, pruned, sample_min_rows,
                      sample_spec, slow_caps)
from .space import canonical, device_anchors, prune

log = logging.getLogger(__name__)

__all__ = ["Case", "Session", "exhaustive", "budgeted", "STRATEGIES", "run"]

STRATEGIES = ("exhaustive", "budgeted")
SKIP_STATUSES = ("invalid", "wrong", "failed")


class Session:
    """One tuning run (see the module docstring).

    Parameters
    ----------
    case : :class:`Case`
    space : :class:`clmf.autotune.space.Space`
    strategy : "exhaustive" | "budgeted"
    db : path of the JSON Lines database to append to
    budget : seconds (budgeted strategy)
    state_dir : where the journal lives (default: the per-user cache directory)
    sample_time : target device seconds of one sampled half-step (see
        :func:`clmf.autotune.measure.calibrate_samples`)
    sample : "auto" (calibrated and checked), "full" (whole half-steps) or a fraction in (0, 1]
    sample_tol : the calibration check's tolerance (relative); 0 or None: no check
    check_time : the check times the whole side when it takes ≤ this many seconds
    progress : show a tqdm bar with the best so far
    earlier : how many of this device's earlier best configurations are measured first
    """

    def __init__(self, case, space, strategy, db, budget=None, seed=0, state_dir=None,
                 sample_time=0.03, progress=True, repeats=7, min_time=0.05, resume=True,
                 sample="auto", sample_tol=SAMPLE_TOL, check_time=CHECK_TIME, starts=(),
                 earlier=4, max_wall=None):
        from clmf.engine.kernels import template_hash
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose from {STRATEGIES}")
        self.case, self.space, self.strategy = case, space, strategy
        # configurations measured at full fidelity right after the anchors (e.g. known-good shapes
        # of a variant family the random exploration might sample rarely); they compete as any other
        self.starts = [KernelConfig.parse(c) if isinstance(c, str) else c for c in (starts or ())]
        self.db = Database(db)
        self.budget = float(budget) if budget is not None else None
        # wall-clock seconds for the search, builds and checks included (not part of the run's
        # identity: a resumed run replays its journal whatever the limit)
        self.max_wall = float(max_wall) if max_wall else None
        self._t_start = None
        self.wall_limited = False
        self.seed = int(seed)
        self.sample_time = float(sample_time)
        self.progress = progress
        self.repeats, self.min_time = repeats, min_time
        self.template_hash = template_hash()
        self.sample = sample_spec(sample)
        self.sample_tol = float(sample_tol) if sample_tol else 0.0
        self.check_time = float(check_time)
        ident = {"device": case.key, "dataset": case.dataset_class, "f": case.f,
                 "storage": case.storage, "space": space.name, "strategy": strategy,
                 "budget": self.budget, "seed": self.seed, "templates": self.template_hash,
                 "sample_time": self.sample_time, "repeats": repeats, "min_time": min_time,
                 "method": MEASURE_VERSION, "tuner": journal.tuner_hash(),
                 "sample": self.sample, "sample_tol": self.sample_tol,
                 "check_time": self.check_time}
        if case.mode != "explicit":
            ident.update(case.mode_fields())
        self.run_id = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        self.state_dir = pathlib.Path(state_dir) if state_dir else default_state_dir()
        self.journal = self.state_dir / f"{self.run_id}.jsonl"
        if not resume:
            self.journal.unlink(missing_ok=True)      # (a link is removed, never followed)
        self.results = {}            # (config key, fidelity) -> Result
        self.order = []              # evaluation order of keys
        self.spent = 0.0             # budget consumed (sum of measurement times), replayed
        self._replay = {}
        self.anchors = {}
        self.incumbent = None        # {side: Choice} of the lookup chain without this run
        self.earlier_limit = earlier
        self.measurer = None
        self.samples_desc = None
        self.calibration = None
        self._bar = None
        self.resumed = False
        self.pruned, self.rejected = {}, []   # pruned before any build: anchors (by reason),
                                              # the space's enumeration (config, reason, message)

    # ----- journal ---------------------------------------------------------------------------
    def _jwrite(self, entry):
        """Append one event to the journal (synced); a journal refused by :mod:`clmf.cache`
        (a link, a pipe, a device) is skipped with a warning (the run goes on, without
        resume)."""
        fh = open_append(self.journal)
        if fh is None:
            return
        with fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _jread(self):
        return journal.read(self.journal, _result_from_json)

    def _skip_from_db(self):
        """Configurations this device/driver/f/storage/templates already rejected."""
        skip = {}
        for r in self.db.records():
            if (r.get("kind") == "measurement" and r.get("status") in SKIP_STATUSES
                    and r.get("device") == self.case.key and r.get("f") == self.case.f
                    and r.get("storage") == self.case.storage
                    and tuning.record_mode(r) == self.case.mode
                    and r.get("template_hash") == self.template_hash):
                try:
                    c = KernelConfig.from_dict(r["config"])
                except (ValueError, TypeError, KeyError):
                    continue
                skip[c.key()] = Result(c, r["status"], r.get("reason", ""),
                                       r.get("message", "") + " (recorded earlier; not retried)",
                                       r.get("verify_rel_err"), {}, "full", 0.0)
        return skip

    # ----- lifecycle -------------------------------------------------------------------------
    def probe(self):
        """The reference configuration of the sample calibration: the untuned default."""
        c = self.case
        return canonical(c.default_solver(tuning.heuristic(c.info, c.kf, storage=c.storage)),
                         c.mode)

    def _samples(self):
        """Calibrated (and checked) samples: ({side: Sample}, calibration record)."""
        c = self.case
        probe = self.probe()
        kw = dict(storage=c.storage, mode=c.mode, alpha=c.alpha)
        min_rows = sample_min_rows(c.info, probe, c.f)
        if self.sample == "full":
            return ({s: full_sample(c.R, s) for s in SIDES},
                    {"sample": "full", "note": "whole half-steps timed, no sampling"})
        if self.sample == "auto":
            samples = calibrate_samples(c.device, c.R, c.f, probe, self.sample_time,
                                        min_rows=min_rows, seed=self.seed, **kw)
        else:
            samples = {s: make_sample(c.R, s, self.sample, self.seed, min_rows) for s in SIDES}
        cal = {"sample": self.sample, "min_rows": min_rows}
        if self.sample_tol > 0:
            from .incumbent import form_probes
            samples, sides = check_samples(c.device, c.R, c.f, probe, samples, self.sample_tol,
                                           self.check_time, self.seed, min_rows, **kw,
                                           forms=form_probes(c, probe, (self.run_id,)))
            cal["sides"] = sides
        return samples, cal

    def out_of_time(self):
        """Whether the search has used its wall-clock limit (``max_wall``): no new candidates
        then; the finalists' promotion and the final showdown still run."""
        if self.max_wall is None or self._t_start is None:
            return False
        if time.monotonic() - self._t_start > self.max_wall:
            if not self.wall_limited:
                log.info("f=%d: the wall-clock limit (%.0f s) is reached: no new candidates",
                         self.case.f, self.max_wall)
            self.wall_limited = True
        return self.wall_limited

    def start(self):
        case = self.case
        self._t_start = time.monotonic()
        header, results, crashed = self._jread()
        self._skip = self._skip_from_db()
        self._replay = results
        t0 = time.perf_counter()
        if header is None:
            samples, cal = self._samples()
            fr = {s: samples[s].fraction for s in SIDES}
            spent = time.perf_counter() - t0
            header = {"event": "header", "run_id": self.run_id, "fractions": fr,
                      "min_rows": cal.get("min_rows"), "calibration": cal,
                      "calibration_seconds": spent, "date": base_record("x")["date"]}
            self._jwrite(header)
            self.samples = samples
            self.calibration = cal
            self.db.append(base_record(
                "run", run_id=self.run_id, device=case.key, device_info=dataclasses.asdict(case.info),
                f=case.f, storage=case.storage, dataset=case.side_class("users"),
                strategy=self.strategy, space=self.space.name, budget=self.budget, seed=self.seed,
                template_hash=self.template_hash, load_average=os.getloadavg(),
                sample={s: samples[s].describe() for s in SIDES}, calibration=cal,
                calibration_seconds=spent, **case.mode_fields()))
        else:
            self.resumed = True
            min_rows = header.get("min_rows") or sample_min_rows(case.info, self.probe(), case.f)
            self.samples = {s: make_sample(case.R, s, header["fractions"][s], self.seed, min_rows)
                            for s in SIDES}
            self.calibration = header.get("calibration")
            log.info("resuming run %s: %d results in the journal, %d crashed", self.run_id,
                     len(results), len(crashed))
        self.spent = float(header.get("calibration_seconds", 0.0))
        self.samples_desc = {s: self.samples[s].describe() for s in SIDES}
        self.measurer = Measurer(case.device, case.R, case.f, self.samples, case.storage,
                                 repeats=self.repeats, min_time=self.min_time, mode=case.mode,
                                 alpha=case.alpha)
        for (key, fid), times in crashed:
            cfg = KernelConfig.from_dict(json.loads(key))
            if times >= 2:
                res = Result(cfg, "failed", "crashed", f"the tuning process died {times} times "
                             "while measuring this configuration", None, {}, fid, 0.0)
                self._record(res, key, fid, journal=True)
            else:       # once: a kill or a power cut, not the configuration — measured again
                self._jwrite({"event": "died", "key": key, "fidelity": fid})
                journal.record_interrupted(self, cfg, fid, "killed", "the tuning process died "
                                           "while measuring this configuration; measured again")
        total = None
        if self.progress:
            from tqdm.auto import tqdm
            total = self.budget if self.strategy == "budgeted" else None
            self._bar = tqdm(total=total, desc=f"tune f={case.f} {case.dataset}",
                             unit="s" if total else "cfg", leave=True,
                             bar_format=None)
        return self

    def close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # ----- records ---------------------------------------------------------------------------
    def _common(self):
        c = self.case
        return dict(run_id=self.run_id, device=c.key, f=c.f, storage=c.storage,
                    template_hash=self.template_hash, strategy=self.strategy,
                    space=self.space.name, **c.mode_fields())

    def _record(self, res, key, fidelity, journal=True):
        self.results[(key, fidelity)] = res
        self.order.append((key, fidelity))
        if not journal:          # replayed from the journal: the database has it already
            return
        self._jwrite({"event": "result", "key": key, "fidelity": fidelity,
                      "result": _result_to_json(res)})
        recs = []
        cfgd = res.config.to_dict()
        if res.ok:
            for side in SIDES:
                d = res.sides[side]
                recs.append(base_record(
                    "measurement", status="ok", side=side, config=cfgd, variant=str(res.config),
                    dataset=self.case.side_class(side), seconds=d["seconds"],
                    sample_seconds=d["sample_seconds"], stages=d["stages"],
                    stages_estimated=d["stages_estimated"], raw=d["raw"], runs=d["runs"],
                    fidelity=fidelity, verify_rel_err=res.verify_rel_err,
                    sample=self.samples_desc[side], **self._common()))
        else:
            recs.append(base_record(
                "measurement", status=res.status, reason=res.reason, message=res.message[:500],
                side="both", config=cfgd, variant=str(res.config),
                dataset=self.case.side_class("users"), verify_rel_err=res.verify_rel_err,
                fidelity=fidelity, **self._common()))
        self.db.append(recs)

    def evaluate(self, cfg, fidelity="full"):
        """The Result of ``cfg`` at ``fidelity`` ("low" or "full"), measured at most once."""
        key = cfg.key()
        for fid in (fidelity, "full") if fidelity == "low" else ("full",):
            if (key, fid) in self.results:
                return self.results[(key, fid)]
        if key in self._skip:
            res = self._skip[key]
            self.results[(key, fidelity)] = res
            return res
        low = self.results.get((key, "low"))
        if low is not None and not low.ok:
            return low
        pruned = self._pruned(cfg, fidelity)
        if pruned is not None:
            return pruned
        if (key, fidelity) in self._replay:          # resumed: replay the journal
            res = self._replay.pop((key, fidelity))
            self._record(res, key, fidelity, journal=False)
            self.results[(key, fidelity)] = res
        else:
            self._jwrite({"event": "start", "key": key, "fidelity": fidelity})
            verified = low.verify_rel_err if low is not None and low.ok else None
            try:
                res = self.measurer.evaluate(cfg, fidelity, verified=verified)
            except KeyboardInterrupt:
                self._jwrite({"event": "interrupted", "key": key, "fidelity": fidelity})
                journal.record_interrupted(self, cfg, fidelity, "interrupted", "Ctrl-C while "
                                           "measuring this configuration; measured again on "
                                           "resume")
                raise
            self._record(res, key, fidelity)
        self.spent += res.seconds_spent
        self._tick(res)
        return res

    def _pruned(self, cfg, fidelity):
        """The recorded ``invalid`` Result of ``cfg`` when it cannot be built at this case
        (:func:`clmf.autotune.measure.pruned`: never built or timed then), else None."""
        res = pruned(cfg, self.case.mode, self.case.kf, self.case.info, fidelity)
        if res is not None:
            log.info("%s: %s", cfg, res.message)
            self.pruned[res.reason] = self.pruned.get(res.reason, 0) + 1
            self._record(res, cfg.key(), fidelity)
        return res

    def _tick(self, res):
        if self._bar is None:
            return
        if self.strategy == "budgeted":
            self._bar.n = min(self.budget or 0, round(self.spent, 1))
            self._bar.refresh()
        else:
            self._bar.update(1)
        b = self.best_pair(any_fidelity=True)
        if b:
            self._bar.set_postfix_str(f"best {b['iteration_seconds']:.4g} s/it "
                                      f"({b['configs']['users']} | {b['configs']['items']})")

    # ----- results ---------------------------------------------------------------------------
    _PRI = {"low": 0, "full": 1, "final": 2}

    def ok_results(self, any_fidelity=False):
        """{config key: Result} of the ok results at the highest fidelity measured (showdown >
        full > low); low-fidelity ones only with ``any_fidelity`` (or when there is nothing
        else)."""
        out, pri = {}, {}
        for (key, fid), r in self.results.items():
            if not r.ok or (fid == "low" and not any_fidelity):
                continue
            p = self._PRI.get(fid, 0)
            if key not in out or p > pri[key]:
                out[key], pri[key] = r, p
        if not out and not any_fidelity:
            return self.ok_results(True)
        return out

    def retime_cost(self, configs):
        """Estimated seconds to re-time ``configs`` once at full fidelity (no build)."""
        t = 0.0
        for c in configs:
            r = self.results.get((c.key(), "full"))
            scale = 1.0
            if r is None:
                # only the low-fidelity timing (3 runs): a full one takes ≥ 7
                r, scale = self.results.get((c.key(), "low")), 7 / 3
            if r is not None and r.ok:
                t += sum(sum(r.sides[s].get("wall", [])) * 1.3 * scale + 0.02 for s in SIDES)
        return t

    def showdown(self, configs, rounds=2, budget_left=None):
        """Re-measure ``configs`` round-robin (so they share the machine's conditions) at full
        fidelity; each gets a "final" result whose per-side time is the median over its full
        measurement and the rounds (as many rounds as ``budget_left`` seconds allow)."""
        configs = [c for c in configs if (c.key(), "full") in self.results
                   and self.results[(c.key(), "full")].ok]
        if len(configs) < 2:
            return
        if all((c.key(), "final") in self._replay for c in configs):
            return self._replay_final(configs)
        if budget_left is not None:
            rounds = min(rounds, int(budget_left // max(self.retime_cost(configs), 1e-6)))
            if rounds < 1:
                return
        per = {c.key(): [self.results[(c.key(), "full")]] for c in configs}
        for _ in range(rounds):
            for c in configs:
                key = c.key()
                r = self.measurer.evaluate(c, "full", verified=per[key][0].verify_rel_err)
                self.spent += r.seconds_spent
                if not r.ok:
                    continue
                per[key].append(r)
        for c in configs:
            key = c.key()
            rs = per[key]
            sides = {}
            for side in SIDES:
                d = dict(rs[0].sides[side])
                vals = [x.sides[side]["seconds"] for x in rs]
                d["seconds"] = float(np.median(vals))
                d["rounds_seconds"] = vals
                sides[side] = d
            res = Result(c, "ok", "", "", rs[0].verify_rel_err, sides, "final",
                         sum(x.seconds_spent for x in rs[1:]))
            self._record(res, key, "final")
            self._tick(res)

    def _replay_final(self, configs):
        for c in configs:
            r = self._replay.pop((c.key(), "final"), None)
            if r is not None:
                self.spent += r.seconds_spent
                self._record(r, c.key(), "final", journal=False)

    def ranking(self, side, any_fidelity=True):
        rs = self.ok_results(any_fidelity).values()
        return sorted(rs, key=lambda r: r.side_seconds(side))

    def best_pair(self, any_fidelity=False):
        """The best (users, items) pair with one factor padding (same vector width rounding)."""
        res = list(self.ok_results(any_fidelity).values())
        if not res:
            return None
        # After a showdown, choose among its finalists only: they were re-timed side by side
        # under the same machine conditions, while everyone else keeps one older measurement.
        # (Re-timing the finalists, picked for their low first timing, can only push them up:
        # ranking them against the others' single timings would favour a runner-up by noise.)
        finals = [r for r in res if r.fidelity == "final"]
        if finals:
            res = finals
        w = self.case.width           # both sides share the factor buffers' padding
        best = None
        for ldf in sorted({r.config.ldf(w) for r in res}):
            grp = [r for r in res if r.config.ldf(w) == ldf]
            u = min(grp, key=lambda r: r.side_seconds("users"))
            i = min(grp, key=lambda r: r.side_seconds("items"))
            t = u.side_seconds("users") + i.side_seconds("items")
            if best is None or t < best["iteration_seconds"]:
                best = {"iteration_seconds": t, "results": {"users": u, "items": i},
                        "configs": {"users": u.config, "items": i.config}}
        return best

    def measure_anchors(self):
        """At full fidelity, in this order: what the user had (the incumbent pair the lookup chain
        chooses without this run's records), the baseline ``batch``, the untuned default (the
        heuristic), this device's earlier best configurations, the device type's known winners
        (:func:`device_anchors`) and the given starts."""
        from .incumbent import earlier_bests, lookup_incumbent
        c = self.case
        self.anchors = {}
        self.incumbent = lookup_incumbent(c, exclude_runs=(self.run_id,))
        for side, name in (("users", "incumbent"), ("items", "incumbent_items")):
            cfg = self.incumbent[side].config
            if side == "users" or cfg.key() != self.incumbent["users"].config.key():
                self.anchors[name] = self.evaluate(cfg, "full")
        self.measurer.slow_cap = slow_caps([r for r in self.anchors.values() if r.ok],
                                           SLOW_MIN if c.info.type == "CPU" else SLOW_MIN_GPU)
        base = canonical(c.default_solver(tuning.BASELINE.replace(storage=c.storage)), c.mode)
        self.anchors["baseline"] = self.evaluate(base, "full")
        self.anchors["default"] = self.evaluate(self.probe(), "full")
        if c.mode == "implicit":     # the hermitian path beside the fused CG (issue 27)
            cg = canonical(self.probe().replace(solver="cg"), c.mode)
            self.anchors["default_cg"] = self.evaluate(cg, "full")
        for i, cfg in enumerate(earlier_bests(c, (self.run_id,), self.earlier_limit)):
            self.anchors[f"earlier{i + 1}"] = self.evaluate(cfg, "full")
        for i, cfg in enumerate(device_anchors(c, self.space)):
            self.anchors[f"device{i + 1}"] = self.evaluate(cfg, "full")
        for i, cfg in enumerate(self.starts):     # (one that fails pruning: recorded invalid)
            cfg = canonical(cfg.replace(storage=c.storage), c.mode)
            self.anchors[f"start{i + 1}"] = self.evaluate(cfg, "full")
        return self.anchors

    def incumbent_pair(self):
        """The incumbent's measured pair in :meth:`best_pair`'s form, or None (not measured or
        not ok)."""
        u = self.anchors.get("incumbent")
        i = self.anchors.get("incumbent_items", u)
        if u is None or not (u.ok and i.ok):
            return None
        return {"iteration_seconds": u.side_seconds("users") + i.side_seconds("items"),
                "results": {"users": u, "items": i}, "configs": {"users": u.config,
                                                                 "items": i.config}}

    def finish(self):
        """Write the best records and return the run's summary (for :mod:`clmf.autotune.report`)."""
        c = self.case
        best = self.best_pair()
        summary = {"run_id": self.run_id, "device": c.key, "device_info": dataclasses.asdict(c.info),
                   "dataset": c.dataset, "dataset_class": c.dataset_class, "f": c.f, "kernel_f": c.kf,
                   "storage": c.storage, "strategy": self.strategy, "space": self.space.name,
                   "budget": self.budget, "spent_seconds": self.spent, "samples": self.samples_desc,
                   "max_wall": self.max_wall, "wall_limited": self.wall_limited,
                   "calibration": self.calibration, **c.mode_fields(),
                   "evaluated": len({k for k, _ in self.results}),
                   "pruned": {r: sum(1 for x in self.rejected if x[1] == r) + self.pruned.get(r, 0)
                              for r in {x[1] for x in self.rejected} | set(self.pruned)},
                   "load_average": os.getloadavg(),
                   "statuses": {}, "best": None, "anchors": {}, "results": []}
        for (key, fid), r in self.results.items():
            summary["statuses"][r.status] = summary["statuses"].get(r.status, 0) + 1
        for name, r in self.anchors.items():
            summary["anchors"][name] = {"config": str(r.config), "status": r.status,
                                        "iteration_seconds": r.iteration_seconds if r.ok else None,
                                        "sides": {s: r.side_seconds(s) for s in SIDES} if r.ok else {}}
        top = {}
        for (k, fid), r in self.results.items():
            if k not in top or self._PRI.get(fid, 0) > self._PRI.get(top[k].fidelity, 0):
                top[k] = r
        summary["results"] = [_result_to_json(r) | {"key": k} for k, r in top.items()]
        if best is None:
            return summary
        from .incumbent import (challengers, final_showdown, incumbent_summary, tuned_pair,
                                verified_from, verify_best)
        base, heur = self.anchors.get("baseline"), self.anchors.get("default")
        bt = base.iteration_seconds if base is not None and base.ok else None
        ht = heur.iteration_seconds if heur is not None and heur.ok else None
        inc, final = self.incumbent_pair(), None
        searched = best
        if inc is not None:      # never write a regression: the winner against what the user had
            final = final_showdown(self, best, inc, others=challengers(self, best, inc))
            best = tuned_pair(self, final, best) if final["beats_incumbent"] else inc
            verified = verified_from(self, final, best)
        else:
            verified = verify_best(self, best)
        summary["incumbent"] = incumbent_summary(self.incumbent, inc, final)
        summary["final"] = final
        it = best["iteration_seconds"]
        guard = {"chosen": final["chosen"] if final else "tuned",
                 "beats_incumbent": final["beats_incumbent"] if final else None,
                 "measured_iteration_seconds": final[final["chosen"]]["iteration_seconds"]
                 if final else None,
                 "speedup_vs_incumbent": final["incumbent"]["iteration_seconds"]
                 / final[final["chosen"]]["iteration_seconds"] if final else None,
                 "searched": {"configs": {s: str(searched["configs"][s]) for s in SIDES},
                              "iteration_seconds": searched["iteration_seconds"]}}
        summary["best"] = {"iteration_seconds": it,
                           "configs": {s: str(best["configs"][s]) for s in SIDES},
                           "sides": {s: best["results"][s].sides[s] for s in SIDES},
                           "speedup_vs_baseline": bt / it if bt else None,
                           "speedup_vs_default": ht / it if ht else None,
                           "verified": verified, **guard}
        recs = []
        for side in SIDES:
            r, cfg = best["results"][side], best["configs"][side]
            recs.append(base_record(
                "best", side=side, config=cfg.to_dict(), variant=str(cfg),
                dataset=c.side_class(side), seconds=r.side_seconds(side),
                iteration_seconds=it, baseline_iteration_seconds=bt, default_iteration_seconds=ht,
                iteration_rel_baseline=(it / bt) if bt else None,
                speedup_vs_baseline=(bt / it) if bt else None,
                speedup_vs_default=(ht / it) if ht else None, incumbent=summary["incumbent"],
                evaluated=summary["evaluated"], spent_seconds=self.spent, budget=self.budget,
                load_average=os.getloadavg(), verified=verified.get(side),
                sample=self.samples_desc[side], **guard, **self._common()))
        self.db.append(recs)
        return summary


# ----- strategies ------------------------------------------------------------------------------
def exhaustive(session: Session):
    """Every configuration of the (enumerable) space at full fidelity."""
    cands = session.space.enumerate(session.case.info, session.rejected)
    if session._bar is not None:
        session._bar.total = len(cands) + 2
        session._bar.refresh()
    session.measure_anchors()
    for cfg in cands:
        if session.out_of_time():
            break
        session.evaluate(cfg, "full")
    session.showdown(_top(session, 2, fidelity=False))
    return session


def _top(session, k, fidelity=True):
    """Union of the top-k configurations of each side (any fidelity, or full only)."""
    out, seen = [], set()
    for side in SIDES:
        for r in session.ranking(side, any_fidelity=fidelity)[:k]:
            if r.config.key() not in seen:
                seen.add(r.config.key())
                out.append(r.config)
    return out


def _composed(session):
    """The best S1/S2 configuration with the best S3 settings of each side (stage times add)."""
    out = []
    res = list(session.ok_results(True).values())
    if not res:
        return out
    def s12_time(r, side):      # S1 (and the implicit Gram, an S1 launch), S2
        st = r.sides[side]["stages_estimated"]
        return st["s1"] + st["s2"] + st.get("gram", 0.0)

    for side in SIDES:
        # in explicit/biased mode the fused CG has no S1: its S1/S2 time says nothing of flags
        s12 = min(res, key=lambda r: s12_time(r, side))
        s3 = min(res, key=lambda r: r.sides[side]["stages_estimated"]["s3"])
        c = s12.config.replace(solve_wg=s3.config.solve_wg, solve_vec=s3.config.solve_vec,
                               solver=s3.config.solver, cg_steps=s3.config.cg_steps)
        try:
            c = prune(canonical(c, session.case.mode), session.case.kf, session.case.info)
        except InvalidConfigError:
            continue
        if all(c.key() != o.key() for o in out):
            out.append(c)
    return out


def budgeted(session: Session, exploit=0.2, explore=0.3, finalists=3):
    """Anchors → local search around them → random exploration → stage composition and local
    search with promotion, within ``session.budget`` seconds (see the module docstring)."""
    budget = session.budget or 60.0
    space, info = session.space, session.case.info
    rng = np.random.default_rng(session.seed)
    session.measure_anchors()
    pool = space.enumerate(info, session.rejected) if space.enumerable else None
    order = None
    if pool is not None:
        # stratified by variant family (the flags): round-robin over the families in random
        # order, each family's members in random order, so small families are seen early
        fam = {}
        for i in rng.permutation(len(pool)):
            fam.setdefault(pool[i].name, []).append(pool[i])
        groups = [fam[k] for k in sorted(fam)]
        groups = [groups[i] for i in rng.permutation(len(groups))]
        order = []
        while any(groups):
            for g in groups:
                if g:
                    order.append(g.pop())
        order.reverse()                         # next_random() pops from the end
    tried = {r.config.key() for r in session.ok_results(True).values()}

    def next_random():
        if pool is not None:
            while order:
                c = order.pop()
                if c.key() not in tried:
                    return c
            return None
        for _ in range(100):
            c = space.sample(rng, info)
            if c is not None and c.key() not in tried:
                return c
        return None

    def promote():
        """Successive halving's last rung: the current top of each side at full fidelity."""
        for c in _top(session, finalists):
            if (c.key(), "full") not in session.results:
                session.evaluate(c, "full")

    def run(cfg):
        tried.add(cfg.key())
        r = session.evaluate(cfg, "low")
        if r.ok and any(r.config.key() == c.key() for c in _top(session, finalists)):
            promote()
        return r

    def neighbour():
        """An untried neighbour of one of the current top configurations, or None."""
        parents = _top(session, finalists)
        if not parents:
            return None
        parent = parents[int(rng.integers(len(parents)))]
        if pool is not None:
            nb = [c for c in space.neighbours(parent, pool) if c.key() not in tried]
            if nb:
                return nb[0] if rng.random() < 0.6 else nb[int(rng.integers(len(nb)))]
            return None
        for _ in range(5):
            child = space.mutate(parent, rng, info)
            if child is not None and child.key() not in tried:
                return child
        return None

    # 1. the promising region first: around the anchors (what the user had, the device's
    # earlier tunings), then 2. random exploration, both at low fidelity
    for share, pick in ((exploit, neighbour), (exploit + explore, next_random)):
        while session.spent < share * budget and not session.out_of_time():
            c = pick()
            if c is None:
                break
            run(c)
    # 3. stage composition, then local search around the current best of each side
    for c in _composed(session):
        if c.key() not in tried and not session.out_of_time():
            run(c)

    def reserve():      # the final promotion of the finalists and one showdown round
        return 1.2 * (session.retime_cost(_top(session, finalists))
                      + session.retime_cost(_top(session, 2)))

    composed_again = False
    while session.spent < budget - reserve() and not session.out_of_time():
        if not composed_again and session.spent >= 0.75 * budget:
            composed_again = True
            for c in _composed(session):
                if c.key() not in tried:
                    run(c)
            continue
        child = neighbour() or next_random()
        if child is None:
            break
        run(child)
    promote()
    session.showdown(_top(session, 2, fidelity=False), budget_left=budget - session.spent)
    return session


def run(case, space, strategy="budgeted", db=None, budget=None, **kw):
    """Run one tuning session to the end; returns its summary (see :meth:`Session.finish`)."""
    s = Session(case, space, strategy, db or tuning.user_db_path(), budget=budget, **kw)
    try:
        s.start()
        (exhaustive if strategy == "exhaustive" else budgeted)(s)
        return s.finish()
    finally:
        s.close()
