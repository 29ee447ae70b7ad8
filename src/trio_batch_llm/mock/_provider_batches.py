"""The mock's Anthropic and Gemini batch routes: which request is which store operation, answered how.

:class:`ProviderBatches` holds the app's :class:`~._anthropic_batches.AnthropicBatchStore`
and :class:`~._gemini_batches.GeminiBatchStore` and serves their requests the
way the app serves OpenAI's Batch API (:meth:`MockOpenAIApp._batch_api`): the
generic faults planned from ``(seed, "METHOD path-template", occurrence)``,
then the scripted ``batch_create_faults`` of a create, then the store. Errors
are worded in the route's dialect (Anthropic's ``{"type": "error", ...}``,
Google's ``{"error": {code, message, status}}``), with ``retry-after`` on 429s.

Each line of a batch is answered by ``answer_message`` / ``answer_generate``:
the app's live dialect for ``/v1/messages`` and ``generateContent``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import anyio

from ._anthropic_batches import AnthropicBatchStore, LineAnswer, anthropic_error, match_anthropic_batch_route
from ._asgi import Exchange, Receive, Scope, Send, send_json, send_raw
from ._dialect import Dialect, Route
from ._gemini_batches import GeminiBatchStore, GeminiLineAnswer, google_error, match_gemini_batch_route
from ._plan import Plan, plan_request, reply
from ._respond import Responder
from ._state import Counters, MockServerConfig, mock_token_count

__all__ = [
    "ProviderBatchRoute", "ProviderBatches", "generate_line_answer", "line_answers", "message_line_answer",
]


@final
@dataclass(frozen=True, slots=True)
class ProviderBatchRoute:
    dialect: str  # "anthropic" | "gemini"
    template: str
    action: str
    target: str


ExecuteRoute = Callable[[Route, dict[str, Any], str], tuple[int, dict[str, Any]]]
"""The app's ``execute_route``: one line of a dialect, planned and answered as a live request."""
Arrive = Callable[[Scope, Any, "str | None", float], Exchange]
"""The app's ``_arrive(scope, body, prompt, now)``: a request recorded, the batches due by now finished."""


