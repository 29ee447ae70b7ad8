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

A file is written only when it is provably ours or holds nothing
(:func:`classify_database`): our ``application_id`` *and* our tables, or an
empty database (no tables, ``application_id`` and ``user_version`` both 0; a
new, zero-byte file is one). Anything else, including a database with only
our ``application_id``, is refused before the first write (even before WAL
mode is set, which would change the file's header), and never migrated. The
run repository opens its files through the same check.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Literal, final

from .._values._config import ArtifactIdentity
from .._values._errors import ArtifactStoreError
from .._values._results import WorkItemResult
from .._version import __version__
from ._codec import JSONValue
from ._fingerprint import encode_record
from ._protocol import FORMAT_NAME, FORMAT_VERSION, StoredRecord, encode_result
from ._sqlite_locks import retry_busy
from ._store_base import ThreadedStore, logger

__all__ = ["APPLICATION_ID", "SqliteArtifactStore", "classify_database"]

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
_OUR_TABLES: Final = frozenset({"meta", "results"})


def classify_database(conn: sqlite3.Connection, path: object) -> Literal["empty", "ours"]:
    """Whether the open database is empty (may be initialised) or ours; ArtifactStoreError otherwise.

    Reads only: nothing is written, whatever the answer.
    """
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        user_version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        entries = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", None) != "SQLITE_NOTADB":
            raise
        raise ArtifactStoreError(
            f"{path}: opening failed: {exc}: it is not a trio-batch-llm database; it was left untouched"
        ) from exc
    if app_id == APPLICATION_ID and tables >= _OUR_TABLES:
        return "ours"
    if app_id == 0 and user_version == 0 and entries == 0:
        return "empty"
    if app_id == APPLICATION_ID:
        why = f"it has trio-batch-llm's application_id but not its tables ({', '.join(sorted(_OUR_TABLES))})"
    elif app_id != 0:
        why = f"its application_id is {app_id:#x}, not trio-batch-llm's ({APPLICATION_ID:#x})"
    elif tables or entries:
        names = ", ".join(sorted(tables)) or "no tables"
        why = f"it holds {entries} schema object(s) ({names}) and no trio-batch-llm application_id"
    else:
        why = f"its user_version is {user_version}, set by another program"
    raise ArtifactStoreError(
        f"{path} is not a trio-batch-llm database ({why}); a SQLite database not written by "
        "trio-batch-llm is never changed or migrated, and it was left untouched"
    )


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

    Outputs are kept only when they come back from JSON as themselves (plain
    JSON); pass ``output_encoder`` and ``output_decoder`` together to keep any
    other type. A result that cannot be kept raises :class:`ArtifactEncodeError`
    from ``append()`` and writes nothing.
    """

    _position_name = "row"

    _io_error_types = (OSError, sqlite3.Error)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        identity: ArtifactIdentity,
        fsync: bool = False,
        store_prompts: bool = False,
        allow_identity_mismatch: bool = False,
        output_encoder: Callable[[Any], JSONValue] | None = None,
        output_decoder: Callable[[JSONValue], Any] | None = None,
    ) -> None:
        super().__init__(
            path,
            identity=identity,
            store_prompts=store_prompts,
            allow_identity_mismatch=allow_identity_mismatch,
            output_encoder=output_encoder,
            output_decoder=output_decoder,
        )
        self._fsync = bool(fsync)
        self._conn: sqlite3.Connection | None = None

    # -- event loop side ---------------------------------------------------------

    def _encode(
        self, result: WorkItemResult[Any], output: JSONValue, fingerprint: str, prompt: str | None
    ) -> Row:
        # The base class checked the id: valid UTF-8 text, as SQLite text must be.
        category = result.error_category.value if result.error_category else None
        text = encode_result(result, lambda payload: payload, output=output).decode("utf-8")
        return (
            result.item_id, fingerprint, self._identity_fp, int(result.success), category, text,
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
        classify_database(conn, self._path)  # before WAL mode: that would already change the file
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
            # Again, under the write lock: another process may have created it meanwhile.
            if classify_database(conn, self._path) == "empty":
                self._create(conn)
            else:
                self._check_identity(self._read_header(conn)["identity"])
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
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('header', ?)", (encode_record(header).decode("utf-8"),)
        )

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
                if classify_database(conn, self._path) != "ours":
                    raise ArtifactStoreError(f"{self._path} is not a trio-batch-llm artifact database")
                self._read_header(conn)
                with contextlib.closing(conn.execute(_SELECT_ALL)) as rows:
                    for row in rows:
                        yield self._decoded(self._stored(row)).to_result(replayed=False)
            finally:
                conn.close()
