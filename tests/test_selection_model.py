"""The selection model (clmf.tuning.model) on planted measurement records: which groups it
reads, how it weighs them, and the lookup's ``model`` rule (issue 27)."""
from __future__ import annotations

import math

import pytest
from test_tuning_db import dbenv, fake_info, stats, write  # noqa: F401  (dbenv: a fixture)

from clmf import tuning
from clmf.engine.config import KernelConfig
from clmf.errors import InvalidConfigError
from clmf.tuning import model as M
from clmf.tuning.database import base_record

A = "batch+reg:tx=4,ty=4"
B = "batch+reg+local:nnz_batch=16"
FUSED = "batch+vec4:tx=1,ty=1,solve_wg=1,solver=fusedcg"


def run(info, f, times, run_id, mode="explicit", shape=(2000, 1000, 40000),
        date="2026-11-26T00:00:00+00:00"):
    """ok measurements of one run, both sides: ``times`` maps a variant to its seconds."""
    dev = tuning.device_record(info)
    m, n, nnz = shape
    out = []
    for side in ("users", "items"):
        rows, cols = (m, n) if side == "users" else (n, m)
        for v, t in times.items():
            cfg = KernelConfig.parse(v)
            out.append(base_record("measurement", status="ok", run_id=run_id, device=dev, f=f,
                                   storage="float32", side=side, mode=mode, config=cfg.to_dict(),
                                   variant=str(cfg), seconds=float(t),
                                   dataset={"m": m, "n": n, "nnz": nnz, "rows": rows,
                                            "cols": cols}) | {"date": date})
    return out


def groups(records, info):
    return M.newest(M.groups_of(records, tuning.device_record(info)))


def ranked(gs, f, mode="explicit", shape=(2000, 1000, 40000)):
    r, _near = M.rank(gs, f, mode, "users", M.features(*shape))
    return [str(c) for _s, _k, c, _sup, _w in r]


def test_the_nearest_groups_ranking_wins():
    info = fake_info()
    recs = run(info, 64, {A: 1.0, B: 1.6}, "r64") + run(info, 16, {A: 1.5, B: 1.0}, "r16")
    gs = groups(recs, info)
    assert ranked(gs, 56)[0] == A and ranked(gs, 20)[0] == B
    # a configuration the nearest group never measured is unknown there, not slow: B measured
    # only at f = 16 does not lose at f = 20 for being absent from the f = 64 run
    gs = groups(run(info, 64, {A: 1.0}, "r64") + run(info, 16, {B: 1.0, A: 1.4}, "r16"), info)
    assert ranked(gs, 20)[0] == B


def test_a_silence_where_others_were_faster_counts_against_a_configuration():
    """A configuration one group found among its fastest but the groups that could have timed it
    beside it do not report (they found others faster) counts their silence as the prior's
    time: it no longer beats one that every group reports, the single group's best (the
    leave-one-out picked such a one, 4.5x the cell's best on PoCL implicit f = 64)."""
    info = fake_info()
    W = "batch+reg:tx=8,ty=4"
    near = run(info, 64, {A: 1.0, B: 1.16, W: 1.5}, "near")
    other = run(info, 100, {W: 1.0, A: 1.9}, "f100") + run(info, 40, {W: 1.0, A: 1.9}, "f40")

    def scores(recs):
        """Each configuration's score at f = 64 from ``recs``."""
        r, _near = M.rank(groups(recs, info), 64, "explicit", "users",
                          M.features(2000, 1000, 40000))
        return {str(c): s for s, _k, c, _sup, _w in r}
    a, b, w = (str(KernelConfig.parse(x)) for x in (A, B, W))
    score = scores(near + other)
    assert score[a] < score[b] and score[a] < score[w]
    # the silence of the groups that could have timed B raises its score above its one
    # measurement's; W, which every group reports, is only scored by what they measured
    alone = scores(near)
    assert score[b] > alone[b] + 0.03 and score[w] < alone[w]


