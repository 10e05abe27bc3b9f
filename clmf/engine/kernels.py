"""Rendering, validating, building and caching the OpenCL programs of a configuration.

Templates live in the ``cl_kernels`` package (Jinja2, StrictUndefined: a missing variable fails
loudly), compiled in the process only (no on-disk bytecode cache: see :func:`_env`). Programs are
memoized per (context, source, options); pyopencl's own disk cache, keyed by
source, options, device and driver, makes a rebuild in a new process cheap. Each ``cl.Kernel`` is
retrieved once and reused.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.resources
import logging
import os
import re
import threading

import jinja2
import numpy as np

from ..errors import InvalidConfigError
from ..tuning.spec import system_row_width
from .config import KernelConfig
from .memory import gram_geometry, gram_tiled

log = logging.getLogger(__name__)

__all__ = ["render", "render_als", "render_metrics", "build", "Program", "validate",
           "template_hash", "als_program", "metrics_program"]

BUILD_OPTIONS = ("-cl-mad-enable",)
# cg_steps ≤ f, except that the default 3 steps stay allowed at f < 3 (what an untuned CG fit runs)
CG_STEPS_FLOOR = KernelConfig.cg_steps


@functools.lru_cache(maxsize=1)
def _env():
    """The Jinja2 environment of the templates. Compiled templates are kept in this process
    only: Jinja's on-disk bytecode cache unpickles and executes its files, so a file planted in
    the cache directory would run as code (issue 33); compiling a fit's templates costs a new
    process some 40–80 ms once."""
    return jinja2.Environment(loader=jinja2.PackageLoader("clmf.cl_kernels", "."),
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True,
                              bytecode_cache=None)


@functools.lru_cache(maxsize=1)
def template_hash():
    """Hash of every template's text, written into each rendered source (cache key hygiene)."""
    h = hashlib.sha256()
    root = importlib.resources.files("clmf.cl_kernels")
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".j2"):
            h.update(entry.name.encode())
            h.update(entry.read_bytes())
    return h.hexdigest()[:16]


# the only characters a string rendered into a kernel source (a comment or a #define) may hold:
# configuration names and values (``batch+reg:tx=4,solver=cg``), never comment delimiters,
# preprocessor directives, quotes or line breaks
_SAFE_TEXT = re.compile(r"^[A-Za-z0-9_+:=,.\- ]{0,200}$")


def _check_variable(name, value):
    """Refuse a template variable that is not a whitelisted value (bool, int, float, safe text,
    or a list/tuple/dict of those)."""
    if isinstance(value, (bool, int, float)) or value is None:
        return
    if isinstance(value, str):
        if not _SAFE_TEXT.match(value):
            raise InvalidConfigError(f"template variable {name} holds characters that may not be "
                                     f"rendered into a kernel source: {value[:60]!r}", "schema")
        return
    if isinstance(value, (list, tuple)):
        for x in value:
            _check_variable(name, x)
        return
    if isinstance(value, dict):
        for x in value.values():
            _check_variable(name, x)
        return
    raise InvalidConfigError(f"template variable {name} has type {type(value).__name__}", "schema")


def render(template, **variables):
    """Render one template with ``variables`` (every variable it names must be given, and each
    must be a whitelisted value: see :func:`_check_variable`)."""
    variables.setdefault("template_hash", template_hash())
    for k, v in variables.items():
        _check_variable(k, v)
    return _env().get_template(template).render(**variables)


def _next_pow2(x):
    p = 1
    while p < x:
        p *= 2
    return p


