"""The command line's JSONL input: one JSON value per line, read fast and checked line by line.

A line is an object ``{"id": ..., "prompt": ..., "context": ...}``
(``context`` optional, any JSON; an integer id is read as its decimal string;
``"item_id"`` may stand for ``"id"``), or ``{"id": ..., "messages": [...], "params": {...}}``
(chat messages instead of ``prompt``, and request parameters, both checked
here; such a record's ``prompt`` is the request as one text, ``request_text``,
which the run unpacks), either with an optional ``"sample"`` (a whole number >= 0:
which sample of its request the item is, part of its response-cache key), or a
string, the prompt, whose id is ``item-N`` (N counts the items from 0, as
``process_prompts`` does). Blank lines are skipped.
The keys of an object follow the rule of every reader, :func:`row_problem`
(the API's and a run's source's), plus ``"sample"``: any other key, both ``prompt`` and
``messages``, or a key given twice (:func:`repeated_row_key`), is refused,
naming the line and the field.

Speed matters here: a million lines are checked before the first call. The
file is read and decoded a few MiB at a time, and a clean object line takes
one C-level parse (the decoder's ``scan_once``, half the cost of
``json.loads``), a key-set test and a few type checks (:func:`classify_line`),
none of which accepts a line the full check refuses; every other
line takes the full path, whose messages are ``json``'s own. A byte range
of the file can be checked on its own (:func:`scan_range`), so that
:mod:`._input_scan` can check a big file on several cores.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, final

from .._values._item_checks import json_line_nesting_column, nesting_problem, surrogate_problem
from .._values._prompts import REPEATED_KEY_PROBLEM, repeated_row_key, row_problem
from .._values._requests import check_params, check_prompt, item_id_problem, prompt_text, request_text
from ._input_records import MAX_REPORTED, InputError, InputRecord, sample_problem

__all__ = [
    "JsonlPart",
    "classify_line",
    "jsonl_blocks",
    "jsonl_entries",
    "jsonl_lines",
    "prompt_problem",
    "scan_range",
]

_BLOCK: Final = 1 << 22
"""Bytes read at a time by the checking pass (fewer, larger reads: it is the hot path)."""
_FEED_BLOCK: Final = 1 << 20
"""Bytes read at a time while the run takes the items: a block's lines are held until the run has
taken them all, so a smaller block keeps the run's footprint small."""
_NESTING_CHECK_AT: Final = 258  # a shorter line cannot hold more than 257 brackets
_FAST_KEYS: Final = frozenset({"id", "prompt", "context"})
"""The keys of a line the fast path takes: a subset of what :func:`row_problem` allows, with a
``prompt`` and an ``id`` (no ``item_id``, ``messages`` or ``params``, which need the full check)."""


class _NonFinite(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity``: Python's json reads them, strict readers do not."""


def _refuse_constant(literal: str) -> Any:
    raise _NonFinite(literal)


_SCAN: Final[Any] = getattr(json.JSONDecoder(parse_constant=_refuse_constant), "scan_once")  # noqa: B009


def _decode_line(path: Path, raw: bytes, number: int) -> str | InputError:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return InputError(path, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})",
                          line=number)


def jsonl_blocks(
    path: Path, start: int = 0, end: int | None = None, *, block_size: int = _BLOCK
) -> Iterator[tuple[int, list[str | InputError]]]:
    """The lines of bytes ``[start, end)`` (which begin a line), a few MiB at a time: ``(number of
    the first, lines)``, numbered from 1, without line endings (a line of JSON is all one line), a
    line's UTF-8 problem in place of its text. A file that cannot be read raises :class:`InputError`."""
    try:
        with path.open("rb") as f:
            f.seek(start)
            left = -1 if end is None else end - start
            number, rest = 0, b""
            while left != 0:
                block = f.read(block_size if left < 0 else min(block_size, left))
                if not block:
                    break
                left = left - len(block) if left > 0 else left
                block = rest + block
                cut = block.rfind(b"\n") + 1
                if cut == 0:
                    rest = block
                    continue
                rest = block[cut:]
                try:
                    lines: list[str | InputError] = list(block[:cut].decode("utf-8").split("\n"))
                except UnicodeDecodeError:
                    lines = [_decode_line(path, raw, number + n)
                             for n, raw in enumerate(block[:cut].split(b"\n"), start=1)]
                lines.pop()  # what follows the last newline: nothing
                if start == 0 and number == 0:
                    lines[0] = _no_bom(lines[0])
                yield number + 1, lines
                number += len(lines)
            if rest:  # a last line without its newline
                text = _decode_line(path, rest, number + 1)
                yield number + 1, [_no_bom(text) if start == 0 and number == 0 else text]
    except OSError as exc:
        raise InputError(path, f"cannot read it: {exc.strerror or exc}") from None


