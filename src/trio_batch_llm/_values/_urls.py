"""Base URLs: joining an API path onto one, recognising OpenAI's own API, hiding keys inside one.

:func:`join_url` puts the path before the base URL's query (Azure-style
``?api-version=...`` endpoints keep it). :func:`is_openai_api` says whether a
URL is OpenAI's own API, the one host ``OPENAI_API_KEY`` is sent to unasked.

A base URL may carry a credential: userinfo (``http://user:KEY@host/v1``, sent
by the HTTP client as Basic auth) or a query value (``?api_key=KEY``,
``?key=``, ``?token=``, Azure's ``?sig=`` / ``?code=``). The URL is still used
as given; only what is *shown* — the command line's "resume with" line and
other messages, strategy reprs, quota scope names, error texts of results,
what a run stores — goes through :func:`redact_url` (one URL) or
:func:`redact_urls` (every URL inside a text). Every function here is pure and never raises.

Redaction is deliberately generous: all of the userinfo goes (a lone user name
is often the token itself), and so does every query or fragment value whose
name looks like a credential; hiding an innocent value costs nothing.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote, urlsplit

__all__ = ["REDACTED", "is_openai_api", "join_url", "normalize_base_url", "redact_url", "redact_urls"]

OPENAI_API_HOST: Final = "api.openai.com"

REDACTED: Final = "<redacted>"
_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_KEYLIKE_PARTS: Final = ("key", "token", "secret", "password", "passwd", "pwd", "auth", "credential",
                         "signature", "session", "bearer", "jwt")
_KEYLIKE_NAMES: Final = frozenset({"sig", "code", "pass", "pw", "sas"})


def _keylike(name: str) -> bool:
    plain = re.sub(r"[^a-z0-9]", "", unquote(name).lower())
    return plain in _KEYLIKE_NAMES or any(part in plain for part in _KEYLIKE_PARTS)


def _redact_params(params: str) -> str:
    parts = []
    for part in params.split("&"):
        name, equals, value = part.partition("=")
        parts.append(f"{name}={REDACTED}" if equals and value and _keylike(name) else part)
    return "&".join(parts)


def redact_url(url: str) -> str:
    """``url`` with its userinfo and key-like query and fragment values replaced by ``<redacted>``.

    Text that is not ``scheme://...`` comes back unchanged. The userinfo is
    everything up to the last ``@`` before any ``?`` or ``#``, so a key with an
    unescaped ``/`` in it is hidden too (at worst a path holding an ``@`` goes
    with it).
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = len(rest)
    for mark in "?#":
        found = rest.find(mark)
        if found != -1:
            end = min(end, found)
    at = rest.rfind("@", 0, end)
    if at != -1:
        rest = f"{REDACTED}@{rest[at + 1:]}"
    head, hash_mark, fragment = rest.partition("#")
    path, question, query = head.partition("?")
    if question:
        path += question + _redact_params(query)
    if hash_mark:
        path += hash_mark + _redact_params(fragment)
    return f"{scheme}{sep}{path}"


def redact_urls(text: str) -> str:
    """``text`` with every URL in it passed through :func:`redact_url` (fast when it holds none)."""
    if "://" not in text:
        return text
    return _URL.sub(lambda found: redact_url(found.group()), text)


def _split_query(url: str) -> tuple[str, str]:
    """``(everything before the query or fragment, the query and fragment with their marks)``."""
    cut = min((i for i in (url.find("?"), url.find("#")) if i != -1), default=len(url))
    return url[:cut], url[cut:]


def normalize_base_url(url: str) -> str:
    """``url`` without the trailing slashes of its path (its query, if any, kept)."""
    head, tail = _split_query(url)
    return head.rstrip("/") + tail


def join_url(base_url: str, path: str) -> str:
    """``path`` (``/chat/completions``) appended to the path of ``base_url``, before its query."""
    head, tail = _split_query(base_url)
    return head.rstrip("/") + path + tail


def is_openai_api(url: str) -> bool:
    """Whether ``url`` is OpenAI's own API: ``https://api.openai.com`` (port 443), no userinfo."""
    return is_host_api(url, OPENAI_API_HOST)


def is_host_api(url: str, host: str) -> bool:
    """Whether ``url`` is ``https://HOST`` (port 443, no userinfo): a provider's own API, where its key
    from the environment may go unasked."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    return (parts.scheme.lower() == "https" and (parts.hostname or "") == host
            and port in (None, 443) and parts.username is None and parts.password is None)
