"""Call any OpenAI-compatible endpoint (chat completions or responses) over httpx2 directly.

No SDK: the request body, the response parsing and the error table live in
``_wire``; the HTTP client lives in ``_http`` (imported when a strategy is
constructed, never by ``import trio_batch_llm``).

Shared clients. Strategies with equal :meth:`lease_identity` share one client
per event loop: :meth:`prepare` opens it into the per-loop registry
(:mod:`.._clients`) unless it is already there, :meth:`execute` looks it
up, :meth:`cleanup` closes it and drops it (idempotently). The engine's lease
registry runs ``prepare`` once per identity and ``cleanup`` at the last
release, which is exactly the lifetime the client needs. A client passed in
by the user is used as is and never closed by us.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, final

import anyio.lowlevel

from ..._admission import RATE_LIMIT_METADATA_KEY, rate_limit_headers
from ..._values._categories import ErrorCategory
from ..._values._errors import ConfigurationError, ProviderError
from ..._values._prompts import LLMRequest, check_params
from ..._values._results import RetryState, TokenUsage
from ..._values._structured import ResponseModel
from ..._values._urls import join_url, normalize_base_url, redact_url, redact_urls
from ..._version import __version__
from .._base import wire_key_material
from .._batch import BatchEndpoint
from .._clients import client_registry, close_lease
from .._keys import Secret, endpoint_api_key
from .._structured import StructuredOutputStrategy
from ._batch_api import OpenAIBatchEndpoint
from ._wire import (
    API_PATHS,
    RESPONSES_REFUSED,
    Api,
    build_request_body,
    check_api,
    decode_json,
    parse_response_body,
)
from ._wire_errors import decode_error_body, error_from_status, error_in_body, schema_rejected

__all__ = ["OpenAICompatibleStrategy"]

_DEFAULT_TIMEOUT = 600.0  # mirrors _http.DEFAULT_TIMEOUT without importing httpx2

OPENAI_KEY_RULE = "OPENAI_API_KEY goes only to https://api.openai.com unasked"


def no_key_error(error: ProviderError, base_url: str, api_key_env: str | None,
                 key_rule: str = OPENAI_KEY_RULE) -> ProviderError:
    """A 401 to a request that carried no key: say so, and how to pass one."""
    if api_key_env is not None:
        why = f"the environment variable {api_key_env} (api_key_env=) is not set"
    else:
        why = key_rule
    return ProviderError(
        f"{error} -- no API key was sent to {redact_url(base_url)} ({why}): pass api_key=, or api_key_env= "
        "naming the environment variable that holds this endpoint's key (command line: --api-key-env NAME)",
        category=ErrorCategory.AUTHENTICATION, retry_after=error.retry_after, status_code=error.status_code,
    )


class _EndpointStrategy(StructuredOutputStrategy):
    """What both OpenAI strategies share: key handling, identities, the per-loop client registry (and,
    from :class:`StructuredOutputStrategy`, the structured-output stage)."""

    _user_client: Any
    _identity_client: Any = None  # the client object the user passed (the SDK strategy wraps a copy)
    _secret: Secret | None
    _label: ClassVar[str]
    _concurrency_hint: int | None = None

    def __init__(self, model: str, *, base_url: str, api: str, concurrency: int | None,
                 extra_body: Mapping[str, Any] | None, system_prompt: str | None,
                 temperature: float | None, max_output_tokens: int | None,
                 headers: Mapping[str, str] | None, timeout: float | None,
                 params: Mapping[str, Any] | None = None,
                 response_model: type | Mapping[str, Any] | None = None) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigurationError("model", model, "must be a non-empty string")
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ConfigurationError("concurrency", concurrency, "must be a positive integer or None")
        if max_output_tokens is not None and max_output_tokens < 1:
            raise ConfigurationError("max_output_tokens", max_output_tokens, "must be positive or None")
        if timeout is not None and not timeout > 0:
            raise ConfigurationError("timeout", timeout, "must be positive or None")
        self.model = model
        self.base_url = normalize_base_url(base_url)
        self.api: Api = check_api(api)
        self.concurrency = concurrency
        self.extra_body = dict(extra_body or {})
        self.system_prompt = system_prompt
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens
        self.headers = dict(headers or {})
        self.timeout = timeout
        try:
            self.params = check_params(params, "params=")
        except (TypeError, ValueError) as exc:
            raise ConfigurationError("params", params, str(exc).removeprefix("params=: ")) from exc
        if self.api == "responses":
            for key in self.params.keys() & RESPONSES_REFUSED.keys():
                raise ConfigurationError("params", params, f"{key!r}: {RESPONSES_REFUSED[key]} "
                                         "(use api=\"chat\", or send it in extra_body)")
        self._response = ResponseModel(response_model) if response_model is not None else None
        self.response_model = self._response.model if self._response is not None else None

    @property
    def model_name(self) -> str:
        return self.model

    @property
    def provider_name(self) -> str:
        return self._label

    def request_problem(self, request: LLMRequest) -> str | None:
        """Refuses, at input, what this API cannot send (``seed``/``stop`` on the Responses API)."""
        if self.api == "responses":
            for key in sorted(request.params.keys() & RESPONSES_REFUSED.keys()):
                return (f"params[{key!r}]: {RESPONSES_REFUSED[key]}; use api=\"chat\", or put it in "
                        f"params['extra_body'] if your endpoint takes it")
        return None

    def configure_concurrency(self, concurrency: int) -> None:
        """The engine's hint (calls that may run at once), given before an owner's first :meth:`prepare`.

        It sizes the connection pool of a client we open: that many connections
        are kept alive for reuse. Unlike an explicit ``concurrency=`` (which
        wins, and also caps connections) the hint caps nothing: a client is
        shared by every owner of this identity in the event loop, and the one
        that opened it must not throttle a later owner admitting more calls
        (the engine's admission already bounds each owner's calls). A client
        passed in by the user keeps its own pool.
        """
        if isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1:
            self._concurrency_hint = concurrency

    @property
    def connection_limit(self) -> int | None:
        """``concurrency=`` (it caps the pool we open), or the pool limit of the client passed in."""
        if self._user_client is None:
            return self.concurrency
        from . import _http

        return _http.pool_limit(self._user_client)

    @property
    def pool_size(self) -> int | None:
        """Connections a client we open keeps alive: ``concurrency=``, else the engine's hint."""
        return self.concurrency if self.concurrency is not None else self._concurrency_hint

    _max_tokens_field: ClassVar[str] = "max_tokens"

    def request_body(self, prompt: str | LLMRequest, *, include_extra: bool = True) -> dict[str, Any]:
        """The JSON body of one request for ``prompt`` (a text prompt, or an item's request)."""
        return build_request_body(
            self.api, self.model, prompt, system_prompt=self.system_prompt,
            temperature=self.temperature, max_output_tokens=self.max_output_tokens,
            max_tokens_field=self._max_tokens_field, extra_body=self.extra_body, params=self.params,
            response=self._response, include_extra=include_extra)

    def batch_request_body(self, prompt: str | LLMRequest) -> dict[str, Any]:
        """The ``body`` of ``prompt``'s Batch API request line: what :meth:`execute_request` would send."""
        return self.request_body(prompt)

    def cache_key_material(self, request: LLMRequest) -> dict[str, Any] | None:  # all execute_request sends
        return wire_key_material(self._label, self.model, self.base_url, self.batch_request_body(request))

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        """One call for a text prompt (what :meth:`execute_request` does for an item's request)."""
        return await self.execute_request(LLMRequest(prompt), attempt, timeout, state)

    def batch_endpoint(self) -> BatchEndpoint:
        """OpenAI's Files and Batch APIs at this strategy's ``base_url``, with its key and settings."""
        return OpenAIBatchEndpoint(self)

    def request_headers(self) -> dict[str, str]:
        """The headers every request to the endpoint carries: the key as a bearer token, then ``headers=``."""
        headers = {"accept": "application/json", "user-agent": f"trio-batch-llm/{__version__}"}
        if self._secret is not None:
            headers["authorization"] = f"Bearer {self._secret.reveal()}"
        headers.update({name.lower(): value for name, value in self.headers.items()})
        return headers

    @property
    def secret(self) -> Secret | None:
        """The API key, wrapped so that it never prints (``None`` without a key)."""
        return self._secret

    def http_client(self) -> object | None:
        """The ``httpx2.AsyncClient`` passed as ``client=``, if any (used as is, never closed by us)."""
        return self._user_client if self._label == "openai-compatible" else None

    def _fingerprint(self) -> str | None:
        return self._secret.fingerprint() if self._secret is not None else None

    def lease_identity(self) -> object:
        user_client = self._identity_client if self._identity_client is not None else self._user_client
        return (type(self), self.model, self.base_url, self.api, self._fingerprint(), user_client)

    def quota_scope(self) -> object:
        """Provider-wide: every model behind one endpoint and key shares concurrency, RPM/TPM and cooldowns.

        Sharing is the safe side: a 429 from an endpoint whose limits are really
        per model costs some throughput, while separate scopes on a shared limit
        cause 429 storms. Override this method for per-model scopes.
        """
        return ("openai-endpoint", redact_url(self.base_url), self._fingerprint())

    def _open_client(self) -> Any:
        raise NotImplementedError

    async def _close_client(self, client: Any) -> None:
        raise NotImplementedError

    async def prepare(self) -> None:
        await anyio.lowlevel.checkpoint()
        if self._user_client is not None:
            return
        clients = client_registry()
        identity = self.lease_identity()
        if identity not in clients:
            clients[identity] = self._open_client()

    async def cleanup(self) -> None:
        if self._user_client is not None:
            await anyio.lowlevel.checkpoint()
            return
        await close_lease(self.lease_identity(), self._close_client)

    def _client_for_call(self) -> Any:
        if self._user_client is not None:
            return self._user_client
        client = client_registry().get(self.lease_identity())
        if client is None:
            raise RuntimeError(f"{type(self).__name__}.prepare() must run before execute()")
        return client

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(model={self.model!r}, base_url={redact_url(self.base_url)!r}, "
                f"api={self.api!r})")


