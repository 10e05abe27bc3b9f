"""MkDocs hook: the docstrings' Sphinx roles (``:class:`X```, ``:meth:`~a.b```) rendered as plain
code, as Sphinx shows them, instead of the role's name printed before the code."""
from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj|ref):<code>~?")


def on_page_content(html, **kwargs):
    """Drop the role prefix (and a leading ``~``) before each inline code span."""
    return _ROLE.sub("<code>", html)
