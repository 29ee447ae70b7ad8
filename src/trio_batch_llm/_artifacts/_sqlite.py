"""``SqliteArtifactStore``: a checkpoint in one SQLite database (WAL mode).

One connection per store, created with ``check_same_thread=False`` and only
ever used in the store's worker thread, behind its ``CapacityLimiter(1)`` and
I/O lock: no SQLite call runs on the event loop. Concurrent appends are
grouped into one ``BEGIN IMMEDIATE … COMMIT`` transaction; each append returns
after the commit that contains it.

Schema (``PRAGMA application_id`` marks the file as ours)::

    meta(key TEXT PRIMARY KEY, value TEXT)        -- key 'header': format, version, identity
    results(seq INTEGER PRIMARY KEY, item_id, fingerprint, identity,
            success, error_category, result JSON, prompt)   -- indexed by (item_id, seq)

Records are only inserted; the newest ``seq`` for an item supersedes older
ones, and the history stays for audit.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any, Final, final

from .._config import ArtifactIdentity
from .._errors import ArtifactStoreError
from .._results import WorkItemResult
from .._version import __version__
from ._protocol import FORMAT_NAME, FORMAT_VERSION, StoredRecord, encode_result
from ._sqlite_locks import retry_busy
from ._store_base import ThreadedStore, logger

__all__ = ["SqliteArtifactStore"]

APPLICATION_ID: Final = 0x54424C4C  # "TBLL"
_BUSY_TIMEOUT_SECONDS: Final = 5.0

_SCHEMA: Final = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE results (
        seq INTEGER PRIMARY KEY,
        item_id TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        identity TEXT NOT NULL,
        success INTEGER NOT NULL,
        error_category TEXT,
        result TEXT NOT NULL,
        prompt TEXT
    )""",
    "CREATE INDEX results_by_item ON results (item_id, seq)",
)
_SELECT_ALL: Final = "SELECT seq, item_id, fingerprint, identity, result, prompt FROM results ORDER BY seq"
_INSERT: Final = (
    "INSERT INTO results (item_id, fingerprint, identity, success, error_category, result, prompt)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)

Row = tuple[str, str, str, int, str | None, str, str | None]


def _utf8_safe(text: str) -> str:
    """SQLite text must be UTF-8; a lone surrogate is kept as an escape (prompts are audit-only)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


@final
class SqliteArtifactStore(ThreadedStore[Row]):
    """Checkpoint results to a SQLite database in WAL mode; see the module docstring.

    A commit is durable against a process crash (``synchronous=NORMAL``);
    ``fsync=True`` selects ``synchronous=FULL``, durable against power loss.
    Raw prompts are stored only with ``store_prompts=True``.
    """

    _io_error_types = (OSError, sqlite3.Error)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        identity: ArtifactIdentity,
        fsync: bool = False,
        store_prompts: bool = False,
        allow_identity_mismatch: bool = False,
    ) -> None:
        super().__init__(
            path,
            identity=identity,
            store_prompts=store_prompts,
            allow_identity_mismatch=allow_identity_mismatch,
        )
        self._fsync = bool(fsync)
        self._conn: sqlite3.Connection | None = None

    # -- event loop side ---------------------------------------------------------

    def _encode(self, result: WorkItemResult[Any], fingerprint: str, prompt: str | None) -> Row:
        item_id = result.item_id
        try:
            item_id.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"item id {item_id!r} is not valid UTF-8 text") from exc
        category = result.error_category.value if result.error_category else None
        text = encode_result(result, lambda payload: payload).decode("utf-8")
        return (
            item_id, fingerprint, self._identity_fp, int(result.success), category, text,
            None if prompt is None else _utf8_safe(prompt),
        )

    # -- thread side -------------------------------------------------------------

    def _open_sync(self) -> None:
        with self._io_errors("opening"):
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
        # SQLite refuses these at once, whatever the busy timeout, while another process is turning
        # a fresh file into a WAL database: hence the retries (see _sqlite_locks).
        mode = retry_busy(
            conn, _BUSY_TIMEOUT_SECONDS, lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        )
        if str(mode).lower() != "wal":
            raise ArtifactStoreError(f"{self._path}: SQLite refused WAL mode (journal_mode={mode})")
        conn.execute("PRAGMA synchronous=" + ("FULL" if self._fsync else "NORMAL"))
        retry_busy(conn, _BUSY_TIMEOUT_SECONDS, lambda: conn.execute("BEGIN IMMEDIATE"))
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if app_id == 0 and tables == 0:
                self._create(conn)
            elif app_id == APPLICATION_ID:
                self._check_identity(self._read_header(conn)["identity"])
            else:
                raise ArtifactStoreError(f"{self._path} is a SQLite database not written by trio-batch-llm")
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def _create(self, conn: sqlite3.Connection) -> None:
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
        header = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "identity": self._identity.to_dict(),
            "identity_fingerprint": self._identity_fp,
            "created_at": datetime.datetime.now(datetime.UTC).isoformat(),
            "library_version": __version__,
        }
        conn.execute("INSERT INTO meta (key, value) VALUES ('header', ?)", (json.dumps(header),))

    def _read_header(self, conn: sqlite3.Connection) -> dict[str, Any]:
        row = conn.execute("SELECT value FROM meta WHERE key = 'header'").fetchone()
        header = json.loads(row[0]) if row else None
        if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
            raise ArtifactStoreError(f"{self._path}: the meta table holds no trio-batch-llm header")
        version = header.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ArtifactStoreError(
                f"{self._path}: format version {version!r} is newer than this library reads "
                f"({FORMAT_VERSION}); upgrade trio-batch-llm"
            )
        return header

    def _require_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ArtifactStoreError(f"{self._path}: the store is not open")
        return self._conn

    def _stored(self, row: tuple[Any, ...]) -> StoredRecord:
        seq, item_id, fingerprint, identity, text, prompt = row
        try:
            result = json.loads(text)
        except ValueError:
            result = None
        if not isinstance(result, dict):
            raise ArtifactStoreError(f"{self._path}: results row {seq} holds a corrupt result")
        return StoredRecord(
            item_id=item_id,
            fingerprint=fingerprint,
            result=result,
            identity_matches=identity == self._identity_fp,
            prompt=prompt,
            position=seq,
        )

    def _load_sync(self) -> dict[str, StoredRecord]:
        conn = self._require_conn()
        with self._io_errors("loading"), contextlib.closing(conn.execute(_SELECT_ALL)) as rows:
            # closing(): a corrupt row must not leave the statement open (it would block the close).
            return {record.item_id: record for record in map(self._stored, rows)}

    def _count_sync(self) -> int:
        conn = self._require_conn()
        with self._io_errors("counting records"):
            return int(conn.execute("SELECT count(*) FROM results").fetchone()[0])

    def _write_sync(self, items: Sequence[Row]) -> None:
        conn = self._require_conn()
        with self._io_errors(f"committing {len(items)} record(s)"):
            retry_busy(conn, _BUSY_TIMEOUT_SECONDS, lambda: conn.execute("BEGIN IMMEDIATE"))
            try:
                conn.executemany(_INSERT, items)
                conn.execute("COMMIT")
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")

    def _close_sync(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            # Fold the WAL back into the database so the file stands alone. Best
            # effort: every commit is already durable, and the next open replays the WAL.
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            logger.warning("%s: could not checkpoint the WAL on close: %s", self._path, exc)
        with self._io_errors("closing"):
            conn.close()

    def iter_results(self) -> Iterator[WorkItemResult[Any]]:
        """Every stored result in write order, ``replayed=False``.

        Blocking; for offline inspection. Opens its own read-only connection,
        works whether or not the store is open, and does not check the identity.
        """
        if not self._path.exists():
            raise ArtifactStoreError(f"{self._path}: no such artifact database")
        with self._io_errors("reading"):
            conn = sqlite3.connect(self._path.resolve().as_uri() + "?mode=ro", uri=True)
            try:
                if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                    raise ArtifactStoreError(f"{self._path} is not a trio-batch-llm artifact database")
                self._read_header(conn)
                with contextlib.closing(conn.execute(_SELECT_ALL)) as rows:
                    for row in rows:
                        yield self._stored(row).to_result(replayed=False)
            finally:
                conn.close()
