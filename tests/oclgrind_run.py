"""Run one tiny clmf fit (or a planted-bug canary) on the Oclgrind simulator.

Meant to be started in a subprocess by ``tests/test_oclgrind.py``, whose environment makes the
Oclgrind ICD the only OpenCL platform and turns its checks on (``OCLGRIND_DATA_RACES=1`` ...).
Oclgrind itself writes its diagnostics (to stderr, or to ``OCLGRIND_LOG``): judging them is the
caller's job. This script only fails (non-zero exit) when the fit does not match the NumPy
reference, or when it cannot run at all.

    python tests/oclgrind_run.py --variant "batch:tx=4,ty=4,solve_wg=16" --f 5 --case empty
    python tests/oclgrind_run.py --variant "batch+vec4+syrk:bx=4,solver=cg" --f 9 --mode implicit
    python tests/oclgrind_run.py --canary race      # must be reported as a data race
    python tests/oclgrind_run.py --reduce 5         # the reduce mode's kernels at f = 5
    python tests/oclgrind_run.py --list-cases

Exit status: 0 fit matches (or canary ran), 1 mismatch, 2 usage, 3 not on Oclgrind, 4 clmf
rejects the variant for this f or device before building (``InvalidConfigError``, not a build
failure; stdout says why), other: crash. On success the last stdout line starts with
``OCLGRIND_RUN OK``.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import scipy.sparse as sp

TOL = 1e-4
OK_MARK = "OCLGRIND_RUN OK"
INVALID_MARK = "OCLGRIND_RUN INVALID_CONFIG"
EXIT_INVALID = 4


# ----- tiny rating matrices with the edge cases ------------------------------------------------
def _matrix(m, n, density, seed, full_rows=(), full_cols=(), empty_rows=(), empty_cols=(),
            single_rows=(), single_cols=()):
    rng = np.random.default_rng(seed)
    mask = rng.random((m, n)) < density
    for r in full_rows:
        mask[r, :] = True
    for c in full_cols:
        mask[:, c] = True
    for r in single_rows:                 # exactly one rating (first non-empty column)
        mask[r, :] = False
        mask[r, next(c for c in range(n) if c not in empty_cols)] = True
    for c in single_cols:
        mask[:, c] = False
        mask[next(r for r in range(m) if r not in empty_rows), c] = True
    for r in empty_rows:
        mask[r, :] = False
    for c in empty_cols:
        mask[:, c] = False
    rows, cols = np.nonzero(mask)
    vals = rng.integers(1, 6, size=rows.size).astype(np.float32)
    return sp.csr_matrix((vals, (rows, cols)), shape=(m, n))


def case_empty():
    """9 × 7: an empty user and an empty item, a user and an item with a single rating, a user
    who rated everything; 9 rows, odd (a half-filled last work-group where one handles tz=2 rows,
    a partial second launch under batch_rows=7)."""
    return _matrix(9, 7, 0.5, seed=1, empty_rows=(2,), empty_cols=(4,), single_rows=(6,),
                   single_cols=(1,), full_rows=(0,))


def case_long():
    """9 × 38: a user who rated every item (a row longer than the default nnz_batch=32, than any
    tile and than any work-group's stride), an empty user and an empty item, the rest at
    density 0.3 (users with 6 to 19 ratings, items with 1 to 6; at 0.1, with most items rated
    once or twice, three CG steps on the items' f = 3 systems drifted 8e-4 from the float64
    reference, over the 5e-4 allowed here). Run in launches of 5 rows (row0 > 0
    and a partial last launch on both sides) unless the variant sets its own batch_rows:
    batch_rows is no template variable, the kernels are the variant's own.

    One long row is enough: both sides run the same program (one variant, one f), the items'
    half-step through the transpose. An item rated by every user as well (34 × 38, as before)
    made the other side long too, at 33 more systems to solve (tests/test_oclgrind.py took
    671 CPU s with it, 534 s without), with no kernel path that this matrix does not reach."""
    return _matrix(9, 38, 0.3, seed=2, full_rows=(0,), empty_rows=(5,), empty_cols=(7,))


# name -> (matrix builder, batch_rows to use when the variant does not set one; 0: clmf's choice)
CASES = {"empty": (case_empty, 0), "long": (case_long, 5)}


# ----- the fit ----------------------------------------------------------------------------------
def _rel_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (nb if nb > 0 else 1.0))


def _quiet_pyopencl_nv_probe():
    """pyopencl asks every device for CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV each time it sets up
    a kernel (``invoker._check_arg_size``), and Oclgrind's API checker rightly reports that
    clGetDeviceInfo call as CL_INVALID_VALUE. It is pyopencl's probe, not clmf's: answer it
    without asking the device when the platform is not NVIDIA's, so that the API checker stays
    fully on and every report it makes is about clmf."""
    try:
        import pyopencl.characterize as ch
    except ImportError:
        return
    orig = getattr(ch, "nv_compute_capability", None)
    if orig is None or getattr(orig, "_clmf_quiet", False):
        return

    def nv_compute_capability(dev):
        if "nvidia" not in dev.platform.name.lower():
            return None
        return orig(dev)

    nv_compute_capability._clmf_quiet = True
    ch.nv_compute_capability = nv_compute_capability


def _check_device(dev):
    plat = dev.platform.name
    if "oclgrind" not in plat.lower():
        print(f"refusing to run: the selected device is on {plat!r}, not Oclgrind", file=sys.stderr)
        sys.exit(3)


MODES = ("explicit", "implicit", "biased")


def run_fit(variant, f, case, device, lam=0.1, seed=0, mode="explicit"):
    import clmf
    from clmf import reference as ref
    from clmf.engine.device import select_device

    _quiet_pyopencl_nv_probe()
    dev = select_device(device)
    _check_device(dev)
    build, batch_rows = CASES[case]
    R = build()
    m, n = R.shape
    cfg = clmf.KernelConfig.parse(variant)
    if batch_rows and "batch_rows=" not in variant:
        cfg = cfg.replace(batch_rows=batch_rows)
    X0, Y0 = ref.start_factors(m, n, f, seed)
    kw = {"implicit": dict(feedback="implicit", alpha=2.0), "biased": dict(biases=True)}
    model = clmf.ALS(factors=f, regularization=lam, iterations=1, variant=cfg, device=dev,
                     **kw.get(mode, {}))
    try:
        model.fit(R, init=(X0, Y0), show_progress=False)
    except clmf.InvalidConfigError as e:
        if e.reason == "build_failed":     # the simulator's compiler rejected the kernel: a failure
            raise
        print(f"{INVALID_MARK} reason={e.reason}: {e}")
        return EXIT_INVALID
    if mode == "biased":
        # [factors | bias] is one solution vector per row
        Xr, Yr, bu, bi, _mu = ref.als_biased(R, f, lam, 1, init=(X0, Y0), solver=cfg.solver,
                                             cg_steps=cfg.cg_steps)
        Xr, Yr = np.column_stack([Xr, bu]), np.column_stack([Yr, bi])
        gx = np.column_stack([model.user_factors_, model.user_biases_])
        gy = np.column_stack([model.item_factors_, model.item_biases_])
    else:
        Xr, Yr = ref.als(R, f, lam, 1, init=(X0, Y0), solver=cfg.solver, cg_steps=cfg.cg_steps,
                         weighted=mode != "implicit",
                         implicit_alpha=2.0 if mode == "implicit" else None)
        gx, gy = model.user_factors_, model.item_factors_
    ex, ey = _rel_err(gx, Xr), _rel_err(gy, Yr)
    # float16 storage: the 1e-2. CG solvers: float32 CG drifts from float64 CG by about
    # eps·cond(A) per step, and Oclgrind builds with -cl-opt-disable (no fma contraction), so the
    # race check allows 5e-4 there; the 1e-4 accuracy bound is asserted on the real devices
    # (tests/test_variants.py, tests/test_feedback.py).
    tol = 1e-2 if cfg.storage == "float16" else (5e-4 if cfg.solver != "cholesky" else TOL)
    if mode == "biased":         # a half-step's error carried into the other side's targets
        tol *= 10
    empty_u = np.flatnonzero(np.diff(R.indptr) == 0)
    empty_i = np.flatnonzero(np.bincount(R.indices, minlength=n) == 0)
    zeros = bool(np.all(model.user_factors_[empty_u] == 0) and np.all(model.item_factors_[empty_i] == 0))
    finite = bool(np.all(np.isfinite(model.user_factors_)) and np.all(np.isfinite(model.item_factors_)))
    used = {s: str(c.config) for s, c in model.config_.items()}
    summary = (f"variant={variant!r} f={f} case={case} mode={mode} shape={R.shape} nnz={R.nnz} "
               f"configs={used} clmf={clmf.__file__} rel_err_X={ex:.3g} rel_err_Y={ey:.3g} empty_rows_zero={zeros}")
    if ex <= tol and ey <= tol and zeros and finite:
        print(f"{OK_MARK} {summary}")
        return 0
    print(f"MISMATCH (tolerance {TOL}, finite={finite}) {summary}", file=sys.stderr)
    return 1


def run_reduce(fs, device):
    """The reduce mode's kernels (``reduce.cl.j2``, both forms: GPUs' and CPUs' unpack) on
    exactly sized buffers, against NumPy: ``pack_systems``; ``unpack_systems`` with λ·n and the
    Gram matrix from a ring offset, alone (host sums) and summing two peers' rings (device
    sums); work-groups fewer than the rows and wider than a row. (The in-process pipeline runs
    its engines in threads, which Oclgrind's simulator does not support: its kernels run
    here.)"""
    import pyopencl as cl

    from clmf.engine.device import select_device
    from clmf.engine.kernels import render
    from clmf.engine.memory import packed_width
    _quiet_pyopencl_nv_probe()
    dev = select_device(device)
    _check_device(dev)
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    mf = cl.mem_flags
    rng = np.random.default_rng(fs)
    n, w, peers = 5, packed_width(fs), 2
    M = rng.standard_normal((n, fs, fs)).astype(np.float32)
    A = (M + M.transpose(0, 2, 1)).astype(np.float32)
    B = rng.standard_normal((n, fs)).astype(np.float32)
    i, j = np.tril_indices(fs)
    packed = np.concatenate([A[:, i, j], B], axis=1)
    rings = rng.standard_normal((peers, n, w)).astype(np.float32)
    G = rng.standard_normal((fs, fs)).astype(np.float32)
    G = G + G.T
    counts = np.array([0, 3, 3, 7, 9, 12, 15], np.int64)

    def const(a):
        return cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a))
    dA, dB, dG, ip, dR = const(A), const(B), const(G), const(counts), const(rings)
    # every buffer made once: Oclgrind 21.10's uninitialised-value plugin keeps stale shadow
    # state in device memory a released buffer leaves to a new one (see run_topk)
    dP = cl.Buffer(ctx, mf.READ_WRITE, size=packed.nbytes)
    oA = cl.Buffer(ctx, mf.READ_WRITE, size=4 * 3 * fs * fs)
    oB = cl.Buffer(ctx, mf.READ_WRITE, size=4 * 3 * fs)
    bad = []
    for mirror in (False, True):
        prog = cl.Program(ctx, render("reduce.cl.j2", mirror=mirror)).build()
        pack, unpack = (cl.Kernel(prog, x) for x in ("pack_systems", "unpack_systems"))
        for groups, wg in ((n, 1), (2, 4), (3, 16)):
            geo = ((groups * wg,), (wg,))
            pack(q, *geo, dA, dB, dP, np.int32(n), np.int32(fs))
            P = np.empty_like(packed)
            cl.enqueue_copy(q, P, dP)
            if not np.array_equal(P, packed):
                bad.append(f"pack mirror={mirror} {groups}x{wg}")
            # rows 1..3 of the ring (block rows 2..4 of the row pointers), alone and summed
            # with the peers' rings
            for npeers in (0, peers):
                unpack(q, *geo, dP, np.int64(1), np.int32(3), dR if npeers else dP,
                       np.int32(npeers), np.int64(n * w), ip, np.int32(2), np.float32(0.5),
                       np.int32(1), dG, np.int32(1), oA, oB, np.int32(fs))
                gA, gB = np.empty((3, fs, fs), np.float32), np.empty((3, fs), np.float32)
                cl.enqueue_copy(q, gA, oA)
                cl.enqueue_copy(q, gB, oB)
                rows = packed[1:4] + (rings[0, 1:4] + rings[1, 1:4] if npeers else 0)
                S = np.zeros((3, fs, fs), np.float32)
                S[:, i, j] = rows[:, :len(i)]
                S[:, j, i] = rows[:, :len(i)]
                diag = 0.5 * np.diff(counts)[2:5]
                wantA = S + G + diag[:, None, None] * np.eye(fs, dtype=np.float32)
                if not (np.allclose(gA, wantA, rtol=1e-5, atol=1e-5)
                        and np.allclose(gB, rows[:, len(i):], rtol=1e-6, atol=1e-6)):
                    bad.append(f"unpack mirror={mirror} {groups}x{wg} peers={npeers}")
            q.finish()
    if bad:
        print(f"MISMATCH reduce kernels f={fs}: {bad}", file=sys.stderr)
        return 1
    print(f"{OK_MARK} reduce kernels f={fs}")
    return 0


# ----- canaries: planted bugs the check must report ---------------------------------------------
CANARY_SRC = r"""
#define N 16
/* read-write race in local memory: each work-item reads its neighbour's slot while the
 * neighbour writes it, with no barrier in between */
