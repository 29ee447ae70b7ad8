"""API keys: where one comes from, and a wrapper that never shows it.

A key is sent only where it belongs (:func:`endpoint_api_key`, :func:`provider_api_key`):
the user named it for this endpoint, or it is a provider's own key (``OPENAI_API_KEY``,
``ANTHROPIC_API_KEY``, ...) and this is that provider's own host. Inside the
library it travels as a :class:`Secret`, which no repr, log line, f-string or
pickle reveals; messages that may echo it are scrubbed with :meth:`Secret.redact`.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, final

from .._values._errors import ConfigurationError
from .._values._urls import is_host_api, is_openai_api

__all__ = ["OPENAI_KEY_ENV", "Secret", "endpoint_api_key", "provider_api_key", "resolve_api_key"]

OPENAI_KEY_ENV = "OPENAI_API_KEY"
_MIN_SECRET_LENGTH = 8


@final
class Secret:
    """An API key that never shows itself in a repr, a str, a log line or an f-string."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def fingerprint(self) -> str:
        """A short one-way digest: equal keys share quotas and clients without storing the key."""
        return hashlib.sha256(self._value.encode()).hexdigest()[:16]

    def redact(self, text: str) -> str:
        """``text`` without the key. Placeholder keys (``"EMPTY"``, ``"none"``) are too short to hide and
        would mangle ordinary words, so keys under eight characters are left alone."""
        return text.replace(self._value, "<redacted>") if len(self._value) >= _MIN_SECRET_LENGTH else text

    def __repr__(self) -> str:
        return "Secret('<redacted>')"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("an API key is not picklable")


def resolve_api_key(api_key: str | None, *, env: str | None = "OPENAI_API_KEY") -> Secret | None:
    """The key from the argument, else from the environment variable ``env``; ``None`` if neither."""
    if env is not None and (not isinstance(env, str) or not env):
        raise ConfigurationError("api_key_env", env, "must be the name of an environment variable, or None")
    if api_key is None and env:
        api_key = os.environ.get(env) or None
    if api_key is not None and not isinstance(api_key, str):
        raise ConfigurationError("api_key", type(api_key).__name__, "must be a string")
    return Secret(api_key) if api_key else None


def endpoint_api_key(api_key: str | None, api_key_env: str | None, base_url: str) -> Secret | None:
    """The key for ``base_url``: ``api_key``, else the variable ``api_key_env`` (for any endpoint),
    else ``OPENAI_API_KEY`` only when ``base_url`` is OpenAI's own API; ``None`` if none applies.

    A key is sent only where it belongs: the user named this key for this
    endpoint, or it is OpenAI's key and this is OpenAI.
    """
    if api_key is not None or api_key_env is not None:
        return resolve_api_key(api_key, env=api_key_env)
    return resolve_api_key(None, env=OPENAI_KEY_ENV if is_openai_api(base_url) else None)


def provider_api_key(api_key: str | None, api_key_env: str | None, base_url: str, *, host: str,
                     env_names: tuple[str, ...]) -> Secret | None:
    """The key for ``base_url`` of a provider whose own API is ``https://HOST``: ``api_key``, else the
    variable ``api_key_env`` (for any endpoint), else the first set of ``env_names`` (the provider's
    own variables, such as ``ANTHROPIC_API_KEY``) only when ``base_url`` is that host; ``None`` if none
    applies. A key in the shell is never handed to another endpoint (a mock, a gateway) unasked.
    """
    if api_key is not None or api_key_env is not None:
        return resolve_api_key(api_key, env=api_key_env)
    if not is_host_api(base_url, host):
        return None
    for name in env_names:
        found = resolve_api_key(None, env=name)
        if found is not None:
            return found
    return None
