"""``trio-batch-llm export CHECKPOINT OUT``: a checkpoint as a flat table a data person can load.

A checkpoint (``run``'s ``--out``, or any JSONL or SQLite checkpoint store) is
a log: a header, then one nested record per result, and after a resume
several records for some ids. The table has one flat row per id, from that
id's *last* record, with the columns of :data:`COLUMNS` (and ``prompt`` with
``--prompts INPUT``). Rows come in input order (:mod:`._export_order`: the order
of ``--prompts INPUT``, else the order each id was first recorded), or with
``--order completion`` in the order of those last records. Object outputs (a
``--response-schema`` run's) and contexts (a CSV input's own columns) are spread
into typed columns of their own (:mod:`._export_columns`) unless ``--no-flatten``.
Formats:

- ``jsonl``: one JSON object per row; ``output`` and ``context`` (and the spread
  columns) keep their JSON values.
- ``csv``: a header row, then one row per id (``csv`` module's default dialect);
  values that are not text are written as JSON; a missing value is an empty field.
- ``parquet``: through ``pyarrow`` (``pip install "trio-batch-llm[parquet]"``),
  written in row groups of :data:`ROW_GROUP` rows; text columns as in CSV; counts
  and whole-number columns are 64-bit integers, missing values null.

The checkpoint is read twice (once to count each id's records and learn the
columns, once to write each id's last one), so memory holds a count and a
position per id, not the results; with ``--prompts`` it also holds the prompts
of the input. OUT is written to a temporary file beside it and renamed into
place when complete: a failure leaves no half-written table and an existing OUT
untouched. The table gets the mode a new file gets (``0o666`` less the umask),
as the checkpoints do.

OUT is never what the command reads (CHECKPOINT, ``--prompts INPUT``: compared
as files, so a symbolic or a hard link to one is refused too) nor an existing
checkpoint of ours (a JSONL one by its header, or a SQLite file): ``export`` only
ever replaces a table.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Final

from .._artifacts import JsonlArtifactStore, SqliteArtifactStore
from .._artifacts._protocol import FORMAT_NAME
from .._values._config import ArtifactIdentity
from .._values._errors import ArtifactStoreError
from .._values._results import WorkItemResult
from ._command import EXIT_OK, EXIT_USAGE, UsageError
from ._export_columns import Spread
from ._export_order import count_records, in_order, last_records, positions
from ._input import InputError, iter_input, scan_input
from ._render import refuse, say

__all__ = ["COLUMNS", "ROW_GROUP", "Table", "check_table_out", "export_command", "table_format"]

COLUMNS: Final = ("id", "success", "output", "error", "error_category", "stop_reason", "attempts",
                  "input_tokens", "output_tokens", "total_tokens", "execution_seconds", "context")
"""The table's own columns; ``output`` and ``context`` may be spread into several (``--no-flatten``: not)."""
_MIDDLE: Final = COLUMNS[COLUMNS.index("error"):COLUMNS.index("context")]
_TYPES: Final = {"success": "bool", "attempts": "int", "input_tokens": "int", "output_tokens": "int",
                 "total_tokens": "int", "execution_seconds": "float"}
ROW_GROUP: Final = 10_000
_FORMATS: Final = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet",
                   ".pq": "parquet"}
_SQLITE_MAGIC: Final = b"SQLite format 3\0"
# The stores read offline without checking identity (iter_results); this one is never compared.
_ANY_IDENTITY: Final = ArtifactIdentity(provider="export", model="export")


def table_format(out: Path, given: str | None) -> str:
    if given is not None:
        return given
    kind = _FORMATS.get(out.suffix.lower())
    if kind is None:
        raise UsageError(f"OUT {out}: cannot tell the format from the extension {out.suffix!r}; "
                         "pass --format jsonl, csv or parquet")
    return kind


def _results(checkpoint: Path) -> Callable[[], Iterator[WorkItemResult[Any]]]:
    """A way to read every stored result, in write order, again and again."""
    if not checkpoint.is_file():
        raise UsageError(f"CHECKPOINT {checkpoint}: " + ("no such file" if not checkpoint.exists()
                                                          else "not a regular file"))
    with checkpoint.open("rb") as f:
        magic = f.read(len(_SQLITE_MAGIC))
    store: JsonlArtifactStore | SqliteArtifactStore
    if magic == _SQLITE_MAGIC:
        store = SqliteArtifactStore(checkpoint, identity=_ANY_IDENTITY)
    else:
        store = JsonlArtifactStore(checkpoint, identity=_ANY_IDENTITY)
    return store.iter_results


