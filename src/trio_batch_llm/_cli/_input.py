"""The command line's input: read and check a whole JSONL or CSV file before any call.

Every problem is an :class:`InputError` naming the file, the line and, where
there is one, the field, so an operator can fix the file in one pass (exit
status 2, nothing written).

JSONL (``.jsonl``, ``.ndjson``): one JSON value per line, either an object
``{"id": ..., "prompt": ..., "context": ...}`` (``context`` optional, any JSON;
an integer id is read as its decimal string; other keys are ignored) or a
string, the prompt, whose id is ``item-N`` (N counts the items from 0, as
``process_prompts`` does). Blank lines are skipped.

CSV (``.csv``): a header row with ``id`` and ``prompt`` columns; any other
columns become the item's context, a ``{column: value}`` mapping (``None``
when there are none). Quoted fields may span lines; a line number is where
the record starts. A leading UTF-8 byte order mark is ignored in both formats.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import importlib.util
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final, final

from .._values._item_checks import json_line_nesting_column, nesting_problem, surrogate_problem
from .._values._requests import item_id_problem

__all__ = [
    "CSV_FIELD_LIMIT",
    "InputError",
    "InputRecord",
    "read_input",
]

_FORMATS: Final = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}


@final
class InputError(ValueError):
    """A problem with the input file, located by file, line and field."""

    def __init__(self, path: Path | str, problem: str, *, line: int | None = None,
                 field: str | None = None) -> None:
        where = str(path)
        if line is not None:
            where += f", line {line}"
        if field is not None:
            where += f', field "{field}"'
        super().__init__(f"{where}: {problem}")
        self.path = str(path)
        self.line = line
        self.field = field
        self.problem = problem


@final
@dataclass(frozen=True, slots=True)
class InputRecord:
    item_id: str
    prompt: str
    context: Any
    line: int


def read_input(path: str | Path) -> list[InputRecord]:
    """Every record of ``path``, checked; raises :class:`InputError` at the first problem."""
    path = Path(path)
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise InputError(path, f"cannot tell the format from the extension {path.suffix!r}; "
                               "use .jsonl (or .ndjson) or .csv")
    if not path.is_file():
        raise InputError(path, "no such file" if not path.exists() else "not a regular file")
    records = _read_jsonl(path) if kind == "jsonl" else _read_csv(path)
    if not records:
        raise InputError(path, "contains no prompts")
    return records


def _decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` with line endings kept; non-UTF-8 bytes are an error naming the line."""
    try:
        with path.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InputError(
                        path, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})",
                        line=number,
                    ) from None
                if number == 1 and text.startswith("\ufeff"):
                    text = text[1:]
                yield number, text
    except OSError as exc:
        raise InputError(path, f"cannot read it: {exc.strerror or exc}") from None


class _Ids:
    """Rejects a repeated id, naming the line where it was first seen."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._first: dict[str, int] = {}

    def add(self, item_id: str, line: int) -> None:
        problem = item_id_problem(item_id)
        if problem is not None:
            raise InputError(self._path, f"{item_id!r} {problem}", line=line, field="id")
        first = self._first.setdefault(item_id, line)
        if first != line:
            raise InputError(self._path, f"duplicate id {item_id!r} (first on line {first})",
                             line=line, field="id")


def _read_jsonl(path: Path) -> list[InputRecord]:
    records: list[InputRecord] = []
    ids = _Ids(path)
    for number, text in _decoded_lines(path):
        if not text.strip():
            continue
        column = json_line_nesting_column(text)  # before json.loads, which recurses per level
        if column is not None:
            raise InputError(path, nesting_problem(column), line=number)
        try:
            value = json.loads(text, parse_constant=_refuse_constant)
        except json.JSONDecodeError as exc:
            raise InputError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=number) from None
        except _NonFinite as exc:
            problem = f"{exc} is not JSON (strict JSON has no NaN or Infinity; write null or a string)"
            raise InputError(path, problem, line=number, field=_non_finite_field(text)) from None
        if isinstance(value, str):
            record = InputRecord(f"item-{len(records)}", _prompt(path, value, number), None, number)
        elif isinstance(value, dict):
            record = InputRecord(_json_id(path, value, number), _prompt(path, value.get("prompt"), number),
                                 value.get("context"), number)
        else:
            raise InputError(path, f'expected an object with "id" and "prompt", or a string; '
                                   f"found {_json_type(value)}", line=number)
        ids.add(record.item_id, number)
        records.append(record)
    return records


class _NonFinite(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity``: Python's json reads them, strict readers do not."""


