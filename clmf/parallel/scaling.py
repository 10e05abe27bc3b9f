"""Timing fits on 1..N devices: the scaling table of ``clmf bench --scaling`` and the runs of
``benchmarks/scale_runs.py`` (seconds per iteration, speedup, exchange share, streamed copies)."""
from __future__ import annotations

import logging
import time

import numpy as np

from .layout import Layout

log = logging.getLogger(__name__)

__all__ = ["configs_for", "timed_fit", "scaling_rows", "render_scaling"]


def configs_for(devices, layout, f, solver="auto", regularization=0.05):
    """Each device's tuned configuration pair (the estimator's own lookup,
    :func:`clmf.tuning.resolve`)."""
    from ..tuning import FitSpec, resolve, side_stats
    m, n = layout.shape
    stats = {"users": side_stats(layout.users.counts(), n),
             "items": side_stats(layout.items.counts(), m)}
    spec = FitSpec.of({"factors": f, "regularization": regularization, "solver": solver})
    out = []
    for d in devices:
        ch = resolve(spec, d, stats)
        out.append((ch["users"].config, ch["items"].config))
    return out


def _build(devices, data, layout, f, cfgs, single, max_device_memory, modes, reduce_sum=None):
    """The timed backend: one device's engine (``single`` or one device, nothing forced) or a
    :class:`MultiEngine` (``reduce_sum``: its reduce's sums, None the default)."""
    import scipy.sparse as sp

    from .backend import MultiEngine, make_backend
    if single is True or (single is None and len(devices) == 1 and max_device_memory is None
                          and modes is None):
        R = (data if not isinstance(data, Layout) else
             sp.csr_matrix((layout.users.data, layout.users.indices, layout.users.indptr),
                           shape=layout.shape))
        return make_backend(devices[:1], R, f, cfgs[:1], profile=True)
    extra = {} if reduce_sum is None else {"reduce_sum": reduce_sum}
    return MultiEngine(devices, layout, f, cfgs, max_device_memory=max_device_memory,
                       profile=True, modes=modes, **extra)


def sample_triples(layout, k=1_000_000, seed=0):
    """``k`` random training ratings as (users, items, ratings) (a cheap RMSE check)."""
    rng = np.random.default_rng(seed)
    e = np.sort(rng.integers(0, layout.nnz, size=min(k, layout.nnz)))
    u = np.searchsorted(layout.users.indptr, e, side="right") - 1
    return (u.astype(np.int32), np.asarray(layout.users.indices[e]),
            np.asarray(layout.users.data[e]))


def timed_fit(devices, data, f, iterations=5, budget_s=120.0, single=None,
              max_device_memory=None, modes=None, regularization=0.05, say=None, label="",
              configs=None, reduce_sum=None):
    """Build the backend of a fit of ``data`` (a Layout or a scipy CSR) on ``devices``, run a
    warm-up iteration and up to ``iterations`` timed ones within ``budget_s``.

    ``single``: True forces the single-device engine, False the multi-device one, None lets
    :func:`clmf.parallel.make_backend` choose. Returns a dict: backend, build and warm-up
    seconds, per-iteration seconds and their median ``s_per_it``, the split (compute, exchange
    tail, device busy times), memory plan, configurations and a sampled train RMSE. A
    looked-up configuration that the device's kernel limits refuse is rejected and the lookup
    asked again, as a fit does (``configs`` given: refused). ``reduce_sum``: a
    :class:`MultiEngine`'s reduce sums (``"device"`` or ``"host"``; None: its default)."""
    from .. import reference
    from ..engine.core import Engine
    from ..engine.device import device_info
    from ..errors import InvalidConfigError
    from ..tuning import fallback
    from .backend import MultiEngine
    say = say or (lambda msg: log.info("%s", msg))
    layout = data if isinstance(data, Layout) else Layout.from_csr(data)
    t0 = time.time()
    given = configs is not None
    cfgs = configs or configs_for(devices, layout, f, regularization=regularization)
    for _attempt in range(8):
        try:
            eng = _build(devices, data, layout, f, cfgs, single, max_device_memory, modes,
                         reduce_sum)
            break
        except InvalidConfigError as e:
            if given:
                raise                 # the caller's configurations: refused, not replaced
            # a looked-up configuration the device's kernel limits refuse: rejected (one
            # warning, as a fit does) and the lookup asked again
            k = int(getattr(e, "device_index", 0) or 0)
            side = getattr(e, "side", None)
            bad = ([cfgs[k][0 if side == "users" else 1]] if side in ("users", "items")
                   else list(dict.fromkeys(cfgs[k])))
            for cfg in bad:
                fallback.reject(device_info(devices[k]), cfg, f, "explicit",
                                "the scaling benchmark's lookup", e)
            cfgs = configs_for(devices, layout, f, regularization=regularization)
    else:
        raise RuntimeError("no configuration of the lookup could be built")
    kind = type(eng).__name__
    out = {"backend": kind, "build_s": time.time() - t0,
           "memory": {k: v for k, v in eng.memory.items()
                      if k in ("total", "streamed", "per_device")},
           "configs": [[str(a), str(b)] for a, b in cfgs[:len(devices)]]}
    say(f"{label}: {kind} built in {out['build_s']:.1f} s")
    if isinstance(eng, MultiEngine):
        out["plan"] = eng.plan.describe()
        out["device_plans"] = [p.describe() for p in eng.dplans]
        say(f"{label}: {out['plan']}; " + " | ".join(out["device_plans"]))
    try:
        m, n = layout.shape
        X0, Y0 = reference.start_factors(m, n, f, 0)
        eng.set_factors("users", X0)
        eng.set_factors("items", Y0)
        del X0, Y0
        eng.finish()
        t = time.time()
        eng.iteration(regularization, True)
        eng.finish()
        out["warmup_s"] = time.time() - t
        say(f"{label}: warm-up iteration {out['warmup_s']:.3f} s")
        if isinstance(eng, MultiEngine):
            eng.reset_times()
        elif isinstance(eng, Engine):
            eng.stage_times = {k: 0.0 for k in eng.stage_times}
        times = []
        start = time.time()
        for it in range(iterations):
            t = time.time()
            eng.iteration(regularization, True)
            eng.finish()
            times.append(time.time() - t)
            say(f"{label}: iteration {it + 1}: {times[-1]:.4f} s")
            if time.time() - start + times[-1] > budget_s:
                say(f"{label}: time budget reached")
                break
        out["iter_s"] = times
        out["s_per_it"] = float(np.median(times))
        if isinstance(eng, MultiEngine):
            out["split"] = eng.time_split()
        else:
            out["split"] = {"wall": float(np.mean(times)), "exchange": 0.0,
                            **{k: v / len(times) for k, v in eng.stage_times.items()}}
        u, i, r = sample_triples(layout)
        se, cnt = eng.squared_error("sample", u, i, r)
        out["train_rmse_sample"] = float(np.sqrt(se / cnt))
        say(f"{label}: {out['s_per_it']:.4f} s/it, split {out['split']}, "
            f"sample RMSE {out['train_rmse_sample']:.4f}")
    finally:
        eng.release()
    return out


