"""Token usage as a strategy reports it: the keys a :class:`TokenUsage` has, and the check of a report.

A report is ``None`` (unknown) or a mapping of the :class:`TokenUsage` keys to
whole numbers >= 0. Anything else was once summed silently: a key the engine
does not know (``prompt_tokens``, the provider's spelling) counted for nothing,
a negative count lowered the batch's totals and its budget, and a report that is
not a mapping crashed the batch when it was added up. Now it is refused where it
is reported, with an error naming the key and the value: ``ProviderError(token_usage=...)``
at construction, and a strategy's answer in the attempt itself (so it is that
item's failure, a ``LOGIC_ERROR``, and the batch goes on).

The check runs once per answer on the hot path: one pass over the report's few
keys, no allocation unless it fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ._results import TokenUsage

__all__ = ["TOKEN_USAGE_KEYS", "check_token_usage", "token_usage_problem"]

TOKEN_USAGE_KEYS: Final = frozenset(TokenUsage.__optional_keys__)
"""The keys a token usage report may have (all of :class:`TokenUsage`'s)."""
_KNOWN: Final = ", ".join(sorted(TOKEN_USAGE_KEYS))


def token_usage_problem(usage: object) -> tuple[type[Exception], str] | None:
    """``(exception type, what is wrong)`` with a token usage report, or ``None`` when it is fine."""
    if usage is None:
        return None
    if not isinstance(usage, Mapping):
        return TypeError, f"{usage!r:.80} must be a mapping of token counts (a TokenUsage) or None"
    for key, value in usage.items():
        if type(value) is not int or value < 0 or key not in TOKEN_USAGE_KEYS:
            problem = _entry_problem(key, value)
            if problem is not None:
                return problem
    return None


def _entry_problem(key: object, value: object) -> tuple[type[Exception], str] | None:
    if key not in TOKEN_USAGE_KEYS:
        return ValueError, f"has the unknown key {key!r:.80}; a TokenUsage has {_KNOWN}"
    if isinstance(value, bool) or not isinstance(value, int):
        return TypeError, f"[{key!r}]={value!r:.80} must be a whole number (an int) >= 0"
    if value < 0:
        return ValueError, f"[{key!r}]={value!r} must be a whole number >= 0"
    return None  # an int subclass (not bool) >= 0: a count all the same


def check_token_usage(usage: object, where: str) -> None:
    """Raise ``TypeError``/``ValueError`` (``"{where}: token usage ..."``) unless ``usage`` is fine."""
    if usage is None:
        return
    if type(usage) is dict and TOKEN_USAGE_KEYS.issuperset(usage):  # the common case: nothing built
        for value in usage.values():
            if type(value) is not int or value < 0:
                break
        else:
            return
    found = token_usage_problem(usage)
    if found is not None:
        kind, problem = found
        space = "" if problem.startswith("[") else " "
        raise kind(f"{where}: token usage{space}{problem}")
