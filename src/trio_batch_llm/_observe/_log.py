"""The library's log messages about a run: one function per message family, one policy.

Loggers are named by module family under ``trio_batch_llm``: ``.engine`` (an
item's retries and failures, a batch's stop), ``.admission`` (a quota scope's
cooldowns and pacing changes), next to the existing ``.cleanup``,
``.artifacts``, ``.observers`` and ``.progress``. The policy (the table is in
``docs/guides/observability.md``):

- a failed attempt that will be retried: DEBUG, per attempt;
- a scope's first 429 and its first cooldown: INFO, with the cause (the
  Retry-After, or the backoff chosen without one); later cooldowns: DEBUG;
- a pacing change: INFO, per scope and change (rare by construction: one per
  limit the provider reports, one per lowering of a discovered rate);
- a scope whose provider has refused every call for a minute: WARNING, once per
  stall (again only after calls flowed and stalled anew);
- a batch's stop (deadline, abort, budget, interruption): INFO, once;
- an item's final failure: WARNING for the first of its category in a batch,
  DEBUG for the rest (:class:`FailureLog`), so a batch of 10,000 items failing
  the same way logs one warning, not 10,000; ``call()`` and ``call_result()``
  log every failure at DEBUG, since their caller holds it.

Records carry the item id, the attempt, the category and the wait; never a
prompt, an output or an exception's message (they may hold user data or a key
a provider echoed back): the exception's type name only. The message is in
the item's result (``error``), which strategies scrub of their keys.
Every field is also on the record (``extra``), for structured handlers.

This module imports nothing but :mod:`logging` and values, so the admission
and engine layers can both use it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from .._values._categories import ErrorCategory

if TYPE_CHECKING:
    from .._values._quota_reports import Pace

__all__ = [
    "ADMISSION_LOGGER",
    "ENGINE_LOGGER",
    "FailureLog",
    "PaceWatch",
    "PacedScope",
    "log_cooldown",
    "log_first_rate_limit",
    "log_retry",
    "log_stall",
    "log_stop",
]

ENGINE_LOGGER: Final = "trio_batch_llm.engine"
ADMISSION_LOGGER: Final = "trio_batch_llm.admission"

engine_logger = logging.getLogger(ENGINE_LOGGER)
admission_logger = logging.getLogger(ADMISSION_LOGGER)


def _error_type(exc: BaseException | None) -> str:
    return "-" if exc is None else type(exc).__name__


def log_retry(item_id: str, attempt: int, category: ErrorCategory, wait: float, exc: BaseException) -> None:
    """DEBUG: attempt ``attempt`` of ``item_id`` failed with ``category``; the next starts after ``wait``."""
    if engine_logger.isEnabledFor(logging.DEBUG):
        engine_logger.debug(
            "item %r: attempt %d failed (%s, %s); retrying after %.3g s",
            item_id, attempt, category.value, _error_type(exc), wait,
            extra={"item_id": item_id, "attempt": attempt, "category": category.value, "wait": wait,
                   "error_type": _error_type(exc)},
        )


def log_stop(kind: str, reason: str, stop_reason: str | None = None, item_id: str | None = None) -> None:
    """INFO: the batch stops (``batch_deadline``, ``aborted``, ``budget_exhausted``, ``interrupted``).

    ``stop_reason`` (what its unfinished items say) and ``item_id`` (the item that decided it)
    go to the record's extras."""
    engine_logger.info("batch stopping (%s): %s", kind, reason,
                       extra={"stop": kind, "reason": reason, "stop_reason": stop_reason, "item_id": item_id})


def _cause(retry_after: float | None, chosen: float) -> str:
    if retry_after is not None:
        return f"429, Retry-After {retry_after:.3g} s"
    return f"429 without Retry-After: backoff of {chosen:.3g} s chosen"


def log_cooldown(scope: str, seconds: float, retry_after: float | None, *, first: bool = True) -> None:
    """A rate limit started a cooldown of ``scope``: no call starts there for ``seconds``.

    INFO for the scope's first cooldown (saying so), DEBUG for the later ones: a provider that
    refuses for hours would otherwise log a line per cooldown; the stall WARNING covers those."""
    level = logging.INFO if first else logging.DEBUG
    if admission_logger.isEnabledFor(level):
        later = "; its later cooldowns are logged at DEBUG" if first else ""
        admission_logger.log(
            level, "quota scope %s: rate limited (%s); no call starts there for %.3g s (cooldown)%s",
            scope, _cause(retry_after, seconds), seconds, later,
            extra={"scope": scope, "wait": seconds, "retry_after": retry_after, "category": "rate_limit",
                   "status": 429},
        )


def log_first_rate_limit(scope: str, retry_after: float | None, wait: float) -> None:
    """INFO: ``scope``'s first 429 changed nothing scope-wide (no cooldown, no lower pace): say so."""
    if wait > 0:
        effect = f"only that call waits {wait:.3g} s (its headers say capacity remains)"
    else:
        effect = "no cooldown (no Retry-After): its items retry as the scope's pace allows"
    cause = f"429, Retry-After {retry_after:.3g} s" if retry_after is not None else "429 without Retry-After"
    admission_logger.info(
        "quota scope %s: first rate limit (%s); %s", scope, cause, effect,
        extra={"scope": scope, "wait": wait, "retry_after": retry_after, "category": "rate_limit",
               "status": 429},
    )


def log_stall(scope: str, seconds: float, refusals: int, waiting: int, in_flight: int) -> None:
    """WARNING, once per stall: every call of ``scope`` has been answered 429 for ``seconds``."""
    admission_logger.warning(
        "quota scope %s: the provider has refused every call for %.0f s (%d 429s in a row; %d calls"
        " waiting, %d in flight); each item gives up after RetryConfig.max_rate_limit_wait",
        scope, seconds, refusals, waiting, in_flight,
        extra={"scope": scope, "stalled": seconds, "refusals": refusals, "waiting": waiting,
               "in_flight": in_flight, "category": "rate_limit"},
    )