@final
class OpenAICompatibleStrategy(_EndpointStrategy):
    """Speak the OpenAI wire format to ``base_url`` (for example ``http://localhost:8000/v1``).

    ``api="chat"`` posts to ``/chat/completions`` (sending ``max_output_tokens``
    as ``max_tokens``, which compatible servers understand most widely);
    ``api="responses"`` posts to ``/responses`` (either path goes before the
    base URL's query, if it has one). ``extra_body`` keys are merged into every
    request body last.

    The key, sent as a bearer token, is ``api_key``, else the environment
    variable named by ``api_key_env``, for any ``base_url``. Given neither,
    ``OPENAI_API_KEY`` is read only when ``base_url`` is OpenAI's own API
    (``https://api.openai.com``): a key in your shell is never handed to
    another endpoint unasked. Without a key no ``Authorization`` header is
    sent, and a 401 answer says how to pass one. ``concurrency`` sizes the
    connection pool and caps it (by default the engine's concurrency sizes
    it, through :meth:`configure_concurrency`). ``timeout`` bounds each HTTP phase; the engine's cancel
    scopes bound whole attempts. ``client`` may be your own ``httpx2.AsyncClient``
    (its pool and timeouts apply; we never close it). ``execute`` returns
    ``(text, usage, metadata)``.
    """

    _label = "openai-compatible"

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        api_key: str | None = None,
        api: str = "chat",
        client: object = None,
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
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            shown = redact_urls(base_url) if isinstance(base_url, str) else base_url
            raise ConfigurationError("base_url", shown, "must be an http:// or https:// URL")
        super().__init__(model, base_url=base_url, api=api, concurrency=concurrency,
                         extra_body=extra_body, system_prompt=system_prompt, temperature=temperature,
                         max_output_tokens=max_output_tokens, headers=headers, timeout=timeout,
                         params=params, response_model=response_model)
        from . import _http  # here, not at module level: `import trio_batch_llm` stays httpx2-free

        self._http = _http
        if client is not None and not _http.is_async_client(client):
            raise ConfigurationError("client", type(client).__name__, "must be an httpx2.AsyncClient")
        self._user_client = client
        self._secret = endpoint_api_key(api_key, api_key_env, self.base_url)
        self._api_key_env = api_key_env
        self._key_rule = OPENAI_KEY_RULE
        self._url = join_url(self.base_url, API_PATHS[self.api])

    def use_provider_key(self, secret: Secret | None, api_key_env: str | None, key_rule: str) -> None:
        """Another provider's key rule (OpenRouter's): its resolved key, and what a 401 without one says.

        Called by a provider's factory right after construction, before any call.
        """
        self._secret = secret
        self._api_key_env = api_key_env
        self._key_rule = key_rule

    def _open_client(self) -> Any:
        return self._http.create_client(
            concurrency=self.concurrency, keepalive=self._concurrency_hint, timeout=self.timeout
        )

    async def _close_client(self, client: Any) -> None:
        await client.aclose()

    async def execute_request(
        self, request: LLMRequest, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        client = self._client_for_call()
        reply = await self._http.post_json(
            client, self._url, self.request_body(request), headers=self.request_headers(),
            timeout=timeout, secret=self._secret,
        )
        if not 200 <= reply.status_code < 300:
            body = decode_error_body(reply.content)
            error = error_from_status(reply.status_code, reply.headers, body, secret=self._secret)
            if reply.status_code == 401 and self._secret is None:
                raise no_key_error(error, self.base_url, self._api_key_env, self._key_rule)
            if self._response is not None and schema_rejected(error):
                raise ProviderError(
                    f"the provider rejected the response schema {self._response.name!r} (not retried: "
                    f"a schema it refuses stays refused; simplify the schema or use another model): {error}",
                    category=ErrorCategory.INVALID_REQUEST, status_code=error.status_code,
                ) from error
            raise error
        payload = decode_json(reply.content)
        in_body = error_in_body(payload, reply.headers, secret=self._secret)
        if in_body is not None:  # never a success; its headers (Retry-After, limits) still count
            raise in_body
        text, usage, metadata = parse_response_body(self.api, payload)
        metadata["api"] = self.api
        metadata["status_code"] = reply.status_code
        reported = rate_limit_headers(reply.headers)
        if reported:  # what the quota scope paces by (RateLimitConfig.learn_limits)
            metadata[RATE_LIMIT_METADATA_KEY] = reported
        return text, usage, metadata
