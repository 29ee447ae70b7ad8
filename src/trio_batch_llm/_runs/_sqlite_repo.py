"""``SqliteRunRepository``: run state in the tables ``runs``, ``run_items`` and ``run_results``.

The tables live in the same database file as a :class:`SqliteArtifactStore`
(the file keeps the artifact store's ``application_id`` and header, so either
can be opened first). Synchronous and blocking: the async side calls it from a
worker thread behind a ``CapacityLimiter(1)``. Each public method is one
``BEGIN IMMEDIATE … COMMIT`` (or one read), see :mod:`._schema`.

The right to drive a run is a :class:`FileClaims` lock in ``<database>.run-locks/``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final, final

from .._artifacts._fingerprint import canonical_json, identity_fingerprint
from .._artifacts._sqlite import APPLICATION_ID, SqliteArtifactStore
from .._config import ArtifactIdentity
from .._errors import ArtifactMismatchError, ArtifactStoreError
from ._claims import FileClaims
from ._schema import (
    NewItem,
    NewResult,
    PendingItem,
    RunSnapshot,
    RunSpec,
    RunStateError,
    RunTermination,
    SourceCheckpoint,
    StoredResult,
)

__all__ = ["SqliteRunRepository"]

_BUSY_TIMEOUT_SECONDS: Final = 30.0
RUNS_SCHEMA_VERSION: Final = 1

_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY,
        mode TEXT NOT NULL,
        identity TEXT NOT NULL,
        identity_fingerprint TEXT NOT NULL,
        config TEXT NOT NULL,
        status TEXT NOT NULL,
        termination TEXT,
        source_position INTEGER NOT NULL DEFAULT 0,
        source_cursor INTEGER,
        source_fingerprint TEXT,
        source_last_item TEXT,
        source_exhausted INTEGER NOT NULL DEFAULT 0,
        items INTEGER NOT NULL DEFAULT 0,
        done INTEGER NOT NULL DEFAULT 0,
        succeeded INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        total_tokens INTEGER NOT NULL DEFAULT 0,
        last_sequence INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    # Prompt and context are kept only while the item is pending (a resume needs them).
    """CREATE TABLE IF NOT EXISTS run_items (
        run_id TEXT NOT NULL,
        item_id TEXT NOT NULL,
        ingest_seq INTEGER NOT NULL,
        fingerprint TEXT NOT NULL,
        prompt TEXT,
        context TEXT,
        state TEXT NOT NULL,
        result_sequence INTEGER,
        PRIMARY KEY (run_id, item_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS run_items_by_state ON run_items (run_id, state, ingest_seq)",
    """CREATE TABLE IF NOT EXISTS run_results (
        run_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        item_id TEXT NOT NULL,
        success INTEGER NOT NULL,
        error_category TEXT,
        result TEXT NOT NULL,
        PRIMARY KEY (run_id, sequence)
    ) WITHOUT ROWID""",
)
_RUN_COLUMNS: Final = (
    "run_id, mode, identity, config, status, termination, source_position, source_cursor,"
    " source_fingerprint, source_last_item, source_exhausted, items, done, succeeded, failed,"
    " input_tokens, output_tokens, total_tokens, last_sequence, created_at, updated_at"
)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _snapshot(row: tuple[Any, ...]) -> RunSnapshot:
    (run_id, mode, identity, config, status, termination, position, cursor, fingerprint, last_item,
     exhausted, items, done, succeeded, failed, inp, out, total, last_seq, created, updated) = row
    term = json.loads(termination) if termination else None
    return RunSnapshot(
        run_id=run_id,
        status=status,
        mode=mode,
        identity=ArtifactIdentity(**json.loads(identity)),
        config=json.loads(config),
        termination=RunTermination(term["kind"], term.get("reason")) if term else None,
        checkpoint=SourceCheckpoint(
            position=position, cursor=cursor, fingerprint=fingerprint, last_item_id=last_item,
            exhausted=bool(exhausted),
        ),
        items=items, done=done, succeeded=succeeded, failed=failed,
        input_tokens=inp, output_tokens=out, total_tokens=total, last_sequence=last_seq,
        created_at=created, updated_at=updated,
    )


@final
class SqliteRunRepository:
    """Runs in a SQLite database (WAL); see the module docstring. Not thread-safe: one caller."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        identity: ArtifactIdentity | None = None,
        read_only: bool = False,
        fsync: bool = False,
    ) -> None:
        self._path = Path(path)
        # Written into the file's artifact header only when this creates the file.
        self._identity = identity if identity is not None else ArtifactIdentity("trio-batch-llm", "runs")
        self._read_only = read_only
        self._fsync = fsync
        self._conn: sqlite3.Connection | None = None
        self._claims = FileClaims(Path(f"{self._path}.run-locks"))

    @property
    def path(self) -> Path:
        return self._path

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
            if self._read_only:
                if not self._path.exists():
                    raise ArtifactStoreError(f"{self._path}: no such run database")
                uri = self._path.resolve().as_uri() + "?mode=ro"
                conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            else:
                conn = sqlite3.connect(
                    self._path, timeout=_BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False
                )
            try:
                self._prepare(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn

    def _prepare(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout={int(_BUSY_TIMEOUT_SECONDS * 1000)}")
        # Only to reuse its header checks; this object never opens its own connection.
        header_store = SqliteArtifactStore(self._path, identity=self._identity)
        if self._read_only:
            if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                raise ArtifactStoreError(f"{self._path} is not a trio-batch-llm database")
            header_store._read_header(conn)
            return
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise ArtifactStoreError(f"{self._path}: SQLite refused WAL mode (journal_mode={mode})")
        conn.execute("PRAGMA synchronous=" + ("FULL" if self._fsync else "NORMAL"))
        with self._transaction(conn):
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if app_id == 0 and tables == 0:
                header_store._create(conn)  # an artifact database that also holds runs
            elif app_id == APPLICATION_ID:
                header_store._read_header(conn)
            else:
                raise ArtifactStoreError(f"{self._path} is a SQLite database not written by trio-batch-llm")
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('runs', ?)",
                (json.dumps({"runs_schema_version": RUNS_SCHEMA_VERSION}),),
            )

    def close(self) -> None:
        self._claims.release_all()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if not self._read_only:
            try:
                # Fold the WAL back into the file so it stands alone (best effort, as the store does).
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
        with self._errors("closing"):
            conn.close()

    # -- helpers -----------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise ArtifactStoreError(f"{self._path}: {doing} failed: {exc}") from exc

    @staticmethod
    @contextlib.contextmanager
    def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def _write(self, doing: str) -> Iterator[sqlite3.Connection]:
        conn = self._require()
        if self._read_only:
            raise RunStateError(f"{self._path}: opened read-only; cannot {doing}")
        with self._errors(doing), self._transaction(conn):
            yield conn

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ArtifactStoreError(f"{self._path}: the run repository is not open")
        return self._conn

    def _row(self, conn: sqlite3.Connection, run_id: str) -> RunSnapshot:
        row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunStateError(f"{self._path}: no run named {run_id!r}")
        return _snapshot(row)

    # -- runs --------------------------------------------------------------------

    def attach(self, spec: RunSpec) -> RunSnapshot:
        identity_json = canonical_json(spec.identity.to_dict())
        with self._write(f"opening run {spec.run_id!r}") as conn:
            row = conn.execute(
                "SELECT mode, identity_fingerprint, identity FROM runs WHERE run_id = ?", (spec.run_id,)
            ).fetchone()
            if row is None:
                now = _now()
                conn.execute(
                    "INSERT INTO runs (run_id, mode, identity, identity_fingerprint, config, status,"
                    " created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'running', ?, ?)",
                    (spec.run_id, spec.mode, identity_json, identity_fingerprint(spec.identity),
                     canonical_json(spec.config), now, now),
                )
            else:
                mode, fingerprint, stored_identity = row
                if fingerprint != identity_fingerprint(spec.identity):
                    raise ArtifactMismatchError(
                        f"{self._path}: run {spec.run_id!r} was created under identity {stored_identity}, "
                        f"not {identity_json}; use another run id"
                    )
                if mode != spec.mode:
                    raise RunStateError(
                        f"{self._path}: run {spec.run_id!r} runs in mode {mode!r}, not {spec.mode!r}"
                    )
            return self._row(conn, spec.run_id)

    def snapshot(self, run_id: str) -> RunSnapshot:
        conn = self._require()
        with self._errors(f"reading run {run_id!r}"):
            return self._row(conn, run_id)

    def transition(
        self,
        run_id: str,
        *,
        from_statuses: frozenset[str],
        to: str,
        termination: RunTermination | None,
    ) -> tuple[bool, RunSnapshot]:
        term = json.dumps(termination.to_dict()) if termination is not None else None
        marks = ", ".join("?" * len(from_statuses))
        with self._write(f"changing the status of run {run_id!r}") as conn:
            changed = conn.execute(
                f"UPDATE runs SET status = ?, termination = ?, updated_at = ?"
                f" WHERE run_id = ? AND status IN ({marks})",
                (to, term, _now(), run_id, *sorted(from_statuses)),
            ).rowcount
            return changed == 1, self._row(conn, run_id)

    def complete(self, run_id: str) -> tuple[bool, RunSnapshot]:
        term = json.dumps(RunTermination("completed").to_dict())
        with self._write(f"completing run {run_id!r}") as conn:
            # The guard is here, not in the caller: incomplete ingestion is never terminal.
            changed = conn.execute(
                "UPDATE runs SET status = 'completed', termination = ?, updated_at = ?"
                " WHERE run_id = ? AND status = 'running' AND source_exhausted = 1 AND done = items",
                (term, _now(), run_id),
            ).rowcount
            return changed == 1, self._row(conn, run_id)

    # -- items and results -------------------------------------------------------

    def ingest(self, run_id: str, items: Sequence[NewItem], checkpoint: SourceCheckpoint) -> RunSnapshot:
        with self._write(f"ingesting {len(items)} item(s) into run {run_id!r}") as conn:
            (count,) = conn.execute("SELECT items FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            rows = [
                (run_id, item.item_id, count + offset, item.fingerprint, item.prompt, item.context_json)
                for offset, item in enumerate(items, start=1)
            ]
            try:
                conn.executemany(
                    "INSERT INTO run_items (run_id, item_id, ingest_seq, fingerprint, prompt, context, state)"
                    " VALUES (?, ?, ?, ?, ?, ?, 'pending')",
                    rows,
                )
            except sqlite3.IntegrityError:
                raise ValueError(self._duplicate(conn, run_id, items)) from None
            conn.execute(
                "UPDATE runs SET items = items + ?, source_position = ?, source_cursor = ?,"
                " source_fingerprint = ?, source_last_item = ?, source_exhausted = ?, updated_at = ?"
                " WHERE run_id = ?",
                (len(items), checkpoint.position, checkpoint.cursor, checkpoint.fingerprint,
                 checkpoint.last_item_id, int(checkpoint.exhausted), _now(), run_id),
            )
            return self._row(conn, run_id)

    @staticmethod
    def _duplicate(conn: sqlite3.Connection, run_id: str, items: Sequence[NewItem]) -> str:
        seen: set[str] = set()
        for item in items:
            if item.item_id in seen:
                break
            seen.add(item.item_id)
        else:
            for item in items:
                found = conn.execute(
                    "SELECT 1 FROM run_items WHERE run_id = ? AND item_id = ?", (run_id, item.item_id)
                ).fetchone()
                if found:
                    break
            else:  # pragma: no cover - the IntegrityError had another cause
                return f"run {run_id!r}: could not store the slice (integrity error)"
        return f"duplicate item_id={item.item_id!r}: every item of a run needs a unique id"

    def pending(self, run_id: str, *, after_ingest_seq: int, limit: int) -> list[PendingItem]:
        conn = self._require()
        with self._errors(f"reading the pending items of run {run_id!r}"):
            rows = conn.execute(
                "SELECT ingest_seq, item_id, prompt, context FROM run_items"
                " WHERE run_id = ? AND state = 'pending' AND ingest_seq > ? ORDER BY ingest_seq LIMIT ?",
                (run_id, after_ingest_seq, limit),
            ).fetchall()
        return [PendingItem(seq, item_id, prompt, context) for seq, item_id, prompt, context in rows]

    def record(self, run_id: str, results: Sequence[NewResult]) -> RunSnapshot:
        with self._write(f"recording {len(results)} result(s) of run {run_id!r}") as conn:
            (sequence,) = conn.execute(
                "SELECT last_sequence FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            done = succeeded = inp = out = total = 0
            for result in results:
                sequence_if_new = sequence + 1
                marked = conn.execute(
                    "UPDATE run_items SET state = 'done', result_sequence = ?, prompt = NULL, context = NULL"
                    " WHERE run_id = ? AND item_id = ? AND state = 'pending'",
                    (sequence_if_new, run_id, result.item_id),
                ).rowcount
                if not marked:
                    continue  # already done (or never ingested): never a second result
                sequence = sequence_if_new
                conn.execute(
                    "INSERT INTO run_results (run_id, sequence, item_id, success, error_category, result)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (run_id, sequence, result.item_id, int(result.success), result.error_category,
                     result.result_json),
                )
                done += 1
                succeeded += int(result.success)
                inp += result.input_tokens
                out += result.output_tokens
                total += result.total_tokens
            conn.execute(
                "UPDATE runs SET done = done + ?, succeeded = succeeded + ?, failed = failed + ?,"
                " input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
                " total_tokens = total_tokens + ?, last_sequence = ?, updated_at = ? WHERE run_id = ?",
                (done, succeeded, done - succeeded, inp, out, total, sequence, _now(), run_id),
            )
            return self._row(conn, run_id)

    def results(self, run_id: str, *, after_sequence: int, limit: int | None) -> list[StoredResult]:
        conn = self._require()
        with self._errors(f"reading the results of run {run_id!r}"):
            rows = conn.execute(
                "SELECT sequence, item_id, result FROM run_results"
                " WHERE run_id = ? AND sequence > ? ORDER BY sequence LIMIT ?",
                (run_id, after_sequence, -1 if limit is None else limit),
            ).fetchall()
        return [StoredResult(seq, item_id, text) for seq, item_id, text in rows]

    # -- claims ------------------------------------------------------------------

    def try_claim(self, run_id: str) -> bool:
        return self._claims.try_claim(run_id)

    def release(self, run_id: str) -> None:
        self._claims.release(run_id)
