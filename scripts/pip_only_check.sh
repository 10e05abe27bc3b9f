#!/usr/bin/env bash
# The pip-only install path, as a new user without root takes it:
#   python -m venv venv && venv/bin/pip install clmf-*.whl "pyopencl[pocl]"
# (PoCL from PyPI as a wheel; no system OpenCL packages; the wheel's dependencies, pyarrow among
# them since it became the one reader of rating files, come from PyPI as wheels too). The system's OpenCL runtimes are hidden
# (OCL_ICD_VENDORS points at an empty folder) and every cache starts empty, so the kernels are
# built by PyPI's PoCL as on a fresh machine; then the README's first example runs.
# Checks: the wheel adds exactly one top-level package, `clmf`; the only OpenCL device is PyPI's
# PoCL; the example exits with status 0.
#
# usage: scripts/pip_only_check.sh [WHEEL]     (default: the one dist/clmf-*.whl)
# env:   PYTHON (interpreter for the venv; default .venv/bin/python, else python3),
#        PIP_CACHE_DIR (pip's cache, kept between runs so the step stays short)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf '[pip-only] %s\n' "$*"; }
die() { printf '[pip-only] ERROR: %s\n' "$*" >&2; exit 1; }

WHEEL="${1:-}"
if [ -z "$WHEEL" ]; then
    shopt -s nullglob
    wheels=("$ROOT"/dist/clmf-*.whl)
    shopt -u nullglob
    [ ${#wheels[@]} -eq 1 ] ||
        die "expected one clmf wheel in dist/ (make setup builds it), found ${#wheels[@]}"
    WHEEL="${wheels[0]}"
fi
[ -f "$WHEEL" ] || die "no wheel at $WHEEL"
WHEEL="$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/clmf-pip-only.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/pip}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
t0=$SECONDS

log "fresh venv ($("$PY" --version 2>&1)) in $WORK/venv"
"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin/python"
log "pip install $(basename "$WHEEL") \"pyopencl[pocl]\" (pip cache: $PIP_CACHE_DIR)"
"$V" -m pip install -q "$WHEEL" "pyopencl[pocl]"
log "installed in $((SECONDS - t0)) s:" \
    "$("$V" -m pip list --format=freeze 2>/dev/null | tr '\n' ' ')"

# exactly one top-level package added by the clmf wheel, and nothing unowned in site-packages
# (run outside the checkout: its clmf.egg-info must not be what importlib.metadata finds)
mkdir -p "$WORK/run"
cd "$WORK/run"
"$V" - <<'EOF'
import importlib.metadata as md
import pathlib
import sys
import sysconfig

site = pathlib.Path(sysconfig.get_paths()["purelib"])
def tops(dist):
    out = set()
    for f in dist.files or ():
        parts = pathlib.PurePosixPath(str(f)).parts
        if not parts or parts[0] == ".." or parts[0].endswith((".dist-info", ".data")):
            continue
        out.add(parts[0][:-3] if parts[0].endswith(".py") else parts[0])
    return out
clmf_tops = tops(md.distribution("clmf"))
print(f"[pip-only] top-level names installed by the clmf wheel: {sorted(clmf_tops)}")
if clmf_tops != {"clmf"}:
    sys.exit(f"[pip-only] ERROR: the clmf wheel must add exactly one top-level package, clmf; "
             f"it adds {sorted(clmf_tops)}")
owned = set()
for d in md.distributions():
    owned |= tops(d)
present = {p.name[:-3] if p.name.endswith(".py") else p.name for p in site.iterdir()
           if not p.name.endswith((".dist-info", ".pth", ".data")) and p.name != "__pycache__"
           and not p.name.startswith("_distutils_hack")}
unowned = sorted(present - owned)
if unowned:
    sys.exit(f"[pip-only] ERROR: site-packages holds entries no distribution owns: {unowned}")
EOF

# the README's first example, run outside the checkout with the system runtimes hidden
"$V" - "$ROOT/README.md" "$WORK/example.py" <<'EOF'
import re
import sys
text = open(sys.argv[1], encoding="utf-8").read()
m = re.search(r"```python\n(.*?)```", text, re.S)
if not m:
    sys.exit("[pip-only] ERROR: README.md has no ```python example")
open(sys.argv[2], "w", encoding="utf-8").write(m.group(1))
print("[pip-only] README's first example:\n" + m.group(1).rstrip())
EOF
mkdir -p "$WORK/no-icd" "$WORK/home/cache" "$WORK/home/data"
RUN=(env -u PYTHONPATH -u CLMF_TUNING_DB -u CLMF_DEVICE -u PYOPENCL_CTX -u POCL_DEVICES
     OCL_ICD_VENDORS="$WORK/no-icd" XDG_CACHE_HOME="$WORK/home/cache"
     XDG_DATA_HOME="$WORK/home/data" POCL_CACHE_DIR="$WORK/home/cache/pocl")
"${RUN[@]}" "$V" - <<'EOF'
import sys
import clmf
devs = clmf.devices()
for d in devs:
    print(f"[pip-only] device: {d}")
if not devs or any("Portable Computing Language" not in d.platform for d in devs):
    sys.exit("[pip-only] ERROR: expected only PyPI's PoCL (system runtimes hidden)")
EOF
t1=$SECONDS
"${RUN[@]}" "$V" "$WORK/example.py"
log "README example ran in $((SECONDS - t1)) s with PyPI's PoCL; step total $((SECONDS - t0)) s"
