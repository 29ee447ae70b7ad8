"""The mock's Anthropic and Gemini batch routes: which request is which store operation, answered how.

:class:`ProviderBatches` holds the app's :class:`~._anthropic_batches.AnthropicBatchStore`
and :class:`~._gemini_batches.GeminiBatchStore` and serves their requests the
way the app serves OpenAI's Batch API: the request recorded in its dialect
(key, request id), the generic faults planned from ``(seed, "METHOD
path-template", occurrence)``, then the scripted ``batch_create_faults`` of a
create, then the store. Errors go out in the route's dialect (its error body
and retry hints, through the app's responder).

Each line of a batch is answered by the app's live dialect (``POST
/v1/messages``, ``generateContent``: :func:`line_answers`), checked and planned
as a live request, so a batch line gets exactly the live route's answer.

:func:`plan_batch_request` and :func:`send_store_answer` are the steps every
batch request takes, OpenAI's (served by the app) included: its fault plan and
scripted create fault, and the store's answer with the faults that act once a
batch is made.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import anyio

from ._anthropic_batches import AnthropicBatchStore, LineAnswer, match_anthropic_batch_route
from ._asgi import Exchange, Receive, Scope, Send, send_json, send_raw
from ._batch_store import BatchReply
from ._dialect import Dialect, Route
from ._gemini_batches import GeminiBatchStore, GeminiLineAnswer, match_gemini_batch_route
from ._plan import Plan, plan_request
from ._respond import Responder
from ._state import Counters, MockServerConfig, RecordedRequest

__all__ = ["ProviderBatchRoute", "ProviderBatches", "line_answers", "plan_batch_request", "send_store_answer"]


@final
@dataclass(frozen=True, slots=True)
class ProviderBatchRoute:
    dialect: str  # "anthropic" | "gemini"
    template: str
    action: str
    target: str


ExecuteRoute = Callable[[Route, dict[str, Any], str], tuple[int, dict[str, Any]]]
"""The app's ``execute_route``: one line of a dialect, planned and answered as a live request."""
Arrive = Callable[[Scope, Any, "str | None", float, Dialect], Exchange]
"""The app's ``_arrive(scope, body, prompt, now, dialect)``: a request recorded, due batches finished."""


@final
class ProviderBatches:
    """The Anthropic and Gemini batch stores of one app, and how their requests are answered."""

    def __init__(self, config: MockServerConfig, counts: Counters, respond: Responder,
                 clock: Callable[[], float], dialects: Sequence[Dialect], execute: ExecuteRoute) -> None:
        answer_message, answer_generate, self._dialects = line_answers(dialects, execute)
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

    async def send_error(self, exchange: Exchange, send: Send, status: int, message: str, *,
                         retry_after: float | None = None) -> None:
        """An error in the exchange's dialect (its error body, retry hints and request id)."""
        _, kind, code = exchange.dialect.error_text(status, None)
        await self._respond.send_error(exchange, send, status, message, kind, code, retry_after=retry_after)

    async def handle(self, route: ProviderBatchRoute, arrive: Arrive, scope: Scope, raw: bytes,
                     receive: Receive, send: Send) -> None:
        """One batch request: its arrival recorded (``arrive``: the app's), then :meth:`serve`."""
        try:
            recorded: Any = json.loads(raw) if raw else None
        except ValueError:
            recorded = raw
        dialect = self._dialects[0] if route.dialect == "anthropic" else self._dialects[1]
        exchange = arrive(scope, recorded, None, self._clock(), dialect)
        self._counts.batch_api_requests += 1
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = scope.get("query_string", b"").decode("latin-1")
        await self.serve(route, exchange, raw, query, headers, receive, send)

    async def serve(self, route: ProviderBatchRoute, exchange: Exchange, raw: bytes, query: str,
                    headers: dict[str, str], receive: Receive, send: Send) -> None:
        """One batch request, after the app recorded its arrival: faults, create faults, the store."""
        if self._respond.closing:
            await self.send_error(exchange, send, 503, "the mock server is shutting down")
            return
        if self.config.api_key is not None and exchange.credential != self.config.api_key:
            await self.send_error(exchange, send, 401, "invalid x-api-key (mock)")
            return
        plan, script = plan_batch_request(
            self.config, self._counts, route.template, exchange.record,
            (lambda: next(self._create_faults, "ok")) if route.action == "create" else None)
        respond = self._respond
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
                await self.send_error(exchange, send, status, f"mock error {status}", retry_after=wait)
                return
            moment = self._clock()
            self.advance(moment)
            answer = store.dispatch(route.action, route.target, raw, query, moment)

            async def refuse(status: int, message: str) -> None:
                await self.send_error(exchange, send, status, message)

            await send_store_answer(respond, exchange, send, answer, script, refuse=refuse,
                                    content_type=b"application/binary", clock=self._clock)

        await respond.guarded(exchange, receive, send, act)




