#!/usr/bin/env python3
"""Nsight Compute counters for clmf's OpenCL kernels: capture a launch, replay it through CUDA.

Nsight Compute profiles CUDA launches only, and NVIDIA's OpenCL program binaries are PTX. This
captures, in a real half-step, the largest launch of each named kernel per side (its PTX, geometry,
scalar arguments and every buffer argument's bytes before and after the launch, and its OpenCL
event time), then replays each capture through the CUDA driver API (``libcuda`` by ctypes: the
same PTX, JIT-compiled by the same driver; the PTX's ``%envreg`` reads, which NVIDIA's OpenCL uses
for global offsets, are set to 0: the captured launches have none). The replay checks every
buffer it wrote against the OpenCL launch's result before it is timed, so the counters belong to
the same computation; ``ncu`` then profiles the replays.

    # capture (OpenCL) and replay under ncu, one directory per (kernel, side):
    python3 benchmarks/ncu_replay.py capture --out $OUT/cap --cells "implicit:256;explicit:100" \
        --kernels s3_fcg,s1_hermitian [--data netflix --scale 1]
    python3 benchmarks/ncu_replay.py replay $OUT/cap/implicit256-s3_fcg-users --reps 3
    ncu --set full -k regex:s3_ -c 1 -o $OUT/rep python3 benchmarks/ncu_replay.py replay DIR
    python3 benchmarks/ncu_replay.py summary REPORT.ncu-rep > summary.txt
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

T0 = time.perf_counter()


def log(msg):
    """Progress on stderr, elapsed seconds first."""
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- capture (OpenCL)

def _snapshot(queue, buf):
    """A buffer's bytes on the host."""
    import pyopencl as cl
    h = np.empty(buf.size, np.uint8)
    cl.enqueue_copy(queue, h, buf)
    return h


class Recorder:
    """Wraps ``pyopencl.Kernel.__call__``: while armed, each launch of a named kernel runs alone
    (the queue finished before and after it) and the largest launch per kernel is kept (PTX,
    geometry, arguments, buffers before and after, OpenCL event seconds)."""

    def __init__(self, names):
        import pyopencl as cl
        self.names = set(names)
        self.armed = False
        self.best = {}
        self._orig = cl.Kernel.__call__
        rec = self

        def call(kern, queue, gsize, lsize, *args, **kw):
            """A kernel's launch: captured while armed and named, else as pyopencl does."""
            name = kern.function_name
            if not rec.armed or name not in rec.names:
                return rec._orig(kern, queue, gsize, lsize, *args, **kw)
            return rec.capture(kern, queue, gsize, lsize, args, kw)

        cl.Kernel.__call__ = call

    def restore(self):
        """Unwrap the kernels' launches."""
        import pyopencl as cl
        cl.Kernel.__call__ = self._orig

    def capture(self, kern, queue, gsize, lsize, args, kw):
        """Run one launch alone; keep it when it is the kernel's largest so far."""
        import pyopencl as cl
        name = kern.function_name
        size = int(np.prod(gsize))
        if kw.get("global_offset") is not None or lsize is None:
            raise ValueError(f"{name}: launches with a global offset or no local size are not "
                             f"replayed")
        keep = size > self.best.get(name, {}).get("size", -1)
        queue.finish()
        pre = [_snapshot(queue, a) if isinstance(a, cl.Buffer) else None for a in args] \
            if keep else None
        ev = self._orig(kern, queue, gsize, lsize, *args, **kw)
        ev.wait()
        if not keep:
            return ev
        try:
            secs = (ev.profile.end - ev.profile.start) * 1e-9
        except cl.Error:
            secs = None
        spec = []
        for i, a in enumerate(args):
            if isinstance(a, cl.Buffer):
                post = _snapshot(queue, a)
                spec.append({"kind": "buffer", "pre": pre[i],
                             "post": None if np.array_equal(post, pre[i]) else post})
            elif isinstance(a, cl.LocalMemory):
                raise ValueError(f"{name}: local-memory arguments are not replayed")
            else:
                v = np.asarray(a)
                spec.append({"kind": "scalar", "dtype": v.dtype.str, "value": v.item()})
        ptx = kern.get_info(cl.kernel_info.PROGRAM).get_info(cl.program_info.BINARIES)[0]
        self.best[name] = {"size": size, "gsize": [int(x) for x in gsize],
                           "lsize": [int(x) for x in lsize], "args": spec, "ptx": ptx,
                           "cl_seconds": secs}
        return ev


