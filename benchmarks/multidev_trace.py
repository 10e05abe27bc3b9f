#!/usr/bin/env python3
"""Where a multi-device iteration's time outside the kernels goes, per device and half-step
(issue 28: on four H100s the wall exceeds the slowest device's kernels by 0.017–0.025 s an
iteration on Netflix-shaped sets).

    python benchmarks/multidev_trace.py OUTDIR --preset netflix [--fraction 1] [--gpus 4]
        [--factors 100] [--iterations 6] [--cache DIR] [--devices gpu] [--gc-off]
        [--switch-interval S]

Runs :func:`clmf.parallel.scaling.timed_fit` (the scale-out benchmark's fit: profiling on,
one warm-up iteration) with host clocks around each :class:`clmf.parallel.MultiEngine`
half-step (the main thread: its start to the gather) and each device's part of it (its
half-step generator's first step — the first launch, in the main thread where the devices'
launches are interleaved, else the pool thread's entry — to its end), and that part's growth
of the device's ``compute`` (entry to its kernels' end, as the engine measures it),
``exchange`` (its kernels' end to the last peer row on the device) and ``kernels`` (profiled
busy time). Per half-step and device, in ms: ``start`` (the part's first step after the
half-step's start), ``compute``, ``kernels``, ``idle`` (compute − kernels: the device waiting
within its own part), ``exchange``, ``end`` (the gather's return after the part's); per
half-step the main thread's wall and the device whose kernels ended last. Writes
``OUTDIR/trace.json`` and ``OUTDIR/trace.md`` (medians over the timed iterations).
``--gc-off`` turns Python's cyclic garbage collector off for the fit,
``--switch-interval`` sets the interpreter's thread switch interval (``sys.setswitchinterval``,
default 0.005 s): telling the interpreter's lock and the collector apart as causes of the idle.
``--events`` also records every kernel launch and copy each device's queues took in a
half-step (the host's clock around the enqueue call, the device's queued / submit / start / end
times) and tells apart, on each device's compute queue, the gaps in which the next command had
not yet been enqueued (the host late) from those in which it waited on the device or driver
(``events.md``, ``events.json``: one timed iteration's full timeline too).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def instrument(log, calls=None, events=None):
    """Wrap the engines' and the multi-device backend's half-steps so that each appends its
    host times to ``log`` (a list): ``("main", side, t_in, t_out)`` and ``("dev", index,
    side, t_in, t_out, Δcompute, Δexchange, Δkernels)``; with ``calls`` (see :func:`capture`)
    each half-step's commands per device are appended to ``events``: ``(side, per device)``."""
    from clmf.engine.core import Engine
    from clmf.parallel import backend
    lock = threading.Lock()
    engine_steps, multi_half, piped = Engine.half_step_steps, backend.MultiEngine.half_step, \
        backend.pipelined

    @contextlib.contextmanager
    def part(eng, side):
        """Log the enclosed part of device ``eng``'s half-step of ``side``: its host times and
        the growth of the device's compute, exchange and kernel seconds."""
        keys = ("compute", "exchange", "kernels")
        before = [eng.times.get(k, 0.0) for k in keys]
        t = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            with lock:
                log.append(("dev", eng.index, side, t, t1,
                            *(eng.times.get(k, 0.0) - b for k, b in zip(keys, before))))

    def half_step_steps(self, side, *args, **kw):
        """An engine's half-step (its generator: launches, then the wait), timed from its
        first launch to its end."""
        gen = engine_steps(self, side, *args, **kw)

        def steps():
            """The wrapped generator."""
            with part(self, side):
                yield from gen
        return steps()

    def pipelined(eng, side, *args, **kw):
        """A reduced half-step of one device, timed."""
        with part(eng, side):
            return piped(eng, side, *args, **kw)

    def multi(self, side, *args, **kw):
        """The backend's half-step, timed (its devices' commands taken where recorded)."""
        t = time.perf_counter()
        try:
            return multi_half(self, side, *args, **kw)
        finally:
            t1 = time.perf_counter()
            with lock:
                log.append(("main", side, t, t1))
            if calls is not None:
                events.append((side, take_events(calls, self.workers, t, t1)))
    Engine.half_step_steps = half_step_steps
    backend.pipelined = pipelined
    backend.MultiEngine.half_step = multi