def als_variables(config: KernelConfig, f: int, device_info=None, implicit=False, biased=False,
                  ldf=None):
    """Template variables of the ALS program (S1, S2, S3) for ``config`` at ``f`` factors.

    With ``biased`` the systems have ``f`` unknowns (factors + the row's bias) and the rows are
    ``f + 1`` wide ([factors | 1 | bias]); ``implicit`` weights the entries by confidence.
    ``ldf`` overrides the factor rows' leading dimension (a multiple of the config's own: devices
    of one fit with different vector widths share one row layout)."""
    if f < 1:
        raise InvalidConfigError(f"factors must be ≥ 1, not {f}", "f")
    local_budget = device_info.local_mem if device_info is not None else 32 * 1024
    bx, by = config.tile_edges(f)
    v = dict(
        f=f, ldf=_check_ldf(config, system_row_width(f, biased), ldf), storage=config.storage,
        config_str=str(config.replace(split=0)), implicit=bool(implicit), biased=bool(biased),
        variant_name=config.name, reg=config.reg, local=config.local, vec=config.vec,
        tile=config.tile, gemm=config.gemm, syrk=config.syrk, mma=config.mma,
        precision=config.precision, mma_emulate=config.mma and not mma_supported(device_info),
        fused_solve=config.fused_solve, fused_dims=config.dims, direct=config.direct,
        triangle=config.triangle, tx=config.tx, ty=config.ty, tz=config.tz,
        bx=bx, by=by, nnz_batch=config.nnz_batch, s1_wg=config.s1_local_size(f),
        s2_wg=min(_next_pow2(f), 256),
        comb_wg=_comb_wg(device_info),
        solve_wg=config.swg(f), solve_vec=config.svec(f),
        solver=config.solver, cg_steps=config.cg_steps,
        chol_local=config.chol_local_bytes(f) + 4 * (4 * f + config.swg(f)) <= local_budget,
    )
    v.update(config.s1_geometry(f))
    v.update(config.fcg_geometry(f))
    v["fd_gsum_tree"] = gsum_tree_ok(device_info)
    v["fd_shfl"] = dims_shuffle(config, device_info)
    v["fd_wshfl"] = bool(v["fd_shfl"] and config.dims_wshfl)
    v["fd_rsum"] = bool(v["fd_shfl"] and config.dims_rsum)
    v["fd_pipe"] = bool(config.dims and config.dims_pipe)
    v["fd_shfl_masks"] = [1 << i for i in range(max(0, v["fd_d"].bit_length() - 1))]
    v["fd_rs_levels"], v["fd_rs_masks"] = rsum_levels(v["fd_d"], v["fd_nb"])
    v["gram_tiled"] = gram_tiled(device_info.type if device_info else "GPU")
    geo = gram_geometry(f, 1, device_info.max_work_group_size if device_info else 256)
    v["gram_lg"], v["gram_r"] = geo.lg, geo.r
    v["bx"], v["by"] = bx, by
    v["s2_wg"] = max(1, min(v["s2_wg"], device_info.max_work_group_size if device_info else 256))
    if config.swg(f) == 1:
        # one work-item per system in S3, and then per row in S2 too: the factor loops run
        # inner and contiguous, which CPU compilers vectorise (PoCL: S2 ×8, CG ×1.5 faster on
        # ML-100K at f = 50 than with work-items across the factors)
        v["s2_wg"] = 1
    return v


def _comb_wg(device_info):
    """Work-items of the long rows' combine kernel (one work-group per real row)."""
    return max(1, min(64, device_info.max_work_group_size if device_info else 64))


def ptx_supported(device_info):
    """True when the device's compiler takes inline PTX (NVIDIA's platform). The platform name
    decides, never a device-name substring."""
    from .device import platform_short
    return device_info is not None and platform_short(device_info.platform) == "nvidia"


def mma_supported(device_info):
    """True when the device runs PTX ``mma.sync`` TF32 (inline PTX, compute capability ≥ 8.0)."""
    if not ptx_supported(device_info):
        return False
    cc = getattr(device_info, "compute_capability", (0, 0)) or (0, 0)
    return tuple(cc) >= (8, 0)


def mma_emulation():
    """True when the environment asks for the mma variant's emulation on devices without tensor
    cores (``CLMF_MMA_EMULATION=1``: tests of its staging, guards and reduction on CPUs only;
    never chosen by the tuning lookup)."""
    return os.environ.get("CLMF_MMA_EMULATION", "") == "1"


def shfl_emulation():
    """True when the environment asks for the dims form's warp-shuffle emulation on devices
    without PTX (``CLMF_SHFL_EMULATION=1``: tests of its order, guards and barriers on CPUs)."""
    return os.environ.get("CLMF_SHFL_EMULATION", "") == "1"


