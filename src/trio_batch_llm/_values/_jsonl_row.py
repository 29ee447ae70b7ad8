"""The one reader of a JSONL input row: a line's text to a checked row, or what is wrong with it.

Both JSONL inputs read their lines here: the command line's input file
(``_cli/_input_jsonl.py``, which reads a file in blocks and locates a problem by
file and line) and a durable run's source (``_runs/_source.py``, which reads by
byte offset and locates a problem by entry and byte); each keeps its own way of
reading the file and of naming a place, and they share what a line *means*.

A line is an object ``{"id": ..., "prompt": ..., "context": ...}``
(``context`` optional, any JSON; an integer id is read as its decimal string;
``"item_id"`` may stand for ``"id"``), or ``{"id": ..., "messages": [...], "params": {...}}``
(chat messages instead of ``prompt``, and request parameters, both checked
here; such a row's ``prompt`` is the request as one text, :func:`request_text`,
which its reader unpacks), either with an optional ``"sample"`` (a whole number >= 0:
which sample of its request the item is, part of its response-cache key; the
command line's key only), or a string, the prompt, whose id is generated
(``None`` here: ``item-N``, N counting the items from 0, as ``process_prompts``
does). The keys of an object follow the rule of every reader, :func:`row_problem`:
any other key, both ``prompt`` and ``messages``, or a key given twice
(:func:`repeated_row_key`), is refused, naming the field.

Speed matters here: a million lines are checked before the first call. A
clean object line takes one C-level parse (the decoder's ``scan_once``, half
the cost of ``json.loads``), a key-set test and a few type checks, none of
which accepts a line the full check refuses; every other line takes the full
path, whose messages are ``json``'s own. The command line's hot loop
(``scan_range``) writes the fast path out again with :data:`SCAN`,
:data:`NESTING_CHECK_AT` and :data:`FAST_KEYS`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, final

from ._item_checks import json_line_nesting_column, nesting_problem, surrogate_problem
from ._prompts import REPEATED_KEY_PROBLEM, repeated_row_key, row_problem
from ._requests import check_params, check_prompt, item_id_problem, prompt_text, request_text

__all__ = [
    "FAST_KEYS",
    "NESTING_CHECK_AT",
    "SCAN",
    "Row",
    "RowProblem",
    "decode_row",
    "prompt_problem",
    "read_row",
    "sample_problem",
]

NESTING_CHECK_AT: Final = 258  # a shorter line cannot hold more than 257 brackets
FAST_KEYS: Final = frozenset({"id", "prompt", "context"})
"""The keys of a line the fast path takes: a subset of what :func:`row_problem` allows, with a
``prompt`` and an ``id`` (no ``item_id``, ``messages`` or ``params``, which need the full check)."""


class _NonFinite(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity``: Python's json reads them, strict readers do not."""


def _refuse_constant(literal: str) -> Any:
    raise _NonFinite(literal)


SCAN: Final[Any] = getattr(json.JSONDecoder(parse_constant=_refuse_constant), "scan_once")  # noqa: B009
"""``scan_once(text, 0) -> (value, end)`` of a strict decoder: ``end == len(text)`` when the
whole text is one JSON value (``json.loads`` would also build the value, then look for trailing text)."""

Row = tuple[str | None, str, Any, int]  # (id, prompt, context, sample); id None: generated (item-N)


@final
@dataclass(frozen=True, slots=True)
class RowProblem:
    """What is wrong with a line, and the row's field it is in (``None``: the line as a whole).

    A class of its own, not a tuple, so that it is never taken for a :data:`Row`."""

    problem: str
    field: str | None = None


