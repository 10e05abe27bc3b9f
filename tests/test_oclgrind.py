"""Every representative kernel variant runs clean under the Oclgrind simulator.

Each check runs ``tests/oclgrind_run.py`` in a subprocess that sees exactly one OpenCL platform,
Oclgrind (Debian's ``liboclgrind-rt-icd.so`` listed in an ICD directory made for this check only,
``OCL_ICD_VENDORS``), with its checkers on:

* ``OCLGRIND_DATA_RACES=1``     read-write / write-write races in local and global memory
* ``OCLGRIND_UNIFORM_WRITES=1`` ... including several work-items writing the same value to one
                                word (still a race in OpenCL's memory model; Oclgrind hides
                                those by default)
* ``OCLGRIND_UNINITIALIZED=1``  use of uninitialised values
* ``OCLGRIND_CHECK_API=1``      OpenCL API misuse (e.g. a launch contradicting reqd_work_group_size)
* out-of-bounds accesses and barrier divergence are always checked

``OCLGRIND_BUILD_OPTIONS=-cl-opt-disable``: the kernels are simulated as written, with no
optimisation to remove or merge the accesses the checkers look at; and Oclgrind 21.10's
uninitialised-value plugin aborts ("OCLGRIND FATAL ERROR ... Unsupported instruction: freeze")
on the ``freeze`` instructions that optimised LLVM 11+ code contains.

A check fails when the fit does not match the NumPy reference (the helper exits non-zero), when
Oclgrind logged anything at all (its kernel diagnostics go to a per-run ``OCLGRIND_LOG`` file),
or when stderr carries an Oclgrind diagnostic (API errors are printed there). The canaries plant
a race, an out-of-bounds read, an uninitialised read and an API error, and assert that this very
check reports each of them: proof that it can fail.

The helper answers pyopencl's own CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV probe (made for every
kernel it sets up, reported by the API checker as CL_INVALID_VALUE) without asking Oclgrind, so
nothing is filtered out here: every line Oclgrind reports is about clmf.

The parametrisation is ``representative_variants(f)`` × FACTORS × the helper's CASES, read at
collection: variants added to that list are checked with no change here. A variant that clmf
rejects for some f before building (``InvalidConfigError``, not a build failure) is skipped for it.

An Oclgrind run keeps one CPU busy, so the fits run as parallel subprocesses
(``CLMF_OCLGRIND_JOBS``, default: the number of CPUs), all started when the first one is needed.

Without Oclgrind these tests skip, except under ``CI=true``, where they fail.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import clmf
from clmf.engine.config import KernelConfig, hermitian_variants, representative_variants

pytestmark = pytest.mark.oclgrind

HERE = pathlib.Path(__file__).resolve().parent
HELPER = HERE / "oclgrind_run.py"
IN_CI = os.environ.get("CI", "").lower() == "true"
TIMEOUT_S = 600

# f ≤ 17: 1 (degenerate), 3 (below every tile and vector width), 17 (above 16, not a multiple of
# any vector width or tile edge)
FACTORS = (1, 3, 17)

_spec = importlib.util.spec_from_file_location("clmf_oclgrind_run", HELPER)
_helper = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helper)
CASES = tuple(_helper.CASES)
OK_MARK = _helper.OK_MARK

# What Oclgrind prints on stderr (API errors, fatal errors) or in its log; any match fails.
_DIAG_RE = re.compile(
    r"\boclgrind\b|data race|invalid (read|write)|uninitiali[sz]ed|unaligned|divergence|barrier|"
    r"undefined behaviou?r|out of bounds|runtime error|fatal|\berror\b|warning",
    re.IGNORECASE)

_ICD_CANDIDATES = (
    "/usr/lib/oclgrind/liboclgrind-rt-icd.so",                 # Debian / Ubuntu
    "/usr/lib/*/oclgrind/liboclgrind-rt-icd.so",
    "/usr/lib/*/liboclgrind-rt-icd.so",
    "/usr/lib64/oclgrind/liboclgrind-rt-icd.so",
    "/usr/lib64/liboclgrind-rt-icd.so",
    "/usr/local/lib/oclgrind/liboclgrind-rt-icd.so",
    "/usr/local/lib/liboclgrind-rt-icd.so",
)


def find_oclgrind_icd():
    """Path of Oclgrind's ICD library (``CLMF_OCLGRIND_ICD`` overrides), or None."""
    env = os.environ.get("CLMF_OCLGRIND_ICD")
    if env:
        return env if os.path.isfile(env) else None
    exe = shutil.which("oclgrind")
    pats = list(_ICD_CANDIDATES)
    if exe:
        prefix = pathlib.Path(os.path.realpath(exe)).parent.parent
        pats[:0] = [str(prefix / "lib" / "oclgrind" / "liboclgrind-rt-icd.so"),
                    str(prefix / "lib" / "liboclgrind-rt-icd.so")]
    for pat in pats:
        for hit in sorted(glob.glob(pat)):
            if os.path.isfile(hit):
                return hit
    return None


