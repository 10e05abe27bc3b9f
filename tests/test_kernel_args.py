"""Kernel argument types read from the programs' sources (clmf.engine.kernels.scalar_arg_dtypes):
every kernel clmf builds is told its scalar arguments' types, so that a launch packs them
without pyopencl's per-argument type inspection (~90 µs a launch, holding the interpreter's
lock that four devices' threads share)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from clmf.engine import kernels as K
from clmf.engine.config import KernelConfig

SIGNATURES = """
/* __kernel void commented(int a) */
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void first(__global const float* restrict x, const int n, __local float* s,
           const long off, float lam, unsigned int u, __constant float* c)
{ }
kernel void second(global float *y, ulong m, const double d) { }
__kernel void vector_arg(__global float* y, const float4 v) { }
__kernel void typedef_arg(__global float* y, const real_t v) { }
__kernel void no_args() { }
"""


def test_signatures_parsed():
    """Buffers, local and constant memory are None; scalars their NumPy types (``unsigned
    int`` included); a kernel with a vector or typedef argument is left out; comments are
    not kernels."""
    got = K.scalar_arg_dtypes(SIGNATURES)
    assert got == {
        "first": [None, np.int32, None, np.int64, np.float32, np.uint32, None],
        "second": [None, np.uint64, np.float64],
        "no_args": []}


VARIANTS = ["batch+reg:solver=cholesky", "batch+reg+local+vec4+tile:tx=8,ty=2,bx=32,by=32",
            "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=8,nnz_batch=2",
            "batch+vec4+syrk:bx=8,nnz_batch=8,solver=cg",
            "batch+vec4+gemm:bx=16,nnz_batch=8,solver=cg", "batch:solver=fusedcg"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["explicit", "implicit", "biased"])
def test_every_als_kernel_typed(cl_device, variant, mode):
    """Every kernel of the ALS program of each form is typed: its signature parsed, one type
    per argument of the built kernel, and a launch takes Python numbers for its scalars (an
    untyped pyopencl kernel refuses them)."""
    import pyopencl as cl

    from clmf.engine.device import device_info, get_context
    info = device_info(cl_device)
    cfg = KernelConfig.parse(variant)
    try:
        prog = K.als_program(get_context(cl_device)[0], cl_device, cfg, 12, info,
                             implicit=mode == "implicit", biased=mode == "biased")
    except K.InvalidConfigError as e:
        pytest.skip(f"{variant} not valid here: {e}")
    types = K.scalar_arg_dtypes(prog.source)
    names = set(re.findall(r"__kernel\s+(?:__attribute__\s*\(\(.*?\)\)\s*)*void\s+(\w+)",
                           prog.source, re.S))
    assert set(prog.kernels) <= names == set(types)
    for name, k in prog.kernels.items():
        assert k.get_info(cl.kernel_info.NUM_ARGS) == len(types[name])


def test_typed_launch_takes_python_numbers(cl_device):
    """A kernel built through clmf accepts plain Python numbers for its scalar arguments."""
    import pyopencl as cl

    from clmf.engine.device import get_context
    ctx, q = get_context(cl_device)
    prog = K.build(ctx, "__kernel void kt_put(__global float* a, const int n, const float x,"
                        " const long o) { a[get_global_id(0) + o] = n * x; }")
    a = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 16)
    prog.kernels["kt_put"](q, (2,), None, a, 3, 0.5, 1)
    out = np.zeros(4, np.float32)
    cl.enqueue_copy(q, out, a)
    assert out[1] == out[2] == 1.5


def _other_sources():
    """The sources of every program clmf builds besides the ALS ones."""
    from clmf.inference import heldout as HO
    from clmf.inference.topk import TopKConfig, render_topk
    return {"reduce (CPU)": K._reduce_source(True), "reduce (GPU)": K._reduce_source(False),
            "rotate": K._rotate_source(), "layout": K.render("layout.cl.j2"),
            "convert": K.render("convert.cl.j2"),
            "metrics": K.render_metrics(10, "float32", 12),
            "metrics (biased)": K.render_metrics(10, "float32", 12, biased=True),
            "heldout": HO._source(10, 12, 12, "float32"),
            "topk": render_topk(TopKConfig(), 12, 10),
            "peak": K.render("peak.cl.j2", width=4, chains=8, unroll=1)}


def test_every_other_program_fully_typed():
    """Every kernel of every other program (reduce, rotate, layout, convert, metrics, held-out
    scores, top-k, the peak microbenchmarks) has only argument types the reader knows: none
    falls back to pyopencl's slow untyped launch."""
    for name, src in _other_sources().items():
        kernels = set(re.findall(r"__kernel\s+(?:__attribute__\s*\(\(.*?\)\)\s*)*void\s+(\w+)",
                                 src, re.S))
        assert kernels and kernels == set(K.scalar_arg_dtypes(src)), name
