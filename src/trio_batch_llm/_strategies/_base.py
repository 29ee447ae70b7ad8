"""The strategy protocol: how one item's prompt becomes one provider call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import anyio.lowlevel

from .._values._categories import ErrorCategory
from .._values._config import ArtifactIdentity
from .._values._models import is_pydantic_model_class
from .._values._prompts import LLMRequest
from .._values._results import RetryState, TokenUsage
from ._batch import BatchEndpoint

__all__ = ["LLMCallStrategy", "wire_key_material"]

TOutput = TypeVar("TOutput", covariant=True)
"""Covariant: a strategy of ``str`` outputs is a strategy of ``object`` outputs."""


class LLMCallStrategy(Generic[TOutput]):
    """Subclass and override :meth:`execute` (text prompts) or :meth:`execute_request` (any request).

    The engine calls :meth:`prepare` once per owner before the first call,
    :meth:`execute_request` once per attempt inside the attempt's cancel scope
    (by default it calls :meth:`execute` with the prompt's text), then
    :meth:`parse_output` on what it returned, and :meth:`cleanup` once when the
    last owner holding the strategy closes. ``cleanup`` must be idempotent: a
    forced or failed close may run it again.

    Requests: a strategy that takes chat messages or per-item ``params``
    overrides :meth:`execute_request` and :meth:`request_problem`; one that only
    overrides :meth:`execute` gets text prompts without params, and an item
    with messages or params is refused before any call (:meth:`request_problem`).
    """

    async def execute_request(
        self, request: LLMRequest, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[TOutput, TokenUsage | None, Any]:
        """Make one call for ``request``; by default :meth:`execute` with its text prompt."""
        return await self.execute(request.text, attempt, timeout, state)

    def request_problem(self, request: LLMRequest) -> str | None:
        """Why this strategy cannot send ``request`` (checked at input, before any call), or ``None``.

        The default takes text prompts without params, unless :meth:`execute_request`
        is overridden (then everything: a subclass that takes requests checks them itself).
        """
        if type(self).execute_request is not LLMCallStrategy.execute_request or request.is_plain:
            return None
        what = "chat messages" if not isinstance(request.prompt, str) else \
            f"params ({', '.join(sorted(request.params))})"
        return (f"{type(self).__name__} takes text prompts only (it implements execute(prompt: str, ...)), "
                f"and this item carries {what}: override execute_request(request, ...) to take them")

    def parse_output(self, raw: object, metadata: dict[str, Any]) -> TOutput:
        """The engine's parse stage: a call's raw output -> the item's output (identity by default).

        Raise :class:`ProviderError` with ``category=PARSE`` (e.g. ``StructuredOutputError``)
        when ``raw`` cannot become an output: the attempt failed, and is retried without
        backoff while the attempt budget lasts. ``metadata`` is the call's (may be updated).
        """
        return raw  # type: ignore[return-value]  # identity: what execute returned is a TOutput

    def decode_output(self, stored: object) -> TOutput:
        """A stored output (plain JSON) back to what :meth:`parse_output` made.

        A resume replays a stored output through it. By default a strategy whose
        :attr:`response_model` is a pydantic model class gives that model back
        (a store keeps its ``model_dump(mode="json")``); anything else is returned as stored.
        """
        model: Any = self.response_model
        if isinstance(stored, dict) and is_pydantic_model_class(model):
            return model.model_validate(stored)  # type: ignore[no-any-return]
        return stored  # type: ignore[return-value]  # as stored: a plain output is a TOutput

    async def prepare(self) -> None:
        """Open what calls need (clients, sessions). Runs once per lease."""
        await anyio.lowlevel.checkpoint()

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[TOutput, TokenUsage | None, Any]:
        """Make one call; return ``(output, token_usage, metadata)``.

        ``timeout`` is informational (for SDK timeouts): the engine enforces
        the attempt's time with a cancel scope. Raise :class:`ProviderError`
        to say how a failure should be treated.
        """
        raise NotImplementedError

    async def on_error(self, exception: Exception, attempt: int, state: RetryState | None) -> None:
        """Called before each retry, e.g. to escalate the model or repair the prompt."""
        await anyio.lowlevel.checkpoint()

    async def cleanup(self) -> None:
        """Close what :meth:`prepare` opened. Must be idempotent."""
        await anyio.lowlevel.checkpoint()

    def configure_concurrency(self, concurrency: int) -> None:
        """A hint, given before the first :meth:`prepare` of an owner: calls that may run at once.

        Strategies holding connection pools size them from it. The default ignores it.
        """

    @property
    def connection_limit(self) -> int | None:
        """The most connections this strategy's HTTP pool opens at once, when it caps them (a pool
        sized by :meth:`configure_concurrency` does not); ``None``: no cap, or unknown (the default).

        A cap below the owner's concurrency is warned about once: calls past it would wait for a
        connection inside their attempt."""
        return None

    def quota_scope(self) -> object:
        """Strategies returning equal scopes share concurrency, RPM/TPM quotas and cooldowns."""
        return self

    def lease_identity(self) -> object:
        """Strategies with the same identity share one preparation per event loop."""
        return self

    def classify_error(self, exception: Exception) -> tuple[ErrorCategory, float | None] | None:
        """Classify ``exception`` as ``(category, retry_after)``; ``None`` defers to the default."""
        return None

    def cache_key_material(self, request: LLMRequest) -> dict[str, Any] | None:
        """What decides this request's answer, as JSON-able data: the response cache's key is made of it
        (with the item's ``sample``). ``None``: this strategy's answers cannot be cached.

        The default takes :attr:`provider_name`, :attr:`model_name`, :attr:`system_prompt`,
        :attr:`params`, :attr:`response_schema` and the request (prompt or messages, params); a
        strategy that declares no :attr:`model_name` returns ``None``, since nothing would tell two
        such strategies' answers apart. Strategies that build a wire request override it with that.
        """
        model = self.model_name
        if model is None:
            return None
        return {
            "provider": self.provider_name,
            "model": model,
            "system_prompt": self.system_prompt,
            "params": dict(self.params or {}),
            "response_schema": self.response_schema,
            "prompt": request.prompt if isinstance(request.prompt, str) else list(request.prompt),
            "request_params": dict(request.params),
        }

    @property
    def model_name(self) -> str | None:
        """The model this strategy calls, when it has one (for artifacts and summaries).

        A strategy used with a checkpoint store must declare it (or :attr:`artifact_identity`),
        or the store be given ``identity=``: a resume never guesses which model wrote a result.
        """
        return None

    @property
    def artifact_identity(self) -> ArtifactIdentity | None:
        """The checkpoint identity this strategy declares whole, or ``None`` (the default).

        ``None`` lets :func:`infer_artifact_identity` build it from :attr:`provider_name`,
        :attr:`model_name`, :attr:`system_prompt`, :attr:`params` and :attr:`response_model`.
        A declared identity's provider and model are used as given; its ``prompt_version``
        and ``parser_version``, when ``None``, are filled from those settings.
        """
        return None

    # What a request is made of, as far as the strategy decides it (artifact identities and
    # cost read these). Settable, so a subclass that assigns ``self.system_prompt = ...`` in
    # its ``__init__`` (as strategies did before these existed) keeps working.

    @property
    def provider_name(self) -> str | None:
        """The provider this strategy calls (``"openai"``, ``"openai-compatible"``), or ``None``."""
        return None

    @property
    def system_prompt(self) -> str | None:
        """The system prompt every request carries unless an item's ``params["system"]`` replaces it."""
        return self.__dict__.get("_tbl_system_prompt")

    @system_prompt.setter
    def system_prompt(self, value: str | None) -> None:
        self.__dict__["_tbl_system_prompt"] = value

    @property
    def params(self) -> Mapping[str, Any]:
        """The strategy's default request parameters; an item's ``params`` override them key by key."""
        return self.__dict__.get("_tbl_params") or {}

    @params.setter
    def params(self, value: Mapping[str, Any] | None) -> None:
        self.__dict__["_tbl_params"] = dict(value or {})

    @property
    def response_model(self) -> type | dict[str, Any] | None:
        """The structured output asked for: a pydantic model class, a JSON-schema dict, or ``None``."""
        return self.__dict__.get("_tbl_response_model")

    @response_model.setter
    def response_model(self, value: type | dict[str, Any] | None) -> None:
        self.__dict__["_tbl_response_model"] = value

    @property
    def response_schema(self) -> dict[str, Any] | None:
        """The JSON schema sent to the provider, derived from :attr:`response_model`; ``None`` without one."""
        return None

    def batch_endpoint(self) -> BatchEndpoint | None:
        """The provider's Batch API for this strategy's calls, if it offers one; ``None`` by default.

        ``open_run(..., mode="provider-batch")`` needs it: the run sends its
        items through it instead of :meth:`execute`.
        """
        return None


def wire_key_material(provider: str, model: str, base_url: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """A provider strategy's :meth:`~LLMCallStrategy.cache_key_material`: the wire body it sends, with the
    provider, model and endpoint host (not its port, path or query, and never a key or header)."""
    return {"provider": provider, "model": model, "host": (urlsplit(base_url).hostname or "").lower(),
            "body": dict(body)}