def test_older_runs_and_other_modes_count_less():
    info = fake_info()
    old = run(info, 64, {A: 1.0, B: 1.5}, "old", date="2026-11-20T00:00:00+00:00")
    new = run(info, 64, {A: 1.5, B: 1.0}, "new", date="2026-11-26T00:00:00+00:00")
    assert ranked(groups(old + new, info), 64)[0] == B
    # biased runs inform an explicit fit, weighed less than explicit ones at the same f
    biased = run(info, 64, {A: 1.0, B: 1.5}, "biased", mode="biased")
    explicit = run(info, 64, {A: 1.5, B: 1.0}, "explicit")
    assert ranked(groups(biased + explicit, info), 64)[0] == B
    assert ranked(groups(biased, info), 64)[0] == A


@pytest.mark.parametrize("kind", ["GPU", "CPU"])
def test_explicit_fused_cg_and_implicit_fits(kind):
    """GPUs build the Gram YᵀY with its own kernels (every configuration pays it alike): a fused
    CG's explicit time informs an implicit fit like any configuration's, and an implicit run at
    the case still outweighs it. CPUs build it through the configuration's S1 flags (filler in a
    fused CG): its explicit time says nothing there."""
    info = fake_info(type_=kind)
    recs = run(info, 64, {FUSED: 1.0, A: 1.3}, "explicit")
    gs = groups(recs, info)
    assert ranked(gs, 64, "explicit")[0] == FUSED
    if kind == "CPU":
        r, _near = M.rank(gs, 64, "implicit", "users", M.features(2000, 1000, 40000))
        best = {str(c): s for s, _k, c, _sup, _w in r}
        assert best[A] < best[FUSED]           # the fused CG falls back to the prior
        return
    assert ranked(gs, 64, "implicit")[0] == FUSED
    gs = groups(recs + run(info, 64, {FUSED: 1.4, A: 1.0}, "implicit", mode="implicit"), info)
    assert ranked(gs, 64, "implicit")[0] == A and ranked(gs, 64, "explicit")[0] == FUSED


def test_only_a_measurement_at_this_f_vouches_for_a_configuration():
    """A configuration that ran at another f is probed before use (its device is None): a syrk
    measured at f = 100 needs 306 work-items at f = 128, more than NVIDIA's hermitian kernel
    allows, and the model chose it unprobed for the leave-one-out cells."""
    info = fake_info()
    dev = tuning.device_record(info)
    gs = groups(run(info, 100, {A: 1.0, B: 1.2}, "r100") + run(info, 128, {B: 1.0}, "r128"),
                info)
    r, _near = M.rank(gs, 128, "explicit", "users", M.features(2000, 1000, 40000))
    where = {str(c): w for _s, _k, c, _sup, w in r}
    assert where[str(KernelConfig.parse(A))] is None and where[str(KernelConfig.parse(B))] == dev
    r, _near = M.rank(gs, 100, "explicit", "users", M.features(2000, 1000, 40000))
    assert all(w == dev for _s, _k, _c, _sup, w in r)


def test_a_partial_explicit_vector_of_the_fused_cg_weighs_evidence_less():
    """The one-work-item fused CG in explicit vectors of width w (``solve_vec``): at f = 64 the
    64 unknowns fill whole vectors of 8 and 16, biased feedback's 65 add a partial one, so an
    explicit run at f = 64 says less of its biased time (SVEC_D2) than a biased run at f = 50
    (51 unknowns: partial too), though both are as near."""
    V16 = "batch+vec16:tx=1,ty=1,solve_wg=1,solve_vec=16,solver=fusedcg"
    V8 = "batch+vec8:tx=1,ty=1,solve_wg=1,solve_vec=8,solver=fusedcg"
    v16, v8, scalar = (KernelConfig.parse(x) for x in (V16, V8, FUSED))
    assert M.align_d2(v16, 64, "explicit", 64, "biased") == M.SVEC_D2 > 0
    assert M.align_d2(v8, 64, "explicit", 64, "biased") == M.SVEC_D2
    assert M.align_d2(v16, 128, "explicit", 64, "explicit") == 0.0     # both whole vectors
    assert M.align_d2(v16, 50, "biased", 64, "biased") == 0.0          # both a partial one
    assert M.align_d2(scalar, 64, "explicit", 64, "biased") == 0.0
    assert M.align_d2(KernelConfig.parse(A), 64, "explicit", 64, "biased") == 0.0
    info = fake_info(type_="CPU")
    gs = groups(run(info, 64, {V16: 1.0, V8: 1.3}, "e64")
                + run(info, 50, {V16: 1.2, V8: 1.0}, "b50", mode="biased"), info)
    assert ranked(gs, 64, "biased")[0] == str(v8)
    assert ranked(gs, 64, "explicit")[0] == str(v16)


