"""One trio-batch-llm SQLite file, as both its users open it: the artifact store and the run repository.

:class:`SqliteFile` owns what the two have in common, so they cannot drift apart:

* **Provably ours.** A file is written only when it is ours or holds nothing
  (:func:`classify_database`): our ``application_id`` *and* our tables, or an
  empty database (no schema, ``application_id`` and ``user_version`` both 0;
  a new, zero-byte file is one). Anything else, including a database with
  only our ``application_id``, is refused before the first write (even before
  WAL mode is set, which would change the file's header), and never migrated.
* **The header.** An empty file becomes an artifact database (the ``meta``
  and ``results`` tables, the ``application_id``, a header naming the format,
  its version and the identity it was created under) inside the opening
  transaction; an existing one must carry a header this library can read.
  The run repository keeps its tables in the same file, so either may create it.
* **Pragmas.** WAL mode, ``synchronous=NORMAL`` (durable against a process
  crash) or ``FULL`` (``fsync=True``: against power loss too).
* **Waiting for another connection's lock, with one bound.** A connection's
  busy timeout makes most lock waits wait; not all. Where waiting could
  deadlock, SQLite returns ``SQLITE_BUSY`` at once without calling its busy
  handler. The case that bites a database shared by processes: ``PRAGMA
  journal_mode=WAL`` on a file still in rollback mode while another
  connection holds its write lock, which is exactly what every other process
  sees while the first one turns a fresh file into a WAL database. (A read
  transaction upgrading to a write is another; writes here only ever happen
  inside ``BEGIN IMMEDIATE``, which takes the write lock first.) So each step
  that takes a lock runs through :func:`retry_busy`: on ``SQLITE_BUSY`` it
  sleeps briefly and tries again, the connection's own busy timeout cut to
  the time left, until ``busy_timeout`` seconds after the first try. Only then
  does the error reach the caller, naming the database and the bound.

Blocking by design: every call runs in its owner's worker thread (:mod:`.._backends._worker_gate`).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import logging
import math
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, final

from .._values._artifact_identity import ArtifactIdentity
from .._values._errors import ArtifactStoreError, ConfigurationError
from .._version import __version__
from ._fingerprint import encode_record, identity_fingerprint
from ._protocol import FORMAT_NAME, FORMAT_VERSION, check_format_version

__all__ = [
    "APPLICATION_ID",
    "SqliteFile",
    "check_busy_timeout",
    "classify_database",
    "is_busy",
    "problem_of",
    "retry_busy",
    "set_busy_timeout",
    "transaction",
]

T = TypeVar("T")

logger = logging.getLogger("trio_batch_llm.artifacts")

APPLICATION_ID: Final = 0x54424C4C  # "TBLL"
_OUR_TABLES: Final = frozenset({"meta", "results"})
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

_SQLITE_BUSY: Final = 5
_NEEDS_RECOVERY: Final = frozenset({"SQLITE_READONLY_ROLLBACK", "SQLITE_READONLY_RECOVERY"})
_MAX_MILLISECONDS: Final = 2**31 - 1  # sqlite3_busy_timeout() takes a C int
_FIRST_PAUSE: Final = 0.001
_LONGEST_PAUSE: Final = 0.05


# -- waiting for locks -------------------------------------------------------------------


def check_busy_timeout(value: object) -> float:
    """``value`` as seconds: a real number, finite and >= 0; else :class:`ConfigurationError`."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if isinstance(value, (bool, str, bytes)) or not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError("busy_timeout", value, "must be a finite number of seconds >= 0")
    return seconds


def set_busy_timeout(conn: sqlite3.Connection, seconds: float) -> None:
    conn.execute(f"PRAGMA busy_timeout={min(_MAX_MILLISECONDS, max(0, int(seconds * 1000)))}")


