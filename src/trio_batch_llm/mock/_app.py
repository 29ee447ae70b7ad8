"""The mock server's ASGI app: routes by dialect, its own RPM/TPM limits, answers carried out, records kept.

Each dialect (:mod:`._dialects`) names its completion routes; OpenAI's Files and Batch
APIs (:mod:`._batch_routes`, :mod:`._batch_store`) and ``GET /v1/models`` are here too. It is
over 400 lines because every dialect's routes (batches and caches included) meet in this one place.
What each request gets is planned by :mod:`._plan` from ``(seed, prompt text, occurrence)``,
*occurrence* counting earlier arrivals of the same prompt past the server's own limiter;
this module carries the plan out, in the request's dialect. A *reset* sends an informational
``103`` head and closes the connection (ASGI cannot send a TCP RST; httpx2 sees "Server
disconnected without sending a response"; meaningless in-process). A *hang* never answers.
Files and Batch API requests get the generic faults too (not ``malformed``), planned from
``(seed, "METHOD path-template", occurrence)``. Every request first finishes the batches due
at the app's clock, so batch lines take their prompt occurrences in time order.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, final

import anyio
import anyio.lowlevel

from ._asgi import Exchange, Receive, Scope, Send, lifespan, read_body, send_json
from ._batch_routes import BatchRoute, dispatch, match_route
from ._batch_store import BatchStore
from ._dialect import Dialect, Route
from ._dialects import DIALECTS, GeminiDialect
from ._limits import ServerLimits
from ._openai import Api, OpenAIDialect, openai_error_payload
from ._plan import CREATED, Plan, plan_request, reply, success_body
from ._provider_batches import ProviderBatches, ProviderBatchRoute, plan_batch_request, send_store_answer
from ._respond import Responder
from ._state import Counters, MockServerConfig, MockServerStats, RecordedRequest, mock_token_count

__all__ = ["MockOpenAIApp"]

_SECRET_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "x-goog-api-key"})


@final
class MockOpenAIApp:
    """The ASGI application (``await app(scope, receive, send)``); serve it or mount it in-process.

    ``clock`` (default ``anyio.current_time``) stamps arrivals and drives the
    RPM/TPM windows; ``wall_clock`` (default ``time.time``) says which calendar
    minute it is, for ``calendar_rpm_limit``; latency and hangs always use ``anyio.sleep``.
    """

    def __init__(self, config: MockServerConfig | None = None, *,
                 clock: Callable[[], float] | None = None,
                 wall_clock: Callable[[], float] | None = None) -> None:
        self.config = config if config is not None else MockServerConfig()
        self._clock = clock if clock is not None else anyio.current_time  # injectable for exact tests
        self._wall_clock = wall_clock if wall_clock is not None else time.time  # likewise
        self._records: list[RecordedRequest] = []
        self._counts = Counters()
        self._limits = ServerLimits(self.config)
        self._changed: anyio.Event | None = None
        self._respond = Responder(self._counts, self._clock, self._notify, self.config.retry_after_headers)
        self._store = BatchStore(self.config, self._execute_line)
        self.dialects: tuple[Dialect, ...] = tuple(make(self.config, self._clock) for make in DIALECTS)
        """The dialects this app speaks, in the order their routes are tried (OpenAI's first)."""
        self._openai = next(d for d in self.dialects if isinstance(d, OpenAIDialect))
        self.provider_batches = ProviderBatches(self.config, self._counts, self._respond, self._clock,
                                                self.dialects, self.execute_route)
        self.gemini = next(d for d in self.dialects if isinstance(d, GeminiDialect)).bind(self._wall_clock)

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
            max_arrivals_per_window=self._limits.arrivals.max_total,
            max_served_per_window=self._limits.served.max_total,
            prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
            batch_api_requests=c.batch_api_requests, **dataclasses.asdict(self._store.counts),
            max_served_per_calendar_minute=self._limits.calendar.max_count,
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
        self._respond.begin_shutdown()

    # -- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":  # websocket and friends: not ours
            await anyio.lowlevel.checkpoint()
            return
        body = await read_body(receive)
        path, method = scope["path"], scope["method"]
        if path in ("/v1/models", "/models") and method == "GET":
            model = {"id": self.config.model or "mock-model", "object": "model", "created": CREATED,
                     "owned_by": "trio-batch-llm"}
            await send_json(send, 200, {"object": "list", "data": [model]})
            return
        batch_route = match_route(method, path) or self.provider_batches.match(method, path)
        route = next((r for d in self.dialects if (r := d.route(method, path)) is not None), None)
        handler: Callable[[Scope, bytes, Receive, Send], Awaitable[None]]
        if isinstance(batch_route, BatchRoute):
            handler = functools.partial(self._batch_api, batch_route)
        elif isinstance(batch_route, ProviderBatchRoute):
            handler = functools.partial(self.provider_batches.handle, batch_route, self._arrive)
        elif (found := self.gemini.cache_route(method, path)) is not None:  # Gemini's context caches
            handler = functools.partial(self.gemini.serve, found, self._arrive, self._refusal, self._respond)
        elif route is not None:
            handler = functools.partial(self._completion, route)
        else:
            known = batch_route is not None or any(d.route("POST", path) for d in self.dialects)
            message = f"no route {method} {path}"
            await send_json(send, 405 if known else 404,
                            openai_error_payload(message, kind="invalid_request_error"))
            return
        counts = self._counts
        counts.in_flight += 1
        counts.max_in_flight = max(counts.max_in_flight, counts.in_flight)
        try:
            await handler(scope, body, receive, send)
        finally:
            counts.in_flight -= 1
            self._notify()

    def _arrive(self, scope: Scope, body: Any, prompt: str | None, now: float,
                dialect: Dialect | None = None) -> Exchange:
        """Record a request's arrival; finish the batches due by now (so occurrences follow time)."""
        self._store.advance(now)
        self.provider_batches.advance(now)
        dialect = dialect if dialect is not None else self._openai
        headers = _headers(scope)
        record = RecordedRequest(
            method=scope["method"], path=scope["path"], arrival=now, prompt=prompt,
            headers={k: v for k, v in headers.items() if k not in _SECRET_HEADERS},
            body=body,
        )
        if self.config.record_requests:
            self._records.append(record)
        number = self._counts.requests + self._counts.batch_api_requests
        request_id = "req_" + hashlib.sha256(f"{self.config.seed}\x00{number}".encode()).hexdigest()[:24]
        exchange = Exchange(record, dialect, request_id,
                            dialect.credential(headers, scope.get("query_string", b"").decode("latin-1")))
        exchange.headers = dialect.response_headers(request_id)
        return exchange

    def _refusal(self, exchange: Exchange) -> tuple[int, str, str, str | None] | None:
        """The error for any request while shutting down (503) or with a wrong key (401)."""
        if self._respond.closing:
            return 503, "the mock server is shutting down", "server_error", None
        if self.config.api_key is not None and exchange.credential != self.config.api_key:
            return 401, "Incorrect API key provided (mock)", "invalid_request_error", "invalid_api_key"
        return None

    async def _completion(self, route: Route, scope: Scope, raw: bytes, receive: Receive, send: Send) -> None:
        now = self._clock()
        try:
            payload: Any = json.loads(raw)
        except ValueError:
            payload = raw.decode("utf-8", "replace")
        dialect = route.dialect
        prompt = dialect.prompt_text(route, payload)
        exchange = self._arrive(scope, payload, prompt, now, dialect)
        self._counts.requests += 1
        self._limits.arrive(now)
        self._notify()
        refusal = self._refusal(exchange)
        problem = dialect.check(route, _headers(scope), payload) if refusal is None else None
        if refusal is not None:
            await self._respond.send_error(exchange, send, *refusal)
        elif problem is not None or prompt is None or not isinstance(payload, dict):
            message = problem.message if problem is not None else "the body carries no prompt"
            await self._respond.send_error(exchange, send, problem.status if problem is not None else 400,
                                           message, "invalid_request_error",
                                           problem.code if problem is not None else None)
        elif payload.get("stream"):
            await self._respond.send_error(exchange, send, 400,
                                           "stream=true is not supported by the mock server",
                                           "invalid_request_error")
        else:
            await self._answer(route, payload, prompt, exchange, receive, send)

    async def _answer(self, route: Route, payload: dict[str, Any], prompt: str, exchange: Exchange,
                      receive: Receive, send: Send) -> None:
        dialect = route.dialect
        refused = dialect.schema_refusal(route, payload)
        if refused is not None:  # checked before admission, as a provider checks the body first
            await self._respond.send_error(exchange, send, 400, refused, "invalid_request_error",
                                           "invalid_json_schema")
            return
        _, completion_tokens = reply(self.config, prompt)
        prompt_tokens = mock_token_count(prompt)
        cached = getattr(dialect, "cached_input_tokens", None)  # optional: cache reads count no input
        counted = prompt_tokens - (cached(route, payload, prompt_tokens) if cached is not None else 0)
        if not await self._admit(exchange, send, prompt_tokens + completion_tokens,
                                 (counted, completion_tokens)):
            return
        # Counted once admitted, so the server's own 429s do not shift a prompt's scripted faults.
        occurrence = self._counts.occurrences[prompt]
        self._counts.occurrences[prompt] += 1
        plan = self._plan(route, payload, prompt, occurrence)
        exchange.record.outcome = plan.kind if plan.kind != "error" else f"error:{plan.status}"
        # Built only for what sends it: building one has effects (Anthropic's prompt cache is written).
        body = success_body(self.config, route, payload, prompt, occurrence, plan.content) \
            if plan.kind in ("ok", "malformed") else {}

        async def act() -> None:
            if plan.kind == "hang":
                await self._respond.hang()
            if plan.latency > 0:
                await anyio.sleep(plan.latency)
            await self._respond.perform(plan, body, exchange, send)

        await self._respond.guarded(exchange, receive, send, act)

    def _execute_line(self, api: Api, payload: dict[str, Any], prompt: str) -> tuple[int, dict[str, Any]]:
        """One line of an OpenAI batch (see :meth:`execute_route`)."""
        return self.execute_route(Route(self._openai, api), payload, prompt)

    def execute_route(self, route: Route, payload: dict[str, Any], prompt: str) -> tuple[int, dict[str, Any]]:
        """One batch line of any dialect, planned as a live request: ``(status, body)`` in its dialect.

        Latency is ignored; hang/reset/malformed become 500. The Batch APIs of every dialect use it.
        """
        dialect = route.dialect
        key = f"{self.config.seed}\x00line\x00{prompt}"
        request_id = "req_" + hashlib.sha256(key.encode()).hexdigest()[:24]

        def error(status: int, message: str, kind: str, code: str | None) -> tuple[int, dict[str, Any]]:
            return status, dialect.error_body(status, message, kind, code, retry_after=None,
                                              request_id=request_id)

        if payload.get("stream"):  # refused before it counts, as live
            return error(400, "stream=true is not supported by the mock server", "invalid_request_error",
                         None)
        refused = dialect.schema_refusal(route, payload)
        if refused is not None:  # refused before it counts, as live
            return error(400, refused, "invalid_request_error", "invalid_json_schema")
        occurrence = self._counts.occurrences[prompt]
        self._counts.occurrences[prompt] += 1
        plan = self._plan(route, payload, prompt, occurrence)
        if plan.kind == "ok":
            return 200, success_body(self.config, route, payload, prompt, occurrence, plan.content)
        if plan.kind == "error" and plan.code == "error_in_200":
            message, kind, _ = dialect.error_text(plan.status, None)
            return 200, error(plan.status, message, kind, plan.code)[1]
        if plan.kind == "error":
            return error(plan.status, *dialect.error_text(plan.status, plan.code))
        return error(500, *dialect.error_text(500, None))

    def _plan(self, route: Route, payload: dict[str, Any], prompt: str, occurrence: int) -> Plan:
        """The prompt's plan, then the knobs that override it: a refused schema, a spent limit."""
        plan = plan_request(self.config, prompt, occurrence)
        if self.config.reject_json_schema and route.dialect.requested_schema(route, payload) is not None:
            plan = Plan("error", plan.latency, 400, "invalid_json_schema")
        spend = self.config.spend_limit_after
        if spend is not None and self._counts.succeeded >= spend:
            plan = Plan("error", plan.latency, 429, "spend_limit")
        return plan

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
            await self._respond.send_error(exchange, send, *refusal)
            return
        plan, script = plan_batch_request(self.config, self._counts, route.template, exchange.record,
                                          self._store.next_create_fault if route.action == "create" else None)
        headers = _headers(scope)
        respond = self._respond

        async def act() -> None:
            if plan.kind == "hang" or script == "hang_before_create":
                await respond.hang()
            if plan.latency > 0:
                await anyio.sleep(plan.latency)
            if plan.kind != "ok":
                await respond.perform(plan, {}, exchange, send)
                return
            if script.startswith("error:"):
                status = int(script.removeprefix("error:"))
                wait = self.config.retry_after if status in (429, 503) else None
                await respond.perform(Plan("error", status=status, retry_after=wait), {}, exchange, send)
                return
            moment = self._clock()
            self._store.advance(moment)
            answer = dispatch(self._store, route, raw, headers.get("content-type", ""),
                              scope.get("query_string", b"").decode("latin-1"), moment)
            self._notify()

            async def refuse(status: int, message: str) -> None:
                await respond.send_error(exchange, send, status, message, "invalid_request_error")

            await send_store_answer(respond, exchange, send, answer, script, refuse=refuse,
                                    content_type=b"application/octet-stream", clock=self._clock)

        await respond.guarded(exchange, receive, send, act)

    async def _admit(self, exchange: Exchange, send: Send, tokens: int, split: tuple[int, int]) -> bool:
        """Enforce the server's own RPM/TPM limits over the sliding window; answer 429 when over.

        From here on every answer to this request carries the rate-limit headers (when configured),
        except a refusal by the calendar-minute limit, which tells nothing.
        """
        limits, now = self._limits, self._clock()
        decision = limits.admit(now, tokens, self._wall_clock() if self.config.calendar_rpm_limit else 0.0,
                                split)
        dialect = exchange.dialect
        exchange.headers = dialect.response_headers(exchange.request_id)
        if not decision.silent:
            exchange.headers += dialect.ratelimit_headers(limits.states(now), self._wall_clock())
        if decision.too_large:
            await self._respond.send_error(exchange, send, 400,
                                           f"request needs {tokens} tokens, over the TPM limit",
                                           "invalid_request_error", "request_too_large")
            return False
        if not decision.served:
            exchange.record.outcome = "rate_limited_enforced"
            self._counts.rate_limited_enforced += 1
            await self._respond.send_error(exchange, send, 429, "Rate limit reached (mock server limit)",
                                           "requests", "rate_limit_exceeded",
                                           retry_after=None if decision.silent else decision.wait)
            return False
        await anyio.lowlevel.checkpoint()
        return True


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