def test_explicit_measurements_at_f_do_not_vouch_in_biased_mode():
    """Biases add an unknown: a syrk that built at explicit f = 128 needs 306 work-items in
    biased mode there (the coverage run's leave-one-out chose it unprobed and it failed)."""
    info = fake_info()
    dev = tuning.device_record(info)
    gs = groups(run(info, 128, {A: 1.0, B: 1.2}, "r128"), info)
    r, _near = M.rank(gs, 128, "biased", "users", M.features(2000, 1000, 40000))
    assert r and all(w is None for _s, _k, _c, _sup, w in r)
    r, _near = M.rank(gs, 128, "explicit", "users", M.features(2000, 1000, 40000))
    assert all(w == dev for _s, _k, _c, _sup, w in r)


def test_far_groups_make_no_prediction():
    info = fake_info()
    gs = groups(run(info, 8, {A: 1.0}, "r8", shape=(200, 100, 4000)), info)
    r, near = M.rank(gs, 256, "explicit", "users", M.features(500000, 20000, 10 ** 8))
    assert r == [] and near == []


def test_a_case_unlike_any_tuned_one_ranks_by_its_nearest_groups():
    """Where even the nearest group is past MAX_D2 (f = 48 against runs at f = 16 and 14), the
    groups within SPAN_D2 of the nearest still rank the configurations (the ``nearest`` rung
    copied one run's choice, 1.45-8.7x the best of the 24009×888 cells); a group beyond
    FAR_D2 never counts."""
    info = fake_info()
    gs = groups(run(info, 16, {A: 1.0, B: 1.3}, "r16") + run(info, 14, {A: 1.3, B: 1.0}, "r14")
                + run(info, 4, {B: 1.0}, "r4"), info)
    r, near = M.rank(gs, 48, "explicit", "users", M.features(2000, 1000, 40000))
    d2 = sorted(d for d, _g in near)
    assert d2[0] > M.MAX_D2 and d2[-1] - d2[0] <= M.SPAN_D2 and d2[-1] <= M.FAR_D2
    assert {g.f for _d, g in near} == {16, 14}          # f = 4: past the span
    assert str(r[0][2]) == A                               # the nearer group's best


@pytest.mark.parametrize("mode", ["explicit", "implicit"])
def test_lookup_model_rule_with_its_reason(dbenv, mode):  # noqa: F811
    """An unseen f on a device with tuning runs: the ``model`` rule, its reason naming the
    nearest run; the same f tuned: ``tuned`` first."""
    from test_tuning_db import best_records
    info = fake_info()
    ds = {"m": 2000, "n": 1000, "nnz": 40000}
    write(dbenv["env"], run(info, 64, {A: 1.0, B: 1.4}, "r64", mode=mode)
          + best_records(info, 64, ds, A, A, "r64", mode=mode))
    ch = tuning.choose(info, 48, "users", stats("users", ds), mode=mode)
    assert ch.rule == "model" and ch.config == KernelConfig.parse(A), ch
    assert f"f=64 {mode} users 2000×1000" in ch.reason
    assert tuning.choose(info, 64, "users", stats("users", ds), mode=mode).rule == "tuned"


def _wrong(info, f, variant, run_id, mode="explicit"):
    """A measurement of status wrong: ``variant`` failed the reference check at f in mode."""
    return base_record("measurement", status="wrong", reason="reference_mismatch", run_id=run_id,
                       device=tuning.device_record(info), f=f, storage="float32", side="both",
                       mode=mode, config=KernelConfig.parse(variant).to_dict(), variant=variant,
                       verify_rel_err=0.005)


