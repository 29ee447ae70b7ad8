"""What the mock answers: a plan for each request, and the deterministic reply of a success.

Everything is decided from ``(seed, key, occurrence)``: the key is the prompt
text for a completion (or a batch line), ``"METHOD path-template"`` for a
Files or Batch API request, and *occurrence* counts the earlier requests with
that key. So a seeded run gives the same answers and faults on both backends
whatever order requests arrive in, and a retried prompt rolls again instead of
failing forever.

Markers inside a prompt force a fault, for exact tests (``xN``: only the first
N occurrences of that prompt; without it: every one)::

    [[fail:503]] [[fail:429x2]] [[hang]] [[reset]] [[malformed]]
    [[context_length]] [[content_policy]] [[latency:0.25]] [[retry_after:2.5]] [[spend_limit]]
    [[error_in_200:429]] [[no_provider]] (OpenRouter's error bodies: :mod:`._openai`)

and, for a request that asks for a JSON schema (:mod:`._structured`), markers that
change the answer's content: ``[[invalid_json]]`` (text that is not JSON),
``[[schema_violation]]`` (JSON that breaks the schema), ``[[fenced]]`` (the JSON
wrapped in a markdown code fence), ``[[refusal]]`` (the model refuses), and
``[[reject_schema]]`` (400, the schema refused as a provider refuses one).

Nothing here sends, sleeps or reads a clock: the app carries a plan out.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Any, Final, Literal, final

from ._dialect import Answer, Content, Route
from ._state import MockServerConfig, mock_token_count
from ._structured import answer_json, example_of, schema_violation

__all__ = ["CREATED", "Content", "Plan", "plan_request", "reply", "success_body"]

CREATED: Final = 1_700_000_000
"""The ``created`` timestamp of every answer: a fixed one keeps whole responses deterministic."""
_MARKER = re.compile(
    r"\[\[(fail|hang|reset|malformed|context_length|content_policy|latency|retry_after|invalid_json"
    r"|schema_violation|fenced|refusal|reject_schema|spend_limit|error_in_200|no_provider)"
    r"(?::([0-9.]+))?(?:x(\d+))?\]\]"
)
_CONTENT_MARKERS: Final = frozenset({"invalid_json", "schema_violation", "fenced", "refusal"})
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


@final
@dataclass(frozen=True, slots=True)
class Plan:
    """How to answer one request: after ``latency`` seconds, a success, an error, a hang, a reset or a
    truncated body; an error has its ``status``, its ``code`` and maybe a ``retry_after``."""

    kind: Literal["ok", "error", "hang", "reset", "malformed"]
    latency: float = 0.0
    status: int = 200
    code: str | None = None
    retry_after: float | None = None
    content: Content = "text"
    """What a success says, for a request asking for a JSON schema (see the module docstring)."""


def plan_request(config: MockServerConfig, key: str, occurrence: int) -> Plan:
    """The plan for the ``occurrence``-th request with ``key``: its markers first, then the seeded rates."""
    rng = random.Random(f"{config.seed}\x00{key}\x00{occurrence}")
    latency = rng.uniform(*config.latency) if isinstance(config.latency, tuple) else config.latency
    roll = rng.random()
    content_roll = rng.random()  # drawn after roll: the plans of requests without a schema do not change
    content: Content = "text"
    if content_roll < config.invalid_json_rate:
        content = "invalid_json"
    elif content_roll < config.invalid_json_rate + config.schema_violation_rate:
        content = "schema_violation"
    retry_after, explicit = config.retry_after, False
    forced: Plan | None = None
    for match in _MARKER.finditer(key):
        name, value, times = match.group(1), match.group(2), match.group(3)
        if name == "latency" and value is not None:
            latency = float(value)
        elif name == "retry_after" and value is not None:
            retry_after, explicit = float(value), True
        elif name in _CONTENT_MARKERS:
            if times is None or occurrence < int(times):
                content = name  # type: ignore[assignment]
        elif forced is None and (times is None or occurrence < int(times)):
            forced = _marker_plan(name, value)
    if forced is not None:
        # Retry-After goes with 429 and 503 (as HTTP uses it), or wherever a marker asks for it
        # no wait ends a spend limit; an error inside a 200 has no headers to carry one
        hinted = forced.status in (429, 503) and forced.code not in ("spend_limit", "error_in_200")
        wait = retry_after if explicit or hinted else None
        return Plan(forced.kind, latency, forced.status, forced.code, wait)
    edge = 0.0
    for kind, rate in (("reset", config.reset_rate), ("hang", config.hang_rate),
                       ("malformed", config.malformed_rate)):
        edge += rate
        if roll < edge:
            return Plan(kind, latency, content=content)  # type: ignore[arg-type]
    edge += config.server_error_rate
    if roll < edge:
        status = config.server_error_status
        return Plan("error", latency, status, None, retry_after if status == 503 else None)
    edge += config.rate_limit_rate
    if roll < edge:
        return Plan("error", latency, 429, "rate_limit_exceeded", retry_after)
    return Plan("ok", latency, content=content)


def _marker_plan(name: str, value: str | None) -> Plan:
    if name == "fail":
        status = int(float(value)) if value else 500
        return Plan("error", status=status, code="rate_limit_exceeded" if status == 429 else None)
    if name == "context_length":
        return Plan("error", status=400, code="context_length_exceeded")
    if name == "content_policy":
        return Plan("error", status=400, code="content_policy_violation")
    if name == "reject_schema":
        return Plan("error", status=400, code="invalid_json_schema")
    if name == "spend_limit":  # a spend limit or quota that no wait ends: each dialect words it
        return Plan("error", status=429, code="spend_limit")
    if name == "error_in_200":  # OpenRouter: an error met once the model started, sent as HTTP 200
        return Plan("error", status=int(float(value)) if value else 429, code="error_in_200")
    if name == "no_provider":  # OpenRouter: no provider could serve the model (retryable)
        return Plan("error", status=int(float(value)) if value else 502, code="no_provider_available")
    return Plan(name)  # type: ignore[arg-type]  # hang, reset, malformed


def reply(config: MockServerConfig, prompt: str) -> tuple[str, int]:
    """The answer's text and completion tokens: an echo, or seeded words when ``output_tokens`` is set."""
    wanted = config.output_tokens
    if wanted is None:
        text = "echo: " + prompt
        return text, mock_token_count(text)
    rng = random.Random(f"{config.seed}\x00words\x00{prompt}")
    count = wanted if isinstance(wanted, int) else rng.randint(*wanted)
    return " ".join(rng.choice(_WORDS) for _ in range(count)), count


