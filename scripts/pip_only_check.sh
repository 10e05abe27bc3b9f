#!/usr/bin/env bash
# The pip-only install path, as a new user without root takes it: the README's install block
# (python3 -m venv venv && . venv/bin/activate; pip install dist/clmf-*.whl "pyopencl[pocl]"),
# run as written: PoCL from PyPI as a wheel, no system OpenCL packages (the wheel's dependencies,
# pyarrow among them, come from PyPI as wheels too). The system's OpenCL runtimes are hidden
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

# the README's pip-only install block (the one under this mark), run as written in $WORK, where
# dist/ holds the wheel and python3 is $PY: it makes $WORK/venv
MARK='<!-- ci: scripts/pip_only_check.sh -->'
"$PY" - "$ROOT/README.md" "$MARK" >"$WORK/install.sh" <<'EOF'
import re
import sys
text = open(sys.argv[1], encoding="utf-8").read()
m = re.search(re.escape(sys.argv[2]) + r"[ \t]*\n```bash\n(.*?)^```", text, re.S | re.M)
if not m:
    sys.exit(f"[pip-only] ERROR: README.md has no ```bash block under {sys.argv[2]}")
sys.stdout.write(m.group(1))
EOF
mkdir -p "$WORK/dist" "$WORK/bin"
ln -s "$WHEEL" "$WORK/dist/$(basename "$WHEEL")"
ln -s "$(command -v "$PY")" "$WORK/bin/python3"
log "the README's install block ($("$PY" --version 2>&1), pip cache: $PIP_CACHE_DIR):"
sed 's/^/[pip-only]   /' "$WORK/install.sh"
(cd "$WORK" && PATH="$WORK/bin:$PATH" PIP_QUIET=1 bash -euo pipefail install.sh)
V="$WORK/venv/bin/python"
[ -x "$V" ] || die "the README's install block made no venv at $WORK/venv"
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

# issue 34: the first fit of every mode at f = 16/64/128 on ML-100K and Last.fm, each in a fresh
# process with every cache empty (probes and kernel builds included); fails on a crash or a stall
# (> 60 s), prints the table (the goal is <= 10 s each)
DATA_DIR="${CLMF_SHARED_DATA:-$ROOT/../shared/data}"
if [ -d "$DATA_DIR/ml-100k" ] && [ -d "$DATA_DIR/hetrec2011-lastfm-2k" ]; then
    t1=$SECONDS
    "${RUN[@]}" "$V" "$ROOT/scripts/first_fit_check.py" --data-dir "$DATA_DIR" \
        --json "$WORK/first-fits.json"
    log "first fits of every mode ran in $((SECONDS - t1)) s with PyPI's PoCL"
elif [ "${CI:-}" = "true" ]; then
    die "the shared data ($DATA_DIR: ml-100k, hetrec2011-lastfm-2k) is missing (CI=true needs it)"
else
    log "shared data not found under $DATA_DIR: first-fit check skipped"
fi