def test_a_configuration_found_wrong_in_a_mode_is_never_proposed_in_it(dbenv):  # noqa: F811
    """A, the fastest at f = 64 (a biased run, where it passed), failed explicit feedback's
    reference check at f = 32 and never passed it: the model proposes B for an explicit case,
    still A for a biased one; once A passes in an explicit run it is a candidate again."""
    info = fake_info()
    ds = {"m": 2000, "n": 1000, "nnz": 40000}
    recs = run(info, 64, {A: 1.0, B: 1.3}, "b64", mode="biased") + [_wrong(info, 32, A, "e32")]
    assert M.refuted(recs, tuning.device_record(info)) == {"explicit": [KernelConfig.parse(A)]}
    assert M.refuted(recs, tuning.device_record(info), exclude_runs=("e32",)) == {}
    write(dbenv["env"], recs)
    pick = {m: tuning.choose(info, 48, "users", stats("users", ds), mode=m) for m in
            ("explicit", "biased")}
    assert pick["explicit"].rule == "model" and pick["explicit"].config == KernelConfig.parse(B)
    assert pick["biased"].config == KernelConfig.parse(A)
    ok = run(info, 100, {A: 1.0, B: 1.1}, "e100", shape=(9000, 1000, 90000))
    assert M.refuted(recs + ok, tuning.device_record(info)) == {"explicit": []}


def test_a_group_whose_mode_refutes_a_configuration_does_not_set_its_prior():
    """Biased f = 32: the nearest group (explicit f = 32) reports only B because A failed its
    reference check there: its silence on A says nothing of A's biased time, so A's prior is
    weighed by the nearest group that could have timed it (implicit f = 32, A the fastest),
    and A wins; counted as that explicit group's silence, B would."""
    info = fake_info()
    recs = run(info, 32, {B: 1.0}, "e32") + run(info, 32, {A: 1.0, B: 1.2}, "i32",
                                                 mode="implicit")
    gs = groups(recs, info)
    wrong = M.refuted(recs + [_wrong(info, 32, A, "e32")], tuning.device_record(info))

    def best(w):
        r, _near = M.rank(gs, 32, "biased", "users", M.features(2000, 1000, 40000), wrong=w)
        return str(r[0][2])
    assert best(wrong) == A and best(None) == B


def test_a_group_whose_mode_refutes_a_configuration_says_nothing_of_the_others_against_it():
    """Biased f = 32: A failed explicit feedback's reference check, so the nearest group
    (explicit f = 32) timed B against a best without A and found B fastest; the implicit f = 32
    group, where A is valid, timed both: A 1.0, B 1.03. The explicit group says nothing of B
    against A (as a group that could not build A): A wins; with that group's B counted against
    A (as before), B would (H100 Netflix biased f = 32 leave-one-out: the items side picked the
    explicit runs' syrk, 2.0x the cell's best, mma)."""
    info = fake_info()
    recs = (run(info, 32, {B: 1.0, FUSED: 1.3}, "e32")
            + run(info, 32, {A: 1.0, B: 1.03, FUSED: 1.2}, "i32", mode="implicit"))
    gs = groups(recs, info)
    wrong = M.refuted(recs + [_wrong(info, 32, A, "e32")], tuning.device_record(info))
    r, _near = M.rank(gs, 32, "biased", "users", M.features(2000, 1000, 40000), wrong=wrong)
    assert str(r[0][2]) == A
    # the old comparison: every group as if it could have timed A validly
    saved = M._leader_scores
    try:
        M._leader_scores = lambda views, ev, pri, bld, el, rounds=8: saved(
            views, ev, pri, {k: [True] * len(v) for k, v in bld.items()}, el, rounds)
        r, _near = M.rank(gs, 32, "biased", "users", M.features(2000, 1000, 40000), wrong=wrong)
    finally:
        M._leader_scores = saved
    assert str(r[0][2]) == B


