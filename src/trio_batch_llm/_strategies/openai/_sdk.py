"""Call OpenAI through the official ``openai`` SDK (which runs on httpx2).

The SDK is imported when a strategy is constructed, never by ``import
trio_batch_llm``. Clients are built with ``max_retries=0`` (retries belong to
the engine) and shared per event loop by lease identity, like
:class:`OpenAICompatibleStrategy`.

SDK failures are not wrapped (CONTRACT C7.2): ``openai.RateLimitError`` and
friends reach the engine, and ``WorkItemResult.exception``, as themselves.
:meth:`OpenAIStrategy.classify_error` files status errors with the same table
the direct client uses (``_wire_errors.status_category``), so both strategies give a
response the same category; everything else (timeouts, connection errors, a
body that is not JSON) is left to the default classifier. The one thing done
to an SDK exception on its way out is scrubbing the API key from its message,
in place, in case a server echoed it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, final

from ..._admission import RATE_LIMIT_METADATA_KEY, rate_limit_headers
from ..._values._categories import ErrorCategory
from ..._values._errors import ConfigurationError
from ..._values._prompts import LLMRequest
from ..._values._results import RetryState, TokenUsage
from ..._values._retry_after import retry_after_from_headers
from ..._values._urls import is_openai_api, redact_url
from .._keys import Secret, endpoint_api_key
from .._sdk_strategy import SdkStrategy, import_extra
from ._compatible import _DEFAULT_TIMEOUT
from ._wire import parse_response_body
from ._wire_errors import status_batch_stop, status_category

__all__ = ["OpenAIStrategy"]

_OPENAI_URL = "https://api.openai.com/v1"


def _sdk_api_key(api_key: str | None, api_key_env: str | None, base_url: str, *, paired: bool) -> Secret:
    """The SDK needs a key; ``OPENAI_API_KEY`` goes only to OpenAI, or to the ``OPENAI_BASE_URL`` set
    beside it."""
    if api_key is not None or api_key_env is not None or paired or is_openai_api(base_url):
        secret = endpoint_api_key(api_key, api_key_env, _OPENAI_URL if paired else base_url)
        if secret is not None:
            return secret
        source = f"the environment variable {api_key_env}" if api_key_env else "OPENAI_API_KEY"
        raise ConfigurationError("api_key", None, f"no key: pass api_key=, api_key_env=, or set {source}")
    raise ConfigurationError(
        "api_key", None,
        f"base_url={redact_url(base_url)!r} is not OpenAI's API, and OPENAI_API_KEY is sent only to "
        "https://api.openai.com (or to the OPENAI_BASE_URL set beside it): pass api_key=, or api_key_env= "
        "naming the environment variable that holds this endpoint's key",
    )


@final
class OpenAIStrategy(SdkStrategy):
    """OpenAI (or an endpoint the SDK can talk to) via ``openai.AsyncOpenAI``.

    ``api="responses"`` (default) calls ``client.responses.create``; ``api="chat"``
    calls ``client.chat.completions.create`` (sending ``max_output_tokens`` as
    ``max_completion_tokens``). ``client`` may be a ready ``AsyncOpenAI``: it is
    used through ``with_options(max_retries=0)`` and never closed by us. Without
    one, ``base_url`` comes from the argument, ``OPENAI_BASE_URL`` or the public
    endpoint, and the key from ``api_key``, else the environment variable named
    by ``api_key_env``, else ``OPENAI_API_KEY`` -- which is read only for
    OpenAI's own API or for the ``OPENAI_BASE_URL`` set beside it (the SDK's
    pairing): another ``base_url=`` needs its key named explicitly.
    ``concurrency`` sizes and caps the SDK's httpx2 connection pool (by default
    the engine's concurrency sizes it, through :meth:`configure_concurrency`).
    Failures raise the SDK's own exceptions.
    """

    _label = "openai"

    def __init__(
        self,
        model: str = "gpt-4o-mini",
        *,
        client: object = None,
        api: str = "responses",
        base_url: str | None = None,
        api_key: str | None = None,
        concurrency: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        system_prompt: str | None = None,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = _DEFAULT_TIMEOUT,
        api_key_env: str | None = None,
        params: Mapping[str, Any] | None = None,
        response_model: type | Mapping[str, Any] | None = None,
    ) -> None:
        openai = import_extra("openai", "OpenAIStrategy needs the openai SDK: "
                                        "pip install 'trio-batch-llm[openai]'")
        self._openai = openai
        self._sdk_client_class = openai.AsyncOpenAI
        if client is not None:
            base_url, secret, client = self._adopt_client(client, "openai.AsyncOpenAI", base_url=base_url,
                                                          api_key=api_key, api_key_env=api_key_env)
        else:
            env_base_url = os.environ.get("OPENAI_BASE_URL") or None
            base_url = base_url or env_base_url or _OPENAI_URL
            secret = _sdk_api_key(api_key, api_key_env, base_url, paired=base_url == env_base_url)
        super().__init__(model, base_url=base_url, api=api, concurrency=concurrency,
                         extra_body=extra_body, system_prompt=system_prompt, temperature=temperature,
                         max_output_tokens=max_output_tokens, headers=headers, timeout=timeout,
                         params=params, response_model=response_model)
        self._user_client = client
        self._secret = secret

    _max_tokens_field = "max_completion_tokens"

    def request_body(self, prompt: str | LLMRequest, *, include_extra: bool = False) -> dict[str, Any]:
        """The keyword arguments :meth:`execute_request` passes to the SDK's ``create`` (minus extras,
        unless ``include_extra``: the SDK merges ``extra_body`` into the body last)."""
        return super().request_body(prompt, include_extra=include_extra)

    def batch_request_body(self, prompt: str | LLMRequest) -> dict[str, Any]:
        """What :meth:`execute_request` sends: the SDK merges ``extra_body`` last, so a line does too."""
        return self.request_body(prompt, include_extra=True)

    async def execute_request(
        self, request: LLMRequest, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        client = self._client_for_call()
        options = self._call_options(request, timeout)
        body = self.request_body(request)
        # The raw response, for its rate-limit headers (what the quota scope paces by).
        resource = client.chat.completions if self.api == "chat" else client.responses
        try:
            raw = await resource.with_raw_response.create(**body, **options)
        except Exception as exc:  # re-raised as itself (CONTRACT C7.2), only scrubbed of the key
            self._leaving(exc)
            if isinstance(exc, self._openai.APIStatusError):  # credits or quota spent: the batch stops
                stops = status_batch_stop(exc.status_code, exc.body)
                if stops is not None:
                    exc.stops_batch = stops  # read duck-typed by the engine
            raise
        text, usage, metadata = parse_response_body(self.api, raw.parse().to_dict(mode="json"))
        metadata["api"] = self.api
        reported = rate_limit_headers(raw.headers)
        if reported:
            metadata[RATE_LIMIT_METADATA_KEY] = reported
        return text, usage, metadata

    def classify_error(self, exception: Exception) -> tuple[ErrorCategory, float | None] | None:
        """File an SDK status error by the wire table; ``None`` leaves the rest to the default classifier."""
        if isinstance(exception, self._openai.APIStatusError):
            category = status_category(exception.status_code, exception.body)
            return category, retry_after_from_headers(exception.response.headers)
        return None