def _check_ldf(config, width, ldf):
    """The config's leading dimension for rows of ``width``, or ``ldf`` when it is a valid one."""
    own = config.ldf(width)
    if ldf is None:
        return own
    if ldf < own or ldf % (config.vec or 1):
        raise InvalidConfigError(f"leading dimension {ldf} is not a multiple of the vector width "
                                 f"{config.vec or 1} at least {own}", "geometry")
    return int(ldf)


def render_als(config: KernelConfig, f: int, device_info=None, implicit=False, biased=False,
               ldf=None):
    """The OpenCL C source of the ALS program for a configuration (for debugging: ``clmf source``)."""
    return render("als.cl.j2", **als_variables(config, f, device_info, implicit, biased, ldf))


def convert_program(context):
    """The program converting factor rows between float32 and half (a float16 exchange)."""
    return build(context, render("convert.cl.j2"))


def reduce_launch(device_info, rows):
    """``(global, local)`` sizes of the pack and unpack kernels over ``rows`` systems, a
    work-group each (any geometry is correct: groups take the systems in turn): 64 work-items
    walking a system's triangle together on a GPU, one on a CPU (PoCL and Intel, f = 100: 1.5-2×
    faster than 8, and than fewer groups)."""
    wg = 64 if device_info.type == "GPU" else 1
    return (max(1, rows) * wg,), (wg,)


def reduce_program(context, device_info):
    """The program packing and unpacking the reduce mode's systems (f is an argument; the
    unpack's loop form by device type)."""
    return build(context, _reduce_source(device_info.type != "GPU"))


@functools.lru_cache(maxsize=2)
def _reduce_source(mirror):
    """``reduce.cl.j2`` rendered (``mirror``: the CPUs' unpack)."""
    return render("reduce.cl.j2", mirror=bool(mirror))


ROTATE_ROWS = 8    # rows per tile of the rotation kernel (rotate.cl.j2's RT_ROWS)


def rotate_program(context):
    """The program rotating factor rows in place by an f × f matrix (``rt_rotate``: f, the row
    stride and the tile's local memory are arguments; one program per context)."""
    return build(context, _rotate_source())


@functools.lru_cache(maxsize=1)
def _rotate_source():
    """``rotate.cl.j2`` rendered with :data:`ROTATE_ROWS` rows per tile."""
    return render("rotate.cl.j2", rows=ROTATE_ROWS)


def render_metrics(f, storage="float32", ldf=None, wg=128, biased=False):
    return render("metrics.cl.j2", f=f, ldf=ldf or f, storage=storage, wg=wg, implicit=False,
                  biased=biased, config_str=f"metrics wg={wg}")


