"""``max_in_flight`` across real processes: children against the mock, one Redis; and ``runs start --quota``.

The mock counts the requests it is answering at once (``max_in_flight``), so the bound is measured
where it matters, on the server. The children run on both event loops (one trio, one asyncio).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from trio_batch_llm import ProcessorConfig, RedisQuotaBackend, llm
from trio_batch_llm._admission import QuotaRegistry
from trio_batch_llm.testing import MockServer, MockServerConfig, serve_mock

from .._paths import TESTS
from .._servers.redis import PASSWORD
from ..cli.test_cli import ENV, MODEL, command
from ..cli.test_runs import RUN, run_main, start_args, write_items

pytestmark = pytest.mark.anyio

CHILD = str(TESTS / "_inflight_child.py")
BOUND = 4


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "trio"  # the test's own loop only serves the mock; the children use both loops


def child(server: MockServer, redis_url: str, items: int, backend: str, *extra: str) -> list[str]:
    return [sys.executable, CHILD, server.base_url, redis_url, str(items), "--max-in-flight", str(BOUND),
            "--backend", backend, *extra]


async def finished(argv: list[str]) -> dict[str, int]:
    done = await anyio.run_process(argv, env=ENV, check=False, stdin=subprocess.DEVNULL)
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 0 and PASSWORD not in output, output
    counts: dict[str, int] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return counts


async def test_two_processes_never_exceed_max_in_flight_together(redis_url: str) -> None:
    # Each process alone would have 8 calls open at once (its concurrency); together 16.
    async with serve_mock(MockServerConfig(model=MODEL, latency=0.2)) as server:
        results: list[dict[str, int]] = []

        async def run(argv: list[str]) -> None:
            results.append(await finished(argv))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for backend in ("trio", "asyncio"):
                    tg.start_soon(run, child(server, redis_url, 16, backend, "--concurrency", "8"))
        stats = server.statistics()
    assert results == [{"succeeded": 16, "failed": 0}] * 2
    assert stats.requests == 32
    assert stats.max_in_flight == BOUND  # never above, and the bound was used


def _in_flight_reaches(server: MockServer, count: int) -> None:
    deadline = time.monotonic() + 30
    while server.statistics().in_flight < count:
        assert time.monotonic() < deadline, "the child never had its calls open"
        time.sleep(0.01)


async def test_a_killed_process_gives_its_slots_back_within_the_expiry(redis_url: str) -> None:
    expiry = 3.0
    backend = RedisQuotaBackend(redis_url, max_in_flight=BOUND, in_flight_expiry=expiry)
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        holder = await anyio.open_process(
            child(server, redis_url, BOUND, "asyncio", "--expiry", str(expiry),
                  "--prompt-suffix", " [[latency:120]]"),
            env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            await anyio.to_thread.run_sync(_in_flight_reaches, server, BOUND)  # it holds every slot
        finally:
            holder.send_signal(signal.SIGKILL)  # no release, no hand back: only the expiry frees them
            await holder.wait()
        killed = anyio.current_time()
        # This process takes the same scope's slots (the same strategy: the same quota_scope() key).
        scope_key = llm("openai-compatible:mock-model", base_url=server.base_url).quota_scope()
        config = ProcessorConfig(concurrency=BOUND, quota_backend=backend)
        async with anyio.create_task_group() as tg:
            registry = QuotaRegistry(backend=backend, spawn=tg.start_soon)
            try:
                scope = registry.scope_for(scope_key, config)
                with anyio.fail_after(expiry + 10):
                    admissions = [await scope.admit() for _ in range(BOUND)]
                waited = anyio.current_time() - killed
                for admission in admissions:
                    admission.release_unused()
            finally:
                await registry.aclose()
        # The holder renewed at most a third of the expiry before it died, so its leases held at least
        # the other two thirds; and they were gone by the expiry (plus a poll, a round trip, a busy machine).
        assert expiry * 2 / 3 <= waited <= expiry + 2.0, waited
        with anyio.fail_after(30):  # and a new process runs at the full bound
            counts = await finished(child(server, redis_url, BOUND, "trio", "--expiry", str(expiry),
                                          "--prompt-suffix", " [[latency:0.05]]"))
    assert counts == {"succeeded": BOUND, "failed": 0}


async def test_two_lease_drivers_of_one_run_share_max_in_flight(redis_url: str, tmp_path: Path) -> None:
    source, db = tmp_path / "in.jsonl", tmp_path / "runs.sqlite"
    ids = write_items(source, [f"prompt {n}" for n in range(24)])
    async with serve_mock(MockServerConfig(model=MODEL, latency=0.2)) as server:
        outputs: list[tuple[int, str]] = []

        async def drive(backend: str) -> None:
            argv = start_args(server, db, source, backend, "--concurrency", "6", "--lease-seconds", "30",
                              "--quota", redis_url, "--quota-max-in-flight", "2")
            done = await anyio.run_process(command(*argv), env=ENV, check=False, stdin=subprocess.DEVNULL)
            outputs.append((done.returncode, (done.stdout + done.stderr).decode()))

        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drive, "trio")
                tg.start_soon(drive, "asyncio")
        stats = server.statistics()
    for code, output in outputs:
        assert code == 0 and f"run {RUN}: completed" in output, output
        assert PASSWORD not in output
    assert stats.requests == len(ids)
    assert stats.max_in_flight == 2  # 12 without the shared bound


@pytest.mark.parametrize("quota", ["http://user:pw-secret@example.com", "redis://h:port/0", "redis://h/db1"])
def test_runs_start_refuses_a_bad_quota_url_as_run_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, quota: str
) -> None:
    source, db = tmp_path / "in.jsonl", tmp_path / "runs.sqlite"
    write_items(source, ["x"])
    model = ("--model", f"openai-compatible:{MODEL}", "--base-url", "http://127.0.0.1:9/v1")
    code, started = run_main(capsys, "runs", "start", str(db), RUN, str(source), *model, "--quota", quota)
    run_code, ran = run_main(capsys, "run", str(source), "--out", str(tmp_path / "out.jsonl"), *model,
                             "--quota", quota)
    assert code == run_code == 2
    assert started == ran and "error: --quota " in started, started
    assert "pw-secret" not in started and not db.exists()


def test_quota_max_in_flight_needs_quota(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source, db = tmp_path / "in.jsonl", tmp_path / "runs.sqlite"
    write_items(source, ["x"])
    model = ("--model", f"openai-compatible:{MODEL}", "--base-url", "http://127.0.0.1:9/v1")
    code, output = run_main(capsys, "runs", "start", str(db), RUN, str(source), *model,
                            "--quota-max-in-flight", "2")
    assert code == 2 and "--quota-max-in-flight needs --quota" in output, output
    code, output = run_main(capsys, "runs", "start", str(db), RUN, str(source), *model, "--quota", "redis://h",
                            "--quota-max-in-flight", "0")
    assert code == 2 and "--quota-max-in-flight" in output, output
    code, output = run_main(capsys, "run", str(source), "--out", str(tmp_path / "out.jsonl"), *model,
                            "--quota-max-in-flight", "2")
    assert code == 2 and "--quota-max-in-flight needs --quota" in output, output
    assert not db.exists() and not (tmp_path / "out.jsonl").exists()


async def test_runs_start_refused_by_the_quota_server_is_bad_usage(redis_url: str, tmp_path: Path) -> None:
    source, db = tmp_path / "in.jsonl", tmp_path / "runs.sqlite"
    write_items(source, ["x"])
    wrong = redis_url.replace(PASSWORD, "wrong-password")
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        argv = start_args(server, db, source, "trio", "--quota", wrong)
        done = await anyio.run_process(command(*argv), env=ENV, check=False, stdin=subprocess.DEVNULL)
        calls = server.statistics().requests
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 2, output
    assert "error: --quota: the Redis quota backend" in output and "refused this client" in output
    assert "wrong-password" not in output and calls == 0
