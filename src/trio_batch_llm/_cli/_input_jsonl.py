"""The command line's JSONL input: the file read fast, a few MiB at a time, each line checked.

What a line means (its keys, its checks, every message) is the one JSONL row reader's,
:func:`~.._values._jsonl_row.read_row`, which a run's source shares; this module reads
the file, numbers the lines and locates a problem by file, line and field
(:class:`~._input_records.InputError`). Blank lines are skipped.

Speed matters here: a million lines are checked before the first call. The
file is read and decoded a few MiB at a time; a byte range of the file can be
checked on its own (:func:`scan_range`), so that :mod:`._input_scan` can check
a big file on several cores.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, final

from .._values._jsonl_row import Row, RowProblem, plain_row, read_row
from ._input_records import MAX_REPORTED, InputError, InputRecord, decode_line

__all__ = [
    "JsonlPart",
    "classify_line",
    "jsonl_blocks",
    "jsonl_entries",
    "jsonl_lines",
    "scan_range",
]

_BLOCK: Final = 1 << 22
"""Bytes read at a time by the checking pass (fewer, larger reads: it is the hot path)."""
_FEED_BLOCK: Final = 1 << 20
"""Bytes read at a time while the run takes the items: a block's lines are held until the run has
taken them all, so a smaller block keeps the run's footprint small."""


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
                    lines = [decode_line(path, raw, number + n)
                             for n, raw in enumerate(block[:cut].split(b"\n"), start=1)]
                lines.pop()  # what follows the last newline: nothing
                if start == 0 and number == 0:
                    lines[0] = _no_bom(lines[0])
                yield number + 1, lines
                number += len(lines)
            if rest:  # a last line without its newline
                text = decode_line(path, rest, number + 1)
                yield number + 1, [_no_bom(text) if start == 0 and number == 0 else text]
    except OSError as exc:
        raise InputError(path, f"cannot read it: {exc.strerror or exc}") from None


def jsonl_lines(path: Path, *, block_size: int = _FEED_BLOCK) -> Iterator[tuple[int, str | InputError]]:
    """``(line number, text)`` of :func:`jsonl_blocks`, one line at a time."""
    for first, lines in jsonl_blocks(path, block_size=block_size):
        yield from enumerate(lines, start=first)


def _no_bom(text: str | InputError) -> str | InputError:
    return text[1:] if isinstance(text, str) and text.startswith("\ufeff") else text


def classify_line(path: Path, text: str, number: int) -> Row | InputError | None:
    """The :data:`~.._values._jsonl_row.Row` of one line, its problem, or ``None`` for a blank line."""
    row = read_row(text)
    if isinstance(row, RowProblem):
        return InputError(path, row.problem, line=number, field=row.field)
    return row


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

    The hot loop of a big file's check: a plain row (the fast path
    :func:`~.._values._jsonl_row.plain_row` that every reader shares) is
    counted here without building its :data:`Row`; every other line goes
    through :func:`classify_line` itself.
    """
    part = JsonlPart()
    seen: set[int] = set()
    suspects, generated, problems = part.suspects, part.generated, part.problems
    seen_add, plain = seen.add, plain_row
    items = entries = number = 0
    for first, lines in jsonl_blocks(path, start, end):
        number = first - 1
        for text in lines:
            number += 1
            value = plain(text) if type(text) is str else None
            if value is not None:
                items += 1
                entries += 1
                key = hash(value["id"])
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