def jsonl_lines(path: Path, *, block_size: int = _FEED_BLOCK) -> Iterator[tuple[int, str | InputError]]:
    """``(line number, text)`` of :func:`jsonl_blocks`, one line at a time."""
    for first, lines in jsonl_blocks(path, block_size=block_size):
        yield from enumerate(lines, start=first)


def _no_bom(text: str | InputError) -> str | InputError:
    return text[1:] if isinstance(text, str) and text.startswith("\ufeff") else text


Row = tuple[str | None, str, Any, int]  # (id, prompt, context, sample); id None: generated (item-N)


def classify_line(path: Path, text: str, number: int) -> Row | InputError | None:
    """The :data:`Row` of one line, its problem, or ``None`` for a blank line."""
    stripped = text.strip()
    if not stripped:
        return None
    if len(stripped) <= _NESTING_CHECK_AT and "\\u" not in stripped:  # the fast path
        try:
            value, end = _SCAN(stripped, 0)
        except (StopIteration, ValueError, RecursionError):
            end = -1
        if end == len(stripped) and type(value) is dict:
            item_id, prompt = value.get("id"), value.get("prompt")
            if (type(item_id) is str and type(prompt) is str and item_id.strip() and prompt.strip()
                    and value.keys() <= _FAST_KEYS and _keys_once(stripped, value)):
                return item_id, prompt, value.get("context"), 0
    return _full_check(path, text, stripped, number)


def _keys_once(text: str, value: dict[str, Any]) -> bool:
    """The fast path's test that no key of the line was given twice (:func:`repeated_row_key`'s
    cheap half: a line without ``\\u`` escapes writes each key one way only)."""
    return (text.count('"id"') == 1 and text.count('"prompt"') == 1
            and ("context" not in value or text.count('"context"') == 1))


def _full_check(path: Path, text: str, stripped: str, number: int) -> Row | InputError:
    # Nesting is measured before parsing, which recurses per level.
    if len(stripped) > _NESTING_CHECK_AT and stripped.count("[") + stripped.count("{") >= _NESTING_CHECK_AT:
        column = json_line_nesting_column(text)
        if column is not None:
            return InputError(path, nesting_problem(column), line=number)
    try:
        value, end = _SCAN(stripped, 0)
    except (StopIteration, ValueError, RecursionError):
        end = -1
    if end != len(stripped):
        return _json_problem(path, text, number)
    escaped = "\\u" in stripped  # only a \u escape can make a lone surrogate in a UTF-8 file
    if isinstance(value, str):
        problem = _prompt_problem(value, escaped)
        if problem is not None:
            return InputError(path, problem, line=number, field="prompt")
        return None, value, None, 0
    if not isinstance(value, dict):
        return InputError(path, f'expected an object with "id" and "prompt", or a string; '
                                f"found {_json_type(value)}", line=number)
    # "sample" is the command line's own key (a run's source and process_prompts rows have none yet).
    keys = row_problem({key: item for key, item in value.items() if key != "sample"})
    if keys is not None:
        return InputError(path, keys[1], line=number, field=keys[0])
    repeated = repeated_row_key(stripped, value)
    if repeated is not None:
        return InputError(path, REPEATED_KEY_PROBLEM, line=number, field=repeated)
    item_id, problem = _json_id(value)
    if problem is None and escaped and (found := item_id_problem(item_id)) is not None:
        problem = f"{item_id!r} {found}"
    if problem is not None:
        return InputError(path, problem, line=number, field="id")
    sample = value.get("sample", 0)
    problem = sample_problem(sample)
    if problem is not None:
        return InputError(path, problem, line=number, field="sample")
    if "messages" in value or "params" in value:
        return _request_line(path, value, item_id, number, sample)
    prompt = value.get("prompt")
    problem = _prompt_problem(prompt, escaped)
    if problem is not None or not isinstance(prompt, str):
        return InputError(path, problem or "missing", line=number, field="prompt")
    return item_id, prompt, value.get("context"), sample


def _request_line(path: Path, value: dict[str, Any], item_id: str | None,
                  number: int, sample: int) -> Row | InputError:
    """A line with ``messages`` and/or ``params``: checked, and kept as one request text."""
    field = "messages" if "messages" in value else "prompt"
    prompt = value[field]
    try:
        if field == "prompt":
            problem = _prompt_problem(prompt, True)
            if problem is not None:
                return InputError(path, problem, line=number, field="prompt")
        else:
            if isinstance(prompt, str):
                raise TypeError('must be a list of chat messages (a text prompt goes in "prompt")')
            prompt = check_prompt(prompt, "messages")
            text_problem = surrogate_problem(prompt_text(prompt))
            if text_problem is not None:
                return InputError(path, text_problem, line=number, field="messages")
    except (TypeError, ValueError) as exc:
        return InputError(path, str(exc).removeprefix("messages: "), line=number, field=field)
    try:
        params = check_params(value.get("params"), "params")
    except (TypeError, ValueError) as exc:
        return InputError(path, str(exc).removeprefix("params: "), line=number, field="params")
    return item_id, request_text(prompt, params), value.get("context"), sample