def _refuse_constant(literal: str) -> Any:
    raise _NonFinite(literal)


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


def _json_id(path: Path, obj: dict[str, Any], line: int) -> str:
    if "id" not in obj:
        raise InputError(path, "missing", line=line, field="id")
    value = obj["id"]
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        problem = f"must be a string or an integer, not {_json_type(value)}"
        raise InputError(path, problem, line=line, field="id")
    if not value.strip():
        raise InputError(path, "is empty", line=line, field="id")
    return value


def _prompt(path: Path, value: object, line: int) -> str:
    if value is None:
        raise InputError(path, "missing", line=line, field="prompt")
    if not isinstance(value, str):
        raise InputError(path, f"must be a string, not {_json_type(value)}", line=line, field="prompt")
    if not value.strip():
        raise InputError(path, "is empty", line=line, field="prompt")
    problem = surrogate_problem(value)  # only JSON's \ud800 escapes make one: UTF-8 files cannot
    if problem is not None:
        raise InputError(path, problem, line=line, field="prompt")
    return value


CSV_FIELD_LIMIT: Final = 64 * 1024 * 1024
"""Characters one CSV field may hold: far above any model's context window (the csv module's own
default, 131,072, would refuse prompts that JSONL takes). Like a JSONL line, a field is held in memory."""
_CSV_LIMIT_LOCK: Final = threading.Lock()


@functools.cache
def _private_csv() -> ModuleType | None:
    """A private instance of the C ``_csv`` module (multi-phase init gives each instance its own state),
    so that raising its field limit leaves ``csv.field_size_limit()`` of the process alone; ``None``
    where the interpreter cannot make one."""
    try:
        spec = importlib.util.find_spec("_csv")
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - any failure means "use the shared module"
        return None
    return None if module is sys.modules.get("_csv") else module


@contextlib.contextmanager
def _csv_module() -> Iterator[Any]:
    """A module with ``reader`` and ``Error`` whose field limit is :data:`CSV_FIELD_LIMIT` meanwhile."""
    private = _private_csv()
    if private is not None:
        private.field_size_limit(CSV_FIELD_LIMIT)
        yield private
        return
    with _CSV_LIMIT_LOCK:  # the shared limit, raised for this read only
        saved = csv.field_size_limit(CSV_FIELD_LIMIT)
        try:
            yield csv
        finally:
            csv.field_size_limit(saved)


def _read_csv(path: Path) -> list[InputRecord]:
    with _csv_module() as module:
        return _read_csv_with(module, path)


def _read_csv_with(module: Any, path: Path) -> list[InputRecord]:
    lines = _decoded_lines(path)
    numbers: list[int] = []  # the physical line of each text handed to csv, in order

    def texts() -> Iterator[str]:
        for number, text in lines:
            numbers.append(number)
            yield text

    reader = module.reader(texts(), strict=True)
    records: list[InputRecord] = []
    ids = _Ids(path)
    header: list[str] | None = None
    while True:
        start = len(numbers) + 1  # the record begins on the next physical line
        try:
            row = next(reader)
        except StopIteration:
            break
        except module.Error as exc:
            line = numbers[-1] if numbers else 1
            if str(exc).startswith("field larger than field limit"):
                raise InputError(path, f"a field is longer than {CSV_FIELD_LIMIT:,} characters "
                                       "(the CSV field limit)", line=line) from None
            raise InputError(path, f"malformed CSV: {exc}", line=line) from None
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = _csv_header(path, row, start)
            continue
        if len(row) != len(header):
            raise InputError(path, f"expected {len(header)} fields ({', '.join(header)}), found {len(row)}",
                             line=start)
        fields = dict(zip(header, row, strict=True))
        item_id = fields.pop("id")
        if not item_id.strip():
            raise InputError(path, "is empty", line=start, field="id")
        prompt = _prompt(path, fields.pop("prompt"), start)
        ids.add(item_id, start)
        records.append(InputRecord(item_id, prompt, fields or None, start))
    if header is None:
        raise InputError(path, "contains no prompts (not even a header row)")
    return records


def _csv_header(path: Path, row: list[str], line: int) -> list[str]:
    header = [name.strip() for name in row]
    for name in ("id", "prompt"):
        if name not in header:
            raise InputError(path, f"missing column (the header has: {', '.join(header)})",
                             line=line, field=name)
    seen: set[str] = set()
    for name in header:
        if not name:
            raise InputError(path, "the header has an empty column name", line=line)
        if name in seen:
            raise InputError(path, "column named twice in the header", line=line, field=name)
        seen.add(name)
    return header
