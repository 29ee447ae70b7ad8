"""The mock server's ASGI app: OpenAI wire format, deterministic answers, faults, records.

Answers ``POST /v1/chat/completions`` and ``POST /v1/responses`` (also without
the ``/v1`` prefix) and ``GET /v1/models``, and emulates the Files and Batch
APIs (``/v1/files``, ``/v1/batches``; see :mod:`._batches`). Everything is decided from
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

Files and Batch API requests get the generic faults too (not ``malformed``),
planned from ``(seed, "METHOD path-template", occurrence of that endpoint)``;
a faulted request does nothing. Every request (completions included) first
finishes the batches that are due at the app's clock, so a batch's lines take
their prompt occurrences in time order with the live requests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import re
from collections import defaultdict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, final

import anyio
import anyio.lowlevel

from .._strategies.openai._wire import (
    Api,
    chat_completion_payload,
    error_payload,
    prompt_text_of_request,
    responses_payload,
)
from ._batches import BatchRoute, BatchStore, match_route
from ._state import MockServerConfig, MockServerStats, RecordedRequest, SlidingWindow, mock_token_count

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
    authorization: str | None = None
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
    batch_api_requests: int = 0
    occurrences: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    endpoint_occurrences: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))


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
        self._store = BatchStore(self.config, self._execute_line)

    # -- observation ----------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received (completions, files, batches), in arrival order (a copy of the list)."""
        return list(self._records)

    @property
    def batches(self) -> list[dict[str, Any]]:
        """Every batch object (as the API shows it), in creation order, as of the last request.

        Batches advance only when a request arrives (or :meth:`advance_batches` is called).
        """
        return self._store.batches

    @property
    def files(self) -> list[dict[str, Any]]:
        """Every file object (uploads and result files), in creation order, with ``"deleted"`` added:
        a deleted file stays listed here (so tests see what was uploaded) but the API answers 404."""
        return self._store.files

    def advance_batches(self) -> None:
        """Finish the batches that are due at the app's clock now, as any request would."""
        self._store.advance(self._clock())
        self._notify()

    def statistics(self) -> MockServerStats:
        c = self._counts
        return MockServerStats(
            requests=c.requests, succeeded=c.succeeded, rate_limited=c.rate_limited,
            rate_limited_enforced=c.rate_limited_enforced, server_errors=c.server_errors,
            client_errors=c.client_errors, malformed=c.malformed, resets=c.resets, hangs=c.hangs,
            disconnects=c.disconnects, in_flight=c.in_flight, max_in_flight=c.max_in_flight,
            max_arrivals_per_window=self._arrivals.max_total, max_served_per_window=self._served.max_total,
            prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
            batch_api_requests=c.batch_api_requests, **dataclasses.asdict(self._store.counts),
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
        batch_route = match_route(method, path)
        if isinstance(batch_route, BatchRoute):
            self._counts.in_flight += 1
            self._counts.max_in_flight = max(self._counts.max_in_flight, self._counts.in_flight)
            try:
                await self._batch_api(batch_route, scope, body, receive, send)
            finally:
                self._counts.in_flight -= 1
                self._notify()
            return
        api = _ROUTES.get(path)
        if api is None or method != "POST":
            status = 404 if api is None and batch_route is None else 405
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

    def _arrive(self, scope: Scope, body: Any, prompt: str | None, now: float) -> _Exchange:
        """Record a request's arrival; finish the batches due by now (so occurrences follow time)."""
        self._store.advance(now)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        record = RecordedRequest(
            method=scope["method"], path=scope["path"], arrival=now, prompt=prompt,
            headers={k: v for k, v in headers.items() if k not in _SECRET_HEADERS},
            body=body,
        )
        if self.config.record_requests:
            self._records.append(record)
        return _Exchange(record, authorization=headers.get("authorization"))

    def _refusal(self, exchange: _Exchange) -> tuple[int, str, str, str | None] | None:
        """The error for any request while shutting down (503) or with a wrong key (401)."""
        if self._closing:
            return 503, "the mock server is shutting down", "server_error", None
        if self.config.api_key is not None and exchange.authorization != f"Bearer {self.config.api_key}":
            return 401, "Incorrect API key provided (mock)", "invalid_request_error", "invalid_api_key"
        return None

    async def _completion(self, api: Api, scope: Scope, raw: bytes, receive: Receive, send: Send) -> None:
        now = self._clock()
        try:
            payload: Any = json.loads(raw)
        except ValueError:
            payload = raw.decode("utf-8", "replace")
        prompt = prompt_text_of_request(api, payload)
        exchange = self._arrive(scope, payload, prompt, now)
        self._counts.requests += 1
        self._arrivals.add(now)
        self._notify()
        refusal = self._refusal(exchange)
        if refusal is not None:
            await self._send_error(exchange, send, *refusal)
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
        _, completion_tokens = self._reply(prompt)
        prompt_tokens = mock_token_count(prompt)
        if not await self._admit(exchange, send, prompt_tokens + completion_tokens):
            return
        # Counted once admitted, so the server's own 429s do not shift a prompt's scripted faults.
        occurrence = self._counts.occurrences[prompt]
        self._counts.occurrences[prompt] += 1
        plan = self._plan(prompt, occurrence)
        exchange.record.outcome = plan.kind if plan.kind != "error" else f"error:{plan.status}"
        body = self._success_body(api, payload, prompt, occurrence)

        async def act() -> None:
            if plan.kind == "hang":
                await self._hang()
            if plan.latency > 0:
                await anyio.sleep(plan.latency)
            await self._perform(plan, body, exchange, send)

        await self._guarded(exchange, receive, send, act)

    def _success_body(self, api: Api, payload: dict[str, Any], prompt: str,
                      occurrence: int) -> dict[str, Any]:
        """The 200 body for ``prompt``'s ``occurrence``-th arrival (live, or a batch line)."""
        text, completion_tokens = self._reply(prompt)
        digest = hashlib.sha256(f"{self.config.seed}\x00{prompt}\x00{occurrence}".encode()).hexdigest()[:24]
        model = str(payload.get("model") or self.config.model or "mock-model")
        build = chat_completion_payload if api == "chat" else responses_payload
        return build(response_id=("chatcmpl-" if api == "chat" else "resp_") + digest, model=model, text=text,
                     prompt_tokens=mock_token_count(prompt), completion_tokens=completion_tokens,
                     created=_CREATED)

    def _execute_line(self, api: Api, payload: dict[str, Any], prompt: str) -> tuple[int, dict[str, Any]]:
        """One batch line, planned as a live request (latency ignored; hang/reset/malformed become 500)."""
        if payload.get("stream"):  # refused before it counts, as live
            return 400, error_payload("stream=true is not supported by the mock server",
                                      kind="invalid_request_error")
        occurrence = self._counts.occurrences[prompt]
        self._counts.occurrences[prompt] += 1
        plan = self._plan(prompt, occurrence)
        if plan.kind == "ok":
            return 200, self._success_body(api, payload, prompt, occurrence)
        if plan.kind == "error":
            message, kind, code = _error_text(plan.status, plan.code)
            return plan.status, error_payload(message, kind=kind, code=code)
        message, kind, code = _error_text(500, None)
        return 500, error_payload(message, kind=kind, code=code)

    async def _hang(self) -> NoReturn:
        self._counts.hangs += 1
        self._notify()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover - sleep_forever returns only by raising

    async def _guarded(self, exchange: _Exchange, receive: Receive, send: Send,
                       act: Callable[[], Awaitable[None]]) -> None:
        """Run ``act`` (which answers) released by a client disconnect or by shutdown (then 503)."""
        with anyio.CancelScope() as scope:
            self._active.add(scope)
            if self._closing:  # shutdown began while this request was on its way here
                scope.cancel()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_watch_disconnect, receive, scope, exchange)
                    await act()
                    tg.cancel_scope.cancel()
            finally:
                self._active.discard(scope)
        if exchange.disconnected and not exchange.started:
            self._counts.disconnects += 1
            exchange.record.client_disconnected = True
        elif scope.cancelled_caught and not exchange.started:  # released by shutdown
            await self._send_error(exchange, send, 503, "the mock server is shutting down", "server_error")

    async def _batch_api(self, route: BatchRoute, scope: Scope, raw: bytes, receive: Receive,
                         send: Send) -> None:
        """A Files/Batch API request: generic faults, then scripted create faults, then the store."""
        now = self._clock()
        try:
            recorded: Any = json.loads(raw) if raw else None
        except ValueError:
            recorded = raw  # a multipart upload: kept as bytes
        exchange = self._arrive(scope, recorded, None, now)
        self._counts.batch_api_requests += 1
        self._notify()
        refusal = self._refusal(exchange)
        if refusal is not None:
            await self._send_error(exchange, send, *refusal)
            return
        occurrence = self._counts.endpoint_occurrences[route.template]
        self._counts.endpoint_occurrences[route.template] += 1
        plan = self._plan(route.template, occurrence)
        if plan.kind == "malformed":  # not a batch-endpoint fault: a truncated file would be undetectable
            plan = _Plan("ok", plan.latency)
        script = self._store.next_create_fault() if route.action == "create" and plan.kind == "ok" else "ok"
        record = exchange.record
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}

        if plan.kind in ("hang", "reset") or script == "hang_before_create":
            record.outcome = "reset" if plan.kind == "reset" else "hang"

        async def act() -> None:
            if plan.kind == "hang" or script == "hang_before_create":
                await self._hang()
            if plan.latency > 0:
                await anyio.sleep(plan.latency)
            if plan.kind != "ok":
                await self._perform(plan, {}, exchange, send)
                return
            if script.startswith("error:"):
                status = int(script.removeprefix("error:"))
                wait = self.config.retry_after if status in (429, 503) else None
                await self._perform(_Plan("error", status=status, retry_after=wait), {}, exchange, send)
                return
            moment = self._clock()
            self._store.advance(moment)
            reply = self._store.dispatch(route, raw, headers.get("content-type", ""),
                                         scope.get("query_string", b"").decode("latin-1"), moment)
            self._notify()
            if reply.created and script == "hang_after_create":
                record.outcome = "hang"
                await self._hang()
            if reply.created and script == "reset_after_create":
                record.outcome = "reset"
                await self._perform(_Plan("reset"), {}, exchange, send)
            elif reply.status >= 400:
                await self._send_error(exchange, send, reply.status, reply.message, "invalid_request_error")
            else:
                record.outcome, record.answered = "ok", self._clock()
                if reply.content is not None:
                    await _send_raw(send, reply.status, reply.content, exchange=exchange,
                                    content_type=b"application/octet-stream")
                else:
                    await _send_json(send, reply.status, reply.payload, exchange=exchange)

        await self._guarded(exchange, receive, send, act)

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
                    exchange: _Exchange | None = None, content_type: bytes = b"application/json") -> None:
    if exchange is not None:
        exchange.started = True
    head = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})
