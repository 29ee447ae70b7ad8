"""Frozen, validated configuration records (backoff arithmetic: :mod:`._backoff`; prices: :mod:`._cost`).

Every record validates itself at construction and raises
:class:`ConfigurationError` naming the field and the offending value, so a bad
setting fails before any work starts.
"""

from __future__ import annotations

import enum
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, final

from . import _backoff
from ._artifact_identity import ArtifactIdentity as ArtifactIdentity
from ._breaker_config import CircuitBreakerConfig, check_circuit_breaker
from ._categories import ErrorCategory
from ._checks import fraction, non_negative, positive, whole
from ._config_warnings import warn_if_suspicious
from ._cost import run_cost_function
from ._errors import ConfigurationError
from ._quota_backend import RedisQuotaBackend
from ._ramp import StartupRampConfig
from ._response_cache import CacheMode, ResponseCache, as_response_cache, check_cache_mode
from ._token_estimates import RequestTokens, TokenEstimate, default_token_estimator

if TYPE_CHECKING:
    from ._results import TokenUsage

__all__ = [
    "FROM_CONFIG",
    "AbortMode",
    "ArtifactIdentity",
    "FromConfig",
    "GuardrailConfig",
    "ProcessorConfig",
    "RateLimitConfig",
    "ResumePolicy",
    "RetryConfig",
]

DEFAULT_WORKERS: Final = 5


@final
class FromConfig(enum.Enum):
    """The default of a processor argument that :class:`ProcessorConfig` has too: the config's value."""

    VALUE = "from config"


FROM_CONFIG: Final = FromConfig.VALUE


class AbortMode(enum.Enum):
    """What a guardrail abort does to calls already in flight."""

    DRAIN_ACTIVE = "drain_active"
    """Stop admitting new items; let calls in flight finish."""
    CANCEL_ACTIVE = "cancel_active"
    """Stop admitting and cancel calls in flight."""


class ResumePolicy(enum.Enum):
    """Which stored results a run may replay instead of calling again."""

    NONE = "none"
    """Refuse a store that already holds results."""
    REUSE_SUCCESSES = "reuse_successes"
    """Replay stored successes; rerun everything else."""
    REUSE_ALL = "reuse_all"
    """Also replay terminal provider failures; engine verdicts always rerun."""


@final
@dataclass(frozen=True, slots=True)
class RetryConfig:
    """Retry budgets and exponential backoff with full jitter.

    Rate-limit failures draw on ``max_rate_limit_retries`` and do not use up
    ``max_attempts``; a provider's Retry-After wins when it is larger than the
    computed backoff. ``max_rate_limit_wait`` bounds one item's time throttled by 429s (whichever first).
    """

    max_attempts: int = 3
    initial_wait: float = 1.0
    max_wait: float = 60.0
    exponential_base: float = 2.0
    jitter: bool = True
    max_rate_limit_retries: int = 20
    respect_retry_after: bool = True
    jitter_seed: int | None = None
    """Seed for the jitter, drawn per item (``Random(f"{seed}\\0{item_id}")``); ``None`` is unseeded."""
    max_rate_limit_wait: float | None = 600.0
    """Seconds one item may wait throttled by 429s in all (docs/guides/retries.md); ``None``: unbounded."""

    def __post_init__(self) -> None:
        whole("max_attempts", self.max_attempts, minimum=1, allow_none=False)
        non_negative("initial_wait", self.initial_wait)
        non_negative("max_wait", self.max_wait)
        if self.max_wait < self.initial_wait:
            raise ConfigurationError("max_wait", self.max_wait, "must be >= initial_wait")
        positive("exponential_base", self.exponential_base, allow_none=False)
        if self.exponential_base < 1:
            raise ConfigurationError("exponential_base", self.exponential_base, "must be >= 1")
        whole("max_rate_limit_retries", self.max_rate_limit_retries, minimum=0, allow_none=False)
        positive("max_rate_limit_wait", self.max_rate_limit_wait)

    def backoff_ceiling(self, retry_number: int) -> float:
        """The largest wait before retry ``retry_number`` (0 for the first retry)."""
        return _backoff.ceiling(retry_number, initial_wait=self.initial_wait,
                                exponential_base=self.exponential_base, max_wait=self.max_wait)

    def backoff(self, retry_number: int, rng: random.Random | None = None) -> float:
        """The wait before retry ``retry_number``: ``uniform(0, ceiling)`` with jitter."""
        return _backoff.jittered(self.backoff_ceiling(retry_number), jitter=self.jitter, rng=rng)

    def wait_before_retry(
        self, retry_number: int, retry_after: float | None, rng: random.Random | None = None
    ) -> float:
        """Backoff for ``retry_number``, raised to ``retry_after`` when that is larger."""
        return _backoff.at_least(self.backoff(retry_number, rng),
                                 retry_after if self.respect_retry_after else None)


