"""The synthetic generator: seeded low-rank-plus-noise ratings with power-law user activity
and item popularity, in the shapes of the data sets of the clMF paper (:func:`list_presets`)."""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import re
import time
from typing import NamedTuple

import numpy as np

from .ratings import Ratings

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# synthetic data
# --------------------------------------------------------------------------------------
_PRESETS: dict[str, tuple[int, int, int]] = {
    # name: (users, items, ratings) -- the data sets of the clMF paper's Table 1
    "movielens-100k": (943, 1_682, 100_000),
    "movielens-10m": (71_567, 65_133, 10_000_054),
    "movielens-20m": (138_493, 26_744, 20_000_263),
    "netflix": (480_189, 17_770, 99_072_112),
    "yahoomusic-r1": (1_948_882, 98_213, 115_579_440),
    "yahoomusic-r4": (7_642, 11_916, 211_231),
    "delicious": (1_867, 69_226, 104_799),
    # the scaling runs' shapes (issue 14): cuMF's Hugewiki and four times Netflix; at full
    # size build them with clmf.parallel.synthetic_layout (block by block, no whole COO)
    "hugewiki": (50_082_604, 39_780, 3_101_144_313),
    "netflix-4x": (1_920_756, 71_080, 396_288_448),
}

_MAX_DENSITY = 0.5
_CHUNK_NNZ = 1 << 19
_HEAVY_FRACTION = 1 / 8
_MAX_ROUNDS = 40
_DOT_BLOCK = 1 << 16


class SyntheticFactors(NamedTuple):
    """The true model behind :func:`synthetic` data (before rounding, clipping and noise).

    ``rating ~ clip(round(global_mean + user_bias[u] + item_bias[i] + user_factors[u] @
    item_factors[i] + noise), 1, 5)``.

    Attributes
    ----------
    user_factors : numpy.ndarray
        ``(n_users, rank)`` float32.
    item_factors : numpy.ndarray
        ``(n_items, rank)`` float32.
    user_bias : numpy.ndarray
        ``(n_users,)`` float32.
    item_bias : numpy.ndarray
        ``(n_items,)`` float32.
    global_mean : float
        The global offset.
    item_popularity : numpy.ndarray
        ``(n_items,)`` float64 sampling probabilities of the items.

    Examples
    --------
    >>> r, f = synthetic(shape=(20, 30), nnz=100, return_factors=True)
    >>> f.user_factors.shape, f.item_factors.shape
    ((20, 8), (30, 8))
    """

    user_factors: np.ndarray
    item_factors: np.ndarray
    user_bias: np.ndarray
    item_bias: np.ndarray
    global_mean: float
    item_popularity: np.ndarray


def _fmt_count(x: int) -> str:
    for div, suf in ((1e6, "M"), (1e3, "K")):
        if x >= div:
            return f"{x / div:.3g}{suf}"
    return str(int(x))


def synthetic_from_spec(spec: str, seed: int = 0) -> tuple[Ratings, str] | None:
    """``(ratings, name)`` of a ``synthetic:USERSxITEMSxRATINGS`` spec (the benchmark's and the
    tuner's data-set syntax, e.g. ``synthetic:200000x10000x4450000`` → ``synthetic-200Kx10Kx4.45M``),
    or None when ``spec`` is not one."""
    m = re.fullmatch(r"synthetic:(\d+)x(\d+)x(\d+)", str(spec).strip())
    if not m:
        return None
    u, i, z = (int(g) for g in m.groups())
    data = synthetic(shape=(u, i), nnz=z, seed=seed)
    return data, f"synthetic-{_fmt_count(u)}x{_fmt_count(i)}x{_fmt_count(z)}"


def list_presets() -> dict[str, tuple[int, int, int]]:
    """The synthetic presets: name -> (n_users, n_items, n_ratings) at ``scale=1``.

    The shapes are those of the data sets of the clMF paper's Table 1.

    Returns
    -------
    dict
        A copy; changing it changes nothing.

    Examples
    --------
    >>> list_presets()["movielens-100k"]
    (943, 1682, 100000)
    """
    return dict(_PRESETS)


