"""Which strings name a PostgreSQL database, and how one is shown without its password.

A run store given as a string is a PostgreSQL database when it is a
``postgresql://`` (or ``postgres://``) URL, or a libpq keyword string
(``"host=db port=5432 user=app password=... dbname=runs"``, what psycopg and
``psql`` accept as well). Anything else is a SQLite path. A keyword string is
recognised by its first ``keyword=`` being one libpq knows, so a SQLite file is
never created under a name that holds a password.

:func:`display` is the one way such a string is shown (locations, reprs,
messages, the command line's output): a URL with its userinfo and key-like
query values redacted, a keyword string with its ``password`` value redacted.
Pure functions; none raises.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote, urlsplit

from ._urls import REDACTED, redact_url

__all__ = ["display", "is_conninfo", "is_postgres_store", "is_postgres_url", "secret_of"]

_SCHEMES: Final = ("postgresql://", "postgres://")
# libpq's connection keywords (PostgreSQL 15's "Parameter Key Words").
_KEYWORDS: Final = frozenset({
    "host", "hostaddr", "port", "dbname", "user", "password", "passfile", "channel_binding",
    "connect_timeout", "client_encoding", "options", "application_name", "fallback_application_name",
    "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
    "replication", "gssencmode", "sslmode", "requiressl", "sslcompression", "sslcert", "sslkey",
    "sslpassword", "sslrootcert", "sslcrl", "sslcrldir", "sslsni", "requirepeer", "ssl_min_protocol_version",
    "ssl_max_protocol_version", "krbsrvname", "gsslib", "service", "target_session_attrs",
    "load_balance_hosts",
})
_SECRET_KEYWORDS: Final = frozenset({"password", "sslpassword"})
_FIRST_KEY: Final = re.compile(r"\s*([A-Za-z_]+)\s*=")
# One ``keyword = value`` pair: the value single-quoted (backslash escapes) or up to a space.
_PAIR: Final = re.compile(r"\s*([A-Za-z_]+)\s*=\s*('(?:[^'\\]|\\.)*'?|[^\s]*)", re.S)


def is_postgres_url(store: object) -> bool:
    return isinstance(store, str) and store.lower().startswith(_SCHEMES)


def is_conninfo(store: object) -> bool:
    """Whether ``store`` is a libpq keyword string: its first ``keyword=`` is one libpq knows."""
    if not isinstance(store, str):
        return False
    found = _FIRST_KEY.match(store)
    return found is not None and found.group(1).lower() in _KEYWORDS


def is_postgres_store(store: object) -> bool:
    """A ``postgresql://`` URL or a libpq keyword string."""
    return is_postgres_url(store) or is_conninfo(store)


def _pairs(conninfo: str) -> list[tuple[str, str, tuple[int, int]]]:
    """``(keyword, raw value, the value's span)`` of each pair, as far as the string parses."""
    pairs, at = [], 0
    while at < len(conninfo) and (found := _PAIR.match(conninfo, at)) is not None and found.end() > at:
        pairs.append((found.group(1).lower(), found.group(2), found.span(2)))
        at = found.end()
    return pairs


def _unquote(raw: str) -> str:
    if raw.startswith("'"):
        return re.sub(r"\\(.)", r"\1", raw[1:-1] if raw.endswith("'") and len(raw) > 1 else raw[1:])
    return raw


def display(store: str) -> str:
    """``store`` as shown anywhere: without its password (see the module docstring)."""
    if not is_conninfo(store):
        return redact_url(store)
    out, last = [], 0
    for keyword, _, (start, end) in _pairs(store):
        out.append(store[last:start])
        out.append(REDACTED if keyword in _SECRET_KEYWORDS else store[start:end])
        last = end
    if store[last:].strip():  # what did not parse (a stray word...) may hold a password still
        out.append(f" {REDACTED}")
    return "".join(out)


def secret_of(store: str) -> str | None:
    """The password in ``store`` (URL userinfo or ``?password=``, or a keyword), to scrub from messages."""
    if is_conninfo(store):
        for keyword, raw, _ in _pairs(store):
            if keyword == "password" and raw:
                return _unquote(raw) or None
        return None
    parts = urlsplit(store)
    try:
        password = parts.password
    except ValueError:
        password = None
    if password:
        return unquote(password)
    for pair in parts.query.split("&"):
        name, _, value = pair.partition("=")
        if name == "password" and value:
            return unquote(value)
    return None