@final
class ProviderBatches:
    """The Anthropic and Gemini batch stores of one app, and how their requests are answered."""

    def __init__(self, config: MockServerConfig, counts: Counters, respond: Responder,
                 clock: Callable[[], float], dialects: Sequence[Dialect], execute: ExecuteRoute) -> None:
        answer_message, answer_generate = line_answers(config, counts, dialects, execute)
        self.config = config
        self.anthropic = AnthropicBatchStore(config, answer_message)
        self.gemini = GeminiBatchStore(config, answer_generate)
        self._counts = counts
        self._respond = respond
        self._clock = clock
        self._create_faults = iter(config.batch_create_faults)

    def match(self, method: str, path: str) -> ProviderBatchRoute | str | None:
        """The route of ``method path``; ``"wrong method"``; ``None`` if the path is not a batch path."""
        matchers = (("anthropic", match_anthropic_batch_route), ("gemini", match_gemini_batch_route))
        for dialect, matcher in matchers:
            found = matcher(method, path)
            if isinstance(found, tuple):
                return ProviderBatchRoute(dialect, *found)
            if found is not None:
                return found
        return None

    def advance(self, now: float) -> None:
        self.anthropic.advance(now)
        self.gemini.advance(now)

    def authorized(self, route: ProviderBatchRoute, headers: dict[str, str]) -> bool:
        """The dialect's own key header carries ``api_key`` (Anthropic ``x-api-key``, Google
        ``x-goog-api-key``); a Bearer token is taken too, as both APIs' gateways do."""
        key = self.config.api_key
        if key is None:
            return True
        own = headers.get("x-api-key" if route.dialect == "anthropic" else "x-goog-api-key")
        return key in (own, (headers.get("authorization") or "").removeprefix("Bearer "))

    def error_body(self, route: ProviderBatchRoute, status: int, message: str) -> dict[str, Any]:
        return anthropic_error(status, message) if route.dialect == "anthropic" else google_error(status,
                                                                                                 message)

    async def send_error(self, route: ProviderBatchRoute, exchange: Exchange, send: Send, status: int,
                         message: str, *, retry_after: float | None = None) -> None:
        """An error in the route's dialect, counted as the app counts its answers."""
        if exchange.record.outcome == "pending":
            exchange.record.outcome = f"error:{status}"
        exchange.record.answered = self._clock()
        if status == 429:
            self._counts.rate_limited += 1
        elif status >= 500:
            self._counts.server_errors += 1
        else:
            self._counts.client_errors += 1
        headers = [] if retry_after is None else [(b"retry-after", str(math.ceil(retry_after)).encode())]
        await send_json(send, status, self.error_body(route, status, message), headers=headers,
                        exchange=exchange)

    async def handle(self, route: ProviderBatchRoute, arrive: Arrive, scope: Scope, raw: bytes,
                     receive: Receive, send: Send) -> None:
        """One batch request: its arrival recorded (``arrive``: the app's), then :meth:`serve`."""
        try:
            recorded: Any = json.loads(raw) if raw else None
        except ValueError:
            recorded = raw
        exchange = arrive(scope, recorded, None, self._clock())
        self._counts.batch_api_requests += 1
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = scope.get("query_string", b"").decode("latin-1")
        await self.serve(route, exchange, raw, query, headers, receive, send)

    async def serve(self, route: ProviderBatchRoute, exchange: Exchange, raw: bytes, query: str,
                    headers: dict[str, str], receive: Receive, send: Send) -> None:
        """One batch request, after the app recorded its arrival: faults, create faults, the store."""
        if self._respond.closing:
            await self.send_error(route, exchange, send, 503, "the mock server is shutting down")
            return
        if not self.authorized(route, headers):
            await self.send_error(route, exchange, send, 401, "invalid x-api-key (mock)")
            return
        occurrence = self._counts.endpoint_occurrences[route.template]
        self._counts.endpoint_occurrences[route.template] += 1
        plan = plan_request(self.config, route.template, occurrence)
        if plan.kind == "malformed":  # a truncated result file would be undetectable: not a batch fault
            plan = Plan("ok", plan.latency)
        script = next(self._create_faults, "ok") if route.action == "create" and plan.kind == "ok" else "ok"
        respond, record = self._respond, exchange.record
        if plan.kind in ("hang", "reset") or script == "hang_before_create":
            record.outcome = "reset" if plan.kind == "reset" else "hang"
        store: AnthropicBatchStore | GeminiBatchStore = (
            self.anthropic if route.dialect == "anthropic" else self.gemini)
        if route.dialect == "anthropic":
            self.anthropic.origin = f"http://{headers.get('host', '127.0.0.1')}"

        async def act() -> None:
            if plan.kind == "hang" or script == "hang_before_create":
                await respond.hang()
            if plan.latency > 0:
                await anyio.sleep(plan.latency)
            if plan.kind == "reset":
                await respond.perform(plan, {}, exchange, send)
                return
            if plan.kind == "error" or script.startswith("error:"):
                status = plan.status if plan.kind == "error" else int(script.removeprefix("error:"))
                wait = self.config.retry_after if status in (429, 503, 529) else None
                await self.send_error(route, exchange, send, status, f"mock error {status}", retry_after=wait)
                return
            moment = self._clock()
            self.advance(moment)
            answer = store.dispatch(route.action, route.target, raw, query, moment)
            if answer.created and script == "hang_after_create":
                record.outcome = "hang"
                await respond.hang()
            if answer.created and script == "reset_after_create":
                record.outcome = "reset"
                await respond.perform(Plan("reset"), {}, exchange, send)
            elif answer.status >= 400:
                await self.send_error(route, exchange, send, answer.status, answer.message)
            else:
                record.outcome, record.answered = "ok", self._clock()
                if answer.content is not None:
                    await send_raw(send, answer.status, answer.content, exchange=exchange,
                                   content_type=b"application/binary")
                else:
                    await send_json(send, answer.status, answer.payload, exchange=exchange)

        await respond.guarded(exchange, receive, send, act)


