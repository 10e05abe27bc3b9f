#!/usr/bin/env python3
"""Registers, spills and work-group limits of the ALS kernels of configurations on an NVIDIA
device (the build log of ``-cl-nv-verbose``: ptxas' per-kernel report).

    python scripts/archive/nv_regs.py -f 100 --variant "batch+vec4+mma:tx=7,nnz_batch=32,solver=cg"
"""
from __future__ import annotations

import argparse
import re


def main(argv=None):
    """Print ptxas' report for each (variant, f)."""
    import pyopencl as cl

    import clmf.engine.kernels as K
    from clmf.engine.config import KernelConfig
    from clmf.engine.device import device_info, select_device

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("-f", "--factors", type=int, nargs="+", default=[100])
    ap.add_argument("--variant", nargs="+", required=True)
    ap.add_argument("--implicit", action="store_true")
    ap.add_argument("--kernel", default="s1", help="kernel name prefix (e.g. s3_fcg)")
    a = ap.parse_args(argv)
    dev = select_device(a.device)
    info = device_info(dev)
    ctx = cl.Context([dev])
    for f in a.factors:
        for v in a.variant:
            cfg = KernelConfig.parse(v)
            try:
                K.validate(cfg, f, info)
            except Exception as e:                      # noqa: BLE001 - report and go on
                print(f"f={f} {v}: invalid ({e})")
                continue
            src = K.render_als(cfg, f, info, a.implicit)
            opts = list(K.BUILD_OPTIONS) + ["-cl-nv-verbose"]
            prg = cl.Program(ctx, src).build(options=opts)
            log = prg.get_build_info(dev, cl.program_build_info.LOG)
            for k in prg.all_kernels():
                if not k.function_name.startswith(a.kernel):
                    continue
                wg = k.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, dev)
                priv = k.get_work_group_info(cl.kernel_work_group_info.PRIVATE_MEM_SIZE, dev)
                m = re.search(rf"Compiling entry function '{k.function_name}'.*?Used (\d+) "
                              r"registers[^\n]*", log, re.S)
                print(f"f={f} {v} {k.function_name} {' '.join(opts[1:-1])}: max work-group {wg}, "
                      f"private {priv} B, "
                      f"{m.group(0).splitlines()[-1].strip() if m else 'no ptxas line'}")


if __name__ == "__main__":
    main()
