"""Call Anthropic's Messages API through the official ``anthropic`` SDK (which runs on httpx2 and anyio).

The SDK is imported when a strategy is constructed, never by ``import trio_batch_llm``.
Clients are built with ``max_retries=0`` (retries belong to the engine) and shared per
event loop by lease identity, as the OpenAI strategies share theirs (the base class
holds that machinery, the key handling and the structured-output stage).

SDK failures are not wrapped (CONTRACT C7.2): ``anthropic.RateLimitError`` and friends
reach the engine as themselves, scrubbed of the key, with the rate-limit headers of their
answer as ``exc.metadata["rate_limit"]`` and, for a spend limit, ``exc.stops_batch``
saying why the batch must stop. :meth:`AnthropicStrategy.classify_error` files them with
the dialect's one table (``_errors``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any, final

from ..._admission import RATE_LIMIT_METADATA_KEY, rate_limit_headers
from ..._values._categories import ErrorCategory
from ..._values._errors import ConfigurationError
from ..._values._prompts import LLMRequest
from ..._values._results import RetryState, TokenUsage
from ..._values._urls import redact_url
from .._batch import BatchEndpoint
from .._keys import Secret, provider_api_key
from .._sdk_strategy import SdkStrategy, import_extra
from ..openai._compatible import _DEFAULT_TIMEOUT
from ._errors import sdk_verdict
from ._requests import REFUSED_PARAMS, build_params, request_problem
from ._wire import read_message

__all__ = ["AnthropicStrategy"]

ANTHROPIC_URL = "https://api.anthropic.com"
ANTHROPIC_HOST = "api.anthropic.com"
KEY_ENV = "ANTHROPIC_API_KEY"


def _api_key(api_key: str | None, api_key_env: str | None, base_url: str, *, paired: bool) -> Secret:
    """The SDK needs a key; ``ANTHROPIC_API_KEY`` goes only to Anthropic, or to the
    ``ANTHROPIC_BASE_URL`` set beside it (the SDK's own pairing)."""
    secret = provider_api_key(api_key, api_key_env, ANTHROPIC_URL if paired else base_url,
                              host=ANTHROPIC_HOST, env_names=(KEY_ENV,))
    if secret is not None:
        return secret
    if api_key is not None or api_key_env is not None:
        source = f"the environment variable {api_key_env}" if api_key_env else "api_key="
        raise ConfigurationError("api_key", None, f"no key: {source} is empty or not set")
    raise ConfigurationError(
        "api_key", None,
        f"no key for base_url={redact_url(base_url)!r}: {KEY_ENV} is sent only to {ANTHROPIC_URL} (or to "
        "the ANTHROPIC_BASE_URL set beside it); pass api_key=, or api_key_env= naming the environment "
        "variable that holds this endpoint's key",
    )


@final
class AnthropicStrategy(SdkStrategy):
    """Claude through Anthropic's Messages API (``anthropic.AsyncAnthropic``).

    Requests: an item's prompt or OpenAI-format messages (images as ``image_url`` parts,
    tools, tool calls and results), its params (``system``, ``max_output_tokens``, ``stop``,
    ``tools``, ``tool_choice``, a ``json_schema`` response format, ``extra_body``) become the
    Messages params; ``max_tokens`` is the item's or this strategy's ``max_output_tokens``,
    else 4096. What Anthropic cannot take (``temperature``, ``top_p``, ``seed``,
    ``logprobs``) is refused at input. ``response_model=`` (pydantic or a JSON schema) is
    sent as ``output_config.format`` and validated by the parse stage. ``cache_system_prompt``
    marks the strategy's system prompt for prompt caching; content parts carrying
    ``cache_control`` keep it.

    ``client`` may be a ready ``AsyncAnthropic`` (used through ``with_options(max_retries=0)``,
    never closed by us). Without one, ``base_url`` comes from the argument,
    ``ANTHROPIC_BASE_URL`` or the public API, and the key from ``api_key``, else the
    environment variable named by ``api_key_env``, else ``ANTHROPIC_API_KEY`` -- read only for
    Anthropic's own API (or the ``ANTHROPIC_BASE_URL`` set beside it). ``concurrency`` sizes
    and caps the connection pool; ``timeout`` bounds each HTTP phase; ``headers`` go with
    every request.
    """

    _label = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        client: object = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        base_url: str | None = None,
        system_prompt: str | None = None,
        params: Mapping[str, Any] | None = None,
        response_model: type | Mapping[str, Any] | None = None,
        max_output_tokens: int | None = None,
        cache_system_prompt: bool = False,
        concurrency: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = _DEFAULT_TIMEOUT,
    ) -> None:
        anthropic = import_extra("anthropic", "AnthropicStrategy needs the anthropic SDK: "
                                              "pip install 'trio-batch-llm[anthropic]'")
        self._anthropic = anthropic
        if not isinstance(cache_system_prompt, bool):
            raise ConfigurationError("cache_system_prompt", cache_system_prompt, "must be True or False")
        self._sdk_client_class = anthropic.AsyncAnthropic
        if client is not None:
            base_url, secret, client = self._adopt_client(client, "anthropic.AsyncAnthropic",
                                                          base_url=base_url, api_key=api_key,
                                                          api_key_env=api_key_env)
        else:
            if base_url is not None and (not isinstance(base_url, str)
                                         or not base_url.startswith(("http://", "https://"))):
                raise ConfigurationError("base_url", redact_url(str(base_url)), "must be an http(s) URL")
            env_base_url = os.environ.get("ANTHROPIC_BASE_URL") or None
            base_url = base_url or env_base_url or ANTHROPIC_URL
            secret = _api_key(api_key, api_key_env, base_url, paired=base_url == env_base_url)
        super().__init__(model, base_url=base_url, api="chat", concurrency=concurrency,
                         extra_body=extra_body, system_prompt=system_prompt, temperature=None,
                         max_output_tokens=max_output_tokens, headers=headers, timeout=timeout,
                         params=params, response_model=response_model)
        for key in sorted(self.params.keys() & REFUSED_PARAMS.keys()):
            raise ConfigurationError("params", params, f"{key!r}: {REFUSED_PARAMS[key]}")
        self.cache_system_prompt = cache_system_prompt
        self._user_client = client
        self._secret = secret

    def request_problem(self, request: LLMRequest) -> str | None:
        """Refuses, at input, what the Messages API cannot take (sampling params, seed, logprobs,
        content parts it has no block for, a JSON mode without a schema)."""
        return request_problem(request, self.params, self._response)

    def request_body(self, prompt: str | LLMRequest, *, include_extra: bool = True) -> dict[str, Any]:
        """The Messages params for ``prompt``: the keyword arguments of ``messages.create`` (JSON-able),
        with the ``extra_body`` fields merged in last unless ``include_extra`` is false (the SDK call
        sends them itself). What a Message Batch request's ``params`` holds."""
        request = prompt if isinstance(prompt, LLMRequest) else LLMRequest(prompt)
        shared_extra = {**self.extra_body, **(self.params.get("extra_body") or {})}
        body, extra = build_params(
            self.model, request, params={**self.params, "extra_body": shared_extra},
            system_prompt=self.system_prompt, cache_system_prompt=self.cache_system_prompt,
            max_output_tokens=self.max_output_tokens, response=self._response,
        )
        return {**body, **extra} if include_extra else body

    def batch_request_body(self, prompt: str | LLMRequest) -> dict[str, Any]:
        return self.request_body(prompt)

    def batch_endpoint(self) -> BatchEndpoint:
        """Anthropic's Message Batches at this strategy's ``base_url``, with its key and settings."""
        module = importlib.import_module(f"{__package__}._batch_api")  # imported only when asked for
        endpoint: BatchEndpoint = module.AnthropicBatchEndpoint(self)
        return endpoint

    def lease_identity(self) -> object:
        user_client = self._identity_client if self._identity_client is not None else self._user_client
        return (type(self), self.model, self.base_url, self._fingerprint(), user_client)

    def quota_scope(self) -> object:
        """Every model behind one endpoint and key shares concurrency, rate limits and cooldowns."""
        return ("anthropic-endpoint", redact_url(self.base_url), self._fingerprint())

    async def execute_request(
        self, request: LLMRequest, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        client = self._client_for_call()
        body = self.request_body(request, include_extra=False)
        options = self._call_options(request, timeout)
        try:  # the raw response, for its request id and rate-limit headers (what admission learns from)
            raw = await client.messages.with_raw_response.create(**body, **options)
        except Exception as exc:  # re-raised as itself (CONTRACT C7.2), scrubbed and annotated
            self._leaving(exc)
            verdict = sdk_verdict(exc)
            if verdict is not None and verdict[2] is not None:
                exc.stops_batch = verdict[2]  # type: ignore[attr-defined]
            raise
        text, usage, metadata = read_message(await raw.parse())  # SDK 2.x: an AsyncAPIResponse
        request_id = raw.headers.get("request-id")
        if request_id:
            metadata["request_id"] = request_id
        reported = rate_limit_headers(raw.headers)
        if reported:
            metadata[RATE_LIMIT_METADATA_KEY] = reported
        return text, usage, metadata

    def classify_error(self, exception: Exception) -> tuple[ErrorCategory, float | None] | None:
        """File an SDK status error by the dialect's table; ``None`` leaves the rest to the default rules."""
        verdict = sdk_verdict(exception) if isinstance(exception, self._anthropic.APIStatusError) else None
        return None if verdict is None else (verdict[0], verdict[1])

    def __repr__(self) -> str:
        return f"AnthropicStrategy(model={self.model!r}, base_url={redact_url(self.base_url)!r})"