def _text_of(value: Any) -> str:
    """The text of a message content (a string, or parts with ``text``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text_of(part.get("text", "")) for part in value if isinstance(part, dict))
    return ""


def planned_line(config: MockServerConfig, counts: Counters, prompt: str) -> tuple[Plan, str, int]:
    """One batch line planned as a live request of ``prompt`` (its occurrence counted): the plan, the
    answer's text and its output tokens. Hang, reset and malformed become a 500."""
    occurrence = counts.occurrences[prompt]
    counts.occurrences[prompt] += 1
    plan = plan_request(config, prompt, occurrence)
    if plan.kind not in ("ok", "error"):
        plan = Plan("error", status=500)
    text, tokens = reply(config, prompt)
    return plan, text, tokens


def message_line_answer(config: MockServerConfig, counts: Counters) -> LineAnswer:
    """A line of a message batch answered as a Messages API call: an interim dialect for the batch
    store until the app's own ``/v1/messages`` dialect answers lines (same plans, markers, occurrences)."""

    def answer(params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        messages = params.get("messages")
        if not isinstance(messages, list) or not messages or not isinstance(params.get("max_tokens"), int):
            return 400, anthropic_error(400, "messages and max_tokens: Field required")
        prompt = "".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict))
        plan, text, tokens = planned_line(config, counts, prompt)
        if plan.kind == "error":
            return plan.status, anthropic_error(plan.status, f"mock error {plan.status}")
        usage = {"input_tokens": mock_token_count(prompt), "output_tokens": tokens,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        return 200, {"id": "msg_mock", "type": "message", "role": "assistant", "model": params.get("model"),
                     "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                     "stop_sequence": None, "usage": usage}

    return answer


def generate_line_answer(config: MockServerConfig, counts: Counters) -> GeminiLineAnswer:
    """A line of a Gemini batch answered as a ``generateContent`` call: an interim dialect for the batch
    store until the app's own Gemini dialect answers lines (same plans, markers, occurrences)."""

    def answer(model: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        contents = request.get("contents")
        if not isinstance(contents, list) or not contents:
            return 400, google_error(400, "* GenerateContentRequest.contents: contents is not specified")
        prompt = "".join(_text_of(c.get("parts")) for c in contents if isinstance(c, dict))
        plan, text, tokens = planned_line(config, counts, prompt)
        if plan.kind == "error":
            return plan.status, google_error(plan.status, f"mock error {plan.status}")
        prompt_tokens = mock_token_count(prompt)
        usage = {"promptTokenCount": prompt_tokens, "candidatesTokenCount": tokens,
                 "totalTokenCount": prompt_tokens + tokens}
        return 200, {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                                     "finishReason": "STOP", "index": 0}],
                     "usageMetadata": usage, "modelVersion": model}

    return answer


_LINE_HEADERS: Final = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
"""What a batch line is checked with: the headers its create carried (a line has none of its own)."""


def _dialect_line(dialect: Dialect, route: Route, execute: ExecuteRoute,
                  payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One line through a live dialect: checked, then planned and answered as a live request."""
    problem = dialect.check(route, _LINE_HEADERS, payload)
    prompt = dialect.prompt_text(route, payload)
    if problem is not None or prompt is None:
        message = problem.message if problem is not None else "the body carries no prompt"
        status = problem.status if problem is not None else 400
        code = problem.code if problem is not None else None
        return status, dialect.error_body(status, message, "invalid_request_error", code, retry_after=None,
                                          request_id="req_batch_line")
    return execute(route, payload, prompt)


def line_answers(config: MockServerConfig, counts: Counters, dialects: Sequence[Dialect],
                 execute: ExecuteRoute) -> tuple[LineAnswer, GeminiLineAnswer]:
    """How the app answers a line of each provider's batches: by its live dialect (``/v1/messages``,
    ``generateContent``) when the app speaks it, else by the interim answers below."""
    anthropic = next(((d, r) for d in dialects if (r := d.route("POST", "/v1/messages")) is not None), None)
    probe = "/v1beta/models/{model}:generateContent"
    gemini = next((d for d in dialects if d.route("POST", probe.format(model="m")) is not None), None)
    answer_message = message_line_answer(config, counts)
    answer_generate = generate_line_answer(config, counts)
    if anthropic is not None:
        dialect, route = anthropic

        def answer_message(params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            return _dialect_line(dialect, route, execute, params)

    if gemini is not None:
        google = gemini

        def answer_generate(model: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            route = google.route("POST", probe.format(model=model))
            assert route is not None  # the dialect routes every model's path
            return _dialect_line(google, route, execute, request)

    return answer_message, answer_generate