def test_an_adapted_configuration_scores_by_its_own_evidence(dbenv):  # noqa: F811
    """A syrk measured fastest with 2 slices at f = 100 and refused at f = 128 runs there with
    1 slice — another configuration, never measured: it scores as the prior, so a configuration
    measured nearly as fast wins (stop 39's leave-one-out picked the adapted syrk and ran
    1.3-1.65x the cell's best)."""
    import warnings

    from clmf.tuning import fallback
    info = fake_info()
    syrk = KernelConfig.parse("batch+vec4+syrk:bx=8,ks=2,solver=cg")
    ds = {"m": 2000, "n": 1000, "nnz": 40000}
    write(dbenv["env"], run(info, 100, {str(syrk): 1.0, B: 1.2}, "r100"))
    assert tuning.choose(info, 112, "users", stats("users", ds)).config == syrk
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fallback.reject(info, syrk, 112, "explicit", "a test", "306 work-items > 256")
    ch = tuning.choose(info, 112, "users", stats("users", ds))
    assert ch.rule == "model" and ch.config == KernelConfig.parse(B), ch


@pytest.mark.parametrize("kind", ["GPU", "CPU"])
def test_configurations_running_the_same_kernels_are_one(kind):
    """A fused CG never launches S1 (but for the implicit Gram on CPUs): its S1 fields change
    nothing, so twins differing only there share one key and one measurement."""
    fused = KernelConfig.parse(FUSED)
    twin = fused.replace(tx=8, ty=8, reg=True)
    herm = KernelConfig.parse(A)
    for mode in ("explicit", "biased", "implicit"):
        one = M.case_key(fused, mode, kind) == M.case_key(twin, mode, kind)
        assert one == (kind == "GPU" or mode != "implicit"), (kind, mode)
        assert M.case_key(herm, mode, kind) != M.case_key(herm.replace(tx=8), mode, kind)
    # a run that measured only the twin measured the configuration itself
    info = fake_info(type_=kind)
    gs = groups(run(info, 64, {str(twin): 1.0, A: 1.3}, "r64"), info)
    r, _near = M.rank(gs, 64, "explicit", "users", M.features(2000, 1000, 40000))
    assert r[0][1] == M.case_key(fused, "explicit", kind) and r[0][3] > 0


@pytest.mark.parametrize("kind", ["GPU", "CPU"])
def test_a_fused_cgs_s1_chunk_is_s1_filler(kind):
    """``nnz_batch`` is the chunk S1 stages (and the fused CG's dimensions form's entry groups'):
    a fused CG without that form that never launches S1 runs the same kernels whatever it
    holds. Intel's CPU runtime, biased f = 128: its implicit run's best, ``batch+reg+local+vec4:
    tx=16,ty=4,nnz_batch=16`` with the S1 vec4 fused CG, was another candidate than the
    ``batch+vec4:tx=1,ty=1`` one a biased run timed (and its filler tiles do not build at 129
    unknowns), so the model picked ``vec16``: 1.24× the cell's best, ``vec4`` (1.00)."""
    fused = KernelConfig.parse("batch+vec4:tx=1,ty=1,solve_wg=1,solve_vec=16,solver=fusedcg")
    twin = KernelConfig.parse("batch+reg+local+vec4:tx=16,ty=4,nnz_batch=16,solve_wg=1,"
                              "solve_vec=16,solver=fusedcg")
    dims = KernelConfig.parse("batch+vec4:nnz_batch=8,solve_wg=128,solver=fusedcg,"
                              "fused_dims=True")
    for mode in ("explicit", "biased", "implicit"):
        one = M.case_key(fused, mode, kind) == M.case_key(twin, mode, kind)
        assert one == (kind == "GPU" or mode != "implicit"), (kind, mode)
        assert M.case_key(dims, mode, kind) != M.case_key(dims.replace(nnz_batch=4), mode, kind)
    info = fake_info(type_=kind)
    gs = groups(run(info, 128, {str(twin): 1.0, A: 1.3}, "r1")
                + run(info, 128, {str(fused): 1.0, A: 1.3}, "r2", shape=(3000, 1000, 60000)),
                info)
    r, _near = M.rank(gs, 128, "biased", "users", M.features(2000, 1000, 40000))
    sup = {str(c): s for _s, _k, c, s, _w in r}
    assert r[0][1] == M.case_key(fused, "biased", kind, 129) and len(r) == 2
    # both runs' evidence (at 129 unknowns the explicit vectors of 16 end in a partial one)
    assert r[0][3] == pytest.approx(sup[str(KernelConfig.parse(A))] * math.exp(-M.SVEC_D2))


