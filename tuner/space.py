"""The search space: variant flags × tx, ty, bx, by, tz, nnz_batch, vec, solve_wg, solver, split.

The ``full`` preset includes the gemm variant (``batch[+vec4]+gemm``: bx, tz, nnz_batch active) and
the syrk variant (``batch+vec4+syrk``: bx — its micro-tile edge —, ks, nnz_batch active);
the ``bounded`` preset keeps the flag set its exhaustive-vs-budgeted comparisons were run on.

A :class:`Space` is a product of per-field value grids with conditional fields (``nnz_batch``
only with ``local``; ``bx``, ``by``, ``tz`` only with ``tile``; ``cg_steps`` only with the CG
solver; ``split``, the long rows' piece length, only where the grid has it — the GPU presets —
and never with the fused CG, which builds no hermitians; the plain ``batch`` variant only sees
``tx·ty``). Every configuration is put in a
canonical form (:func:`canonical`) so equivalent ones are built once, and pruned *before* any
build by :func:`prune` (idle work-items, :func:`clmf.engine.kernels.validate`: work-group limits, local
memory by :meth:`KernelConfig.local_mem_bytes` against the device's, register blocks). What a
built kernel allows is checked later, by :func:`clmf.engine.kernels.als_program` (typed
``InvalidConfigError.reason``), during measurement.

Three presets: ``default`` (what ``clmf tune`` searches unless told otherwise: the shapes that win
on the devices we know, CG and fused CG included, see :func:`_default_space`), ``bounded`` (a few
hundred configurations, cholesky only: the exhaustive-vs-budgeted comparison) and ``full`` (every grid value; solvers as asked, Cholesky by default; far too large
to enumerate: the budgeted strategy samples and walks it).

Modes (:data:`clmf.tuning.MODES`): a space is built at the kernels' f (f + 1 with biases: pass
:func:`clmf.tuning.kernel_factors`). In ``implicit`` mode every solver is a default candidate
(the implicit fit's untuned solver is the fused CG; Cholesky and the CG on built hermitians are
at least as exact) with the fused CG's 3 steps only (what an untuned implicit fit runs: fewer
steps would be faster and converge less), and the fused CG keeps its S1 flags: they build the
Gram matrix YᵀY every implicit half-step runs.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

from clmf.engine.config import DIMS_FIELDS, SOLVERS, SPLIT_NEVER, KernelConfig
from clmf.engine.kernels import mma_supported, validate
from clmf.errors import InvalidConfigError

__all__ = ["Space", "canonical", "prune", "make_space", "SPACES", "config_id"]

FLAG_FIELDS = ("reg", "local", "vec", "tile", "gemm", "syrk", "mma")
# The CG solvers are opt-in (``solvers=``): a CG half-step is cheaper but converges less per
# iteration, which a per-iteration time objective cannot judge. Their steps stay ≤ 3: with more,
# float32 CG mid-convergence departs from the float64 reference CG beyond the 1e-4 validation
# tolerance (≈ 5e-3 at 6 steps, f = 10, on the validation problems), so they could not pass.
DEFAULT_SOLVERS = ("cholesky",)
MODE_SOLVERS = {"implicit": ("cholesky", "cg", "fusedcg")}
# CG steps trade accuracy per iteration for time per iteration, which a per-iteration time
# objective cannot judge (the H100 Netflix f=10 tuning picked 2 steps: 2% worse test RMSE after 4
# iterations); the tuner keeps the solver's default number of steps
MODE_CG_STEPS = {"implicit": [3]}
PARAM_FIELDS = ("tx", "ty", "bx", "by", "tz", "ks", "nnz_batch", "solve_wg", "solve_vec", "solver",
                "cg_steps", "split", "dims_q", "dims_p", "direct", "dims_shfl",
                "dims_wshfl", "dims_rsum", "dims_pipe")
# the GPU presets' long-row piece lengths: automatic (0), fixed lengths, never split. A long row is
# one work-group's work unsplit; on a CPU (a few compute units, work-groups run as loops) the
# tail it makes is short, and the automatic rule splits nothing on the data sizes CPUs take
SPLIT_GRID = [0, 8192, 32768, SPLIT_NEVER]
_MUTABLE = ("tx", "ty", "bx", "by", "tz", "ks", "nnz_batch", "solve_wg", "solve_vec", "cg_steps",
            "split", "fused_solve", "fused_dims", "dims_q", "dims_p", "direct", "dims_shfl",
            "dims_wshfl", "dims_rsum", "dims_pipe")


def flags_of(cfg):
    """The flag tuple of a configuration, in FLAG_FIELDS order."""
    return tuple(getattr(cfg, k) for k in FLAG_FIELDS)


def _pow2_le(x):
    p = 1
    while p * 2 <= x:
        p *= 2
    return p


def config_id(cfg):
    """A short, stable text id of a configuration (its readable string)."""
    return str(cfg)


def canonical(cfg: KernelConfig, mode="explicit") -> KernelConfig:
    """The representative of the configurations that build the same kernels (in ``mode``: the
    implicit fused CG still runs S1, for the Gram matrix)."""
    kw = {}
    if cfg.solver == "fusedcg" and mode != "implicit":
        # the fused CG applies A from the row's entries: no S1 in explicit ALS, only the
        # vector width (factor padding) still matters
        kw.update(reg=False, local=False, tile=False, syrk=False, ks=1)
        kw.update(tx=1, ty=1) if cfg.vec else kw.update(tx=8, ty=8)
        cfg = cfg.replace(**kw)
        kw = {}
    if cfg.fused_dims and not cfg.dims:
        # the dimensions form of the fused CG solver only, its geometry with it
        kw.update(fused_dims=False, **{k: getattr(KernelConfig, k) for k in DIMS_FIELDS})
    elif cfg.dims and cfg.dims_shfl:  # the shuffles sum an entry's parts: no dims_p
        kw["dims_p"] = KernelConfig.dims_p
    if not (cfg.local or cfg.gemm or cfg.syrk or cfg.mma or cfg.dims):
        kw["nnz_batch"] = KernelConfig.nnz_batch
    if not (cfg.tile or cfg.gemm or cfg.syrk or cfg.mma):
        kw.update(bx=0, by=0, tz=1)
    if cfg.gemm:                      # square tiles: by is not used
        kw["by"] = 0
    if cfg.syrk:                      # micro-tile edge bx and slices ks only
        kw.update(tx=KernelConfig.tx, ty=KernelConfig.ty, by=0, tz=1)
    if cfg.mma:                       # warps per slice tx, slices ks, precision only
        kw.update(ty=KernelConfig.ty, bx=0, by=0, tz=1)
        if cfg.fused_solve:           # no S3 work-group
            kw["solve_wg"] = 0
    if cfg.solver == "cholesky":
        kw["cg_steps"] = KernelConfig.cg_steps
    if cfg.solve_vec and (cfg.solver != "fusedcg" or cfg.solve_wg != 1):
        kw["solve_vec"] = 0           # the explicit vectors of the one-work-item fused CG only
    if cfg.solver == "fusedcg" or cfg.fused_solve:   # no hermitians built: nothing to split
        kw["split"] = KernelConfig.split
    if not (cfg.reg or cfg.local or cfg.vec or cfg.tile or cfg.gemm or cfg.syrk or cfg.mma):
        p = cfg.tx * cfg.ty           # the baseline uses tx·ty work-items, flat
        tx = _pow2_le(max(1, int(math.isqrt(p)))) if (p & (p - 1)) == 0 else cfg.tx
        kw.update(tx=tx, ty=p // tx)
    return cfg.replace(**kw) if kw else cfg


def _prune_dims(cfg, f):
    """Reject a fused CG dimensions form whose ``dims_q``/``dims_p`` build the kernel of another
    value at this f (slices clamped to what f needs; the automatic sum one work-item wide), or
    leave sum work-items idle (raise InvalidConfigError)."""
    g = cfg.fcg_geometry(f)
    if cfg.dims_q > 1 and g["fd_q"] != cfg.dims_q:
        raise InvalidConfigError(f"dims_q={cfg.dims_q} gives {g['fd_q']} slices per work-item at "
                                 f"f={f}: the kernel of another value", "duplicate_geometry")
    if cfg.dims_p == 0 and g["fd_p"] == 1:
        raise InvalidConfigError("dims_p=0 is one work-item per entry's sum here: the kernel "
                                 "of dims_p=1", "duplicate_geometry")
    if cfg.dims_p > 1 and (cfg.dims_p > g["fd_d"]
                           or cfg.dims_p * g["fd_e"] * g["fd_nb"] > cfg.swg(f)):
        raise InvalidConfigError(f"dims_p={cfg.dims_p} work-items per entry's sum of "
                                 f"{g['fd_d']} parts, {g['fd_e'] * g['fd_nb']} entries per chunk "
                                 f"and {cfg.swg(f)} work-items", "idle_work_items")


def prune(cfg: KernelConfig, f: int, info):
    """Raise :class:`InvalidConfigError` (typed reason) if ``cfg`` cannot or should not be built
    for ``f`` factors on the device ``info``; returns ``cfg`` otherwise."""
    bx, by = cfg.tile_edges(f)
    vw = cfg.vec or 1
    if cfg.mma:
        g = cfg.s1_geometry(f)
        if cfg.tx * g["parts"] > g["nblk"]:
            raise InvalidConfigError(f"{cfg.tx * g['parts']} warps per slice for {g['nblk']} "
                                     "blocks", "idle_work_items")
        if cfg.nnz_batch < 8 * cfg.ks:
            raise InvalidConfigError(f"{cfg.ks} slices for {cfg.nnz_batch // 8} k-groups per "
                                     "chunk", "idle_work_items")
    elif cfg.syrk:
        r = cfg.bx or 8
        if r > 4 and r - 4 >= f + 1:         # (the triangle has f + 1 rows: b rides along)
            raise InvalidConfigError(f"micro-tile {r} when {r - 4} already covers f={f}", "geometry")
    elif cfg.gemm:
        g = cfg.s1_geometry(f)
        if (cfg.tx - 1) * g["rx"] >= bx or (cfg.ty - 1) * g["ry"] >= bx:
            raise InvalidConfigError(f"{cfg.tx}×{cfg.ty} work-items with {g['rx']}×{g['ry']} "
                                     f"micro-tiles for a tile edge {bx}", "idle_work_items")
        if cfg.bx and cfg.bx > f:
            raise InvalidConfigError(f"tile {cfg.bx} larger than f={f}", "geometry")
    elif cfg.reg or cfg.local or cfg.vec or cfg.tile:
        # work-items that would own no output element
        if cfg.tx > bx:
            raise InvalidConfigError(f"tx={cfg.tx} > tile edge {bx}", "idle_work_items")
        if cfg.ty > -(-by // vw):
            raise InvalidConfigError(f"ty={cfg.ty} > tile edge {by}/{vw}", "idle_work_items")
    else:
        if cfg.tx * cfg.ty > 2 * f * (f + 1) // 2 and cfg.tx * cfg.ty > 1:
            raise InvalidConfigError(f"{cfg.tx * cfg.ty} work-items for {f * (f + 1) // 2} "
                                     "output elements", "idle_work_items")
    if cfg.tile:
        if (cfg.bx and cfg.bx > f) or (cfg.by and cfg.by > f):
            raise InvalidConfigError(f"tile {cfg.bx}×{cfg.by} larger than f={f}", "geometry")
    if cfg.solver != "cholesky" and cfg.cg_steps > f:
        raise InvalidConfigError(f"cg_steps={cfg.cg_steps} > f={f}", "geometry")
    if cfg.dims:
        _prune_dims(cfg, f)
    validate(cfg, f, info)
    return cfg


@dataclasses.dataclass
class Space:
    """A product space of configurations at ``f`` factors for one device.

    ``flags`` lists the (reg, local, vec, tile, gemm, syrk, mma) tuples; ``grid`` maps each field to its values
    (``square_tiles`` restricts tiles to bx = by). Small spaces are enumerated
    (:meth:`enumerate`); large ones are sampled (:meth:`sample`) and walked (:meth:`mutate`).
    """
    name: str
    f: int
    flags: list
    grid: dict
    storage: str = "float32"
    mode: str = "explicit"
    ENUMERATE_LIMIT = 50_000

    def __post_init__(self):
        # shorter tuples of older callers (reg, local, vec, tile[, gemm]): the later flags off
        self.flags = [tuple(fl) + (False,) * (len(FLAG_FIELDS) - len(fl)) for fl in self.flags]

    def active(self, flags, solver):
        """The fields that matter for a configuration with these flags and solver."""
        reg, local, vec, tile, gemm, syrk, mma = flags
        # (with fused_solve no hermitian is built either: canonical() drops its split)
        split = ["split"] if "split" in self.grid and solver != "fusedcg" else []
        if mma:
            # the plain TF32 precision is not searched: a time objective cannot judge the
            # accuracy it trades (an explicit request or an accuracy-checked run chooses it)
            out = ["tx", "ks", "nnz_batch", "solve_wg", "solver"] + split
            out += ["fused_solve"] if solver == "cg" else []
            out += ["direct"] if "direct" in self.grid else []   # (ks = 1, not fused only)
            return out + (["cg_steps"] if solver != "cholesky" else [])
        if syrk:
            out = ["bx", "ks", "nnz_batch", "solve_wg", "solver"] + split
            return out + (["cg_steps"] if solver != "cholesky" else [])
        out = ["tx", "ty", "solve_wg", "solver"] + split
        if solver == "fusedcg" and "solve_vec" in self.grid:
            out.append("solve_vec")
        dims = solver == "fusedcg" and vec == 4 and "fused_dims" in self.grid
        if dims:                      # the fused CG's dimensions form, entries per group
            out.append("fused_dims")
            # its slices per work-item and work-items per entry's sum, where the space has them
            out += [k for k in DIMS_FIELDS if k in self.grid]
        if local or gemm or dims:
            out.append("nnz_batch")
        if gemm:
            out += ["bx", "tz"]
        if tile:
            out += ["bx", "tz"] if self.grid.get("square_tiles") else ["bx", "by", "tz"]
        if solver != "cholesky":
            out.append("cg_steps")
        return out

    def _make(self, flags, vals):
        reg, local, vec, tile, gemm, syrk, mma = flags
        kw = dict(vals)
        if not kw.get("fused_dims"):  # (the dimensions form's geometry with it only)
            for k in DIMS_FIELDS:
                kw.pop(k, None)
        if (self.grid.get("square_tiles") or gemm) and "bx" in kw:
            kw["by"] = kw["bx"]
        return KernelConfig(reg=reg, local=local, vec=vec, tile=tile, gemm=gemm, syrk=syrk,
                            mma=mma, storage=self.storage, **kw)

    def _raw(self):
        g = self.grid
        for fl in self.flags:
            for solver in g["solver"]:
                fields = [k for k in self.active(fl, solver) if k != "solver"]
                for combo in itertools.product(*(g[k] for k in fields)):
                    try:
                        yield self._make(fl, dict(zip(fields, combo), solver=solver))
                    except InvalidConfigError:
                        continue

    def size_upper(self):
        """The number of raw grid points (before canonical forms and pruning)."""
        g, n = self.grid, 0
        for fl in self.flags:
            for solver in g["solver"]:
                fields = [k for k in self.active(fl, solver) if k != "solver"]
                n += math.prod(len(g[k]) for k in fields)
        return n

    @property
    def enumerable(self):
        return self.size_upper() <= self.ENUMERATE_LIMIT

    def enumerate(self, info, rejected=None):
        """Every valid canonical configuration, in a stable order. ``rejected`` (a list) collects
        ``(config, reason, message)`` of the pruned ones."""
        if not self.enumerable:
            raise ValueError(f"the {self.name} space at f={self.f} has {self.size_upper()} grid "
                             "points: too many to enumerate; sample it (budgeted strategy)")
        seen, out = set(), []
        for cfg in self._raw():
            c = canonical(cfg, self.mode)
            k = c.key()
            if k in seen:
                continue
            seen.add(k)
            try:
                prune(c, self.f, info)
            except InvalidConfigError as e:
                if rejected is not None:
                    rejected.append((c, e.reason, str(e)))
                continue
            out.append(c)
        return out

    def _valid(self, cfg, info):
        try:
            return prune(canonical(cfg, self.mode), self.f, info)
        except InvalidConfigError:
            return None

    def sample(self, rng, info, tries=200):
        """A random valid configuration (flags uniformly, then each active field uniformly)."""
        g = self.grid
        for _ in range(tries):
            fl = self.flags[rng.integers(len(self.flags))]
            solver = g["solver"][rng.integers(len(g["solver"]))]
            vals = {k: g[k][rng.integers(len(g[k]))] for k in self.active(fl, solver) if k != "solver"}
            try:
                c = self._valid(self._make(fl, dict(vals, solver=solver)), info)
            except InvalidConfigError:
                c = None
            if c is not None:
                return c
        return None

    def mutate(self, cfg, rng, info, tries=50):
        """A valid neighbour of ``cfg``: one flag toggled, or one active field moved one grid step
        (tx/ty and bx/by may move together), or the solver switched."""
        g = self.grid
        fl0 = flags_of(cfg)
        for _ in range(tries):
            fl = list(fl0)
            vals = {k: getattr(cfg, k) for k in _MUTABLE}
            solver = cfg.solver
            fields = self.active(fl0, solver)
            what = rng.integers(len(fields) + 1)
            if what == len(fields):           # a flag
                alts = [f for f in self.flags if sum(a != b for a, b in zip(f, fl0)) == 1]
                if not alts:
                    continue
                fl = list(alts[rng.integers(len(alts))])
            else:
                k = fields[what]
                if k == "solver":
                    others = [s for s in g["solver"] if s != solver]
                    if not others:
                        continue
                    solver = others[rng.integers(len(others))]
                else:
                    keys = [k] + ([{"tx": "ty", "ty": "tx"}[k]] if k in ("tx", "ty")
                                  and rng.random() < 0.3 else [])
                    for kk in keys:
                        vs = g[kk]
                        cur = vals[kk]
                        i = vs.index(cur) if cur in vs else int(rng.integers(len(vs)))
                        j = min(len(vs) - 1, max(0, i + (1 if rng.random() < 0.5 else -1)))
                        vals[kk] = vs[j]
            act = self.active(tuple(fl), solver)
            for k in _MUTABLE:
                if k in act and vals[k] not in g[k]:
                    vals[k] = g[k][rng.integers(len(g[k]))]
            keep = {k: vals[k] for k in act if k != "solver"}
            try:
                c = self._valid(self._make(tuple(fl), dict(keep, solver=solver)), info)
            except InvalidConfigError:
                c = None
            if c is not None and c.key() != cfg.key():
                return c
        return None

    def neighbours(self, cfg, candidates):
        """Members of ``candidates`` one step from ``cfg``: one or two flags toggled, or one field
        changed (tx/ty and bx/by may move together), comparing only the fields active in both (a
        tile toggle is one step, whatever bx/by/tz become); nearest grid steps first."""
        a = cfg.to_dict()
        act_a = set(self.active(flags_of(cfg), cfg.solver))
        out = []
        for c in candidates:
            b = c.to_dict()
            act = act_a & set(self.active(flags_of(c), c.solver))
            fdiff = [k for k in FLAG_FIELDS if a[k] != b[k]]
            diff = [k for k in PARAM_FIELDS if k in act and a[k] != b[k]]
            if fdiff:
                # one or two flags toggled, nothing else: the flag combinations of a bounded
                # space are sparse (batch+reg+local+vec4 → batch+reg is two toggles)
                if not diff and len(fdiff) <= 2:
                    out.append((float(len(fdiff)), c))
                continue
            if len(diff) == 1 or (len(diff) == 2 and set(diff) in ({"tx", "ty"}, {"bx", "by"})):
                k = diff[0]
                va, vb = a[k], b[k]
                step = abs(math.log2(max(vb, 1) / max(va, 1))) if isinstance(va, int) and \
                    not isinstance(va, bool) else 1.0
                out.append((step, c))
        out.sort(key=lambda t: t[0])
        return [c for _, c in out]


def _pow2s(lo, hi):
    out, p = [], lo
    while p <= hi:
        out.append(p)
        p *= 2
    return out


def _tile_edges(f, choices):
    return sorted({e for e in choices if e < f} | {f})


def make_space(name, f, info, storage="float32", solvers=None, mode="explicit"):
    """The ``bounded`` or ``full`` preset at ``f`` factors (the kernels' f: f + 1 with biases) for
    the device ``info`` in the tuning ``mode``."""
    maxwg = info.max_work_group_size
    mode_solvers = MODE_SOLVERS.get(mode)
    if name == "bounded":
        flags = [(False, False, 0, False, False), (True, False, 0, False, False),
                 (False, True, 0, False, False), (True, True, 0, False, False),
                 (True, True, 4, False, False), (True, True, 0, True, False),
                 (True, True, 4, True, False)]
        edges = [e for e in (8, 16, 32) if e < f] or [f]
        grid = dict(tx=[1, 2, 4, 8, 16], ty=[1, 2, 4, 8, 16], nnz_batch=[16, 64],
                    bx=edges, by=edges,
                    square_tiles=True, tz=[1, 2], solve_wg=[0], solve_vec=[0],
                    solver=list(mode_solvers or ["cholesky"]),
                    cg_steps=[3])
        return Space("bounded", f, flags, grid, storage, mode)
    if name == "default":
        return _default_space(f, info, storage, mode)
    if name == "full":
        solvers = [s for s in (solvers or mode_solvers or DEFAULT_SOLVERS) if s in SOLVERS]
        flags = [(r, loc, v, t, False) for r in (False, True) for loc in (False, True)
                 for v in (0, 4, 8, 16) for t in (False, True)]
        flags += [(False, False, 0, False, True), (False, False, 4, False, True)]   # gemm
        flags += [(False, False, 4, False, False, True)]                             # syrk
        if mma_supported(info):
            flags += [(False, False, 4, False, False, False, True)]                  # mma
        cap = min(maxwg, 1024)
        # powers of two, and the work-item counts that split a tile edge of f, f/2 or f/3 into
        # whole micro-tiles of 4 or 8 (the gemm variant's natural shapes, e.g. 13 × 4 = 52)
        extra = {-(-e // r) for e in (f, -(-f // 2), -(-f // 3)) for r in (4, 8)}
        ts = sorted(set(_pow2s(1, min(32, cap))) | {t for t in extra if 2 < t <= min(32, cap)})
        grid = dict(tx=ts, ty=ts,
                    nnz_batch=[8, 16, 32, 64, 128],
                    bx=_tile_edges(f, (4, 8, 12, 16, 24, 32, 48, 52, 64, -(-f // 2), -(-f // 3))),
                    by=_tile_edges(f, (4, 8, 16, 24, 32, 48, 64)), tz=[1, 2, 4],
                    ks=_pow2s(1, min(128, cap)),
                    solve_wg=_pow2s(1, min(f, maxwg, 256)), solver=solvers,
                    solve_vec=[0, 4, 8, 16] if info.type == "CPU" else [0],
                    fused_solve=[False, True], fused_dims=[False, True], direct=[0, 1, 2, 4],
                    cg_steps=list(MODE_CG_STEPS.get(mode, [KernelConfig.cg_steps])))
        if info.type != "CPU":
            grid["split"] = list(SPLIT_GRID)
            grid["nnz_batch"] = [2, 4] + grid["nnz_batch"]        # the fused CG's groups
            grid["solve_wg"] = _pow2s(1, min(maxwg, 256))          # (its form takes > f)
            grid.update(_dims_grid(f, info))
        return Space("full", f, flags, grid, storage, mode)
    raise ValueError(f"unknown space {name!r}; choose from {SPACES}")


def _default_space(f, info, storage="float32", mode="explicit"):
    """The ``default`` preset: what wins on the devices we know (the shipped tunings) — Cholesky,
    CG and fused CG; registers with vector widths 4/8/16, with and without local memory, and
    tiles; ``solve_wg`` = 1 and 2 (the barrier-free CG forms) on CPUs, the one-work-item fused CG
    in scalar loops or explicit float8/float16 vectors (``solve_vec``); the gemm and syrk shapes
    on GPUs — at the work-item counts that split f, f/2 into whole 4- or 8-wide micro-tiles. On a
    CPU it is enumerable (≈ 7,000 configurations at f = 50); on a GPU the budgeted strategy samples
    and walks it."""
    gpu = info.type != "CPU"
    cap = min(info.max_work_group_size, 1024)
    vw = (4, 8, 16)
    flags = [(False, False, 0, False, False), (True, False, 0, False, False),
             (True, True, 0, False, False)]
    flags += [(True, loc, w, False, False) for loc in (False, True) for w in vw]
    flags += [(True, True, 4, True, False), (True, False, 4, True, False)]
    if gpu:
        flags += [(False, False, 0, False, True), (False, False, 4, False, True),   # gemm
                  (False, False, 4, False, False, True)]                            # syrk
    if mma_supported(info):
        flags += [(False, False, 4, False, False, False, True)]                     # mma
    extra = {-(-e // r) for e in (f, -(-f // 2)) for r in (4, 8)}
    ts = sorted(set(_pow2s(1, min(16, cap))) | {t for t in extra if 2 < t <= min(32, cap)})
    edges = [e for e in (8, 16, 32) + ((64,) if gpu else ()) if e < f] or [f]
    # on GPUs also 128 work-items, and more than f: the fused CG's dimensions form takes them
    wgs = (0, 8, 32, 64, 128, 256) if gpu else (0, 1, 2, 16)
    # bx: tile edges; on GPUs also 0 (gemm over the whole f) and the syrk micro-tiles 4 and 8
    grid = dict(tx=ts, ty=ts, nnz_batch=[4, 8, 16, 32, 64] if gpu else [16, 32, 64],
                bx=sorted(set(edges) | ({0, 4, 8} if gpu else set())), by=edges, square_tiles=True,
                tz=[1, 2, 4], ks=[1, 2, 4, 8, 16, 32] if gpu else [1],
                solve_wg=[w for w in wgs if w <= info.max_work_group_size
                          and (gpu or w <= f)],
                solve_vec=[0] if gpu else [0, 8, 16],
                solver=["cholesky", "cg", "fusedcg"], fused_solve=[False, True],
                direct=[0, 1, 2, 4],
                cg_steps=list(MODE_CG_STEPS.get(mode, [KernelConfig.cg_steps])))
    if gpu:
        grid["split"] = list(SPLIT_GRID)
        grid["fused_dims"] = [False, True]
        grid.update(_dims_grid(f, info))
    return Space("default", f, flags, grid, storage, mode)


def _dims_grid(f, info=None):
    """The fused CG dimensions form's geometry on GPUs: one work-item per entry's sum of parts
    or as many as fit (``dims_p``); from f = 64 (16 float4 slices) also 2 or 4 slices per
    work-item (``dims_q``: fewer work-items per entry, more entries at once); on NVIDIA the
    entry sums as warp shuffles or not (``dims_shfl``)."""
    from clmf.engine.kernels import ptx_supported
    g = dict(dims_p=[1, 0], dims_q=[1, 2, 4] if f >= 64 else [1], dims_pipe=[False, True])
    if ptx_supported(info):
        g["dims_shfl"] = [False, True]
        g["dims_wshfl"] = [False, True]
        g["dims_rsum"] = [False, True]
    return g


SPACES = ("default", "bounded", "full")


# measured as anchors on CPUs where the space holds them: the one-work-item fused CG in explicit
# float16 / float8 vectors won on both CPU runtimes in every mode (issue 16: 6–27× the CG shapes
# on Intel's), but a short budgeted search behind a slow incumbent could miss it
CPU_ANCHORS = ("batch+vec16:tx=1,ty=1,solve_wg=1,solve_vec=16,solver=fusedcg",
               "batch+vec8:tx=1,ty=1,solve_wg=1,solve_vec=8,solver=fusedcg")


def device_anchors(case, space):
    """The device type's known winners (:data:`CPU_ANCHORS` on CPUs) that ``space`` holds."""
    if case.info.type != "CPU":
        return []
    out = []
    for text in CPU_ANCHORS:
        cfg = canonical(KernelConfig.parse(text).replace(storage=case.storage), case.mode)
        g = space.grid
        if cfg.solver not in g.get("solver", ()) or cfg.solve_vec not in g.get("solve_vec", ()):
            continue
        try:
            prune(cfg, case.kf, case.info)
        except InvalidConfigError:
            continue
        out.append(cfg)
    return out
