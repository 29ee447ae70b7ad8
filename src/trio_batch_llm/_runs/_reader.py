"""Reading a run's terminal results by sequence, exporting them, and snapshots from any process.

:func:`load_results` is synchronous: :class:`Run` calls it in its repository
thread. :func:`read_run_snapshot` and :func:`iter_run_results` are for scripts
and other processes (blocking, read-only connection).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Final

import anyio

from .._values._results import WorkItemResult
from ._schema import RunResult, RunSnapshot, StoredResult
from .repository._client import RepositoryClient
from .repository._leases import LeaseReport
from .repository._locate import repository_at
from .repository._protocol import RunRepository

__all__ = ["export_results_jsonl", "iter_run_results", "list_runs", "load_results", "read_run_snapshot"]

_EXPORT_PAGE: Final = 1000


def _decode(stored: StoredResult) -> RunResult:
    return RunResult(stored.sequence, WorkItemResult.from_dict(json.loads(stored.result_json)))


def load_results(
    repository: RunRepository, run_id: str, after_sequence: int, limit: int | None
) -> list[RunResult]:
    return [_decode(s) for s in repository.results(run_id, after_sequence=after_sequence, limit=limit)]


async def export_results_jsonl(db: RepositoryClient, run_id: str, path: str, after_sequence: int) -> int:
    """Write ``{"sequence": n, "result": {...}}`` lines to ``path`` (a temporary file, then a rename).

    Reads page by page, so a long export never holds the repository for long.
    """
    target = anyio.Path(path)
    partial = target.with_name(target.name + ".partial")
    written = 0
    async with await anyio.open_file(partial, "w", encoding="utf-8") as f:
        cursor = after_sequence
        while page := await db.call(
            db.repository.results, run_id, after_sequence=cursor, limit=_EXPORT_PAGE
        ):
            await f.write("".join(f'{{"sequence":{s.sequence},"result":{s.result_json}}}\n' for s in page))
            cursor = page[-1].sequence
            written += len(page)
        await f.flush()
        await anyio.to_thread.run_sync(os.fsync, f.wrapped.fileno())
    await partial.replace(target)
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
    """Every result of ``run_id`` after ``after_sequence``, in order (blocking; offline use)."""
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