def test_configurations_running_the_same_kernels_at_the_cases_f_are_one():
    """A syrk with ``solve_wg=32`` builds the kernels of the one without it at f = 32 (the
    default's S3 work-group there), not at f = 64: at f = 32 the two are one candidate, with
    the evidence of both runs (each reported one of them), as the offline check reads them."""
    info = fake_info()
    s32, s0 = ("batch+vec4+syrk:bx=8,ks=8,solve_wg=32,solver=cg",
               "batch+vec4+syrk:bx=8,ks=8,solver=cg")
    recs = (run(info, 32, {s32: 1.0, A: 1.2}, "r1")
            + run(info, 32, {s0: 1.0, A: 1.2}, "r2", shape=(3000, 1000, 60000)))
    gs = groups(recs, info)

    def syrks(f):
        r, _near = M.rank(gs, f, "explicit", "users", M.features(2000, 1000, 40000))
        sup = {str(c): s for _s, _k, c, s, _w in r}
        return [s for c, s in sup.items() if "syrk" in c], sup[A]
    one, a = syrks(32)
    assert len(one) == 1 and one[0] == pytest.approx(a)
    assert len(syrks(64)[0]) == 2
    kf = 32
    assert M.case_key(KernelConfig.parse(s32), "explicit", "GPU", kf) \
        == M.case_key(KernelConfig.parse(s0), "explicit", "GPU", kf)


def test_the_dims_form_across_a_partial_float4_slice_counts_less():
    """The fused CG's dimensions form at f = 64 explicit (16 whole float4 slices) says little of
    biased f = 64 (65 unknowns: a partial slice): a biased run at another f outweighs it."""
    info = fake_info()
    dims = "batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=16,nnz_batch=4"
    syrk = "batch+vec4+syrk:bx=8,ks=2,solver=cg"
    recs = run(info, 64, {dims: 1.0, syrk: 1.2}, "explicit") \
        + run(info, 96, {syrk: 1.0, dims: 1.3}, "biased", mode="biased")
    gs = groups(recs, info)
    assert ranked(gs, 64, "explicit")[0] == str(KernelConfig.parse(dims))
    assert ranked(gs, 64, "biased")[0] == str(KernelConfig.parse(syrk))
    assert M.align_d2(KernelConfig.parse(dims), 64, "explicit", 64, "biased") == M.ALIGN_D2
    assert M.align_d2(KernelConfig.parse(dims), 96, "biased", 64, "biased") == 0.0
    assert M.align_d2(KernelConfig.parse(syrk), 64, "explicit", 64, "biased") == 0.0


def _sampled(records, rows, nnz):
    """``records`` as a run that timed its sides on a sample of ``rows`` rows and ``nnz``
    ratings (the tuner's ``sample``)."""
    return [r | {"sample": {"fraction": rows / r["dataset"]["rows"], "rows": rows, "nnz": nnz,
                            "full_rows": r["dataset"]["rows"], "full_nnz": r["dataset"]["nnz"]}}
            for r in records]


def test_a_sample_too_small_to_fill_the_device_counts_less(dbenv):  # noqa: F811
    """A run that timed f = 64 on 40 of 2,000 rows (fewer than fill the device: 8 compute units
    × FILL_GROUPS) ranked B first; a whole-side run at f = 80 ranked A first: a fit of the whole
    side takes the latter's ranking (the lookup passes the device's fill)."""
    info = fake_info()
    ds = {"m": 2000, "n": 1000, "nnz": 40000}
    recs = _sampled(run(info, 64, {B: 1.0, A: 1.5}, "sampled"), 40, 800) \
        + run(info, 80, {A: 1.0, B: 1.5}, "whole")
    gs = groups(recs, info)
    fill = M.fill_rows(info.compute_units)
    assert 40 < fill < 1000
    assert {g.ran for g in gs if g.run_id == "sampled"} == {40}
    feats = M.features(2000, 1000, 40000)
    best = lambda fill: str(M.rank(gs, 64, "explicit", "users", feats, fill=fill)[0][0][2])  # noqa: E731
    assert best(fill) == A
    assert best(None) == B                       # without the fill: the nearest f's ranking
    write(dbenv["env"], recs)
    assert tuning.choose(info, 64, "users", stats("users", ds)).config == KernelConfig.parse(A)