@final
@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    """How a quota scope answers rate limits: learning the provider's limits, and the shared cooldown.

    With ``learn_limits`` (the default) a scope paces itself by the rate-limit
    headers its provider sends (requests and tokens left, and when they
    reset), and without them discovers the limit from 429s: the admitted rate
    drops to ``discovery_decrease`` times itself on a 429 and climbs back
    linearly over ``discovery_recovery_seconds``. A 429 whose headers say
    capacity remains is a blip for that one call (retried after its
    Retry-After, else ``blip_retry_seconds``). A cooldown pauses the whole
    scope only when the provider asked for a wait (Retry-After). Configured
    RPM/TPM stay upper bounds either way.

    With ``learn_limits=False`` every 429 starts (or joins) the scope's
    cooldown: ``cooldown_seconds`` (or the provider's Retry-After when given),
    multiplied by ``backoff_multiplier`` for each further storm within a
    cooldown's aftermath, up to ``max_cooldown_seconds``.

    After any cooldown, admission reopens gradually: the scope's concurrency
    starts at ``slow_start_initial_fraction`` of its bound and grows linearly
    back to the bound over ``slow_start_seconds``.
    """

    cooldown_seconds: float = 5.0
    backoff_multiplier: float = 2.0
    max_cooldown_seconds: float = 120.0
    slow_start_seconds: float = 10.0
    slow_start_initial_fraction: float = 0.25
    learn_limits: bool = True
    """Pace by the provider's rate-limit headers and discover limits without them."""
    pacing_margin: float = 0.005
    """The share of each reported limit left unused before its reset (at least one call's worth)."""
    discovery_decrease: float = 0.8
    """On a 429 without headers, the discovered rate becomes this fraction of itself."""
    discovery_recovery_seconds: float = 20.0
    """Seconds the additive increase takes to climb back to the rate before a decrease."""
    discovery_probe: float = 0.05
    """Past the rate before the last decrease, the discovered rate grows by this fraction of it per window."""
    discovery_min_rpm: float = 1.0
    """The discovered rate never falls below this many requests per minute."""
    blip_retry_seconds: float = 1.0
    """The wait of a call whose 429 said capacity remains, when it carried no Retry-After."""

    def __post_init__(self) -> None:
        non_negative("cooldown_seconds", self.cooldown_seconds)
        positive("backoff_multiplier", self.backoff_multiplier, allow_none=False)
        if self.backoff_multiplier < 1:
            raise ConfigurationError("backoff_multiplier", self.backoff_multiplier, "must be >= 1")
        non_negative("max_cooldown_seconds", self.max_cooldown_seconds)
        if self.max_cooldown_seconds < self.cooldown_seconds:
            raise ConfigurationError(
                "max_cooldown_seconds", self.max_cooldown_seconds, "must be >= cooldown_seconds"
            )
        non_negative("slow_start_seconds", self.slow_start_seconds)
        fraction("slow_start_initial_fraction", self.slow_start_initial_fraction, low_open=True, high=1.0)
        if not isinstance(self.learn_limits, bool):
            raise ConfigurationError("learn_limits", self.learn_limits, "must be True or False")
        fraction("pacing_margin", self.pacing_margin, low_open=False, high=0.5)
        fraction("discovery_decrease", self.discovery_decrease, low_open=True, high=1.0, high_open=True)
        positive("discovery_recovery_seconds", self.discovery_recovery_seconds, allow_none=False)
        positive("discovery_min_rpm", self.discovery_min_rpm, allow_none=False)
        fraction("discovery_probe", self.discovery_probe, low_open=True, high=1.0)
        non_negative("blip_retry_seconds", self.blip_retry_seconds)