@pytest.fixture(scope="session")
def oclgrind(tmp_path_factory):
    """(environment, scratch dir) for the subprocesses: Oclgrind as the only platform."""
    lib = find_oclgrind_icd()
    if lib is None:
        msg = ("Oclgrind is not installed (no liboclgrind-rt-icd.so; Debian/Ubuntu: "
               "`apt-get install oclgrind`, or set CLMF_OCLGRIND_ICD)")
        if IN_CI:
            pytest.fail(msg + " -- CI=true requires it")
        pytest.skip(msg)
    root = tmp_path_factory.mktemp("oclgrind")
    vendors = root / "vendors"
    vendors.mkdir()
    (vendors / "oclgrind.icd").write_text(lib + "\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OCLGRIND_") and k not in (
               "CLMF_DEVICE", "PYOPENCL_CTX", "PYOPENCL_TEST", "OCL_ICD_FILENAMES",
               "OPENCL_VENDOR_PATH")}
    # the child imports the very clmf this test process imported (installed wheel or checkout)
    clmf_root = str(pathlib.Path(clmf.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([clmf_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update({
        "OCL_ICD_VENDORS": str(vendors),
        "OCLGRIND_DATA_RACES": "1",
        "OCLGRIND_UNIFORM_WRITES": "1",
        "OCLGRIND_UNINITIALIZED": "1",
        "OCLGRIND_CHECK_API": "1",
        "OCLGRIND_BUILD_OPTIONS": "-cl-opt-disable",
        "OCLGRIND_NUM_THREADS": "1",     # parallelism comes from running several subprocesses
        "PYOPENCL_NO_CACHE": "1",        # no disk cache: every build goes through Oclgrind
        "PYTHONUNBUFFERED": "1",
    })
    return env, root


def diagnostics(stderr, log):
    """Oclgrind's reports: every non-blank line of its log, and stderr lines that look like one."""
    out = [ln for ln in log.splitlines() if ln.strip()]
    out += [ln for ln in stderr.splitlines() if _DIAG_RE.search(ln)]
    return out


def run_helper(oclgrind, name, *args):
    """Run the helper under Oclgrind; return (CompletedProcess, diagnostics, log text)."""
    env, root = oclgrind
    log_path = root / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.log"
    log_path.unlink(missing_ok=True)
    env = dict(env, OCLGRIND_LOG=str(log_path))
    proc = subprocess.run([sys.executable, str(HELPER), *args], env=env, cwd=str(root),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    return proc, diagnostics(proc.stderr, log), log


def _excerpt(text, limit=6000):
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"


def _params():
    out = []
    for f in FACTORS:
        for variant in representative_variants(f):
            for case in CASES:
                vid = re.sub(r"[^A-Za-z0-9_+]+", "-", variant).strip("-")
                out.append(pytest.param(variant, f, case, id=f"{vid}-f{f}-{case}"))
    return out


def _fit_args(variant, f, case, mode="explicit"):
    return (f"{variant}-f{f}-{case}-{mode}", "--variant", variant, "--f", str(f), "--case", case,
            "--mode", mode)


# implicit feedback and biases on the hermitian path (issue 27): one S1 variant of each family
# (solvers alternating) at f = 17, both cases; and the fused CG's dimensions form with several
# slices per work-item or spread sums (its first pass forms each mode's right-hand side)
MODE_FACTORS = (17,)
# the dimensions forms at f = 9 (3 slices: 2 per work-item, the second work-item's partial and
# padded; its first pass forms the mode's right-hand side): at f = 17 one took 35 s under Oclgrind
# (the explicit sweep runs them at f = 1, 3 and 17)
DIMS_MODE_FACTORS = (9,)


def _dims_geometries():
    """The representative fused CG dimensions forms with ``dims_q`` or ``dims_p`` set."""
    out = []
    for v in representative_variants():
        c = KernelConfig.parse(v)
        if c.dims and (c.dims_q, c.dims_p) != (1, 1):
            out.append(c)
    return out


def _mode_params():
    out = []
    for mode in ("implicit", "biased"):
        for c in hermitian_variants(per_family=True) + _dims_geometries():
            variant = str(c)
            for f in (DIMS_MODE_FACTORS if c.dims else MODE_FACTORS):
                for case in CASES:
                    vid = re.sub(r"[^A-Za-z0-9_+]+", "-", variant).strip("-")
                    out.append(pytest.param(variant, f, case, mode,
                                            id=f"{mode}-{vid}-f{f}-{case}"))
    return out


@pytest.fixture(scope="session")
def oclgrind_fits(oclgrind, request):
    """Futures of the selected fits (those pytest will run, after -k/-m), started at once."""
    jobs = int(os.environ.get("CLMF_OCLGRIND_JOBS", "0") or 0) or max(1, os.cpu_count() or 1)
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="oclgrind")
    futures = {}
    for item in request.session.items:
        cs = getattr(item, "callspec", None)
        if getattr(item, "function", None) in (test_variant_clean_under_oclgrind,
                                               test_mode_clean_under_oclgrind) and cs is not None:
            key = (cs.params["variant"], cs.params["f"], cs.params["case"],
                   cs.params.get("mode", "explicit"))
            if key not in futures:
                futures[key] = pool.submit(run_helper, oclgrind, *_fit_args(*key))
    yield pool, futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("variant,f,case", _params())
def test_variant_clean_under_oclgrind(oclgrind, oclgrind_fits, variant, f, case):
    _check_clean(oclgrind, oclgrind_fits, variant, f, case)


@pytest.mark.parametrize("variant,f,case,mode", _mode_params())
def test_mode_clean_under_oclgrind(oclgrind, oclgrind_fits, variant, f, case, mode):
    """Implicit feedback (the Gram YᵀY by S1, the weighted sums) and biases on the hermitian
    path run clean and match the reference of the mode."""
    _check_clean(oclgrind, oclgrind_fits, variant, f, case, mode)


def _check_clean(oclgrind, oclgrind_fits, variant, f, case, mode="explicit"):
    """One fit under Oclgrind: no diagnostics, the reference matched (else skipped when clmf
    refuses the variant before building)."""
    pool, futures = oclgrind_fits
    key = (variant, f, case, mode)
    if key not in futures:
        futures[key] = pool.submit(run_helper, oclgrind, *_fit_args(*key))
    proc, diags, log = futures[key].result()
    if proc.returncode == _helper.EXIT_INVALID and not diags:
        pytest.skip(f"clmf rejects {variant!r} at f={f} before building: "
                    + proc.stdout.split(_helper.INVALID_MARK, 1)[-1].strip())
    report = (f"variant {variant!r}, f={f}, case {case!r}, mode {mode}: exit status "
              f"{proc.returncode}, "
              f"{len(diags)} Oclgrind diagnostic line(s)\n"
              f"--- stdout\n{_excerpt(proc.stdout)}\n--- stderr\n{_excerpt(proc.stderr)}\n"
              f"--- Oclgrind log\n{_excerpt(log)}")
    assert not diags and proc.returncode == 0 and OK_MARK in proc.stdout, report


# ----- canaries: the check must be able to fail -------------------------------------------------
def _canary(oclgrind, which):
    proc, diags, log = run_helper(oclgrind, f"canary-{which}", "--canary", which)
    assert proc.returncode == 0 and OK_MARK in proc.stdout, (
        f"the {which} canary did not run: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    assert diags, f"Oclgrind reported nothing for the planted {which} bug: the check cannot fail"
    return "\n".join(diags)


def test_canary_race_is_reported(oclgrind):
    text = _canary(oclgrind, "race")
    assert re.search(r"Read-write data race at local memory", text), text[:3000]
    assert re.search(r"Write-write data race at global memory", text), text[:3000]
    assert "Kernel: race_local" in text and "Kernel: race_global" in text, text[:3000]


def test_canary_out_of_bounds_is_reported(oclgrind):
    text = _canary(oclgrind, "oob")
    assert re.search(r"Invalid read of size 4 at global memory", text), text[:3000]


def test_canary_uninitialized_is_reported(oclgrind):
    text = _canary(oclgrind, "uninit")
    assert "Uninitialized value" in text, text[:3000]


def test_canary_api_misuse_is_reported(oclgrind):
    text = _canary(oclgrind, "api")
    assert "CL_INVALID_WORK_GROUP_SIZE" in text or "runtime error" in text, text[:3000]


@pytest.mark.parametrize("fs", [1, 3, 17])
def test_reduce_kernels_clean_under_oclgrind(oclgrind, fs):
    """The reduce mode's kernels (pack; unpack alone and summing peers' rings, the device sums;
    both forms, work-groups narrower and wider than a row) run clean and match NumPy."""
    proc, diags, log = run_helper(oclgrind, f"reduce-f{fs}", "--reduce", str(fs))
    assert proc.returncode == 0, _excerpt(proc.stdout + proc.stderr)
    assert OK_MARK in proc.stdout.splitlines()[-1]
    assert not diags, "Oclgrind reported:\n" + _excerpt("\n".join(diags))


TOPK_CONFIGS = (
    "topk:wx=4,wy=2,rm=2,rnv=1,v=4,tk=2,cap=2,qres=0,yt=0",     # staged items, overflow rounds
    "topk:wx=4,wy=2,rm=2,rnv=2,v=1,tk=4,cap=16,qres=1,yt=0",    # staged query block, scalar
    "topk:wx=2,wy=4,rm=2,rnv=1,v=4,tk=4,cap=3,qres=0,yt=1",     # transposed items
    "topk:wx=1,wy=4,rm=2,rnv=2,v=4,tk=4,cap=16,qres=0,yt=2",    # packed item panels
)


@pytest.mark.parametrize("case", sorted(_helper.TOPK_CASES))
@pytest.mark.parametrize("config", TOPK_CONFIGS)
def test_topk_clean_under_oclgrind(oclgrind, config, case):
    """The top-k kernels (scan with its local lists, masks and rounds; merge) run clean."""
    proc, diags, log = run_helper(oclgrind, f"{config}-{case}", "--topk", config,
                                  "--topk-case", case)
    assert proc.returncode == 0, _excerpt(proc.stdout + proc.stderr)
    assert OK_MARK in proc.stdout.splitlines()[-1]
    assert not diags, "Oclgrind reported:\n" + _excerpt("\n".join(diags))