class Table:
    """The table's columns, learnt on the first read of the checkpoint, and each result's row of cells."""

    def __init__(self, *, flatten: bool, prompts: dict[str, str] | None, structured: bool) -> None:
        self._flatten = flatten
        self._prompts = prompts
        self._structured = structured  # JSONL: values keep their JSON form
        self._outputs = Spread("output", nested=True, numbers_in_text=False)
        self._contexts = Spread("context", nested=False, numbers_in_text=True)
        self.columns: list[str] = []

    def see(self, result: WorkItemResult[Any]) -> None:
        if not self._flatten:
            return  # one cell each: nothing to learn
        self._outputs.see(result.output)
        self._contexts.see(result.context)

    def plan(self) -> None:
        """Settle the columns, after the first read: the spread ones take no name of our own."""
        taken = {*COLUMNS, "prompt"}
        outputs = self._outputs.plan(taken, flatten=self._flatten, prefix="output.", renamed="output.")
        contexts = self._contexts.plan(taken, flatten=self._flatten, prefix="", renamed="input.")
        self.columns = ["id", "success", *outputs, *_MIDDLE, *contexts]
        if self._prompts is not None:
            self.columns.append("prompt")

    def types(self) -> dict[str, str]:
        """Each column's type (``int``, ``float``, ``bool``, ``text``)."""
        spread = [*self._outputs.columns, *self._contexts.columns]
        return {name: _TYPES.get(name, "text") for name in self.columns} | {
            column.name: column.type for column in spread if column.path}

    def row(self, result: WorkItemResult[Any]) -> list[Any]:
        """``result``'s cells, in the order of :attr:`columns`."""
        usage = result.token_usage
        cells = [
            result.item_id,
            result.success,
            *self._outputs.cells(result.output, structured=self._structured),
            result.error,
            None if result.error_category is None else result.error_category.value,
            None if result.stop_reason is None else result.stop_reason.value,
            result.attempts,
            usage.get("input_tokens"),
            usage.get("output_tokens"),
            usage.get("total_tokens"),
            result.timing.execution,
            *self._contexts.cells(result.context, structured=self._structured),
        ]
        if self._prompts is not None:
            cells.append(self._prompts.get(result.item_id))
        return cells


def _prompts(source: Path) -> dict[str, str]:
    scan_input(source)
    return {record.item_id: record.prompt for record in iter_input(source)}


def _write_jsonl(f: IO[str], rows: Iterator[list[Any]], columns: list[str]) -> None:
    for row in rows:
        f.write(json.dumps(dict(zip(columns, row, strict=True)), ensure_ascii=False, allow_nan=False,
                           default=str) + "\n")


def _write_csv(f: IO[str], rows: Iterator[list[Any]], columns: list[str]) -> None:
    writer = csv.writer(f)
    writer.writerow(columns)
    writer.writerows(rows)


def _pyarrow() -> tuple[Any, Any]:
    try:
        return importlib.import_module("pyarrow"), importlib.import_module("pyarrow.parquet")
    except ImportError:
        raise UsageError("--format parquet needs pyarrow: pip install 'trio-batch-llm[parquet]'") from None


def _write_parquet(path: Path, rows: Iterator[list[Any]], types: dict[str, str]) -> None:
    pa, pq = _pyarrow()
    arrow = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "text": pa.string()}
    schema = pa.schema([(name, arrow[kind]) for name, kind in types.items()])
    with pq.ParquetWriter(str(path), schema) as writer:
        batch: list[list[Any]] = []
        for row in rows:
            batch.append(row)
            if len(batch) == ROW_GROUP:
                writer.write_table(_arrow_table(pa, batch, schema))
                batch = []
        if batch:
            writer.write_table(_arrow_table(pa, batch, schema))


def _arrow_table(pa: Any, rows: list[list[Any]], schema: Any) -> Any:
    return pa.Table.from_arrays([pa.array(list(column), type=kind) for column, kind in
                                 zip(zip(*rows, strict=True), schema.types, strict=True)], schema=schema)


_HEADER_PROBE: Final = 64 * 1024  # bytes of an existing OUT read to recognise a JSONL checkpoint's header


def _same_file(one: Path, other: Path) -> bool:
    """Whether two paths name one file (through symbolic and hard links alike)."""
    try:
        return one.samefile(other)
    except OSError:  # either is missing or unreadable: not the same existing file
        return False


