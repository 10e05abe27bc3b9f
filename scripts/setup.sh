#!/usr/bin/env bash
# clmf development / CI set-up: system OpenCL packages, a virtual env with the project installed
# from its built wheel, and an ICD vendors directory that makes both PoCL and Intel's CPU OpenCL
# runtime visible.  Idempotent; quick when everything is already in place.
#
# usage: scripts/setup.sh [STAGE...]
#   (no stage)        everything: --deps then --project
#   --deps            system packages (apt), Python choice, .venv, Python dependencies
#   --project         build the clmf wheel, (re)install it into .venv, write .icd/, check OpenCL
#   --icd             only (re)write the .icd/ vendors directory
#   --check           only list the OpenCL platforms/devices seen through .icd/
#   --register-intel  register .venv's Intel CPU runtime system-wide (needs root or sudo)
#   --unregister-intel
#
# environment:
#   PYTHON=/path/to/python3.x    use this interpreter for the venv (must be >= 3.11)
#   CLMF_SKIP_APT=1              never call apt-get (install the OpenCL packages yourself)
#   CLMF_EXTRAS=test,intel,dask,docs  extras installed with the wheel
#   CLMF_REQUIRE_PLATFORMS="A,B" fail the check unless a platform whose name contains each of
#                                A, B, ... is found (CI sets PoCL and Intel)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
ICD_DIR="$ROOT/.icd"
WHEEL_DIR="$ROOT/dist"
EXTRAS="${CLMF_EXTRAS:-test,intel,dask,docs}"
PROJECT="clmf"
SYSTEM_ICD_DIR="/etc/OpenCL/vendors"
SYSTEM_INTEL_ICD="$SYSTEM_ICD_DIR/clmf-intel-cpu.icd"
APT_PACKAGES=(ocl-icd-libopencl1 pocl-opencl-icd clinfo oclgrind)
MIN_PY="3.11"

export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -n "${CI:-}" ] || [ ! -t 1 ]; then export PIP_PROGRESS_BAR=off; fi

log()  { printf '[setup] %s\n' "$*"; }
warn() { printf '[setup] WARNING: %s\n' "$*" >&2; }
die()  { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# root / sudo
# ---------------------------------------------------------------------------------------------
# Run a command as root: directly when we are root, else through sudo.  Without a terminal (CI,
# no stdin) sudo must not prompt, so it is used with -n and we say clearly when that cannot work.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        if [ -t 0 ] && [ -z "${CI:-}" ]; then
            sudo "$@"
        elif sudo -n true 2>/dev/null; then
            sudo -n "$@"
        else
            die "needs root for: $* -- not root, and sudo wants a password but there is no terminal. Run as root, configure passwordless sudo, or run the command yourself first."
        fi
    else
        die "needs root for: $* -- not root and sudo is not installed."
    fi
}

can_be_root() {
    [ "$(id -u)" -eq 0 ] && return 0
    command -v sudo >/dev/null 2>&1 || return 1
    { [ -t 0 ] && [ -z "${CI:-}" ]; } && return 0
    sudo -n true 2>/dev/null
}

