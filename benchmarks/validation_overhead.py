#!/usr/bin/env python3
"""What validation costs a fit: ``fit(train, validation=held)`` against ``fit(train)`` on Last.fm
implicit feedback (HetRec 2011, strengths log1p(plays), leave-2-out), and ``score`` /
``clmf.evaluate`` on the fitted model, per OpenCL device.

Each device: one warm-up fit (kernel builds, top-k calibration), then ``--repeats`` pairs of fits
(without / with validation, alternating); the medians of wall and of this process's CPU seconds
and their ratios are recorded. Writes
``<out>.json`` and ``<out>.md`` with device, driver, date and commit.

    python benchmarks/validation_overhead.py --device pocl --device intel \\
        --out results/bench/validation-overhead/lastfm-f64
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time


def main():
    """Measure the fits and evaluations on each device given; print and write the results."""
    # benchmarks/: the same Last.fm split and options
    from lastfm_implicit import lastfm_arguments, lastfm_split

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    lastfm_arguments(p)
    p.add_argument("--device", action="append", help="device spec (repeatable; default auto)")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()

    import clmf
    from clmf.engine.device import device_info, device_label, select_device
    from clmf.provenance import commit
    train, held = lastfm_split(a.data, a.k_out, a.seed)
    R, T = train.to_csr(), held.to_csr()
    load_start = os.getloadavg()          # a shared machine: the load the timings ran under
    rows = []
    for spec in a.device or ["auto"]:
        dev = select_device(spec)
        info = device_info(dev)

        def model():
            return clmf.ALS(a.factors, a.regularization, a.iterations, feedback="implicit",
                            alpha=a.alpha, device=dev, random_state=a.seed)

        model().fit(R, validation=T, show_progress=False)        # warm-up: builds, calibration
        # wall seconds, and this process's CPU seconds (all its threads: less sensitive to
        # other jobs on a shared machine, though a runtime's spinning threads count too)
        plain, valid, plain_cpu, valid_cpu = [], [], [], []
        for _ in range(a.repeats):
            t, c = time.perf_counter(), time.process_time()
            model().fit(R, show_progress=False)
            plain.append(time.perf_counter() - t)
            plain_cpu.append(time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            m = model().fit(R, validation=T, show_progress=False)
            valid.append(time.perf_counter() - t)
            valid_cpu.append(time.process_time() - c)
        its = sum(h["seconds"] for h in m.history_)
        score_s, eval_s = [], []
        for _ in range(a.repeats):
            t = time.perf_counter()
            s = m.score(T, user_items=R)
            score_s.append(time.perf_counter() - t)
            if hasattr(clmf, "evaluate"):
                t = time.perf_counter()
                ev = clmf.evaluate(m, R, T, K=10)
                eval_s.append(time.perf_counter() - t)
        row = dict(device=device_label(info), driver=info.driver,
                   fit_s=statistics.median(plain), fit_validation_s=statistics.median(valid),
                   fit_s_all=plain, fit_validation_s_all=valid,
                   fit_cpu_s=statistics.median(plain_cpu),
                   fit_validation_cpu_s=statistics.median(valid_cpu),
                   validated_iterations_s=its,
                   score_s=statistics.median(score_s), score=float(s),
                   evaluate_s=statistics.median(eval_s) if eval_s else None,
                   evaluate=ev if eval_s else None,
                   validation_precision_at_10=m.history_[-1].get("validation_precision@10"))
        row["ratio"] = row["fit_validation_s"] / row["fit_s"]
        row["added_s"] = row["fit_validation_s"] - row["fit_s"]
        row["cpu_ratio"] = row["fit_validation_cpu_s"] / row["fit_cpu_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                commit=commit(), host=platform.node(), data=os.path.basename(a.data),
                users=int(R.shape[0]), items=int(R.shape[1]), train_nnz=int(R.nnz),
                held_out_nnz=int(T.nnz), factors=a.factors, regularization=a.regularization,
                alpha=a.alpha, iterations=a.iterations, k_out=a.k_out, repeats=a.repeats,
                strengths="log1p(plays)", command=" ".join(["python"] + sys.argv),
                load_average_start=load_start, load_average_end=os.getloadavg(),
                cpus=os.cpu_count())
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out + ".json", "w") as fh:
            json.dump(dict(meta=meta, rows=rows), fh, indent=1)
        lines = ["# Validation's cost: Last.fm implicit fits with and without `validation=`", "",
                 f"`{meta['command']}` — {meta['date']}, commit {meta['commit'][:12]}, host "
                 f"{meta['host']}; {meta['users']} users × {meta['items']} artists, "
                 f"{meta['train_nnz']} train / {meta['held_out_nnz']} held out "
                 f"(leave-{a.k_out}-out), log1p(plays), f={a.factors}, λ={a.regularization}, "
                 f"alpha={a.alpha}, {a.iterations} iterations; medians of {a.repeats} "
                 f"(after a warm-up fit); {meta['cpus']} CPUs, load average "
                 f"{meta['load_average_start'][0]:.1f} at the start, "
                 f"{meta['load_average_end'][0]:.1f} at the end.", "",
                 "| device | driver | fit s | fit + validation s | ratio | added s | CPU s: fit, "
                 "fit + validation (ratio) | score() s | evaluate() s |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            ev = f"{r['evaluate_s']:.3f}" if r["evaluate_s"] is not None else "—"
            lines.append(f"| {r['device']} | {r['driver']} | {r['fit_s']:.3f} | "
                         f"{r['fit_validation_s']:.3f} | {r['ratio']:.2f}× | {r['added_s']:.3f} | "
                         f"{r['fit_cpu_s']:.3f}, {r['fit_validation_cpu_s']:.3f} "
                         f"({r['cpu_ratio']:.2f}×) | {r['score_s']:.3f} | {ev} |")
        with open(a.out + ".md", "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
