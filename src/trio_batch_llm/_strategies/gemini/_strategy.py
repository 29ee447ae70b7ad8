"""``GeminiStrategy``: Gemini's ``generateContent`` over REST (our httpx2 layer), or a google-genai client.

Transport. google-genai's own async client cannot run on Trio (its per-loop HTTP client
calls ``asyncio.get_running_loop()``; credential refresh uses ``asyncio.Lock`` and
``asyncio.to_thread``; its retries ``asyncio.sleep``) and it refuses to start without a
key, so by default the REST JSON that :meth:`request_body` builds goes out through
``_strategies/openai/_http.py`` (the one module that imports httpx2), on both backends.
A ``google.genai.Client`` passed as ``client=`` is used as is (``aio.models``), which runs
on Trio only when its ``http_options`` carry an ``httpx2.AsyncClient``.

Shared clients and the context cache follow the OpenAI strategies: one session per lease
identity and event loop in :func:`.._clients.client_registry`, opened by :meth:`prepare`
(which also finds or creates the context cache) and closed by :meth:`cleanup` (which
deletes the cache first). Neither the SDK nor httpx2 is imported by ``import trio_batch_llm``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

import anyio.lowlevel

from ..._admission import RATE_LIMIT_METADATA_KEY, rate_limit_headers
from ..._values._categories import ErrorCategory
from ..._values._errors import ConfigurationError, ProviderError
from ..._values._prompts import LLMRequest, check_params
from ..._values._results import RetryState, TokenUsage
from ..._values._structured import ResponseModel
from ..._values._urls import normalize_base_url, redact_url, redact_urls
from .._base import wire_key_material
from .._batch import BatchEndpoint
from .._clients import client_registry, close_lease
from .._keys import Secret, provider_api_key
from .._structured import StructuredOutputStrategy
from ._cache import CacheHandle, GeminiContextCache, cache_body
from ._wire import build_request_body, read_response, request_problem

__all__ = ["GEMINI_HOST", "GeminiStrategy"]

GEMINI_HOST: Final = "generativelanguage.googleapis.com"
_DEFAULT_BASE_URL: Final = f"https://{GEMINI_HOST}"
_KEY_ENVS: Final = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
_DEFAULT_TIMEOUT: Final = 600.0
_CACHED_FIELDS: Final = ("systemInstruction", "tools", "toolConfig")


class _Session:
    """What one lease identity holds in one event loop: the HTTP client, and the cache if any."""

    def __init__(self, client: Any, owns_client: bool, cache: CacheHandle | None) -> None:
        self.client = client
        self.owns_client = owns_client
        self.cache = cache


async def _close_session(session: _Session) -> None:
    """Delete the session's cache, then close the client if we opened it."""
    if session.cache is not None:
        await session.cache.close(session.client)  # raises if it fails: a later cleanup retries
    if session.owns_client:
        await session.client.aclose()
    else:
        await anyio.lowlevel.checkpoint()