def _per_minute(rate: float | None) -> str:
    return "none" if rate is None else f"{rate:.4g}/min"


class PacedScope(Protocol):
    """What :class:`PaceWatch` reads of a quota scope (its :class:`~trio_batch_llm._admission._core.QuotaCore`
    gives both): one record of its pace, and how long its cooldown lasts."""

    def pace(self) -> Pace: ...

    def cooldown_remaining(self, now: float, /) -> float: ...


@final
class PaceWatch:
    """What a quota scope's learning admission knows before a release, to log what the release changed.

    ``before = PaceWatch.of(core)``, release, ``before.log_changes(name, core, now)``:
    a new cooldown (INFO), a discovered request rate that moved (INFO down, DEBUG
    up: it grows a little with every answer), a limit the provider reported for
    the first time or changed (INFO). Reads the scope's :class:`PacedScope` view only.
    """

    __slots__ = ("_before",)

    def __init__(self, before: Pace) -> None:
        self._before = before

    @classmethod
    def of(cls, core: PacedScope) -> PaceWatch:
        return cls(core.pace())

    def log_changes(
        self, scope: str | None, core: PacedScope, now: float, retry_after: float | None = None
    ) -> bool:
        """Log what changed since :meth:`of`; return whether a cooldown or a lower pace was logged at INFO."""
        name = scope or "-"
        before, after = self._before, core.pace()
        said = False
        if after.cooldowns != before.cooldowns:
            first = before.cooldowns == 0
            log_cooldown(name, core.cooldown_remaining(now), retry_after, first=first)
            said = first
        if after.rate != before.rate:
            old = None if before.rate is None else before.rate * 60
            new = None if after.rate is None else after.rate * 60
            lowered = new is not None and (old is None or new < old)
            level = logging.INFO if lowered else logging.DEBUG
            said = said or lowered
            if admission_logger.isEnabledFor(level):
                admission_logger.log(
                    level, "quota scope %s: request pace %s to %s (was %s), learnt from 429s",
                    name, "lowered" if lowered else "raised", _per_minute(new), _per_minute(old),
                    extra={"scope": name, "old_rpm": old, "new_rpm": new, "source": "discovery"},
                )
        for what, old_limit, new_limit in (("requests", before.request_limit, after.request_limit),
                                           ("tokens", before.token_limit, after.token_limit)):
            if new_limit != old_limit:
                admission_logger.info(
                    "quota scope %s: the provider reports a limit of %s %s per window (was %s); pacing by it",
                    name, new_limit, what, "unknown" if old_limit is None else old_limit,
                    extra={"scope": name, "limit": what, "old": old_limit, "new": new_limit,
                           "source": "headers"},
                )
        return said


@final
class FailureLog:
    """One batch's (one pool's) log of final failures: a WARNING for the first of each category.

    The rest of that category go to DEBUG, and :meth:`summary` (INFO, at the
    end) counts them all, so nothing is hidden and nothing floods. Results the
    engine decided for items it never ran or cut short (``not_executed``,
    ``aborted``, ``budget``) are the stop's doing, logged once by :func:`log_stop`;
    replayed failures are history.

    ``quiet=True`` logs every failure at DEBUG: for ``call_result()`` and
    ``call()``, whose caller holds each failure (a result, or an exception)
    and decides what it deserves.
    """

    __slots__ = ("_counts", "_owner", "_quiet")

    def __init__(self, owner: str = "batch", *, quiet: bool = False) -> None:
        self._owner = owner
        self._quiet = quiet
        self._counts: dict[str, int] = {}

    def note(self, item_id: str, category: ErrorCategory | None, attempts: int,
             exc: BaseException | None) -> None:
        if FailureLog.skips(category):
            return
        assert category is not None
        key = category.value
        seen = self._counts.get(key, 0)
        self._counts[key] = seen + 1
        if seen == 0 and not self._quiet:
            engine_logger.warning(
                "item %r failed after %d attempt(s): %s (%s); further %s failures in this %s are"
                " logged at DEBUG", item_id, attempts, key, _error_type(exc), key, self._owner,
                extra=_failure_fields(item_id, attempts, key, exc),
            )
        elif engine_logger.isEnabledFor(logging.DEBUG):  # (a thousand cut at once: nothing built for none)
            engine_logger.debug("item %r failed after %d attempt(s): %s (%s)", item_id, attempts, key,
                                _error_type(exc), extra=_failure_fields(item_id, attempts, key, exc))

    @staticmethod
    def skips(category: ErrorCategory | None) -> bool:
        """Whether :meth:`note` ignores failures of ``category`` (no category, or a stop's verdict)."""
        return category is None or category in _STOP_VERDICTS

    @property
    def counts(self) -> dict[str, int]:
        """Final failures by category so far."""
        return dict(self._counts)

    def summary(self) -> None:
        """INFO, when there were failures: their counts by category."""
        if self._counts:
            text = ", ".join(f"{key}={count}" for key, count in sorted(self._counts.items()))
            engine_logger.info("%s finished with failures: %s", self._owner, text,
                               extra={"failures": dict(self._counts)})


def _failure_fields(item_id: str, attempts: int, key: str, exc: BaseException | None) -> dict[str, Any]:
    return {"item_id": item_id, "attempt": attempts, "category": key, "error_type": _error_type(exc)}


_STOP_VERDICTS: Final = frozenset({ErrorCategory.NOT_EXECUTED, ErrorCategory.ABORTED, ErrorCategory.BUDGET})
