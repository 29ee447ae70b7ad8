"""The first line of a batch's summary: how the batch ended, in words a person reads.

``BatchTermination.kind`` is a name for programs (``batch_deadline``,
``budget_exhausted``, ...); the summaries of :meth:`BatchResult.summary` and of
the command line share this one line, so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ._results import BatchTermination

__all__ = ["termination_headline"]

# The stops a guardrail or the provider decided: "stopped", and what stopped it when the reason is lost.
_STOPPED: Final[Mapping[str, str]] = {
    "batch_deadline": "batch deadline reached",
    "budget_exhausted": "budget spent",
    "provider_retired": "provider retired",
}


def termination_headline(termination: BatchTermination) -> str:
    """``Batch completed``, ``Batch stopped: batch deadline (30.0 s) reached``, ``Batch interrupted
    (interrupted by SIGINT)``: the kind in plain words, then the reason."""
    kind, reason = termination.kind, termination.reason
    what = _STOPPED.get(kind)
    if what is None:  # completed, interrupted, aborted: already words
        return f"Batch {kind}" + (f" ({reason})" if reason else "")
    if not reason:
        return f"Batch stopped: {what}"
    if kind == "budget_exhausted":  # its reason names the setting (max_total_tokens=...), not the budget
        return f"Batch stopped: {what} ({reason})"
    return f"Batch stopped: {reason}"
