"""The command line's CSV input: a header row with ``id`` and ``prompt``, other columns the context.

An optional ``sample`` column (a whole number >= 0, empty for 0) says which sample of its request
each row is, as JSONL's ``"sample"`` does.

A column named like a request key or parameter (``messages``, ``params``, ``temperature``, ...)
is refused: as context it would never be sent.

Read with a private instance of the C ``_csv`` module whose field limit is
:data:`CSV_FIELD_LIMIT`, so the process's own ``csv.field_size_limit()`` is
left alone. Each record is an :class:`InputRecord`, or the
:class:`InputError` that says what is wrong with it (the checking pass
collects those); a file the csv module cannot go on reading (bad quoting, a
field over the limit) or whose header is wrong raises its :class:`InputError`.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import importlib.util
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from .._values._jsonl_row import prompt_problem, sample_problem
from .._values._prompts import PARAM_KEYS, ROW_KEYS
from ._input_records import InputError, InputRecord, decode_line

__all__ = ["CSV_FIELD_LIMIT", "csv_entries", "decoded_lines"]

CSV_FIELD_LIMIT: Final = 64 * 1024 * 1024
"""Characters one CSV field may hold: far above any model's context window (the csv module's own
default, 131,072, would refuse prompts that JSONL takes). Like a JSONL line, a field is held in memory."""
_CSV_LIMIT_LOCK: Final = threading.Lock()
_REQUEST_NAMES: Final = {
    **{name: "key" for name in ROW_KEYS - {"id", "prompt", "context"}},
    **{name: "parameter" for name in PARAM_KEYS | {"max_tokens"}},
}
"""Header names that mean a part of the request: as context columns they would be dropped unsent."""


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


def decoded_lines(path: Path) -> Iterator[tuple[int, str | InputError]]:
    """``(line number, text)`` with line endings kept (csv needs them inside quoted fields), or the
    line's UTF-8 problem in place of its text; a file that cannot be read raises :class:`InputError`."""
    try:
        with path.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                text = decode_line(path, raw, number)
                if isinstance(text, InputError):
                    yield number, text
                    continue
                if number == 1 and text.startswith("\ufeff"):
                    text = text[1:]
                yield number, text
    except OSError as exc:
        raise InputError(path, f"cannot read it: {exc.strerror or exc}") from None


def csv_entries(path: Path) -> Iterator[InputRecord | InputError]:
    with _csv_module() as module:
        yield from _entries_with(module, path)


def _entries_with(module: Any, path: Path) -> Iterator[InputRecord | InputError]:
    last: list[int] = [0]  # the physical line of the text handed to csv last

    def texts() -> Iterator[str]:
        for number, text in decoded_lines(path):
            last[0] = number
            if isinstance(text, InputError):
                # Fatal in a CSV file: without the line, quoting could pair up the wrong fields.
                raise text
            yield text

    reader = module.reader(texts(), strict=True)
    header: list[str] | None = None
    start = 1  # the record begins on the line after the last one csv read
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except module.Error as exc:
            line = max(1, last[0])
            if str(exc).startswith("field larger than field limit"):
                raise InputError(path, f"a field is longer than {CSV_FIELD_LIMIT:,} characters "
                                       "(the CSV field limit)", line=line) from None
            raise InputError(path, f"malformed CSV: {exc}", line=line) from None
        row_start, start = start, last[0] + 1
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = _csv_header(path, row, row_start)
            continue
        yield _record(path, header, row, row_start)
    if header is None:
        raise InputError(path, "contains no prompts (not even a header row)")


def _record(path: Path, header: list[str], row: list[str], line: int) -> InputRecord | InputError:
    if len(row) != len(header):
        return InputError(path, f"expected {len(header)} fields ({', '.join(header)}), found {len(row)}",
                          line=line)
    fields = dict(zip(header, row, strict=True))
    item_id = fields.pop("id")
    if not item_id.strip():
        return InputError(path, "is empty", line=line, field="id")
    prompt = fields.pop("prompt")
    problem = prompt_problem(prompt)
    if problem is not None:
        return InputError(path, problem, line=line, field="prompt")
    sample = fields.pop("sample", "").strip()
    if sample and not (sample.isascii() and sample.isdigit()):
        return InputError(path, str(sample_problem(sample)), line=line, field="sample")
    return InputRecord(item_id, prompt, fields or None, line, int(sample or 0))


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
        if name in _REQUEST_NAMES:
            # Every column but id and prompt is context, which is never sent: a "messages" or
            # "temperature" column would run every item without it (JSONL's rule: row_problem).
            raise InputError(path, f"a column named like a request {_REQUEST_NAMES[name]} would be the "
                                   "item's context, which is never sent; use a JSONL file (\"messages\", "
                                   "\"params\") or the command's request flags (--system, --temperature, "
                                   "--max-tokens), or rename the column", line=line, field=name)
        seen.add(name)
    return header