# ---------------------------------------------------------------------------------------------
# system packages
# ---------------------------------------------------------------------------------------------
pkg_installed() {
    command -v dpkg-query >/dev/null 2>&1 || return 1
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

APT_UPDATED=0
apt_install() {  # apt_install PKG... : installs those not installed yet
    local missing=() p
    for p in "$@"; do pkg_installed "$p" || missing+=("$p"); done
    if [ ${#missing[@]} -eq 0 ]; then
        log "system packages present: $*"
        return 0
    fi
    if [ -n "${CLMF_SKIP_APT:-}" ]; then
        warn "CLMF_SKIP_APT is set; not installing: ${missing[*]}"
        return 0
    fi
    command -v apt-get >/dev/null 2>&1 ||
        die "missing system packages (${missing[*]}) and no apt-get on this machine. Install an OpenCL ICD loader, PoCL, clinfo and oclgrind with your package manager, then rerun with CLMF_SKIP_APT=1."
    can_be_root ||
        die "missing system packages: ${missing[*]}. Installing them needs root (not root; sudo missing or wants a password without a terminal). Run: sudo apt-get install ${missing[*]} -- then rerun."
    local opts=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" update -q
        APT_UPDATED=1
    fi
    log "apt-get install ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y -q "${missing[@]}"
}

apt_has_candidate() {  # true if apt knows an installable version of the package
    command -v apt-cache >/dev/null 2>&1 || return 1
    apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [^(]'
}

# ---------------------------------------------------------------------------------------------
# Python
# ---------------------------------------------------------------------------------------------
PY=""
find_python() {  # sets PY to the absolute path of the first suitable interpreter
    local cands c exe
    if [ -n "${PYTHON:-}" ]; then cands=("$PYTHON"); else cands=(python3.13 python3.12 python3.11 python3); fi
    for c in "${cands[@]}"; do
        command -v "$c" >/dev/null 2>&1 || continue
        # run it: a pyenv shim exists for every name but fails for versions that are not selected
        exe="$("$c" -c 'import sys; print(sys.executable if sys.version_info >= (3, 11) else "")' 2>/dev/null || true)"
        if [ -n "$exe" ] && [ -x "$exe" ]; then PY="$exe"; return 0; fi
    done
    return 1
}

choose_python() {
    if ! find_python; then
        if [ -z "${PYTHON:-}" ] && [ -z "${CLMF_SKIP_APT:-}" ] && command -v apt-get >/dev/null 2>&1 && ! pkg_installed python3; then
            log "no python3 found; installing the distribution's python3"
            apt_install python3 python3-venv
        fi
        find_python || die "no Python >= $MIN_PY found (tried: ${PYTHON:-python3.13 python3.12 python3.11 python3}; found: $(python3 --version 2>&1 || echo none)). Install Python >= $MIN_PY (Debian 12 and Ubuntu 24.04 ship it as python3) or point PYTHON=/path/to/python3.x at one."
    fi
    log "python: $PY ($("$PY" -c 'import platform; print(platform.python_version())'))"
}

venv_ok() {
    [ -x "$VPY" ] && "$VPY" -c 'import sys, pip; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1
}

make_venv() {
    if venv_ok; then
        log "virtual env present: .venv ($("$VPY" -c 'import platform; print(platform.python_version())'))"
        return 0
    fi
    [ -e "$VENV" ] && { log "removing unusable .venv"; rm -rf "$VENV"; }
    log "creating virtual env .venv with $PY"
    local errlog
    errlog="$(mktemp)"
    if ! "$PY" -m venv "$VENV" >"$errlog" 2>&1; then
        rm -rf "$VENV"
        # Debian/Ubuntu split ensurepip out of the interpreter package into python3-venv
        # (python3.X-venv for the interpreter's own version).
        local ver pkgs=(python3-venv)
        ver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
        if apt_has_candidate "python$ver-venv"; then pkgs+=("python$ver-venv"); fi
        log "'$PY -m venv' failed ($(tail -n 1 "$errlog")); installing ${pkgs[*]}"
        apt_install "${pkgs[@]}"
        if ! "$PY" -m venv "$VENV" >"$errlog" 2>&1; then
            cat "$errlog" >&2
            rm -rf "$VENV" "$errlog"
            die "cannot create a virtual env with $PY (see above)"
        fi
    fi
    rm -f "$errlog"
    log "upgrading pip in .venv"
    "$VPY" -m pip install -q --upgrade pip || warn "could not upgrade pip; continuing with $("$VPY" -m pip --version)"
}

# ---------------------------------------------------------------------------------------------
# Python dependencies (read from pyproject.toml, so they install even before the wheel builds)
# ---------------------------------------------------------------------------------------------
install_deps() {
    local req="$VENV/clmf-requirements.txt"
    CLMF_EXTRAS="$EXTRAS" "$VPY" - "$PROJECT" >"$req" <<'EOF'
import os, re, sys, tomllib
project = sys.argv[1]
with open("pyproject.toml", "rb") as f:
    meta = tomllib.load(f)["project"]
reqs = list(meta.get("dependencies", []))
optional = meta.get("optional-dependencies", {})
for extra in filter(None, os.environ["CLMF_EXTRAS"].split(",")):
    if extra not in optional:
        sys.exit(f"extra {extra!r} is not defined in pyproject.toml")
    reqs += optional[extra]
# a self-referencing extra ("clmf[test]") is satisfied by the wheel itself
reqs = [r for r in reqs if re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() != project]
print("\n".join(reqs))
EOF
    log "installing Python dependencies (pyproject.toml: dependencies + [$EXTRAS]): $(tr '\n' ' ' <"$req")"
    "$VPY" -m pip install -r "$req"
}

# ---------------------------------------------------------------------------------------------
# the project itself: built wheel, installed non-editable, reinstalled every time
# ---------------------------------------------------------------------------------------------
install_project() {
    venv_ok || die ".venv is missing or broken; run scripts/setup.sh --deps (or make setup) first"
    log "building the $PROJECT wheel"
    # stale setuptools output would leak deleted modules into the wheel
    rm -rf "$ROOT/build" "$ROOT/$PROJECT.egg-info" "$WHEEL_DIR"
    "$VPY" -m pip wheel -q --no-deps -w "$WHEEL_DIR" "$ROOT" ||
        die "building the $PROJECT wheel failed (see pip's output above)"
    rm -rf "$ROOT/build" "$ROOT/$PROJECT.egg-info"
    local wheels=("$WHEEL_DIR"/"$PROJECT"-*.whl)
    [ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || die "expected one $PROJECT wheel in $WHEEL_DIR, found: ${wheels[*]}"
    local wheel="${wheels[0]}"
    log "installing $(basename "$wheel") into .venv (non-editable, forced reinstall)"
    "$VPY" -m pip install -q --force-reinstall --no-deps "$wheel"
    # make sure what this wheel declares (dependencies + extras) is satisfied; a no-op normally
    "$VPY" -m pip install -q "$wheel[$EXTRAS]"
    [ -x "$VENV/bin/$PROJECT" ] || die "console script .venv/bin/$PROJECT was not installed"
    # import from outside the repo, so the checkout cannot shadow the installed package
    (cd / && "$VPY" - "$VENV" <<'EOF'
import importlib, os, sys
venv = os.path.realpath(sys.argv[1])
for name in ("clmf", "clmf.cl_kernels", "clmf.autotune"):
    try:
        mod = importlib.import_module(name)
    except Exception as exc:  # the package may still be under construction
        print(f"[setup] WARNING: installed package {name!r} does not import: {exc!r}", file=sys.stderr)
        continue
    where = [os.path.realpath(p) for p in getattr(mod, "__path__", [])]
    if not where or not all(p.startswith(venv + os.sep) for p in where):
        sys.exit(f"[setup] ERROR: {name} resolves to {where}, not to the installed wheel in {venv}")
    print(f"[setup] installed {name} -> {where[0]}")
EOF
    )
}

# ---------------------------------------------------------------------------------------------
# OpenCL vendors directory .icd/: the system's ICDs (PoCL) + .venv's Intel CPU runtime
# ---------------------------------------------------------------------------------------------
intel_lib() { printf '%s\n' "$VENV/lib/libintelocl.so"; }

write_icd_dir() {
    local tmp f lib
    lib="$(intel_lib)"
    tmp="$(mktemp -d "$ROOT/.icd.tmp.XXXXXX")"
    for f in "$SYSTEM_ICD_DIR"/*.icd; do
        [ -e "$f" ] || continue
        # our own system-wide registration points at the same library as intel-cpu.icd below
        [ "$f" = "$SYSTEM_INTEL_ICD" ] && continue
        cp "$f" "$tmp/"
    done
    if [ -f "$lib" ]; then
        [ -e "$tmp/intel-cpu.icd" ] && log "replacing the system's intel-cpu.icd by .venv's Intel runtime in .icd/"
        printf '%s\n' "$lib" >"$tmp/intel-cpu.icd"
    else
        warn "Intel CPU runtime not found at $lib (extra 'intel' not installed?); .icd/ holds only the system ICDs"
    fi
    rm -rf "$ICD_DIR"
    mv "$tmp" "$ICD_DIR"
    chmod 755 "$ICD_DIR"
    log "wrote .icd/: $(cd "$ICD_DIR" && for f in *.icd; do [ -e "$f" ] && printf '%s -> %s; ' "$f" "$(cat "$f")"; done)"
}

# ---------------------------------------------------------------------------------------------
# final check: which OpenCL platforms/devices does pyopencl see?
# ---------------------------------------------------------------------------------------------
check_opencl() {
    venv_ok || die ".venv is missing; run make setup first"
    [ -d "$ICD_DIR" ] || write_icd_dir
    log "OpenCL platforms seen with OCL_ICD_VENDORS=$ICD_DIR:"
    (cd / && OCL_ICD_VENDORS="$ICD_DIR" "$VPY" - <<'EOF'
import os, sys
import pyopencl as cl
try:
    platforms = cl.get_platforms()
except cl.Error as exc:  # CL_PLATFORM_NOT_FOUND_KHR when no ICD loads
    print(f"[setup]   pyopencl: {exc}")
    platforms = []
for p in platforms:
    print(f"[setup]   platform: {p.name} | {p.vendor} | {p.version}")
    try:
        devices = p.get_devices()
    except cl.Error as exc:
        print(f"[setup]     (no devices: {exc})")
        continue
    for d in devices:
        kind = "/".join(k for k in ("CPU", "GPU", "ACCELERATOR", "CUSTOM")
                        if d.type & getattr(cl.device_type, k, 0)) or str(d.type)
        print(f"[setup]     device: {d.name.strip()} | {kind} | "
              f"{d.max_compute_units} CUs | {d.global_mem_size / 2**30:.1f} GiB | {d.version} | driver {d.driver_version}")
if not platforms:
    sys.exit("[setup] ERROR: no OpenCL platform found. Check that pocl-opencl-icd is installed "
             "(ls /etc/OpenCL/vendors), that .icd/ lists it, and try: "
             "OCL_ICD_VENDORS=$PWD/.icd clinfo -l")
names = [p.name for p in platforms]
try:   # the rule (platform names only, never device names) has its home in clmf
    from clmf.engine.device import missing_platforms
except ImportError as exc:
    sys.exit(f"[setup] ERROR: clmf is not installed in .venv ({exc}); run scripts/setup.sh first")
missing = missing_platforms(names)
if missing:
    sys.exit(f"[setup] ERROR: required OpenCL platform(s) missing: {missing}; found {names}")
if not any("Intel" in n for n in names):
    print("[setup] WARNING: Intel's CPU OpenCL platform is not visible", file=sys.stderr)
if not any("Portable Computing Language" in n for n in names):
    print("[setup] WARNING: PoCL is not visible", file=sys.stderr)
EOF
    )
}

# ---------------------------------------------------------------------------------------------
# optional: system-wide registration of .venv's Intel runtime
# ---------------------------------------------------------------------------------------------
register_intel() {
    local lib
    lib="$(intel_lib)"
    [ -f "$lib" ] || die "Intel CPU runtime not installed at $lib; run make setup first"
    can_be_root || die "registering system-wide needs root or sudo. Do it by hand: echo '$lib' | sudo tee $SYSTEM_INTEL_ICD"
    as_root mkdir -p "$SYSTEM_ICD_DIR"
    printf '%s\n' "$lib" | as_root tee "$SYSTEM_INTEL_ICD" >/dev/null
    log "wrote $SYSTEM_INTEL_ICD -> $lib"
    log "every OpenCL program on this machine now sees Intel's CPU runtime (no OCL_ICD_VENDORS needed)."
    log "it points into this checkout's .venv: after moving or deleting it, run make unregister-intel."
}

unregister_intel() {
    if [ -e "$SYSTEM_INTEL_ICD" ]; then
        as_root rm -f "$SYSTEM_INTEL_ICD"
        log "removed $SYSTEM_INTEL_ICD"
    else
        log "$SYSTEM_INTEL_ICD not present; nothing to do"
    fi
}

# ---------------------------------------------------------------------------------------------
stage_deps() {
    apt_install "${APT_PACKAGES[@]}"
    choose_python
    make_venv
    install_deps
}

stage_project() {
    install_project
    write_icd_dir
    check_opencl
}

main() {
    local t0=$SECONDS
    [ $# -eq 0 ] && set -- --deps --project
    local arg
    for arg in "$@"; do
        case "$arg" in
            --deps) stage_deps ;;
            --project) stage_project ;;
            --icd) write_icd_dir ;;
            --check) check_opencl ;;
            --register-intel) register_intel ;;
            --unregister-intel) unregister_intel ;;
            -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; return 0 ;;
            *) die "unknown argument: $arg (see --help)" ;;
        esac
    done
    log "done ($*) in $((SECONDS - t0)) s"
}

main "$@"
