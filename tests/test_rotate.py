"""Implicit half-steps in their Gram matrix's eigenbasis (:mod:`clmf.engine.rotate`): the
rotation kernel against NumPy on every device (tiles cut short, f not a multiple of 4, padded
rows left alone, no rows), fits that rotate against the NumPy reference and against the same
fit unrotated (``CLMF_GRAM_ROTATION=0``) over several iterations, factors read back in the
original basis, and where the rotation does not apply."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import random_ratings, rel_err

import clmf
from clmf import reference as ref
from clmf.engine import kernels as K
from clmf.engine import rotate as RT

DIMS = "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=8,nnz_batch=3"


@pytest.mark.parametrize("f,rows", [(1, 1), (5, 9), (17, 8), (17, 23), (33, 0), (64, 17)])
def test_rotate_kernel_matches_numpy(cl_device, f, rows):
    import pyopencl as cl
    ctx = cl.Context([cl_device])
    q = cl.CommandQueue(ctx)
    ldf = f + 3                                   # padding columns must stay as they are
    rng = np.random.default_rng(f + rows)
    X = rng.standard_normal((max(rows, 1), ldf)).astype(np.float32)
    V = np.linalg.qr(rng.standard_normal((f, f)))[0].astype(np.float32)
    mf = cl.mem_flags
    xb = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=X)
    vb = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=V)
    kern = K.rotate_program(ctx).kernels["rt_rotate"]
    for wg, groups in ((8, 2), (1, 1), (4, 64)):   # tiles taken in turn; more groups than tiles
        cl.enqueue_copy(q, xb, X)
        kern(q, (groups * wg,), (wg,), xb, np.int64(rows), np.int32(f), np.int32(ldf), vb,
             cl.LocalMemory(4 * K.ROTATE_ROWS * f))
        out = np.empty_like(X)
        cl.enqueue_copy(q, out, xb)
        want = X.copy()
        want[:rows, :f] = X[:rows, :f].astype(np.float64) @ V.astype(np.float64)
        assert rel_err(out[:, :f], want[:, :f]) <= 1e-5
        assert np.array_equal(out[:, f:], X[:, f:])
        assert np.array_equal(out[rows:], X[rows:])


def _problem(f, users=61, items=43):
    R = random_ratings(users, items, 0.25, seed=f, empty_rows=[2], empty_cols=[5])
    return R, ref.start_factors(users, items, f, 1)


def _counted(monkeypatch):
    """Count the engine's rotations, serial or overlapped (each starts with the Gram matrix's
    copy: the installed module's class, patched)."""
    calls = []
    orig = RT.Rotation.start

    def start(self, side):
        calls.append(side)
        return orig(self, side)
    monkeypatch.setattr(RT.Rotation, "start", start)
    return calls


@pytest.mark.parametrize("f", [4, 17])
def test_rotated_fit_matches_reference_and_unrotated(cl_device, f, monkeypatch):
    R, init = _problem(f)
    calls = _counted(monkeypatch)
    kw = dict(device=cl_device, variant=DIMS, feedback="implicit", alpha=2.0, solver="fusedcg")
    m = clmf.ALS(f, 0.1, 3, **kw).fit(R, init=init, show_progress=False)
    assert calls == ["users"] * 3               # the longer side, once per iteration
    Xr, Yr = ref.als(R, f, 0.1, 3, weighted=False, init=init, implicit_alpha=2.0,
                     solver="fusedcg", cg_steps=3)
    assert rel_err(m.user_factors_, Xr) <= 1e-4 and rel_err(m.item_factors_, Yr) <= 1e-4
    monkeypatch.setenv(RT.ENV, "0")
    u = clmf.ALS(f, 0.1, 3, **kw).fit(R, init=init, show_progress=False)
    assert calls == ["users"] * 3               # none more
    assert rel_err(m.user_factors_, u.user_factors_) <= 1e-4
    assert rel_err(m.item_factors_, u.item_factors_) <= 1e-4


@pytest.mark.parametrize("head", [1, 7, 60])
def test_head_rows_solved_before_the_rotation(cl_device, head, monkeypatch):
    """A GPU's overlapped form (the first rows solved in the current basis with the full Gram
    matrix while the host takes the eigendecomposition, then rotated with the others) forced on
    any device: the reference's factors, and the serial form's within float32 rounding."""
    R, init = _problem(9)
    kw = dict(device=cl_device, variant=DIMS, feedback="implicit", alpha=2.0, solver="fusedcg")
    monkeypatch.setenv(RT.ENV, "serial")
    serial = clmf.ALS(9, 0.1, 3, **kw).fit(R, init=init, show_progress=False)
    monkeypatch.delenv(RT.ENV)
    monkeypatch.setattr(RT.Rotation, "head_rows", lambda self, rows: head)
    calls, completes = _counted(monkeypatch), []
    orig = RT.Rotation.complete
    monkeypatch.setattr(RT.Rotation, "complete",
                        lambda self: (completes.append(1), orig(self))[1])
    monkeypatch.setattr(RT.Rotation, "rotate", None)          # no serial rotation
    m = clmf.ALS(9, 0.1, 3, **kw).fit(R, init=init, show_progress=False)
    assert calls == ["users"] * 3 and len(completes) == 3
    Xr, Yr = ref.als(R, 9, 0.1, 3, weighted=False, init=init, implicit_alpha=2.0,
                     solver="fusedcg", cg_steps=3)
    assert rel_err(m.user_factors_, Xr) <= 1e-4 and rel_err(m.item_factors_, Yr) <= 1e-4
    assert rel_err(m.user_factors_, serial.user_factors_) <= 1e-4


