"""The mock's Gemini dialect on the app's seam: routes, key, checks, answers, Google's errors, caches.

Routes: ``POST /v1beta/models/{model}:generateContent`` (also ``/v1``), and the
context caches under ``/v1beta/cachedContents`` (:meth:`GeminiDialect.cache_route`,
served by :meth:`GeminiDialect.serve_cache`). The key travels in the
``x-goog-api-key`` header or the ``?key=`` query parameter.

What is Gemini's own (beside the wire format of :mod:`._gemini`):

- a request naming a ``cachedContent`` that does not exist, was deleted or has
  expired gets Google's 403 ``CachedContent not found (or permission denied)``;
  one that also sets ``systemInstruction``, ``tools`` or ``toolConfig``, or names
  another model than the cache's, gets Google's 400. A live cache's tokens are
  added to ``promptTokenCount`` and reported as ``cachedContentTokenCount``.
- ``gemini_daily_request_limit``: past that many ``generateContent`` requests in a
  day of the app's clock, every request gets the per-day 429
  (``GenerateRequestsPerDayPerProjectPerModel``, no ``RetryInfo``); the
  ``[[spend_limit]]`` marker answers the same.
- every other 429 (injected, or the server's own RPM/TPM limit) is a per-minute
  quota whose wait is ``RetryInfo.retryDelay`` in the body: Gemini sends no
  ``Retry-After`` and no rate-limit headers, so neither does this dialect.
- a 503 is ``UNAVAILABLE`` "The model is overloaded".
- the ``[[blocked]]`` marker answers what Google sends for a prompt its safety
  filters block: a 200 with ``promptFeedback.blockReason`` and no candidates.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, final
from urllib.parse import parse_qs

from .._values._schema_check import response_schema_problem
from ._asgi import Exchange, Receive, Scope, Send, send_json
from ._dialect import Answer, LimitState, Problem, Route
from ._gemini import (
    blocked_answer,
    fields_of,
    model_path,
    request_problem,
    requested_function,
    requested_schema,
    shape_answer,
)
from ._gemini import prompt_text as gemini_prompt_text
from ._gemini_caches import Answer as CacheAnswer
from ._gemini_caches import CacheStore, GeminiCacheStats
from ._gemini_errors import cache_not_found, google_error, quota_exhausted, status_error
from ._respond import Responder
from ._state import MockServerConfig

__all__ = ["GeminiDialect"]

Arrive = Callable[[Scope, Any, "str | None", float, Any], Exchange]
Refusal = Callable[[Exchange], "tuple[int, str, str, str | None] | None"]
_DAY: Final = 86_400.0
_CACHES: Final = re.compile(r"/v1(?:beta|alpha)?/cachedContents(?:/([^/:]+))?")
_WITH_CACHE: Final = ("CachedContent can not be used with GenerateContent request setting "
                      "system_instruction, tools or tool_config.\n\nProposed fix: move those values to "
                      "CachedContent from GenerateContent request.")
_NAMED: Final = {
    "context_length_exceeded": "The input token count (1048577) exceeds the maximum number of tokens allowed "
                               "(1048576).",
    "content_policy_violation": "The request was blocked by the safety filters (mock).",
    "invalid_json_schema": "* GenerateContentRequest.generation_config.response_schema: the mock refuses "
                           "this schema, as Gemini refuses one it does not support.\n",
}


@final
class GeminiDialect:
    """Google's Gemini API (Developer API, ``generativelanguage``): see the module docstring."""

    name = "gemini"
    base_path = ""
    structured_tools = False

    def __init__(self, config: MockServerConfig, clock: Callable[[], float]) -> None:
        self._config = config
        self._clock = clock
        self.caches = CacheStore(min_tokens=config.gemini_min_cache_tokens, seed=config.seed)
        self._day_start: float | None = None
        self._today = (0, 0)  # (day number since the first request, requests counted that day)

    # -- routes and checks ----------------------------------------------------------------------

    def route(self, method: str, path: str) -> Route | None:
        found = model_path(path)
        if found is None or method != "POST" or found[1] not in ("generateContent", "streamGenerateContent"):
            return None
        return Route(self, found[1], found[0])

    def cache_route(self, method: str, path: str) -> tuple[str, str | None] | None:
        """``(method, cache id or None)`` of a ``cachedContents`` request, else ``None``."""
        match = _CACHES.fullmatch(path)
        if match is None:
            return None
        allowed = ("GET", "PATCH", "DELETE") if match.group(1) else ("GET", "POST")
        return (method, match.group(1)) if method in allowed else None

    def credential(self, headers: Mapping[str, str], query: str) -> str | None:
        keys = parse_qs(query).get("key")
        return headers.get("x-goog-api-key") or (keys[0] if keys else None)

    def check(self, route: Route, headers: Mapping[str, str], payload: Any) -> Problem | None:
        if route.operation != "generateContent":
            return Problem(400, f"{route.operation} is not supported by the mock server")
        problem = request_problem(payload)
        if problem is not None:
            return Problem(400, problem)
        fields = fields_of(payload)
        now = self._clock()
        if "cachedContent" in fields:
            if any(key in fields for key in ("systemInstruction", "tools", "toolConfig")):
                return Problem(400, _WITH_CACHE)
            record = self.caches.lookup(fields["cachedContent"], now)
            if record is not None and record.model != "models/" + str(route.model):
                return Problem(400, f"Model used by GenerateContent request (models/{route.model}) and "
                                    f"CachedContent ({record.model}) has to be the same.")
            if self.caches.use(fields["cachedContent"], now) is None:  # counted once the body is fine
                return Problem(403, "CachedContent not found (or permission denied)", "cache_not_found")
        return self._count_day(now)

    def _count_day(self, now: float) -> Problem | None:
        limit = self._config.gemini_daily_request_limit
        if limit is None:
            return None
        if self._day_start is None:
            self._day_start = now
        day = math.floor((now - self._day_start) / _DAY)
        count = self._today[1] if self._today[0] == day else 0
        if count >= limit:
            return Problem(429, "per-day quota exhausted", "per_day_quota")
        self._today = (day, count + 1)
        return None

    # -- what a request asks for ----------------------------------------------------------------

    def prompt_text(self, route: Route, payload: Any) -> str | None:
        if not isinstance(payload, Mapping):
            return None
        return gemini_prompt_text(payload) if request_problem(payload) is None else ""  # check() says why

    def requested_schema(self, route: Route, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        return requested_schema(payload)

    def requested_tool(self, route: Route, payload: Mapping[str, Any],
                       prompt: str) -> tuple[str, dict[str, Any]] | None:
        return requested_function(payload, prompt)

    def schema_refusal(self, route: Route, payload: Mapping[str, Any]) -> str | None:
        schema = requested_schema(payload)
        problem = response_schema_problem(schema) if schema else None
        if problem is not None:
            return f"* GenerateContentRequest.generation_config.response_schema: the schema {problem}.\n"
        function = requested_function(payload, "[[tool_call]]")
        problem = response_schema_problem(function[1]) if function and function[1] else None
        if function is not None and problem is not None:
            return (f"* GenerateContentRequest.tools[0].function_declarations: the parameters of "
                    f"{function[0]!r} {problem}.\n")
        return None

    # -- answers --------------------------------------------------------------------------------

    def success_body(self, route: Route, payload: Mapping[str, Any], prompt: str,
                     answer: Answer) -> dict[str, Any]:
        fields = fields_of(payload)
        record = self.caches.lookup(fields.get("cachedContent"), self._clock())
        model = str(route.model or answer.model)
        if "[[blocked]]" in prompt:
            return blocked_answer(payload, model=model, response_id=answer.digest[:22])
        text = answer.refusal if answer.refusal is not None else answer.text  # Gemini declines in text
        return shape_answer(payload, model=model, text=text, call=answer.tool_call,
                            response_id=answer.digest[:22], cached_tokens=record.tokens if record else 0)

    def usage_of(self, body: Mapping[str, Any]) -> tuple[int, int]:
        usage = body.get("usageMetadata") or {}
        return (int(usage.get("promptTokenCount", 0)),
                int(usage.get("candidatesTokenCount", 0)) + int(usage.get("thoughtsTokenCount", 0)))

    def error_text(self, status: int, code: str | None) -> tuple[str, str, str | None]:
        body = status_error(status)["error"]
        return _NAMED.get(code or "", body["message"]), body["status"], code

    def error_body(self, status: int, message: str, kind: str, code: str | None, *,
                   retry_after: float | None, request_id: str) -> dict[str, Any]:
        model = self._config.model or "gemini-mock"
        if status == 429 and code in ("per_day_quota", "spend_limit"):
            return quota_exhausted("day", model=model, limit=self._config.gemini_daily_request_limit)
        if status == 429:
            return quota_exhausted("minute", model=model, retry_delay=retry_after,
                                   limit=self._config.rpm_limit)
        if code == "cache_not_found":
            return cache_not_found()
        if status == 401:
            return google_error(401, "API key not valid. Please pass a valid API key.", [{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}])
        if message == status_error(status)["error"]["message"] or code in _NAMED:
            return status_error(status, message, retry_delay=retry_after if status == 503 else None)
        return google_error(status, message)

    def retry_headers(self, retry_after: float, hints: tuple[str, ...]) -> list[tuple[bytes, bytes]]:
        return []  # Gemini says its wait in the body (RetryInfo), never in a header

    def ratelimit_headers(self, limits: list[LimitState], wall: float) -> list[tuple[bytes, bytes]]:
        return []  # Gemini sends no rate-limit headers

    def response_headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        return []

    # -- the context caches ---------------------------------------------------------------------

    def cache_statistics(self) -> GeminiCacheStats:
        """The context caches' counts now (alive, created, deleted, expired, renewed, used, ...)."""
        return self.caches.statistics(self._clock())

    async def cache_request(self, found: tuple[str, str | None], arrive: Arrive, refusal_of: Refusal,
                            respond: Responder, wall_clock: Callable[[], float], scope: Scope, raw: bytes,
                            receive: Receive, send: Send) -> None:
        """Serve one ``cachedContents`` request for the app, which passes its ``arrive`` (records it)
        and ``refusal_of`` (shutdown, wrong key): refused as any request, else the store answers."""
        try:
            payload: Any = json.loads(raw) if raw else None
        except ValueError:
            payload = raw.decode("utf-8", "replace")
        exchange = arrive(scope, payload, None, self._clock(), self)
        refusal = refusal_of(exchange)
        if refusal is not None:
            await respond.send_error(exchange, send, *refusal)
            return
        query = scope.get("query_string", b"").decode("latin-1")
        status, body = self.serve_cache(*found, payload, query, wall_clock())
        exchange.record.outcome = "ok" if status == 200 else f"error:{status}"
        exchange.record.answered = self._clock()
        await send_json(send, status, body, exchange=exchange)

    def serve_cache(self, method: str, cache_id: str | None, payload: Any, query: str,
                    wall: float) -> CacheAnswer:
        """Answer one ``cachedContents`` request (routed by :meth:`cache_route`) as ``(status, body)``;
        ``wall`` (the app's wall clock now) names the moments of the cache's times."""
        now = self._clock()
        params = {k: v[0] for k, v in parse_qs(query).items()}
        store = self.caches
        if cache_id is None:
            return store.create(payload, now, wall) if method == "POST" else store.list(params, now, wall)
        if method == "GET":
            return store.get(cache_id, now, wall)
        if method == "PATCH":
            return store.patch(cache_id, payload, params.get("updateMask"), now, wall)
        return store.delete(cache_id, now)
