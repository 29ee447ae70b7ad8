"""MkDocs hook: fail the (strict) build when a page shows a private name.

A private name (``_EndpointStrategy``, ``_DEFAULT_TIMEOUT``) in a public
signature or a class's bases tells a reader about something they cannot
import; :mod:`griffe_public` removes the ones we know how to, and this hook
catches the rest. It also refuses ``**kwargs: Any``: forwarded keyword
arguments are typed or listed, so the page says what may be passed.
Last, no page of the finished site (text, links, tooltips) may name a private
module, ``trio_batch_llm._...``: a tooltip ``(trio_batch_llm._values._errors.X)``
or an example's ``from trio_batch_llm._runs import ...`` sends a reader where
the package promises nothing.
"""

from __future__ import annotations

import html as html_module
import logging
import re
from typing import Any

log = logging.getLogger("mkdocs.hooks.private_names")

_SIGNATURE = re.compile(r'<div class="doc-signature[^"]*">(.*?)</div>', re.S)
_BASES = re.compile(r"<p>\s*Bases:(.*?)</p>", re.S)
_TAG = re.compile(r"<[^>]+>")
_PRIVATE = re.compile(r"(?<![A-Za-z0-9_.])_[A-Za-z][A-Za-z0-9_]*")
_UNTYPED_KWARGS = re.compile(r"\*\*\w+:\s*Any\b")
_PRIVATE_MODULE = re.compile(r"\btrio_batch_llm\._\w+(?:\.\w+)*")
# llm() forwards its keywords to the strategy its spec names; they are documented on those classes.
_FORWARDERS = ("llm(",)


def _text(fragment: str) -> str:
    return " ".join(html_module.unescape(_TAG.sub("", fragment)).split())


def find_private(page_html: str) -> list[str]:
    """Every signature or base list of ``page_html`` that shows a private name or ``**kwargs: Any``."""
    problems: list[str] = []
    for pattern, what in ((_SIGNATURE, "signature"), (_BASES, "bases")):
        for match in pattern.finditer(page_html):
            text = _text(match.group(1))
            names = sorted(set(_PRIVATE.findall(text)))
            if names:
                problems.append(f"{what} shows private name(s) {', '.join(names)}: {text[:160]}")
            if what == "signature" and _UNTYPED_KWARGS.search(text) and not text.startswith(_FORWARDERS):
                problems.append(f"signature has untyped keyword arguments: {text[:160]}")
    return problems


def on_page_content(html: str, *, page: Any, **_: Any) -> str:
    if page.file.src_uri.startswith("reference/"):
        for problem in find_private(html):
            log.warning("%s: %s", page.file.src_uri, problem)
    return html


def find_private_modules(page_html: str) -> list[str]:
    """Each distinct ``trio_batch_llm._...`` path the finished page shows, with what surrounds it."""
    problems: dict[str, str] = {}
    for match in _PRIVATE_MODULE.finditer(page_html):
        before = _text(page_html[max(0, match.start() - 400):match.start()].rpartition(">")[0] + ">")
        problems.setdefault(match.group(), before[-100:])
    return [f"names private module path {path}: ...{around}" for path, around in sorted(problems.items())]


def on_post_page(output: str, *, page: Any, **_: Any) -> str:
    # After autorefs has written the links and their tooltips.
    for problem in find_private_modules(output):
        log.warning("%s: %s", page.file.src_uri, problem)
    return output
