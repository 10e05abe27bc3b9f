"""The selection model: a configuration for an unseen (f, mode, data shape) on a tuned device,
predicted from the measurements of that device's tuning runs (the ``model`` rung of
:mod:`clmf.tuning.lookup`).

Every tuning run times many configurations on each side, so each run × side is a *group*: the
configurations' times relative to the group's fastest (``rel`` ≥ 1; an older run's rebased onto
its cell's newest, below). A configuration's merit at
an unseen case is predicted as a kernel-weighted mean (:func:`weight`) of its log relative time
over the groups near the case in feature space, where

* the features are ``ln f``, the side's shape (``ln`` rows, columns and ratings per row — what
  decides S1's work per row, S3's number of systems and how many work-groups fill the device),
  the tuning mode and the side, with the distance :func:`distance`: f by a factor
  ``e^F_SCALE`` (≈ 1.4) counts as much as the shape by a factor ``e^SHAPE_SCALE`` (≈ 2) on
  average; another mode or side adds a fixed amount (implicit feedback's Gram term and weights
  change more than biases do), and so does a run's age (kernels change between tuning
  campaigns);
* every mode's groups inform every other mode's case, farther away (above), with one
  exception: where the implicit Gram YᵀY runs through the configuration's own S1 flags (CPUs:
  :func:`clmf.engine.memory.gram_tiled`), a fused CG measured without implicit feedback says
  nothing of its time with it (those flags, unused there, build the Gram), so such evidence is
  left out; on GPUs the Gram has its own kernels and costs every configuration alike;
* configurations that run the same kernels are one (:func:`case_key`): a fused CG never
  launches the S1 kernel (except for the implicit Gram on CPUs), so its S1 fields — tx, ty, the
  variant flags, and outside the dimensions form the chunk ``nnz_batch`` (:func:`s1_free`) —
  change nothing, and a run that measured it with tx = ty = 1 measured the
  one with 8 × 8 too (the fastest of such twins in a group stands for them);
* the fused CG's dimensions form with and without a partial float4 slice of the unknowns
  (biased adds one: f + 1) are farther apart (:func:`align_d2`), and less so the one-work-item
  fused CG in explicit vectors (``solve_vec``) with and without a partial vector;
* a group reports only its :data:`TOP_K` fastest configurations, and a configuration it does
  not report is *unknown* there, not slow (runs measured different configurations: a budgeted
  search samples, and kernels added later were never measured by older runs): its time there
  counts as the prior relative time ``e^PRIOR``, at the group's weight, so one group's find
  does not outweigh the near groups that never report it (PoCL pthread-skylake-avx512,
  20000×10000 implicit f = 64 left out: a Gram tiling one group found 1.16x its best, absent
  from the three other implicit groups near, beat the cell's best, which the four found
  1.0-2.3x theirs; it ran 4.5x the cell's best). The mean is shrunk towards the prior with a
  further weight of :data:`PRIOR_SHARE` of the nearest group's, so a configuration that the
  nearest groups found among their fastest beats one that only far groups did — the groups
  that *could* have measured it: a group older than every group reporting the configuration's
  kernel family
  (:func:`family`: the fields that pick its code paths; :func:`family_dates`) timed the kernels
  of its day, so its silence says nothing of a family added later (H100, Netflix shape,
  implicit f = 256 left out: the nearest group, MovieLens-20M implicit f = 256, predates the
  ``dims_shfl`` form that Netflix explicit f = 256 found 1.4× faster than the forms it timed);
* a group that could not build a configuration at its f (the device's validation: e.g. the
  warp-shuffle dims forms at f = 200, 50 float4 slices) timed the others against a best
  without it, so it says nothing of them relative to it: candidates are compared through the
  groups that could build both (:func:`rank`; H100 Netflix f = 128 and 256 left out, f = 200's
  best form without shuffles outweighed the shuffle forms measured 1.3-1.7x faster beside it);
  so does a group of a mode that refutes a configuration (below: it never timed it validly);
* the runs of one cell measure the same thing but with the kernels of their day: an older run's
  relative times are rebased onto the newest's through the configurations both timed (the
  anchors a newer run re-times; :func:`_bridge`, as the offline check's
  ``clmf.autotune.loo.bridged_times``), so its best counts as fast as the newest run found it,
  not as 1.

A configuration the device's runs found wrong in a mode (its reference check failed; never ok in
that mode: :func:`refuted`) is no candidate in that mode, and a group of that mode never timed it
validly, so its silence sets no prior for it elsewhere and its times of the others say nothing
of them against it (H100: ``mma`` in tf32 fails explicit feedback's 1e-3, passes biased and
implicit feedback's; the explicit runs' best syrk is no evidence against it in biased mode).

The configuration with the lowest predicted log relative time that validates at the case's f on
the device wins; both sides share the factor rows' padding, so the pair is the best sum over
configurations of one leading dimension. Groups farther than :data:`MAX_D2` are ignored, unless
within :data:`SPAN_D2` of the nearest (a shape unlike any tuned one still has neighbours to rank
the configurations by: the ``nearest`` rung copies one run's choice, 1.45-8.7x the best of
24009×888 cells); with no group the model makes no prediction and the lookup falls through to
``nearest``.

The model reads only the top-K of each group (``clmf.autotune.distill`` ships exactly those
measurement records, so the compact databases predict what the raw ones do).
"""
from __future__ import annotations

