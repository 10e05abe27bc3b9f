"""A tuning session's journal (``<state_dir>/<run_id>.jsonl``) and its interrupted measurements.

Events, one JSON line each: ``header`` (the run's sample), ``start`` (a measurement begins),
``result`` (it ended, with its :class:`~clmf.autotune.measure.Result`), ``interrupted``
(Ctrl-C ended it: recorded when it happened) and ``died`` (a resumed run found a ``start``
without an end: the process was killed in it). An interrupted measurement is not a result: it is
measured again on resume. Only a configuration in which the process died twice is given up as
``failed/crashed`` (one that kills its driver).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json

from clmf.cache import open_lines
from clmf.tuning.database import base_record

__all__ = ["read", "record_interrupted", "tuner_hash"]


@functools.lru_cache(maxsize=1)
def tuner_hash():
    """Hash of the tuner's own sources (this package's modules): part of a run's identity, so a
    run of a changed tuner is a new run — neither a resume of an older journal nor records
    merged with an older run's under one id (H100, stops 48-49: four runs of biased f = 200 at
    four commits shared one id, and the records of their different samples mixed)."""
    h = hashlib.sha256()
    root = importlib.resources.files(__package__)
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".py"):
            h.update(entry.name.encode())
            h.update(entry.read_bytes())
    return h.hexdigest()[:16]


def read(path, result_from_json):
    """(header, {(key, fidelity): Result}, [((key, fidelity), deaths)]) of a journal; ``deaths``
    counts the times the process died in a measurement never finished (this time included)."""
    fh = open_lines(path)            # None: missing, or refused (a link, a pipe, a device)
    if fh is None:
        return None, {}, []
    header, results, open_, deaths = None, {}, set(), {}
    with fh:
        for line in fh:
            try:
                e = json.loads(line)
            except ValueError:
                continue        # a torn last line from a crash
            ev = e.get("event")
            if ev == "header":
                header = e
                continue
            k = (e.get("key"), e.get("fidelity"))
            if ev == "start":
                if k in open_:                    # started again after a death in it
                    deaths[k] = deaths.get(k, 0) + 1
                open_.add(k)
            elif ev == "result":
                results[k] = result_from_json(e["result"])
                open_.discard(k)
            elif ev in ("interrupted", "died"):
                open_.discard(k)
                if ev == "died":
                    deaths[k] = deaths.get(k, 0) + 1
    return header, results, [(k, deaths.get(k, 0) + 1) for k in sorted(open_) if k not in results]


def record_interrupted(session, cfg, fidelity, reason, message):
    """Append a measurement cut short to the session's database (status ``interrupted``, which
    later runs measure again, unlike ``failed``)."""
    session.db.append(base_record(
        "measurement", status="interrupted", reason=reason, message=message, side="both",
        config=cfg.to_dict(), variant=str(cfg), dataset=session.case.side_class("users"),
        fidelity=fidelity, **session._common()))
