"""What the strategies over a provider's official SDK share: its client, its call options, its errors.

:class:`OpenAIStrategy` (``openai``) and :class:`AnthropicStrategy` (``anthropic``)
differ in their dialect (the request they build, the answer they read, the error
table they file by) and in nothing else: a ready SDK client passed as ``client=``
is adopted the same way (used through ``with_options(max_retries=0)``, never closed
by us, its base URL and key decide the endpoint), a client we open is built with
the SDK's retries off (retries belong to the engine) over our httpx2 pool when
the pool is sized, the ``extra_body``/headers/timeout of a call become the SDK's
per-request options, and an SDK exception leaves as itself (CONTRACT C7.2),
scrubbed of the key and carrying its answer's rate-limit headers.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from .._admission import RATE_LIMIT_METADATA_KEY, rate_limit_headers
from .._values._errors import ConfigurationError
from .._values._prompts import LLMRequest
from ._keys import Secret
from .openai._compatible import _EndpointStrategy

__all__ = ["SdkStrategy", "import_extra", "report_rate_limits", "scrub_key"]


def import_extra(module: str, needs: str) -> ModuleType:
    """``module``, imported when a strategy is constructed (never by ``import trio_batch_llm``); without
    it, an ImportError saying what ``needs`` it and which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(needs) from exc


class SdkStrategy(_EndpointStrategy):
    """An :class:`_EndpointStrategy` whose calls go through a provider's SDK client class."""

    _sdk_client_class: Any  # the SDK's async client class (the SDK is imported only when constructed)

    def _adopt_client(self, client: object, sdk_name: str, *, base_url: str | None, api_key: str | None,
                      api_key_env: str | None) -> tuple[str, Secret | None, object]:
        """``(base_url, key, client for calls)`` of a ready SDK client passed as ``client=``.

        The client decides the endpoint and the key, so passing either beside it is refused;
        calls go through a copy with the SDK's retries off, and the lease identity is the
        object the user passed (two strategies over one client share it)."""
        if not isinstance(client, self._sdk_client_class):
            raise ConfigurationError("client", type(client).__name__, f"must be an {sdk_name}")
        if base_url is not None or api_key is not None or api_key_env is not None:
            conflict = "base_url" if base_url is not None else "api_key" if api_key is not None \
                else "api_key_env"
            raise ConfigurationError(conflict, "<given>", "client= already decides it; pass one")
        key = getattr(client, "api_key", None)
        self._identity_client = client
        adopted: Any = client
        return (str(adopted.base_url), Secret(key) if isinstance(key, str) and key else None,
                adopted.with_options(max_retries=0))

    def _open_client(self) -> Any:
        from .openai import _http

        assert self._secret is not None  # checked in __init__ for SDK clients we build
        http_client = None
        if self.pool_size is not None:
            http_client = _http.create_client(
                concurrency=self.concurrency, keepalive=self._concurrency_hint, timeout=self.timeout
            )
        return self._sdk_client_class(
            api_key=self._secret.reveal(), base_url=self.base_url, max_retries=0,
            timeout=self.timeout, http_client=http_client,
        )

    async def _close_client(self, client: Any) -> None:
        await client.close()  # closes the httpx2 client too, ours or the SDK's own

    def _call_options(self, request: LLMRequest, timeout: float | None) -> dict[str, Any]:
        """The SDK's per-request options for one call: the ``extra_body`` of the strategy, its params and
        the item (merged in that order; the SDK merges them into the body last), headers, timeout."""
        options: dict[str, Any] = {}
        extra = {**self.extra_body, **(self.params.get("extra_body") or {}),
                 **(request.params.get("extra_body") or {})}
        if extra:
            options["extra_body"] = extra
        if self.headers:
            options["extra_headers"] = self.headers
        if timeout is not None:
            options["timeout"] = timeout
        return options

    def _leaving(self, exc: BaseException) -> None:
        """An SDK exception on its way out, re-raised as itself: scrubbed, with its rate-limit headers."""
        scrub_key(exc, self._secret)
        report_rate_limits(exc)


def report_rate_limits(exc: BaseException) -> None:
    """Give an SDK status error the ``metadata["rate_limit"]`` a :class:`ProviderError` carries.

    The SDK's exception is raised as itself, so the rate-limit headers of its response are
    attached to it, as the one attribute the engine reads them from; nothing else changes.
    """
    response = getattr(exc, "response", None)
    if response is None or hasattr(exc, "metadata"):
        return
    reported = rate_limit_headers(getattr(response, "headers", None))
    if reported:
        exc.metadata = {RATE_LIMIT_METADATA_KEY: reported}  # type: ignore[attr-defined]


def scrub_key(exc: BaseException, secret: Secret | None) -> None:
    """Remove the API key from an SDK exception's message in place; its type and identity stay."""
    if secret is None or secret.redact(text := str(exc)) == text:
        return
    exc.args = tuple(secret.redact(arg) if isinstance(arg, str) else arg for arg in exc.args)
    message = getattr(exc, "message", None)
    if isinstance(message, str):
        exc.message = secret.redact(message)  # type: ignore[attr-defined]
