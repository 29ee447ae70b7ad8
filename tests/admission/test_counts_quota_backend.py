"""Issue 35, point 4: while admission waits for the shared quota backend (Redis), progress says so,
and counts those items as waiting, not in flight: in flight is only an item whose call is under way.

A real Redis server, killed mid-run (as in ``test_quota_redis``); the run ends with the clear
``QuotaBackendError`` after ``unreachable_timeout``. Real time: the waits are bounded by that
timeout and by the window of a full RPM limit, never by a sleep the test chose.
"""

from __future__ import annotations

import gc
import socket
import warnings

import anyio
import pytest

from trio_batch_llm import (
    FakeStrategy,
    ProcessorConfig,
    QuotaBackendError,
    RedisQuotaBackend,
    process_prompts,
)
from trio_batch_llm._cli._run import check_quota
from trio_batch_llm._observe._display import format_progress_line
from trio_batch_llm._observe._snapshot import Progress, ProgressSnapshot

from .._servers.redis import PASSWORD, start_redis

pytestmark = pytest.mark.anyio


class Recorder(Progress):
    """Each snapshot with the calls the strategy had under way when it was drawn."""

    def __init__(self, strategy: FakeStrategy) -> None:
        self.strategy = strategy
        self.seen: list[tuple[ProgressSnapshot, int, bool]] = []
        self.killed = False

    def update(self, snapshot: ProgressSnapshot) -> None:
        self.seen.append((snapshot, self.strategy.in_flight, self.killed))


async def test_while_redis_is_down_progress_says_waiting_for_the_quota_backend(anyio_backend: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # coredis's leak (see test_quota_redis)
        try:
            await _redis_down_mid_run()
        finally:
            gc.collect()


async def _redis_down_mid_run() -> None:
    server = start_redis()
    try:
        strategy = FakeStrategy(latency=0.001)
        recorder = Recorder(strategy)
        backend = RedisQuotaBackend(server.url, unreachable_timeout=1.0, connect_timeout=0.2,
                                    command_timeout=0.5)
        config = ProcessorConfig(concurrency=8, max_requests_per_minute=20, quota_backend=backend,
                                 progress_interval=0.02)

        async def kill_when_the_window_is_full() -> None:
            while len(strategy.calls) < 20 or strategy.in_flight:  # noqa: ASYNC110 - no event to wait on
                await anyio.sleep(0.005)
            # The window is full: the 8 workers wait for Redis to grant a unit; none has a call.
            server.kill()
            recorder.killed = True

        errors: list[BaseException] = []
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_when_the_window_is_full)
                await process_prompts(strategy, [f"p{i}" for i in range(60)], config=config,
                                      progress=recorder)
        except* QuotaBackendError as group:
            errors.extend(group.exceptions)
        assert len(errors) == 1  # the clear error, after unreachable_timeout
        assert len(strategy.calls) == 20
        down = [snapshot for snapshot, calls, killed in recorder.seen if killed and calls == 0]
        assert down, "no progress drawn while Redis was down"
        lines = [format_progress_line(snapshot, bar_width=0) for snapshot in down]
        # Nothing is in flight: the 8 items wait for the quota backend, and the line says so.
        assert all(snapshot.in_flight == 0 for snapshot in down), lines
        waiting = [line for line in lines if "0 in flight | 8 waiting for the quota backend" in line]
        assert waiting, lines
    finally:
        server.close()


def test_the_line_names_what_the_waiting_items_wait_for() -> None:
    snapshot = ProgressSnapshot(completed=0, failed=0, in_flight=0, waiting=16, total=20,
                                waiting_for="the quota backend")
    line = format_progress_line(snapshot, bar_width=0)
    assert line.startswith("0/20 (0%) | 0 failed | 0 in flight | 16 waiting for the quota backend | ")
    assert "16 waiting |" not in line


async def test_the_command_line_says_it_waits_for_an_unreachable_quota_backend(
        anyio_backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backend = RedisQuotaBackend(f"redis://:{PASSWORD}@127.0.0.1:{port}/0", unreachable_timeout=2.0,
                                connect_timeout=0.2, command_timeout=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # coredis's leak (see test_quota_redis)
        try:
            with pytest.raises(QuotaBackendError, match="unreachable for 2 s"):
                await check_quota(backend)
        finally:
            gc.collect()
    err = capsys.readouterr().err
    assert (f"trio-batch-llm: waiting for the quota backend redis://<redacted>@127.0.0.1:{port}/0: it does"
            " not answer (giving up after 2 s)") in err, err
    assert PASSWORD not in err