def scaling_rows(devices, data, f, iterations=5, budget_s=60.0, say=None):
    """Time the fit on the first 1, 2, …, N devices; rows with s/it, speedup over one device,
    efficiency and the exchange share of an iteration."""
    rows = []
    base = None
    for k in range(1, len(devices) + 1):
        res = timed_fit(devices[:k], data, f, iterations, budget_s, say=say,
                        label=f"f={f} on {k} device(s)")
        s = res["s_per_it"]
        base = base or s
        split = res.get("split", {})
        rows.append({"devices": k, "f": f, "s_per_it": s, "speedup": base / s,
                     "efficiency": base / s / k,
                     "exchange_share": (split.get("exchange", 0.0)
                                        / max(split.get("wall", s), 1e-12)),
                     "backend": res["backend"], "plan": res.get("plan", "")})
    return rows


def render_scaling(rows, title="Scaling"):
    """A markdown table of :func:`scaling_rows` output."""
    out = [f"### {title}", "", "| devices | f | s/it | speedup | efficiency | exchange share | "
           "backend |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['devices']} | {r['f']} | {r['s_per_it']:.4f} | {r['speedup']:.2f}× | "
                   f"{r['efficiency']:.0%} | {r['exchange_share']:.0%} | {r['backend']} |")
    return "\n".join(out) + "\n"


def cmd_scaling(args, load, argv=None):
    """``clmf bench --scaling DEVICES``: for each data set and f, time the fit on the first
    1..N devices; write ``scaling-<time>.md`` and ``.json`` in the output folder."""
    import datetime
    import json
    import pathlib

    from ..engine.device import device_info, device_label, select_devices, spec_from_text
    from ..provenance import commit
    devices = select_devices(spec_from_text(args.scaling))
    infos = [device_info(d) for d in devices]
    when = datetime.datetime.now(datetime.timezone.utc)
    out = pathlib.Path(args.out or pathlib.Path("results") / "bench" / "scaling")
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or f"scaling-{when.strftime('%Y%m%dT%H%M%SZ')}"
    rows = []
    parts = [f"# clmf scaling {when.isoformat(timespec='seconds')}", "",
             f"commit {commit()}; command `clmf bench {' '.join(argv or [])}`", "",
             "devices: " + "; ".join(f"{device_label(i)} (driver {i.driver})"
                                     for i in infos), ""]
    for data_spec in args.data or ["ml-100k"]:
        R = load(data_spec)
        for f in args.factors:
            got = scaling_rows(devices, R, f, iterations=args.iterations, say=print)
            for r in got:
                r["data"] = data_spec
            rows += got
            parts.append(render_scaling(got, f"{data_spec}, f = {f} ({R.nnz:,} ratings)"))
    (out / f"{name}.md").write_text("\n".join(parts))
    (out / f"{name}.json").write_text(json.dumps({"date": when.isoformat(), "commit": commit(),
                                                  "argv": argv, "rows": rows}, indent=1))
    print("\n".join(parts))
    print(f"wrote {out / (name + '.md')}")
    return 0
