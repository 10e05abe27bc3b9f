"""The device memory plan of a fit: rows per launch within the scratch budget and the bytes
allocated on the device."""
from __future__ import annotations

__all__ = ["memory_estimate", "choose_batch_rows"]

_SCRATCH_BUDGET = 512 << 20     # default cap on per-side hermitian scratch
_MAX_BATCH_ROWS = 1 << 16


def choose_batch_rows(config, f, rows, info, budget=None):
    """Rows per launch: the config's ``batch_rows`` or what fits the scratch budget, ≥ 1."""
    per_row = 4 * (f * f + f)
    cap = min(info.max_alloc, budget or _SCRATCH_BUDGET, max(per_row, info.global_mem // 8))
    fit = max(1, cap // per_row)
    want = config.batch_rows or _MAX_BATCH_ROWS
    return int(max(1, min(want, fit, rows)))


def memory_estimate(users, items, f, configs, batch_rows):
    """Bytes clmf allocates on the device for a fit (dict with a 'total')."""
    est = {}
    est["csr"] = users.nbytes() + items.nbytes()
    for side, cfg, rows in (("users", configs[0], users.rows), ("items", configs[1], items.rows)):
        itemsize = 2 if cfg.storage == "float16" else 4
        est[f"factors_{side}"] = rows * cfg.ldf(f) * itemsize
        est[f"scratch_{side}"] = batch_rows[side] * 4 * (f * f + f)
    est["status"] = 16
    est["total"] = sum(est.values())
    return est
