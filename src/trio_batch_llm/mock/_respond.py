"""How the mock's answers go out: plans carried out, every answer counted, pending ones released.

One :class:`Responder` per app. It counts each answer as it sends it (into
the app's :class:`~._state.Counters`), stamps the record's answer time, and
holds the cancel scope of every request that is waiting (a latency, a hang),
so :meth:`Responder.begin_shutdown` releases them all with a 503.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, final

import anyio

from ._asgi import Exchange, Receive, Send, send_json, send_raw, watch_disconnect
from ._plan import Plan
from ._state import Counters

__all__ = ["Responder"]


@final
class Responder:
    """Sends the answers of one app, counting them; releases pending requests at shutdown."""

    def __init__(self, counts: Counters, clock: Callable[[], float], notify: Callable[[], None],
                 hints: tuple[str, ...] = ("retry-after",)) -> None:
        self._counts = counts
        self._hints = hints
        self._clock = clock
        self._notify = notify
        self._active: set[anyio.CancelScope] = set()
        self.closing = False
        """Set by :meth:`begin_shutdown`: new requests are refused with a 503."""

    def begin_shutdown(self) -> None:
        """Refuse new requests (503) and release every pending one, hangs included."""
        self.closing = True
        for scope in list(self._active):
            scope.cancel()

    async def perform(self, plan: Plan, body: dict[str, Any], exchange: Exchange, send: Send) -> None:
        """Answer as ``plan`` says (``body`` is the success body, or ``{}``)."""
        exchange.record.answered = self._clock()
        if plan.kind == "ok":
            self._counts.succeeded += 1
            prompt_tokens, completion_tokens = exchange.dialect.usage_of(body)
            self._counts.prompt_tokens += prompt_tokens
            self._counts.completion_tokens += completion_tokens
            await send_json(send, 200, body, exchange=exchange)
        elif plan.kind == "malformed":
            self._counts.malformed += 1
            text = json.dumps(body)
            await send_raw(send, 200, text[: len(text) // 2].encode(), exchange=exchange)
        elif plan.kind == "reset":
            self._counts.resets += 1
            exchange.started = True
            await send({"type": "http.response.start", "status": 103, "headers": []})
        elif plan.code == "error_in_200":  # the error is in the body of a 200 (OpenRouter)
            self._count_error(plan.status)
            message, kind, _ = exchange.dialect.error_text(plan.status, None)
            body = exchange.dialect.error_body(plan.status, message, kind, plan.code, retry_after=None,
                                               request_id=exchange.request_id)
            await send_json(send, 200, body, exchange=exchange)
        else:
            await self.send_error(exchange, send, plan.status,
                                  *exchange.dialect.error_text(plan.status, plan.code),
                                  retry_after=plan.retry_after)

    async def send_error(self, exchange: Exchange, send: Send, status: int, message: str, kind: str,
                         code: str | None = None, *, retry_after: float | None = None) -> None:
        """An error in the exchange's dialect; with ``retry_after``, the configured retry hints in that
        dialect (OpenAI's: ``Retry-After`` and ``retry-after-ms``, and/or LiteLLM's
        ``llm_provider-retry-after``)."""
        if exchange.record.outcome == "pending":
            exchange.record.outcome = f"error:{status}"
        exchange.record.answered = self._clock()
        self._count_error(status)
        dialect = exchange.dialect
        headers = dialect.retry_headers(retry_after, self._hints) if retry_after is not None else []
        if status == 503 and self.closing:
            headers.append((b"connection", b"close"))
        body = dialect.error_body(status, message, kind, code, retry_after=retry_after,
                                  request_id=exchange.request_id)
        await send_json(send, status, body, headers=headers, exchange=exchange)

    def _count_error(self, status: int) -> None:
        if status == 429:
            self._counts.rate_limited += 1
        elif status >= 500:
            self._counts.server_errors += 1
        else:
            self._counts.client_errors += 1

    async def hang(self) -> NoReturn:
        """Never answer: only a disconnect or the shutdown (cancelling the guard) ends it."""
        self._counts.hangs += 1
        self._notify()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover - sleep_forever returns only by raising

    async def guarded(self, exchange: Exchange, receive: Receive, send: Send,
                      act: Callable[[], Awaitable[None]]) -> None:
        """Run ``act`` (which answers) released by a client disconnect or by shutdown (then 503)."""
        with anyio.CancelScope() as scope:
            self._active.add(scope)
            if self.closing:  # shutdown began while this request was on its way here
                scope.cancel()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(watch_disconnect, receive, scope, exchange)
                    await act()
                    tg.cancel_scope.cancel()
            finally:
                self._active.discard(scope)
        if exchange.disconnected and not exchange.started:
            self._counts.disconnects += 1
            exchange.record.client_disconnected = True
        elif scope.cancelled_caught and not exchange.started:  # released by shutdown
            await self.send_error(exchange, send, 503, "the mock server is shutting down", "server_error")
