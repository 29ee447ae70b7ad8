"""The command line's providers: ``--model PROVIDER:NAME``, ``--api``, ``--base-url`` and ``--api-key-env``
turned into a strategy, and the line that says which API a run speaks.

Every provider keeps the key rule of issue 16: ``--api-key-env NAME`` sends that
variable's key to any endpoint; without it each strategy sends its provider's own
variable (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, ``GEMINI_API_KEY``/``GOOGLE_API_KEY``,
``OPENROUTER_API_KEY``) only to that provider's own host, and another ``--base-url``
gets no key. The Anthropic and Gemini strategies are imported only when asked for.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Mapping
from typing import Any, Final

from .._strategies._base import LLMCallStrategy
from .._strategies._factory import llm
from .._values._errors import ConfigurationError
from .._values._urls import is_openai_api, redact_url
from ._command import UsageError

__all__ = ["API_HELP", "OPENAI_WIRE", "PROVIDERS", "api_note", "build_strategy", "endpoint_line"]

PROVIDERS: Final = ("openai-compatible", "openai", "anthropic", "gemini", "openrouter")
OPENAI_WIRE: Final = frozenset({"openai", "openai-compatible", "openrouter"})
"""Providers spoken in OpenAI's wire format, where ``--api chat|responses`` applies."""
API_HELP: Final = ("the OpenAI API to call, for openai, openai-compatible and openrouter: chat (the Chat "
                   "Completions API, POST /chat/completions) or responses (the Responses API, POST "
                   "/responses); default: responses for openai:, chat for openai-compatible: and "
                   "openrouter:. Through a gateway that translates the Responses API, chat may count "
                   "several times fewer tokens. (anthropic speaks the Messages API, gemini generateContent)")
_NATIVE: Final[Mapping[str, tuple[str, str]]] = {
    "anthropic": ("trio_batch_llm._strategies.anthropic._strategy", "AnthropicStrategy"),
    "gemini": ("trio_batch_llm._strategies.gemini._strategy", "GeminiStrategy"),
}
_FLAGS: Final = {"system_prompt": "--system", "temperature": "--temperature",
                 "max_output_tokens": "--max-tokens", "response_model": "--response-schema"}
_API_NAMES: Final = {"chat": "Chat Completions API", "responses": "Responses API"}
_DEFAULT_HOSTS: Final = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com",
                         "gemini": "https://generativelanguage.googleapis.com",
                         "openrouter": "https://openrouter.ai/api/v1"}


def _native_class(provider: str, model: str) -> type[Any]:
    module_name, class_name = _NATIVE[provider]
    try:
        return getattr(importlib.import_module(module_name), class_name)  # type: ignore[no-any-return]
    except ImportError as exc:
        raise UsageError(f"--model {provider}:{model}: {exc} (the {provider} strategy needs "
                         f"pip install 'trio-batch-llm[{provider}]')") from None


def _native_kwargs(provider: str, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` as the native strategy takes them: a setting it has no argument for goes into
    ``params=`` (temperature), or is dropped (concurrency: the engine's bound still holds), or is
    refused naming its flag."""
    accepted = inspect.signature(_native_class(provider, model).__init__).parameters
    taken: dict[str, Any] = {}
    for name, value in kwargs.items():
        if value is None or name in accepted:
            if value is not None:
                taken[name] = value
        elif name == "temperature" and "params" in accepted:
            taken.setdefault("params", {})["temperature"] = value
        elif name != "concurrency":
            raise UsageError(f"{_FLAGS.get(name, name)} is not supported with --model {provider}:{model}")
    return taken


def build_strategy(provider: str, model: str, *, api: str | None, base_url: str | None,
                   api_key: str | None, api_key_env: str | None, settings: Mapping[str, Any],
                   concurrency: int | None) -> LLMCallStrategy[str]:
    """The strategy ``--model provider:model`` and the endpoint flags ask for; :class:`UsageError`
    (one line, the key never in it) for anything that cannot run."""
    if provider == "openai-compatible" and not base_url:
        raise UsageError(f"--base-url is required with --model {provider}:{model}")
    if api is not None and provider not in OPENAI_WIRE:
        raise UsageError(f"--api {api} applies to OpenAI's wire format (openai, openai-compatible, "
                         f"openrouter); --model {provider}:{model} speaks its own API")
    if provider == "openai" and api_key_env is None and base_url \
            and not is_openai_api(base_url) and base_url != os.environ.get("OPENAI_BASE_URL"):
        raise UsageError(f"--base-url {redact_url(base_url)} is not OpenAI's API, and OPENAI_API_KEY is "
                         "sent only to https://api.openai.com: name the environment variable that holds "
                         "this endpoint's key with --api-key-env NAME")
    kwargs: dict[str, Any] = {"api_key": api_key, "concurrency": concurrency, **settings}
    if base_url:
        kwargs["base_url"] = base_url
    if api is not None:
        kwargs["api"] = api
    if provider in _NATIVE:
        kwargs = _native_kwargs(provider, model, kwargs)
    try:
        return llm(f"{provider}:{model}", **kwargs)
    except ImportError as exc:
        raise UsageError(f"--model {provider}:{model}: {exc}") from None
    except ConfigurationError as exc:
        if exc.field == "params" and "temperature" in kwargs.get("params", {}):  # from --temperature
            raise UsageError(f"--temperature is not supported with --model {provider}:{model}: "
                             f"{exc.problem.removeprefix(repr('temperature') + ': ')}") from None
        raise UsageError(str(exc)) from None


def endpoint_line(provider: str, model: str, strategy: LLMCallStrategy[Any]) -> str:
    """``model openai:gpt-4o-mini, Chat Completions API at https://api.openai.com/v1``: which API a
    run speaks, and where (the URL without credentials)."""
    api = getattr(strategy, "api", None)
    if provider in OPENAI_WIRE:
        spoken = _API_NAMES.get(api if isinstance(api, str) else "chat", "Chat Completions API")
    else:
        spoken = {"anthropic": "Messages API", "gemini": "generateContent API"}.get(provider, "API")
    url = getattr(strategy, "base_url", None) or _DEFAULT_HOSTS.get(provider)
    where = f" at {redact_url(url)}" if isinstance(url, str) and url else ""
    return f"model {provider}:{model}, {spoken}{where}"


def api_note(provider: str, model: str, api: str | None, strategy: LLMCallStrategy[Any]) -> str | None:
    """The line a run prints before its first call when ``--model openai:NAME`` speaks its default, the
    Responses API, to an endpoint that is not OpenAI's: a gateway translating it to chat completions
    has been seen to count about four times the tokens (and cost) of the same answers by ``--api
    chat``. ``None`` when ``--api`` chose, or the endpoint is OpenAI's own."""
    url = getattr(strategy, "base_url", None)
    if provider != "openai" or api is not None or getattr(strategy, "api", None) != "responses" \
            or not isinstance(url, str) or is_openai_api(url):
        return None
    return (f"note: --model {provider}:{model} speaks the Responses API (POST /responses) to "
            f"{redact_url(url)}; a gateway that translates it may count several times the tokens of "
            "--api chat (the Chat Completions API); pass --api responses or --api chat to choose")
