"""Where a recorded figure came from: the clmf commit (used by every results writer)."""
from __future__ import annotations

import functools
import os
import pathlib
import subprocess

__all__ = ["commit"]


@functools.lru_cache(maxsize=1)
def commit():
    """The commit of the clmf sources in use: ``$CLMF_COMMIT`` if set (e.g. on a machine that got
    a copy of the working tree without ``.git``), else ``git rev-parse HEAD`` of the checkout
    holding this package, with ``+dirty`` when tracked files are modified; ``"unknown"`` when
    neither is available (an installed wheel)."""
    env = os.environ.get("CLMF_COMMIT")
    if env:
        return env
    root = pathlib.Path(__file__).resolve().parents[1]
    try:
        c = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return c + ("+dirty" if dirty else "")
    except Exception:
        return "unknown"
