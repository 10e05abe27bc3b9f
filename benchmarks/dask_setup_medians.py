"""Medians over every round (warm-ups excluded) of the after/before setup.json files of
benchmarks/dask_setup.py under a folder, as a Markdown table, with the task stream's phases
(seconds from `fit`): python benchmarks/dask_setup_medians.py FOLDER BEFORE AFTER (BEFORE and
AFTER: the columns' names)."""
import glob
import json
import statistics
import sys

WORKER_STAGES = ("split", "split_wall", "merge_users", "merge_items", "merge_wait", "blocks",
                 "blocks_wait", "context", "start_factors",
                 "start_wait", "engine")

# phases of the task stream: (task kinds, 4 = first start / 5 = last end)
PHASES = {"tasks: first read starts": (("read_parquet", "read_parquet_file"), 4),
          "tasks: merge_scans ends": (("merge_scans",), 5),
          "tasks: first split starts": (("split",), 4),
          "tasks: last split ends": (("split",), 5),
          "tasks: probe ends": (("probe",), 5),
          "tasks: build ends": (("build",), 5)}


def rows(files):
    """Per measured round: the times to the first iteration, their ratio and the stages."""
    out = []
    for f in files:
        with open(f) as fh:
            rec = json.load(fh)
        for r in rec["rounds"][1:]:
            ds = r["dask_stages"]
            ws = ds.get("workers", [])
            row = {"inprocess_s": r["inprocess_s"], "dask_s": r["dask_s"],
                   "ratio": r["dask_s"] / r["inprocess_s"], "prepare_s": ds["prepare_s"],
                   "set_up_s": ds["set_up_s"], "engine.probe": ds["engine"]["probe"],
                   "engine.blocks_and_engines": ds["engine"]["blocks_and_engines"]}
            for name, (kinds, col) in PHASES.items():      # the task stream, from `fit`
                got = [t[col] for t in ds.get("tasks", [])
                       if t[0] in kinds and t[1] == "compute"]
                if got:
                    row[name] = min(got) if col == 4 else max(got)
            for k in WORKER_STAGES:
                if any(k in w for w in ws):
                    row["max worker " + k] = max(w.get(k, 0.0) for w in ws)
            out.append(row)
    return out


def medians(files):
    """``({stage: median}, rounds)`` of :func:`rows`."""
    rs = rows(files)
    keys = list(dict.fromkeys(k for r in rs for k in r))
    return {k: statistics.median([r[k] for r in rs if k in r]) for k in keys}, len(rs)


def main():
    """Print the table."""
    def pick(v):
        """The setup.json files of version ``v``."""
        return sorted(glob.glob(f"{sys.argv[1]}/**/{v}/**/setup.json", recursive=True))
    a, na = medians(pick("after"))
    b, nb = medians(pick("before"))
    print(f"| median of {nb} / {na} rounds | before ({sys.argv[2]}) | after ({sys.argv[3]}) |")
    print("|---|---|---|")
    for k in dict.fromkeys(list(b) + list(a)):
        print(f"| {k} | " + " | ".join(f"{x[k]:.3f}" if k in x else "–" for x in (b, a)) + " |")


if __name__ == "__main__":
    main()
