"""Distil raw tuning databases into the compact ones the wheel ships.

The raw databases (``results/tuning/*.jsonl.gz``, gzip; plain ``*.jsonl`` are read too) keep
every run, measurement and sample for provenance and re-analysis; an installed clmf only needs
what the lookup chain (:mod:`clmf.tuning.lookup`) can choose from. For each raw file this writes
one plain file of the same name without ``.gz`` (``results/tuning/shipped/<slug>.jsonl``, package
data ``clmf.tuning.shipped``) holding:

* a ``distilled`` header record: the schema version, the source (``results/tuning/<slug>.jsonl``:
  its records, whether stored plain or gzip) and the git blob id of its JSON Lines bytes,
  decompressed (``gzip -dc <slug>.jsonl.gz | git hash-object --stdin``; the id the plain file had
  in git before the raw files were compressed, so ``git log --all --find-object=<blob>`` finds
  the commits that held it), the clmf commits of the runs kept, the rules below and the record
  counts (the lookup ignores this kind);
* the ``best`` records (both sides, unchanged) of the run the ``tuned``/``nearest``/``vendor``
  rungs rank first for each case — device (platform, vendor, type, name), f, storage, mode and
  data-set shape (m, n, nnz): the newest run, then the best time relative to its baseline — and
  of the older runs of the case whose (users, items) pair differs from every newer one's (the
  lookup falls back to them when the newer pairs do not validate, e.g. at another f); older runs
  repeating a newer pair are never chosen and are left out;
* for the ``default`` rung (the computed default over stored measurements of a device type), the
  ``measurement`` records it can use, stripped to the keys it reads: per group (device type, mode,
  f, run, side) the fastest record of each configuration, kept when it is the group's best or one
  of the ``top`` configurations (by mean relative time) measured in at least half the groups of its
  (type, mode, f) — computed over all raw files together, as the lookup merges them;
* for the ``model`` rung (the selection model, :mod:`clmf.tuning.model`), per run and side the
  fastest record of each of its ``TOP_K`` fastest configurations, with the data set's shape, and
  the measurements of status ``wrong`` (configurations whose reference check failed: the model
  refuses them in that mode on that device).

The result is deterministic (records in the order of the raw files, keys sorted, no clock; the
same whether a raw file is stored plain or compressed); with
the default ``top`` the lookup chooses the same configuration from the compact files as from the
raw ones (``tests/test_tuning_distill.py`` checks every case of the raw files and unseen shapes,
f and devices), unless none of a computed default's ``top`` ranked configurations validates on the
device asking.

``python -m clmf.autotune.distill results/tuning/*.jsonl.gz -o results/tuning/shipped``
(``--check`` exits 1 when the files there are not what the raw files give).
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import logging
import math
import pathlib
import sys

from clmf.engine.config import compact_config, config_text
from clmf.tuning.database import read_database, records_bytes
from clmf.tuning.lookup import newest_first, record_cases
from clmf.tuning.model import shape_fields, top_records, wrong_record
from clmf.tuning.schema import SCHEMA_VERSION, SIDES, norm_text, record_mode

log = logging.getLogger(__name__)

__all__ = ["distill", "distill_files", "write", "TOP"]

TOP = 32                     # ranked configurations kept per (device type, mode, f)
# the keys of a measurement record the lookup (and its record checks) read
_MEASUREMENT_KEYS = ("schema_version", "kind", "status", "side", "mode", "device", "f", "storage",
                     "run_id", "config", "seconds", "date", "commit")


def _blob_id(data):
    """The git blob id of ``data`` (what ``git hash-object`` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _device_key(d):
    return tuple(norm_text(d.get(k, "")).lower() for k in ("platform", "vendor", "type", "device"))


def _case_key(c):
    return (_device_key(c.device), c.f, c.storage, c.mode,
            tuple(c.dataset[k] for k in ("m", "n", "nnz")))


def _kept_runs(records):
    """The run ids of one file the lookup can choose: per case, the run it ranks first and each
    older run whose pair differs from every newer one's (chosen when the newer pairs do not
    validate on the device asking, e.g. at another f)."""
    by_case = {}
    for c in record_cases(records, "raw"):
        by_case.setdefault(_case_key(c), []).append(c)
    keep = set()
    for cases in by_case.values():
        seen = []
        for c in sorted(cases, key=newest_first):
            pair = (c.configs["users"], c.configs["items"])
            if pair not in seen:
                seen.append(pair)
                keep.add(c.run_id)
    return keep


def _measurement_group(r):
    """(device type, mode, f, run, side) of an ok measurement the default rung reads, else None."""
    if r.get("kind") != "measurement" or r.get("status") != "ok" or r.get("side") not in SIDES:
        return None
    mode = record_mode(r)
    try:
        t = float(r["seconds"])
        key = ((r.get("device") or {}).get("type"), mode, int(r["f"]), r["run_id"], r["side"])
    except (KeyError, TypeError, ValueError):
        return None
    return key if mode is not None and t > 0 else None


def _model_measurements(sources):
    """{(file index, line index)} of the measurement records the selection model reads: per run
    and side the fastest record of each of its ``TOP_K`` fastest configurations
    (:func:`clmf.tuning.model.top_records`), and every measurement of status wrong (the
    configurations it refuses, :func:`clmf.tuning.model.refuted`)."""
    keep = set()
    for i, recs in enumerate(sources):
        where = {id(r): (i, j) for j, r in enumerate(recs)}
        for top in top_records(recs).values():
            keep.update(where[id(r)] for r in top)
        keep.update((i, j) for j, r in enumerate(recs) if wrong_record(r))
    return keep


def _kept_measurements(sources, top):
    """{(file index, line index)} of the measurement records the default rung and the selection
    model need."""
    groups = collections.defaultdict(dict)          # group -> config -> (seconds, (file, line))
    for i, recs in enumerate(sources):
        for j, r in enumerate(recs):
            g = _measurement_group(r)
            if g is None:
                continue
            k = config_text(r["config"])             # (the lookup's own grouping)
            t = float(r["seconds"])
            if k not in groups[g] or t < groups[g][k][0]:
                groups[g][k] = (t, (i, j))
    by_class = collections.defaultdict(list)
    for g, cfgs in groups.items():
        by_class[g[:3]].append(cfgs)
    keep = set()
    for cls, sel in by_class.items():
        scores = collections.defaultdict(list)
        for cfgs in sel:
            best = min(t for t, _ in cfgs.values())
            for k, (t, where) in cfgs.items():
                scores[k].append(t / best)
                if t == best:
                    keep.add(where)
        need = max(1, math.ceil(len(sel) / 2))
        ranked = sorted((sum(v) / len(v), k) for k, v in scores.items() if len(v) >= need)
        chosen = {k for _, k in ranked[:top]}
        for cfgs in sel:
            keep.update(where for k, (t, where) in cfgs.items() if k in chosen)
    return keep | _model_measurements(sources)


_TOPK_RAW = ("candidates", "calibration")     # a topk record's raw measurements, not shipped


def distill(sources, names=None, blobs=None, top=TOP):
    """The compact record lists of raw databases (lists of records, in the lookup's order).

    ``names``/``blobs`` label each source in its header (file name, git blob id)."""
    names = names or [f"source{i}" for i in range(len(sources))]
    blobs = blobs or [None] * len(sources)
    meas = _kept_measurements(sources, top)
    model = _model_measurements(sources)
    out = []
    for i, recs in enumerate(sources):
        runs = _kept_runs(recs)
        body = []
        for j, r in enumerate(recs):
            if r.get("kind") == "best" and r.get("run_id") in runs:
                body.append(r)
            elif (i, j) in meas:
                m = {k: r[k] for k in _MEASUREMENT_KEYS if k in r}
                if isinstance(m.get("config"), dict):
                    m["config"] = compact_config(m["config"])
                if (i, j) in model and isinstance(r.get("dataset"), dict):
                    m.update(shape_fields(r))
                body.append(m)
            elif r.get("kind") == "topk":     # top-k tunings (clmf.inference.topk), compact
                body.append({k: v for k, v in r.items() if k not in _TOPK_RAW})
        commits = sorted({r["commit"] for r in body if r.get("kind") == "best" and "commit" in r})
        head = {"schema_version": SCHEMA_VERSION, "kind": "distilled", "source": names[i],
                "source_git_blob": blobs[i], "run_commits": commits, "runs": sorted(runs),
                "records_in": len(recs), "records_out": len(body), "top": top,
                "rule": "best records of the runs with distinct pairs per case (device, f, "
                        "storage, mode, m, n, nnz), newest first; ok measurements the computed "
                        "default can rank (clmf.autotune.distill)"}
        out.append([head] + body)
    return out


def _dumps(records):
    return "".join(json.dumps(r, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"
                   for r in records).encode()


def plain_name(path):
    """The name of a raw database's records and of its compact file: ``<slug>.jsonl`` of
    ``<slug>.jsonl.gz`` or ``<slug>.jsonl``."""
    name = pathlib.Path(path).name
    return name[:-len(".gz")] if name.endswith(".gz") else name


def distill_files(paths, top=TOP):
    """{file name: bytes} of the compact databases of the raw files ``paths`` (plain or gzip)."""
    paths = [pathlib.Path(p) for p in paths]
    names = [plain_name(p) for p in paths]
    if len(set(names)) < len(names):
        raise ValueError("a raw database given twice (plain and gzip?): "
                         + ", ".join(sorted(str(p) for p in paths)))
    data = [records_bytes(p) for p in paths]
    sources = [read_database(p, strict=True) for p in paths]
    compact = distill(sources, [f"results/tuning/{n}" for n in names],
                      [_blob_id(d) for d in data], top)
    return {n: _dumps(recs) for n, recs in zip(names, compact)}


def write(paths, out_dir, top=TOP):
    """Write the compact databases of ``paths`` into ``out_dir`` (stale ``*.jsonl`` removed);
    returns {path: size}."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = distill_files(paths, top)
    for old in out_dir.glob("*.jsonl"):
        if old.name not in files:
            old.unlink()
    sizes = {}
    for name, data in files.items():
        p = out_dir / name
        tmp = p.with_suffix(".jsonl.tmp")
        tmp.write_bytes(data)
        tmp.replace(p)
        sizes[p] = len(data)
    return sizes


def main(argv=None):
    """``python -m clmf.autotune.distill RAW.jsonl.gz... -o DIR [--check]``."""
    p = argparse.ArgumentParser(prog="python -m clmf.autotune.distill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("raw", nargs="+",
                   help="raw tuning databases (results/tuning/*.jsonl.gz; plain .jsonl too)")
    p.add_argument("-o", "--out", default="results/tuning/shipped", help="output directory")
    p.add_argument("--top", type=int, default=TOP,
                   help="ranked configurations kept per device type, mode and f")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when the output directory is out of date")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.check:
        files = distill_files(a.raw, a.top)
        out = pathlib.Path(a.out)
        stale = sorted(n for n, d in files.items()
                       if not (out / n).is_file() or (out / n).read_bytes() != d)
        extra = sorted(x.name for x in out.glob("*.jsonl") if x.name not in files)
        for n in stale + extra:
            log.info("out of date: %s", out / n)
        return 1 if stale or extra else 0
    for path, size in write(a.raw, a.out, a.top).items():
        log.info("%s: %.1f KiB", path, size / 1024)
    return 0


if __name__ == "__main__":
    sys.exit(main())
