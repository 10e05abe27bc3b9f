"""Per-file table of two test runs recorded with CLMF_TEST_TIMES (tests/conftest.py): tests, wall
and CPU seconds (the test process and its waited-for children) before and after.

    python results/ci-time/summarize.py before.jsonl[.gz] after.jsonl[.gz] > table.md
"""
from __future__ import annotations

import collections
import gzip
import json
import sys


def load(path):
    """{file: [tests, wall s, cpu s]} of one run (a test recorded twice counts once, the last)."""
    opener = gzip.open if path.endswith(".gz") else open
    last = {}
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            last[r["test"]] = r
    out = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for r in last.values():
        row = out[r["test"].split("::", 1)[0]]
        row[0] += 1
        row[1] += r["wall"]
        row[2] += r["cpu"]
    return out


def main(before, after):
    """Print the markdown table, largest CPU time before first."""
    b, a = load(before), load(after)
    files = sorted(set(b) | set(a), key=lambda f: -(b[f][2] if f in b else a[f][2]))
    print("| file | tests before | wall s before | CPU s before | tests after | wall s after "
          "| CPU s after |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    tot = [0, 0.0, 0.0, 0, 0.0, 0.0]
    for f in files:
        x, y = b.get(f, [0, 0.0, 0.0]), a.get(f, [0, 0.0, 0.0])
        print(f"| {f} | {x[0]} | {x[1]:.0f} | {x[2]:.0f} | {y[0]} | {y[1]:.0f} | {y[2]:.0f} |")
        for k, v in enumerate(x + y):
            tot[k] += v
    print(f"| **total** | {tot[0]} | {tot[1]:.0f} | {tot[2]:.0f} | {tot[3]} | {tot[4]:.0f} "
          f"| {tot[5]:.0f} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
