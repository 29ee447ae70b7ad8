"""The mock's dialect seam: what one provider's wire format decides, behind one protocol.

The app (:mod:`._app`) plans every request the same way (markers, seeded faults,
its own limits) and asks the request's :class:`Dialect` for everything that is
wire format: which routes it serves, where its key travels, the prompt text a
request carries (what markers are read from), the schema or forced tool it asks
for, the success body, the usage of a body, the error body and its retry hints,
and the rate-limit headers. A dialect is made per app (``Dialect(config, clock)``),
so it may keep state of its own (Anthropic's prompt cache).

A new dialect is a module with a class satisfying :class:`Dialect`, listed in
:mod:`._dialects`. Nothing here knows a particular provider. The rules every dialect
shares on declared tools (:func:`chosen_tool`, :func:`tool_schema_refusal`) live here,
so the dialects differ only in where the wire puts a tool and its choice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, final

from .._values._schema_check import response_schema_problem

__all__ = [
    "Answer", "Content", "Dialect", "LimitState", "Problem", "Route", "chosen_tool", "tool_schema_refusal",
    "tool_schemas",
]

Content = Literal["text", "invalid_json", "schema_violation", "fenced", "refusal"]
"""What a structured success says: the schema's JSON, or one of the faults the markers ask for."""


@final
@dataclass(frozen=True, slots=True)
class Route:
    """A request's dialect and operation (``"chat"``, ``"messages"``, ...), and the model its path names."""

    dialect: Dialect
    operation: str
    model: str | None = None


@final
@dataclass(frozen=True, slots=True)
class Problem:
    """A request refused before any work: ``status``, ``message`` and an optional ``code``."""

    status: int
    message: str
    code: str | None = None


@final
@dataclass(frozen=True, slots=True)
class Answer:
    """A success, dialect-free: the dialect shapes it into its own body.

    ``digest`` (24 hex digits) and ``call_digest`` (16) make the ids; ``tool_call`` is
    ``(name, arguments)`` with the arguments as a JSON value; ``refusal`` the model's
    refusal text. Token counts are the mock tokenizer's.
    """

    digest: str
    call_digest: str
    model: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    created: int
    tool_call: tuple[str, Any] | None = None
    refusal: str | None = None


@final
@dataclass(frozen=True, slots=True)
class LimitState:
    """One limit the server enforces, as its headers tell it: ``kind`` (``"requests"`` or ``"tokens"``),
    the ``limit`` in force, what is ``remaining`` and the seconds until the window is empty."""

    kind: str
    limit: int
    remaining: int
    empty_in: float


class Dialect(Protocol):
    """One provider's wire format (see the module docstring)."""

    name: str
    """Short name (``"openai"``, ``"anthropic"``): what ``serve-mock`` prints beside its base URL."""
    base_path: str
    """The path a client's ``base_url`` ends with (``"/v1"``, ``""``)."""
    structured_tools: bool
    """A forced tool is this dialect's structured output, so the content markers apply to its input."""

    def route(self, method: str, path: str) -> Route | None:
        """The completion route for ``method path``, or ``None`` when it is not this dialect's."""

    def credential(self, headers: Mapping[str, str], query: str) -> str | None:
        """The API key a request carries, where this dialect carries it (``None``: none)."""

    def check(self, route: Route, headers: Mapping[str, str], payload: Any) -> Problem | None:
        """What makes the request invalid for the provider (a missing field or header), or ``None``."""

    def prompt_text(self, route: Route, payload: Any) -> str | None:
        """All the text a request carries, joined by newlines; ``None`` when the shape is wrong."""

    def requested_schema(self, route: Route, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        """The JSON schema the answer must follow (native structured output), or ``None``."""

    def requested_tool(self, route: Route, payload: Mapping[str, Any],
                       prompt: str) -> tuple[str, dict[str, Any]] | None:
        """``(tool name, its input schema)`` of the call to answer with, or ``None``."""

    def schema_refusal(self, route: Route, payload: Mapping[str, Any]) -> str | None:
        """The message of the 400 for a malformed schema in the request, or ``None``."""

    def success_body(self, route: Route, payload: Mapping[str, Any], prompt: str,
                     answer: Answer) -> dict[str, Any]:
        """The 200 body of ``answer``."""

    def usage_of(self, body: Mapping[str, Any]) -> tuple[int, int]:
        """``(input tokens, output tokens)`` of a success body, for the server's counters."""

    def error_text(self, status: int, code: str | None) -> tuple[str, str, str | None]:
        """``(message, kind, code)`` of a planned error, worded as the provider words it."""

    def error_body(self, status: int, message: str, kind: str, code: str | None, *,
                   retry_after: float | None, request_id: str) -> dict[str, Any]:
        """The error body in the dialect's shape (``retry_after`` for dialects that put it there)."""

    def retry_headers(self, retry_after: float, hints: tuple[str, ...]) -> list[tuple[bytes, bytes]]:
        """The headers that carry a wait, among the configured ``hints``."""

    def ratelimit_headers(self, limits: list[LimitState], wall: float) -> list[tuple[bytes, bytes]]:
        """The rate-limit headers for the limits in force (``wall``: the wall clock's time now)."""

    def response_headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        """Headers every answer of this dialect carries (a request id)."""


def tool_schemas(declared: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each declared tool's input schema as a dict of its own (``{}`` where it declares none)."""
    return {name: dict(schema) if isinstance(schema, Mapping) else {} for name, schema in declared.items()}


def chosen_tool(tools: Mapping[str, dict[str, Any]], named: str | None, *, forced: bool,
                prompt: str) -> tuple[str, dict[str, Any]] | None:
    """``(name, input schema)`` of the tool to call: the one the request's choice ``named`` (when
    declared), else the first when the choice ``forced`` a call or the prompt carries the
    ``[[tool_call]]`` marker; ``None``: answer in text."""
    if named is not None and named in tools:
        return named, tools[named]
    if forced or "[[tool_call]]" in prompt:
        name = next(iter(tools))
        return name, tools[name]
    return None


def tool_schema_refusal(declared: Mapping[str, Any], say: Callable[[str, str], str]) -> str | None:
    """``say(name, problem)`` of the first declared tool whose input schema is malformed, or ``None``
    (a tool without a schema, or with ``{}``, takes any input)."""
    for name, parameters in declared.items():
        problem = response_schema_problem(parameters) if parameters not in (None, {}) else None
        if problem is not None:
            return say(name, problem)
    return None
