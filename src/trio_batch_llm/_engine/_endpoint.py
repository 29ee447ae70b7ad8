"""Whether a failed attempt says the endpoint itself is unusable (what the circuit breaker counts).

Unusable: the connection was refused, the host name does not resolve, TLS failed,
the provider answered 401 or 403, or 404 about the model (or the URL's path). Read
off the exception and its chain (``__cause__``/``__context__``: httpx and the SDKs
wrap the socket's error), by type and duck typing, so neither ``httpx`` nor an SDK
is imported. Everything else (timeouts, resets, 5xx, 429, a 404 about something
else) says nothing about the endpoint as a whole.
"""

from __future__ import annotations

import re
import socket
import ssl
from typing import Final

__all__ = ["endpoint_unusable"]

_REFUSED: Final = "connection refused"
_DNS: Final = "host name not resolved"
_TLS: Final = "TLS failed"

_CHAIN_DEPTH: Final = 8
_UNUSABLE_STATUSES: Final = frozenset({401, 403})
# A 404 about the model, or about the URL (a wrong base URL answers a bare "404 page not found").
_NOT_FOUND_ENDPOINT: Final = re.compile(
    r"model|page not found|\b(?:path|route|url|endpoint)\b|^\W*(?:http 404\W*)?not found\W*$", re.IGNORECASE)
# httpx and httpcore say in words what their socket's error was when they keep no chain.
_CONNECT_WORDS: Final = re.compile(
    r"connection refused|errno 111\b|errno 61\b|winerror 10061|name or service not known|"
    r"nodename nor servname|temporary failure in name resolution|getaddrinfo failed|"
    r"no address associated with hostname|certificate verify failed|\[ssl", re.IGNORECASE)
_CONNECT_CLASS_NAMES: Final = frozenset({"ConnectError", "APIConnectionError"})


def endpoint_unusable(exc: BaseException, status: int | None, text: str | None = None) -> str | None:
    """Why ``exc`` (a failed attempt's exception, with its HTTP ``status`` if any) says the endpoint
    is unusable (``"connection refused"``, ``"HTTP 401"``, ...), or ``None`` when it does not;
    ``text`` is its lowercased error text, read when the status is 404."""
    if status is not None:
        if status in _UNUSABLE_STATUSES:
            return f"HTTP {status}"
        if status == 404 and _NOT_FOUND_ENDPOINT.search(text if text is not None else str(exc)):
            return "HTTP 404 (model or URL not found)"
        return None
    return _chain_unusable(exc, _CHAIN_DEPTH)


def _chain_unusable(exc: BaseException, depth: int) -> str | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    for _ in range(depth):
        if current is None or id(current) in seen:
            break
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError):
            return _REFUSED
        if isinstance(current, socket.gaierror):
            return _DNS
        if isinstance(current, ssl.SSLError):
            return _TLS
        if isinstance(current, BaseExceptionGroup):
            # Every address tried (anyio on Trio groups them): unusable only if each one was.
            causes = {_chain_unusable(sub, depth - 1) for sub in current.exceptions}
            return None if not causes or None in causes else " / ".join(sorted(c for c in causes if c))
        if _is_connect_error(current):
            found = _CONNECT_WORDS.search(str(current)[:1024])
            if found is not None:
                return _words_cause(found.group(0).lower())
        current = current.__cause__ or current.__context__
    return None


def _words_cause(words: str) -> str:
    if "ssl" in words or "certificate" in words:
        return _TLS
    if "refused" in words or "errno 111" in words or "errno 61" in words or "10061" in words:
        return _REFUSED
    return _DNS


def _is_connect_error(exc: BaseException) -> bool:
    return any(klass.__name__ in _CONNECT_CLASS_NAMES for klass in type(exc).__mro__)
