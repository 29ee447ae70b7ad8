"""OpenRouter: ``llm("openrouter:VENDOR/MODEL")`` as the OpenAI-compatible strategy at openrouter.ai.

OpenRouter speaks OpenAI's chat completions, so no strategy of its own is needed:
this factory sets its base URL, its key rule (``OPENROUTER_API_KEY`` goes only to
``https://openrouter.ai`` unless named) and its optional attribution headers. Its
error shapes -- an error inside an HTTP 200 body, 402 for spent credits, 502
``no_provider_available`` -- are read by the compatible strategy's wire module,
which every endpoint shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..._values._errors import ConfigurationError
from .._keys import provider_api_key
from ._compatible import OpenAICompatibleStrategy

__all__ = ["OPENROUTER_BASE_URL", "OPENROUTER_KEY_ENV", "openrouter_strategy"]

OPENROUTER_BASE_URL: Final = "https://openrouter.ai/api/v1"
OPENROUTER_HOST: Final = "openrouter.ai"
OPENROUTER_KEY_ENV: Final = "OPENROUTER_API_KEY"
_KEY_RULE: Final = "OPENROUTER_API_KEY goes only to https://openrouter.ai unasked"


def openrouter_strategy(
    model: str,
    *,
    base_url: str = OPENROUTER_BASE_URL,
    api_key: str | None = None,
    api_key_env: str | None = None,
    http_referer: str | None = None,
    x_title: str | None = None,
    headers: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> OpenAICompatibleStrategy:
    """An :class:`OpenAICompatibleStrategy` for OpenRouter's ``model`` (``"anthropic/claude-sonnet-4"``).

    The key is ``api_key``, else the variable ``api_key_env`` (sent to any
    ``base_url``), else ``OPENROUTER_API_KEY`` only when ``base_url`` is
    OpenRouter's own. ``http_referer`` and ``x_title`` become the ``HTTP-Referer``
    and ``X-Title`` headers OpenRouter uses to attribute an app. Other keyword
    arguments go to :class:`OpenAICompatibleStrategy` unchanged.
    """
    if not isinstance(model, str) or "/" not in model.strip("/"):
        raise ConfigurationError("model", model, 'OpenRouter names models "VENDOR/NAME", '
                                 'for example "openai/gpt-4o-mini"')
    sent = dict(headers or {})
    for name, value in (("HTTP-Referer", http_referer), ("X-Title", x_title)):
        if value is not None:
            if not isinstance(value, str) or not value.strip():
                field = "http_referer" if name == "HTTP-Referer" else "x_title"
                raise ConfigurationError(field, value, "must be a non-empty string or None")
            sent[name] = value
    strategy = OpenAICompatibleStrategy(model, base_url=base_url, headers=sent, **kwargs)
    secret = provider_api_key(api_key, api_key_env, strategy.base_url, host=OPENROUTER_HOST,
                              env_names=(OPENROUTER_KEY_ENV,))
    strategy.use_provider_key(secret, api_key_env, _KEY_RULE)
    return strategy