def is_busy(exc: BaseException) -> bool:
    """``SQLITE_BUSY`` or one of its extended codes (recovery, snapshot, timeout)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and isinstance(code, int) and code & 0xFF == _SQLITE_BUSY


def retry_busy(conn: sqlite3.Connection, bound: float, step: Callable[[], T]) -> T:
    """``step()``, tried again on ``SQLITE_BUSY`` until ``bound`` seconds have passed; see the module
    docstring. ``step`` must be safe to repeat after a ``SQLITE_BUSY`` (a lock it did not get)."""
    deadline = time.monotonic() + bound
    pause = _FIRST_PAUSE
    shortened = False
    try:
        while True:
            try:
                return step()
            except sqlite3.OperationalError as exc:
                remaining = deadline - time.monotonic()
                if not is_busy(exc) or remaining <= 0:
                    raise
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, _LONGEST_PAUSE)
            # The next try's own wait, if SQLite waits at all this time, ends at the bound too.
            set_busy_timeout(conn, deadline - time.monotonic())
            shortened = True
    finally:
        if shortened:
            set_busy_timeout(conn, bound)


def problem_of(exc: BaseException, bound: float) -> str:
    """What ``exc`` says went wrong, for a message; a lock held past ``bound`` seconds says so,
    since SQLite's own words for it ("database is locked") name neither the wait nor its cause."""
    if not is_busy(exc):
        return str(exc)
    return (
        f"the database stayed locked by another connection for longer than busy_timeout={bound:g} s "
        "(another process holds its write lock)"
    )


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection, bound: float, *, immediate: bool = True) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` (or a deferred ``BEGIN``: a read snapshot) … ``COMMIT``, rolled back if
    the body raises; the BEGIN goes through :func:`retry_busy` with ``bound``.

    A write takes the write lock before its first read (IMMEDIATE), so no statement inside ever
    needs to upgrade a read lock: the one wait SQLite may refuse at once, without its busy
    handler. The artifact store, the run repository and the response cache begin theirs here.
    """
    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"
    retry_busy(conn, bound, lambda: conn.execute(begin))
    try:
        yield
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


# -- whose file it is ----------------------------------------------------------------------


def classify_database(conn: sqlite3.Connection, path: object) -> Literal["empty", "ours"]:
    """Whether the open database is empty (may be initialised) or ours; ArtifactStoreError otherwise.

    Reads only: nothing is written, whatever the answer. Outside a transaction
    the reads share one read transaction: four separate snapshots could
    straddle another process's commit creating the file, and show its tables
    without its ``application_id`` (our own file, refused as foreign).
    """
    own_snapshot = not conn.in_transaction
    try:
        if own_snapshot:
            conn.execute("BEGIN")  # deferred: the first read takes the snapshot, no write lock
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
    finally:
        if own_snapshot and conn.in_transaction:
            conn.execute("ROLLBACK")  # nothing was written: this only ends the snapshot
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


# -- the file ------------------------------------------------------------------------------


@final
class SqliteFile:
    """How trio-batch-llm opens, initialises, writes and closes one SQLite file; see the module docstring.

    Holds no connection: its owner keeps the one :meth:`connect` returns and
    uses it only in its worker thread.
    """

    __slots__ = ("_busy_timeout", "_fsync", "_path")

    def __init__(self, path: Path, *, busy_timeout: float, fsync: bool = False) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._fsync = fsync

    @property
    def path(self) -> Path:
        return self._path

    @property
    def busy_timeout(self) -> float:
        return self._busy_timeout

    def connect(self, *, read_only: bool = False) -> sqlite3.Connection:
        """A connection in autocommit mode (transactions are ours: :meth:`transaction`).

        For writing, a foreign file is refused first (:func:`classify_database`,
        before WAL mode would change it), then WAL mode and ``synchronous`` are
        set. A read-only connection changes nothing (but see :meth:`_connect_read_only`); its
        caller checks the file.
        """
        if read_only:
            return self._connect_read_only()
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            set_busy_timeout(conn, self._busy_timeout)  # not connect(timeout=): it overflows past 24 days
            classify_database(conn, self._path)
            mode = self.retry(conn, lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
            if str(mode).lower() != "wal":
                raise ArtifactStoreError(f"{self._path}: SQLite refused WAL mode (journal_mode={mode})")
            conn.execute("PRAGMA synchronous=" + ("FULL" if self._fsync else "NORMAL"))
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect_read_only(self) -> sqlite3.Connection:
        """A read-only connection; first, the recovery a writer killed mid-transaction left undone.

        A hot rollback journal (a writer killed before the file was in WAL mode, e.g. while
        it was being created) or a WAL index to rebuild must be replayed before anything can
        be read, and a read-only connection may not: SQLite refuses every read with
        ``SQLITE_READONLY_ROLLBACK`` / ``_RECOVERY``. A read-write connection then does only
        that, as the store's own next open would: the dead writer's uncommitted transaction
        is undone, nothing committed changes, and no statement of ours writes.
        """
        try:
            return self._open_read_only()
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorname", "") not in _NEEDS_RECOVERY:
                raise
        if not self._header_allows_recovery():
            raise ArtifactStoreError(
                f"{self._path}: a writer died in the middle of a transaction and the file is not"
                " provably ours, so it is not recovered here; open it with the program that wrote it"
            )
        recover = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            set_busy_timeout(recover, self._busy_timeout)
            self.retry(recover, functools.partial(_first_read, recover))
        finally:
            recover.close()
        return self._open_read_only()

    def _open_read_only(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None,
                               check_same_thread=False)
        try:
            set_busy_timeout(conn, self._busy_timeout)
            self.retry(conn, functools.partial(_first_read, conn))
        except BaseException:
            conn.close()
            raise
        return conn

    def _header_allows_recovery(self) -> bool:
        """Whether the file's header, read as bytes, is ours (application id), or of a database in
        which no table was ever created (schema cookie 0): a file being created when its writer died."""
        with self._path.open("rb") as raw:
            header = raw.read(100)
        if len(header) < 100:
            return True
        return (int.from_bytes(header[68:72], "big") == APPLICATION_ID
                or int.from_bytes(header[40:44], "big") == 0)

    def retry(self, conn: sqlite3.Connection, step: Callable[[], T]) -> T:
        """``step()`` through :func:`retry_busy`, bounded by this file's ``busy_timeout``."""
        return retry_busy(conn, self._busy_timeout, step)

    def transaction(self, conn: sqlite3.Connection) -> contextlib.AbstractContextManager[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (:func:`transaction`), bounded by this file's ``busy_timeout``."""
        return transaction(conn, self._busy_timeout)

    @contextlib.contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """SQLite and OS errors as ArtifactStoreError naming the file (the original as the cause);
        a lock held past the bound says so."""
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            problem = problem_of(exc, self._busy_timeout)
            raise ArtifactStoreError(f"{self._path}: {doing} failed: {problem}") from exc

    def initialise(self, conn: sqlite3.Connection, identity: ArtifactIdentity) -> dict[str, Any] | None:
        """Inside the opening transaction: make an empty file an artifact database created under
        ``identity`` (``None``), or return the header of one that is ours already."""
        # Again, under the write lock: another process may have created it meanwhile.
        if classify_database(conn, self._path) == "empty":
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            header = {
                "format": FORMAT_NAME,
                "version": FORMAT_VERSION,
                "identity": identity.to_dict(),
                "identity_fingerprint": identity_fingerprint(identity),
                "created_at": datetime.datetime.now(datetime.UTC).isoformat(),
                "library_version": __version__,
            }
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('header', ?)", (encode_record(header).decode("utf-8"),)
            )
            return None
        return self.read_header(conn)

    def check_ours(self, conn: sqlite3.Connection, what: str) -> dict[str, Any]:
        """For a reader: the header of a file that is ours, else ArtifactStoreError (not ``what``)."""
        if classify_database(conn, self._path) != "ours":
            raise ArtifactStoreError(f"{self._path} is not a trio-batch-llm {what}")
        return self.read_header(conn)

    def read_header(self, conn: sqlite3.Connection) -> dict[str, Any]:
        row = conn.execute("SELECT value FROM meta WHERE key = 'header'").fetchone()
        header = json.loads(row[0]) if row else None
        if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
            raise ArtifactStoreError(f"{self._path}: the meta table holds no trio-batch-llm header")
        check_format_version(self._path, header)
        return header

    def close(self, conn: sqlite3.Connection, *, fold_wal: bool) -> None:
        """Close ``conn``; with ``fold_wal``, first fold the WAL back into the file so it stands alone.

        Best effort and without waiting: every commit is durable already, a
        TRUNCATE checkpoint would wait the whole busy timeout for any other
        connection's reader or writer, and the last connection to close folds
        the WAL anyway (the next open replays it otherwise).
        """
        if fold_wal:
            try:
                set_busy_timeout(conn, 0)
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                if not is_busy(exc):
                    logger.warning("%s: could not checkpoint the WAL on close: %s", self._path, exc)
        with self.errors("closing"):
            conn.close()


def _first_read(conn: sqlite3.Connection) -> object:
    """A read that makes SQLite replay whatever recovery a file needs (or refuse, read-only)."""
    return conn.execute("PRAGMA schema_version").fetchone()