@final
@dataclass(frozen=True, slots=True)
class GuardrailConfig:
    """Deadlines, fail-fast categories and spending caps for a batch.

    A budget fails closed: when ``cost_function`` raises, or returns anything
    but a finite real number >= 0 (NaN, an infinity, a negative number, a
    bool, a string, an int too large for a float), the spend is unknown and
    the batch stops as ``budget_exhausted``, its reason naming the value and
    the item; every item still gets its one result.
    """

    total_timeout_per_item: float | None = None
    batch_timeout: float | None = None
    abort_on_error_categories: frozenset[ErrorCategory] = frozenset()
    abort_mode: AbortMode = AbortMode.DRAIN_ACTIVE
    max_total_tokens: int | None = None
    max_total_cost: float | None = None
    cost_function: Callable[[TokenUsage], float] | None = None

    def __post_init__(self) -> None:
        positive("total_timeout_per_item", self.total_timeout_per_item)
        positive("batch_timeout", self.batch_timeout)
        categories: object = self.abort_on_error_categories
        if isinstance(categories, (str, ErrorCategory)) or not isinstance(categories, Iterable):
            raise ConfigurationError(
                "abort_on_error_categories", categories, "must be a collection of ErrorCategory"
            )
        try:
            normalized = frozenset(ErrorCategory(c) for c in categories)
        except ValueError:
            raise ConfigurationError(
                "abort_on_error_categories", categories, "holds a value that is not an ErrorCategory"
            ) from None
        object.__setattr__(self, "abort_on_error_categories", normalized)
        if not isinstance(self.abort_mode, AbortMode):
            raise ConfigurationError("abort_mode", self.abort_mode, "must be an AbortMode")
        whole("max_total_tokens", self.max_total_tokens, minimum=1)
        if self.max_total_cost is not None:
            non_negative("max_total_cost", self.max_total_cost)
            if self.cost_function is None:
                raise ConfigurationError("cost_function", None, "is required when max_total_cost is set")
        if self.cost_function is not None and not callable(self.cost_function):
            raise ConfigurationError(
                "cost_function", self.cost_function, "must be callable: token usage -> cost (a number >= 0)"
            )

    def item_cost(self, usage: TokenUsage) -> float:
        """``cost_function(usage)`` as a float; :class:`~._cost.InvalidCost` when it is not a valid cost
        (its ``__cause__`` is the exception ``cost_function`` raised, if it raised)."""
        assert self.cost_function is not None
        return run_cost_function(self.cost_function, usage)


