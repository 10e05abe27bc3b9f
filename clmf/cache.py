"""Where clmf keeps its on-disk caches (tuning indexes, compiled kernel templates)."""
from __future__ import annotations

import os
import pathlib

__all__ = ["cache_dir"]


def cache_dir():
    """Directory of clmf's on-disk caches: ``$CLMF_CACHE_DIR``, else ``$XDG_CACHE_HOME/clmf``,
    else ``~/.cache/clmf``."""
    env = os.environ.get("CLMF_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "clmf"
