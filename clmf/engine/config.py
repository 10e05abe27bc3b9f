"""The one kernel configuration object: the currency between tuner, database, builder and model.

Variant names follow one grammar, ``batch[+reg][+local][+vecN][+tile][+gemm|+syrk|+mma]`` (in that order, each
at most once), parsed by :meth:`KernelConfig.parse`; the numeric parameters ride along as
``name:key=value`` pairs, e.g. ``"batch+reg+local:tx=8,ty=8,nnz_batch=32"``.

``gemm`` is the GEMM-shaped S1 (``batch+gemm``, optionally ``batch+vec4+gemm``): lower-triangle tiles
of edge ``bx``, both operand panels staged in local memory ``nnz_batch`` entries at a time, an
``rx × ry`` register micro-tile per work-item, ``tz`` rows per work-group, and the right-hand side
(S2) computed in the diagonal tiles from the same staged panels. It stages, tiles and keeps
registers by construction, so it does not combine with ``reg``/``local``/``tile``.

``syrk`` (``batch+vec4+syrk``) computes a row's whole lower triangle in one work-group with no tile
waste: the padded f × f triangle is cut into ``bx × bx`` register micro-tiles (bx a multiple of 4),
one work-item per micro-tile of the lower triangle; the row's gathered factors are staged once per
chunk of ``nnz_batch`` entries and shared by every micro-tile; ``ks`` slices of work-items split a
chunk's entries between them (split-K) and are summed by a tree in local memory at the end, which
also makes the write-back of the full f × f matrix coalesced. The right-hand side rides along as
an extra staged column (row f of the triangle is b; implicit feedback, whose b weights differ from
the Gram's, sums it apart), so S2 is not launched. When one micro-tile covers the whole triangle
(bx ≥ f + 1) only its lower triangle is accumulated: one work-item per slice holds the row's whole
partial hermitian.

``mma`` (``batch+vec4+mma``, NVIDIA with compute capability ≥ 8.0 only) computes the row's
hermitian on the tensor cores (PTX ``mma.sync`` m16n8k8 TF32): the padded f × f lower triangle is
cut into 16 × 16 blocks held by warps in registers (``tx`` warps per slice, each a contiguous
range of the row-major triangle's blocks), ``ks`` slices split each chunk's k-groups of 8
entries, ``nnz_batch`` entries (a multiple of 8) are staged per chunk; ``precision="fp32"`` (3xTF32 split products, float32-
equivalent sums) or ``"tf32"`` (one product, 10-bit mantissas: chosen only where the accuracy
check passes). ``fused_solve`` (with ``solver="cg"``) runs the CG in the same work-group on the
system kept in local memory: nothing is written to global memory and S3 is not launched.
Other devices never build it (``validate`` rejects it with reason
``"unsupported_device"``).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re

from ..errors import InvalidConfigError

__all__ = ["KernelConfig", "VARIANT_FLAGS", "SOLVERS", "STORAGES", "SPLIT_NEVER",
           "representative_variants", "hermitian_variants", "compact_config",
           "config_text"]

VARIANT_FLAGS = ("reg", "local", "vec", "tile", "gemm", "syrk", "mma")
SOLVERS = ("cholesky", "cg", "fusedcg")
STORAGES = ("float32", "float16")
PRECISIONS = ("fp32", "tf32")
_NAME_RE = re.compile(r"^batch(\+reg)?(\+local)?(\+vec(4|8|16))?(\+tile)?(\+gemm)?(\+syrk)?(\+mma)?$")
_INT_FIELDS = ("tx", "ty", "bx", "by", "tz", "ks", "nnz_batch", "solve_wg", "solve_vec",
               "cg_steps", "batch_rows", "split", "dims_q", "dims_p", "direct")
_BOOL_FIELDS = ("reg", "local", "tile", "gemm", "syrk", "mma", "triangle", "fused_solve",
                "fused_dims", "dims_shfl", "dims_wshfl", "dims_rsum", "dims_pipe")
# the fused CG dimensions form's parameters (meaningful with fused_dims only)
DIMS_FIELDS = ("dims_q", "dims_p", "dims_shfl", "dims_wshfl", "dims_rsum", "dims_pipe")
# hard bounds of every integer field, checked whenever a configuration is made (the bounds that
# depend on f and the device, e.g. cg_steps ≤ f or the work-group limits, are checked by
# clmf.kernels.validate where both are known)
MAX_CG_STEPS = 4096
# ``split`` at this value cuts no row: a row of one side has fewer entries than the other side has
# rows (int32 column indices), so no row reaches 2^31 - 1 entries
SPLIT_NEVER = (1 << 31) - 1
INT_RANGES = {"vec": (0, 16), "tx": (1, 1 << 14), "ty": (1, 1 << 14), "tz": (1, 1 << 14),
              "bx": (0, 1 << 16), "by": (0, 1 << 16), "ks": (1, 1 << 10),
              "nnz_batch": (1, 1 << 20), "solve_wg": (0, 1 << 14), "solve_vec": (0, 16),
              "cg_steps": (1, MAX_CG_STEPS), "batch_rows": (0, (1 << 31) - 1),
              "split": (0, SPLIT_NEVER), "dims_q": (1, 16), "dims_p": (0, 1 << 14),
              "direct": (0, 64)}
_DIGITS = re.compile(r"^[0-9]{1,12}$")      # ASCII digits only (int() takes "1_0", "１", " +3")
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


def _show(v):
    """A bounded, printable rendering of an untrusted value for an error message."""
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _pow2(x):
    return x > 0 and (x & (x - 1)) == 0


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One kernel configuration for one side (users or items) of an ALS half-step.

    Parameters
    ----------
    reg, local, vec, tile : the variant flags; ``vec`` is 0 (scalar) or the vector width 4/8/16
    tx, ty : work-items per work-group in each dimension of the S1 output block (the baseline
        ``batch`` variant uses ``tx*ty`` work-items per row, flat)
    bx, by : S1 tile edge (``tile``/``gemm``; 0 means the whole f); ``syrk``: the micro-tile edge
    tz : rows of a batch handled by one work-group at once (``tile``/``gemm`` only)
    ks : ``syrk`` only: slices of work-items that split a row's entries (a power of two)
    nnz_batch : rows of Y staged in local memory per step (``local``/``gemm``/``syrk``)
    solve_wg : work-items per system in S3 (a power of two ≤ f); 0 = the largest power of two
        ≤ min(f, 64). At 1, S2 also runs one work-item per row and both walk the factors in an
        inner, contiguous loop (what CPU compilers vectorise)
    solve_vec : 0, or 4/8/16: with the fused CG at one work-item per system (``swg(f) == 1``),
        that work-item's CG (and S2, one work-item per row) is written in explicit float vectors
        of this width, for compilers that vectorise across work-items rather than along loops
        (Intel's CPU runtime runs the scalar one-work-item form as scalar code); ignored
        elsewhere (:meth:`svec`)
    solver : "cholesky" (default), "cg" (cuMF's batched CG on the built hermitians) or "fusedcg"
        (CG applying A from the row's entries, S1 skipped); cg_steps their iterations
    storage : "float32" or "float16" (factors stored as half, compute in float32)
    triangle : compute only the lower triangle of each hermitian and mirror it
    batch_rows : rows per S1/S2/S3 launch; 0 = sized from device memory (the scratch; the fused
        CG's dimensions form keeps none: up to :data:`clmf.engine.memory.MAX_BATCH_ROWS`)
    split : most entries of a row one S1 work-group sums (long rows are cut into pieces of at
        most ``split`` entries, summed by a combine kernel: :func:`clmf.engine.memory.plan_split`);
        0 = automatic (the rule in :func:`clmf.engine.memory.split_threshold`), 1 ..
        ``SPLIT_NEVER`` - 1 = that many, ``SPLIT_NEVER`` (2^31 - 1) = never split. The fused CG
        solver and ``fused_solve`` build no hermitians and ignore it; so do multi-device fits
    fused_solve : ``mma`` with ``solver="cg"`` only: the CG runs in the S1 work-group
    direct : ``mma`` with ``ks = 1`` and no ``fused_solve`` only: 0 = the slices' sums go
        through the packed f × f triangle in local memory; N ≥ 1 = each warp writes its blocks of
        the hermitian to global memory from its registers (both triangles), so local memory holds
        only the staged chunk — the form for f whose triangle does not fit (at 48 KB: f > 144,
        e.g. 256) —, and a row's blocks are shared by N work-groups (each stages the row's
        entries, mostly from L2: the groups of a row run side by side), so fewer accumulators
        per work-item at large f
    fused_dims : with ``solver="fusedcg"`` (ignored with the other solvers: :attr:`dims`) and
        ``vec4`` (the S1 flags serve only implicit feedback's Gram matrix, as with every fused
        CG): the fused CG's dimensions form for GPUs
        (``cl_kernels/solve_fcgdims.cl.j2``): the ``solve_wg`` work-items of a row split every
        entry's factor row into float4 slices and the row's entries into groups, so each CG step
        gathers a row once, coalesced, and the right-hand side is formed in the first pass (S2
        is not launched); ``nnz_batch`` entries per group are held in registers per chunk
    dims_shfl : ``fused_dims`` only, NVIDIA (PTX): an entry's D parts of ``y·v`` summed by a
        butterfly of warp shuffles over its D lanes instead of through local memory (no
        barriers in the chunk loop; D a power of two ≤ 32, whole warps; dims_p then does not
        apply): :func:`clmf.engine.kernels.dims_shuffle`
    dims_wshfl : ``dims_shfl`` only: lane d of an entry's D lanes loads the weight factors of its
        group's entry d (so nnz_batch ≤ D) and the lanes take them by shuffles after the sums,
        instead of every lane loading every entry's (one load and two registers per lane
        instead of nnz_batch each; the same values)
    dims_rsum : ``dims_shfl`` only (not with ``dims_wshfl``, whose loads it replaces): the
        entry group's sums as a reduce-scatter over its D lanes (nnz_batch a power of two ≤ D):
        each lane ends with one entry's sum, forms its weight (the factors loaded by that lane)
        and hands it to the others: 2·nnz_batch - 1 + log2(D/nnz_batch) shuffles per chunk
        instead of nnz_batch·log2(D) and more (a different summation order: not bit for bit
        the butterflies)
    dims_pipe : ``fused_dims`` only: the gathers software-pipelined — each chunk's rows loaded
        while the previous chunk's are summed and applied (twice the gathered rows in registers,
        so ``2·q·nnz_batch`` ≤ 16 float4s; the same arithmetic and values)
    dims_q : ``fused_dims`` only: float4 slices of every vector per work-item, at least (more
        where ``solve_wg`` work-items with this many do not cover f; at most f/4 rounded up), so
        ``f/4/dims_q`` work-items share an entry and the work-group holds more entry groups;
        1 = as few as cover f (the original geometry)
    dims_p : ``fused_dims`` only: work-items that sum one entry's parts of ``y·v`` (each a
        share, the shares added where the weights are applied); 1 = one work-item per entry
        (the original form), 0 = as many as the work-group holds (at most the parts per entry)

    Examples
    --------
    >>> KernelConfig.parse("batch+reg+local:tx=4,ty=4").name
    'batch+reg+local'
    """

    reg: bool = False
    local: bool = False
    vec: int = 0
    tile: bool = False
    gemm: bool = False
    syrk: bool = False
    mma: bool = False
    tx: int = 8
    ty: int = 8
    bx: int = 0
    by: int = 0
    tz: int = 1
    ks: int = 1
    nnz_batch: int = 32
    solve_wg: int = 0
    solve_vec: int = 0
    solver: str = "cholesky"
    cg_steps: int = 3
    storage: str = "float32"
    precision: str = "fp32"
    triangle: bool = True
    batch_rows: int = 0
    split: int = 0
    fused_solve: bool = False
    fused_dims: bool = False
    direct: int = 0
    dims_shfl: bool = False
    dims_wshfl: bool = False
    dims_rsum: bool = False
    dims_pipe: bool = False
    dims_q: int = 1
    dims_p: int = 1

    def __post_init__(self):
        # a configuration may come from an untrusted tuning record or a --variant string: every
        # field has its exact type (bools are bools, integers are ints, not floats or strings),
        # integers lie in bounded ranges and enumerations are checked, so nothing but these
        # whitelisted values ever reaches a kernel template or its comment
        for k in _BOOL_FIELDS:
            v = getattr(self, k)
            if type(v) is not bool:
                raise InvalidConfigError(f"{k} must be true or false, not {_show(v)}", k)
        for k in ("solver", "storage", "precision"):
            v = getattr(self, k)
            if type(v) is not str:
                raise InvalidConfigError(f"{k} must be a string, not {_show(v)}", k)
        if type(self.vec) is not int or self.vec not in (0, 4, 8, 16):
            raise InvalidConfigError(f"vector width must be 0, 4, 8 or 16, not {_show(self.vec)}",
                                     "vec")
        if self.solver not in SOLVERS:
            raise InvalidConfigError(f"unknown solver {_show(self.solver)}; choose from {SOLVERS}",
                                     "solver")
        if self.storage not in STORAGES:
            raise InvalidConfigError(f"unknown storage {_show(self.storage)}; choose from "
                                     f"{STORAGES}", "storage")
        if self.precision not in PRECISIONS:
            raise InvalidConfigError(f"unknown precision {_show(self.precision)}; choose from "
                                     f"{PRECISIONS}", "precision")
        if self.precision != "fp32" and not self.mma:
            raise InvalidConfigError("precision tf32 is a parameter of the mma variant", "precision")
        for k in _INT_FIELDS:
            v = getattr(self, k)
            lo, hi = INT_RANGES[k]
            if type(v) is not int:
                raise InvalidConfigError(f"{k} must be an integer, not {_show(v)}", k)
            if not lo <= v <= hi:
                raise InvalidConfigError(f"{k} must be in [{lo}, {hi}], not {v}", k)
        if self.cg_steps < 1:
            raise InvalidConfigError("cg_steps must be ≥ 1", "cg_steps")
        if self.gemm and (self.reg or self.local or self.tile):
            raise InvalidConfigError("gemm stages in local memory, keeps register tiles and tiles the "
                                     "triangle by itself: it combines only with +vec4", "name")
        if self.gemm and self.vec not in (0, 4):
            raise InvalidConfigError("gemm takes vec4 (vector local loads) or no vector", "vec")
        if self.syrk:
            if self.reg or self.local or self.tile or self.gemm or self.vec != 4:
                raise InvalidConfigError("syrk stages, keeps register micro-tiles and covers the "
                                         "triangle by itself with float4 loads: it is "
                                         "batch+vec4+syrk only", "name")
            if self.bx % 4:
                raise InvalidConfigError(f"syrk micro-tile edge bx must be a multiple of 4 "
                                         f"(0: 8), not {self.bx}", "bx")
            if not _pow2(self.ks):
                raise InvalidConfigError(f"ks must be a power of two, not {self.ks}", "ks")
        if self.mma:
            if self.reg or self.local or self.tile or self.gemm or self.syrk or self.vec != 4:
                raise InvalidConfigError("mma stages, keeps register tiles and covers the triangle "
                                         "by itself with float4 loads: it is batch+vec4+mma only",
                                         "name")
            if self.nnz_batch % 8:
                raise InvalidConfigError(f"mma stages k-groups of 8 entries: nnz_batch must be a "
                                         f"multiple of 8, not {self.nnz_batch}", "nnz_batch")
            if not _pow2(self.ks) or self.ks > 8:
                raise InvalidConfigError(f"mma ks must be a power of two ≤ 8, not {self.ks}", "ks")
            if self.tx > 32:
                raise InvalidConfigError(f"mma tx (warps per slice) must be ≤ 32, not {self.tx}",
                                         "tx")
        if self.direct and not (self.mma and self.ks == 1 and not self.fused_solve):
            raise InvalidConfigError("direct (the hermitian written from the warps' registers) is "
                                     "an mma parameter with ks=1 and no fused_solve", "direct")
        if self.direct and self.tx * self.direct > 64:
            raise InvalidConfigError(f"mma direct={self.direct} work-groups of {self.tx} warps: at "
                                     "most 64 warps per row", "direct")
        if self.fused_solve and not (self.mma and self.solver == "cg"):
            raise InvalidConfigError("fused_solve (CG in the S1 work-group, the system kept in "
                                     "local memory) is an mma parameter with solver=cg",
                                     "fused_solve")
        if self.dims and self.vec != 4:
            raise InvalidConfigError("fused_dims (the fused CG in float4 slices of the factor "
                                     "rows) takes +vec4 (rows padded to whole float4s)", "vec")
        if self.dims_wshfl and not self.dims_shfl:
            raise InvalidConfigError("dims_wshfl (the weights shared by shuffles) is a parameter "
                                     "of dims_shfl", "dims_shfl")
        if self.dims_rsum and not self.dims_shfl:
            raise InvalidConfigError("dims_rsum (the entry sums reduce-scattered by shuffles) is "
                                     "a parameter of dims_shfl", "dims_shfl")
        if self.dims_rsum and self.dims_wshfl:
            raise InvalidConfigError("dims_rsum loads each entry's weight in the lane that sums "
                                     "it: dims_wshfl does not apply", "dims_wshfl")
        if self.dims_pipe and not self.fused_dims:
            raise InvalidConfigError("dims_pipe (the gathers pipelined) is a parameter of "
                                     "fused_dims", "fused_dims")
        if self.dims_shfl and not self.fused_dims:
            raise InvalidConfigError("dims_shfl (the entry sums as warp shuffles) is a parameter "
                                     "of fused_dims", "fused_dims")
        if (self.dims_q != 1 or self.dims_p != 1) and not self.fused_dims:
            raise InvalidConfigError("dims_q and dims_p (slices per work-item, work-items per "
                                     "entry's sum) are parameters of fused_dims", "fused_dims")
        if not self.syrk and not self.mma and self.ks != 1:
            raise InvalidConfigError("ks (split-K slices) is a syrk or mma parameter", "ks")
        if self.solve_wg and not _pow2(self.solve_wg):
            raise InvalidConfigError(f"solve_wg must be a power of two, not {self.solve_wg}", "solve_wg")
        if self.solve_vec not in (0, 4, 8, 16):
            raise InvalidConfigError(f"solve_vec must be 0, 4, 8 or 16, not {self.solve_vec}",
                                     "solve_vec")

    # ----- names ---------------------------------------------------------------------------
    @property
    def name(self):
        """The variant's name in the ``batch[+reg][+local][+vecN][+tile]`` grammar."""
        s = "batch"
        if self.reg:
            s += "+reg"
        if self.local:
            s += "+local"
        if self.vec:
            s += f"+vec{self.vec}"
        if self.tile:
            s += "+tile"
        if self.gemm:
            s += "+gemm"
        if self.syrk:
            s += "+syrk"
        if self.mma:
            s += "+mma"
        return s

    @classmethod
    def parse(cls, text, **overrides):
        """Parse ``"batch+reg:tx=4,ty=4"``; keyword ``overrides`` win over the text's pairs."""
        if isinstance(text, KernelConfig):
            return dataclasses.replace(text, **overrides) if overrides else text
        if not isinstance(text, str):
            raise TypeError(f"a variant is a name string or KernelConfig, not {type(text).__name__}")
        head, _, tail = text.strip().partition(":")
        m = _NAME_RE.match(head.strip())
        if not m:
            raise InvalidConfigError(
                f"unknown variant {text!r}: expected "
                "batch[+reg][+local][+vec4|8|16][+tile][+gemm|+syrk|+mma] "
                "(flags in that order)", "name")
        kw = dict(reg=bool(m.group(1)), local=bool(m.group(2)),
                  vec=int(m.group(4)) if m.group(4) else 0, tile=bool(m.group(5)),
                  gemm=bool(m.group(6)), syrk=bool(m.group(7)), mma=bool(m.group(8)))
        if tail.strip():
            for pair in tail.split(","):
                k, eq, v = pair.partition("=")
                k = k.strip()
                if not eq or k not in {f.name for f in dataclasses.fields(cls)} or k in VARIANT_FLAGS:
                    raise InvalidConfigError(f"bad parameter {pair!r} in variant {text!r}", "name")
                v = v.strip()
                if k in ("solver", "storage", "precision"):
                    kw[k] = v
                elif k in _BOOL_FIELDS:
                    if v.lower() not in _TRUE + _FALSE:
                        raise InvalidConfigError(f"parameter {k} must be 0/1/true/false, "
                                                 f"not {_show(v)}", k)
                    kw[k] = v.lower() in _TRUE
                else:
                    if not _DIGITS.match(v):
                        raise InvalidConfigError(f"parameter {k} must be a non-negative integer "
                                                 f"of at most 12 ASCII digits, not {_show(v)}", k)
                    kw[k] = int(v)
        kw.update(overrides)
        return cls(**kw)

    def replace(self, **kw):
        """A copy with the fields ``kw`` changed (checked like a new configuration)."""
        return dataclasses.replace(self, **kw)

    def to_dict(self):
        """The fields as a plain dict (JSON-serialisable; every field is a scalar, so no deep
        copy: ``dataclasses.asdict`` took 0.3 ms a call, most of a tuning lookup's time)."""
        return {f.name: getattr(self, f.name) for f in _FIELDS}

    @classmethod
    def from_dict(cls, d):
        """The configuration of a ``to_dict()`` mapping (e.g. a tuning record's ``config``),
        checked field by field like any other (raises :class:`InvalidConfigError`)."""
        if not isinstance(d, dict):
            raise InvalidConfigError(f"a configuration is a JSON object, not {_show(d)}", "schema")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in d if k not in names]
        if unknown:
            raise InvalidConfigError(f"unknown configuration fields "
                                     f"{_show(sorted(map(str, unknown)))}", "schema")
        return cls(**d)

    def __str__(self):
        base = KernelConfig()
        diff = [f"{k}={v}" for k, v in self.to_dict().items()
                if k not in VARIANT_FLAGS and v != getattr(base, k)]
        return self.name + (":" + ",".join(diff) if diff else "")

    def key(self):
        """A canonical JSON string of the fields (a dictionary key)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    # ----- geometry -------------------------------------------------------------------------
    def ldf(self, f):
        """Leading dimension of the factor matrices: f rounded up to the vector width."""
        from ..tuning.spec import leading_dim
        return leading_dim(f, self.vec)

    def swg(self, f):
        """S3 work-group size at ``f`` factors (resolves ``solve_wg=0``)."""
        if self.solve_wg:
            return self.solve_wg
        p = 1
        while p * 2 <= min(max(f, 1), 64):
            p *= 2
        return p

    def svec(self, f):
        """The explicit vector width of the one-work-item fused CG at ``f`` factors (0: scalar
        loops, or ``solve_vec`` does not apply: another solver or work-items per system)."""
        return (self.solve_vec if self.solver == "fusedcg" and not self.dims
                and self.swg(f) == 1 else 0)

    @property
    def dims(self):
        """True when the fused CG runs in its dimensions form (``fused_dims`` with the fused CG
        solver; another solver ignores the field, e.g. where a multi-device fit's reduced side
        swaps the fused CG for ``cg``)."""
        return self.fused_dims and self.solver == "fusedcg"

    def s1_local_size(self, f=None):
        """Work-items of one S1 work-group (``syrk``: depends on ``f``, which it then needs)."""
        if self.syrk or self.mma:
            if f is None:
                raise ValueError("the syrk/mma work-group size depends on f")
            return self.s1_geometry(f)["wg"]
        return self.tx * self.ty * (self.tz if (self.tile or self.gemm) else 1)

    @property
    def fuses_rhs(self):
        """True when S1 also computes the right-hand sides (S2 is then not launched)."""
        if self.dims:                       # b is formed in the fused CG's first pass
            return True
        return (self.gemm or self.syrk or self.mma) and self.solver != "fusedcg"

    def dims_entry_items(self, f):
        """The dims form's ``(f4, q, d)`` at ``f`` unknowns: float4 slices, slices per work-item
        and work-items per entry before ``dims_shfl`` rounds ``d`` up to a power of two."""
        f4 = -(-f // 4)
        q = min(f4, max(self.dims_q, -(-f4 // self.swg(f))))
        return f4, q, -(-f4 // q)

    def fcg_geometry(self, f):
        """The fused CG dimensions form's geometry at ``f`` unknowns: float4 slices ``f4``,
        ``q`` per work-item, ``d`` work-items per entry, ``e`` entry groups, ``nb`` entries per
        group and chunk, ``held`` entries a group holds gathered (two chunks' with
        ``dims_pipe``), ``p`` work-items per entry's sum of parts, ``t`` sums per work-item,
        ``tree`` the strides of the groups' sums (``fused_dims`` only)."""
        swg = self.swg(f)
        f4, q, d = self.dims_entry_items(f)
        if self.dims_shfl:
            # the shuffles sum over power-of-two segments of a warp: D rounded up, the slices
            # past F4 read as 0 (f = 200, dims_q=4: 13 -> 16 work-items an entry, 14 of 64
            # slices empty; a work-item may hold none)
            d = 1 << (d - 1).bit_length()
        e = swg // d
        ch = e * self.nnz_batch
        p = self.dims_p or max(1, min(swg // ch, d))
        levels = (e - 1).bit_length()              # the groups' sums: a tree over 2^levels ≥ e
        return dict(fd_f4=f4, fd_q=q, fd_d=d, fd_e=e, fd_nb=self.nnz_batch,
                    fd_held=self.nnz_batch * (2 if self.dims_pipe else 1), fd_p=p,
                    fd_t=-(-ch * p // swg), fd_tree=[1 << (levels - i) for i in range(1, levels + 1)])

    def tile_edges(self, f):
        """(bx, by) of the S1 output block one work-group computes."""
        if self.syrk or self.mma:
            return (f, f)
        if self.gemm:
            b = min(self.bx or f, f)
            return (b, b)
        if self.tile:
            return (min(self.bx or f, f), min(self.by or f, f))
        return (f, f)

    def s1_geometry(self, f):
        """Derived S1 geometry (template variables and launch shape) at ``f`` factors."""
        vw = self.vec or 1
        bx, by = self.tile_edges(f)
        if self.syrk:
            return self._syrk_geometry(f)
        if self.mma:
            return self._mma_geometry(f)
        if self.gemm:
            return self._gemm_geometry(f, bx, vw)
        rx = -(-bx // self.tx)
        jw = -(-(rx * self.tx) // vw) * vw
        ryv = -(-by // (self.ty * vw))
        kw = ryv * self.ty * vw
        if self.tile:
            koff, cols = jw, jw + kw
            nti, ntj = -(-f // bx), -(-f // by)
            tri = self.triangle and bx == by
            nt = nti * (nti + 1) // 2 if tri else nti * ntj
            tz = self.tz
        else:
            koff, cols = 0, max(jw, kw)
            ntj, nt, tri, tz = 1, 1, False, 1
        pitch = cols + (1 if vw == 1 else 0)
        return dict(vw=vw, bx=bx, by=by, rx=rx, ryv=ryv, jw=jw, kw=kw, koff=koff, cols=cols,
                    pitch=pitch, ntj=ntj, nt=nt, tri_tiles=tri, tz_eff=tz)

    def _gemm_geometry(self, f, b, vw):
        # micro-tile rx × ry per work-item; with vec4 the rows/columns a work-item owns are
        # contiguous (vector local loads), else strided by tx/ty (conflict-free scalar loads)
        rx, ry = -(-b // self.tx), -(-b // self.ty)
        if vw > 1:
            rx, ry = -(-rx // vw) * vw, -(-ry // vw) * vw
        pw = max(self.tx * rx, self.ty * ry)
        pw = -(-pw // vw) * vw
        nti = -(-f // b)
        return dict(vw=vw, bx=b, by=b, rx=rx, ry=ry, pw=pw, pitch=pw, nti=nti,
                    nt=nti * (nti + 1) // 2, tz_eff=self.tz, tri_tiles=True,
                    qb=-(-b // (self.tx * self.ty)))

    def _syrk_geometry(self, f):
        # r × r micro-tiles over the triangle of f padded to nti·r; one work-item per micro-tile
        # of the lower triangle (nth per slice), ks slices; the staged row of fp floats is stored
        # as r/4 planes of nti float4s (plane h holds part h of every micro-tile: a warp's loads of
        # consecutive micro-tiles read consecutive float4s)
        r = self.bx or 8
        nti = -(-(f + 1) // r)                    # one more row: b rides along as row f
        fp = nti * r
        nth = nti * (nti + 1) // 2
        single = nti == 1
        nacc = r * (r + 1) // 2 if single else r * r
        qb = -(-(fp // 4) // nth)                  # right-hand-side float4s per work-item
        wg = nth * self.ks
        nb = self.nnz_batch
        panel = nb * fp + 2 * nb
        # the split-K tree sums slice pairs through `slots` slices' worth of local memory at a
        # time (as many as fit in 8192 floats, at least one): level h, slices [h + g, h + g + p)
        # hand over to [g, g + p)
        per_slot = nth * (nacc + 4 * qb)
        slots = max(1, min(self.ks // 2, 8192 // per_slot))
        rounds = [(h, g, min(slots, h - g)) for h in (self.ks >> i for i in range(1, self.ks.bit_length()))
                  for g in range(0, h, slots)]
        red = slots * per_slot if self.ks > 1 else 0
        packed = fp * (fp + 1) // 2 + fp
        lds = -(-max(panel, red, packed) // 4) * 4
        return dict(vw=4, bx=f, by=f, r=r, nti=nti, fp=fp, nth=nth, single=single, nacc=nacc,
                    qb=qb, wg=wg, ks=self.ks, lds_floats=lds, nt=1, tz_eff=1, tri_tiles=True,
                    spt=-(-(nb * fp // 4) // wg), ept=-(-nb // wg), slots=slots, rounds=rounds)

    def _mma_geometry(self, f):
        # f padded to 16-row blocks; the nblk blocks of the lower triangle spread over the tx
        # warps of a slice (slots per warp); ks slices; staging as k-groups of 8 entries, each
        # fp * 8 + 8 floats (see hermitian_mma.cl.j2)
        fp = -(-f // 16) * 16
        ntb = fp // 16
        nblk = ntb * (ntb + 1) // 2
        wb = self.tx
        parts = max(1, self.direct)                # work-groups per row
        wg = 32 * wb * self.ks
        nb = self.nnz_batch
        staged = (nb // 8) * (fp * 8 + 8) + 2 * nb
        packed = 0 if self.direct else 256 * nblk
        p2 = 1 << (wg - 1).bit_length()            # the fused CG's reduction tree
        solve = 4 * fp + p2 if self.fused_solve else 0
        tri = [(i, j) for i in range(ntb) for j in range(i + 1)]
        nw = wb * parts                            # a row's warps (slices' aside)
        warp_blocks = [[list(tri[p]) for p in range(w * nblk // nw, (w + 1) * nblk // nw)]
                       for w in range(nw)]        # warp w's contiguous range (as the kernel's)
        return dict(vw=4, bx=f, by=f, fp=fp, ntb=ntb, nblk=nblk, wb=wb, ks=self.ks, wg=wg,
                    parts=parts, packed_floats=packed, p2=p2, warp_blocks=warp_blocks,
                    slots=-(-nblk // nw), lds_floats=max(staged, packed + solve), nt=1, tz_eff=1,
                    tri_tiles=True, spt=-(-(nb * fp // 4) // wg), ept=-(-nb // wg),
                    qb=-(-f // wg))

    def s1_groups(self, f, nrows):
        """Number of S1 work-groups for a batch of ``nrows`` rows."""
        if self.mma:
            return nrows * max(1, self.direct)
        if self.syrk:
            return nrows
        if not (self.reg or self.local or self.vec or self.tile or self.gemm):
            return nrows
        g = self.s1_geometry(f)
        return -(-nrows // g["tz_eff"]) * g["nt"]

    def local_mem_bytes(self, f, device_local=None):
        """Local memory the S1 kernel of this configuration declares, by formula (bytes)."""
        if self.syrk or self.mma:
            return 4 * self.s1_geometry(f)["lds_floats"]
        if self.gemm:
            g = self.s1_geometry(f)
            nb = self.nnz_batch
            return 4 * g["tz_eff"] * ((nb * 2 * g["pitch"] + 3) // 4 * 4 + (2 * nb + 3) // 4 * 4)
        if not self.local:
            return 0
        g = self.s1_geometry(f)
        return 4 * g["tz_eff"] * self.nnz_batch * g["pitch"]

    def chol_local_bytes(self, f):
        return 4 * (f * f + 2 * f) + 16


_FIELDS = dataclasses.fields(KernelConfig)     # (to_dict's, in declaration order)


def compact_config(d):
    """A configuration mapping (a tuning record's ``config``) without the fields at their
    defaults: one text per configuration, whichever fields the writing version knew
    (:meth:`KernelConfig.from_dict` fills them in again); other keys are kept."""
    base = _defaults()
    return {k: v for k, v in d.items() if k not in base or v != base[k]}


def config_text(d):
    """One JSON text per configuration mapping, whichever fields its record's version wrote
    (the :func:`compact_config` form, keys sorted): records group by it."""
    return _compact_text(json.dumps(d, sort_keys=True))


@functools.lru_cache(maxsize=4096)
def _compact_text(text):
    return json.dumps(compact_config(json.loads(text)), sort_keys=True)


@functools.lru_cache(maxsize=1)
def _defaults():
    """The default configuration's fields (a mapping: do not modify)."""
    return KernelConfig().to_dict()


def representative_variants(f=None):
    """Variant strings that together exercise every template path (used by the correctness and
    Oclgrind tests; kept small because every entry costs a kernel build per device and f).
    Checks compare each with the reference of the same solver (CG: same steps, same start) and
    a float16-storage variant at a 1e-2 tolerance."""
    return [
        "batch:tx=4,ty=4",
        "batch:tx=3,ty=5,batch_rows=7,triangle=0",
        "batch+reg:tx=4,ty=4",
        "batch+local:tx=4,ty=2,nnz_batch=5",
        "batch+reg+local:tx=4,ty=4,nnz_batch=8",
        "batch+reg+local+vec4:tx=4,ty=2,nnz_batch=8",
        "batch+vec8:tx=2,ty=2",
        "batch+reg+local+tile:tx=4,ty=4,bx=8,by=8,tz=2,nnz_batch=8",
        "batch+reg+local+vec4+tile:tx=2,ty=2,bx=8,by=8,tz=2,nnz_batch=6",
        "batch+local+tile:tx=2,ty=4,bx=6,by=6,nnz_batch=4,triangle=0",
        "batch+reg+tile:tx=4,ty=4,bx=16,by=8",
        "batch+reg+local:tx=4,ty=4,nnz_batch=8,solver=cg,cg_steps=3",
        "batch+local+tile:tx=4,ty=4,bx=8,by=8,nnz_batch=8,solver=cg,cg_steps=2,batch_rows=5",
        "batch+reg+local+vec4:tx=4,ty=2,nnz_batch=8,storage=float16",
        "batch:tx=4,ty=4,storage=float16,solver=cg",
        "batch:solver=fusedcg,cg_steps=3,batch_rows=7",
        "batch:solver=fusedcg,cg_steps=2,solve_wg=2",
        # the one-work-item fused CG (and S2) in explicit vectors: ragged last vector at every f
        # but 16 (f < SVW: that vector alone), half storage
        "batch:solver=fusedcg,solve_wg=1,solve_vec=8,batch_rows=7",
        "batch:solver=fusedcg,solve_wg=1,solve_vec=16,storage=float16",
        "batch+gemm:tx=3,ty=2,bx=7,tz=3,nnz_batch=4,batch_rows=7",
        "batch+vec4+gemm:tx=2,ty=2,bx=8,tz=2,nnz_batch=5",
        "batch+vec4+gemm:tx=2,ty=4,bx=12,nnz_batch=8,solver=cg,storage=float16",
        "batch+reg+vec8:tx=4,ty=1,solve_wg=1,solver=cg",
        "batch+reg:tx=4,ty=4,solve_wg=1,batch_rows=7",
        "batch+vec4+syrk:bx=4,ks=2,nnz_batch=5,batch_rows=7",
        "batch+vec4+syrk:bx=8,ks=32,nnz_batch=16,solver=cg",
        "batch+vec4+syrk:bx=16,ks=8,nnz_batch=8,storage=float16",
        # the fused CG's dimensions form: several entry groups and a ragged chunk (F4 not a
        # multiple of the work-items), slices per work-item > 1 (2 work-items), half storage;
        # more work-items than unknowns at small f
        "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=8,nnz_batch=3,batch_rows=7",
        "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=2,nnz_batch=2,storage=float16",
        "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=32,nnz_batch=4,cg_steps=2",
        # ... with more slices per work-item than needed (so more entry groups), and the sums of
        # an entry's parts spread over several work-items (as many as fit / exactly 3)
        "batch+vec4:solver=fusedcg,fused_dims=1,dims_q=2,dims_p=0,solve_wg=16,nnz_batch=1",
        "batch+vec4:solver=fusedcg,fused_dims=1,dims_p=3,solve_wg=16,nnz_batch=3,batch_rows=7",
        # tensor cores (NVIDIA; elsewhere its emulation, CLMF_MMA_EMULATION=1)
        "batch+vec4+mma:tx=2,ks=2,nnz_batch=16,batch_rows=7",
        "batch+vec4+mma:tx=3,nnz_batch=8,solver=cg,fused_solve=1",
        # ... its blocks written from the registers, two work-groups a row
        "batch+vec4+mma:tx=2,nnz_batch=8,direct=2",
        # the dims form's entry sums as warp shuffles (NVIDIA; elsewhere their emulation,
        # CLMF_SHFL_EMULATION=1; D rounded up to a power of two where f makes it none)
        "batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_q=2,solve_wg=32,nnz_batch=2",
        "batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_wshfl=1,dims_q=2,solve_wg=32,"
        "nnz_batch=2",
        "batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_rsum=1,dims_q=2,solve_wg=32,"
        "nnz_batch=2",
        # the gathers pipelined a chunk ahead, with the local-memory sums and with the shuffles
        "batch+vec4:solver=fusedcg,fused_dims=1,dims_pipe=1,dims_q=2,solve_wg=16,nnz_batch=3",
        "batch+vec4:solver=fusedcg,fused_dims=1,dims_shfl=1,dims_rsum=1,dims_pipe=1,dims_q=2,"
        "solve_wg=32,nnz_batch=2",
        # long rows cut into pieces of 3 (resp. 5) entries, pieces and batches interleaved
        "batch:tx=4,ty=4,split=3,batch_rows=4",
        "batch+vec4+syrk:bx=4,ks=2,nnz_batch=5,split=5,batch_rows=7",
    ]


def hermitian_variants(per_family=False):
    """The configurations of :func:`representative_variants` that build the hermitians (every S1
    variant except the fused CG's, which applies A from the entries), each with the Cholesky and
    the CG solver of the built systems (the checks of implicit feedback and biases on the
    hermitian path); ``per_family``: one per S1 family (flags, long rows split or not), the
    solvers alternating."""
    out = []
    for v in representative_variants():
        c = KernelConfig.parse(v)
        if c.solver == "fusedcg" or c.fused_solve:
            continue
        for s in ("cholesky", "cg"):
            x = c.replace(solver=s)
            if x not in out:
                out.append(x)
    if not per_family:
        return out
    fam, seen = [], set()
    for c in out:
        key = (c.name, bool(c.split))
        if c.solver == "cholesky" and key not in seen:
            seen.add(key)
            fam.append(c.replace(solver=("cholesky", "cg")[len(fam) % 2]))
    return fam
