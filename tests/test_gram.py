"""The implicit Gram kernels (``cl_kernels/gram.cl.j2``: ``gr_partial`` then ``gr_sum``) against
NumPy's YᵀY on every device: tile edges (f not a multiple of the tile, one and several tiles per
edge), one chunk and many (a short last chunk), no rows at all, half-precision factors and
padded rows, and the smaller work-groups of devices that allow fewer than 256 work-items; and
the CPUs' path (the side's S1 over virtual rows, :func:`clmf.engine.memory.gram_tiled`) against
them."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from clmf.engine import kernels as K
from clmf.engine.config import KernelConfig
from clmf.engine.device import device_info
from clmf.engine.launch import gram_buffers, launch_gram
from clmf.engine.memory import GRAM_CHUNKS, gram_geometry, gram_tiled


def _tiled_program(ctx, cfg, f, info, ldf=None):
    """The ALS program with the tiled Gram kernels, whatever the device's own path (rendered
    as for a GPU: CPUs run the S1 path in fits, these checks run the kernels on them too)."""
    return K.build(ctx, K.render_als(cfg, f, dataclasses.replace(info, type="GPU"),
                                     implicit=True, ldf=ldf))


def _gram(cl_device, f, rows, *, storage="float32", max_wg=None, seed=0):
    """G from the kernels and from NumPy (float64) for ``rows`` random rows of ``f`` factors."""
    import pyopencl as cl
    info = device_info(cl_device)
    if max_wg is not None:
        info = dataclasses.replace(info, max_work_group_size=max_wg)
    cfg = KernelConfig.parse("batch" + (":storage=float16" if storage == "float16" else ""))
    ctx = cl.Context([cl_device])
    q = cl.CommandQueue(ctx)
    ldf = cfg.ldf(f) + 3                    # padded rows: the kernels must read LDF, not F
    prog = _tiled_program(ctx, cfg, f, info, ldf)
    rng = np.random.default_rng(seed)
    Y = rng.standard_normal((max(rows, 1), ldf)).astype(np.float32)
    Y[:, f:] = np.nan                        # the padding must never be read into G
    host = Y.astype(np.float16) if storage == "float16" else Y
    geo = gram_geometry(f, rows, info.max_work_group_size)
    mf = cl.mem_flags
    dY = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=host)
    P = cl.Buffer(ctx, mf.READ_WRITE, size=geo.partial_bytes)
    G = cl.Buffer(ctx, mf.READ_WRITE, size=4 * f * f)
    launch_gram(prog.kernels, q, cfg, f, {"geo": geo, "rows": rows, "P": P}, dY, None, None, G)
    out = np.empty((f, f), np.float32)
    cl.enqueue_copy(q, out, G)
    ref = host[:rows, :f].astype(np.float64)
    return out, ref.T @ ref, geo


@pytest.mark.parametrize("f,rows", [(1, 7), (3, 300), (17, 1000), (64, 513), (100, 2000),
                                    (130, 257)])
def test_gram_matches_numpy(cl_device, f, rows):
    out, ref, geo = _gram(cl_device, f, rows)
    scale = np.abs(ref).max()
    assert np.allclose(out, ref, rtol=1e-5, atol=1e-5 * scale), np.abs(out - ref).max() / scale
    assert np.array_equal(out, out.T)          # both triangles from one tile's sums


def test_many_chunks_and_a_short_last_one(cl_device):
    rows = GRAM_CHUNKS * 256 + 77
    out, ref, geo = _gram(cl_device, 20, rows, seed=1)
    assert geo.chunks == GRAM_CHUNKS and geo.chunks * geo.rows_per_chunk >= rows
    assert (geo.chunks - 1) * geo.rows_per_chunk < rows
    assert np.allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_no_rows_gives_zeros(cl_device):
    out, _ref, _geo = _gram(cl_device, 9, 0)
    assert not out.any()


def test_half_precision_factors(cl_device):
    out, ref, _geo = _gram(cl_device, 33, 400, storage="float16", seed=2)
    assert np.allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("max_wg", [64, 16])
def test_small_work_groups(cl_device, max_wg):
    out, ref, geo = _gram(cl_device, 40, 600, max_wg=max_wg, seed=3)
    assert geo.lg * geo.lg <= max_wg
    assert np.allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_geometry_bounds():
    """Chunks never pass GRAM_CHUNKS nor leave a chunk empty; tiles cover f; the memory plan's
    count (16 × 16 work-groups) bounds every smaller work-group's partial tiles."""
    for f in (1, 2, 15, 16, 17, 64, 65, 100, 128, 129, 256, 513):
        for rows in (0, 1, 255, 256, 10_000, 5_000_000):
            g = gram_geometry(f, rows)
            assert 1 <= g.chunks <= GRAM_CHUNKS
            assert (g.chunks - 1) * g.rows_per_chunk < max(rows, 1) <= g.chunks * g.rows_per_chunk
            nt = -(-f // g.tile)
            assert nt * g.tile >= f and g.pairs == nt * (nt + 1) // 2
            for wg in (128, 64, 16):
                assert gram_geometry(f, rows, wg).partial_bytes <= g.partial_bytes


@pytest.mark.parametrize("variant", ["batch", "batch+vec4:solver=fusedcg,solve_wg=1"])
def test_cpu_path_matches_the_tiled_kernels(cl_device, variant):
    """What a fit on this device runs (:func:`gram_buffers`) equals the tiled kernels' G."""
    import pyopencl as cl
    info = device_info(cl_device)
    f, rows = 21, 700
    cfg = KernelConfig.parse(variant)
    ctx = cl.Context([cl_device])
    q = cl.CommandQueue(ctx)
    progs = {"fit": K.build(ctx, K.render_als(cfg, f, info, implicit=True)),
             "tiled": _tiled_program(ctx, cfg, f, info)}
    Y = np.random.default_rng(4).standard_normal((rows, cfg.ldf(f))).astype(np.float32)
    mf = cl.mem_flags
    dY = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=Y)
    bs = 16
    A = cl.Buffer(ctx, mf.READ_WRITE, size=4 * f * f * bs)
    B = cl.Buffer(ctx, mf.READ_WRITE, size=4 * f * bs)
    out = {}
    for name, gram in [("fit", gram_buffers(cl, ctx, info, f, rows, bs)),
                       ("tiled", {"geo": gram_geometry(f, rows, info.max_work_group_size),
                                  "rows": rows, "P": None})]:
        if gram.get("geo") is not None and gram.get("P") is None:
            gram["P"] = cl.Buffer(ctx, mf.READ_WRITE, size=gram["geo"].partial_bytes)
        G = cl.Buffer(ctx, mf.READ_WRITE, size=4 * f * f)
        launch_gram(progs[name].kernels, q, cfg, f, gram, dY, A, B, G)
        out[name] = np.empty((f, f), np.float32)
        cl.enqueue_copy(q, out[name], G)
    assert ("geo" in gram_buffers(cl, ctx, info, f, rows, bs)) == gram_tiled(info.type)
    ref = Y[:, :f].astype(np.float64).T @ Y[:, :f].astype(np.float64)
    for name in out:
        assert np.allclose(out[name], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max()), name