def success_body(config: MockServerConfig, route: Route, payload: dict[str, Any], prompt: str,
                 occurrence: int, content: Content = "text") -> dict[str, Any]:
    """The 200 body for ``prompt``'s ``occurrence``-th arrival (live, or a batch line), in its dialect.

    A request asking for a JSON schema gets schema-valid JSON (or the fault ``content`` says),
    one with a forced tool a tool call (:mod:`._structured`).
    """
    dialect = route.dialect
    text, completion_tokens = reply(config, prompt)
    rng = random.Random(f"{config.seed}\x00json\x00{prompt}")
    schema = dialect.requested_schema(route, payload)
    tool = dialect.requested_tool(route, payload, prompt)
    if tool is not None and dialect.structured_tools and content != "text":
        # The forced tool is the structured output: a violation breaks its input, and text or a
        # refusal come instead of the call, as a model that did not follow the schema answers.
        schema, tool = (tool[1], None) if content != "schema_violation" else (None, tool)
    call: tuple[str, Any] | None = None
    refusal: str | None = None
    if tool is not None:
        value = schema_violation(tool[1], rng) if content == "schema_violation" and dialect.structured_tools \
            else example_of(tool[1], rng)
        call, text = (tool[0], value), ""
    elif schema is not None:
        if content == "refusal":
            refusal, text = "I can't help with that (mock)", ""
        elif content == "invalid_json":
            text = "Sure! Here is the answer: " + text
        elif content == "schema_violation":
            text = answer_json(schema_violation(schema, rng))
        else:
            text = answer_json(example_of(schema, rng))
            if content == "fenced":
                text = "```json\n" + text + "\n```"
    if schema is not None or call is not None:
        completion_tokens = mock_token_count(text or (answer_json(call[1]) if call else ""))
    digest = hashlib.sha256(f"{config.seed}\x00{prompt}\x00{occurrence}".encode()).hexdigest()[:24]
    call_digest = hashlib.sha256(f"{config.seed}\x00{prompt}".encode()).hexdigest()[:16]
    model = str(payload.get("model") or route.model or config.model or "mock-model")
    answer = Answer(digest=digest, call_digest=call_digest, model=model, text=text,
                    prompt_tokens=mock_token_count(prompt), completion_tokens=completion_tokens,
                    created=CREATED, tool_call=call, refusal=refusal)
    return dialect.success_body(route, payload, prompt, answer)