SYRK = "batch+vec4+syrk:bx=8,ks=2,solver=cg"


def test_a_group_older_than_a_kernel_family_does_not_set_its_prior():
    """The nearest group (f = 64, a run before the syrk kernels were timed on the device) found
    A fastest; a newer run at f = 96 found the syrk 1.25× faster than A. The nearest group never
    could time the syrk, so its silence does not shrink the syrk towards the prior: the syrk
    wins at f = 64. Where an older run *had* timed a syrk without reporting it among its
    fastest, the nearest group's silence counts and A wins."""
    info = fake_info()
    near = run(info, 64, {A: 1.0, B: 1.3}, "near", date="2026-11-26T00:00:00+00:00")
    far = run(info, 96, {SYRK: 1.0, A: 1.25}, "far", date="2026-11-26T06:00:00+00:00")
    gs = groups(near + far, info)
    assert M.family_dates(gs)[M.family(KernelConfig.parse(SYRK))] == "2026-11-26T06:00:00+00:00"
    assert ranked(gs, 64)[0] == str(KernelConfig.parse(SYRK))
    older = run(info, 32, {SYRK.replace("ks=2", "ks=4"): 1.0}, "older",
                date="2026-11-25T23:00:00+00:00")
    assert ranked(groups(near + far + older, info), 64)[0] == A


def test_an_older_run_of_the_cell_is_rebased_through_its_anchors():
    """An older run of the cell found B fastest and A 1.02× slower; the newest found a new
    configuration C 1.6× faster than A and did not time B: in the newest run's units the older
    run's B is 1.6 / 1.02 × C, not 1 (its times scaled by the anchors' median ratio); a run of
    another cell, or one sharing no configuration with the newer runs, keeps its times."""
    info = fake_info()
    old = run(info, 64, {B: 1.0, A: 1.02}, "old", date="2026-11-26T00:00:00+00:00")
    new = run(info, 64, {SYRK: 1.0, A: 1.6}, "new", date="2026-11-26T06:00:00+00:00")
    apart = run(info, 64, {FUSED: 1.0, "batch:tx=2,ty=2": 1.5}, "apart",
                date="2026-11-25T00:00:00+00:00")
    other = run(info, 32, {B: 1.0, A: 1.02}, "other", date="2026-11-25T00:00:00+00:00")
    gs = {(g.run_id, g.side): g for g in groups(old + new + apart + other, info)}
    rel = {run_id: {str(g.configs[k]): r for k, r in g.rel.items()}
           for (run_id, side), g in gs.items() if side == "users"}
    a, b = str(KernelConfig.parse(A)), str(KernelConfig.parse(B))
    assert rel["old"][b] == pytest.approx(1.6 / 1.02) and rel["old"][a] == pytest.approx(1.6)
    assert rel["new"][a] == pytest.approx(1.6)
    assert rel["apart"][str(KernelConfig.parse(FUSED))] == 1.0 and rel["other"][b] == 1.0
    before = dict(gs[("old", "users")].rel)       # a second pass (the lookup's merge) is a no-op
    M.newest(list(gs.values()))
    assert gs[("old", "users")].rel == pytest.approx(before)
    assert M.anchor_scale([]) is None and M.anchor_scale([4.0, 1.0, 9.0]) == 4.0
    assert M.anchor_scale([1.0, 4.0]) == pytest.approx(2.0)


SHFL = "batch+vec4:nnz_batch=8,solve_wg=128,solver=fusedcg,fused_dims=True,dims_shfl=True,dims_q=2"
PLAIN = "batch+vec4:nnz_batch=8,solve_wg=256,solver=fusedcg,fused_dims=True,dims_q=2"