def _power_weights(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Zipf-like probabilities ``rank**-exponent`` assigned to a random permutation."""
    w = np.arange(1, n + 1, dtype=np.float64) ** (-float(exponent))
    w = w[rng.permutation(n)]
    return w / w.sum()


def _multinomial(rng: np.random.Generator, total: int, p: np.ndarray) -> np.ndarray:
    p = p / p.sum()
    # numpy requires sum(p[:-1]) <= 1; guard the rounding
    p = np.clip(p, 0, None)
    p[-1] = max(0.0, 1.0 - p[:-1].sum())
    return rng.multinomial(total, p).astype(np.int64)


def _user_counts(rng, nnz: int, m: int, cap: int, exponent: float) -> np.ndarray:
    """Per-user rating counts: >= 1 each, <= cap each, power-law distributed, sum nnz."""
    p = _power_weights(m, exponent, rng)
    counts = 1 + _multinomial(rng, nnz - m, p)
    for _ in range(1000):
        over = counts > cap
        if not over.any():
            break
        excess = int((counts[over] - cap).sum())
        counts[over] = cap
        free = counts < cap
        pf = np.where(free, p, 0.0)
        counts += _multinomial(rng, excess, pf)
    else:  # pragma: no cover - cannot happen while nnz <= m * cap
        raise RuntimeError("could not distribute ratings over users")
    return counts


def alias_table(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker alias table for O(1) sampling from ``p``."""
    n = len(p)
    q = p * n
    alias = np.arange(n, dtype=np.int32)
    small = list(np.flatnonzero(q < 1.0))
    large = list(np.flatnonzero(q >= 1.0))
    q = q.copy()
    while small and large:
        s = small.pop()
        g = large.pop()
        alias[s] = g
        q[g] -= 1.0 - q[s]
        (small if q[g] < 1.0 else large).append(g)
    for k in small + large:
        q[k] = 1.0
    return q, alias


def _draw_items(rng, size: int, n: int, q: np.ndarray, alias: np.ndarray) -> np.ndarray:
    x = rng.random(size) * n
    j = x.astype(np.int32)
    np.minimum(j, n - 1, out=j)
    x -= j
    return np.where(x < q[j], j, alias[j])


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """Sorted unique values by sort + adjacent compare (faster than hash-based np.unique)."""
    a = np.sort(a)
    if a.size > 1:
        keep = np.empty(a.size, dtype=bool)
        keep[0] = True
        np.not_equal(a[1:], a[:-1], out=keep[1:])
        a = a[keep]
    return a


def _in_sorted(keys: np.ndarray, sorted_arr: np.ndarray) -> np.ndarray:
    if sorted_arr.size == 0 or keys.size == 0:
        return np.zeros(keys.shape, dtype=bool)
    pos = np.searchsorted(sorted_arr, keys)
    np.minimum(pos, sorted_arr.size - 1, out=pos)
    return sorted_arr[pos] == keys


def _exact_sample(rng, users, counts, n, inv_pop, exclude_keys=None) -> np.ndarray:
    """Weighted sampling without replacement (Efraimidis-Spirakis) for a few users.

    Returns sorted int64 keys ``user * n + item``; ``exclude_keys`` (sorted) are avoided.
    """
    out = []
    batch = max(1, (1 << 21) // max(n, 1))
    for b0 in range(0, len(users), batch):
        bu = users[b0: b0 + batch]
        bc = counts[b0: b0 + batch]
        e = rng.standard_exponential((len(bu), n)) * inv_pop[None, :]
        if exclude_keys is not None and exclude_keys.size:
            lo = np.searchsorted(exclude_keys, bu.astype(np.int64) * n)
            hi = np.searchsorted(exclude_keys, (bu.astype(np.int64) + 1) * n)
            for r_, (a, b) in enumerate(zip(lo, hi)):
                e[r_, (exclude_keys[a:b] - bu[r_].astype(np.int64) * n)] = np.inf
        for r_, (u, c) in enumerate(zip(bu, bc)):
            c = int(c)
            if c <= 0:
                continue
            if c >= n:
                chosen = np.arange(n)
            else:
                chosen = np.argpartition(e[r_], c - 1)[:c]
            out.append(np.int64(u) * n + np.sort(chosen).astype(np.int64))
    return np.concatenate(out) if out else np.empty(0, np.int64)


def _chunk_pairs(rng, u0: int, counts: np.ndarray, n: int, q, alias, inv_pop) -> np.ndarray:
    """Unique sorted keys ``user*n+item`` for users ``u0 .. u0+len(counts)-1``."""
    k = len(counts)
    users = np.arange(u0, u0 + k, dtype=np.int64)
    heavy = counts > max(8, int(n * _HEAVY_FRACTION))
    parts = []
    if heavy.any():
        parts.append(_exact_sample(rng, users[heavy], counts[heavy], n, inv_pop))
    light = ~heavy
    lu, lc = users[light], counts[light]
    if lu.size:
        rows = np.repeat(lu, lc)
        big = _sorted_unique(rows * n + _draw_items(rng, rows.size, n, q, alias))
        del rows
        have = np.bincount(big // n - u0, minlength=k)[light]
        short = lc - have
        extra = np.empty(0, np.int64)
        for _ in range(_MAX_ROUNDS):
            act = short > 0
            if not act.any():
                break
            rows = np.repeat(lu[act], short[act])
            cand = _sorted_unique(rows * n + _draw_items(rng, rows.size, n, q, alias))
            cand = cand[~_in_sorted(cand, big)]
            cand = cand[~_in_sorted(cand, extra)]
            extra = np.sort(np.concatenate([extra, cand]), kind="stable")
            short -= np.bincount(cand // n - u0, minlength=k)[light]
        if (short > 0).any():
            act = short > 0
            excl = np.sort(np.concatenate([big, extra]), kind="stable")
            extra = np.concatenate([extra, _exact_sample(rng, lu[act], short[act], n, inv_pop, excl)])
        parts += [big, extra]
    # parts are sorted runs: the stable sort (timsort) merges them in near-linear time
    return np.sort(np.concatenate(parts), kind="stable")


def synthetic(
    preset: str = "movielens-100k",
    *,
    scale: float = 1.0,
    seed: int | np.random.Generator | None = 0,
    rank: int = 8,
    noise: float = 0.5,
    return_factors: bool = False,
    shape: tuple[int, int] | None = None,
    nnz: int | None = None,
    user_exponent: float = 0.6,
    item_exponent: float = 0.5,
    timestamps: bool = False,
    n_jobs: int | None = None,
):
    """Seeded synthetic ratings: low rank plus noise, power-law users and items.

    Ratings are ``clip(round(mu + b_u + b_i + p_u . q_i + e), 1, 5)`` as float32 with
    ``e ~ N(0, noise**2)``. Each user's number of ratings follows a Zipf-like law
    (``rank**-user_exponent`` over a random order of users, at least one each, at most half
    the items); items are drawn without repetition per user with Zipf-like popularity
    (``rank**-item_exponent``, mixed with 5 % uniform). Pairs are unique; the output is
    sorted by (user, item) with identity id maps. The result depends only on the
    arguments, not on ``n_jobs``.

    Generation runs in chunks of about half a million ratings on a thread pool, so memory
    stays close to the size of the output (int32 users and items, float32 ratings).

    Parameters
    ----------
    preset : str, default "movielens-100k"
        One of :func:`list_presets` (the clMF paper's data set shapes).
    scale : float, default 1.0
        Multiplies users, items and ratings (each at least 1; ratings then capped so the
        density is at most 50 % and raised so every user has one rating).
    seed : int, numpy.random.Generator or None, default 0
        Seed; ``None`` draws fresh entropy.
    rank : int, default 8
        Rank of the true factors.
    noise : float, default 0.5
        Standard deviation of the Gaussian noise before rounding.
    return_factors : bool, default False
        Also return the true model as :class:`SyntheticFactors`.
    shape : (int, int), optional
        ``(n_users, n_items)``, overriding the preset (``scale`` still applies).
    nnz : int, optional
        Number of ratings, overriding the preset (``scale`` still applies).
    user_exponent, item_exponent : float, default 0.6, 0.5
        Power-law exponents of user activity and item popularity (0 = uniform).
    timestamps : bool, default False
        Add uniform random timestamps in 2000-2010.
    n_jobs : int, optional
        Worker threads; default ``min(os.cpu_count(), 16)``.

    Returns
    -------
    Ratings or (Ratings, SyntheticFactors)

    Examples
    --------
    >>> r = synthetic("movielens-100k", seed=1)
    >>> r.shape, len(r)
    ((943, 1682), 100000)
    >>> float(r.ratings.min()) >= 1 and float(r.ratings.max()) <= 5
    True
    """
    t0 = time.perf_counter()
    if preset not in _PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(_PRESETS)}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    if int(rank) < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    if not (noise >= 0 and math.isfinite(noise)):
        raise ValueError(f"noise must be >= 0, got {noise}")
    for name, e in (("user_exponent", user_exponent), ("item_exponent", item_exponent)):
        if not (e >= 0 and math.isfinite(e)):
            raise ValueError(f"{name} must be >= 0, got {e}")
    m0, n0, nnz0 = _PRESETS[preset]
    if shape is not None:
        if len(shape) != 2 or min(int(shape[0]), int(shape[1])) < 1:
            raise ValueError(f"shape must be two positive ints, got {shape!r}")
        m0, n0 = int(shape[0]), int(shape[1])
    if nnz is not None:
        if int(nnz) < 1:
            raise ValueError(f"nnz must be >= 1, got {nnz}")
        nnz0 = int(nnz)
    m = max(1, int(round(m0 * scale)))
    n = max(1, int(round(n0 * scale)))
    total = max(1, int(round(nnz0 * scale)))
    if m >= 2**31 or n >= 2**31:
        raise ValueError(f"shape ({m}, {n}) exceeds int32 indices")
    if total >= 2**31:
        raise ValueError(f"{total:,} ratings: build sets past 2^31 ratings with "
                         "clmf.parallel.synthetic_layout (both CSR layouts, block by block, in "
                         "bounded memory) rather than as one COO")
    cap_total = max(m, int(_MAX_DENSITY * m * n))
    if total > cap_total:
        logger.warning("synthetic: %d ratings capped to %d (density <= 50%%)", total, cap_total)
        total = cap_total
    if total < m:
        logger.info("synthetic: raising %d ratings to %d so every user has one", total, m)
        total = m
    user_cap = max(1, math.ceil(n * _MAX_DENSITY), math.ceil(total / m))
    user_cap = min(user_cap, n)

    if isinstance(seed, np.random.Generator):
        seed = int(seed.integers(0, 2**63 - 1))
    root = np.random.SeedSequence(seed)
    s_struct, s_factors, s_chunks, s_time = root.spawn(4)
    rng = np.random.default_rng(s_struct)
    counts = _user_counts(rng, total, m, user_cap, user_exponent)
    pop = _power_weights(n, item_exponent, rng)
    pop = 0.95 * pop + 0.05 / n
    q, alias = alias_table(pop)
    inv_pop = 1.0 / pop

    # chunks of users of about _CHUNK_NNZ ratings (fixed by the data, not by n_jobs)
    cum = np.cumsum(counts)
    bounds = np.searchsorted(cum, np.arange(_CHUNK_NNZ, total, _CHUNK_NNZ), side="left") + 1
    bounds = np.unique(np.r_[0, bounds[bounds < m], m])
    offsets = np.r_[0, cum][bounds]
    chunk_seeds = s_chunks.spawn(len(bounds) - 1)

    users_out = np.empty(total, dtype=np.int32)
    items_out = np.empty(total, dtype=np.int32)
    ratings_out = np.empty(total, dtype=np.float32)

    frng = np.random.default_rng(s_factors)
    rank = int(rank)
    fscale = math.sqrt(0.7 / math.sqrt(rank))  # sd of p.q is about 0.7
    P = (frng.standard_normal((m, rank), dtype=np.float32) * fscale).astype(np.float32)
    Q = (frng.standard_normal((n, rank), dtype=np.float32) * fscale).astype(np.float32)
    bu = (frng.standard_normal(m, dtype=np.float32) * 0.35).astype(np.float32)
    bi = (frng.standard_normal(n, dtype=np.float32) * 0.45).astype(np.float32)
    mu = 3.5

    def work(c: int) -> None:
        a, b = int(bounds[c]), int(bounds[c + 1])
        crng = np.random.default_rng(chunk_seeds[c])
        keys = _chunk_pairs(crng, a, counts[a:b], n, q, alias, inv_pop)
        lo, hi = int(offsets[c]), int(offsets[c + 1])
        if keys.size != hi - lo:  # pragma: no cover - internal invariant
            raise RuntimeError(f"chunk {c}: generated {keys.size} pairs, expected {hi - lo}")
        uu = (keys // n).astype(np.int32)
        ii = (keys - uu.astype(np.int64) * n).astype(np.int32)
        del keys
        x = np.empty(uu.size, dtype=np.float32)
        for s0 in range(0, uu.size, _DOT_BLOCK):  # bounded float32 temporaries
            s1 = s0 + _DOT_BLOCK
            x[s0:s1] = np.einsum("ij,ij->i", P[uu[s0:s1]], Q[ii[s0:s1]])
        x += bu[uu]
        x += bi[ii]
        x += np.float32(mu)
        if noise > 0:
            x += crng.standard_normal(x.size, dtype=np.float32) * np.float32(noise)
        np.rint(x, out=x)
        np.clip(x, 1, 5, out=x)
        users_out[lo:hi] = uu
        items_out[lo:hi] = ii
        ratings_out[lo:hi] = x

    n_chunks = len(bounds) - 1
    workers = n_jobs if n_jobs is not None else min(os.cpu_count() or 1, 16)
    workers = max(1, min(int(workers), n_chunks))
    if workers == 1:
        for c in range(n_chunks):
            work(c)
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            for f in [pool.submit(work, c) for c in range(n_chunks)]:
                f.result()

    ts = None
    if timestamps:
        trng = np.random.default_rng(s_time)
        start, stop = 946_684_800, 1_262_304_000  # 2000-01-01 .. 2010-01-01 UTC
        ts = trng.integers(start, stop, size=total, dtype=np.int64)

    out = Ratings._new(
        users_out, items_out, ratings_out, ts,
        np.arange(m, dtype=np.int64), np.arange(n, dtype=np.int64),
    )
    logger.info(
        "synthetic %r scale=%g: %d users x %d items, %d ratings in %.2f s (%d chunks, %d threads)",
        preset, scale, m, n, total, time.perf_counter() - t0, n_chunks, workers,
    )
    if return_factors:
        return out, SyntheticFactors(P, Q, bu, bi, mu, pop)
    return out