__kernel __attribute__((reqd_work_group_size(N, 1, 1)))
void race_local(__global float* out)
{
    __local float s[N];
    const int l = get_local_id(0);
    s[l] = (float)l;
    barrier(CLK_LOCAL_MEM_FENCE);
    s[l] += s[(l + 1) % N];                       /* planted: needs a barrier and a copy */
    barrier(CLK_LOCAL_MEM_FENCE);
    out[get_global_id(0)] = s[l];
}

/* write-write race in global memory: every work-item of a group writes a different value to
 * the same word */
__kernel __attribute__((reqd_work_group_size(N, 1, 1)))
void race_global(__global float* out)
{
    out[get_group_id(0)] = (float)get_local_id(0);   /* planted */
}

/* out-of-bounds read one past the end of the buffer */
__kernel __attribute__((reqd_work_group_size(N, 1, 1)))
void oob_read(__global const float* in, __global float* out)
{
    const int g = get_global_id(0);
    out[g] = in[g + 1];                           /* planted: in has exactly N*groups floats */
}

/* read of local memory nobody wrote */
__kernel __attribute__((reqd_work_group_size(N, 1, 1)))
void uninit_local(__global float* out)
{
    __local float s[N];
    const int l = get_local_id(0);
    if (l > 0) s[l] = (float)l;                   /* planted: s[0] never written */
    barrier(CLK_LOCAL_MEM_FENCE);
    out[get_global_id(0)] = s[0] + 1.0f;
}
"""

CANARIES = ("race", "oob", "uninit", "api")


def run_canary(which, device):
    import pyopencl as cl

    from clmf.engine.device import select_device

    _quiet_pyopencl_nv_probe()
    dev = select_device(device)
    _check_device(dev)
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    n, groups = 16, 2
    prog = cl.Program(ctx, CANARY_SRC).build()
    mf = cl.mem_flags
    out = cl.Buffer(ctx, mf.READ_WRITE, size=4 * n * groups)
    if which == "api":
        # a launch whose work-group size contradicts reqd_work_group_size: the API checker
        # must report clEnqueueNDRangeKernel's CL_INVALID_WORK_GROUP_SIZE
        try:
            prog.race_global(q, (n * groups,), (n // 2,), out)
        except cl.Error:
            pass
        q.finish()
        print(f"{OK_MARK} canary=api")
        return 0
    host_in = np.arange(n * groups, dtype=np.float32)
    inp = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=host_in)
    if which == "race":
        prog.race_local(q, (n * groups,), (n,), out)
        prog.race_global(q, (n * groups,), (n,), out)
    elif which == "oob":
        prog.oob_read(q, (n * groups,), (n,), inp, out)
    elif which == "uninit":
        prog.uninit_local(q, (n * groups,), (n,), out)
    res = np.empty(n * groups, np.float32)
    cl.enqueue_copy(q, res, out)
    q.finish()
    print(f"{OK_MARK} canary={which}")
    return 0


TOPK_CASES = {"all": (3, False), "candidates": (12, True)}


def run_topk(config, case, device):
    """Device top-k (``clmf.inference.topk``) on a tiny problem with the edges at once: ties,
    seen items (one query has seen everything), N beyond a tile or beyond the candidates, rows
    past the last work-group, several splits and their merge; compared with brute force.

    One query per process: Oclgrind 21.10's uninitialised-value plugin reports the merge's
    reads of the scan's output on the second query of a process (device memory reused from the
    first query's buffers keeps stale shadow state; the results are checked right either way),
    so each case runs alone, with every checker on."""
    from clmf.engine.device import select_device
    from clmf.inference import topk as T
    _quiet_pyopencl_nv_probe()
    dev = select_device(device)
    _check_device(dev)
    cfg = T.TopKConfig.parse(config)
    rng = np.random.default_rng(0)
    b, n, f = 11, 45, 5
    Q = rng.integers(-2, 3, (b, f)).astype(np.float32)
    Y = rng.integers(-2, 3, (n, f)).astype(np.float32)
    mask = rng.random((b, n)) < 0.3
    mask[3, :] = True                              # a query that has seen everything
    R = sp.csr_matrix(mask.astype(np.float32))
    cand = np.array([0, 2, 3, 7, 8, 20, 21, 30, 44])
    dtk = T.DeviceTopK(Y, dev, config=cfg)
    S = Q.astype(np.float64) @ Y.T.astype(np.float64)
    N, use_cand = TOPK_CASES[case]
    for N, c in ((N, cand if use_cand else None),):
        ids, sc = dtk.query(Q, N, candidates=c, exclude=R)
        cc = np.arange(n) if c is None else c
        k = min(N, cc.size)
        for r in range(b):
            keep = [int(j) for j in cc if j not in set(R[r].indices.tolist())]
            want = sorted(keep, key=lambda j: (-S[r, j], j))[:k]
            got = ids[r][ids[r] >= 0].tolist()
            if got != want:
                print(f"MISMATCH topk {config} N={N} row {r}: {got} != {want}")
                return 1
    print(f"{OK_MARK} topk={config} case={case}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", help="variant string, e.g. 'batch:tx=4,ty=4,solve_wg=16'")
    ap.add_argument("--f", type=int, help="factors")
    ap.add_argument("--case", choices=sorted(CASES), default="empty")
    ap.add_argument("--mode", choices=MODES, default="explicit",
                    help="explicit ratings, implicit feedback (alpha 2) or biases")
    ap.add_argument("--canary", choices=CANARIES, help="run a planted-bug kernel instead of a fit")
    ap.add_argument("--device", default="oclgrind",
                    help="clmf device spec (default: the Oclgrind platform by name)")
    ap.add_argument("--topk", help="run the device top-k with this TopKConfig string instead")
    ap.add_argument("--topk-case", choices=sorted(TOPK_CASES), default="all")
    ap.add_argument("--list-cases", action="store_true")
    ap.add_argument("--reduce", type=int, metavar="F",
                    help="run the reduce mode's kernels at F unknowns instead")
    a = ap.parse_args(argv)
    if a.reduce:
        return run_reduce(a.reduce, a.device)
    if a.topk:
        return run_topk(a.topk, a.topk_case, a.device)
    if a.list_cases:
        for name, (fn, batch_rows) in CASES.items():
            R = fn()
            print(name, R.shape, R.nnz, f"batch_rows={batch_rows or 'auto'}")
        return 0
    if a.canary:
        return run_canary(a.canary, a.device)
    if a.variant is None or a.f is None:
        ap.error("--variant and --f are required (or --canary)")
    return run_fit(a.variant, a.f, a.case, a.device, mode=a.mode)


if __name__ == "__main__":
    sys.exit(main())