def decode_row(raw: bytes) -> str | RowProblem:
    """A line's bytes as text, or where they are not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RowProblem(f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})")


def read_row(text: str, *, sample: bool = True, surrogates: bool = True) -> Row | RowProblem | None:
    """The :data:`Row` of one line, its problem, or ``None`` for a blank line.

    A run's source reads with ``sample=False``, which refuses the ``"sample"`` key (a run stores no
    sample yet), and ``surrogates=False``, which leaves a lone surrogate in the id or the prompt to its
    item check (:func:`~.._engine._inputs.to_item` names the item, as it does for an iterable source).
    """
    stripped = text.strip()
    if not stripped:
        return None
    value = plain_row(stripped)
    if value is not None:
        return value["id"], value["prompt"], value.get("context"), 0
    return _full_check(text, stripped, sample, surrogates)


def plain_row(text: str) -> dict[str, Any] | None:
    """The fast path every JSONL reader shares: the decoded object of a line that is a plain row,
    ``None`` for any other line (which then takes the full check, the one that names what is wrong).

    A plain row is ``text`` exactly (no surrounding blanks), without ``\\u`` escapes and short
    enough that nesting cannot be deep: one object whose keys are among :data:`FAST_KEYS`, each
    written once, with a non-blank string ``"id"`` and ``"prompt"``. Such a line needs none of the
    full check's other tests. A lone surrogate can only come from a ``\\u`` escape in a UTF-8 file,
    and a key written twice two ways (``"id"`` and ``"\\u0069d"``) needs one too; with escapes
    excluded, counting each key's spelling finds a repeated key.
    """
    if len(text) > NESTING_CHECK_AT or "\\u" in text:
        return None
    try:
        value, end = SCAN(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    if end != len(text) or type(value) is not dict:
        return None
    item_id, prompt = value.get("id"), value.get("prompt")
    if (type(item_id) is str and type(prompt) is str and item_id.strip() and prompt.strip()
            and value.keys() <= FAST_KEYS and text.count('"id"') == 1 and text.count('"prompt"') == 1
            and ("context" not in value or text.count('"context"') == 1)):
        return value
    return None


def _full_check(text: str, stripped: str, sample: bool, surrogates: bool) -> Row | RowProblem:
    # Nesting is measured before parsing, which recurses per level.
    if len(stripped) > NESTING_CHECK_AT and stripped.count("[") + stripped.count("{") >= NESTING_CHECK_AT:
        column = json_line_nesting_column(text)
        if column is not None:
            return RowProblem(nesting_problem(column))
    try:
        value, end = SCAN(stripped, 0)
    except (StopIteration, ValueError, RecursionError):
        end = -1
    if end != len(stripped):
        return _json_problem(text)
    # Only a \u escape can make a lone surrogate in a UTF-8 file: without one, no line is searched.
    escaped = surrogates and "\\u" in stripped
    if isinstance(value, str):
        problem = _prompt_problem(value, escaped)
        if problem is not None:
            return RowProblem(problem, "prompt")
        return None, value, None, 0
    if not isinstance(value, dict):
        kind = _json_type(value)
        return RowProblem(f'expected an object with "id" and "prompt", or a string; found {kind}')
    # "sample" is the command line's own key (a run's source and process_prompts rows have none yet).
    keys = row_problem({key: item for key, item in value.items() if key != "sample"} if sample else value)
    if keys is not None:
        return RowProblem(keys[1], keys[0])
    repeated = repeated_row_key(stripped, value)
    if repeated is not None:
        return RowProblem(REPEATED_KEY_PROBLEM, repeated)
    item_id, problem = _json_id(value)
    if problem is None and escaped and (found := item_id_problem(item_id)) is not None:
        problem = f"{item_id!r} {found}"
    if problem is not None:
        return RowProblem(problem, "id")
    number = value.get("sample", 0)
    problem = sample_problem(number)
    if problem is not None:
        return RowProblem(problem, "sample")
    if "messages" in value or "params" in value:
        return _request_row(value, item_id, number, escaped)
    prompt = value.get("prompt")
    problem = _prompt_problem(prompt, escaped)
    if problem is not None or not isinstance(prompt, str):
        return RowProblem(problem or "missing", "prompt")
    return item_id, prompt, value.get("context"), number


def _request_row(value: dict[str, Any], item_id: str | None, sample: int, escaped: bool) -> Row | RowProblem:
    """A line with ``messages`` and/or ``params``: checked, and kept as one request text."""
    field = "messages" if "messages" in value else "prompt"
    prompt = value[field]
    try:
        if field == "prompt":
            problem = _prompt_problem(prompt, escaped)
            if problem is not None:
                return RowProblem(problem, "prompt")
        else:
            if isinstance(prompt, str):
                raise TypeError('must be a list of chat messages (a text prompt goes in "prompt")')
            prompt = check_prompt(prompt, "messages")
            text_problem = surrogate_problem(prompt_text(prompt)) if escaped else None
            if text_problem is not None:
                return RowProblem(text_problem, "messages")
    except (TypeError, ValueError) as exc:
        return RowProblem(str(exc).removeprefix("messages: "), field)
    try:
        params = check_params(value.get("params"), "params")
    except (TypeError, ValueError) as exc:
        return RowProblem(str(exc).removeprefix("params: "), "params")
    return item_id, request_text(prompt, params), value.get("context"), sample


def _json_problem(text: str) -> RowProblem:
    """The error json.loads gives for ``text`` (the slow path: only lines that are not clean JSON)."""
    try:
        json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        return RowProblem(f"invalid JSON: {exc.msg} (column {exc.colno})")
    except _NonFinite as exc:
        problem = f"{exc} is not JSON (strict JSON has no NaN or Infinity; write null or a string)"
        return RowProblem(problem, _non_finite_field(text))
    except RecursionError:
        return RowProblem(nesting_problem())
    return RowProblem("invalid JSON")  # pragma: no cover - scan_once agreed


def _non_finite_field(text: str) -> str | None:
    """The top-level field holding a non-finite number (the error path only)."""
    marker = object()
    try:
        value = json.loads(text, parse_constant=lambda _: marker)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    for key, item in value.items():
        stack = [item]
        while stack:
            current = stack.pop()
            if current is marker:
                return str(key)
            if isinstance(current, dict):
                stack.extend(current.values())
            elif isinstance(current, list):
                stack.extend(current)
    return None


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", bool: "a boolean", int: "a number",
             float: "a fractional number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _json_id(obj: dict[str, Any]) -> tuple[str, str | None]:
    """The object's id (``"id"``, or ``"item_id"`` as the API reads it) as a string, or why it has none."""
    key = "item_id" if "item_id" in obj else "id"
    if key not in obj:
        return "", "missing"
    value = obj[key]
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value), None
    if not isinstance(value, str):
        return "", f"must be a string or an integer, not {_json_type(value)}"
    if not value.strip():
        return "", "is empty"
    return value, None


def _prompt_problem(value: object, escaped: bool = True) -> str | None:
    if value is None:
        return "missing"
    if not isinstance(value, str):
        return f"must be a string, not {_json_type(value)}"
    if not value.strip():
        return "is empty"
    return surrogate_problem(value) if escaped else None


def prompt_problem(value: object) -> str | None:
    """Why ``value`` cannot be a prompt, or ``None`` (the CSV reader shares the rule)."""
    return _prompt_problem(value)


def sample_problem(value: object) -> str | None:
    """Why ``value`` cannot be a row's ``"sample"`` (a whole number >= 0), or ``None``."""
    if type(value) is not int or value < 0:
        return f"must be a whole number >= 0 (which sample of the request the item is), not {value!r:.40}"
    return None
