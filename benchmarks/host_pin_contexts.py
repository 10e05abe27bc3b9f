#!/usr/bin/env python3
"""Which host memory each device of a multi-device fit copies to and from at the bus's speed
without blocking its thread (issue 28: on four H100s the devices other than the first waited
in their D2H copies' enqueue calls, the exchange's host arrays being page-locked in the first
device's context only).

For each device (its own context, as a multi-device fit makes them) and each kind of host
array, ``--chunks`` non-blocking copies of ``--megabytes`` in all, device → host then host →
device, from one thread: the host's time inside the enqueue calls, the wall time until all
ended, GB/s; then the same with every device copying at once from a thread of its own. Kinds:

- ``pageable``: a NumPy array;
- ``pin0``: page-locked in the first device's context (what the exchange uses today);
- ``pin_own``: page-locked in the copying device's own context;
- ``pin0_reg``: ``pin0`` with a ``USE_HOST_PTR`` buffer over it made in the copying device's
  context (whether the driver then treats the pages as page-locked there too);
- ``pageable_reg``: ``pageable`` with such a buffer.

    python3 benchmarks/host_pin_contexts.py OUT --devices gpu --megabytes 48 --chunks 12

Writes OUT/host_pin_contexts.json and OUT/host_pin_contexts.md.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import threading
import time

import numpy as np


def copies(cl, queue, dev_buf, host, chunks, to_host):
    """Enqueue ``chunks`` non-blocking copies between ``dev_buf`` and ``host`` (uint8) and wait:
    ``(seconds inside the enqueue calls, wall seconds, longest single enqueue)``."""
    n = host.nbytes // chunks
    t0 = time.perf_counter()
    inside, longest, evs = 0.0, 0.0, []
    for c in range(chunks):
        a = c * n
        t = time.perf_counter()
        if to_host:
            ev = cl.enqueue_copy(queue, host[a:a + n], dev_buf, src_offset=a, is_blocking=False)
        else:
            ev = cl.enqueue_copy(queue, dev_buf, host[a:a + n], dst_offset=a, is_blocking=False)
        dt = time.perf_counter() - t
        inside += dt
        longest = max(longest, dt)
        evs.append(ev)
    cl.wait_for_events(evs)
    return inside, time.perf_counter() - t0, longest


def main(argv=None):
    """Measure; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--devices", default="gpu")
    ap.add_argument("--megabytes", type=int, default=48)
    ap.add_argument("--chunks", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    import pyopencl as cl

    from clmf.engine.device import device_info, get_context
    from clmf.engine.upload import pinned_array, wrap_host
    from clmf.parallel import select_devices
    devs = select_devices(f"{args.devices}:all")
    ctxs = [get_context(d)[0] for d in devs]
    queues = [cl.CommandQueue(c) for c in ctxs]
    nbytes = args.megabytes << 20
    nbytes -= nbytes % args.chunks
    mf = cl.mem_flags
    dev_bufs = [cl.Buffer(c, mf.READ_WRITE, size=nbytes) for c in ctxs]
    keep = []

    def host_for(kind, d):
        """A host array of ``kind`` for device ``d``."""
        if kind in ("pageable", "pageable_reg"):
            h = np.zeros(nbytes, np.uint8)
        else:
            owner = 0 if kind.startswith("pin0") else d
            buf, h = pinned_array(ctxs[owner], queues[owner], (nbytes,), np.uint8)
            keep.append(buf)
        if kind.endswith("_reg"):
            keep.append(wrap_host(ctxs[d], h))
        return h

    kinds = ("pageable", "pin0", "pin_own", "pin0_reg", "pageable_reg")
    rows = []
    for kind in kinds:
        hosts = [host_for(kind, d) for d in range(len(devs))]
        for to_host in (True, False):
            for d in range(len(devs)):           # one device at a time
                runs = [copies(cl, queues[d], dev_bufs[d], hosts[d], args.chunks, to_host)
                        for _ in range(args.repeats + 1)][1:]
                rows.append({"kind": kind, "dir": "d2h" if to_host else "h2d", "device": d,
                             "together": False,
                             "enqueue_ms": statistics.median(r[0] for r in runs) * 1e3,
                             "longest_us": statistics.median(r[2] for r in runs) * 1e6,
                             "wall_ms": statistics.median(r[1] for r in runs) * 1e3,
                             "gbs": nbytes / statistics.median(r[1] for r in runs) / 1e9})
            if len(devs) > 1:                    # all devices at once, a thread each
                for _rep in range(args.repeats + 1):
                    res = [None] * len(devs)

                    def one(d, res=res, to_host=to_host, hosts=hosts):
                        """Device ``d``'s copies."""
                        res[d] = copies(cl, queues[d], dev_bufs[d], hosts[d], args.chunks,
                                        to_host)
                    ts = [threading.Thread(target=one, args=(d,)) for d in range(len(devs))]
                    t = time.perf_counter()
                    for th in ts:
                        th.start()
                    for th in ts:
                        th.join()
                    wall = time.perf_counter() - t
                for d in range(len(devs)):
                    rows.append({"kind": kind, "dir": "d2h" if to_host else "h2d", "device": d,
                                 "together": True, "enqueue_ms": res[d][0] * 1e3,
                                 "longest_us": res[d][2] * 1e6, "wall_ms": res[d][1] * 1e3,
                                 "gbs": nbytes / res[d][1] / 1e9, "all_wall_ms": wall * 1e3})
        print(kind, "done", flush=True)
    info = device_info(devs[0])
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec = {"device": f"{info.platform} | {info.name}", "driver": info.driver,
           "devices": len(devs), "megabytes": args.megabytes, "chunks": args.chunks,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": " ".join(["python"] + sys.argv), "rows": rows}
    (out / "host_pin_contexts.json").write_text(json.dumps(rec, indent=1))
    lines = [f"# Host memory kinds per device context: {len(devs)} × {info.name} "
             f"({info.driver}), {args.megabytes} MB in {args.chunks} copies\n",
             f"{rec['date']}\n\n    {rec['command']}\n",
             "Medians of the repeats (alone) or the last repeat (together); ms.\n",
             "| kind | dir | device | together | enqueue ms | longest enqueue µs | wall ms "
             "| GB/s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kind']} | {r['dir']} | {r['device']} | {r['together']} | "
                     f"{r['enqueue_ms']:.2f} | {r['longest_us']:.0f} | {r['wall_ms']:.2f} | "
                     f"{r['gbs']:.1f} |")
    (out / "host_pin_contexts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