@final
@dataclass(frozen=True, slots=True)
class ProcessorConfig:
    """How a processor, pool or one-shot call runs its items.

    ``concurrency`` is the one knob most users set: it sizes the workers, the
    provider admission bound and connection pools. ``max_workers`` is the
    async-batch-llm spelling of the same thing; set one or the other (or both
    to the same value).
    """

    concurrency: int | None = None
    max_workers: int | None = None
    attempt_timeout: float | None = 120.0
    retry: RetryConfig = field(default_factory=RetryConfig)
    rate_limit: RateLimitConfig = field(default_factory=RateLimitConfig)
    guardrails: GuardrailConfig = field(default_factory=GuardrailConfig)
    max_requests_per_minute: float | None = None
    max_tokens_per_minute: int | None = None
    token_estimator: Callable[[str], int | TokenEstimate] | None = None
    """The input estimate of a prompt's text for TPM admission: an ``int`` (the request's
    ``max_output_tokens`` is added) or a :class:`TokenEstimate` (used whole). ``None``: tiktoken
    when installed and it knows the model, else about four characters a token."""
    max_queue_size: int = 0
    max_result_queue_size: int = 0
    max_provider_concurrency: int | None = None
    progress_interval: float = 0.5
    post_processor_timeout: float | None = 30.0
    startup_ramp: StartupRampConfig | None = None
    quota_backend: RedisQuotaBackend | None = None
    """Where quota scopes keep shared state: ``None`` (in this process) or a :class:`RedisQuotaBackend`."""
    circuit_breaker: CircuitBreakerConfig | None = field(default_factory=CircuitBreakerConfig)
    """Each quota scope's circuit breaker (fail closed when the endpoint is unusable); ``None``: off."""
    cache: ResponseCache | str | os.PathLike[str] | None = None
    """The response cache (:class:`SqliteResponseCache`, :class:`PostgresResponseCache`,
    :class:`RedisResponseCache`, or a SQLite path / ``postgresql://`` / ``redis://`` URL); ``None``: none."""
    cache_mode: CacheMode = "read-write"
    """How the cache is used: ``read-write``, ``read-only``, ``write-only`` or ``refresh``."""
    observer_timeout: float | None = 5.0
    """Seconds one call of an async observer may take (then it is cancelled, logged once, counted),
    and what the owner's close gives its async observers in all to take their queued events;
    ``None``: unbounded."""
    cache_refusals: bool = False
    """Cache answers that are refusals (``details.refusal``) too; by default a refusal is asked again."""

    def __post_init__(self) -> None:
        if self.quota_backend is not None and not isinstance(self.quota_backend, RedisQuotaBackend):
            raise ConfigurationError("quota_backend", self.quota_backend,
                                     "must be a RedisQuotaBackend or None")
        whole("concurrency", self.concurrency, minimum=1)
        whole("max_workers", self.max_workers, minimum=1)
        if (
            self.concurrency is not None
            and self.max_workers is not None
            and self.concurrency != self.max_workers
        ):
            raise ConfigurationError(
                "max_workers",
                self.max_workers,
                f"conflicts with concurrency={self.concurrency}; set one of them",
            )
        positive("attempt_timeout", self.attempt_timeout)
        for name, kind in (("retry", RetryConfig), ("rate_limit", RateLimitConfig),
                           ("guardrails", GuardrailConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ConfigurationError(name, getattr(self, name), f"must be a {kind.__name__}")
        positive("max_requests_per_minute", self.max_requests_per_minute)
        whole("max_tokens_per_minute", self.max_tokens_per_minute, minimum=1)
        if self.token_estimator is not None and not callable(self.token_estimator):
            raise ConfigurationError("token_estimator", self.token_estimator, "must be callable")
        whole("max_queue_size", self.max_queue_size, minimum=0, allow_none=False)
        whole("max_result_queue_size", self.max_result_queue_size, minimum=0, allow_none=False)
        whole("max_provider_concurrency", self.max_provider_concurrency, minimum=1)
        positive("progress_interval", self.progress_interval, allow_none=False)
        positive("post_processor_timeout", self.post_processor_timeout)
        if self.startup_ramp is not None and not isinstance(self.startup_ramp, StartupRampConfig):
            raise ConfigurationError("startup_ramp", self.startup_ramp, "must be a StartupRampConfig")
        check_circuit_breaker(self.circuit_breaker)
        object.__setattr__(self, "cache", as_response_cache(self.cache))
        check_cache_mode(self.cache_mode)
        positive("observer_timeout", self.observer_timeout)
        if not isinstance(self.cache_refusals, bool):
            raise ConfigurationError("cache_refusals", self.cache_refusals, "must be True or False")
        warn_if_suspicious(self)

    @property
    def response_cache(self) -> ResponseCache | None:
        """:attr:`cache` as the :class:`ResponseCache` it was made into (a path or URL given is parsed)."""
        return self.cache if isinstance(self.cache, ResponseCache) else None

    @property
    def workers(self) -> int:
        """The number of workers (and the default provider concurrency bound)."""
        if self.concurrency is not None:
            return self.concurrency
        if self.max_workers is not None:
            return self.max_workers
        return DEFAULT_WORKERS

    @property
    def provider_concurrency(self) -> int:
        """Calls in flight allowed per quota scope."""
        if self.max_provider_concurrency is not None:
            return min(self.max_provider_concurrency, self.workers)
        return self.workers

    def post_processor_timeout_for(self, given: float | FromConfig | None) -> float | None:
        """The processor's ``post_processor_timeout=`` when given, else this config's."""
        return self.post_processor_timeout if given is FROM_CONFIG else given

    def estimate_tokens(self, prompt: str) -> int:
        """The tokens reserved for ``prompt`` with no request parameters and no tokenizer."""
        if self.token_estimator is None:
            return default_token_estimator(prompt)
        return RequestTokens(self.token_estimator)(prompt)
