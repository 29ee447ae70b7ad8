"""The mock server's knobs, what it records, what it counts, and its sliding-window limiter."""

from __future__ import annotations

import math
import re
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import final

from .._values._errors import ConfigurationError

__all__ = [
    "Counters",
    "MockServerConfig",
    "MockServerStats",
    "RecordedRequest",
    "SlidingWindow",
    "mock_token_count",
]


def mock_token_count(text: str) -> int:
    """The mock's tokenizer: one token per four characters, at least one."""
    return max(1, (len(text) + 3) // 4)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MockServerConfig:
    """Knobs of the mock server. Rates are probabilities per request, seeded by ``seed``.

    - ``latency``: seconds before answering, or ``(low, high)`` drawn uniformly per request.
    - ``rate_limit_rate`` / ``retry_after``: injected 429s and the ``Retry-After`` sent
      with injected 429s and 503s (also as ``retry-after-ms``; ``None`` sends none).
    - ``rpm_limit`` / ``tpm_limit``: limits the server *enforces* over a sliding
      ``limit_window`` (60 s): a request that would exceed one gets 429 with the
      exact wait until the window has room. Rejected requests use no quota. A
      request needing more tokens than ``tpm_limit`` gets 400 ``request_too_large``.
    - ``input_tpm_limit`` / ``output_tpm_limit``: input and output tokens per window, enforced
      apart (as Anthropic's ITPM and OTPM are): a request's input tokens, less what it reads from
      Anthropic's prompt cache (cache reads do not count), and its answer's output tokens. Anthropic's
      answers tell them as ``anthropic-ratelimit-input-tokens-*`` / ``-output-tokens-*``; OpenAI has
      no such headers.
    - ``ratelimit_headers``: every completion answer carries its dialect's rate-limit
      headers (OpenAI's ``x-ratelimit-limit/remaining/reset-requests`` and ``-tokens``;
      Anthropic's ``anthropic-ratelimit-requests/tokens-limit/remaining/reset``) for
      the limits that are set, computed from those same windows (see :mod:`._limits`).
    - ``limit_schedule``: ``((at, rpm_limit, tpm_limit), ...)``: from ``at`` seconds after
      the first completion request on, these limits are in force (``None``: no such
      limit); times strictly increasing. Use it to change the limits mid-run.
    - ``calendar_rpm_limit``: requests served per *calendar minute* of the app's wall
      clock (the count starts again at every :00), as some gateways count; a request
      over it gets a 429 that tells nothing: no ``Retry-After``, no rate-limit headers.
      Refused requests use no quota. It binds beside ``rpm_limit`` / ``tpm_limit``.
    - ``retry_after_headers``: which retry hints carry a wait (``retry_after``, or an
      enforced limit's exact wait): ``"retry-after"`` (``Retry-After`` and
      ``retry-after-ms``) and/or ``"llm_provider-retry-after"`` (LiteLLM's proxy
      forwarding a provider's Retry-After, whole seconds); ``()`` sends neither.
    - ``server_error_rate`` / ``server_error_status``: injected 5xx.
    - ``hang_rate``: never answers (until the client disconnects or the server stops).
    - ``reset_rate``: closes the connection without a response.
    - ``malformed_rate``: 200 with a truncated JSON body.
    - ``output_tokens``: ``None`` answers ``"echo: " + prompt``; a number (or range)
      answers that many seeded words, and reports exactly that many completion tokens.
    - ``invalid_json_rate`` / ``schema_violation_rate``: of the requests asking for a JSON
      schema, the share answered with text that is not JSON / JSON that breaks the schema
      (drawn apart from the rates above). ``reject_json_schema``: answer every request asking
      for a JSON schema with 400 ``invalid_json_schema``, as a provider refuses a schema.
    - ``spend_limit_after``: after this many successful answers, every completion request gets the
      dialect's spend-limit refusal (Anthropic: 429 ``enforced_spend_limit_reached``; OpenAI: 429
      ``insufficient_quota``), with no wait: a limit that no retry ends (``[[spend_limit]]`` does it
      for one prompt).
    - ``api_key``: when set, requests must carry it where their dialect carries a key (OpenAI:
      ``Authorization: Bearer <api_key>``; Anthropic: ``x-api-key``), else 401.
    - ``model``: the model name for ``/v1/models`` (answers echo the requested model).
    - ``record_requests``: keep a :class:`RecordedRequest` per request (turn off for huge
      runs; counters are kept either way).

    The Files and Batch APIs (``/v1/files``, ``/v1/batches``; the generic knobs above apply
    to those requests too, except ``malformed_rate``):

    - ``batch_latency``: seconds from a batch's creation until it finishes (at the first
      request at or after that time; there is no background task).
    - ``batch_create_faults``: consumed one per ``POST /v1/batches`` (that passed auth and the
      generic faults), in order, then ``"ok"``: ``"ok"``, ``"error:STATUS"`` (answer that
      status, create nothing), ``"hang_before_create"``, ``"hang_after_create"``,
      ``"reset_after_create"``.
    - ``batch_outcomes``: consumed one per batch that starts running (passed validation and
      the token limit), then ``"completed"``: ``"completed"``, ``"expired"`` (the first half
      of its lines answered, the rest ``batch_expired``), ``"failed"`` (no files).
    - ``batch_list``: ``False`` answers ``GET /v1/batches`` with 404.
    - ``batch_enqueued_token_limit``: input tokens that running batches may hold together; a
      create over it gives a ``failed`` batch with ``token_limit_exceeded``.

    Gemini (:mod:`._gemini_dialect`): ``gemini_daily_request_limit``: past that many
    ``generateContent`` requests in a day of the app's clock, each gets the per-day 429;
    ``gemini_min_cache_tokens``: a ``cachedContents`` create smaller than that is refused
    with Google's 400 (Google's own minimum is 1,024 tokens or more; the mock's default is 1).
    """

    latency: float | tuple[float, float] = 0.0
    rate_limit_rate: float = 0.0
    retry_after: float | None = 1.0
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    input_tpm_limit: int | None = None
    output_tpm_limit: int | None = None
    limit_window: float = 60.0
    ratelimit_headers: bool = False
    limit_schedule: tuple[tuple[float, int | None, int | None], ...] = ()
    calendar_rpm_limit: int | None = None
    retry_after_headers: tuple[str, ...] = ("retry-after",)
    server_error_rate: float = 0.0
    server_error_status: int = 500
    hang_rate: float = 0.0
    reset_rate: float = 0.0
    malformed_rate: float = 0.0
    output_tokens: int | tuple[int, int] | None = None
    invalid_json_rate: float = 0.0
    schema_violation_rate: float = 0.0
    reject_json_schema: bool = False
    seed: int = 0
    api_key: str | None = field(default=None, repr=False)
    model: str | None = None
    record_requests: bool = True
    batch_latency: float = 0.0
    batch_create_faults: tuple[str, ...] = ()
    batch_outcomes: tuple[str, ...] = ()
    batch_list: bool = True
    batch_enqueued_token_limit: int | None = None
    gemini_daily_request_limit: int | None = None
    gemini_min_cache_tokens: int = 1
    spend_limit_after: int | None = None

    def __post_init__(self) -> None:
        rates = {
            "rate_limit_rate": self.rate_limit_rate, "server_error_rate": self.server_error_rate,
            "hang_rate": self.hang_rate, "reset_rate": self.reset_rate, "malformed_rate": self.malformed_rate,
        }
        for name, rate in rates.items():
            if not 0.0 <= rate <= 1.0:
                raise ConfigurationError(name, rate, "must be between 0 and 1")
        if sum(rates.values()) > 1.0 + 1e-9:
            raise ConfigurationError("rates", sum(rates.values()), "the fault rates add up to more than 1")
        for name, rate in (("invalid_json_rate", self.invalid_json_rate),
                           ("schema_violation_rate", self.schema_violation_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ConfigurationError(name, rate, "must be between 0 and 1")
        if self.invalid_json_rate + self.schema_violation_rate > 1.0 + 1e-9:
            raise ConfigurationError("invalid_json_rate", self.invalid_json_rate,
                                     "with schema_violation_rate adds up to more than 1")
        _check_range("latency", self.latency, minimum=0.0)
        if self.output_tokens is not None:
            _check_range("output_tokens", self.output_tokens, minimum=1)
        for name, limit in (("rpm_limit", self.rpm_limit), ("tpm_limit", self.tpm_limit),
                            ("input_tpm_limit", self.input_tpm_limit),
                            ("output_tpm_limit", self.output_tpm_limit)):
            if limit is not None and (not isinstance(limit, int) or limit < 1):
                raise ConfigurationError(name, limit, "must be a positive integer or None")
        calendar = self.calendar_rpm_limit
        if calendar is not None and (isinstance(calendar, bool) or not isinstance(calendar, int)
                                     or calendar < 1):
            raise ConfigurationError("calendar_rpm_limit", calendar, "must be a positive integer or None")
        hints = self.retry_after_headers
        if not isinstance(hints, tuple) or not all(isinstance(h, str) and h in RETRY_HINTS for h in hints):
            raise ConfigurationError("retry_after_headers", hints,
                                     f"must be a tuple of {sorted(RETRY_HINTS)} (or empty)")
        self._check_schedule()
        if not isinstance(self.ratelimit_headers, bool):
            raise ConfigurationError("ratelimit_headers", self.ratelimit_headers, "must be True or False")
        if not self.limit_window > 0:
            raise ConfigurationError("limit_window", self.limit_window, "must be positive")
        if self.retry_after is not None and self.retry_after < 0:
            raise ConfigurationError("retry_after", self.retry_after, "must be non-negative or None")
        if not 500 <= self.server_error_status <= 599:
            raise ConfigurationError("server_error_status", self.server_error_status, "must be a 5xx status")
        self._check_batch_knobs()
        for name, value, low in (("gemini_daily_request_limit", self.gemini_daily_request_limit, 1),
                                 ("gemini_min_cache_tokens", self.gemini_min_cache_tokens, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigurationError(name, value, "must be a whole number >= 1")
        spend = self.spend_limit_after
        if spend is not None and (isinstance(spend, bool) or not isinstance(spend, int) or spend < 0):
            raise ConfigurationError("spend_limit_after", spend, "must be a whole number >= 0 or None")

    def _check_schedule(self) -> None:
        schedule = self.limit_schedule
        if not isinstance(schedule, tuple):
            raise ConfigurationError("limit_schedule", schedule, "must be a tuple of (at, rpm, tpm) tuples")
        previous = -math.inf
        for entry in schedule:
            if not (isinstance(entry, tuple) and len(entry) == 3):
                raise ConfigurationError("limit_schedule", entry, "each change must be (at, rpm, tpm)")
            at, rpm, tpm = entry
            if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at) or at < 0:
                raise ConfigurationError("limit_schedule", entry, "each time must be a finite number >= 0")
            if at <= previous:
                raise ConfigurationError("limit_schedule", entry, "times must be strictly increasing")
            previous = at
            for limit in (rpm, tpm):
                if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                          or limit < 1):
                    raise ConfigurationError("limit_schedule", entry, "limits must be whole numbers >= 1")

    def _check_batch_knobs(self) -> None:
        if not (isinstance(self.batch_latency, int | float) and math.isfinite(self.batch_latency)
                and self.batch_latency >= 0):
            raise ConfigurationError("batch_latency", self.batch_latency, "must be a finite number >= 0")
        for name, values in (("batch_create_faults", self.batch_create_faults),
                             ("batch_outcomes", self.batch_outcomes)):
            if not isinstance(values, tuple):
                raise ConfigurationError(name, values, "must be a tuple of strings")
        for fault in self.batch_create_faults:
            status = _CREATE_ERROR.fullmatch(fault) if isinstance(fault, str) else None
            known = isinstance(fault, str) and fault in CREATE_FAULTS
            if not known and (status is None or not 400 <= int(status.group(1)) <= 599):
                raise ConfigurationError("batch_create_faults", fault,
                                         f"must be one of {sorted(CREATE_FAULTS)} or 'error:NNN' (400-599)")
        for outcome in self.batch_outcomes:
            if not (isinstance(outcome, str) and outcome in BATCH_OUTCOMES):
                raise ConfigurationError("batch_outcomes", outcome,
                                         f"must be one of {sorted(BATCH_OUTCOMES)}")
        limit = self.batch_enqueued_token_limit
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ConfigurationError("batch_enqueued_token_limit", limit,
                                     "must be a positive integer or None")


RETRY_HINTS = frozenset({"retry-after", "llm_provider-retry-after"})
CREATE_FAULTS = frozenset({"ok", "hang_before_create", "hang_after_create", "reset_after_create"})
BATCH_OUTCOMES = frozenset({"completed", "expired", "failed"})
_CREATE_ERROR = re.compile(r"error:(\d{3})")


def _check_range(name: str, value: float | tuple[float, float], *, minimum: float) -> None:
    low, high = value if isinstance(value, tuple) else (value, value)
    if not minimum <= low <= high:
        raise ConfigurationError(name, value, f"must be >= {minimum} (a (low, high) range needs low <= high)")


@final
@dataclass(slots=True, kw_only=True)
class RecordedRequest:
    """One completion request as the server received it (``Authorization`` and api-key headers dropped).

    ``arrival`` is ``anyio.current_time()`` in the serving event loop, and
    ``answered`` the same clock when the response (or a reset) began, ``None``
    while there is none. ``outcome`` is the server's decision: ``ok``, ``hang``,
    ``reset``, ``malformed``, ``error:STATUS`` or ``rate_limited_enforced``
    (``pending`` until decided). ``client_disconnected`` is set when the client
    gave up before an answer.
    """

    method: str
    path: str
    headers: dict[str, str]
    body: object
    arrival: float
    prompt: str | None
    outcome: str = "pending"
    client_disconnected: bool = False
    answered: float | None = None


@final
@dataclass(frozen=True, slots=True)
class MockServerStats:
    """A snapshot of the server's counters.

    ``requests`` counts completion requests received; ``rate_limited`` counts
    every 429 sent, of which ``rate_limited_enforced`` came from the server's own
    RPM/TPM limits (the calendar-minute one included). ``max_served_per_window``
    is the most requests that passed the limiter in any ``limit_window``;
    ``max_arrivals_per_window`` counts every arrival; ``max_served_per_calendar_minute``
    the most served in one calendar minute (counted only with ``calendar_rpm_limit``).
    Token counts cover the 200 answers sent.

    Files and Batch API requests are counted in ``batch_api_requests`` (not in
    ``requests``); the error counters (``rate_limited``, ``server_errors``,
    ``client_errors``), ``resets``, ``hangs``, ``disconnects`` and ``in_flight``
    count them too. ``batches_created`` counts every batch object created (those
    failed at creation included); ``batches_failed`` every batch that ended
    ``failed``, of which ``batches_token_limited`` hit the enqueued token limit.
    ``batch_lines`` counts input lines executed; ``enqueued_tokens`` is what
    running batches hold as of the last request, ``max_enqueued_tokens`` the most
    ever held.
    """

    requests: int
    succeeded: int
    rate_limited: int
    rate_limited_enforced: int
    server_errors: int
    client_errors: int
    malformed: int
    resets: int
    hangs: int
    disconnects: int
    in_flight: int
    max_in_flight: int
    max_arrivals_per_window: int
    max_served_per_window: int
    prompt_tokens: int
    completion_tokens: int
    batch_api_requests: int = 0
    files_uploaded: int = 0
    batches_created: int = 0
    batches_completed: int = 0
    batches_failed: int = 0
    batches_token_limited: int = 0
    batches_expired: int = 0
    batches_cancelled: int = 0
    batch_lines: int = 0
    enqueued_tokens: int = 0
    max_enqueued_tokens: int = 0
    max_served_per_calendar_minute: int = 0


@final
@dataclass(slots=True)
class Counters:
    """What the app counts as it answers (read through :class:`MockServerStats`), and the occurrences
    of each prompt and each Files/Batch endpoint that key its plans."""

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
class SlidingWindow:
    """Weighted events over the last ``length`` seconds; an event at ``t`` leaves at ``t + length``.

    Synchronous and clock-free (callers pass ``now``), so it is exact under a
    virtual clock. Queries do not mutate: asking about a later time and then
    adding at an earlier one is safe. ``add`` expects non-decreasing times.
    """

    def __init__(self, length: float) -> None:
        self.length = length
        self._events: deque[tuple[float, int]] = deque()
        self._held = 0  # the weight in _events, kept as it changes: add() stays O(1) amortized
        self.max_total = 0

    def add(self, now: float, weight: int = 1) -> None:
        events = self._events
        while events and events[0][0] + self.length <= now:
            self._held -= events.popleft()[1]
        events.append((now, weight))
        self._held += weight
        self.max_total = max(self.max_total, self._held)

    def _dead_weight(self, now: float) -> int:
        # Events are in time order, so the ones that left the window are a prefix.
        dead = 0
        for when, weight in self._events:
            if when + self.length > now:
                break
            dead += weight
        return dead

    def held_at(self, now: float) -> tuple[int, float | None]:
        """``(weight in the window at now, time of its newest event)``; ``(0, None)`` when empty."""
        held = self._held - self._dead_weight(now)
        return held, (self._events[-1][0] if held else None)

    def wait_for_room(self, now: float, weight: int, limit: int) -> float:
        """Seconds until ``weight`` more fits under ``limit`` (0 if it fits now)."""
        excess = self._held - self._dead_weight(now) + weight - limit
        if excess <= 0:
            return 0.0
        freed = 0
        for when, event_weight in self._events:
            if when + self.length <= now:
                continue
            freed += event_weight
            if freed >= excess:
                return when + self.length - now
        return self.length
