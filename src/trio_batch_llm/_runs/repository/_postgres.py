"""``PostgresRunRepository``: run state in a PostgreSQL database (psycopg 3, synchronous).

Over 400 lines because it implements the whole RunRepository protocol, one short method per call.

The same tables and behaviour as :class:`SqliteRunRepository`
(:mod:`._postgres_tables`), for runs that many processes on many machines
drive. Synchronous and blocking like SQLite: the async side calls it from its
worker gate (:class:`RepositoryClient`; psycopg's own async API is
asyncio-only). Each public method is one transaction, as :mod:`._protocol`
asks (:mod:`._postgres_writes` holds the longer ones).

The right to drive a run is a session-level advisory lock: it dies with the
connection, so a killed process's claim is free at once. If the connection
is lost (a server restart, a network cut) the next call reconnects and takes
the claims it held again; when another process took one meanwhile, that call
raises :class:`ClaimLostError` saying the claim was lost, and ``ingest`` keeps
refusing for that run until this object claims it again (one ingester at a time).

Errors: a connection-level failure (refused, reset, the server shutting down
or starting up, a name that does not resolve) raises
:class:`DatabaseUnavailableError` -- the async side (:class:`RepositoryClient`)
retries those within its outage window -- and every other database error
:class:`ArtifactStoreError`.

The database is named by a ``postgresql://`` URL or a libpq keyword string
(``"host=... dbname=..."``, :mod:`._conninfo`). Credentials: either may carry a
password (or psycopg finds one in ``PGPASSWORD``/``~/.pgpass``). It is used to
connect and nowhere else: ``location``, the repr and every error message show
the store with its password (and a URL's userinfo and key-like query values)
redacted, and errors from the server have any occurrence of the password
removed too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Literal, final

from ..._artifacts._fingerprint import canonical_json, identity_fingerprint
from ..._values._errors import (
    ArtifactMismatchError,
    ArtifactStoreError,
    ConfigurationError,
    DatabaseUnavailableError,
)
from ..._values._urls import REDACTED
from .._schema import (
    LIVE_SUBMISSION_STATES,
    ClaimLostError,
    NewItem,
    NewResult,
    NewSubmission,
    PendingItem,
    RunSnapshot,
    RunSpec,
    RunStateError,
    RunTermination,
    SourceCheckpoint,
    StoredResult,
    SubmissionRecord,
    SubmissionState,
)
from . import _leases as leases
from . import _postgres_writes as writes
from ._conninfo import display, is_postgres_store, is_postgres_url, secret_of
from ._leases import POSTGRES, LeaseReport
from ._postgres_tables import (
    MIGRATION_LOCK,
    MIGRATIONS,
    SCHEMA_TABLE,
    SCHEMA_VERSION,
    SNAPSHOT,
    SUBMISSION_COLUMNS,
)
from ._sqlite_tables import (
    ALL_SUBMISSION_STATES,
    check_new_submission,
    check_states,
    decode_snapshot,
    utc_now,
)

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "PostgresRunRepository", "is_postgres_store", "is_postgres_url"]

DEFAULT_CONNECT_TIMEOUT: Final = 10.0
# A process stopped mid-transaction holds the run's row lock: the server ends its session after this.
DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT: Final = 5.0
_CLAIM_SALT: Final = b"trio-batch-llm run claim\x00"
# SQLSTATEs of a server that is going away or not there yet: admin_shutdown, crash_shutdown,
# cannot_connect_now (starting up, shutting down). Class 08 (connection exceptions) and
# errors without a SQLSTATE (refused, reset, closed, no such host) count as unreachable too.
_GOING_AWAY: Final = frozenset({"57P01", "57P02", "57P03"})
_NOT_UP: Final = ("shutting down", "starting up", "in recovery", "not yet accepting", "too many clients",
                  "terminating connection")


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server could not be reached (rather than that it refused something)."""
    import psycopg

    if isinstance(exc, OSError):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    if state is None:
        # A connection attempt that failed: the network's word (refused, reset, timed out, no such
        # host) is an outage; the server's (a FATAL line) only when it is going away or not up yet,
        # never a refused login or a database that does not exist.
        text = str(exc).lower()
        return "fatal:" not in text or any(marker in text for marker in _NOT_UP)
    return state.startswith("08") or state in _GOING_AWAY


