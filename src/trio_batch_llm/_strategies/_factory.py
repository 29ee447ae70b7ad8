"""``llm("provider:model", **kwargs)``: a strategy from a short spec string."""

from __future__ import annotations

from typing import Any

from .._values._errors import ConfigurationError
from ._base import LLMCallStrategy
from .openai._compatible import OpenAICompatibleStrategy
from .openai._sdk import OpenAIStrategy

__all__ = ["llm"]

_PROVIDERS = ("openai", "openai-compatible", "anthropic", "gemini", "openrouter")


def llm(spec: str, **kwargs: object) -> LLMCallStrategy[str]:
    """Build a strategy: ``"openai:gpt-4o-mini"``, ``"openai-compatible:NAME"`` (needs ``base_url=``),
    ``"anthropic:NAME"``, ``"gemini:NAME"`` or ``"openrouter:VENDOR/NAME"``.

    Keyword arguments go to the strategy's constructor unchanged. Either strategy sends
    ``OPENAI_API_KEY`` only to OpenAI's own API; another ``base_url=`` takes ``api_key=`` or
    ``api_key_env=`` (the name of the environment variable holding its key), or sends no key.
    """
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigurationError("spec", spec, f'expected "PROVIDER:MODEL" with PROVIDER in {_PROVIDERS}')
    provider, _, model = spec.partition(":")
    # Each constructor checks its own arguments (ConfigurationError), so they go on unchecked here.
    forwarded: dict[str, Any] = dict(kwargs)
    if not model:
        raise ConfigurationError("spec", spec, "the model name after the colon is empty")
    if provider == "openai":
        return OpenAIStrategy(model, **forwarded)
    if provider == "openai-compatible":
        if "base_url" not in forwarded:
            raise ConfigurationError("base_url", None, f"{spec!r} needs base_url=")
        return OpenAICompatibleStrategy(model, **forwarded)
    if provider == "anthropic":  # each provider's module is imported only when asked for
        from .anthropic._strategy import AnthropicStrategy

        return AnthropicStrategy(model, **forwarded)
    if provider == "gemini":
        from .gemini._strategy import GeminiStrategy

        return GeminiStrategy(model, **forwarded)
    if provider == "openrouter":
        from .openai._openrouter import openrouter_strategy

        return openrouter_strategy(model, **forwarded)
    raise ConfigurationError("spec", spec, f"unknown provider {provider!r}; known: {', '.join(_PROVIDERS)}")