@final
class GeminiStrategy(StructuredOutputStrategy):
    """Call Gemini's ``models/{model}:generateContent`` (extra ``[gemini]``).

    The key goes in ``x-goog-api-key``: ``api_key``, else the variable ``api_key_env``,
    else ``GEMINI_API_KEY``/``GOOGLE_API_KEY`` only when ``base_url`` is Google's own
    API. ``base_url`` is the API root (the version, ``api_version``, is added).
    ``context_cache=`` (a :class:`GeminiContextCache`, or ``True`` for the defaults)
    caches the system prompt, the strategy's tools and leading messages for the
    whole batch. ``response_model=`` sends ``responseMimeType: application/json`` with the
    schema as ``responseJsonSchema`` and validates the answer. ``execute`` returns
    ``(text, usage, metadata)``.
    """

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
        context_cache: GeminiContextCache | bool | None = None,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        api_version: str = "v1beta",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = _DEFAULT_TIMEOUT,
        concurrency: int | None = None,
    ) -> None:
        if not isinstance(model, str) or not model or "/" in model.removeprefix("models/"):
            raise ConfigurationError("model", model, "must be a Gemini model name such as gemini-2.5-flash")
        self.model = model.removeprefix("models/")
        base = _DEFAULT_BASE_URL if base_url is None else base_url
        if not isinstance(base, str) or not base.startswith(("http://", "https://")):
            shown = redact_urls(base) if isinstance(base, str) else base
            raise ConfigurationError("base_url", shown, "must be an http:// or https:// URL")
        if not isinstance(api_version, str) or not api_version.isidentifier():
            raise ConfigurationError("api_version", api_version, 'must be a version such as "v1beta"')
        if max_output_tokens is not None and (not isinstance(max_output_tokens, int)
                                              or max_output_tokens < 1):
            raise ConfigurationError("max_output_tokens", max_output_tokens, "must be positive or None")
        if timeout is not None and not timeout > 0:
            raise ConfigurationError("timeout", timeout, "must be positive or None")
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ConfigurationError("concurrency", concurrency, "must be a positive integer or None")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ConfigurationError("system_prompt", type(system_prompt).__name__, "must be a str or None")
        self.base_url = normalize_base_url(base).removesuffix(f"/{api_version}")
        self.api_version = api_version
        self.system_prompt = system_prompt
        self.max_output_tokens = max_output_tokens
        self.timeout = timeout
        self.concurrency = concurrency
        self._concurrency_hint: int | None = None
        try:
            checked = check_params(params, "params=")
        except (TypeError, ValueError) as exc:
            raise ConfigurationError("params", params, str(exc).removeprefix("params=: ")) from exc
        if temperature is not None:
            checked.setdefault("temperature", temperature)
        self.params = checked  # the base class's property stores a copy: set it whole
        self._response = ResponseModel(response_model) if response_model is not None else None
        self.response_model = self._response.model if self._response is not None else None
        if context_cache is True:
            context_cache = GeminiContextCache()
        if context_cache is not None and not isinstance(context_cache, GeminiContextCache):
            raise ConfigurationError("context_cache", context_cache,
                                     "must be a GeminiContextCache, True or None")
        self.context_cache: GeminiContextCache | None = context_cache or None
        self._secret = provider_api_key(api_key, api_key_env, self.base_url, host=GEMINI_HOST,
                                        env_names=_KEY_ENVS)
        self._sdk_client: Any = None
        self._user_client: Any = None
        from ..openai import _http  # here, not at module level: `import trio_batch_llm` stays httpx2-free
        from ._rest import GeminiRest

        self._http = _http
        if client is not None:
            if _is_genai_client(client):
                if self.context_cache is not None:
                    raise ConfigurationError("context_cache", "<GeminiContextCache>",
                                             "needs the REST transport: pass api_key= (and base_url=) "
                                             "instead of a google.genai.Client")
                self._sdk_client = client
            elif _http.is_async_client(client):
                self._user_client = client
            else:
                raise ConfigurationError("client", type(client).__name__,
                                         "must be an httpx2.AsyncClient or a google.genai.Client")
        self._rest = GeminiRest(self.base_url, api_version, self._secret, dict(headers or {}))
        self._cache_body = self._cache_create_body() if self.context_cache is not None else None

    # -- what the engine asks --------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.model

    @property
    def provider_name(self) -> str:
        return "gemini"

    @property
    def secret(self) -> Secret | None:
        return self._secret

    def configure_concurrency(self, concurrency: int) -> None:
        """The engine's hint: how many connections a client we open keeps alive (caps nothing)."""
        if isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1:
            self._concurrency_hint = concurrency

    @property
    def connection_limit(self) -> int | None:
        """``concurrency=`` (it caps the pool we open), or the pool limit of an httpx2 client passed in."""
        if self._user_client is not None:
            return self._http.pool_limit(self._user_client)
        return self.concurrency if self._sdk_client is None else None

    def lease_identity(self) -> object:
        cache = self._cache_body["displayName"] if self._cache_body is not None else None
        return (type(self), self.model, self.base_url, self.api_version, self._fingerprint(),
                self._user_client, self._sdk_client, cache)

    def quota_scope(self) -> object:
        """Per model: Gemini's quotas are per project and model (``...PerProjectPerModel``)."""
        return ("gemini", redact_url(self.base_url), self._fingerprint(), self.model)

    def _fingerprint(self) -> str | None:
        return self._secret.fingerprint() if self._secret is not None else None

    def request_problem(self, request: LLMRequest) -> str | None:
        """What Gemini cannot take (see ``_wire.request_problem``); with a context cache, an item may not
        set what the cache holds (Gemini refuses systemInstruction/tools next to cachedContent)."""
        problem = request_problem(request)
        if problem is None and self.context_cache is not None:
            for key in ("system", "tools", "tool_choice"):
                if request.params.get(key) is not None:
                    return (f"params[{key!r}]: with context_cache= the system prompt and tools live in the "
                            "cache; Gemini refuses them next to it (set them on the strategy instead)")
            if not isinstance(request.prompt, str) and request.prompt and \
                    request.prompt[0].get("role") in ("system", "developer"):
                return "messages[0]: with context_cache= the system prompt lives in the cache"
        return problem

    def request_body(self, prompt: str | LLMRequest, *, cached_content: str | None = None) -> dict[str, Any]:
        """The REST ``GenerateContentRequest`` (camelCase JSON) for ``prompt``; with ``cached_content``
        (a cache's name) the cached fields are left out and it is named instead."""
        body = build_request_body(prompt, system_prompt=self.system_prompt, params=self.params,
                                  max_output_tokens=self.max_output_tokens, response=self._response,
                                  cached_content=cached_content)
        if cached_content is not None:
            for key in _CACHED_FIELDS:
                body.pop(key, None)
        return body

    def cache_key_material(self, request: LLMRequest) -> dict[str, Any] | None:
        """The response cache's key: the whole request (with what a context cache would hold, which
        asks the same), the model (in the URL, not the body), the provider and the endpoint's host."""
        return wire_key_material("gemini", self.model, self.base_url, self.request_body(request))

    def _cache_create_body(self) -> dict[str, Any]:
        option = self.context_cache
        assert option is not None
        shared = {k: v for k, v in self.params.items() if k in ("tools", "tool_choice")}
        lead = build_request_body(LLMRequest(list(option.contents) or "x"), system_prompt=self.system_prompt,
                                  params=shared)
        prefix: dict[str, Any] = {key: lead[key] for key in _CACHED_FIELDS if key in lead}
        if option.contents:
            prefix["contents"] = lead["contents"]
        if not prefix:
            raise ConfigurationError("context_cache", "<GeminiContextCache>",
                                     "has nothing to cache: set system_prompt=, params['tools'] or "
                                     "context_cache.contents")
        return cache_body(self.model, option, prefix)

    def batch_endpoint(self) -> BatchEndpoint:
        """Gemini's batch mode (``models/{model}:batchGenerateContent``) at this strategy's endpoint."""
        from ._batch_api import GeminiBatchEndpoint  # type: ignore[import-not-found,unused-ignore]

        return GeminiBatchEndpoint(self)

    # -- lifecycle -------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Open this identity's session (client, then cache) unless this loop has it already.

        A cache that cannot be created leaves nothing behind: the client we opened is closed."""
        await anyio.lowlevel.checkpoint()
        if self._sdk_client is not None:
            return
        clients = client_registry()
        identity = self.lease_identity()
        if identity in clients:
            return
        owns = self._user_client is None
        client = self._user_client if not owns else self._http.create_client(
            concurrency=self.concurrency, keepalive=self._concurrency_hint, timeout=self.timeout)
        cache = None
        if self._cache_body is not None and self.context_cache is not None:
            cache = CacheHandle(self._rest, self._cache_body, float(self.context_cache.ttl))
            try:
                await cache.open(client)
            except BaseException:
                if owns:  # bounded: closing idle sockets, and a failed prepare must not hang its caller
                    with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                        await client.aclose()
                raise
        clients[identity] = _Session(client, owns, cache)

    async def cleanup(self) -> None:
        """Delete the cache this lease created, then close the client we opened (idempotent)."""
        await close_lease(self.lease_identity(), _close_session)

    def _session(self) -> _Session:
        session = client_registry().get(self.lease_identity())
        if session is None:
            raise RuntimeError("GeminiStrategy.prepare() must run before execute()")
        return session  # type: ignore[no-any-return]

    @property
    def cache_name(self) -> str | None:
        """The context cache's resource name in this event loop (``cachedContents/...``), if any."""
        session = client_registry().get(self.lease_identity())
        cache = session.cache if session is not None else None
        return cache.name if cache is not None else None

    # -- calls -----------------------------------------------------------------------------

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        return await self.execute_request(LLMRequest(prompt), attempt, timeout, state)

    async def execute_request(
        self, request: LLMRequest, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        if self._sdk_client is not None:
            from ._sdk_call import sdk_generate

            return await sdk_generate(self._sdk_client, self.model, self.request_body(request))
        session = self._session()
        cached = None
        if session.cache is not None:
            cached = session.cache.fresh_name() or await session.cache.renewed_name(session.client)
        body = self.request_body(request, cached_content=cached)
        try:
            payload, headers, status = await self._rest.call(
                session.client, "POST", f"models/{self.model}:generateContent", body, timeout=timeout)
        except ProviderError as error:
            if cached is None or session.cache is None or not _cache_gone(error):
                raise
            session.cache.forget(cached)  # the retry creates a new cache first
            raise ProviderError(f"the context cache {cached} is gone ({error}); a new one is made for "
                                "the retry", category=ErrorCategory.TRANSIENT) from error  # not an auth error
        text, usage, metadata = read_response(payload)
        metadata["status_code"] = status
        if cached is not None:
            metadata["cached_content"] = cached
        reported = rate_limit_headers(headers)
        if reported:
            metadata[RATE_LIMIT_METADATA_KEY] = reported
        return text, usage, metadata

    def __repr__(self) -> str:
        return f"GeminiStrategy(model={self.model!r}, base_url={redact_url(self.base_url)!r})"


def _cache_gone(error: ProviderError) -> bool:
    """Gemini's answer to a request naming a cache that expired or was deleted (403 or 404)."""
    return error.status_code in (403, 404) and "cachedcontent" in str(error).lower().replace(" ", "")


def _is_genai_client(client: Any) -> bool:
    """A ``google.genai.Client`` (checked by name: the SDK is not imported to find out)."""
    return type(client).__module__.startswith("google.genai") and hasattr(client, "aio")