def _claim_key(run_id: str) -> int:
    digest = hashlib.sha256(_CLAIM_SALT + run_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@final
class PostgresRunRepository:
    """Runs in a PostgreSQL database named by a ``postgresql://`` URL or a libpq keyword string;
    see the module docstring.

    Not thread-safe: one caller at a time (the worker gate). ``connect_timeout``
    (seconds) bounds each connection attempt; ``statement_timeout`` (seconds,
    or None) bounds each statement, lock waits included;
    ``idle_in_transaction_timeout`` (seconds, or None) ends the session of a
    process stopped in the middle of a transaction (SIGSTOP, a paused VM), which
    would otherwise hold the run's row lock and stall every other driver for as
    long as it is stopped. Its claims go with the session; its lease expires as
    usual. Our transactions never wait between statements, so any bound well
    above a scheduling hiccup is safe.
    """

    def __init__(
        self,
        url: str,
        *,
        read_only: bool = False,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        statement_timeout: float | None = 60.0,
        idle_in_transaction_timeout: float | None = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not is_postgres_store(url):
            raise ConfigurationError("url", display(str(url)),
                                     "must start with postgresql:// or be a libpq keyword string (host=...)")
        if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, (int, float)) \
                or not connect_timeout > 0:
            raise ConfigurationError("connect_timeout", connect_timeout, "must be a number of seconds > 0")
        idle = idle_in_transaction_timeout
        if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float))
                                 or not idle >= 0.001):
            raise ConfigurationError("idle_in_transaction_timeout", idle,
                                     "must be a number of seconds >= 0.001, or None")
        self._url = url
        self._secret = secret_of(url)
        self._location = display(url)
        self._read_only = read_only
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self._idle_in_transaction_timeout = idle_in_transaction_timeout
        self._conn: Any = None
        self._opened = False
        self._claims: set[str] = set()
        self._lost_claims: set[str] = set()  # claims a reconnect could not take again: no ingesting
        self._clock = clock  # seconds; every lease expiry is decided by it (a test injects a fake)

    @property
    def location(self) -> str:
        return self._location

    def __repr__(self) -> str:
        return f"PostgresRunRepository({self._location!r})"

    # -- lifecycle ---------------------------------------------------------------

    def open(self) -> None:
        if self._opened:
            return
        with self._errors("opening"):
            conn = self._connect()
            try:
                if self._read_only:
                    self._check_version(conn, migrate=False)
                else:
                    with conn.transaction():
                        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                        self._check_version(conn, migrate=True)
            except BaseException:
                conn.close()
                raise
        self._conn = conn
        self._opened = True

    def close(self) -> None:
        self._claims.clear()
        self._lost_claims.clear()
        self._opened = False
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()  # ends the session: its advisory locks (the claims) go with it

    def _connect(self) -> Any:
        import psycopg  # an optional dependency: imported only when PostgreSQL is used

        settings = []
        if self._statement_timeout is not None:
            settings.append(f"-c statement_timeout={int(self._statement_timeout * 1000)}")
        if self._idle_in_transaction_timeout is not None:
            idle_ms = int(self._idle_in_transaction_timeout * 1000)
            settings.append(f"-c idle_in_transaction_session_timeout={idle_ms}")
        options: dict[str, Any] = {"options": " ".join(settings)} if settings else {}
        conn = psycopg.connect(
            self._url, autocommit=True, connect_timeout=max(1, round(self._connect_timeout)),
            application_name="trio-batch-llm", **options,
        )
        if self._read_only:
            conn.execute("SET default_transaction_read_only = on")
        return conn

    def _check_version(self, conn: Any, *, migrate: bool) -> None:
        if migrate:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (component TEXT PRIMARY KEY,"
                " version INTEGER NOT NULL, updated_at TEXT NOT NULL)"
            )
        elif conn.execute("SELECT to_regclass(%s)", (SCHEMA_TABLE,)).fetchone()[0] is None:
            raise ArtifactStoreError(f"{self._location}: no runs in this database (no {SCHEMA_TABLE} table)")
        row = conn.execute(f"SELECT version FROM {SCHEMA_TABLE} WHERE component = 'runs'").fetchone()
        stored = 0 if row is None else int(row[0])
        if stored > SCHEMA_VERSION:
            raise ArtifactStoreError(
                f"{self._location}: runs schema version {stored} is newer than this library reads "
                f"({SCHEMA_VERSION}); upgrade trio-batch-llm"
            )
        if not migrate:
            if stored == 0:
                raise ArtifactStoreError(f"{self._location}: no runs in this database")
            return
        for version, statements in MIGRATIONS:
            if version > stored:
                for statement in statements:
                    conn.execute(statement)
        if stored != SCHEMA_VERSION:
            conn.execute(
                f"INSERT INTO {SCHEMA_TABLE} (component, version, updated_at) VALUES ('runs', %s, %s)"
                " ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version,"
                " updated_at = EXCLUDED.updated_at",
                (SCHEMA_VERSION, utc_now()),
            )

    # -- helpers -----------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        if self._secret:
            text = text.replace(self._secret, REDACTED)
        return text

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """psycopg and OS errors as ArtifactStoreError naming the database (never its password)."""
        import psycopg

        try:
            yield
        except (psycopg.Error, OSError) as exc:
            problem = self._scrub(str(exc).strip()) or type(exc).__name__
            kind = DatabaseUnavailableError if _unreachable(exc) else ArtifactStoreError
            # The original goes unchained: its text (and its connection info) may hold the password.
            raise kind(f"{self._location}: {doing} failed: {problem}") from None

    def _require(self) -> Any:
        """The open connection; reconnects (taking the held claims again) after a lost one."""
        if not self._opened:
            raise ArtifactStoreError(f"{self._location}: the run repository is not open")
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            self._conn = None
            conn = self._connect()
            self._conn = conn
            for run_id in sorted(self._claims):
                if not self._lock(conn, run_id):
                    self._claims.discard(run_id)
                    self._lost_claims.add(run_id)
                    raise ClaimLostError(
                        f"{self._location}: the connection was lost and another process has taken "
                        f"the claim on run {run_id!r} meanwhile"
                    )
        return conn

    @contextlib.contextmanager
    def _read(self, doing: str) -> Iterator[Any]:
        with self._errors(doing):
            yield self._require()

    @contextlib.contextmanager
    def _write(self, doing: str) -> Iterator[Any]:
        if self._read_only:
            raise RunStateError(f"{self._location}: opened read-only; cannot {doing}")
        with self._errors(doing):
            conn = self._require()
            with conn.transaction():
                yield conn

    def _row(self, conn: Any, run_id: str) -> RunSnapshot:
        row = conn.execute(SNAPSHOT, (run_id,)).fetchone()
        if row is None:
            raise RunStateError(f"{self._location}: no run named {run_id!r}")
        return decode_snapshot(tuple(row))

    # -- runs --------------------------------------------------------------------

    def attach(self, spec: RunSpec) -> RunSnapshot:
        identity_json = canonical_json(spec.identity.to_dict())
        with self._write(f"opening run {spec.run_id!r}") as conn:
            now = utc_now()
            conn.execute(
                "INSERT INTO runs (run_id, mode, identity, identity_fingerprint, config, status,"
                " created_at, updated_at) VALUES (%s, %s, %s, %s, %s, 'running', %s, %s)"
                " ON CONFLICT (run_id) DO NOTHING",
                (spec.run_id, spec.mode, identity_json, identity_fingerprint(spec.identity),
                 canonical_json(spec.config), now, now),
            )
            mode, fingerprint, stored_identity = conn.execute(
                "SELECT mode, identity_fingerprint, identity FROM runs WHERE run_id = %s", (spec.run_id,)
            ).fetchone()
            if fingerprint != identity_fingerprint(spec.identity):
                raise ArtifactMismatchError(
                    f"{self._location}: run {spec.run_id!r} was created under identity {stored_identity}, "
                    f"not {identity_json}; use another run id"
                )
            if mode != spec.mode:
                raise RunStateError(
                    f"{self._location}: run {spec.run_id!r} runs in mode {mode!r}, not {spec.mode!r}"
                )
            return self._row(conn, spec.run_id)

    def snapshot(self, run_id: str) -> RunSnapshot:
        with self._read(f"reading run {run_id!r}") as conn:
            return self._row(conn, run_id)

    def run_ids(self) -> list[str]:
        with self._read("listing the runs") as conn:
            rows = conn.execute("SELECT run_id FROM runs ORDER BY created_at, created_seq").fetchall()
            return [run_id for (run_id,) in rows]

    def transition(
        self,
        run_id: str,
        *,
        from_statuses: frozenset[str],
        to: str,
        termination: RunTermination | None,
    ) -> tuple[bool, RunSnapshot]:
        term = json.dumps(termination.to_dict()) if termination is not None else None
        with self._write(f"changing the status of run {run_id!r}") as conn:
            changed = conn.execute(
                "UPDATE runs SET status = %s, termination = %s, updated_at = %s"
                " WHERE run_id = %s AND status = ANY(%s)",
                (to, term, utc_now(), run_id, sorted(from_statuses)),
            ).rowcount
            return changed == 1, self._row(conn, run_id)

    def complete(self, run_id: str) -> tuple[bool, RunSnapshot]:
        term = json.dumps(RunTermination("completed").to_dict())
        with self._write(f"completing run {run_id!r}") as conn:
            changed = conn.execute(
                "UPDATE runs SET status = 'completed', termination = %s, updated_at = %s"
                " WHERE run_id = %s AND status = 'running' AND source_exhausted = 1 AND done = items",
                (term, utc_now(), run_id),
            ).rowcount
            return changed == 1, self._row(conn, run_id)

    # -- items and results -------------------------------------------------------

    def ingest(self, run_id: str, items: Sequence[NewItem], checkpoint: SourceCheckpoint) -> RunSnapshot:
        if run_id in self._lost_claims:
            raise ClaimLostError(f"{self._location}: the claim on run {run_id!r} was lost to another "
                                 "process while the connection was down; that one ingests now")
        with self._write(f"ingesting {len(items)} item(s) into run {run_id!r}") as conn:
            writes.insert_items(conn, self._location, run_id, items, checkpoint)
            return self._row(conn, run_id)

    def pending(self, run_id: str, *, after_ingest_seq: int, limit: int) -> list[PendingItem]:
        with self._read(f"reading the pending items of run {run_id!r}") as conn:
            rows = conn.execute(
                "SELECT ingest_seq, item_id, prompt, context, attempts FROM run_items"
                " WHERE run_id = %s AND state = 'pending' AND ingest_seq > %s ORDER BY ingest_seq LIMIT %s",
                (run_id, after_ingest_seq, limit),
            ).fetchall()
        return [PendingItem(*row) for row in rows]

    def record(self, run_id: str, results: Sequence[NewResult], *, lease: int | None = None) -> RunSnapshot:
        with self._write(f"recording {len(results)} result(s) of run {run_id!r}") as conn:
            if lease is not None:
                writes.lock_run(conn, self._location, run_id)  # lock order: the run, then its lease
                leases.check_lease(conn, POSTGRES, run_id, lease, now=self._clock())
            recorded = writes.mark_done(conn, self._location, run_id, results, submission=None, lease=lease)
            if lease is not None and recorded:
                leases.count_done(conn, POSTGRES, run_id, lease, recorded)
            return self._row(conn, run_id)

    # -- leases (many drivers per run: :mod:`._leases`) ---------------------------

    def open_lease(self, run_id: str, driver_id: str, *, lease_seconds: float) -> int:
        with self._write(f"opening a lease on run {run_id!r}") as conn:
            return leases.open_lease(conn, POSTGRES, self._location, run_id, driver_id,
                                     lease_seconds=lease_seconds, now=self._clock())

    def lease_items(self, run_id: str, lease: int, *, limit: int) -> list[PendingItem]:
        with self._write(f"leasing items of run {run_id!r}") as conn:
            return leases.lease_items(conn, POSTGRES, self._location, run_id, lease, limit=limit,
                                      now=self._clock())

    def renew_lease(self, run_id: str, lease: int) -> bool:
        with self._write(f"renewing a lease on run {run_id!r}") as conn:
            return leases.renew_lease(conn, POSTGRES, run_id, lease, now=self._clock())

    def close_lease(self, run_id: str, lease: int) -> int:
        with self._write(f"closing a lease on run {run_id!r}") as conn:
            return leases.close_lease(conn, POSTGRES, self._location, run_id, lease)

    def start_calls(self, run_id: str, lease: int, item_ids: Sequence[str]) -> list[str]:
        with self._write(f"starting {len(item_ids)} call(s) of run {run_id!r}") as conn:
            return leases.start_calls(conn, POSTGRES, self._location, run_id, lease, list(item_ids),
                                      now=self._clock())

    def unstart_calls(self, run_id: str, lease: int, item_ids: Sequence[str]) -> None:
        with self._write(f"forgetting {len(item_ids)} call start(s) of run {run_id!r}") as conn:
            leases.unstart_calls(conn, POSTGRES, self._location, run_id, lease, list(item_ids))

    def lease_report(self, run_id: str) -> LeaseReport:
        with self._read(f"reading the drivers of run {run_id!r}") as conn:
            return leases.report(conn, POSTGRES, run_id, now=self._clock())

    def results(self, run_id: str, *, after_sequence: int, limit: int | None) -> list[StoredResult]:
        with self._read(f"reading the results of run {run_id!r}") as conn:
            rows = conn.execute(
                "SELECT sequence, item_id, result FROM run_results"
                " WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s",
                (run_id, after_sequence, limit),
            ).fetchall()
        return [StoredResult(seq, item_id, text) for seq, item_id, text in rows]

    # -- provider-batch submissions ---------------------------------------------

    def reserve_submission(
        self, run_id: str, submission: NewSubmission, *, capacity_limit: int | None
    ) -> bool:
        check_new_submission(submission, capacity_limit)
        with self._write(f"reserving submission {submission.submission_id!r} of run {run_id!r}") as conn:
            return writes.reserve(conn, self._location, run_id, submission, capacity_limit)

    def update_submission(
        self,
        run_id: str,
        submission_id: str,
        *,
        from_states: frozenset[str],
        to: SubmissionState,
        input_file_id: str | None = None,
        batch_id: str | None = None,
        detail: str | None = None,
    ) -> bool:
        check_states(frozenset({to}), LIVE_SUBMISSION_STATES, "update_submission's to")
        check_states(from_states, LIVE_SUBMISSION_STATES, "update_submission's from_states")
        if not from_states:
            return False
        with self._write(f"updating submission {submission_id!r} of run {run_id!r}") as conn:
            changed = conn.execute(
                "UPDATE run_submissions SET state = %s, input_file_id = COALESCE(%s, input_file_id),"
                " batch_id = COALESCE(%s, batch_id), detail = COALESCE(%s, detail), updated_at = %s"
                " WHERE run_id = %s AND submission_id = %s AND state = ANY(%s)",
                (to, input_file_id, batch_id, detail, utc_now(), run_id, submission_id, sorted(from_states)),
            ).rowcount
            return bool(changed == 1)

    def abandon_submission(
        self, run_id: str, submission_id: str, *, to: Literal["abandoned", "cancelled"], detail: str | None
    ) -> int:
        if to not in ("abandoned", "cancelled"):
            raise ValueError(f"abandon_submission's to must be 'abandoned' or 'cancelled', not {to!r}")
        with self._write(f"abandoning submission {submission_id!r} of run {run_id!r}") as conn:
            return writes.abandon(conn, run_id, submission_id, to, detail)

    def finish_submission(
        self,
        run_id: str,
        submission_id: str,
        results: Sequence[NewResult],
        retry_item_ids: Sequence[str],
        *,
        detail: str | None = None,
        unrun_item_ids: Sequence[str] = (),
    ) -> RunSnapshot:
        with self._write(f"finishing submission {submission_id!r} of run {run_id!r}") as conn:
            writes.finish(conn, self._location, run_id, submission_id, results,
                          unrun_item_ids=unrun_item_ids, detail=detail)
            return self._row(conn, run_id)

    def submissions(self, run_id: str, *, states: frozenset[str] | None = None) -> list[SubmissionRecord]:
        if states is not None and not states:
            return []
        where, params = "", list[Any]()
        if states is not None:
            check_states(states, ALL_SUBMISSION_STATES, "submissions' states")
            where, params = " AND state = ANY(%s)", [sorted(states)]
        with self._read(f"reading the submissions of run {run_id!r}") as conn:
            rows = conn.execute(
                f"SELECT {SUBMISSION_COLUMNS} FROM run_submissions WHERE run_id = %s{where} ORDER BY seq",
                (run_id, *params),
            ).fetchall()
        return [SubmissionRecord(*row) for row in rows]

    def submission_items(self, run_id: str, submission_id: str) -> list[PendingItem]:
        with self._read(f"reading the items of submission {submission_id!r}") as conn:
            rows = conn.execute(
                "SELECT ingest_seq, item_id, prompt, context, attempts FROM run_items"
                " WHERE run_id = %s AND submission = %s AND state = 'batched' ORDER BY ingest_seq",
                (run_id, submission_id),
            ).fetchall()
        return [PendingItem(*row) for row in rows]

    def held_tokens(self, scope: str) -> int:
        with self._read(f"reading the tokens held by scope {scope!r}") as conn:
            return writes.held_tokens(conn, scope)

    # -- claims ------------------------------------------------------------------

    @staticmethod
    def _lock(conn: Any, run_id: str) -> bool:
        return bool(conn.execute("SELECT pg_try_advisory_lock(%s)", (_claim_key(run_id),)).fetchone()[0])

    def try_claim(self, run_id: str) -> bool:
        if run_id in self._claims:
            return False  # held by this object already (another driver in this process)
        with self._read(f"claiming run {run_id!r}") as conn:
            if not self._lock(conn, run_id):
                return False
        self._claims.add(run_id)
        self._lost_claims.discard(run_id)
        return True

    def release(self, run_id: str) -> None:
        self._lost_claims.discard(run_id)  # a segment ends: the next one claims (or not) afresh
        if run_id not in self._claims:
            return
        self._claims.discard(run_id)
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return  # the session is gone, and its lock with it
        with self._errors(f"releasing run {run_id!r}"):
            conn.execute("SELECT pg_advisory_unlock(%s)", (_claim_key(run_id),))

