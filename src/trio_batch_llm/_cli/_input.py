"""The command line's input: a JSONL or CSV file, checked whole before any call, then streamed.

Two passes over the file, neither holding it in memory:

1. :func:`scan_input` checks every line and keeps only what duplicate
   detection needs: a hash per id (a repeated hash is then confirmed with the
   ids themselves, in a second read limited to those hashes). It reports up to
   :data:`MAX_REPORTED` problems, each an :class:`InputError` naming the
   file, the line and, where there is one, the field, so an operator can fix
   the file in one pass (exit status 2, nothing written). A big JSONL file is
   checked on several cores (:mod:`._input_scan`).
2. :func:`iter_input` reads the records again, one at a time, as the run
   takes them.

The formats are described in :mod:`._input_jsonl` and :mod:`._input_csv`. A
leading UTF-8 byte order mark is ignored in both.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from ._input_csv import csv_entries
from ._input_jsonl import jsonl_entries
from ._input_records import MAX_REPORTED, InputError, InputProblems, InputRecord
from ._input_scan import scan_parallel

__all__ = [
    "MAX_REPORTED",
    "InputError",
    "InputProblems",
    "InputRecord",
    "InputScan",
    "iter_input",
    "read_input",
    "scan_input",
]

_FORMATS: Final = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}


@final
@dataclass(frozen=True, slots=True)
class InputScan:
    """What the checking pass learned: the file is good, and holds ``items`` prompts."""

    path: Path
    kind: str
    items: int


def _kind(path: Path) -> str:
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise InputError(path, f"cannot tell the format from the extension {path.suffix!r}; "
                               "use .jsonl (or .ndjson) or .csv")
    if not path.is_file():
        raise InputError(path, "no such file" if not path.exists() else "not a regular file")
    return kind


def _entries(path: Path, kind: str) -> Iterator[InputRecord | InputError]:
    return jsonl_entries(path) if kind == "jsonl" else csv_entries(path)


def scan_input(path: str | Path) -> InputScan:
    """Check every record of ``path``; :class:`InputError` for one problem, :class:`InputProblems`
    for several. Keeps one hash per id, nothing else per record."""
    path = Path(path)
    kind = _kind(path)
    if kind == "jsonl":
        merged = scan_parallel(path)
        items, problems, count = merged.items, merged.problems, merged.problem_count
        suspects = merged.suspects
    else:
        items, problems, count, suspects = _scan_sequential(path, kind)
    if suspects:  # a repeated hash: confirm with the ids themselves, and find their first lines
        duplicates = _duplicates(path, kind, suspects)
        count += len(duplicates)
        problems = sorted([*problems, *duplicates], key=lambda p: p.line or 0)[:MAX_REPORTED]
        items -= len(duplicates)
    if problems:
        raise problems[0] if count == 1 else InputProblems(path, problems, count)
    if not items:
        raise InputError(path, "contains no prompts")
    return InputScan(path, kind, items)


def _scan_sequential(path: Path, kind: str) -> tuple[int, list[InputError], int, set[int]]:
    problems: list[InputError] = []
    count = items = 0
    seen: set[int] = set()
    suspects: set[int] = set()
    for entry in _entries(path, kind):
        if isinstance(entry, InputError):
            count += 1
            if len(problems) < MAX_REPORTED:
                problems.append(entry)
            continue
        items += 1
        key = hash(entry.item_id)
        if key in seen:
            suspects.add(key)
        else:
            seen.add(key)
    return items, problems, count, suspects


def _duplicates(path: Path, kind: str, suspects: set[int]) -> list[InputError]:
    """Every repeat of an id whose hash is in ``suspects``, naming the line it was first on."""
    first: dict[str, int] = {}
    found: list[InputError] = []
    for entry in _entries(path, kind):
        if isinstance(entry, InputError) or hash(entry.item_id) not in suspects:
            continue
        line = first.setdefault(entry.item_id, entry.line)
        if line != entry.line:
            found.append(InputError(path, f"duplicate id {entry.item_id!r} (first on line {line})",
                                    line=entry.line, field="id"))
    return found


def iter_input(path: str | Path) -> Iterator[InputRecord]:
    """The records of ``path`` one at a time (check it with :func:`scan_input` first); a problem
    found now (the file changed meanwhile) is raised as its :class:`InputError`."""
    path = Path(path)
    for entry in _entries(path, _kind(path)):
        if isinstance(entry, InputError):
            raise entry
        yield entry


def read_input(path: str | Path) -> list[InputRecord]:
    """Every record of ``path``, checked, in a list (for sources that must be a list)."""
    scan_input(path)
    return list(iter_input(path))