import dataclasses
import logging
import math

from ..engine.config import DIMS_FIELDS, VARIANT_FLAGS, KernelConfig
from ..errors import InvalidConfigError
from .schema import SIDES, device_identity, record_mode

log = logging.getLogger(__name__)

__all__ = ["TOP_K", "SAMPLE_KEYS", "shape_fields", "Group", "groups_of", "newest", "distance",
           "weight", "rank", "features", "config_key", "case_key", "fill_rows", "runs_s1",
           "built_at", "s1_free", "align_d2", "family", "family_dates", "anchor_scale", "MAX_D2",
           "top_records", "describe", "wrong_record", "refuted"]

TOP_K = 8               # fastest configurations of a group the model reads (and distill keeps)
PRIOR = math.log(1.5)    # prior relative time of any configuration ...
PRIOR_SHARE = 0.3        # ... worth this share of the nearest group's weight
F_SCALE = 0.35           # ln f: a factor 1.42 is one unit of distance
SHAPE_SCALE = 0.7        # ln rows / columns / ratings per row: a factor 2 (RMS) is one unit
MODE_D2 = {frozenset(("explicit", "biased")): 0.5}   # another mode (implicit: IMPLICIT_D2)
IMPLICIT_D2 = 1.0
ALIGN_D2 = 3.0           # the fused CG's dimensions form with and without a partial float4 slice
SVEC_D2 = 1.0            # the one-work-item fused CG with and without a partial explicit vector
SIDE_D2 = 0.25           # the other side's group
STORAGE_D2 = 1.0         # another storage dtype
OLDER_D2 = 1.0           # per newer run of the same case (it measured the current kernels)
AGE_D2 = 1.0             # per day a run is older than the device's newest (kernels change
                         # between tuning campaigns; a run re-measures earlier bests as anchors)
MAX_D2 = 6.0             # groups farther than this are ignored (weight < 0.3 %) ...
SPAN_D2 = 3.0            # ... unless within this of the nearest (a shape unlike any tuned)
FAR_D2 = 18.0            # farther never counts (f by a factor 4.4, the shape by 20 RMS)
FILL_GROUPS = 32         # resident work-groups per compute unit (NVIDIA SMs hold 32 blocks):
                         # a half-step's rows past this many per compute unit fill the device


@dataclasses.dataclass
class Group:
    """The fastest configurations of one tuning run's side."""
    run_id: str
    side: str
    f: int
    mode: str
    storage: str
    feats: dict             # rows, cols, nnz of the side
    rel: dict               # config key -> relative time (≥ 1; rebased: :func:`_bridge`), top-K
    kth: float              # the K-th's relative time (the slowest the group reports)
    configs: dict           # config key -> KernelConfig
    device: dict = None     # the device key of its records (driver included)
    date: str = ""          # of its fastest record
    age: int = 0            # newer runs of the same cell (:func:`newest`)
    days: float = 0.0       # days older than the device's newest group (:func:`newest`)
    ran: int = 0            # rows its half-steps ran over (the sample's; 0: the side's)

    def cell(self):
        """What two runs of the same case share: f, mode, storage, side and shape."""
        return (self.f, self.mode, self.storage, self.side,
                tuple(sorted(self.feats.items())))


def features(rows, cols, nnz):
    """The shape features of one side: rows, columns and ratings (at least 1 each)."""
    return {"rows": max(1, int(rows)), "cols": max(1, int(cols)), "nnz": max(1, int(nnz))}


SAMPLE_KEYS = ("rows", "nnz")     # of a measurement's ``sample``: the rows its kernels ran on


def shape_fields(r):
    """The fields of measurement ``r`` the model reads its shape from (:func:`_record_features`):
    ``{"dataset": {...}, "sample": {...}}`` where present — what the lookup's index and the
    distilled databases keep of it."""
    out = {}
    ds, sm = r.get("dataset"), r.get("sample")
    if isinstance(ds, dict):
        out["dataset"] = {k: ds[k] for k in ("m", "n", "nnz", "rows", "cols") if k in ds}
    if isinstance(sm, dict) and all(k in sm for k in SAMPLE_KEYS):
        out["sample"] = {k: sm[k] for k in SAMPLE_KEYS}
    return out


