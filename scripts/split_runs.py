#!/usr/bin/env python3
"""Split the tuning runs that share one run id across commits in raw tuning databases.

Before the tuner's source hash was part of a run's identity (``clmf.autotune.journal.
tuner_hash``), the same case tuned again by a changed tuner got the same run id: on the H100
(stops 46-49) up to four runs, each with its own ``run`` record, its own samples and its own
commit, shared one id, and every reader (the lookup, the selection model, the leave-one-out)
took them for one run — the minimum of a configuration's times over different samples. Here
each such run id's records are grouped by commit; the oldest commit's records keep the id (what
older result files cite), every later commit's get ``sha1(id:commit)[:16]``. Run ids shared
within one commit (a run repeated at the same commit) are left alone. Rewrites the files in
place (gzip, deterministic), then: ``python -m clmf.autotune.distill results/tuning/*.jsonl.gz
-o results/tuning/shipped``.

``python scripts/split_runs.py results/tuning/*.jsonl.gz [--dry-run]``
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import pathlib
import tempfile


def split(records):
    """(records with the later commits' run ids rewritten, {old id: {commit: new id}})."""
    firsts, commits = {}, {}
    for i, r in enumerate(records):
        rid = r.get("run_id")
        if rid is None:
            continue
        c = str(r.get("commit"))
        commits.setdefault(rid, {})
        if c not in commits[rid]:
            commits[rid][c] = i
        firsts.setdefault(rid, i)
    renamed = {}
    for rid, cs in commits.items():
        heads = {str(r.get("commit")) for r in records
                 if r.get("run_id") == rid and r.get("kind") == "run"}
        if len(cs) < 2 or len(heads) < 2:
            continue
        first = min(cs, key=cs.get)              # the oldest commit (first in the file) keeps it
        renamed[rid] = {c: hashlib.sha1(f"{rid}:{c}".encode()).hexdigest()[:16]
                        for c in cs if c != first}
    out = []
    for r in records:
        new = renamed.get(r.get("run_id"), {}).get(str(r.get("commit")))
        out.append(dict(r, run_id=new) if new else r)
    return out, renamed


def main(argv=None):
    """Rewrite each file (or, with ``--dry-run``, print what would change)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    for path in map(pathlib.Path, a.paths):
        with gzip.open(path, "rt") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        out, renamed = split(records)
        for rid, new in renamed.items():
            print(f"{path.name}: run {rid}: " + ", ".join(f"{c} -> {n}" for c, n in new.items()))
        if a.dry_run or not renamed:
            continue
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                           filename="") as gz:
                for r in out:
                    gz.write((json.dumps(r) + "\n").encode())
            os.replace(tmp, path)
        except BaseException:
            pathlib.Path(tmp).unlink(missing_ok=True)
            raise


if __name__ == "__main__":
    main()