def save(rec, out):
    """Write a capture: ``launch.json``, ``kernel.ptx``, ``argN_pre.npy`` / ``argN_post.npy``."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "kernel.ptx"), "wb") as fh:
        fh.write(bytes(rec["ptx"]))            # as the driver gave it (PTX text, or a binary)
    args = []
    for i, a in enumerate(rec["args"]):
        if a["kind"] == "buffer":
            np.save(os.path.join(out, f"arg{i}_pre.npy"), a["pre"])
            if a["post"] is not None:
                np.save(os.path.join(out, f"arg{i}_post.npy"), a["post"])
            args.append({"kind": "buffer", "bytes": int(a["pre"].size),
                         "written": a["post"] is not None})
        else:
            args.append({k: a[k] for k in ("kind", "dtype", "value")})
    meta = {k: rec[k] for k in ("gsize", "lsize", "cl_seconds")}
    meta.update(args=args, kernel=rec["name"], side=rec["side"], spec=rec["spec"],
                configs=rec["configs"], device=rec["device"], data=rec["data"])
    with open(os.path.join(out, "launch.json"), "w") as fh:
        json.dump(meta, fh, indent=1)


def capture(a):
    """For each cell MODE:F[:VARIANT] build its engine, warm it up, capture each side's launches
    (one data set for all cells)."""
    import scipy.sparse as sp

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import side_profile as spf

    from clmf.data import synthetic
    from clmf.engine.device import device_label, select_devices
    from clmf.tuning import side_stats
    dev = select_devices(a.device)[0]
    data = synthetic(a.data, scale=a.scale, seed=a.seed)
    R = sp.csr_matrix(data.to_csr(), dtype=np.float32)
    m, n = R.shape
    log(f"{device_label(dev)}: {a.data} x{a.scale:g} {m} x {n}, {R.nnz} ratings")
    stats = {"users": side_stats(np.diff(R.indptr), n),
             "items": side_stats(np.bincount(R.indices, minlength=n), m)}
    for cell in (c for c in a.cells.split(";") if c):
        mode, f, variant = (cell.split(":", 2) + ["auto"])[:3]
        try:
            capture_cell(a, dev, R, stats, mode, int(f), variant, spf)
        except Exception as e:                         # one cell's failure is a line, not a stop
            log(f"{cell}: {type(e).__name__}: {e}")


def capture_cell(a, dev, R, stats, mode, f, variant, spf):
    """Capture one cell's largest launch of each named kernel per side (``spf``: the
    side_profile module, whose fit specification and engine it uses)."""
    from clmf.engine.device import device_info, device_label
    from clmf.reference import start_factors
    from clmf.tuning import resolve
    m, n = R.shape
    spec = spf.spec_of(a, f, mode, variant)
    ch = resolve(spec, device_info(dev), stats)
    cfgs = (ch["users"].config, ch["items"].config)
    log(f"{mode} f={f}: users {cfgs[0]} / items {cfgs[1]}")
    eng = spf.engine_for(dev, R, spec, cfgs)
    X0, Y0 = start_factors(m, n, f, a.seed)
    eng.set_factors("users", X0)
    eng.set_factors("items", Y0)
    for side in ("users", "items"):                # warm-up: programs built, factors settled
        eng.half_step(side, float(spec.regularization), spec.weighted)
    eng.queue.finish()
    rec = Recorder(a.kernels.split(","))
    try:
        for side in ("users", "items"):
            rec.best = {}
            rec.armed = True
            eng.half_step(side, float(spec.regularization), spec.weighted)
            eng.queue.finish()
            rec.armed = False
            for name, r in rec.best.items():
                r.update(name=name, side=side, spec=f"{mode} f={f}",
                         configs=[str(c) for c in cfgs], device=device_label(dev),
                         data=f"{a.data} x{a.scale:g} {m}x{n} nnz={R.nnz}")
                d = os.path.join(a.out, f"{mode}{f}-{name}-{side}")
                save(r, d)
                log(f"captured {name} ({side}): {r['gsize']} / {r['lsize']}, OpenCL "
                    f"{r['cl_seconds']} s -> {d}")
    finally:
        rec.restore()
        eng.release()


# ------------------------------------------------------------------------------ replay (CUDA)

class CudaError(RuntimeError):
    """A CUDA driver call failed."""


def _cuda():
    """libcuda with the calls used here."""
    cu = ctypes.CDLL("libcuda.so.1")

    def check(name):
        """The driver call ``name``, raising :class:`CudaError` on a nonzero result."""
        fn = getattr(cu, name)

        def call(*args):
            """``name`` called, its result checked."""
            rc = fn(*args)
            if rc != 0:
                s = ctypes.c_char_p()
                cu.cuGetErrorString(rc, ctypes.byref(s))
                raise CudaError(f"{name}: {rc} {s.value.decode() if s.value else ''}")
        return call
    return cu, check


PTR_TYPES = {"<i4": ctypes.c_int32, "<u4": ctypes.c_uint32, "<i8": ctypes.c_int64,
             "<u8": ctypes.c_uint64, "<f4": ctypes.c_float, "<f8": ctypes.c_double}


def patched_ptx(ptx):
    """The PTX with NVIDIA OpenCL's environment registers (global offsets) read as 0."""
    return re.sub(rb"%envreg\d+", b"0", ptx)


