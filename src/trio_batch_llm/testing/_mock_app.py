"""The mock server's ASGI app: OpenAI wire format, deterministic answers, faults, records.

Answers ``POST /v1/chat/completions`` and ``POST /v1/responses`` (also without
the ``/v1`` prefix) and ``GET /v1/models``. Everything is decided from
``(seed, prompt text, occurrence)`` where *occurrence* counts earlier arrivals
of the same prompt text (past the server's own RPM/TPM limiter), so a seeded
run gives the same answers and faults on both backends whatever order requests
arrive in, and a retried prompt rolls again instead of failing forever.

Per-prompt markers force a fault, for exact tests (``xN``: only the first N
occurrences of that prompt; without it: every one)::

    [[fail:503]] [[fail:429x2]] [[hang]] [[reset]] [[malformed]]
    [[context_length]] [[content_policy]] [[latency:0.25]] [[retry_after:2.5]]

A *reset* answers with an informational ``103`` head and closes the connection:
ASGI cannot make a server send a TCP RST, so the client sees the connection
closed without a response (httpx2: ``RemoteProtocolError: Server disconnected
without sending a response``). A *hang* never answers: it ends when the client
disconnects or the server shuts down. Under an in-process transport (httpx2's
``ASGITransport``) a reset has no meaning; use a served app for resets.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections import defaultdict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal, final

import anyio
import anyio.lowlevel

from .._strategies._wire import (
    Api,
    chat_completion_payload,
    error_payload,
    prompt_text_of_request,
    responses_payload,
)
from ._mock_state import MockServerConfig, MockServerStats, RecordedRequest, SlidingWindow

__all__ = ["MockOpenAIApp", "mock_token_count"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_ROUTES: dict[str, Api] = {
    "/v1/chat/completions": "chat", "/chat/completions": "chat",
    "/v1/responses": "responses", "/responses": "responses",
}
_MARKER = re.compile(
    r"\[\[(fail|hang|reset|malformed|context_length|content_policy|latency|retry_after)"
    r"(?::([0-9.]+))?(?:x(\d+))?\]\]"
)
_CREATED = 1_700_000_000  # a fixed timestamp keeps whole responses deterministic
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")
_SECRET_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})


def mock_token_count(text: str) -> int:
    """The mock's tokenizer: one token per four characters, at least one."""
    return max(1, (len(text) + 3) // 4)


@dataclass(frozen=True, slots=True)
class _Plan:
    kind: Literal["ok", "error", "hang", "reset", "malformed"]
    latency: float = 0.0
    status: int = 200
    code: str | None = None
    retry_after: float | None = None


@dataclass(slots=True)
class _Exchange:
    """One request's progress, shared with its disconnect watcher."""

    record: RecordedRequest
    started: bool = False
    disconnected: bool = False


@dataclass(slots=True)
class _Counters:
    requests: int = 0
    succeeded: int = 0
    rate_limited: int = 0
    rate_limited_enforced: int = 0
    server_errors: int = 0
    client_errors: int = 0
    malformed: int = 0
    resets: int = 0
    hangs: int = 0
    disconnects: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    occurrences: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))


