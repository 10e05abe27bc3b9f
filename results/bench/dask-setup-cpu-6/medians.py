import json, statistics as st, sys
runs = sys.argv[1:]
rows = {}
for c in ("before", "after", "after-m2"):
    vals = {}
    for r in runs:
        d = json.load(open(f"runs/{r}/{c}/setup.json"))
        for rd in d["rounds"][1:]:
            t = {(x[0], x[1]): x for x in rd["dask_stages"]["tasks"]}
            se, be = t[("split", "compute")][5], t[("build", "compute")][5]
            ws = rd["dask_stages"]["workers"]
            rec = {"in-process fit (s)": rd["inprocess_s"], "Dask fit (s)": rd["dask_s"],
                   "Dask / in-process": rd["dask_s"] / rd["inprocess_s"],
                   "tasks: last split ends": se, "tasks: build ends": be,
                   "build end - last split end": be - se}
            for k in ("merge_wait", "merge_items", "merge_users", "blocks", "blocks_wait",
                      "start_pad", "start_upload", "split_wall"):
                rec[f"max worker {k}"] = max(w.get(k, 0) for w in ws)
            for k, v in rec.items():
                vals.setdefault(k, []).append(v)
    rows[c] = vals
print("| median of rounds 1-2 of runs " + ",".join(runs) + " | " + " | ".join(rows) + " |")
print("|---|" + "---|" * len(rows))
for k in rows["before"]:
    print(f"| {k} | " + " | ".join(f"{st.median(rows[c][k]):.3f}" if k in rows[c] else "-" for c in rows) + " |")
print("rounds per cell:", len(rows["before"]["Dask fit (s)"]))