def test_head_split_cuts_the_first_launches():
    from clmf.engine.blocks import Batch, head_split

    def batches(*sizes, nv=()):
        out, row0 = [], 0
        for k, n in enumerate(sizes):
            out.append(Batch({}, 100, row0, n, ["up"] if k == 0 else None, nv=k in nv))
            row0 += n
        return out

    def run(src, rows):
        got = []
        for b in head_split(iter(src), rows):
            b.done = f"ev{len(got)}"
            got.append((b.row0, b.rows, b.head, b.wait))
        return got
    src = batches(10, 5)
    assert run(src, 3) == [(0, 3, True, ["up"]), (3, 7, False, None), (10, 5, False, None)]
    assert src[0].done == "ev1"                  # the cut launch ends with its tail
    assert run(batches(10, 5), 10) == [(0, 10, True, ["up"]), (10, 5, False, None)]
    assert run(batches(4, 5, 6), 6) == [(0, 4, False, ["up"]), (4, 2, True, None),
                                        (6, 3, False, None), (9, 6, False, None)]
    # a split launch is not cut: the head ends with it
    assert run(batches(8, 5, nv=(0,)), 3) == [(0, 8, True, ["up"]), (8, 5, False, None)]


def test_items_rotate_when_they_are_the_longer_side(cl_device, monkeypatch):
    R, init = _problem(6, users=31, items=57)
    calls = _counted(monkeypatch)
    m = clmf.ALS(6, 0.1, 2, device=cl_device, variant=DIMS, feedback="implicit", alpha=2.0,
                 solver="fusedcg").fit(R, init=init, show_progress=False)
    assert calls == ["items"] * 2
    Xr, Yr = ref.als(R, 6, 0.1, 2, weighted=False, init=init, implicit_alpha=2.0,
                     solver="fusedcg", cg_steps=3)
    assert rel_err(m.user_factors_, Xr) <= 1e-4 and rel_err(m.item_factors_, Yr) <= 1e-4


@pytest.mark.parametrize("kw", [dict(feedback="explicit"), dict(biases=True),
                                dict(feedback="implicit", alpha=2.0, storage="float16"),
                                dict(feedback="implicit", alpha=2.0,
                                     variant="batch+vec4+syrk:bx=4,ks=2,nnz_batch=5")])
def test_no_rotation_where_it_does_not_apply(cl_device, kw, monkeypatch):
    R, init = _problem(5)
    calls = _counted(monkeypatch)
    kw = {"variant": DIMS, "solver": "fusedcg", **kw}
    if "syrk" in kw["variant"]:
        kw["solver"] = "cg"
    clmf.ALS(5, 0.1, 1, device=cl_device, **kw).fit(R, init=init, show_progress=False)
    assert calls == []


def test_no_eigendecomposition_runs_the_half_step_unrotated(cl_device, monkeypatch):
    R, init = _problem(5)
    calls = _counted(monkeypatch)

    def fail(*a, **k):
        raise np.linalg.LinAlgError("planted")
    monkeypatch.setattr(np.linalg, "eigh", fail)
    m = clmf.ALS(5, 0.1, 2, device=cl_device, variant=DIMS, feedback="implicit", alpha=2.0,
                 solver="fusedcg").fit(R, init=init, show_progress=False)
    assert calls == ["users"] * 2               # asked, declined: G used as it is
    Xr, Yr = ref.als(R, 5, 0.1, 2, weighted=False, init=init, implicit_alpha=2.0,
                     solver="fusedcg", cg_steps=3)
    assert rel_err(m.user_factors_, Xr) <= 1e-4 and rel_err(m.item_factors_, Yr) <= 1e-4


def test_the_tile_must_fit_the_local_memory(cl_device):
    import dataclasses

    from clmf.engine.device import device_info
    info = dataclasses.replace(device_info(cl_device), local_mem=4 * K.ROTATE_ROWS * 100)
    assert RT.tile_fits(info, 100) and not RT.tile_fits(info, 101)
