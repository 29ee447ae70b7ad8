"""The export's columns: object outputs and contexts spread into columns of their own, each with one type.

``export`` reads a checkpoint twice. The first read shows every result to a :class:`Spread` (one
for the outputs, one for the contexts), which learns the fields and the kinds of value each holds;
the second read turns each row's value into the cells of those columns with :meth:`Spread.cells`.

- An output spreads when every output that is not null is a JSON object (a ``--response-schema``
  run's): one column ``output.<field>`` per field, nested objects dotted (``output.where.city``),
  anything else (a list) kept as JSON. A field that is an object in one row and not in another is
  one column of JSON.
- A context spreads the same way but one level deep, named by its own keys (a CSV input's own
  columns), ``input.<name>`` when the name is one of the table's own columns.
- A column whose values are all whole numbers is an integer column (64 bits), all numbers a float
  column, all booleans a boolean column; in contexts, text that is a number counts as a number
  (a CSV cell is always text: ``"3"`` comes back as ``3``, an empty cell as null), except a number
  with a leading zero (``"02134"``) or a whole number beyond 64 bits, which keep their column text
  (a number would change them). Anything
  else is a text column (values that are not text are JSON in CSV and Parquet).

A value that is not an object (text outputs), or more than :data:`MAX_FIELDS` fields, keeps the
single ``output``/``context`` column of before; so does ``--no-flatten``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal

__all__ = ["MAX_FIELDS", "Column", "Spread", "json_text"]

MAX_FIELDS: Final = 1_000
"""Fields a value may spread into: beyond that (keys that are data, not a schema) it stays one column."""

ColumnType = Literal["int", "float", "bool", "text"]
_INT_TEXT: Final = re.compile(r"[+-]?(?:0|[1-9][0-9]*)")
_FLOAT_TEXT: Final = re.compile(r"[+-]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INT64: Final = range(-(2**63), 2**63)
_SETTLED: Final = frozenset({"text", "json"})  # kinds after which a column is text whatever comes
_NUMBER_TEXT: Final = 40  # characters of the longest text read as a number: longer is text


def json_text(value: Any) -> str | None:
    """Text as itself, anything else as JSON (``None`` stays missing)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, allow_nan=False, default=str)


def _kind(value: Any, numbers_in_text: bool) -> str:
    """The kind of a non-null value, for choosing its column's type."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if value in _INT64 else "json"  # beyond 64 bits: its digits, as text
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        if not numbers_in_text:
            return "text"
        if value == "":
            return "empty"
        if len(value) > _NUMBER_TEXT:
            return "text"
        if _INT_TEXT.fullmatch(value):
            return "int" if int(value) in _INT64 else "text"  # an id of 20 digits: a float would change it
        return "float" if _FLOAT_TEXT.fullmatch(value) and math.isfinite(float(value)) else "text"
    return "json"


def _column_type(kinds: set[str]) -> ColumnType:
    if not kinds - {"empty"} or kinds & {"text", "json"}:
        return "text"
    if "bool" in kinds:
        return "bool" if kinds == {"bool"} else "text"
    return "int" if kinds <= {"int", "empty"} else "float"


@dataclass(slots=True)
class _Seen:
    """What the first read saw at one field path."""

    branch: bool = False  # an object (spread further) somewhere
    kinds: set[str] = field(default_factory=set)  # the kinds of the other non-null values


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    path: tuple[str, ...]
    type: ColumnType


class Spread:
    """One field of every result (``output`` or ``context``), learnt on the first read, cut into cells."""

    def __init__(self, name: str, *, nested: bool, numbers_in_text: bool) -> None:
        self._name = name
        self._nested = nested
        self._numbers_in_text = numbers_in_text
        self._objects = True  # every non-null value so far is a JSON object
        self._paths: dict[tuple[str, ...], _Seen] = {}  # in the order first seen (a parent before its fields)
        self.columns: list[Column] = []

    def see(self, value: Any) -> None:
        """The first read: learn ``value``'s fields."""
        if value is None or not self._objects:
            return
        if not isinstance(value, dict):
            self._objects = False
            return
        self._walk(value, ())
        if len(self._paths) > MAX_FIELDS:
            self._objects = False
            self._paths.clear()

    def _walk(self, obj: dict[Any, Any], prefix: tuple[str, ...]) -> None:
        paths = self._paths
        for key, value in obj.items():
            path = (*prefix, str(key))
            seen = paths.get(path)
            if seen is None:
                seen = paths[path] = _Seen()
            if self._nested and isinstance(value, dict) and value:
                seen.branch = True
                self._walk(value, path)
            elif value is not None and not seen.kinds & _SETTLED:  # (a text column stays one: skip the work)
                seen.kinds.add("json" if isinstance(value, dict) else _kind(value, self._numbers_in_text))

    def plan(self, taken: set[str], *, flatten: bool, prefix: str, renamed: str) -> list[str]:
        """Settle the columns (after the first read), their names not in ``taken`` (which gains them):
        ``prefix`` + the dotted path, and ``renamed`` in front until the name is free."""
        spread = flatten and self._objects and bool(self._paths)
        if not spread:
            self.columns = [Column(self._name, (), "text")]
            taken.add(self._name)
            return [self._name]
        chosen: set[tuple[str, ...]] = set()
        for path, seen in self._paths.items():
            if any(path[:n] in chosen for n in range(1, len(path))):
                continue  # inside a field that is a column of its own
            if seen.branch and not seen.kinds:
                continue  # always an object (or null): its fields are the columns
            kinds = seen.kinds | {"json"} if seen.branch else seen.kinds
            name = prefix + ".".join(path)
            while name in taken:
                name = renamed + name
            taken.add(name)
            chosen.add(path)
            self.columns.append(Column(name, path, _column_type(kinds)))
        return [column.name for column in self.columns]

    def cells(self, value: Any, *, structured: bool) -> list[Any]:
        """``value``'s cells, one per column: typed; in text columns, values that are not text as
        JSON text unless ``structured`` (JSONL keeps JSON values)."""
        if len(self.columns) == 1 and not self.columns[0].path:
            return [value if structured else json_text(value)]
        return [self._cell(_at(value, column.path), column.type, structured) for column in self.columns]

    def _cell(self, value: Any, kind: ColumnType, structured: bool) -> Any:
        if value is None:
            return None
        if kind == "int":
            return None if value == "" else int(value)
        if kind == "float":
            return None if value == "" else float(value)
        if kind == "bool" or structured:
            return value
        return json_text(value)


def _at(value: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` inside ``value`` (``None`` where a part is missing)."""
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value
