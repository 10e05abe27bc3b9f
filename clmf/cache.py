"""Where clmf keeps its on-disk caches (tuning indexes, compiled kernel templates)."""
from __future__ import annotations

import os
import pathlib

__all__ = ["cache_dir"]


def cache_dir():
    """Directory of clmf's on-disk caches: ``$CLMF_CACHE_DIR``, else the platform's user cache
    directory for clmf (``~/.cache/clmf`` on Linux)."""
    env = os.environ.get("CLMF_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    import platformdirs
    return pathlib.Path(platformdirs.user_cache_dir("clmf"))
