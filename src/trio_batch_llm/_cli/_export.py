"""``trio-batch-llm export CHECKPOINT OUT``: a checkpoint as a flat table a data person can load.

A checkpoint (``run``'s ``--out``, or any JSONL or SQLite checkpoint store) is
a log: a header, then one nested record per result, and after a resume
several records for some ids. The table has one flat row per id, from that
id's *last* record, in the order of those last records, with the columns of
:data:`COLUMNS` (and ``prompt`` with ``--prompts INPUT``). Formats:

- ``jsonl``: one JSON object per row; ``output`` and ``context`` keep their JSON
  values.
- ``csv``: a header row, then one row per id (``csv`` module's default dialect);
  ``output`` and ``context`` that are not text are written as JSON; a missing
  value is an empty field.
- ``parquet``: through ``pyarrow`` (``pip install "trio-batch-llm[parquet]"``),
  written in row groups of :data:`ROW_GROUP` rows; ``output`` and ``context``
  are strings as in CSV; counts are 64-bit integers, missing ones null.

The checkpoint is read twice (once to count each id's records, once to write
each id's last one), so memory holds one count per id, not the results; with
``--prompts`` it also holds the prompts of the input. OUT is written to a
temporary file beside it and renamed into place when complete: a failure
leaves no half-written table and an existing OUT untouched. The table gets the
mode a new file gets (``0o666`` less the umask), as the checkpoints do.

OUT is never what the command reads (CHECKPOINT, ``--prompts INPUT``: compared
as files, so a symbolic or a hard link to one is refused too) nor an existing
checkpoint of ours (a JSONL one by its header, or a SQLite file): ``export`` only
ever replaces a table.
"""

from __future__ import annotations

import argparse
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
from ._input import InputError, iter_input, scan_input
from ._render import say, say_input_error

__all__ = ["COLUMNS", "ROW_GROUP", "check_table_out", "export_command", "flat_row", "table_format"]

COLUMNS: Final = ("id", "success", "output", "error", "error_category", "stop_reason", "attempts",
                  "input_tokens", "output_tokens", "total_tokens", "execution_seconds", "context")
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


def _json_text(value: Any) -> str | None:
    """Text as itself, anything else as JSON (``None`` stays missing)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, allow_nan=False, default=str)


def flat_row(result: WorkItemResult[Any], *, structured: bool) -> dict[str, Any]:
    """The table's row for ``result``; ``structured`` keeps ``output`` and ``context`` as JSON values."""
    usage = result.token_usage
    return {
        "id": result.item_id,
        "success": result.success,
        "output": result.output if structured else _json_text(result.output),
        "error": result.error,
        "error_category": None if result.error_category is None else result.error_category.value,
        "stop_reason": None if result.stop_reason is None else result.stop_reason.value,
        "attempts": result.attempts,
        "input_tokens": usage.get("input_tokens"),
        "output_tokens": usage.get("output_tokens"),
        "total_tokens": usage.get("total_tokens"),
        "execution_seconds": result.timing.execution,
        "context": result.context if structured else _json_text(result.context),
    }


def _last_records(read: Callable[[], Iterator[WorkItemResult[Any]]]) -> Iterator[WorkItemResult[Any]]:
    """Each id's last record, in the order of those records (two reads; a count per id kept)."""
    left: dict[str, int] = {}
    for result in read():
        left[result.item_id] = left.get(result.item_id, 0) + 1
    for result in read():
        count = left[result.item_id] - 1
        left[result.item_id] = count
        if count == 0:
            yield result


def _prompts(source: Path) -> dict[str, str]:
    scan_input(source)
    return {record.item_id: record.prompt for record in iter_input(source)}


def _write_jsonl(f: IO[str], rows: Iterator[dict[str, Any]]) -> None:
    for row in rows:
        f.write(json.dumps(row, ensure_ascii=False, allow_nan=False, default=str) + "\n")


def _write_csv(f: IO[str], rows: Iterator[dict[str, Any]], columns: list[str]) -> None:
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)


def _pyarrow() -> tuple[Any, Any]:
    try:
        return importlib.import_module("pyarrow"), importlib.import_module("pyarrow.parquet")
    except ImportError:
        raise UsageError("--format parquet needs pyarrow: pip install 'trio-batch-llm[parquet]'") from None


def _write_parquet(path: Path, rows: Iterator[dict[str, Any]], columns: list[str]) -> None:
    pa, pq = _pyarrow()
    types = {"success": pa.bool_(), "attempts": pa.int64(), "input_tokens": pa.int64(),
             "output_tokens": pa.int64(), "total_tokens": pa.int64(), "execution_seconds": pa.float64()}
    schema = pa.schema([(name, types.get(name, pa.string())) for name in columns])
    with pq.ParquetWriter(str(path), schema) as writer:
        batch: list[dict[str, Any]] = []
        for row in rows:
            batch.append(row)
            if len(batch) == ROW_GROUP:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))


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
    except InputError as exc:
        say_input_error(exc)
        return EXIT_USAGE
    except UsageError as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    columns = [*COLUMNS, "prompt"] if prompts is not None else list(COLUMNS)
    counted = [0]

    def rows() -> Iterator[dict[str, Any]]:
        for result in _last_records(read):
            row = flat_row(result, structured=kind == "jsonl")
            if prompts is not None:
                row["prompt"] = prompts.get(result.item_id)
            counted[0] += 1
            yield row

    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        if kind == "parquet":
            os.close(fd)
            _write_parquet(Path(tmp), rows(), columns)
        else:
            with open(fd, "w", encoding="utf-8", newline="") as f:
                if kind == "jsonl":
                    _write_jsonl(f, rows())
                else:
                    _write_csv(f, rows(), columns)
        os.chmod(tmp, _umask_mode())  # mkstemp makes it 0o600; the table is shared as a new file would be
        os.replace(tmp, out)
    except ArtifactStoreError as exc:
        os.unlink(tmp)
        say(f"error: CHECKPOINT {checkpoint}: {exc}")
        return EXIT_USAGE
    except BaseException:
        os.unlink(tmp)
        raise
    say(f"wrote {counted[0]:,} row(s), one per item id, to {out} ({kind})")
    return EXIT_OK
