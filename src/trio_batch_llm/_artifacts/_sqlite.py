"""``SqliteArtifactStore``: a checkpoint in one SQLite database (WAL mode).

One connection per store, created with ``check_same_thread=False`` and only
ever used through the store's worker gate (one call at a time, in a worker
thread): no SQLite call runs on the event loop. Concurrent appends are
grouped into one ``BEGIN IMMEDIATE … COMMIT`` transaction; each append returns
after the commit that contains it.

Schema (``PRAGMA application_id`` marks the file as ours)::

    meta(key TEXT PRIMARY KEY, value TEXT)        -- key 'header': format, version, identity
    results(seq INTEGER PRIMARY KEY, item_id, fingerprint, identity,
            success, error_category, result JSON, prompt)   -- indexed by (item_id, seq)

Records are only inserted; the newest ``seq`` for an item supersedes older
ones, and the history stays for audit.

The file is opened, initialised and closed by :class:`SqliteFile`, which the
run repository uses too: a file is written only when it is provably ours or
holds nothing, WAL mode, and each lock wait bounded (see :mod:`._sqlite_file`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, final

from .._values._artifact_identity import ArtifactIdentity
from .._values._checks import non_negative, whole
from .._values._errors import ArtifactStoreError
from .._values._results import WorkItemResult
from ._codec import JSONValue
from ._protocol import StoredRecord, encode_result
from ._sqlite_file import SqliteFile
from ._store_base import ThreadedStore

__all__ = ["SqliteArtifactStore"]

_BUSY_TIMEOUT_SECONDS: Final = 5.0
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

    Outputs are kept only when they come back from JSON as themselves (plain
    JSON); pass ``output_encoder`` and ``output_decoder`` together to keep any
    other type. A result that cannot be kept raises :class:`ArtifactEncodeError`
    from ``append()`` and writes nothing.

    ``busy_timeout_seconds``: how long a write waits for another connection's lock
    before it fails; ``read_batch_size``: rows fetched at a time by :meth:`iter_results`.
    ``identity=None`` (the default) infers it from the strategy that runs the
    items (:func:`infer_artifact_identity`: provider, model, fingerprints of
    the system prompt, params and response schema); an explicit identity wins.
    """

    _position_name = "row"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        identity: ArtifactIdentity | None = None,
        fsync: bool = False,
        store_prompts: bool = False,
        allow_identity_mismatch: bool = False,
        output_encoder: Callable[[Any], JSONValue] | None = None,
        output_decoder: Callable[[JSONValue], Any] | None = None,
        busy_timeout_seconds: float = _BUSY_TIMEOUT_SECONDS,
        read_batch_size: int = 1000,
    ) -> None:
        non_negative("busy_timeout_seconds", busy_timeout_seconds)
        whole("read_batch_size", read_batch_size, minimum=1, allow_none=False)
        self._read_batch = read_batch_size
        super().__init__(
            path,
            identity=identity,
            store_prompts=store_prompts,
            allow_identity_mismatch=allow_identity_mismatch,
            output_encoder=output_encoder,
            output_decoder=output_decoder,
        )
        self._file = SqliteFile(self._path, busy_timeout=float(busy_timeout_seconds), fsync=bool(fsync))
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

    @contextlib.contextmanager
    def _io_errors(self, doing: str) -> Iterator[None]:
        with self._file.errors(doing):  # a lock held past the bound says so
            yield

    def _open_sync(self) -> None:
        with self._io_errors("opening"):
            conn = self._file.connect()
            try:
                with self._file.transaction(conn):
                    header = self._file.initialise(conn, self._known_identity)
                    if header is not None:
                        self._check_identity(header["identity"])
            except BaseException:
                conn.close()
                raise
            self._conn = conn

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
        with self._io_errors(f"committing {len(items)} record(s)"), self._file.transaction(conn):
            conn.executemany(_INSERT, items)

    def _close_sync(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._file.close(conn, fold_wal=True)

    def iter_results(self) -> Iterator[WorkItemResult[Any]]:
        """Every stored result in write order, ``replayed=False``.

        Blocking; for offline inspection. Opens its own read-only connection,
        works whether or not the store is open, and does not check the identity.
        """
        if not self._path.exists():
            raise ArtifactStoreError(f"{self._path}: no such artifact database")
        with self._io_errors("reading"):
            conn = self._file.connect(read_only=True)
            try:
                self._file.check_ours(conn, "artifact database")
                with contextlib.closing(conn.execute(_SELECT_ALL)) as cursor:
                    while rows := cursor.fetchmany(self._read_batch):
                        for row in rows:
                            yield self._decoded(self._stored(row)).to_result(replayed=False)
            finally:
                conn.close()
