"""The documentation's doctests (``make docs``): run from the repository root, so the pages'
``../shared/data/...`` paths resolve; a page that reads a shared data set missing here is skipped,
and fails under CI=true (the rule of ``tests/conftest.py``'s ``shared_data``)."""
from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
_SHARED = re.compile(r"\.\./shared/data/([\w.-]+)")


def _tests_conftest():
    """tests/conftest.py as a module (its shared_data rule has one home)."""
    spec = importlib.util.spec_from_file_location("clmf_tests_conftest",
                                                  REPO / "tests" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(autouse=True)
def _docs_doctest_env(request, monkeypatch):
    """Run each page's doctest from the repository root, with its shared data present."""
    monkeypatch.chdir(REPO)
    path = getattr(request.node, "path", None)
    if path is not None and path.suffix == ".md":
        for rel in sorted(set(_SHARED.findall(path.read_text(encoding="utf-8")))):
            _tests_conftest().shared_data(rel)
