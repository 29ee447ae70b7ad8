"""The account stage: a call's answer read and checked, and its admission given back with what it used.

:func:`as_triple` reads what ``execute()`` returned (its usage checked inside the attempt);
:func:`release_attempt` is the one place an attempt's admission goes back to its quota scope,
with the tokens it used and what its headers said of the provider's limits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from .._admission import RATE_LIMIT_METADATA_KEY, RateLimitObservation, parse_rate_limit_headers
from .._values._categories import ErrorCategory
from .._values._results import usage_total
from .._values._usage import check_token_usage, used_tokens
from ._breaker_gate import tell_gate
from ._item_run import Usage

if TYPE_CHECKING:
    from .._admission import Admission
    from ._classify import Classification
    from ._item_run import ItemRun

__all__ = ["Answer", "Usage", "as_triple", "rate_limit_observation", "release_attempt"]

Answer: TypeAlias = tuple[object, Usage, object]
"""A call's answer, checked: ``(raw output, token usage, metadata)``."""


def as_triple(returned: tuple[object, ...]) -> Answer:
    """``execute()``'s answer as ``(output, usage, metadata)``; async-batch-llm's ``(output, usage)`` too.

    Its token usage is checked here, inside the attempt: a bad report is that item's failure
    (``TypeError``/``ValueError``: a ``LOGIC_ERROR``), never a crash of the batch."""
    if type(returned) is tuple and len(returned) == 2:
        output, usage = returned
        meta: object = {}
    else:
        output, usage, meta = returned
    check_token_usage(usage, _ANSWER)
    checked: Usage = usage  # type: ignore[assignment]  # a mapping of counts, or None: checked just now
    return output, checked, meta


_ANSWER = "the strategy's answer"


def rate_limit_observation(source: object, now: Callable[[], float]) -> RateLimitObservation | None:
    """What an answer said about the provider's limits, read on the quota scope's clock ``now``.

    ``source`` is a success's metadata or a failure's ``metadata`` attribute: a strategy puts
    the answer's rate-limit headers under ``"rate_limit"`` there. Anything else gives ``None``,
    without reading the clock (the uncontended release needs none).
    """
    if not isinstance(source, Mapping):
        return None
    headers = source.get(RATE_LIMIT_METADATA_KEY)
    if not headers or not isinstance(headers, Mapping):
        return None
    return parse_rate_limit_headers(headers, now())


def release_attempt(
    run: ItemRun[Any],
    held: Admission,
    gated: bool | None,
    usage: Usage,
    *,
    meta: object,
    exc: Exception | None,
    verdict: Classification | None,
) -> float:
    """Give an attempt's admission back: the one place, for every call that returned or raised.

    The rate-limit headers a success's ``meta`` or a failure's ``exc`` carries
    (``metadata["rate_limit"]``) go to the scope as an observation. Returns this item's
    own wait before a retry: non-zero only for a 429 whose headers say capacity remains.
    ``gated``: what its breaker let go (:meth:`ItemRun.released`), told its outcome here.
    A call cut short is released by ``ItemRunner.drive`` instead, with its usage unknown."""
    if gated is not None and run.binding is not None:  # the breaker let it go: its outcome
        tell_gate(run.binding.breaker, gated, run.item.item_id, verdict, exc)
    observation = rate_limit_observation(meta if exc is None else getattr(exc, "metadata", None),
                                         held.now)
    if verdict is not None:
        if verdict.stops_batch is not None or verdict.category is ErrorCategory.SERVER:
            # A per-day quota, a spend limit, an overload (529, 503) or any 5xx: it says nothing about
            # the rate this scope may call at, so no cooldown and no lesson for discovery.
            held.release(usage_total(usage), observation, answered=False, evidence=False)
            return 0.0
        if verdict.category is ErrorCategory.RATE_LIMIT:
            # Cooldown first, then the slot: no waiter slips in ahead of the cooldown.
            return held.release_rate_limited(verdict.retry_after, usage_total(usage), observation)
    held.release(used_tokens(usage), observation)  # its cache reads too: not held against an input budget
    return 0.0
