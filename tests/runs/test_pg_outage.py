"""A PostgreSQL outage under a run's drivers, libpq keyword strings, and the "unreachable" exit status.

* A lease driver rides out a short server outage (stopped, then started again
  on the same port, while it works): its repository calls retry with a capped
  backoff and reconnect, the results of calls that finished meanwhile wait in
  memory, and the run completes with every item called and recorded once.
* Past ``unreachable_timeout`` the driver stops with
  :class:`DatabaseUnavailableError` (the run stays ``running``, for any driver
  to continue), never with a stored failure.
* The retry window itself is checked in virtual time against a fake repository.
* ``runs`` commands against a server that is down exit with status 69
  (``EX_UNAVAILABLE``), never 2 ("bad usage"), and never print the password.
* A libpq keyword string (``"host=... password=..."``) names a PostgreSQL
  database: no SQLite file is created, and its password never shows.

The real-server tests need real time for the restart (a stop, two seconds, a
start); every wait there is bounded.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from trio_batch_llm import ArtifactStoreError, DatabaseUnavailableError, ProcessorConfig
from trio_batch_llm._runs import open_run, read_run_snapshot
from trio_batch_llm._runs.repository._client import RepositoryClient
from trio_batch_llm._runs.repository._locate import describe_store, repository_at
from trio_batch_llm._runs.repository._postgres import PostgresRunRepository
from trio_batch_llm.cli import main
from trio_batch_llm.testing import MockServerConfig, serve_mock

from .._runs_child import IDENTITY, CountingStrategy, prompts
from .._servers.postgres import PASSWORD, USER, PostgresServer
from ..cli.test_cli import MODEL, spawn
from ..cli.test_runs import RUN, cli, start_args, write_items
from ..conftest import trio_virtual_clock

EXIT_UNAVAILABLE = 69


def _dead_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again at once: nothing listens there


def _conninfo(server: PostgresServer, url: str) -> str:
    database = url.rsplit("/", 1)[1]
    return f"host=127.0.0.1 port={server.port} user={USER} password='{PASSWORD}' dbname={database}"


async def _start_again(server: PostgresServer) -> None:
    with anyio.CancelScope(shield=True):  # even when the test failed: later tests need the server
        await anyio.to_thread.run_sync(server.start)


async def _until_done(url: str, count: int) -> None:
    with anyio.fail_after(30):
        while True:  # another process writes the database: nothing to wait on but its rows
            if (await anyio.to_thread.run_sync(read_run_snapshot, url, RUN)).done >= count:
                return
            await anyio.sleep(0.05)


# --- riding out an outage (a real server) ------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_a_lease_driver_rides_out_a_database_restart(
    anyio_backend: str, postgres_server: PostgresServer, postgres_url: str
) -> None:
    # Calls from the 10th on hold until the server is back: results finish while it is down
    # (they wait in memory), and every task of the driver meets the outage (watcher, heartbeat,
    # feeder, recorder).
    strategy = CountingStrategy(signal_at_call=10, hold_from_call=10)
    outcome: dict[str, Any] = {}
    with anyio.fail_after(60):
        async with await open_run(postgres_url, "job", strategy, prompts(40), identity=IDENTITY,
                                  config=ProcessorConfig(concurrency=4), lease_seconds=20.0,
                                  poll_interval=0.05, unreachable_timeout=30.0) as run:
            async def drive() -> None:
                outcome["snap"] = await run.wait()

            async with anyio.create_task_group() as tg:
                tg.start_soon(drive)
                await strategy.reached.wait()
                await anyio.to_thread.run_sync(postgres_server.stop, "fast")
                try:
                    await anyio.sleep(0.5)
                    strategy.release.set()  # calls finish while the database is down
                    await anyio.sleep(1.5)
                finally:
                    await _start_again(postgres_server)
    snap = outcome["snap"]
    assert (snap.status, snap.done, snap.last_sequence) == ("completed", 40, 40)
    assert strategy.calls == Counter(prompts(40))  # every item called once (the lease never expired)
    assert snap.failed == 0


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_past_the_bound_the_driver_stops_with_database_unavailable(
    anyio_backend: str, postgres_server: PostgresServer, postgres_url: str
) -> None:
    strategy = CountingStrategy(signal_at_call=3, hold_from_call=3)
    with anyio.fail_after(60):
        async with await open_run(postgres_url, "job", strategy, prompts(10), identity=IDENTITY,
                                  config=ProcessorConfig(concurrency=2), lease_seconds=20.0,
                                  poll_interval=0.05, unreachable_timeout=1.0) as run:
            async def hold_then_stop() -> None:
                await strategy.reached.wait()
                await anyio.to_thread.run_sync(postgres_server.stop, "fast")

            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(hold_then_stop)
                    with pytest.raises(DatabaseUnavailableError) as caught:
                        await run.wait()
            finally:
                await _start_again(postgres_server)
    text = str(caught.value)
    assert "unreachable for 1 s" in text and "unreachable_timeout" in text and PASSWORD not in text
    assert isinstance(caught.value, ArtifactStoreError)  # what callers that catch the base still see
    snap = read_run_snapshot(postgres_url, "job")
    assert snap.status == "running" and snap.termination is None  # not failed: any driver continues


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_a_claim_lost_with_the_connection_ends_the_segment_not_the_run(
    anyio_backend: str, postgres_url: str
) -> None:
    # One driver at a time (no leases). Its session is cut and another process takes the claim
    # before it reconnects: it stops driving (no stored failure, no error out of wait()), watches,
    # and drives again once the claim is free.
    strategy = CountingStrategy(signal_at_call=3, hold_from_call=3)
    other = PostgresRunRepository(postgres_url)
    outcome: dict[str, Any] = {}
    with anyio.fail_after(60):
        async with await open_run(postgres_url, "job", strategy, prompts(10), identity=IDENTITY,
                                  config=ProcessorConfig(concurrency=2), poll_interval=0.5) as run:
            async def drive() -> None:
                outcome["snap"] = await run.wait()

            async with anyio.create_task_group() as tg:
                tg.start_soon(drive)
                await strategy.reached.wait()
                await anyio.to_thread.run_sync(other.open)

                def cut_and_claim() -> bool:
                    import time

                    import psycopg

                    pid = run._repo._conn.info.backend_pid  # type: ignore[attr-defined]
                    with psycopg.connect(postgres_url, autocommit=True) as admin:
                        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                        # pg_terminate_backend only signals: the claim is free once the session
                        # is gone (claiming before that raced the dying backend, once under load).
                        give_up = time.monotonic() + 10
                        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                            (pid,)).fetchone() is not None:
                            assert time.monotonic() < give_up, "the cut session did not end"
                            time.sleep(0.01)  # a worker thread (to_thread), not the event loop
                    return other.try_claim("job")

                assert await anyio.to_thread.run_sync(cut_and_claim)
                strategy.release.set()
                await anyio.sleep(1.5)  # the driver meets the lost claim, and watches
                assert "snap" not in outcome
                assert (await run.snapshot()).status == "running"
                await anyio.to_thread.run_sync(other.close)  # the claim is free again
    snap = outcome["snap"]
    assert (snap.status, snap.done, snap.last_sequence, snap.failed) == ("completed", 10, 10, 0)
    results = [r.result.item_id for r in await _results(postgres_url)]
    assert sorted(results) == sorted(set(results)) and len(results) == 10


async def _results(url: str) -> list[Any]:
    from trio_batch_llm._runs import iter_run_results

    return await anyio.to_thread.run_sync(lambda: list(iter_run_results(url, "job")))


# --- the window, in virtual time --------------------------------------------------------------


class _Flaky:
    """A stand-in repository whose calls fail as unreachable ``failures`` times, then succeed."""

    location = "postgresql://<redacted>@db/x"

    def __init__(self, failures: float) -> None:
        self.failures = failures
        self.calls = 0

    def snapshot(self, run_id: str) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise DatabaseUnavailableError(f"{self.location}: reading failed: Connection refused")
        return run_id

    def close(self) -> None:
        pass


@pytest.mark.parametrize("anyio_backend", [trio_virtual_clock()])
@pytest.mark.anyio
async def test_calls_retry_with_a_capped_backoff_within_the_window(anyio_backend: Any) -> None:
    repo = _Flaky(failures=6)
    db = RepositoryClient(repo, unreachable_timeout=60.0)  # type: ignore[arg-type]
    start = anyio.current_time()
    assert await db.call(repo.snapshot, "r") == "r"
    waited = anyio.current_time() - start
    assert repo.calls == 7
    assert 3.0 <= waited <= 12.0  # 0.1, 0.2, 0.4, 0.8, 1.6, 2 (capped) seconds: about 5.1
    await db.aclose()


@pytest.mark.parametrize("anyio_backend", [trio_virtual_clock()])
@pytest.mark.anyio
async def test_past_the_window_a_call_raises_database_unavailable(anyio_backend: Any) -> None:
    repo = _Flaky(failures=float("inf"))
    db = RepositoryClient(repo, unreachable_timeout=30.0)  # type: ignore[arg-type]
    start = anyio.current_time()
    with pytest.raises(DatabaseUnavailableError, match=r"unreachable for 30 s \(unreachable_timeout\)"):
        await db.call(repo.snapshot, "r")
    assert 30.0 <= anyio.current_time() - start <= 32.5
    calls = repo.calls
    # The window runs from the first failure in a row: the next call fails at once, not 30 s later.
    with pytest.raises(DatabaseUnavailableError):
        await db.call(repo.snapshot, "r")
    assert repo.calls == calls + 1
    await db.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [0, -1.0, True, "5", float("inf")])
async def test_a_bad_unreachable_timeout_is_refused_by_name(anyio_backend: str, tmp_path: Path,
                                                            bad: Any) -> None:
    from trio_batch_llm import ConfigurationError

    with pytest.raises(ConfigurationError, match="unreachable_timeout"):
        await open_run(tmp_path / "runs.db", "r", CountingStrategy(), [], identity=IDENTITY,
                       unreachable_timeout=bad)
    assert not (tmp_path / "runs.db").exists()


# --- exit statuses --------------------------------------------------------------------------


def test_runs_commands_exit_unavailable_when_the_server_is_down(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{_dead_port()}/postgres"
    for argv in (["runs", "status", url, RUN], ["runs", "list", url], ["runs", "pause", url, RUN],
                 ["runs", "export", url, RUN, str(tmp_path / "out.jsonl")]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == EXIT_UNAVAILABLE, (argv, out, err)
        assert "unreachable" in err and PASSWORD not in out + err, err


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # a subprocess; the backend is immaterial
async def test_runs_start_exits_unavailable_when_the_server_is_down(anyio_backend: str,
                                                                    tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "x"}\n', encoding="utf-8")
    url = f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{_dead_port()}/postgres"
    code, out, err = await cli("runs", "start", url, RUN, str(source), "--model",
                               "openai-compatible:m", "--base-url", "http://127.0.0.1:9/v1",
                               "--lease-seconds", "30")
    assert code == EXIT_UNAVAILABLE, out + err
    assert "unreachable" in err and "the run failed" not in err and PASSWORD not in out + err


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # subprocesses; the drivers' loop is immaterial here
@pytest.mark.timeout(120)
async def test_runs_start_rides_out_a_restart_and_past_the_bound_exits_unavailable(
    anyio_backend: str, postgres_server: PostgresServer, postgres_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    write_items(source, [f"prompt {n}" for n in range(6)])
    async with serve_mock(MockServerConfig(model=MODEL, latency=0.3)) as server:
        # Under the bound: the server is down for 2 s while the driver works; it finishes the run.
        args = start_args(server, postgres_url, source, "trio", "--concurrency", "1", "--lease-seconds", "30")
        async with spawn(*args) as driver:
            await server.wait_for(lambda stats: stats.requests >= 2)
            await anyio.to_thread.run_sync(postgres_server.stop, "fast")
            try:
                await anyio.sleep(2.0)
            finally:
                await _start_again(postgres_server)
        assert driver.returncode == 0, driver.output
        assert f"run {RUN}: completed" in driver.output and server.stats.requests == 6
        assert PASSWORD not in driver.output

    write_items(source, ["a", "b [[hang]]", "c"])
    other = postgres_server.new_database()
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        # Past the bound: status 69, "unreachable", never "the run failed"; the run stays running.
        args = start_args(server, other, source, "trio",
                          "--concurrency", "1", "--lease-seconds", "30", "--unreachable-timeout", "1")
        async with spawn(*args) as driver:
            await server.wait_for(lambda stats: stats.hangs == 1)
            await _until_done(other, 1)  # "a" recorded (its record may trail "b"'s request)
            await anyio.to_thread.run_sync(postgres_server.stop, "fast")
            try:
                with anyio.fail_after(30):
                    await driver.process.wait()
            finally:
                await _start_again(postgres_server)
        assert driver.returncode == EXIT_UNAVAILABLE, driver.output
        assert "unreachable for 1 s" in driver.output and "the run failed" not in driver.output
        assert PASSWORD not in driver.output
    snap = read_run_snapshot(other, RUN)
    assert (snap.status, snap.done, snap.termination) == ("running", 1, None)


# --- libpq keyword strings -------------------------------------------------------------------


def test_a_libpq_keyword_string_names_a_postgresql_database(
    postgres_server: PostgresServer, postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    conninfo = _conninfo(postgres_server, postgres_url)
    repo = repository_at(conninfo)
    assert isinstance(repo, PostgresRunRepository)
    for shown in (repo.location, repr(repo), describe_store(conninfo)):
        assert PASSWORD not in shown and "password=<redacted>" in shown, shown
    repo.open()
    repo.close()
    bad = conninfo.replace(PASSWORD, PASSWORD + "-wrong")
    with pytest.raises(ArtifactStoreError) as caught:
        PostgresRunRepository(bad).open()
    assert PASSWORD not in str(caught.value)
    assert os.listdir(tmp_path) == []  # no SQLite file named after the string


def test_the_runs_commands_take_a_libpq_keyword_string(
    postgres_server: PostgresServer, postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    conninfo = _conninfo(postgres_server, postgres_url)
    code = main(["runs", "list", conninfo])  # an empty database: no runs table yet
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err and code != 0
    code = main(["runs", "status", conninfo, RUN])
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err and code == 2 and "password=<redacted>" in err, err
    dead = f"host=127.0.0.1 port={_dead_port()} user={USER} password={PASSWORD} dbname=postgres"
    code = main(["runs", "status", dead, RUN])
    out, err = capsys.readouterr()
    assert code == EXIT_UNAVAILABLE and PASSWORD not in out + err, err
    assert os.listdir(tmp_path) == []
