"""What every item must satisfy before any call: a prompt that can be sent, a context that can be stored.

Two things are refused at input, on every way in (``process_prompts`` and
friends, ``add_work``, the pool, run sources, the command line's files), so
that they fail once, clearly and before any work, instead of on every attempt
or in the middle of a batch:

* **A lone surrogate in the prompt** (``"\\ud800"``, which JSON's ``\\ud800``
  escape produces): UTF-8 cannot encode it, so no request carrying it can ever
  be sent. A surrogate *pair* is one ordinary character and is fine.
* **A context nested more than** :data:`MAX_NESTING_DEPTH` **levels deep.**
  Hashing, storing and printing a context recurse once per level, and Python's
  stack gives out at about a thousand frames (less the caller's own): a context
  of 200,000 nested lists raises ``RecursionError`` wherever it is first
  touched. 256 levels is far beyond any real data and leaves room for the
  caller's frames. Lists, tuples, dicts (keys too), sets and frozensets (and
  their subclasses) count as levels; other objects are not looked into. A
  context that contains itself nests without end and is refused the same way.

JSON text is checked before it is parsed (:func:`text_nesting_column`),
because ``json.loads`` itself recurses.
"""

from __future__ import annotations

import re
from itertools import compress
from typing import Any, Final

__all__ = [
    "MAX_NESTING_DEPTH",
    "check_item",
    "item_problem",
    "nesting_exceeds",
    "nesting_problem",
    "surrogate_problem",
    "json_line_nesting_column",
    "text_nesting_column",
]

MAX_NESTING_DEPTH: Final = 256
"""The deepest a context may nest (``[]`` is 1 level, ``[[]]`` 2): see the module docstring."""

_CONTAINERS: Final = (dict, list, tuple, set, frozenset)
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})  # what JSON leaves are made of
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
# A string, or an unterminated one up to the end: the match never fails, so the scan stays linear.
_JSON_STRING: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_BRACKET: Final = re.compile(r"[\[\]{}]")


def surrogate_problem(text: str) -> str | None:
    """``"has a lone surrogate (U+D800 at index 3) ..."`` if ``text`` has one, else ``None``."""
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return (f"has a lone surrogate (U+{ord(found.group()):04X} at index {found.start()}), which UTF-8 "
            "cannot encode, so no request can carry it")


def nesting_problem(column: int | None = None) -> str:
    """Why a context (or, with ``column``, a line of JSON text) is refused for its nesting."""
    if column is not None:
        return (f"nested more than {MAX_NESTING_DEPTH} levels deep at column {column} "
                f"(a context may nest at most {MAX_NESTING_DEPTH} levels)")
    return (f"is nested more than {MAX_NESTING_DEPTH} levels deep, or contains itself "
            f"(a context may nest at most {MAX_NESTING_DEPTH} levels)")


def item_problem(prompt: object, context: object) -> tuple[str, str] | None:
    """``(field, problem)`` for the first thing wrong with an item's prompt and context, else ``None``."""
    if isinstance(prompt, str):
        problem = surrogate_problem(prompt)
        if problem is not None:
            return "prompt", problem
    if nesting_exceeds(context, MAX_NESTING_DEPTH):
        return "context", nesting_problem()
    return None


def check_item(item_id: str, prompt: object, context: object, *, where: str | None = None) -> None:
    """Raise ``ValueError`` naming the item (and ``where`` it came from) if :func:`item_problem` finds one."""
    found = item_problem(prompt, context)
    if found is None:
        return
    field, problem = found
    place = f"item_id={item_id!r}" if where is None else f"{where} (item_id={item_id!r})"
    raise ValueError(f"{place}: {field} {problem}")


# --- nesting -----------------------------------------------------------------------------------


def nesting_exceeds(value: object, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` container levels (a cycle nests without end).

    Level by level, never recursing: each level's containers are found among
    the members of the level above with C-speed passes (``map(type, ...)``,
    ``compress``), so a long list of scalars costs no Python-level loop, and a
    container shared by several parents is looked at once per level.
    """
    if not isinstance(value, _CONTAINERS):
        return False
    level: list[Any] = [value]
    for _ in range(limit):
        members: list[Any] = []
        for container in level:
            members.extend(container)  # a dict gives its keys ...
            if isinstance(container, dict):
                members.extend(container.values())  # ... and its values
        kinds = set(map(type, members))
        if kinds <= _SCALARS:
            return False
        kinds = {kind for kind in kinds if issubclass(kind, _CONTAINERS)}
        if not kinds:
            return False
        nested = list(compress(members, map(kinds.__contains__, map(type, members))))
        level = list(dict(zip(map(id, nested), nested, strict=True)).values()) if len(nested) > 1 else nested
    return True


def _blank(string: re.Match[str]) -> str:
    return " " * len(string.group())


def text_nesting_column(text: str, limit: int) -> int | None:
    """The 1-based column where the JSON ``text`` first nests arrays and objects more than ``limit``
    deep, or ``None``; brackets inside strings do not count.

    Fast for ordinary lines: text with at most ``limit`` opening brackets cannot
    exceed it. Otherwise strings are blanked (same length, so columns stay
    true) and the brackets are counted, stopping at the first one too deep.
    """
    if text.count("[") + text.count("{") <= limit:
        return None
    depth = 0
    for bracket in _BRACKET.finditer(_JSON_STRING.sub(_blank, text)):
        if bracket.group() in "[{":
            depth += 1
            if depth > limit:
                return bracket.start() + 1
        else:
            depth -= 1
    return None


def json_line_nesting_column(text: str) -> int | None:
    """:func:`text_nesting_column` for one JSONL line: its object is a level above the context in it."""
    return text_nesting_column(text, MAX_NESTING_DEPTH + 1)