def replay(a):
    """Check the replay against the OpenCL result, then time it ``--reps`` times."""
    with open(os.path.join(a.dir, "launch.json")) as fh:
        meta = json.load(fh)
    with open(os.path.join(a.dir, "kernel.ptx"), "rb") as fh:
        ptx = patched_ptx(fh.read().rstrip(b"\0")) + b"\0"
    cu, ck = _cuda()
    ck("cuInit")(0)
    dev = ctypes.c_int()
    ck("cuDeviceGet")(ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    ck("cuDevicePrimaryCtxRetain")(ctypes.byref(ctx), dev)
    ck("cuCtxSetCurrent")(ctx)
    mod = ctypes.c_void_p()
    ck("cuModuleLoadData")(ctypes.byref(mod), ctypes.c_char_p(ptx))
    fn = ctypes.c_void_p()
    ck("cuModuleGetFunction")(ctypes.byref(fn), mod, meta["kernel"].encode())
    regs = ctypes.c_int()
    ck("cuFuncGetAttribute")(ctypes.byref(regs), 4, fn)        # CU_FUNC_ATTRIBUTE_NUM_REGS
    smem = ctypes.c_int()
    ck("cuFuncGetAttribute")(ctypes.byref(smem), 1, fn)        # SHARED_SIZE_BYTES
    vals, ptrs = [], []
    for i, arg in enumerate(meta["args"]):
        if arg["kind"] == "buffer":
            p = ctypes.c_uint64()
            ck("cuMemAlloc_v2")(ctypes.byref(p), ctypes.c_size_t(max(arg["bytes"], 1)))
            # the bytes before the launch, read once (every timed run starts from them)
            h = np.ascontiguousarray(np.load(os.path.join(a.dir, f"arg{i}_pre.npy")))
            ptrs.append((i, p, arg, h))
            vals.append(p)
        else:
            vals.append(PTR_TYPES[arg["dtype"]](arg["value"]))

    def upload():
        """Every buffer argument's captured bytes before the launch, to the device."""
        for _i, p, _arg, h in ptrs:
            ck("cuMemcpyHtoD_v2")(p, h.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(h.size))

    params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p)
                                             for v in vals])
    g, lsz = meta["gsize"], meta["lsize"]
    grid = [g[i] // lsz[i] for i in range(len(g))] + [1] * (3 - len(g))
    block = list(lsz) + [1] * (3 - len(lsz))

    def launch():
        """The captured launch, through the CUDA driver."""
        ck("cuLaunchKernel")(fn, *[ctypes.c_uint(x) for x in grid],
                             *[ctypes.c_uint(x) for x in block], ctypes.c_uint(0), None, params,
                             None)

    upload()
    launch()
    ck("cuCtxSynchronize")()
    worst = 0.0
    for i, p, arg, _h in ptrs:
        if not arg["written"]:
            continue
        want = np.load(os.path.join(a.dir, f"arg{i}_post.npy"))
        got = np.empty_like(want)
        ck("cuMemcpyDtoH_v2")(got.ctypes.data_as(ctypes.c_void_p), p, ctypes.c_size_t(got.size))
        if want.size % 4 == 0:
            w, gv = want.view(np.float32), got.view(np.float32)
            ok = np.isfinite(w)
            den = np.maximum(np.abs(w[ok]), 1e-6)
            rel = float(np.max(np.abs(gv[ok] - w[ok]) / den)) if ok.any() else 0.0
        else:
            rel = 0.0 if np.array_equal(want, got) else float("inf")
        worst = max(worst, rel)
    times = []
    start, end = ctypes.c_void_p(), ctypes.c_void_p()
    ck("cuEventCreate")(ctypes.byref(start), 0)
    ck("cuEventCreate")(ctypes.byref(end), 0)
    for _ in range(a.reps):
        upload()
        ck("cuEventRecord")(start, None)
        launch()
        ck("cuEventRecord")(end, None)
        ck("cuEventSynchronize")(end)
        ms = ctypes.c_float()
        ck("cuEventElapsedTime")(ctypes.byref(ms), start, end)
        times.append(ms.value * 1e-3)
    res = {"kernel": meta["kernel"], "side": meta["side"], "spec": meta["spec"],
           "configs": meta["configs"], "grid": grid, "block": block, "registers": regs.value,
           "static_shared_bytes": smem.value, "max_rel_diff_vs_opencl": worst,
           "replay_seconds": times, "opencl_seconds": meta["cl_seconds"]}
    print(json.dumps(res))
    if worst > a.tolerance:
        raise SystemExit(f"replay differs from the OpenCL launch: {worst:.3e} > {a.tolerance}")


# --------------------------------------------------------------------------------- summaries

METRICS = (
    "gpu__time_duration.sum", "sm__cycles_active.avg", "sm__cycles_elapsed.avg",
    "sm__inst_executed.avg.per_cycle_active", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct", "l1tex__t_sector_hit_rate.pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__occupancy_limit_registers", "launch__registers_per_thread",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
    "lts__t_bytes.sum.per_second", "dram__bytes.sum.per_second",
)


def _num(x):
    """A counter's value as a float (Nsight writes thousands separators)."""
    return float(str(x).replace(",", "") or 0)


def summarize(raw):
    """Lines of key counters and warp stall reasons per kernel of ``ncu --page raw --csv``."""
    import csv
    import io
    rows = list(csv.reader(io.StringIO(raw)))
    if len(rows) < 3:
        return [raw]
    head, units, data = rows[0], rows[1], rows[2:]
    col = {h: j for j, h in enumerate(head)}
    out = []
    for d in data:
        out.append(f"== {d[col['Kernel Name']] if 'Kernel Name' in col else '?'}")
        out += [f"  {k} = {d[col[k]]} {units[col[k]]}" for k in METRICS if k in col]
        act, ela = col.get("sm__cycles_active.avg"), col.get("sm__cycles_elapsed.avg")
        if act is not None and ela is not None and _num(d[ela]) > 0:
            # the share of the launch's cycles the SMs had work: the rest is its tail
            out.append(f"  SMs active {_num(d[act]) / _num(d[ela]):.1%} of the elapsed cycles")
        stalls = [(_num(d[j]), h) for h, j in col.items()
                  if h.startswith("smsp__average_warp_latency_issue_stalled_")
                  or h.startswith("smsp__pcsamp_warps_issue_stalled_")]
        out += [f"  stall {h} = {v:g}" for v, h in sorted(stalls, reverse=True)[:12] if v > 0]
    return out


def summary(a):
    """The report's key counters and the warp stall reasons, as text."""
    raw = subprocess.run([a.ncu or "ncu", "--import", a.report, "--page", "raw", "--csv"],
                         capture_output=True, text=True, check=True).stdout
    print("\n".join(summarize(raw)))


def main(argv=None):
    """The command line: capture, replay or summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("--device", default="gpu")
    c.add_argument("--data", default="netflix")
    c.add_argument("--scale", type=float, default=1.0)
    c.add_argument("--cells", default="implicit:256",
                   help="';'-separated MODE:F[:VARIANT] (default variant: auto)")
    c.add_argument("--kernels", default="s3_fcg,s1_hermitian")
    c.add_argument("--alpha", type=float, default=2.0)
    c.add_argument("--regularization", type=float, default=0.05)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", required=True)
    r = sub.add_parser("replay")
    r.add_argument("dir")
    r.add_argument("--reps", type=int, default=1)
    r.add_argument("--tolerance", type=float, default=1e-4)
    s = sub.add_parser("summary")
    s.add_argument("report")
    s.add_argument("--ncu", default=None)
    a = p.parse_args(argv)
    {"capture": capture, "replay": replay, "summary": summary}[a.cmd](a)


if __name__ == "__main__":
    main()
