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

Here too are the two readers the engine sums usage with (:func:`add_usage`,
:func:`usage_total`). A failure's ``token_usage`` may be any exception's
attribute, unchecked, so they read only counts and take anything else as unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["TOKEN_USAGE_KEYS", "UsedTokens", "add_usage", "check_token_usage", "token_usage_problem",
           "usage_total", "used_tokens"]

TOKEN_USAGE_KEYS: Final = frozenset(
    {"input_tokens", "output_tokens", "total_tokens", "cached_input_tokens", "cache_write_input_tokens",
     "reasoning_tokens"}
)
"""The keys a token usage report may have: all of :class:`TokenUsage`'s (a test holds them equal;
``_results`` imports this module, so it cannot be read from the class here)."""
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


def _count(value: object) -> int | None:
    """``value`` when it is a token count (an ``int``, not a ``bool``, >= 0), else ``None``."""
    if type(value) is int:
        return value if value >= 0 else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_total(usage: Mapping[str, Any] | None) -> int | None:
    """Total tokens of ``usage``, or ``None`` when unknown (never a silent zero).

    Strategies' answers and ``ProviderError`` are checked where they are made; a failure's
    ``token_usage`` may be any exception's attribute, so what is not a count is read as unknown.
    """
    if not usage or not isinstance(usage, Mapping):
        return None
    total = _count(usage.get("total_tokens"))
    if total is not None:
        return total
    parts = [_count(usage.get("input_tokens")), _count(usage.get("output_tokens"))]
    if all(p is None for p in parts):
        return None
    return sum(p for p in parts if p is not None)


def add_usage(into: dict[str, int], usage: Mapping[str, Any] | None) -> None:
    """Add ``usage`` into the running sum ``into``, key by key (what is not a count is left out)."""
    if not usage or not isinstance(usage, Mapping):
        return
    for key, value in usage.items():
        if (type(value) is int and value >= 0) or _count(value) is not None:
            into[key] = into.get(key, 0) + value


class UsedTokens(int):
    """A call's real total tokens (an ``int``, as :func:`usage_total`) that says its input tokens and how
    many of them were cache reads: a scope paced by an input-token budget learns from it that cache
    reads do not count against that budget (Anthropic's rule)."""

    input: int
    cached: int

    def __new__(cls, total: int, input_tokens: int, cached: int) -> UsedTokens:
        used = super().__new__(cls, total)
        used.input, used.cached = input_tokens, min(cached, input_tokens)
        return used


def used_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """:func:`usage_total`, as a :class:`UsedTokens` when ``usage`` says its input and cached input."""
    total = usage_total(usage)
    if total is None or not isinstance(usage, Mapping):
        return total
    inputs, cached = _count(usage.get("input_tokens")), _count(usage.get("cached_input_tokens"))
    return total if inputs is None or cached is None else UsedTokens(total, inputs, cached)
