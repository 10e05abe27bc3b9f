#!/usr/bin/env python3
"""Registers, spills and occupancy of clmf's kernels as the device's compiler built them.

For each (mode, f, variant) this builds the ALS program clmf would build on the device and
records per kernel the work-group limit the driver reports (on NVIDIA it falls below the device's
maximum when a work-item's registers cap it), the private (spilled / stack) memory per work-item
and the local memory the kernel uses. On NVIDIA the program's binary is PTX: it is written to
``OUT/ptx/`` and, where ``ptxas`` is on the machine, compiled with ``-v`` for the target's
registers and spill stores/loads per kernel (``OUT/kernel_resources.jsonl``, one line per kernel).

    python3 benchmarks/kernel_resources.py --device gpu --out $OUT \
        --cells "implicit:256:batch+vec4:solver=fusedcg,fused_dims=1,dims_q=4,solve_wg=256"
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess


def parse(argv=None):
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="gpu")
    p.add_argument("--out", required=True)
    p.add_argument("--cells", required=True,
                   help="';'-separated MODE:F:VARIANT (mode explicit, implicit or biased)")
    return p.parse_args(argv)


def find_ptxas():
    """The ptxas binary, if the machine has one (PATH, CUDA_HOME, /usr/local/cuda*, pip's nvidia
    packages)."""
    hit = shutil.which("ptxas")
    if hit:
        return hit
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *glob.glob("/usr/local/cuda-*")]
    for r in roots:
        if r and os.path.exists(os.path.join(r, "bin", "ptxas")):
            return os.path.join(r, "bin", "ptxas")
    hits = glob.glob("/usr/**/site-packages/nvidia/**/bin/ptxas", recursive=True)
    return hits[0] if hits else None


def ptxas_report(ptxas, path, arch):
    """ptxas -v's per-kernel lines: {kernel: {registers, spill_stores, spill_loads, stack}}."""
    r = subprocess.run([ptxas, "-v", f"-arch={arch}", path, "-o", os.devnull],
                       capture_output=True, text=True, timeout=300)
    out, cur = {}, None
    for line in (r.stdout + r.stderr).splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = out.setdefault(m.group(1), {})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m:
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                       spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["registers"] = int(m.group(1))
    if not out:
        out["_error"] = (r.stdout + r.stderr)[-500:]
    return out


def main(argv=None):
    """Build every cell's program and record its kernels' resources."""
    a = parse(argv)
    os.makedirs(os.path.join(a.out, "ptx"), exist_ok=True)
    import pyopencl as cl

    from clmf.engine.config import KernelConfig
    from clmf.engine.device import device_info, select_devices
    from clmf.engine.kernels import als_program, ptx_supported
    dev = select_devices(a.device)[0]
    info = device_info(dev)
    ctx = cl.Context([dev])
    ptxas = find_ptxas() if ptx_supported(info) else None
    cc = getattr(info, "compute_capability", None) or (9, 0)
    arch = f"sm_{cc[0]}{cc[1]}"
    path = os.path.join(a.out, "kernel_resources.jsonl")
    for i, cell in enumerate(c for c in a.cells.split(";") if c.strip()):
        mode, f, variant = cell.split(":", 2)
        f = int(f)
        row = {"mode": mode, "f": f, "variant": variant}
        try:
            cfg = KernelConfig.parse(variant)
            prog = als_program(ctx, dev, cfg, f, info, implicit=mode == "implicit",
                               biased=mode == "biased")
        except Exception as e:
            row["status"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            with open(path, "a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(row, flush=True)
            continue
        kinfo = cl.kernel_work_group_info
        ptx = None
        try:
            binary = bytes(prog.program.get_info(cl.program_info.BINARIES)[0]).rstrip(b"\0")
            if binary[:200].find(b".version") >= 0 or binary[:200].find(b"//") >= 0:
                ptx = os.path.join(a.out, "ptx", f"cell{i}-{mode}-f{f}.ptx")
                with open(ptx, "wb") as fh:
                    fh.write(binary)
        except Exception:
            pass
        regs = ptxas_report(ptxas, ptx, arch) if (ptxas and ptx) else {}
        for name, k in prog.kernels.items():
            r = dict(row, kernel=name, status="ok")
            for key, what in (("wg_limit", kinfo.WORK_GROUP_SIZE),
                              ("private_bytes", kinfo.PRIVATE_MEM_SIZE),
                              ("local_bytes", kinfo.LOCAL_MEM_SIZE)):
                try:
                    r[key] = int(k.get_work_group_info(what, dev))
                except Exception as e:
                    r[key] = f"{type(e).__name__}"
            r.update(regs.get(name, {}))
            if "_error" in regs:
                r["ptxas_error"] = regs["_error"]
            with open(path, "a") as fh:
                fh.write(json.dumps(r) + "\n")
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