@final
class MockOpenAIApp:
    """The ASGI application (``await app(scope, receive, send)``); serve it or mount it in-process.

    ``clock`` (default ``anyio.current_time``) stamps arrivals and drives the
    RPM/TPM windows; latency and hangs always use ``anyio.sleep``.
    """

    def __init__(self, config: MockServerConfig | None = None, *,
                 clock: Callable[[], float] | None = None) -> None:
        self.config = config if config is not None else MockServerConfig()
        self._clock = clock if clock is not None else anyio.current_time  # injectable for exact tests
        self._records: list[RecordedRequest] = []
        self._counts = _Counters()
        window = self.config.limit_window
        self._arrivals = SlidingWindow(window)
        self._served = SlidingWindow(window)
        self._served_tokens = SlidingWindow(window)
        self._active: set[anyio.CancelScope] = set()
        self._changed: anyio.Event | None = None
        self._closing = False

    # -- observation ----------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every completion request received, in arrival order (a copy of the list)."""
        return list(self._records)

    def statistics(self) -> MockServerStats:
        c = self._counts
        return MockServerStats(
            requests=c.requests, succeeded=c.succeeded, rate_limited=c.rate_limited,
            rate_limited_enforced=c.rate_limited_enforced, server_errors=c.server_errors,
            client_errors=c.client_errors, malformed=c.malformed, resets=c.resets, hangs=c.hangs,
            disconnects=c.disconnects, in_flight=c.in_flight, max_in_flight=c.max_in_flight,
            max_arrivals_per_window=self._arrivals.max_total, max_served_per_window=self._served.max_total,
            prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
        )

    async def wait_for(self, predicate: Callable[[MockServerStats], bool]) -> MockServerStats:
        """Wait until ``predicate(statistics())`` holds (checked after every change); return that snapshot."""
        while True:
            stats = self.statistics()
            if predicate(stats):
                await anyio.lowlevel.checkpoint()
                return stats
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def begin_shutdown(self) -> None:
        """Refuse new requests (503) and release every pending one, hangs included."""
        self._closing = True
        for scope in list(self._active):
            scope.cancel()

    # -- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":  # websocket and friends: not ours
            await anyio.lowlevel.checkpoint()
            return
        body = await _read_body(receive)
        path, method = scope["path"], scope["method"]
        if path in ("/v1/models", "/models") and method == "GET":
            model = {"id": self.config.model or "mock-model", "object": "model", "created": _CREATED,
                     "owned_by": "trio-batch-llm"}
            await _send_json(send, 200, {"object": "list", "data": [model]})
            return
        api = _ROUTES.get(path)
        if api is None or method != "POST":
            status = 404 if api is None else 405
            message = f"no route {method} {path}"
            await _send_json(send, status, error_payload(message, kind="invalid_request_error"))
            return
        self._counts.in_flight += 1
        self._counts.max_in_flight = max(self._counts.max_in_flight, self._counts.in_flight)
        try:
            await self._completion(api, scope, body, receive, send)
        finally:
            self._counts.in_flight -= 1
            self._notify()

    async def _completion(self, api: Api, scope: Scope, raw: bytes, receive: Receive, send: Send) -> None:
        now = self._clock()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        authorization = headers.get("authorization")
        try:
            payload: Any = json.loads(raw)
        except ValueError:
            payload = raw.decode("utf-8", "replace")
        prompt = prompt_text_of_request(api, payload)
        record = RecordedRequest(
            method=scope["method"], path=scope["path"], arrival=now, prompt=prompt,
            headers={k: v for k, v in headers.items() if k not in _SECRET_HEADERS},
            body=payload,
        )
        if self.config.record_requests:
            self._records.append(record)
        self._counts.requests += 1
        self._arrivals.add(now)
        self._notify()
        exchange = _Exchange(record)
        if self._closing:
            await self._send_error(exchange, send, 503, "the mock server is shutting down", "server_error")
        elif self.config.api_key is not None and authorization != f"Bearer {self.config.api_key}":
            await self._send_error(exchange, send, 401, "Incorrect API key provided (mock)",
                                   "invalid_request_error", "invalid_api_key")
        elif prompt is None or not isinstance(payload, dict):
            await self._send_error(exchange, send, 400, "the body needs messages (chat) or input (responses)",
                                   "invalid_request_error")
        elif payload.get("stream"):
            await self._send_error(exchange, send, 400, "stream=true is not supported by the mock server",
                                   "invalid_request_error")
        else:
            await self._answer(api, payload, prompt, exchange, receive, send)

    async def _answer(self, api: Api, payload: dict[str, Any], prompt: str, exchange: _Exchange,
                      receive: Receive, send: Send) -> None:
        text, completion_tokens = self._reply(prompt)
        prompt_tokens = mock_token_count(prompt)
        if not await self._admit(exchange, send, prompt_tokens + completion_tokens):
            return
        # Counted once admitted, so the server's own 429s do not shift a prompt's scripted faults.
        occurrence = self._counts.occurrences[prompt]
        self._counts.occurrences[prompt] += 1
        plan = self._plan(prompt, occurrence)
        exchange.record.outcome = plan.kind if plan.kind != "error" else f"error:{plan.status}"
        digest = hashlib.sha256(f"{self.config.seed}\x00{prompt}\x00{occurrence}".encode()).hexdigest()[:24]
        model = str(payload.get("model") or self.config.model or "mock-model")
        build = chat_completion_payload if api == "chat" else responses_payload
        body = build(response_id=("chatcmpl-" if api == "chat" else "resp_") + digest, model=model, text=text,
                     prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, created=_CREATED)
        with anyio.CancelScope() as scope:
            self._active.add(scope)
            if self._closing:  # shutdown began while this request was on its way here
                scope.cancel()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_watch_disconnect, receive, scope, exchange)
                    if plan.kind == "hang":
                        self._counts.hangs += 1
                        self._notify()
                        await anyio.sleep_forever()
                    if plan.latency > 0:
                        await anyio.sleep(plan.latency)
                    await self._perform(plan, body, exchange, send)
                    tg.cancel_scope.cancel()
            finally:
                self._active.discard(scope)
        if exchange.disconnected and not exchange.started:
            self._counts.disconnects += 1
            exchange.record.client_disconnected = True
        elif scope.cancelled_caught and not exchange.started:  # released by shutdown
            await self._send_error(exchange, send, 503, "the mock server is shutting down", "server_error")

    async def _admit(self, exchange: _Exchange, send: Send, tokens: int) -> bool:
        """Enforce the server's own RPM/TPM limits over the sliding window; answer 429 when over."""
        config, now = self.config, self._clock()
        if config.tpm_limit is not None and tokens > config.tpm_limit:
            await self._send_error(exchange, send, 400, f"request needs {tokens} tokens, over the TPM limit",
                                   "invalid_request_error", "request_too_large")
            return False
        wait = 0.0
        if config.rpm_limit is not None:
            wait = self._served.wait_for_room(now, 1, config.rpm_limit)
        if config.tpm_limit is not None:
            wait = max(wait, self._served_tokens.wait_for_room(now, tokens, config.tpm_limit))
        if wait > 0:
            exchange.record.outcome = "rate_limited_enforced"
            self._counts.rate_limited_enforced += 1
            await self._send_error(exchange, send, 429, "Rate limit reached (mock server limit)", "requests",
                                   "rate_limit_exceeded", retry_after=wait)
            return False
        self._served.add(now)
        self._served_tokens.add(now, tokens)
        await anyio.lowlevel.checkpoint()
        return True

    def _plan(self, prompt: str, occurrence: int) -> _Plan:
        config = self.config
        rng = random.Random(f"{config.seed}\x00{prompt}\x00{occurrence}")
        latency = rng.uniform(*config.latency) if isinstance(config.latency, tuple) else config.latency
        roll = rng.random()
        retry_after, explicit = config.retry_after, False
        forced: _Plan | None = None
        for match in _MARKER.finditer(prompt):
            name, value, times = match.group(1), match.group(2), match.group(3)
            if name == "latency" and value is not None:
                latency = float(value)
            elif name == "retry_after" and value is not None:
                retry_after, explicit = float(value), True
            elif forced is None and (times is None or occurrence < int(times)):
                forced = _marker_plan(name, value)
        if forced is not None:
            # Retry-After goes with 429 and 503 (as HTTP uses it), or wherever a marker asks for it
            wait = retry_after if explicit or forced.status in (429, 503) else None
            return _Plan(forced.kind, latency, forced.status, forced.code, wait)
        edge = 0.0
        for kind, rate in (("reset", config.reset_rate), ("hang", config.hang_rate),
                           ("malformed", config.malformed_rate)):
            edge += rate
            if roll < edge:
                return _Plan(kind, latency)  # type: ignore[arg-type]
        edge += config.server_error_rate
        if roll < edge:
            status = config.server_error_status
            return _Plan("error", latency, status, None, retry_after if status == 503 else None)
        edge += config.rate_limit_rate
        if roll < edge:
            return _Plan("error", latency, 429, "rate_limit_exceeded", retry_after)
        return _Plan("ok", latency)

    def _reply(self, prompt: str) -> tuple[str, int]:
        """The answer's text and completion tokens: an echo, or seeded words when ``output_tokens`` is set."""
        wanted = self.config.output_tokens
        if wanted is None:
            text = "echo: " + prompt
            return text, mock_token_count(text)
        rng = random.Random(f"{self.config.seed}\x00words\x00{prompt}")
        count = wanted if isinstance(wanted, int) else rng.randint(*wanted)
        return " ".join(rng.choice(_WORDS) for _ in range(count)), count

    async def _perform(self, plan: _Plan, body: dict[str, Any], exchange: _Exchange, send: Send) -> None:
        exchange.record.answered = self._clock()
        if plan.kind == "ok":
            self._counts.succeeded += 1
            usage = body["usage"]
            self._counts.prompt_tokens += usage.get("prompt_tokens", usage.get("input_tokens", 0))
            self._counts.completion_tokens += usage.get("completion_tokens", usage.get("output_tokens", 0))
            await _send_json(send, 200, body, exchange=exchange)
        elif plan.kind == "malformed":
            self._counts.malformed += 1
            text = json.dumps(body)
            await _send_raw(send, 200, text[: len(text) // 2].encode(), exchange=exchange)
        elif plan.kind == "reset":
            self._counts.resets += 1
            exchange.started = True
            await send({"type": "http.response.start", "status": 103, "headers": []})
        else:
            await self._send_error(exchange, send, plan.status, *_error_text(plan.status, plan.code),
                                   retry_after=plan.retry_after)

    async def _send_error(self, exchange: _Exchange, send: Send, status: int, message: str, kind: str,
                          code: str | None = None, *, retry_after: float | None = None) -> None:
        if exchange.record.outcome == "pending":
            exchange.record.outcome = f"error:{status}"
        exchange.record.answered = self._clock()
        if status == 429:
            self._counts.rate_limited += 1
        elif status >= 500:
            self._counts.server_errors += 1
        else:
            self._counts.client_errors += 1
        headers: list[tuple[bytes, bytes]] = []
        if retry_after is not None:
            headers.append((b"retry-after", str(math.ceil(retry_after)).encode()))
            headers.append((b"retry-after-ms", str(math.ceil(retry_after * 1000)).encode()))
        if status == 503 and self._closing:
            headers.append((b"connection", b"close"))
        await _send_json(send, status, error_payload(message, kind=kind, code=code), headers=headers,
                         exchange=exchange)


def _marker_plan(name: str, value: str | None) -> _Plan | None:
    if name == "fail":
        status = int(float(value)) if value else 500
        return _Plan("error", status=status, code="rate_limit_exceeded" if status == 429 else None)
    if name == "context_length":
        return _Plan("error", status=400, code="context_length_exceeded")
    if name == "content_policy":
        return _Plan("error", status=400, code="content_policy_violation")
    return _Plan(name)  # type: ignore[arg-type]  # hang, reset, malformed


def _error_text(status: int, code: str | None) -> tuple[str, str, str | None]:
    if status == 429:
        return "Rate limit reached (mock)", "requests", code or "rate_limit_exceeded"
    if status >= 500:
        return "The server had an error while processing your request (mock)", "server_error", code
    if code == "context_length_exceeded":
        return ("This model's maximum context length is 128 tokens; the messages are longer (mock)",
                "invalid_request_error", code)
    if code == "content_policy_violation":
        return "This request was rejected by the content policy (mock)", "invalid_request_error", code
    named = {401: "invalid_api_key", 402: "insufficient_quota", 403: "permission_denied",
             404: "model_not_found"}
    return f"mock error {status}", "invalid_request_error", code or named.get(status)


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope, exchange: _Exchange) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            exchange.disconnected = True
            scope.cancel()
            return


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _send_json(send: Send, status: int, payload: Any, *,
                     headers: list[tuple[bytes, bytes]] | None = None,
                     exchange: _Exchange | None = None) -> None:
    await _send_raw(send, status, json.dumps(payload).encode(), headers=headers, exchange=exchange)


async def _send_raw(send: Send, status: int, body: bytes, *, headers: list[tuple[bytes, bytes]] | None = None,
                    exchange: _Exchange | None = None) -> None:
    if exchange is not None:
        exchange.started = True
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})
