"""Runs on PostgreSQL: what only PostgreSQL has (schema table, sessions, reconnects, URLs).

The behaviour both repositories share is tested once for both in
``test_runs_repository.py`` (parametrized over SQLite and PostgreSQL). Here:
the schema-version table and its migration, the claim as a session advisory
lock (it dies with the connection), a reconnect after a server restart,
``open_run``/readers/CLI taking a ``postgresql://`` URL, and the URL's
password never showing (location, repr, errors, stored rows, CLI output).
Against the session's real server (``tests/_servers/postgres.py``).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from trio_batch_llm import (
    ArtifactIdentity,
    ArtifactStoreError,
    ConfigurationError,
    DatabaseUnavailableError,
    ProcessorConfig,
)
from trio_batch_llm._runs import (
    PostgresRunRepository,
    iter_run_results,
    list_runs,
    open_run,
    read_run_snapshot,
)
from trio_batch_llm._runs._schema import ClaimLostError, NewItem, NewResult, RunSpec, SourceCheckpoint
from trio_batch_llm._runs.repository._postgres_tables import SCHEMA_VERSION
from trio_batch_llm._runs.repository._postgres_writes import mark_done
from trio_batch_llm._values._postgres import SCHEMA_TABLE
from trio_batch_llm.testing import MockServerConfig, serve_mock

from .._paths import ROOT
from .._runs_child import IDENTITY, CountingStrategy, prompts
from .._servers.postgres import PASSWORD, PostgresServer
from ..cli.test_cli import MODEL
from ..cli.test_runs import RUN, cli, start_args, write_items

SPEC = RunSpec("r", "live", ArtifactIdentity("m", "p"), {})


def _open(url: str, **kwargs: Any) -> PostgresRunRepository:
    repo = PostgresRunRepository(url, **kwargs)
    repo.open()
    return repo


def _stored_version(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT version FROM {SCHEMA_TABLE} WHERE component = 'runs'").fetchone()
    assert row is not None
    return int(row[0])


def test_the_library_creates_the_schema_and_records_its_version(postgres_url: str) -> None:
    repo = _open(postgres_url)
    try:
        repo.attach(SPEC)
    finally:
        repo.close()
    assert _stored_version(postgres_url) == SCHEMA_VERSION
    again = _open(postgres_url)  # reopening an up-to-date database changes nothing
    try:
        assert again.run_ids() == ["r"]
    finally:
        again.close()
    assert _stored_version(postgres_url) == SCHEMA_VERSION


def test_a_database_from_a_newer_schema_is_refused_and_an_empty_one_is_not_read(postgres_url: str) -> None:
    with pytest.raises(ArtifactStoreError, match="no runs in this database"):
        _open(postgres_url, read_only=True)
    _open(postgres_url).close()
    with psycopg.connect(postgres_url) as conn:
        conn.execute(f"UPDATE {SCHEMA_TABLE} SET version = %s", (SCHEMA_VERSION + 1,))
    for read_only in (False, True):
        with pytest.raises(ArtifactStoreError, match="newer than this library reads"):
            _open(postgres_url, read_only=read_only)


def test_databases_opened_at_once_by_many_are_created_once(postgres_url: str) -> None:
    import threading

    errors: list[BaseException] = []

    def opener() -> None:
        try:
            _open(postgres_url).close()
        except BaseException as exc:  # reported below
            errors.append(exc)
            raise

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _stored_version(postgres_url) == SCHEMA_VERSION


def test_the_password_never_shows(postgres_url: str, postgres_server: PostgresServer) -> None:
    repo = PostgresRunRepository(postgres_url)
    assert PASSWORD not in repo.location and PASSWORD not in repr(repo)
    assert repo.location.startswith("postgresql://<redacted>@127.0.0.1:")
    bad = postgres_url.replace(PASSWORD, PASSWORD + "-wrong")
    with pytest.raises(ArtifactStoreError) as caught:
        _open(bad)
    text = str(caught.value)
    assert "opening failed" in text and PASSWORD not in text and caught.value.__cause__ is None
    # A password in the query string is hidden as well.
    query_url = f"postgresql://127.0.0.1:{postgres_server.port}/nosuchdb?user=tbl&password={PASSWORD}"
    with pytest.raises(ArtifactStoreError) as caught:
        _open(query_url)
    assert PASSWORD not in str(caught.value) and "nosuchdb" in str(caught.value)


def test_a_claim_dies_with_its_connection_and_a_reconnect_says_it_was_lost(postgres_url: str) -> None:
    first, second = _open(postgres_url), _open(postgres_url)
    try:
        first.attach(SPEC)
        assert first.try_claim("r") and not second.try_claim("r") and not first.try_claim("r")
        with psycopg.connect(postgres_url, autocommit=True) as admin:  # cut the first one's session
            admin.execute("SELECT pg_terminate_backend(%s)", (first._conn.info.backend_pid,))
        with pytest.raises(ArtifactStoreError):
            first.snapshot("r")  # the call that meets the cut connection fails...
        assert second.try_claim("r")  # ...and its claim went with the session
        with pytest.raises(ArtifactStoreError, match="another process has taken the claim on run 'r'"):
            first.snapshot("r")
        assert first.snapshot("r").run_id == "r"  # it carries on, without the claim
    finally:
        first.close()
        second.close()


class _FreezesBefore:
    """A connection whose process "freezes" just before the statement starting with ``marker``:
    ``meanwhile`` runs then (what the other drivers do while it is stopped)."""

    def __init__(self, conn: Any, marker: str, meanwhile: Any) -> None:
        self._conn, self._marker, self._meanwhile = conn, marker, meanwhile

    def execute(self, query: str, params: Any = None) -> Any:
        if query.startswith(self._marker) and self._meanwhile is not None:
            meanwhile, self._meanwhile = self._meanwhile, None
            meanwhile()
        return self._conn.execute(query, params)

    def cursor(self) -> Any:
        return self._conn.cursor()


def test_a_driver_frozen_inside_a_transaction_does_not_block_the_others(postgres_url: str) -> None:
    # A process stopped (SIGSTOP, a VM pause) between two statements of a write holds the run's
    # row lock: without a bound every other driver waits on it (up to statement_timeout, then
    # again). The server ends such a session after idle_in_transaction_timeout, locks and all --
    # also right after the results' INSERT (psycopg's executemany, in pipeline mode, kept the
    # server from arming that timeout: the crash test's one-in-eight stall).
    frozen = _open(postgres_url, idle_in_transaction_timeout=0.5)
    other = _open(postgres_url, statement_timeout=5.0)
    seen: list[Any] = []

    def other_pauses_the_run() -> None:
        try:
            seen.append(other.transition("r", from_statuses=frozenset({"running"}), to="paused",
                                         termination=None))  # waits for the row, then gets it
        except ArtifactStoreError as exc:
            seen.append(exc)

    try:
        frozen.attach(SPEC)
        frozen.ingest("r", [NewItem(i, "p", None, "f") for i in "ab"], SourceCheckpoint(2, exhausted=True))
        done = [NewResult(i, True, None, "{}", 0, 0, 0) for i in "ab"]
        with pytest.raises(ArtifactStoreError), frozen._write("recording") as conn:
            mark_done(_FreezesBefore(conn, "UPDATE runs SET done", other_pauses_the_run), frozen.location,
                      "r", done, submission=None)
        assert [(changed, snap.status, snap.done) for changed, snap in seen] == [(True, "paused", 0)]
        assert frozen.snapshot("r").status == "paused"  # the frozen one reconnects and carries on
    finally:
        frozen.close()
        other.close()


@pytest.mark.parametrize("bad", [0, -1.0, True, "5"])
def test_a_bad_idle_in_transaction_timeout_is_refused_by_name(postgres_url: str, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="idle_in_transaction_timeout"):
        PostgresRunRepository(postgres_url, idle_in_transaction_timeout=bad)


def test_a_repository_reconnects_after_a_server_restart(
    postgres_url: str, postgres_server: PostgresServer
) -> None:
    repo = _open(postgres_url)
    try:
        repo.attach(SPEC)
        repo.ingest("r", [NewItem("a", "p", None, "f")], SourceCheckpoint(1, exhausted=True))
        assert repo.try_claim("r")
        postgres_server.restart()
        with pytest.raises(ArtifactStoreError):
            repo.snapshot("r")
        snap = repo.snapshot("r")  # reconnected, and the claim taken again
        assert (snap.items, snap.pending) == (1, 1)
        other = _open(postgres_url)
        try:
            assert not other.try_claim("r")
        finally:
            other.close()
    finally:
        repo.close()


@pytest.mark.anyio
async def test_open_run_and_the_readers_take_a_url(postgres_url: str) -> None:
    strategy = CountingStrategy()
    async with await open_run(postgres_url, "run", strategy, prompts(30), identity=IDENTITY,
                              config=ProcessorConfig(concurrency=4), slice_items=7) as run:
        assert PASSWORD not in repr(run)
        snap = await run.wait()
    assert (snap.status, snap.done, snap.last_sequence) == ("completed", 30, 30)
    assert strategy.calls == Counter(prompts(30))
    results = list(iter_run_results(postgres_url, "run"))
    assert [r.sequence for r in results] == list(range(1, 31))
    assert read_run_snapshot(postgres_url, "run").done == 30
    assert [s.run_id for s in list_runs(postgres_url)] == ["run"]
    with psycopg.connect(postgres_url) as conn:  # nothing stored holds the password
        for table in ("runs", "run_items", "run_results"):
            rows = conn.execute(f"SELECT * FROM {table}").fetchall()
            assert PASSWORD not in json.dumps([list(map(str, row)) for row in rows])


@pytest.mark.anyio
# One backend: each command is a subprocess (about 2 s here), and URL handling is the same on both.
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_runs_commands_take_a_url_and_never_print_its_password(
    anyio_backend: str, tmp_path: Path, postgres_url: str
) -> None:
    source = tmp_path / "in.jsonl"
    write_items(source, [f"prompt {n}" for n in range(6)])
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        db: Any = postgres_url
        code, out, err = await cli(*start_args(server, db, source, anyio_backend, "--concurrency", "3",
                                               "--lease-seconds", "30"))
        assert code == 0, out + err
        assert f"run {RUN}: completed" in out and server.stats.requests == 6
        outputs = [out + err]
        code, out, err = await cli("runs", "status", postgres_url, RUN, "--json")
        assert code == 0, err
        snap = json.loads(out)
        assert (snap["status"], snap["total"], snap["done"], snap["pending"]) == ("completed", 6, 6, 0)
        assert snap["reexecuted_after_lease_expiry"] == 0
        [driver] = snap["drivers"]
        assert (driver["items_done"], driver["state"]) == (6, "stopped")
        assert driver["driver_id"].count(":") == 2 and driver["last_heartbeat"].endswith("+00:00")
        outputs.append(out + err)
        code, out, err = await cli("runs", "list", postgres_url)
        assert code == 0 and RUN in out, err
        outputs.append(out + err)
        code, out, err = await cli("runs", "status", postgres_url, "nosuchrun")
        assert code == 2 and "no run named 'nosuchrun'" in err
        outputs.append(out + err)
    for text in outputs:
        assert PASSWORD not in text


@pytest.mark.anyio
async def test_the_scaling_out_example_runs_on_postgresql(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    path = ROOT / "docs" / "examples" / "scaling_out.py"
    spec = importlib.util.spec_from_file_location("docs_example_scaling_out_pg", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("RUNS_DB", postgres_url)
    await module.main()
    printed = capsys.readouterr().out
    assert "60 results from 3 drivers; re-executed after a lease expiry: 0" in printed
    assert "the mock answered 60 requests" in printed


def test_an_ingest_replayed_after_its_answer_was_lost_changes_nothing(postgres_url: str) -> None:
    # A retry after a commit whose answer went with the connection: the same slice again is a
    # no-op, not "duplicate item_id"; a genuine duplicate (under a later checkpoint) is still refused.
    repo = _open(postgres_url)
    try:
        repo.attach(SPEC)
        items = [NewItem(i, "p", None, "f") for i in "ab"]
        first = repo.ingest("r", items, SourceCheckpoint(2, cursor=10, last_item_id="b"))
        again = repo.ingest("r", items, SourceCheckpoint(2, cursor=10, last_item_id="b"))
        assert (first.items, again.items, again.pending) == (2, 2, 2)
        with pytest.raises(ValueError, match="duplicate item_id='a'"):
            repo.ingest("r", [NewItem("a", "p", None, "f")], SourceCheckpoint(3, cursor=12, last_item_id="a"))
    finally:
        repo.close()


def test_after_a_claim_was_lost_its_holder_ingests_no_more_until_it_claims_again(postgres_url: str) -> None:
    first, second = _open(postgres_url), _open(postgres_url)
    try:
        first.attach(SPEC)
        assert first.try_claim("r")
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first._conn.info.backend_pid,))
        with pytest.raises(ArtifactStoreError):
            first.snapshot("r")
        assert second.try_claim("r")
        with pytest.raises(ClaimLostError):
            first.snapshot("r")
        # Another process ingests now: two ingesters would both take the next slice.
        with pytest.raises(ClaimLostError, match="was lost to another process"):
            first.ingest("r", [NewItem("a", "p", None, "f")], SourceCheckpoint(1))
        second.release("r")
        assert first.try_claim("r")
        assert first.ingest("r", [NewItem("a", "p", None, "f")], SourceCheckpoint(1)).items == 1
    finally:
        first.close()
        second.close()


def test_only_connection_failures_count_as_unreachable(
    postgres_url: str, postgres_server: PostgresServer
) -> None:
    with pytest.raises(DatabaseUnavailableError):  # nothing listens there
        _open(postgres_url.replace(f":{postgres_server.port}/", f":{_closed_port()}/"))
    for refused in (postgres_url.replace(PASSWORD, "wrong"), postgres_url.rsplit("/", 1)[0] + "/nosuchdb"):
        with pytest.raises(ArtifactStoreError) as caught:
            _open(refused)
        assert not isinstance(caught.value, DatabaseUnavailableError), caught.value


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_reservation_replayed_after_its_answer_was_lost_changes_nothing(postgres_url: str) -> None:
    from trio_batch_llm._runs._schema import NewSubmission

    repo = _open(postgres_url)
    try:
        repo.attach(SPEC)
        repo.ingest("r", [NewItem(i, "p", None, "f") for i in "abc"], SourceCheckpoint(3, exhausted=True))
        sub = NewSubmission(submission_id="s1", scope="sc", item_ids=("a", "b"), tokens=40)
        assert repo.reserve_submission("r", sub, capacity_limit=50)
        assert repo.reserve_submission("r", sub, capacity_limit=50)  # the same one again: no error
        assert repo.held_tokens("sc") == 40 and len(repo.submissions("r")) == 1
        with pytest.raises(ValueError, match="submission id 's1' is taken"):  # another one, same id
            repo.reserve_submission("r", NewSubmission("s1", "sc", ("c",), 5), capacity_limit=None)
    finally:
        repo.close()
