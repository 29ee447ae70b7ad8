"""The export's rows: each id's last record, in input order (or completion order), in bounded memory.

A checkpoint is written in completion order and keeps no input order. The first read
(:func:`count_records`) counts each id's records, in the order each id was first recorded; the
second (:func:`last_records`) yields each id's last record, in completion order. :func:`positions`
says where each id's row goes: its line in ``--prompts INPUT``, the ids INPUT lacks after them in
first-recorded order; without INPUT, first-recorded order (a run starts its items in input order,
so this is close to it, and a resume that reruns an item leaves it in its place).

:func:`in_order` puts the rows there: up to :data:`BUFFERED_ROWS` rows are sorted in memory; past
that they go to a temporary SQLite file beside OUT (one row of JSON text per id, keyed by its
position) and come back ordered by the key, so memory holds a count and a position per id, never
the results. The temporary file is removed however the export ends.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

from .._values._results import WorkItemResult

__all__ = ["BUFFERED_ROWS", "count_records", "in_order", "last_records", "positions", "spill_file"]

BUFFERED_ROWS: Final = 10_000
"""Rows sorted in memory; a larger table is sorted through a temporary file."""

Read = Callable[[], Iterator[WorkItemResult[Any]]]


def count_records(read: Read, see: Callable[[WorkItemResult[Any]], None]) -> dict[str, int]:
    """The first read: records per id, in the order each id was first recorded; each result to ``see``."""
    counts: dict[str, int] = {}
    for result in read():
        counts[result.item_id] = counts.get(result.item_id, 0) + 1
        see(result)
    return counts


def last_records(read: Read, counts: dict[str, int]) -> Iterator[WorkItemResult[Any]]:
    """The second read: each id's last record, in the order of those records (``counts`` is used up).
    An id the first read did not see (written since) is left out: its columns are not known."""
    for result in read():
        left = counts.get(result.item_id)
        if left is None:
            continue
        counts[result.item_id] = left - 1
        if left == 1:
            yield result


def positions(counts: dict[str, int], input_ids: Iterable[str] | None) -> dict[str, int]:
    """Where each id's row goes: its place in ``input_ids``, then the others in first-recorded order."""
    place: dict[str, int] = {} if input_ids is None else {item_id: n for n, item_id in enumerate(input_ids)}
    after = len(place)
    for item_id in counts:
        if item_id not in place:
            place[item_id] = after
            after += 1
    return place


def spill_file(directory: Path, name: str) -> str:
    """A new empty temporary file beside OUT (where there is room for the table) to sort through."""
    fd, path = tempfile.mkstemp(prefix=f".{name}.", suffix=".order.tmp", dir=directory)
    os.close(fd)
    return path


@contextlib.contextmanager
def in_order(rows: Iterable[tuple[int, list[Any]]], directory: Path,
             name: str) -> Iterator[Iterator[list[Any]]]:
    """``rows`` (``(position, cells)``) as cells, by position: in memory up to :data:`BUFFERED_ROWS`
    rows, else through a temporary SQLite file in ``directory``, removed on leaving."""
    pending = iter(rows)
    buffer = list(itertools.islice(pending, BUFFERED_ROWS + 1))
    if len(buffer) <= BUFFERED_ROWS:
        buffer.sort(key=lambda entry: entry[0])
        yield (cells for _, cells in buffer)
        return
    path = spill_file(directory, name)
    try:
        with contextlib.closing(sqlite3.connect(path)) as db:
            # A scratch file removed afterwards: nothing to journal or to make durable.
            db.execute("PRAGMA journal_mode = OFF")
            db.execute("PRAGMA synchronous = OFF")
            db.execute("CREATE TABLE rows (position INTEGER PRIMARY KEY, cells TEXT NOT NULL)")
            chunk: list[tuple[int, list[Any]]] = buffer
            while chunk:
                db.executemany("INSERT INTO rows VALUES (?, ?)",
                               [(position, json.dumps(cells, default=str)) for position, cells in chunk])
                chunk = list(itertools.islice(pending, BUFFERED_ROWS))
            del buffer
            cursor = db.execute("SELECT cells FROM rows ORDER BY position")
            yield (json.loads(text) for (text,) in cursor)
    finally:
        os.unlink(path)
