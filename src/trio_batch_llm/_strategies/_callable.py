"""Wrap an existing async function as a strategy."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, final, overload

from .._values._config import ArtifactIdentity
from .._values._prompts import LLMRequest
from .._values._results import RetryState, TokenUsage
from ._base import LLMCallStrategy

__all__ = ["CallOutcome", "CallableStrategy"]

TOutput = TypeVar("TOutput")


@final
@dataclass(frozen=True, slots=True)
class CallOutcome(Generic[TOutput]):
    """What a callable may return to report token usage and metadata with its value."""

    value: TOutput
    token_usage: TokenUsage | None = None
    metadata: object = field(default=None)


@final
class CallableStrategy(LLMCallStrategy[TOutput]):
    """Adapt ``fn(prompt, *, attempt, timeout, state)`` (async) into a strategy.

    ``fn`` may return a plain value or a :class:`CallOutcome`. Keyword arguments
    that ``fn`` does not accept are not passed, so ``async def f(prompt)`` works.
    ``identity`` decides lease sharing and the default quota scope: callables
    with the same identity share preparation and quotas. An
    :class:`ArtifactIdentity` there also declares the provider and model the
    callable calls, so a checkpoint store infers its identity from it; without
    one a callable declares no model, and a store needs ``identity=`` of its own.
    """

    @overload
    def __init__(
        self, fn: Callable[..., Awaitable[CallOutcome[TOutput]]], *, identity: object | None = None
    ) -> None: ...

    @overload
    def __init__(self, fn: Callable[..., Awaitable[TOutput]], *, identity: object | None = None) -> None: ...

    def __init__(
        self,
        fn: Callable[..., Awaitable[TOutput | CallOutcome[TOutput]]],
        *,
        identity: object | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn={fn!r}: must be an async callable")
        self._fn = fn
        self._identity = identity if identity is not None else self
        params: Mapping[str, inspect.Parameter]
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._kwargs = frozenset(
            name for name in ("attempt", "timeout", "state") if takes_all or name in params
        )

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[TOutput, TokenUsage | None, Any]:
        kwargs: dict[str, Any] = {}
        if self._kwargs:
            available = {"attempt": attempt, "timeout": timeout, "state": state}
            kwargs = {k: available[k] for k in self._kwargs}
        value = await self._fn(prompt, **kwargs)
        if isinstance(value, CallOutcome):
            return value.value, value.token_usage, value.metadata
        return value, None, None

    def quota_scope(self) -> object:
        return self._identity

    def lease_identity(self) -> object:
        return self._identity

    @property
    def artifact_identity(self) -> ArtifactIdentity | None:
        """``identity=`` when it is an :class:`ArtifactIdentity`, else ``None``."""
        identity = self._identity
        return identity if isinstance(identity, ArtifactIdentity) else None

    def cache_key_material(self, request: LLMRequest) -> dict[str, Any] | None:
        """The default material, with the declared identity's versions (a new prompt or parser
        version is a new key); ``None`` without a declared model."""
        material = super().cache_key_material(request)
        declared = self.artifact_identity
        if material is not None and declared is not None:
            material["identity"] = declared.to_dict()
        return material

    @property
    def model_name(self) -> str | None:
        declared = self.artifact_identity
        return declared.model if declared is not None else None

    @property
    def provider_name(self) -> str | None:
        declared = self.artifact_identity
        return declared.provider if declared is not None else None

    def __repr__(self) -> str:
        return f"CallableStrategy({getattr(self._fn, '__qualname__', self._fn)!r})"