def validate(config: KernelConfig, f: int, device_info):
    """Check a configuration against a device *before* building; raise InvalidConfigError with a
    typed ``reason`` ("work_group_size", "work_item_sizes", "local_memory", "opencl_version",
    "geometry")."""
    if f * (f + 2) >= 2 ** 31:
        # the templates index a system's f × f entries (and the rows f + 2 wide) with 32-bit ints
        raise InvalidConfigError(f"f={f}: f² reaches 2^31, beyond the kernels' 32-bit indexing "
                                 "within one system", "geometry")
    if config.solver != "cholesky" and config.cg_steps > max(f, CG_STEPS_FLOOR):
        # CG on f unknowns is exact after f steps (the kernels stop a converged system): more
        # steps only cost time, and an untrusted record's huge count would hang the fit
        raise InvalidConfigError(f"cg_steps={config.cg_steps} exceeds f={f} (CG solves f unknowns "
                                 f"in at most f steps)", "cg_steps")
    wg = config.s1_local_size(f)
    maxwg = device_info.max_work_group_size
    if wg > maxwg:
        raise InvalidConfigError(f"S1 work-group {wg} exceeds the device's {maxwg}", "work_group_size")
    if config.dims:
        _validate_fcg_dims(config, f, device_info)
    elif config.swg(f) > max(1, f):
        # More S3 work-items than unknowns leaves whole work-items idle in every step; PoCL 3.1
        # also computes wrong results / corrupts memory in that case (seen here), so it is
        # rejected everywhere.
        raise InvalidConfigError(f"S3 work-group {config.swg(f)} larger than f={f}", "geometry")
    if config.swg(f) > maxwg:
        raise InvalidConfigError(f"S3 work-group {config.swg(f)} exceeds the device's {maxwg}",
                                 "work_group_size")
    if wg > device_info.max_work_item_sizes[0]:
        raise InvalidConfigError(f"S1 work-group {wg} exceeds work-item size limit "
                                 f"{device_info.max_work_item_sizes[0]}", "work_item_sizes")
    lm = config.local_mem_bytes(f)
    if lm > device_info.local_mem:
        raise InvalidConfigError(f"S1 needs {lm} B of local memory, the device has "
                                 f"{device_info.local_mem}", "local_memory")
    if config.tile:
        bx, by = config.tile_edges(f)
        if config.vec and (bx % config.vec or by % config.vec) and (bx < f or by < f):
            raise InvalidConfigError(f"tile edges {bx}×{by} must be multiples of the vector width "
                                     f"{config.vec}", "geometry")
    if config.gemm:
        g = config.s1_geometry(f)
        if config.vec and g["bx"] < f and g["bx"] % config.vec:
            raise InvalidConfigError(f"gemm tile edge {g['bx']} must be a multiple of the vector "
                                     f"width {config.vec}", "geometry")
        spt = -(-config.nnz_batch * (g["pw"] // g["vw"]) // (config.tx * config.ty))
        if spt > 16:
            # the staging is unrolled per work-item: more than 16 vectors each is slow to
            # build (minutes on PoCL) and spills
            raise InvalidConfigError(f"gemm would stage {spt} vectors per work-item and chunk "
                                     f"(nnz_batch {config.nnz_batch}, {config.tx}×{config.ty} "
                                     "work-items); use fewer entries per chunk or more work-items",
                                     "geometry")
        if g["rx"] * g["ry"] > 256:
            raise InvalidConfigError(f"{g['rx']}×{g['ry']} register micro-tile per work-item is too "
                                     "many accumulators", "geometry")
    if max(config.vec, config.svec(f)) == 16:
        from .capability import wide_vectors_ok
        if not wide_vectors_ok(device_info):
            raise InvalidConfigError("16-wide float vectors (vec16 / solve_vec=16) abort this "
                                     "OpenCL runtime's compiler (checked once in a child "
                                     "process); use vector widths up to 8", "unsupported_device")
    if config.dims and config.dims_shfl:
        _check_dims_shuffle(config, f, device_info)
    if config.mma:
        if not (mma_supported(device_info) or mma_emulation()):
            raise InvalidConfigError("the mma variant needs NVIDIA tensor cores (compute "
                                     "capability ≥ 8.0); this device has none",
                                     "unsupported_device")
        g = config.s1_geometry(f)
        if g["spt"] > 32:
            raise InvalidConfigError(f"mma would stage {g['spt']} vectors per work-item and chunk "
                                     f"(nnz_batch {config.nnz_batch}, {g['wg']} work-items); use "
                                     "fewer entries per chunk or more warps", "geometry")
        if 8 * g["slots"] > 128:
            raise InvalidConfigError(f"{8 * g['slots']} mma accumulators per work-item ("
                                     f"{g['nblk']} blocks over {g['wb']} warps) are too many: "
                                     "use more warps (tx)", "geometry")
    if config.syrk:
        g = config.s1_geometry(f)
        if g["spt"] > 16:
            raise InvalidConfigError(f"syrk would stage {g['spt']} vectors per work-item and chunk "
                                     f"(nnz_batch {config.nnz_batch}, {g['wg']} work-items); use "
                                     "fewer entries per chunk or more slices (ks)", "geometry")
        if g["nacc"] > 256:
            raise InvalidConfigError(f"{g['nacc']} register accumulators per work-item (micro-tile "
                                     f"{g['r']}×{g['r']}) is too many", "geometry")
        if getattr(device_info, "type", "") == "CPU":
            # CPU runtimes run a work-group's work-items as loops and keep every work-item's
            # private state across the barriers in one stack frame: PoCL 3.1 crashes (stack
            # overflow) at 1440 work-items × 64 accumulators; this bound keeps clear of it
            priv = 4 * g["wg"] * (g["nacc"] + 4 * g["spt"] + 4 * g["qb"] + 16)
            if priv > 256 * 1024:
                raise InvalidConfigError(f"syrk work-group of {g['wg']} work-items keeps {priv} B "
                                         "of private state across barriers: too much for a CPU "
                                         "runtime's stack", "work_group_size")
    if config.reg:
        g = config.s1_geometry(f)
        regs = g["rx"] * g["ryv"] * g["vw"]
        if regs > 256:
            raise InvalidConfigError(f"{regs} register accumulators per work-item is too many",
                                     "geometry")
    return True


def dims_shuffle(config, device_info):
    """How the fused CG dimensions form sums an entry's D parts (``solve_fcgdims.cl.j2``'s
    ``fd_shfl``): 0 through local memory (the phases), 1 a PTX butterfly (``shfl.sync``: the
    config's ``dims_shfl`` on NVIDIA's platform), 2 its emulation through local memory in the
    same order (``dims_shfl`` elsewhere, which :func:`validate` allows only with
    :func:`shfl_emulation`: tests on other devices)."""
    if not (config.dims and config.dims_shfl):
        return 0
    return 1 if ptx_supported(device_info) else 2


def _check_dims_shuffle(config, f, device_info):
    """Raise :class:`InvalidConfigError` where ``dims_shfl`` cannot build: not NVIDIA (and no
    emulation asked for), D not a power of two ≤ 32 (a segment inside one warp) or the
    work-group not whole warps."""
    if not (ptx_supported(device_info) or shfl_emulation()):
        raise InvalidConfigError("dims_shfl sums with PTX warp shuffles: NVIDIA's platform only",
                                 "unsupported_device")
    d = config.fcg_geometry(f)["fd_d"]
    if d > 32 or d & (d - 1) or config.swg(f) % 32:
        raise InvalidConfigError(f"dims_shfl needs the {d} work-items of an entry to be a power "
                                 f"of two ≤ 32 and solve_wg ({config.swg(f)}) whole warps of 32",
                                 "geometry")
    nb = config.nnz_batch
    if config.dims_rsum and (nb > d or nb & (nb - 1)):
        raise InvalidConfigError(f"dims_rsum reduce-scatters an entry group's sums over its {d} "
                                 f"lanes: nnz_batch ({nb}) must be a power of two at most {d}",
                                 "geometry")
    if config.dims_wshfl and nb > d:
        raise InvalidConfigError(f"dims_wshfl loads entry k's weight in lane k of the entry's {d} "
                                 f"lanes: nnz_batch ({nb}) must be at most {d}",
                                 "geometry")


def rsum_levels(d, nb):
    """The dims form's reduce-scatter (``dims_rsum``) of nb values over a segment of d lanes
    (powers of two, nb ≤ d): its halving levels ``(mask, values before)`` from mask d/2 down,
    then the butterfly masks that complete each lane's entry, from d/(2·nb) down to 1."""
    levels, m, n = [], d // 2, nb
    while n > 1 and m >= 1:
        levels.append((m, n))
        m, n = m // 2, n // 2
    return levels, [1 << i for i in range(m.bit_length() - 1, -1, -1)] if m >= 1 else []


def gsum_tree_ok(device_info):
    """Whether the fused CG dimensions form sums its entry groups' partial vectors by a tree
    (``solve_fcgdims.cl.j2``'s ``pcl_gsum``): everywhere but PoCL, whose 3.1 computed wrong sums
    with it (clean on Oclgrind, right on Intel's runtime); PoCL has every work-item add all the
    groups' sums, the original form."""
    from .device import platform_short
    return device_info is None or platform_short(device_info.platform) != "pocl"


def fcg_dims_local_bytes(config, f):
    """Local memory of the fused CG's dimensions form (``s3_fcg``), by formula (bytes)."""
    g = config.fcg_geometry(f)
    ch = g["fd_e"] * g["fd_nb"]
    return 4 * (ch * (g["fd_d"] | 1) + ch * g["fd_p"] + 4 * g["fd_e"] * g["fd_d"] * g["fd_q"]
                + g["fd_d"] + 4 * g["fd_f4"] + 1)


def fcg_dims_registers(config, f):
    """Registers one work-item of the fused CG's dimensions form keeps, by estimate: the
    gathered rows (``q·nb`` float4s), six vectors of ``q`` float4s (x, r, p, A·p, the
    accumulators and the applied vector's result), the next chunk's ``nb`` column indices and a
    fixed 24 for offsets and scalars."""
    g = config.fcg_geometry(f)
    nb = g["fd_held"]                                         # dims_pipe: two chunks' rows
    return 4 * g["fd_q"] * (nb + 6) + nb + 24


# the most registers a GPU work-item holds (NVIDIA: 255) and a GPU compute unit's register file
# (NVIDIA since Kepler, AMD's per-SIMD VGPRs for a work-group): bounds of the estimate above
GPU_MAX_REGISTERS = 255
GPU_REGISTER_FILE = 65536


def _validate_fcg_dims(config, f, device_info):
    """The fused CG dimensions form's constraints: gathered rows held in registers, registers
    (GPUs), local memory, the work-group size (raise InvalidConfigError)."""
    g = config.fcg_geometry(f)
    rows = g["fd_q"] * g["fd_held"]
    if rows > 16:
        raise InvalidConfigError(f"fused_dims would hold {rows} float4s of gathered rows per "
                                 f"work-item ({g['fd_q']} slices × nnz_batch {g['fd_nb']}"
                                 f"{' × 2 chunks (dims_pipe)' if config.dims_pipe else ''}); at "
                                 "most 16", "geometry")
    if getattr(device_info, "type", "GPU") != "CPU":
        regs, swg = fcg_dims_registers(config, f), config.swg(f)
        if regs > GPU_MAX_REGISTERS or regs * swg > GPU_REGISTER_FILE:
            raise InvalidConfigError(f"fused_dims would keep about {regs} registers per "
                                     f"work-item ({g['fd_q']} slices, nnz_batch {g['fd_nb']}), "
                                     f"{regs * swg} for {swg} work-items: more than a GPU's "
                                     f"{GPU_MAX_REGISTERS} per work-item or {GPU_REGISTER_FILE} "
                                     "per compute unit (it would spill)", "registers")
    lm = fcg_dims_local_bytes(config, f)
    have = device_info.local_mem if device_info is not None else 32 * 1024
    if lm > have:
        raise InvalidConfigError(f"the fused CG needs {lm} B of local memory, the device has "
                                 f"{have}", "local_memory")


_SCALARS = {"char": np.int8, "uchar": np.uint8, "short": np.int16, "ushort": np.uint16,
            "int": np.int32, "uint": np.uint32, "long": np.int64, "ulong": np.uint64,
            "float": np.float32, "double": np.float64}
_QUALIFIERS = {"const", "__private", "private", "volatile", "restrict"}
_MEMORY = ("*", "__global", "__local", "__constant", "global ", "local ", "constant ")
_KERNEL = re.compile(r"\b(?:__)?kernel\s+(?:__attribute__\s*\(\(.*?\)\)\s*)*void\s+(\w+)\s*"
                     r"\(([^)]*)\)", re.S)


def scalar_arg_dtypes(source):
    """``{kernel name: [NumPy dtype of each scalar argument, None for a buffer or local memory
    argument]}`` read from the kernels' signatures in OpenCL C ``source``; a kernel with an
    argument of another type (a vector, a typedef) is left out."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", source, flags=re.S)
    out = {}
    for name, params in _KERNEL.findall(text):
        types = []
        for p in (x.strip() for x in params.split(",") if x.strip()):
            if any(m in p for m in _MEMORY):
                types.append(None)
                continue
            words = [w for w in p.split() if w not in _QUALIFIERS][:-1]   # the type's words
            key = ("u" + words[1] if words[:1] == ["unsigned"] and len(words) == 2 else
                   " ".join(words))
            if key not in _SCALARS:
                break
            types.append(_SCALARS[key])
        else:
            out[name] = types
    return out


class Program:
    """A built program with its kernels retrieved once (``prog.kernels[name]``), each told its
    scalar arguments' types (:func:`scalar_arg_dtypes`): pyopencl then packs a launch's
    arguments in a few microseconds instead of ~90 µs of type inspection, time in which the
    launching thread holds Python's interpreter lock (four devices' threads wait on it)."""

    def __init__(self, cl_program, source, options):
        import pyopencl as cl
        self.program = cl_program
        self.source = source
        self.options = options
        self.kernels = {k.function_name: k for k in cl_program.all_kernels()}
        self._cl = cl
        for name, types in scalar_arg_dtypes(source).items():
            k = self.kernels.get(name)
            if k is not None and k.get_info(cl.kernel_info.NUM_ARGS) == len(types):
                k.set_scalar_arg_dtypes(types)

    def work_group_limit(self, name, device):
        return self.kernels[name].get_work_group_info(
            self._cl.kernel_work_group_info.WORK_GROUP_SIZE, device)

    def local_mem_used(self, name, device):
        return self.kernels[name].get_work_group_info(
            self._cl.kernel_work_group_info.LOCAL_MEM_SIZE, device)


_programs: dict = {}
_building: dict = {}        # key -> threading.Event of a build in flight (set when it ends)
_plock = threading.Lock()


def build(context, source, options=BUILD_OPTIONS):
    """Build (or fetch from the memo) the program ``source`` for ``context``. A build of the same
    program already running in another thread (a warm-up, the engine's build threads) is waited
    for, not started twice."""
    import pyopencl as cl
    key = (context.int_ptr, hashlib.sha256(source.encode()).hexdigest(), tuple(options))
    while True:
        with _plock:
            prog = _programs.get(key)
            if prog is not None:
                return prog
            running = _building.get(key)
            if running is None:
                done = _building[key] = threading.Event()
                break
        running.wait()          # built (then memoized) or failed (then built here, and fails)
    try:
        built = cl.Program(context, source).build(options=list(options))
        prog = Program(built, source, options)
        with _plock:
            _programs.setdefault(key, prog)
            return _programs[key]
    except cl.RuntimeError as e:
        raise InvalidConfigError(f"OpenCL build failed: {e}", "build_failed") from e
    finally:
        with _plock:
            _building.pop(key, None)
        done.set()


def als_program(context, device, config: KernelConfig, f: int, device_info, implicit=False,
                biased=False, ldf=None):
    """Validate, render, build and post-check the ALS program of a configuration."""
    validate(config, f, device_info)
    src = render_als(config, f, device_info, implicit, biased, ldf)
    prog = build(context, src)
    s3 = ("s3_fcg" if config.dims else "s3_fused") if config.solver == "fusedcg" else "s3_solve"
    av = als_variables(config, f, device_info)
    needs = {"s1_hermitian": config.s1_local_size(f), s3: config.swg(f),
             "s2_rhs": av["s2_wg"], "s1_combine": av["comb_wg"]}
    if config.fused_solve:
        needs["s1s3_mma"] = config.s1_local_size(f)
    if implicit and av["gram_tiled"]:
        needs["gr_partial"] = av["gram_lg"] ** 2
    missing = sorted(set(needs) - set(prog.kernels))
    if missing:
        raise InvalidConfigError(f"the program built for {config} has no kernel(s) "
                                 f"{', '.join(missing)} (the OpenCL compiler dropped them)",
                                 "missing_kernel")
    for name, wg in needs.items():
        lim = prog.work_group_limit(name, device)
        if wg > lim:
            raise InvalidConfigError(f"kernel {name} allows work-groups of at most {lim} on this "
                                     f"device, the configuration needs {wg}", "kernel_work_group_size")
    used = max(prog.local_mem_used(n, device) for n in prog.kernels)
    if used > device_info.local_mem:
        raise InvalidConfigError(f"kernel uses {used} B local memory > device {device_info.local_mem}",
                                 "kernel_local_memory")
    return prog


def metrics_program(context, f, storage, ldf, biased=False):
    return build(context, render_metrics(f, storage, ldf, biased=biased))