def _ours(out: Path) -> str | None:
    """What kind of checkpoint of ours the existing file ``out`` is, or ``None``."""
    try:
        with out.open("rb") as f:
            head = f.read(_HEADER_PROBE)
    except OSError:
        return None
    if head.startswith(_SQLITE_MAGIC):
        return "a SQLite database (a checkpoint store or a runs database)"
    first = head.partition(b"\n")[0].lstrip(b"\xef\xbb\xbf")
    try:
        header = json.loads(first)
    except ValueError:
        return None
    if isinstance(header, dict) and header.get("format") == FORMAT_NAME:
        return "a trio-batch-llm checkpoint"
    return None


def _check_paths(checkpoint: Path, out: Path, prompts: Path | None) -> None:
    check_table_out(out, [(checkpoint, "the checkpoint"), (prompts, "the --prompts input")])


def check_table_out(out: Path, inputs: list[tuple[Path | None, str]]) -> None:
    """The rules for the OUT of a table (``export``, ``runs export``): a regular file in a directory
    that exists, never one of the command's ``inputs`` (``(path, what it is)``; through links too:
    the same file is the same file), nor a checkpoint or run database of ours."""
    if not out.parent.is_dir():
        raise UsageError(f"OUT {out}: the directory {out.parent} does not exist")
    if out.exists() and not out.is_file():
        raise UsageError(f"OUT {out}: not a regular file")
    for path, what in inputs:
        if path is not None and _same_file(out, path):
            raise UsageError(f"OUT {out} is {what}; choose another path")
    kind = _ours(out) if out.exists() else None
    if kind is not None:
        raise UsageError(f"OUT {out} is {kind}, not a table: export never replaces one; choose another path")


def _umask_mode() -> int:
    """The mode a new file gets here: ``0o666`` less the process's umask (read by setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def export_command(args: argparse.Namespace) -> int:
    checkpoint, out = Path(args.checkpoint), Path(args.out)
    try:
        kind = table_format(out, args.format)
        _check_paths(checkpoint, out, Path(args.prompts) if args.prompts else None)
        read = _results(checkpoint)
        if kind == "parquet":
            _pyarrow()  # before any work: a missing pyarrow is a usage error
        prompts = _prompts(Path(args.prompts)) if args.prompts else None
    except (InputError, UsageError) as exc:
        return refuse(exc)
    table = Table(flatten=args.flatten, prompts=prompts, structured=kind == "jsonl")
    try:
        counts = count_records(read, table.see)
    except ArtifactStoreError as exc:
        say(f"error: CHECKPOINT {checkpoint}: {exc}")
        return EXIT_USAGE
    table.plan()
    place = None if args.order == "completion" else positions(counts, prompts)
    written = [0]

    def rows() -> Iterator[tuple[int, list[Any]]]:
        for result in last_records(read, counts):
            written[0] += 1
            yield (0 if place is None else place[result.item_id]), table.row(result)

    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        if kind == "parquet":
            os.close(fd)
            with _ordered(rows(), place is not None, out) as ordered:
                _write_parquet(Path(tmp), ordered, table.types())
        else:
            # The file first: it owns the descriptor however the reading ends.
            with (
                open(fd, "w", encoding="utf-8", newline="") as f,
                _ordered(rows(), place is not None, out) as ordered,
            ):
                if kind == "jsonl":
                    _write_jsonl(f, ordered, table.columns)
                else:
                    _write_csv(f, ordered, table.columns)
        os.chmod(tmp, _umask_mode())  # mkstemp makes it 0o600; the table is shared as a new file would be
        os.replace(tmp, out)
    except ArtifactStoreError as exc:
        os.unlink(tmp)
        say(f"error: CHECKPOINT {checkpoint}: {exc}")
        return EXIT_USAGE
    except BaseException:
        os.unlink(tmp)
        raise
    say(f"wrote {written[0]:,} row(s), one per item id, to {out} ({kind})")
    if place is not None and prompts is None:
        say("the rows are in the order each id was first recorded (a checkpoint keeps no input order; "
            "a run starts items in input order): pass --prompts INPUT for the input's own order")
    return EXIT_OK


@contextlib.contextmanager
def _ordered(rows: Iterator[tuple[int, list[Any]]], by_position: bool,
             out: Path) -> Iterator[Iterator[list[Any]]]:
    """The rows' cells: by position (:func:`in_order`), or as they come (completion order)."""
    if not by_position:
        yield (cells for _, cells in rows)
        return
    with in_order(rows, out.parent, out.name) as ordered:
        yield ordered