def plan_batch_request(config: MockServerConfig, counts: Counters, template: str, record: RecordedRequest,
                       create_fault: Callable[[], str] | None) -> tuple[Plan, str]:
    """``(plan, script)`` of one batch request: its generic fault plan, drawn from ``(seed, template,
    occurrence)``, and for a create the plan leaves alone the next scripted create fault
    (``create_fault``; ``"ok"`` otherwise). A request that will hang or reset says so in its record."""
    occurrence = counts.endpoint_occurrences[template]
    counts.endpoint_occurrences[template] += 1
    plan = plan_request(config, template, occurrence)
    if plan.kind == "malformed":  # a truncated result file would be undetectable: not a batch fault
        plan = Plan("ok", plan.latency)
    script = create_fault() if create_fault is not None and plan.kind == "ok" else "ok"
    if plan.kind in ("hang", "reset") or script == "hang_before_create":
        record.outcome = "reset" if plan.kind == "reset" else "hang"
    return plan, script


async def send_store_answer(respond: Responder, exchange: Exchange, send: Send, answer: BatchReply,
                            script: str, *, refuse: Callable[[int, str], Awaitable[None]],
                            content_type: bytes, clock: Callable[[], float]) -> None:
    """Send the store's ``answer``, after the scripted faults that act once a batch is made (a hang or
    a reset after the create: its outcome is then unknown to the client); an error goes out through
    ``refuse(status, message)``, in the route's dialect."""
    record = exchange.record
    if answer.created and script == "hang_after_create":
        record.outcome = "hang"
        await respond.hang()
    if answer.created and script == "reset_after_create":
        record.outcome = "reset"
        await respond.perform(Plan("reset"), {}, exchange, send)
    elif answer.status >= 400:
        await refuse(answer.status, answer.message)
    else:
        record.outcome, record.answered = "ok", clock()
        if answer.content is not None:
            await send_raw(send, answer.status, answer.content, exchange=exchange, content_type=content_type)
        else:
            await send_json(send, answer.status, answer.payload, exchange=exchange)

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


def line_answers(dialects: Sequence[Dialect], execute: ExecuteRoute) -> \
        tuple[LineAnswer, GeminiLineAnswer, tuple[Dialect, Dialect]]:
    """How the app answers a line of each provider's batches: by its live dialect (``POST
    /v1/messages``, ``generateContent``), so a line is answered exactly as the live route answers."""
    probe = "/v1beta/models/{model}:generateContent"
    anthropic = next(((d, r) for d in dialects if (r := d.route("POST", "/v1/messages")) is not None), None)
    google = next((d for d in dialects if d.route("POST", probe.format(model="m")) is not None), None)
    if anthropic is None or google is None:
        raise RuntimeError("the mock's batch routes need the Anthropic and Gemini dialects")
    dialect, message_route = anthropic

    def answer_message(params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return _dialect_line(dialect, message_route, execute, params)

    def answer_generate(model: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        route = google.route("POST", probe.format(model=model))
        assert route is not None  # the dialect routes every model's path
        return _dialect_line(google, route, execute, request)

    return answer_message, answer_generate, (dialect, google)