def capture(calls):
    """Record each kernel launch and copy (``pyopencl.Kernel.__call__``, ``enqueue_copy``) in
    ``calls``: ``(host t before, host t after, queue, what, event)``."""
    import pyopencl as cl
    lock = threading.Lock()
    kcall, ecopy = cl.Kernel.__call__, cl.enqueue_copy

    def kernel_call(self, queue, *args, **kw):
        """A launch, recorded."""
        t = time.perf_counter()
        ev = kcall(self, queue, *args, **kw)
        t1 = time.perf_counter()
        with lock:
            calls.append((t, t1, queue, self.function_name, ev))
        return ev

    def enqueue_copy(queue, dest, src, **kw):
        """A copy, recorded."""
        t = time.perf_counter()
        ev = ecopy(queue, dest, src, **kw)
        t1 = time.perf_counter()
        with lock:
            calls.append((t, t1, queue, "copy", ev))
        return ev
    cl.Kernel.__call__ = kernel_call
    cl.enqueue_copy = enqueue_copy


def take_events(calls, engines, t0, t1):
    """The calls enqueued between host times ``t0`` and ``t1`` (removed from ``calls``), per
    device: ``[{what, queue, host_ms (after t0), enqueue_us, queued, submit, start, end (ms
    after the device's first queued command)}]``."""
    names = {}
    for d, eng in enumerate(engines):
        for k, q in eng.q.items():
            names[q.int_ptr] = (d, k)
    mine = [c for c in calls if t0 <= c[0] <= t1]
    calls[:] = [c for c in calls if not t0 <= c[0] <= t1]
    per = [[] for _ in engines]
    for ta, tb, q, what, ev in mine:
        key = names.get(q.int_ptr)
        if key is None or ev is None:
            continue
        try:
            ev.wait()
            p = ev.profile
            times = [p.queued, p.submit, p.start, p.end]
        except Exception:                                    # noqa: BLE001 - no profile
            continue
        per[key[0]].append({"what": what, "queue": key[1], "host_ms": (ta - t0) * 1e3,
                            "enqueue_us": (tb - ta) * 1e6, "t": times})
    for evs in per:
        if evs:
            base = min(e["t"][0] for e in evs)
            for e in evs:
                e["queued"], e["submit"], e["start"], e["end"] = ((x - base) * 1e-6
                                                                   for x in e.pop("t"))
            evs.sort(key=lambda e: e["start"])
    return per


def compute_gaps(evs):
    """One device's half-step summarised: its commands, the host's enqueue time, and on the
    compute queue the idle before the first command and between commands, split into the part
    in which the next command was not yet enqueued (``host_late``) and the rest (``device``)."""
    comp = [e for e in evs if e["queue"] == "compute"]
    out = {"commands": len(evs), "kernels": sum(1 for e in evs if e["what"] != "copy"),
           "enqueue_ms": sum(e["enqueue_us"] for e in evs) * 1e-3,
           "enqueue_max_us": max((e["enqueue_us"] for e in evs), default=0.0),
           "first_start": comp[0]["start"] if comp else 0.0, "host_late": 0.0, "device": 0.0,
           "busy": sum(e["end"] - e["start"] for e in comp),
           "span": (comp[-1]["end"] if comp else 0.0)}
    for a, b in zip(comp, comp[1:]):
        gap = max(0.0, b["start"] - a["end"])
        late = min(gap, max(0.0, b["queued"] - a["end"]))
        out["host_late"] += late
        out["device"] += gap - late
    return out