def _record_features(r):
    """The side's shape of a measurement record (its ``dataset``: rows/cols of the side, or
    m/n oriented by the side), or None."""
    d = r.get("dataset")
    if not isinstance(d, dict):
        return None
    try:
        if "rows" in d and "cols" in d:
            rows, cols = int(d["rows"]), int(d["cols"])
        else:
            rows, cols = int(d["m"]), int(d["n"])
            if r.get("side") == "items":
                rows, cols = cols, rows
        return features(rows, cols, int(d["nnz"]))
    except (KeyError, TypeError, ValueError):
        return None


def _sampled_rows(r, rows):
    """The rows a measurement's half-step ran over: its ``sample``'s where the run sampled the
    side, else ``rows`` (the whole side's)."""
    sm = r.get("sample")
    try:
        return max(1, min(rows, int(sm["rows"]))) if isinstance(sm, dict) else rows
    except (KeyError, TypeError, ValueError):
        return rows


def fill_rows(compute_units):
    """The rows a half-step needs to fill a device of ``compute_units``: :data:`FILL_GROUPS`
    work-groups (a row each) per compute unit."""
    return max(1, int(compute_units or 0)) * FILL_GROUPS


def distance(g, f, mode, side, feats, storage="float32", fill=None):
    """Squared distance of group ``g`` from a case (see the module docstring); ``fill``: the
    rows that fill the device (:func:`fill_rows`), where known."""
    d2 = (math.log(g.f / f) / F_SCALE) ** 2
    rpr = lambda x: x["nnz"] / x["rows"]                       # noqa: E731 (ratings per row)
    sh = [math.log(g.feats["rows"] / feats["rows"]), math.log(g.feats["cols"] / feats["cols"]),
          math.log(rpr(g.feats) / rpr(feats))]
    d2 += sum(x * x for x in sh) / len(sh) / SHAPE_SCALE ** 2
    if fill:
        # a sample of fewer rows than fill the device ranks the configurations otherwise than
        # the whole side (a row per work-group: the few longest rows set a launch's time)
        ran = min(g.ran or g.feats["rows"], fill) / min(feats["rows"], fill)
        d2 += (math.log(ran) / SHAPE_SCALE) ** 2
    if g.mode != mode:
        d2 += MODE_D2.get(frozenset((g.mode, mode)), IMPLICIT_D2)
    if g.side != side:
        d2 += SIDE_D2
    if g.storage != storage:
        d2 += STORAGE_D2
    return d2 + OLDER_D2 * g.age + AGE_D2 * g.days


_cfg_memo: dict = {}


def config_key(c):
    """The key :func:`rank` gives configuration ``c`` (its fields' values in order)."""
    return repr(tuple(c.__dict__.values()))


def _config(d):
    """(key, KernelConfig) of a record's configuration (memoized), or None when unusable."""
    try:
        # a flat dict of scalars: hashing it is cheap (typed: True and 1 are not equally valid)
        k = tuple(sorted((x, type(v), v) for x, v in d.items()))
        hit = _cfg_memo.get(k)
    except (AttributeError, TypeError):
        return None
    if hit is None:
        try:
            c = KernelConfig.from_dict(d)
            # (the fields' values in order: what KernelConfig.key() tells apart, without its
            # asdict, which would be most of a first lookup's time)
            hit = (config_key(c), c)
        except (InvalidConfigError, TypeError, ValueError):
            hit = False
        if len(_cfg_memo) < 65536:
            _cfg_memo[k] = hit
    return hit or None


def group_key(r):
    """(run, side) of an ok measurement the model reads, else None (what ``clmf.autotune.distill``
    groups by)."""
    if r.get("kind") != "measurement" or r.get("status") != "ok" or r.get("side") not in SIDES:
        return None
    try:
        if not float(r["seconds"]) > 0:
            return None
        return (str(r["run_id"]), r["side"])
    except (KeyError, TypeError, ValueError):
        return None


def wrong_record(r):
    """Whether ``r`` is a measurement whose configuration failed the tuner's reference check
    (status ``wrong``: its error after one iteration beyond the tolerance of its mode)."""
    return r.get("kind") == "measurement" and r.get("status") == "wrong"


