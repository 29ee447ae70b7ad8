"""``SqliteRunRepository``: run state in the tables ``runs``, ``run_items``, ``run_results``
and ``run_submissions`` (:mod:`._sqlite_tables`), one file per store.

The SQLite dialect of :class:`SqlRunRepository` (:mod:`._sql`), which holds
the run-state logic; this module holds what only SQLite does: the file, its
transactions, an older file's missing columns, and claims by lock file.

The tables live in the same database file as a :class:`SqliteArtifactStore`
(the file keeps the artifact store's ``application_id`` and header, so either
can be opened first). Synchronous and blocking: the async side calls it from
its worker gate (:class:`RepositoryClient`). Each public method is one
``BEGIN IMMEDIATE … COMMIT`` (or one read), as :mod:`._protocol` asks; the
writes whose SQL is SQLite's own are :mod:`._sqlite_writes`. ``BEGIN
IMMEDIATE`` takes the database's one write lock at the start, so whatever a
write reads stays true to its commit: SQLite needs none of PostgreSQL's row
locks.

The right to drive a run is a :class:`FileClaims` lock in ``<database>.run-locks/``.

The file is opened through the artifact store's :class:`SqliteFile` (a file
that is not provably ours is refused untouched; WAL mode; the artifact header).
Several processes may open, create and write one database at once: each step
that needs another connection's lock waits for it, ``busy_timeout`` seconds at
most (SQLite's busy timeout, and a retry where SQLite would give up at once),
and only then fails with an error that names the database and the bound.

A writer migrates an older file in place when it opens it (:func:`migrate`);
a read-only open of a version-1 file reads it as having no submissions.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar, Final, final

from ..._artifacts._sqlite_file import SqliteFile, check_busy_timeout
from ..._values._artifact_identity import ArtifactIdentity
from ..._values._errors import ArtifactStoreError
from .._schema import NewItem, NewResult, NewSubmission, RunStateError, SourceCheckpoint
from . import _sqlite_writes as writes
from ._dialect import SQLITE, Dialect
from ._file_claims import FileClaims
from ._sql import SqlRunRepository
from ._sqlite_tables import SNAPSHOT_V1, columns, migrate, stored_schema_version

__all__ = ["SqliteRunRepository"]

DEFAULT_BUSY_TIMEOUT: Final = 30.0


@final
class SqliteRunRepository(SqlRunRepository[sqlite3.Connection]):
    """Runs in a SQLite database (WAL); see the module docstring. Not thread-safe: one caller.

    ``busy_timeout`` (seconds, default 30) bounds each wait for a lock another
    connection holds (another process opening, creating or writing the same
    database); past it the call raises :class:`ArtifactStoreError` naming the
    database and the bound. ``fsync=True`` makes every commit durable against
    power loss (``synchronous=FULL``), not only against a process crash.
    """

    _dialect: ClassVar[Dialect] = SQLITE

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        identity: ArtifactIdentity | None = None,
        read_only: bool = False,
        fsync: bool = False,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = Path(path)
        self._file = SqliteFile(self._path, busy_timeout=check_busy_timeout(busy_timeout), fsync=fsync)
        # Written into the file's artifact header only when this creates the file.
        self._identity = identity if identity is not None else ArtifactIdentity("trio-batch-llm", "runs")
        self._read_only = read_only
        self._conn: sqlite3.Connection | None = None
        # False only for a read-only open of a version-1 file (it cannot be migrated from here).
        self._has_submissions = True
        self._claims = FileClaims(Path(f"{self._path}.run-locks"))
        self._clock = clock  # seconds; every lease expiry is decided by it (a test injects a fake)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def busy_timeout(self) -> float:
        """Seconds each wait for another connection's lock may last."""
        return self._file.busy_timeout

    @property
    def location(self) -> str:
        return str(self._path)

    def __repr__(self) -> str:
        return f"SqliteRunRepository({str(self._path)!r})"

    # -- lifecycle ---------------------------------------------------------------

    def open(self) -> None:
        if self._conn is not None:
            return
        with self._errors("opening"):
            if self._read_only and not self._path.exists():
                raise ArtifactStoreError(f"{self._path}: no such run database")
            conn = self._file.connect(read_only=self._read_only)
            try:
                if self._read_only:
                    self._file.retry(conn, lambda: self._check_read_only(conn))
                else:
                    with self._file.transaction(conn):
                        self._file.initialise(conn, self._identity)  # an artifact database that holds runs
                        migrate(conn, self._path)
            except BaseException:
                conn.close()
                raise
            self._conn = conn

    def _check_read_only(self, conn: sqlite3.Connection) -> None:
        self._file.check_ours(conn, "database")
        stored_schema_version(conn, self._path)
        self._has_submissions = "submission" in columns(conn, "run_items")

    def close(self) -> None:
        self._claims.release_all()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._file.close(conn, fold_wal=not self._read_only)

    # -- the connection ----------------------------------------------------------

    def _errors(self, doing: str) -> contextlib.AbstractContextManager[None]:
        return self._file.errors(doing)

    @contextlib.contextmanager
    def _read(self, doing: str) -> Iterator[sqlite3.Connection]:
        conn = self._require()
        with self._errors(doing):
            yield conn

    @contextlib.contextmanager
    def _write(self, doing: str) -> Iterator[sqlite3.Connection]:
        conn = self._require()
        if self._read_only:
            raise RunStateError(f"{self._path}: opened read-only; cannot {doing}")
        with self._errors(doing), self._file.transaction(conn):
            yield conn

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ArtifactStoreError(f"{self._path}: the run repository is not open")
        return self._conn

    # -- a version-1 file opened read-only (a writer migrates it on open) ------------

    def _snapshot_sql(self) -> str:
        return super()._snapshot_sql() if self._has_submissions else SNAPSHOT_V1

    def _attempts_column(self) -> str:
        return "attempts" if self._has_submissions else "0"

    def _reads_submissions(self) -> bool:
        self._require()
        return self._has_submissions

    def _knows_leases(self, conn: sqlite3.Connection) -> bool:
        return "lease_token" in columns(conn, "run_items")

    # -- the writes SQLite spells its own way (:mod:`._sqlite_writes`) -------------

    def _insert_items(self, conn: sqlite3.Connection, run_id: str, items: Sequence[NewItem],
                      checkpoint: SourceCheckpoint) -> None:
        writes.insert_items(conn, run_id, items, checkpoint)

    def _mark_done(self, conn: sqlite3.Connection, run_id: str, results: Sequence[NewResult], *,
                   submission: str | None, lease: int | None) -> int:
        return writes.mark_done(conn, run_id, results, submission=submission, lease=lease)

    def _reserve(self, conn: sqlite3.Connection, run_id: str, submission: NewSubmission,
                 capacity_limit: int | None) -> bool:
        return writes.reserve(conn, self.location, run_id, submission, capacity_limit)

    # -- claims ------------------------------------------------------------------

    def try_claim(self, run_id: str) -> bool:
        return self._claims.try_claim(run_id)

    def release(self, run_id: str) -> None:
        self._claims.release(run_id)
