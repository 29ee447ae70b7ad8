"""What reading an input file yields: records, and problems located by file, line and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, NamedTuple, final

from .._values._jsonl_row import RowProblem, decode_row

__all__ = ["MAX_REPORTED", "InputError", "InputProblems", "InputRecord", "decode_line"]

MAX_REPORTED: Final = 20
"""Problems reported for one file; the rest are counted."""


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

    def lines(self) -> list[str]:
        """What to show, one line each."""
        return [str(self)]


@final
class InputProblems(InputError):
    """Several problems in one file: ``problems`` holds the first :data:`MAX_REPORTED`
    (in line order), ``count`` says how many there are in all. Its own location and
    message are those of the first problem."""

    def __init__(self, path: Path | str, problems: list[InputError], count: int) -> None:
        first = problems[0]
        super().__init__(path, first.problem, line=first.line, field=first.field)
        self.problems = problems
        self.count = count

    def lines(self) -> list[str]:
        """One line per reported problem, then how many there are in all."""
        shown = [str(problem) for problem in self.problems]
        if self.count > len(shown):
            tail = f"{self.count:,} problems in {self.path}; the first {len(shown)} are listed above"
        else:
            tail = f"{self.count} problems in {self.path}"
        return [*shown, tail + ": fix them and run again"]


class InputRecord(NamedTuple):
    """One prompt of the file (a named tuple: a million of them are made per million lines)."""

    item_id: str
    prompt: str
    context: Any
    line: int
    sample: int = 0
    """Which sample of its request the item is (the row's ``"sample"``): part of its cache key."""


def decode_line(path: Path, raw: bytes, number: int) -> str | InputError:
    """Line ``number`` of either input format as text, or where it is not UTF-8."""
    text = decode_row(raw)
    return InputError(path, text.problem, line=number) if isinstance(text, RowProblem) else text
