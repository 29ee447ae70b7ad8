"""MkDocs hook: render the Sphinx roles our docstrings use (``:class:`X```) as plain code.

The library's docstrings are written for ``help()`` and IDEs, where
``:class:`ParallelBatchProcessor``` reads fine; in HTML the role prefix is
noise. mkdocstrings renders the docstring as Markdown first, so by the time
this hook sees the page the role has become ``:class:<code>X</code>``.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|attr|data|exc|mod|obj|const):(?=<code)")


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub("", html)
