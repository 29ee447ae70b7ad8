"""Reading a run's terminal results by sequence, exporting them, and snapshots from any process.

:func:`load_results` is synchronous: :class:`Run` calls it in its repository
thread. :func:`read_run_snapshot` and :func:`iter_run_results` are for scripts
and other processes (blocking, read-only connection).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any, Final

import anyio

from .._values._errors import ArtifactStoreError
from .._values._results import WorkItemResult
from ._schema import RunResult, RunSnapshot, StoredResult
from .repository._client import RepositoryClient
from .repository._leases import LeaseReport
from .repository._locate import repository_at
from .repository._protocol import RunRepository

__all__ = ["export_results_jsonl", "iter_run_results", "list_runs", "load_results", "read_run_snapshot"]

_EXPORT_PAGE: Final = 1000


def _decode(stored: StoredResult, run_id: str = "", output: Callable[[Any], Any] | None = None) -> RunResult:
    result = WorkItemResult[Any].from_dict(json.loads(stored.result_json))
    if output is not None and result.output is not None:
        try:
            result.output = output(result.output)
        except Exception as exc:  # the strategy's decoder: the stored output is not what it makes now
            raise ArtifactStoreError(
                f"run {run_id!r}: the stored output of item {result.item_id!r} (sequence {stored.sequence}) "
                f"does not decode with this strategy (its response_model changed?): {exc!r}; "
                "iter_run_results() reads it as stored"
            ) from exc
    return RunResult(stored.sequence, result)


def load_results(
    repository: RunRepository, run_id: str, after_sequence: int, limit: int | None,
    output: Callable[[Any], Any] | None = None,
) -> list[RunResult]:
    """A page of results; each output through ``output`` (the strategy's ``decode_output``: a
    live run keeps a model as its JSON, see ``encode_new_result``), if given."""
    return [_decode(s, run_id, output)
            for s in repository.results(run_id, after_sequence=after_sequence, limit=limit)]


def _create_beside(target: anyio.Path) -> tuple[int, str]:
    """A new file in ``target``'s directory under a fresh name (never someone's file), with the mode
    any new file gets there (``0o666`` less the umask, applied by the system as it creates it)."""
    while True:
        name = os.path.join(os.fspath(target.parent), f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
            return os.open(name, flags, 0o666), name
        except FileExistsError:
            continue


async def export_results_jsonl(db: RepositoryClient, run_id: str, path: str, after_sequence: int) -> int:
    """Write ``{"sequence": n, "result": {...}}`` lines to ``path`` (a temporary file, then a rename).

    Reads page by page, so a long export never holds the repository for long. The
    temporary file has a fresh name (a fixed one could be a file of the user's, or a
    link to one) and is removed if the export fails or is cancelled.
    """
    target = anyio.Path(path)
    fd, partial = await anyio.to_thread.run_sync(_create_beside, target)
    written = 0
    try:
        async with await anyio.open_file(fd, "w", encoding="utf-8") as f:
            cursor = after_sequence
            while page := await db.call(
                db.repository.results, run_id, after_sequence=cursor, limit=_EXPORT_PAGE
            ):
                await f.write("".join(f'{{"sequence":{s.sequence},"result":{s.result_json}}}\n'
                                      for s in page))
                cursor = page[-1].sequence
                written += len(page)
            await f.flush()
            await anyio.to_thread.run_sync(os.fsync, f.wrapped.fileno())
        await anyio.Path(partial).replace(target)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.Path(partial).unlink(missing_ok=True)
        raise
    return written


def read_run_snapshot(path: str | os.PathLike[str], run_id: str) -> RunSnapshot:
    """The stored snapshot of ``run_id`` (blocking; for scripts and other processes)."""
    repository = repository_at(path, read_only=True)
    repository.open()
    try:
        return repository.snapshot(run_id)
    finally:
        repository.close()


def read_lease_report(path: str | os.PathLike[str], run_id: str) -> LeaseReport:
    """The drivers of ``run_id`` and its count of items re-leased after an expiry (blocking; read-only)."""
    repository = repository_at(path, read_only=True)
    repository.open()
    try:
        repository.snapshot(run_id)  # "no run named ..." for a mistyped id
        return repository.lease_report(run_id)
    finally:
        repository.close()


def list_runs(path: str | os.PathLike[str]) -> list[RunSnapshot]:
    """The stored snapshot of every run in the database, oldest first (blocking; read-only)."""
    repository = repository_at(path, read_only=True)
    repository.open()
    try:
        return [repository.snapshot(run_id) for run_id in repository.run_ids()]
    finally:
        repository.close()


def iter_run_results(
    path: str | os.PathLike[str], run_id: str, *, after_sequence: int = 0
) -> Iterator[RunResult]:
    """Every result of ``run_id`` after ``after_sequence``, in order (blocking; offline use).

    Outputs are as stored, plain JSON: a pydantic model comes back as its ``model_dump``
    (only :meth:`Run.read_results`, which has the strategy, rebuilds it)."""
    repository = repository_at(path, read_only=True)
    repository.open()
    try:
        cursor = after_sequence
        while page := repository.results(run_id, after_sequence=cursor, limit=_EXPORT_PAGE):
            for stored in page:
                yield _decode(stored)
            cursor = page[-1].sequence
    finally:
        repository.close()