def event_table(steps_events, n_dev):
    """The markdown table of :func:`compute_gaps`' medians per side and device."""
    keys = ("commands", "kernels", "enqueue_ms", "enqueue_max_us", "first_start", "busy",
            "host_late", "device", "span")
    lines = ["| half-step | device | " + " | ".join(keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for side in ("users", "items"):
        mine = [per for s, per in steps_events if s == side]
        if not mine:
            continue
        for d in range(n_dev):
            sums = [compute_gaps(per[d]) for per in mine]
            lines.append(f"| {side} | {d} | " + " | ".join(
                f"{statistics.median(x[k] for x in sums):.3g}" for k in keys) + " |")
    return "\n".join(lines)


def steps(log, n_dev):
    """The log cut into half-steps: ``[(side, main wall, [per-device dict])]``."""
    mains = [e for e in log if e[0] == "main"]
    devs = [e for e in log if e[0] == "dev"]
    out = []
    for _k, side, t0, t1 in mains:
        parts = sorted((e for e in devs if e[2] == side and t0 <= e[3] <= t1),
                       key=lambda e: e[1])
        if len(parts) != n_dev:
            continue
        out.append((side, t1 - t0, [
            {"device": e[1], "start": e[3] - t0, "compute": e[5], "kernels": e[7],
             "idle": e[5] - e[7], "exchange": e[6], "end": t1 - e[4],
             "kernels_end": e[3] + e[5] - t0} for e in parts]))
    return out


def table(rows, n_dev):
    """The markdown table of the medians per side and device (ms)."""
    keys = ("start", "compute", "kernels", "idle", "exchange", "end")
    lines = ["| half-step | main wall | device | " + " | ".join(keys) + " |",
             "|---|---|---|" + "---|" * len(keys)]
    for side in ("users", "items"):
        mine = [r for r in rows if r[0] == side]
        if not mine:
            continue
        wall = statistics.median(r[1] for r in mine) * 1e3
        for d in range(n_dev):
            vals = [statistics.median(r[2][d][k] for r in mine) * 1e3 for k in keys]
            lines.append(f"| {side} | {wall:.2f} | {d} | "
                         + " | ".join(f"{v:.2f}" for v in vals) + " |")
        last = [max(range(n_dev), key=lambda d, r=r: r[2][d]["kernels_end"]) for r in mine]
        lines.append(f"| {side} | | last kernels' end on device | "
                     + ", ".join(str(x) for x in last) + " | | | | | |")
    return "\n".join(lines)


def main(argv=None):
    """Run the traced fit; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--preset", default="netflix")
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--devices", default="gpu", help="gpu or cpu")
    ap.add_argument("--factors", type=int, default=100)
    ap.add_argument("--iterations", type=int, default=6, help="timed, after one warm-up")
    ap.add_argument("--cache", default=None, help="the layouts' folder (scaleout.py's)")
    ap.add_argument("--gc-off", action="store_true", help="no cyclic garbage collection")
    ap.add_argument("--switch-interval", type=float, default=None)
    ap.add_argument("--events", action="store_true",
                    help="record every command's host and device times (events.md)")
    args = ap.parse_args(argv)
    if args.gc_off:
        import gc
        gc.disable()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    from scaleout import load_layout

    from clmf.engine.device import device_info
    from clmf.parallel import select_devices
    from clmf.parallel.scaling import timed_fit
    from clmf.provenance import commit
    devs = select_devices(f"{args.devices}:all")[:args.gpus]
    layout = load_layout(args.preset, args.fraction, args.cache)
    log, calls, events = [], ([] if args.events else None), []
    if args.events:
        capture(calls)
    instrument(log, calls, events)
    r = timed_fit(devs, layout, args.factors, iterations=args.iterations, budget_s=60,
                  say=lambda m: print(m, flush=True), label=args.preset)
    rows = steps(log, len(devs))[2:]             # the warm-up iteration's two left out
    info = device_info(devs[0])
    out = pathlib.Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    rec = {"preset": args.preset, "fraction": args.fraction, "devices": len(devs),
           "gc_off": args.gc_off, "switch_interval": sys.getswitchinterval(),
           "device": f"{info.platform} | {info.name}", "driver": info.driver,
           "f": args.factors, "commit": commit(), "s_per_it": r["s_per_it"],
           "split": r.get("split"), "configs": r.get("configs"),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": " ".join(["python"] + sys.argv), "half_steps": rows}
    (out / "trace.json").write_text(json.dumps(rec, indent=1, default=str))
    md = (f"# {args.preset}@{args.fraction:g} on {len(devs)} × {info.name}, f = {args.factors}: "
          f"{r['s_per_it']:.4f} s/it (gc {'off' if args.gc_off else 'on'}, switch interval "
          f"{sys.getswitchinterval():g} s)\n\n{rec['date']}, commit {rec['commit']}, driver "
          f"{info.driver}.\n\n    {rec['command']}\n\nMedians over {len(rows) // 2} timed "
          f"iterations (ms; see the script's docstring):\n\n{table(rows, len(devs))}\n")
    (out / "trace.md").write_text(md)
    print(md)
    if args.events:
        timed = events[2:]                        # the warm-up iteration's two left out
        (out / "events.json").write_text(json.dumps(
            {"summary": [[s, [compute_gaps(p) for p in per]] for s, per in timed],
             "timeline": timed[-2:]}, indent=1))
        emd = (f"# Commands per device and half-step: {args.preset}@{args.fraction:g}, "
               f"{len(devs)} devices\n\n{rec['date']}, commit {rec['commit']}.\n\n"
               "Medians over the timed half-steps. ms unless named: `enqueue_ms` the host's "
               "time inside the enqueue calls (all queues), `first_start` the compute queue's "
               "first start after the device's first queued command, `busy` its commands' "
               "time, `host_late` its idle between commands before the next was enqueued, "
               "`device` its other idle between commands, `span` first queued to the last "
               f"compute command's end.\n\n{event_table(timed, len(devs))}\n")
        (out / "events.md").write_text(emd)
        print(emd)


if __name__ == "__main__":
    main()
