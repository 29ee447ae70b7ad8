"""``BaseMiddleware``: async-batch-llm's middleware methods over this library's ``before``/``after``.

- ``before_process(work_item)`` returns the item (possibly rewritten, same id) or
  ``None`` to skip it: a skipped item still ends in one result, a failure with category
  ``INVALID_REQUEST`` that names the middleware, made without calling the provider;
- ``after_process(result)`` runs on a newly executed success (not on a replay), last
  registered first;
- ``on_error(work_item, error)`` runs once, on a final failure the provider caused (not
  on deadlines, stops or skips); a :class:`WorkItemResult` it returns (same id)
  replaces the failure. Here it runs inside the same reverse-order pass as
  ``after_process`` (async-batch-llm ran it in registration order).

Every method may be sync or async.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, final

import anyio.lowlevel

from .._observe._callables import call_sync_or_async
from .._strategies._base import LLMCallStrategy
from .._values._categories import ErrorCategory
from .._values._errors import ProviderError
from .._values._requests import LLMWorkItem
from .._values._results import TokenUsage, WorkItemResult

__all__ = ["BaseMiddleware"]


class SkippedByMiddleware(ProviderError):
    """The failure of an item a middleware's ``before_process`` skipped."""


@final
class _Skip(LLMCallStrategy[Any]):
    """Runs in place of a skipped item's strategy: fails at once, calls nobody."""

    def __init__(self, middleware: str) -> None:
        self.middleware = middleware

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: object = None
    ) -> tuple[Any, TokenUsage | None, Any]:
        await anyio.lowlevel.checkpoint()
        raise SkippedByMiddleware(
            f"skipped: {self.middleware}.before_process returned None", category=ErrorCategory.INVALID_REQUEST
        )

    def quota_scope(self) -> object:
        return ("skipped by middleware",)  # one shared scope; the provider's quota is not touched


class BaseMiddleware:
    """Override the async-batch-llm methods you need; the defaults change nothing."""

    on_error_is_terminal: ClassVar[bool] = True
    """Tells the engine that ``on_error`` is this final-failure hook, not the per-attempt one."""

    _skips: ClassVar[dict[str, _Skip]] = {}

    async def before_process(self, work_item: LLMWorkItem[Any]) -> LLMWorkItem[Any] | None:
        await anyio.lowlevel.checkpoint()
        return work_item

    async def after_process(self, result: WorkItemResult[Any]) -> WorkItemResult[Any]:
        await anyio.lowlevel.checkpoint()
        return result

    async def on_error(self, work_item: LLMWorkItem[Any], error: Exception) -> WorkItemResult[Any] | None:
        await anyio.lowlevel.checkpoint()
        return None

    # --- the engine's protocol ---------------------------------------------

    async def before(self, item: LLMWorkItem[Any]) -> LLMWorkItem[Any]:
        changed = await call_sync_or_async(self.before_process, item)
        if changed is not None:
            return changed  # type: ignore[no-any-return]  # the engine checks its type and id
        name = type(self).__qualname__
        skip = self._skips.get(name) or self._skips.setdefault(name, _Skip(name))
        return dataclasses.replace(item, strategy=skip)

    async def after(self, item: LLMWorkItem[Any], result: WorkItemResult[Any]) -> WorkItemResult[Any]:
        if result.success:
            if result.replayed:
                await anyio.lowlevel.checkpoint()
                return result
            return await call_sync_or_async(self.after_process, result)  # type: ignore[no-any-return]
        error = result.exception
        category = result.error_category
        if (not isinstance(error, Exception) or isinstance(error, SkippedByMiddleware)
                or (category is not None and category.engine_verdict)):
            await anyio.lowlevel.checkpoint()
            return result
        recovered = await call_sync_or_async(self.on_error, item, error)
        if recovered is None:
            return result
        if not isinstance(recovered, WorkItemResult) or recovered.item_id != result.item_id:
            raise TypeError(
                f"{type(self).__qualname__}.on_error returned {recovered!r}: must be None or a "
                f"WorkItemResult with item_id={result.item_id!r}"
            )
        return recovered