def refuted(records, device, exclude_runs=()):
    """``{mode: [KernelConfig]}``: the configurations ``device``'s runs in ``records`` (but
    ``exclude_runs``) found wrong in a mode (:func:`wrong_record`, at any f) and never ok in it
    (no ok measurement of it in that mode among ``records``). Accuracy is a property of the
    configuration's arithmetic and the mode's tolerance more than of f (H100: ``mma`` in tf32
    failed explicit feedback's 1e-3 at f = 32, 64, 100 and 128, passed biased and implicit
    feedback's), so the model never proposes one for an unseen case of that mode."""
    want = device_identity(device)
    bad, ok = {}, set()
    for r in records:
        if r.get("kind") != "measurement" or r.get("run_id") in exclude_runs:
            continue
        wrong = wrong_record(r)
        if not (wrong or r.get("status") == "ok"):
            continue
        d, mode = r.get("device"), record_mode(r)
        if mode is None or not isinstance(d, dict) or device_identity(d) != want:
            continue
        c = _config(r.get("config"))
        if c is None:
            continue
        if wrong:
            bad.setdefault(mode, {})[c[0]] = c[1]
        else:
            ok.add((mode, c[0]))
    return {m: [c for k, c in cs.items() if (m, k) not in ok] for m, cs in bad.items()}


def top_records(records, k=TOP_K):
    """{(run, side): [record, ...]}: per group the fastest record of each configuration, the
    ``k`` fastest configurations (ties by configuration key), fastest first."""
    best = {}
    for r in records:
        g = group_key(r)
        if g is None or record_mode(r) is None:
            continue
        c = _config(r.get("config"))
        if c is None:
            continue
        t = float(r["seconds"])
        cur = best.setdefault(g, {})
        if c[0] not in cur or t < float(cur[c[0]]["seconds"]):
            cur[c[0]] = r
    return {g: sorted(v.values(), key=lambda r: (float(r["seconds"]), _config(r["config"])[0]))[:k]
            for g, v in best.items()}


def groups_of(records, device, exclude_runs=()):
    """The :class:`Group` s of ``device``'s (platform, vendor, type, name) ok measurements in
    ``records``, leaving out the runs ``exclude_runs``."""
    keys = ("platform", "vendor", "type", "device")
    want = device_identity(device)
    same = {}                 # the records' raw device strings → whether they are this device
    mine = []
    for r in records:
        d = r.get("device")
        if not isinstance(d, dict) or r.get("run_id") in exclude_runs:
            continue
        raw = tuple(d.get(k, "") for k in keys)
        hit = same.get(raw)
        if hit is None:
            hit = same[raw] = device_identity(d) == want
        if hit:
            mine.append(r)
    out = []
    for (run, side), recs in top_records(mine).items():
        r0 = recs[0]
        feats = _record_features(r0)
        try:
            f = int(r0["f"])
        except (KeyError, TypeError, ValueError):
            continue
        if feats is None or f < 1:
            continue
        t0 = float(r0["seconds"])
        rel, cfgs = {}, {}
        for r in recs:
            key, c = _config(r["config"])
            rel[key] = float(r["seconds"]) / t0
            cfgs[key] = c
        out.append(Group(run, side, f, record_mode(r0), r0.get("storage", "float32"), feats, rel,
                         max(rel.values()), cfgs, r0.get("device"), str(r0.get("date", "")),
                         ran=_sampled_rows(r0, feats["rows"])))
    return newest(out)


def newest(groups):
    """``groups`` with each one's :attr:`Group.age` set — how many newer runs of its cell
    (:meth:`Group.cell`) there are — and :attr:`Group.days`, how many days it is older than the
    newest group. An older run measured older kernels (the ``tuned`` rung prefers the newest
    run; a newer run re-measured the device's earlier bests among its anchors), so it counts
    less (:data:`OLDER_D2` per newer run of its cell, :data:`AGE_D2` per day), but still informs
    about the configurations the newer ones did not measure — in the newest run's units
    (:func:`_bridge`; idempotent: a second call on the same groups rebases nothing)."""
    cells = {}
    for g in groups:
        cells.setdefault(g.cell(), []).append(g)
    for gs in cells.values():
        gs.sort(key=lambda g: (g.date, g.run_id), reverse=True)
        for i, g in enumerate(gs):
            g.age = i
        _bridge(gs)
    stamps = [_stamp(g.date) for g in groups]
    known = [t for t in stamps if t is not None]
    for g, t in zip(groups, stamps):
        g.days = (max(known) - t) / 86400.0 if t is not None else 0.0
    return groups