def jsonl_entries(path: Path) -> Iterator[InputRecord | InputError]:
    """Every record of the file, or the problem of its line, in order."""
    index = 0  # items so far: the N of a generated id item-N
    for number, text in jsonl_lines(path):
        entry = text if isinstance(text, InputError) else classify_line(path, text, number)
        if entry is None:
            continue
        if isinstance(entry, InputError):
            yield entry
        else:
            item_id, prompt, context, sample = entry
            yield InputRecord(item_id or f"item-{index}", prompt, context, number, sample)
        index += 1


@final
@dataclass(slots=True)
class JsonlPart:
    """What checking one byte range found, with lines and item indices counted from its start."""

    lines: int = 0
    entries: int = 0
    """Non-blank lines: each takes an item index, good or not (as :func:`jsonl_entries` counts)."""
    items: int = 0
    problems: list[tuple[str, int, str | None]] = field(default_factory=list)
    """The first :data:`MAX_REPORTED`: (problem, line, field)."""
    problem_count: int = 0
    hashes: array[int] = field(default_factory=lambda: array("q"))
    """``hash()`` of every explicit id, each hash once."""
    suspects: list[int] = field(default_factory=list)
    """Hashes seen twice in this range."""
    generated: array[int] = field(default_factory=lambda: array("q"))
    """Entry indices of bare prompts (their ids depend on the entries before the range)."""
    hash_set: set[int] | None = None
    """The hashes as the set they were collected in, when the part stays in this process
    (``keep_set=True``): then ``hashes`` is empty, and the set is handed over as it is."""


def scan_range(path: Path, start: int = 0, end: int | None = None, *, keep_set: bool = False) -> JsonlPart:
    """Check the lines of bytes ``[start, end)``; see :class:`JsonlPart`.

    The hot loop of a big file's check: :func:`classify_line`'s fast path is
    written out here (no call, no tuple per line) for the lines it takes,
    and every other line goes through :func:`classify_line` itself.
    """
    part = JsonlPart()
    seen: set[int] = set()
    suspects, generated, problems = part.suspects, part.generated, part.problems
    seen_add, scan, limit, fast_keys = seen.add, _SCAN, _NESTING_CHECK_AT, _FAST_KEYS
    items = entries = number = 0
    for first, lines in jsonl_blocks(path, start, end):
        number = first - 1
        for text in lines:
            number += 1
            if type(text) is str and len(text) <= limit and "\\u" not in text:
                try:
                    value, stop = scan(text, 0)
                except (StopIteration, ValueError, RecursionError):
                    stop = -1
                if stop == len(text) and type(value) is dict:
                    item_id, prompt = value.get("id"), value.get("prompt")
                    if (type(item_id) is str and type(prompt) is str and item_id.strip() and prompt.strip()
                            and value.keys() <= fast_keys and text.count('"id"') == 1
                            and text.count('"prompt"') == 1
                            and ("context" not in value or text.count('"context"') == 1)):
                        items += 1
                        entries += 1
                        key = hash(item_id)
                        if key in seen:
                            suspects.append(key)
                        else:
                            seen_add(key)
                        continue
            entry = text if isinstance(text, InputError) else classify_line(path, text, number)
            if entry is None:
                continue
            if isinstance(entry, InputError):
                part.problem_count += 1
                if len(problems) < MAX_REPORTED:
                    problems.append((entry.problem, number, entry.field))
            else:
                items += 1
                item_id = entry[0]
                if item_id is None:
                    generated.append(entries)
                else:
                    key = hash(item_id)
                    if key in seen:
                        suspects.append(key)
                    else:
                        seen_add(key)
            entries += 1
    part.items, part.entries, part.lines = items, entries, number
    if keep_set:
        part.hash_set = seen
    else:
        part.hashes = array("q", seen)
    return part


def _json_problem(path: Path, text: str, number: int) -> InputError:
    """The error json.loads gives for ``text`` (the slow path: only lines that are not clean JSON)."""
    try:
        json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        return InputError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=number)
    except _NonFinite as exc:
        problem = f"{exc} is not JSON (strict JSON has no NaN or Infinity; write null or a string)"
        return InputError(path, problem, line=number, field=_non_finite_field(text))
    except RecursionError:
        return InputError(path, nesting_problem(), line=number)
    return InputError(path, "invalid JSON", line=number)  # pragma: no cover - scan_once agreed


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
