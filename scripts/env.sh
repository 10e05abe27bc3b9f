# Source me (bash or zsh) from anywhere:  source scripts/env.sh
# Activates .venv and points the OpenCL ICD loader at .icd/ (PoCL + Intel's CPU runtime), so that
# `clmf ...`, `python`, `pytest` and `clinfo` see the same platforms as `make test` / `make demo`.
# Run `make setup` first.
_clmf_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
if [ ! -x "$_clmf_root/.venv/bin/python" ] || [ ! -d "$_clmf_root/.icd" ]; then
    echo "clmf: $_clmf_root/.venv or .icd/ is missing; run 'make setup' first" >&2
else
    export OCL_ICD_VENDORS="$_clmf_root/.icd"
    . "$_clmf_root/.venv/bin/activate"
fi
unset _clmf_root