def anchor_scale(ratios):
    """The median of ``ratios`` (of an older run's times to a newer one's, over the
    configurations both timed; the geometric mean of the middle two for an even count), or None
    where there are none: the factor that puts the older run's times in the newer's units."""
    if not ratios:
        return None
    r = sorted(ratios)
    n = len(r)
    return r[n // 2] if n % 2 else math.sqrt(r[n // 2 - 1] * r[n // 2])


def _bridge(gs):
    """Rebase the older runs of one cell (``gs``, newest first) onto the newest's relative
    times: each by :func:`anchor_scale` of the configurations it shares with the runs already
    rebased; one sharing none is left as it is."""
    done = [gs[0]]
    for g in gs[1:]:
        scale = anchor_scale([h.rel[k] / r for h in done for k, r in g.rel.items()
                              if k in h.rel])
        if scale is None:
            continue
        g.rel = {k: r * scale for k, r in g.rel.items()}
        g.kth *= scale
        done.append(g)


def _stamp(date):
    """Seconds since the epoch of an ISO date, or None."""
    import datetime
    try:
        return datetime.datetime.fromisoformat(str(date)).timestamp()
    except ValueError:
        return None


# the fields only the S1 kernel (the hermitians' build) reads: a configuration that never
# launches it runs the same kernels whatever they hold
_S1_FIELDS = ("reg", "local", "tile", "gemm", "syrk", "mma", "tx", "ty", "bx", "by", "tz", "ks",
              "triangle", "split", "fused_solve", "precision", "direct")
_S1_DEFAULTS = {k: f.default for k, f in KernelConfig.__dataclass_fields__.items()
                if k in _S1_FIELDS}
_NB_DEFAULT = KernelConfig.__dataclass_fields__["nnz_batch"].default
_case_memo: dict = {}


def s1_free(c):
    """Fused CG ``c`` with what only its S1 kernel reads at the defaults: the S1-only fields,
    and the entries S1 stages per chunk (``nnz_batch``), which only the fused CG's dimensions
    form reads besides (its entry groups' chunk): the configuration that runs the same kernels
    where S1 is never launched, and one that builds everywhere a fused CG does (a tuning's
    filler tiles, e.g. ``local`` 16 × 4 at f = 128, may not build at 129 unknowns)."""
    return dataclasses.replace(c, **_S1_DEFAULTS, **({} if c.dims else {"nnz_batch": _NB_DEFAULT}))


def runs_s1(c, mode, device_type):
    """Whether configuration ``c`` launches its S1 kernel in ``mode`` on a device of
    ``device_type``: every configuration but a fused CG, which builds no hermitians — except
    for implicit feedback's Gram YᵀY where the device builds it through the S1 flags
    (:func:`clmf.engine.memory.gram_tiled`: CPUs)."""
    if c.solver != "fusedcg":
        return True
    from ..engine.memory import gram_tiled
    return mode == "implicit" and not gram_tiled(device_type)


def built_at(c, kf):
    """Configuration ``c`` as its kernels are built for systems of ``kf`` unknowns: the S3
    work-group resolved (``solve_wg=0`` is the default's size there: at f = 32 a syrk with
    ``solve_wg=32`` is the one without it) and the fused CG dimensions form's geometry (its
    kernel reads only the slices and work-items per entry ``dims_q`` and ``dims_p`` come to,
    :meth:`KernelConfig.fcg_geometry`, and with ``dims_shfl`` no ``dims_p``: at f = 100
    ``dims_q=2,dims_p=0`` is ``dims_q=2``); ``c`` itself where that does not validate."""
    try:
        c = c.replace(solve_wg=c.swg(kf))
        if c.dims:
            g = c.fcg_geometry(kf)
            c = c.replace(dims_q=g["fd_q"], dims_p=1 if c.dims_shfl else g["fd_p"])
    except (InvalidConfigError, ValueError):
        pass
    return c


def case_key(c, mode, device_type, kf=None):
    """The key of configuration ``c`` for a case of ``mode`` on a device of ``device_type``:
    :func:`config_key` of ``c`` with what only S1 reads at the defaults (:func:`s1_free`) where
    it never launches S1 (:func:`runs_s1`) — configurations that run the same kernels are one
    configuration, and the measurements of each count for all (a fused CG tuned with
    tx = ty = 1 and one with the default 8 × 8 are the same kernels) — and, given the case's
    ``kf`` unknowns, the fields that resolve at them resolved (:func:`built_at`)."""
    k = (config_key(c), mode, device_type, kf)
    hit = _case_memo.get(k)
    if hit is None:
        b = c if kf is None else built_at(c, kf)
        hit = config_key(b) if runs_s1(b, mode, device_type) else config_key(s1_free(b))
        if len(_case_memo) < 65536:
            _case_memo[k] = hit
    return hit


def _case_view(g, mode, device_type, kf=None):
    """``(rel, configs)`` of group ``g`` keyed by :func:`case_key` for a case of ``mode`` (and
    ``kf`` unknowns): the fastest of the group's configurations that are one there."""
    rel, cfgs = {}, {}
    for k, r in sorted(g.rel.items(), key=lambda t: t[1]):
        ck = case_key(g.configs[k], mode, device_type, kf)
        if ck not in rel:
            rel[ck], cfgs[ck] = r, g.configs[k]
    return rel, cfgs


def align_d2(c, gf, gmode, f, mode):
    """The distance added for evidence about fused CG ``c`` in the dimensions form measured at
    ``gf`` factors in ``gmode`` for a case of ``f`` in ``mode``: :data:`ALIGN_D2` where one
    system's unknowns (:func:`clmf.tuning.spec.kernel_factors`: f + 1 with biases) fill whole
    float4 slices and the other's do not. The form splits every factor row into float4 slices
    over the work-items; an unknown past a multiple of 4 adds a partial slice — the kernel's
    masked tail, one more work-item per entry and fewer entry groups per work-group (f = 64:
    16 slices, 8 groups of 16 work-items in 128; biased, 65 unknowns: 17 slices, 7 groups) —
    so explicit runs of the form say little of its biased time at the same f (H100, Netflix
    shape, f = 64: 1.0× the explicit cell's best, 1.39× / 4.7× the biased cell's users /
    items best). Likewise :data:`SVEC_D2` for the one-work-item fused CG written in explicit
    vectors of ``solve_vec`` floats (:meth:`KernelConfig.svec`: CPUs), where one system's
    unknowns fill whole vectors and the other's end in a partial one (Intel, 20000×10000
    explicit f = 64 left out: the biased runs at f = 64, 65 unknowns, outweighed the others)."""
    from .spec import kernel_factors
    kg, kc = kernel_factors(gf, gmode), kernel_factors(f, mode)
    if c.dims:
        return ALIGN_D2 if (kg % 4 == 0) != (kc % 4 == 0) else 0.0
    w = c.svec(kc)
    return SVEC_D2 if w and c.svec(kg) == w and (kg % w == 0) != (kc % w == 0) else 0.0


def _gram_unmeasured(c, g, mode):
    """Whether group ``g`` says nothing of fused CG ``c``'s time in implicit ``mode``: measured
    without implicit feedback on a device whose Gram runs through the S1 flags (a fused CG's
    are filler there)."""
    if c.solver != "fusedcg" or mode != "implicit" or g.mode == "implicit":
        return False
    from ..engine.memory import gram_tiled
    return not gram_tiled((g.device or {}).get("type", "GPU"))


def family(c):
    """The kernel family of configuration ``c``: what picks its code paths — the variant flags
    (vectors on or off, not their width), the solver and precision, the fused CG's dimensions
    form and its flags (not its integer geometry)."""
    return (tuple(bool(getattr(c, x)) for x in VARIANT_FLAGS), c.solver, c.precision,
            c.fused_dims, tuple(x for x in DIMS_FIELDS if getattr(c, x) is True))


_family_memo: dict = {}


# kernel capabilities added after tuning runs existed: (date from which the kernels had it, test
# of a configuration at a system's unknowns). A group older than the date could not have built
# such a configuration at its f: it counts as one that could not build it (no silence against
# it, no comparison through it), as the device's builds at the time decided.
# - the dims form's shuffle sums with an entry's work-items rounded up to a power of two (before,
#   refused where f/4/dims_q gave none: H100 f = 100, 200, biased 256 ...)
LATER_CAPABILITIES = (
    ("2026-11-27T20:10", lambda c, kf: c.dims and c.dims_shfl and _dims_padded(c, kf)),
)


def _dims_padded(c, kf):
    """Whether the dims form ``c`` rounds an entry's work-items up at ``kf`` unknowns."""
    d = c.dims_entry_items(int(kf))[2]
    return bool(d & (d - 1))


def built_then(c, g, kf):
    """Whether ``c``'s kernels at ``kf`` unknowns existed when group ``g`` ran."""
    for since, needs in LATER_CAPABILITIES:
        if g.date < since:
            try:
                if needs(c, kf):
                    return False
            except (InvalidConfigError, ValueError, ZeroDivisionError):
                return False
    return True


def family_dates(groups):
    """``{family: date}``: the date of the oldest group that reports a configuration of each
    kernel family (:func:`family`) among its fastest (memoized per groups list)."""
    key = (id(groups), len(groups))
    hit = _family_memo.get(key)
    if hit is not None and hit[0] is groups:
        return hit[1]
    first = {}
    for g in groups:
        for c in g.configs.values():
            fam = family(c)
            if fam not in first or g.date < first[fam]:
                first[fam] = g.date
    if len(_family_memo) > 64:
        _family_memo.clear()
    _family_memo[key] = (groups, first)
    return first


def weight(d2):
    """A group's weight at squared distance ``d2``: ``e^-d2`` (narrow: many far groups must not
    outvote one near group)."""
    return math.exp(-d2)


def _twins(view, mode, dtype, kf):
    """``{case key: [KernelConfig]}``: every configuration the groups of ``view`` report, by
    their :func:`case_key` at the case (the twins that run the same kernels there)."""
    out = {}
    for _d2, g, _v in view:
        for c in g.configs.values():
            x = out.setdefault(case_key(c, mode, dtype, kf), [])
            if c not in x:
                x.append(c)
    return out


def _builds_for(cs, kf, gmode, dtype, builds, memo):
    """Whether the device builds one of configurations ``cs`` (twins) for systems of ``kf``
    unknowns in ``gmode``: ``builds(c, kf)``, with what only S1 reads at the defaults where S1
    never launches there (:func:`s1_free`: filler tiles need not build)."""
    for c in cs:
        s1 = runs_s1(c, gmode, dtype)
        key = (config_key(c), s1, kf)
        if key not in memo:
            try:
                memo[key] = bool(builds(c if s1 else s1_free(c), kf))
            except (InvalidConfigError, ValueError):
                memo[key] = False
        if memo[key]:
            return True
    return False


def _mean(view, ev, pri, within=None):
    """The predicted log relative time of a candidate from its prior and the groups of ``view``
    (``[(d², log relative time or None, align d², whether it speaks of the candidate)]``,
    nearest first), flags per group: ``ev``, its evidence (it measured the candidate), ``pri``,
    it could have timed it (the prior's weight a share of the nearest such group's; one that
    does not report it but speaks of the candidate counts the prior's time at its weight),
    ``within``, the groups to read (all by default); the prior alone where none could."""
    d0, num, sup = None, 0.0, 0.0
    for i, (d2, x, extra, speaks) in enumerate(view):
        if within is not None and not within[i]:
            continue
        if d0 is None and pri[i]:
            d0 = d2
        if ev[i] or (pri[i] and speaks):
            w = weight(d2 + extra)
            num += w * (x if ev[i] else PRIOR)
            sup += w
    if d0 is None and not sup:
        return PRIOR
    w0 = PRIOR_SHARE * weight(view[0][0] if d0 is None else d0)
    return (w0 * PRIOR + num) / (sup + w0)


def _leader_scores(views, ev, pri, bld, eligible, rounds=8):
    """``{key: score}`` of the candidates (:func:`rank`): ``views``, ``ev`` and ``pri`` per
    candidate as :func:`_mean` reads them, ``bld`` per candidate and group whether the device
    builds it at the group's unknowns, ``eligible`` the candidates that may lead (they build at
    the case). The leader (first the best by every group, then the one none beats so) keeps its
    score over every group; each other candidate's is the leader's plus the difference of their
    scores over the groups that could build both where those measured each of the two, else its
    own score."""
    keys = list(views)
    alone = {k: _mean(views[k], ev[k], pri[k]) for k in keys}
    pool = [k for k in keys if k in eligible] or keys
    lead = min(pool, key=lambda k: (alone[k], k))
    seen = {lead}
    for _ in range(rounds):
        out = {lead: alone[lead]}
        for k in keys:
            if k == lead:
                continue
            both = [a and b for a, b in zip(bld[k], bld[lead])]
            if both == bld[k] == bld[lead] or not (
                    any(w and e for w, e in zip(both, ev[k]))
                    and any(w and e for w, e in zip(both, ev[lead]))):
                out[k] = alone[k]          # the same groups, or none measured one of them
                continue
            out[k] = (alone[lead] + _mean(views[k], ev[k], pri[k], both)
                      - _mean(views[lead], ev[lead], pri[lead], both))
        best = min(pool, key=lambda k: (out[k], k))
        if out[best] >= out[lead] or best in seen:
            return out
        lead = best
        seen.add(lead)
    return out


def rank(groups, f, mode, side, feats, storage="float32", fill=None, wrong=None, builds=None):
    """``[(score, key, KernelConfig, support, device)]`` of every configuration in the top-K of
    a group near the case (within :data:`MAX_D2`, or :data:`SPAN_D2` of the nearest group;
    ``key``: its :func:`case_key`), lowest predicted
    log relative time first (``support``: the summed weight of the groups that measured it
    among their fastest;
    ``device``: the device key of the nearest group that measured it *at this f* with as many
    unknowns — biases add one — else None: a configuration that ran at another f may not
    build at this one — a syrk's work-group grows with f, e.g. 256 work-items at f = 100 but
    306 at f = 128 where NVIDIA's compiled hermitian kernel allows 256, and 306 again in
    biased mode at f = 128 where explicit f = 128 built — so the lookup probes it first), and
    the groups used as
    ``[(d², group)]`` nearest first. ``wrong``: ``{mode: [KernelConfig]}`` the device found
    wrong per mode (:func:`refuted`): those of this mode are never candidates (nor their twins
    at this f), and a group of a mode that refutes a configuration never timed it validly, so
    its silence does not set the configuration's prior (as an older group's does not) and it
    counts as a group that could not build it (below).
    ``builds(c, kf)``: whether the device builds configuration ``c`` for systems of ``kf``
    unknowns (the lookup passes :func:`clmf.engine.kernels.validate` on the device); None: every
    group could build every configuration, as before it was given.

    Each configuration's own score is its prior and the log relative times of the groups that
    measured it, the prior's weight a share of the nearest group that could have timed it (no
    older than its kernel family, of a mode that does not refute it, and able to build it), and
    each group that could have timed it but does not report it counts the prior's time at its
    weight (its time there is unknown). A
    group that could not build a configuration timed the others against a best without it, so
    it says nothing of them relative to it: every candidate is compared with a leader — the
    best by its own score that builds at the case, replaced by any that beats it so — over only
    the groups that could build both, its score the leader's plus the difference of the two
    scores there. Where every group that could build one could build both, or where none of
    those measured each of the two (a silence is no measurement against the other), its own
    score stands. (H100, Netflix shape: the warp-shuffle dims forms need a power-of-two number
    of work-items per entry, f = 200's 50 float4 slices give none, and there the best form
    without shuffles was 1.0, 1.3-1.7x the shuffle forms' time at f = 128 and 256 where both
    ran: as the nearest evidence it outweighed those, and the leave-one-out at f = 128 and 256
    picked it, 1.25-1.71x the cells' best. H100 Netflix biased f = 32: the explicit runs,
    where ``mma`` in tf32 is wrong, found a syrk fastest without it; counted against ``mma``,
    the items side picked that syrk, 2.0x the cell's best, ``mma``.)"""
    near = [(distance(g, f, mode, side, feats, storage, fill), g) for g in groups]
    cut = min(FAR_D2, max(MAX_D2, min((d2 for d2, _g in near), default=0.0) + SPAN_D2))
    near = [(d2, g) for d2, g in near if d2 <= cut]
    near.sort(key=lambda t: (t[0], t[1].run_id, t[1].side))
    if not near:
        return [], []
    dtype = (near[0][1].device or {}).get("type", "GPU")
    from .spec import kernel_factors
    kf = kernel_factors(f, mode)
    view = [(d2, g, _case_view(g, mode, dtype, kf)) for d2, g in near]
    bad = {m: {case_key(c, mode, dtype, kf) for c in cs} for m, cs in (wrong or {}).items()}
    cands = {}
    for _d2, g, (rel, cfgs) in view:
        for k, c in cfgs.items():
            if k in bad.get(mode, ()):
                continue
            c0, where = cands.setdefault(k, (c, None))
            if where is None and g.f == f and (g.mode == "biased") == (mode == "biased"):
                cands[k] = (c, g.device)
    first = family_dates(groups)
    twins = _twins(view, mode, dtype, kf) if builds is not None else {}
    memo, seen = {}, {}

    def _builds_in(k, gf, gmode):
        """Whether candidate ``k`` builds at a group's f and mode (memoized)."""
        hit = seen.get((k, gf, gmode))
        if hit is None:
            hit = seen[(k, gf, gmode)] = _builds_for(twins[k], kernel_factors(gf, gmode), gmode,
                                                     dtype, builds, memo)
        return hit
    views, ev, pri, bld, eligible = {}, {}, {}, {}, set()
    for k, (c, _where) in cands.items():
        since = first.get(family(c), "")
        mute = [_gram_unmeasured(c, g, mode) for _d2, g, _v in view]   # (says nothing of c)
        views[k] = [(d2, math.log(rel[k]) if k in rel else None, align_d2(c, g.f, g.mode, f, mode),
                     not m) for (d2, g, (rel, _c)), m in zip(view, mute)]
        ev[k] = [k in rel and not m for (_d2, _g, (rel, _c)), m in zip(view, mute)]
        bld[k] = [k not in bad.get(g.mode, ()) and (builds is None or k in rel
                                                     or (_builds_in(k, g.f, g.mode) and
                                                         built_then(c, g, kernel_factors(g.f,
                                                                                         g.mode))))
                  for _d2, g, (rel, _c) in view]
        pri[k] = [b and g.date >= since for b, (_d2, g, _v) in zip(bld[k], view)]
        if builds is None or _builds_for(twins[k], kf, mode, dtype, builds, memo):
            eligible.add(k)
    final = _leader_scores(views, ev, pri, bld, eligible) if cands else {}
    out = []
    for k, (c, where) in cands.items():
        sup = sum(weight(d2 + x) for (d2, _l, x, _s), e in zip(views[k], ev[k]) if e)
        out.append((final[k], k, c, sup, where))
    out.sort(key=lambda t: (t[0], -t[3], t[1]))
    return out, near


def describe(near, limit=2):
    """A short text of the nearest groups (for a Choice's reason)."""
    parts = []
    for d2, g in near[:limit]:
        parts.append(f"f={g.f} {g.mode} {g.side} {g.feats['rows']}×{g.feats['cols']} "
                     f"nnz={g.feats['nnz']} (d²={d2:.2f})")
    return "; ".join(parts)