def test_a_group_that_could_not_build_a_configuration_says_nothing_of_the_others_against_it(
        dbenv):  # noqa: F811
    """The warp-shuffle dims form (SHFL) needs a power-of-two number of work-items per entry:
    50 float4 slices at f = 200 give none, so the runs there timed PLAIN and B only and found
    PLAIN fastest; at f = 64 and 256, where both built, SHFL was 1.6× and 1.4× faster. At
    f = 128 (SHFL builds) the nearer f = 200 runs say nothing of PLAIN against SHFL, only
    against B: SHFL wins (H100 Netflix leave-one-out at f = 128 and 256 after the f = 200
    records: PLAIN, 1.25-1.71× the cells' best); counted as before (every group as if it could
    build both), PLAIN would. At f = 200 SHFL builds now (its 25 work-items an entry rounded up
    to 32), but the f = 200 runs are older than that (model.LATER_CAPABILITIES): they could not
    build it then and still say nothing of it, so SHFL leads there too (H100 explicit f = 200:
    the padded form 1.44x faster, results/bench/gpu-implicit/run-48/); a run at f = 200 after it
    that searched and does not report SHFL counts against it: PLAIN."""
    from clmf.engine.kernels import validate
    info = fake_info(platform="NVIDIA CUDA", vendor="NVIDIA Corporation", name="Fake NV GPU")
    recs = (run(info, 64, {SHFL: 1.0, PLAIN: 1.6}, "r64")
            + run(info, 256, {SHFL: 1.0, PLAIN: 1.4}, "r256")
            + run(info, 200, {PLAIN: 1.0, B: 1.3}, "r200a")
            + run(info, 200, {PLAIN: 1.0, B: 1.25}, "r200b", shape=(2100, 1000, 42000)))
    write(dbenv["env"], recs)
    ch = tuning.choose(info, 128, "users", stats("users", {"m": 2000, "n": 1000, "nnz": 40000}))
    assert ch.rule == "model" and str(ch.config) == str(KernelConfig.parse(SHFL)), ch
    gs = groups(recs, info)
    shfl, plain = (str(KernelConfig.parse(x)) for x in (SHFL, PLAIN))

    def builds(c, kf):
        """Whether the fake NVIDIA device builds ``c`` for ``kf`` unknowns."""
        try:
            return validate(c, kf, info)
        except InvalidConfigError:
            return False
    assert builds(KernelConfig.parse(SHFL), 200) and builds(KernelConfig.parse(SHFL), 128)
    g200 = next(g for g in gs if g.f == 200)
    assert not M.built_then(KernelConfig.parse(SHFL), g200, 200)
    assert M.built_then(KernelConfig.parse(SHFL), g200, 128)        # no rounding at f = 128
    assert M.built_then(KernelConfig.parse(PLAIN), g200, 200)
    feats = M.features(2000, 1000, 40000)

    def best(f, b):
        """The best-ranked candidate that builds at f (every one with ``b`` None)."""
        r, _near = M.rank(gs, f, "explicit", "users", feats, builds=b)
        return next(str(c) for _s, _k, c, _sup, _w in r if b is None or b(c, f))
    assert best(128, builds) == shfl and best(128, None) == plain
    assert best(200, builds) == shfl
    later = [run(info, 200, {PLAIN: 1.0, B: 1.3}, f"r200{k}", date="2026-11-28T00:00:00+00:00")
             for k in "cd"]
    gs = groups(recs + later[0] + later[1], info)
    assert best(200, builds) == plain


def test_candidates_no_group_measured_both_of_keep_their_own_scores():
    """A was fastest in two runs at f = 120 and 128, where B does not build; the run at f = 56,
    where both build, found B fastest but never timed A (it is not among its fastest). No group
    that could build both measured A: the two are compared by their own scores, and A's
    (two nearer runs) wins — the f = 56 run's silence on A is no measurement of A against B
    (it counts as the prior's time for A, not as B's)."""
    info = fake_info()
    recs = (run(info, 128, {A: 1.0}, "r128") + run(info, 120, {A: 1.0}, "r120")
            + run(info, 56, {B: 1.0, FUSED: 1.3}, "r56"))
    gs = groups(recs, info)
    b = str(KernelConfig.parse(B))
    r, _near = M.rank(gs, 100, "explicit", "users", M.features(2000, 1000, 40000),
                      builds=lambda c, kf: str(c) != b or kf <= 64)
    assert str(r[0][2]) == A
