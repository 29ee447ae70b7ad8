"""The worker-thread gate the stores and the run repository share: one call at a time, none cut short.

Both backends; the native-cancel case is asyncio's own (a ``Task.cancel()``
that gets through anyio's shield while the thread still runs).
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from trio_batch_llm._backends._worker_gate import WorkerGate
from trio_batch_llm._runs.repository._client import RepositoryClient

pytestmark = pytest.mark.anyio


class Recorder:
    """Blocking calls that wait for their own event; records overlap and completion."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.finished: list[str] = []
        self.entered = {name: threading.Event() for name in "ABC"}
        self.go = {name: threading.Event() for name in "ABC"}

    def __call__(self, name: str) -> str:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self.entered[name].set()
        try:
            assert self.go[name].wait(timeout=30)
        finally:
            with self._lock:
                self.active -= 1
                self.finished.append(name)
        return name


async def test_calls_run_one_at_a_time_in_call_order() -> None:
    gate = WorkerGate()
    calls = Recorder()
    got: list[str] = []

    async def call(name: str) -> None:
        got.append(await gate.run(calls, name))

    async with anyio.create_task_group() as tg:
        for name in "ABC":
            tg.start_soon(call, name)
            await anyio.wait_all_tasks_blocked()
        await anyio.to_thread.run_sync(calls.entered["A"].wait)
        assert not calls.entered["B"].is_set()  # waits for A, not beside it
        for name in "ABC":
            calls.go[name].set()
    assert calls.max_active == 1
    assert got == calls.finished == ["A", "B", "C"]


async def test_a_cancelled_caller_waiting_for_the_gate_never_runs() -> None:
    gate = WorkerGate()
    calls = Recorder()
    async with anyio.create_task_group() as tg:
        tg.start_soon(gate.run, calls, "A")
        await anyio.to_thread.run_sync(calls.entered["A"].wait)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await gate.run(calls, "B")
        calls.go["A"].set()
    assert calls.finished == ["A"] and not calls.entered["B"].is_set()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_native_cancel_mid_call_lets_the_call_finish_and_the_next_wait_for_it() -> None:
    import asyncio

    gate = WorkerGate()
    calls = Recorder()
    tasks: dict[str, asyncio.Task[Any]] = {}
    outcome: dict[str, str] = {}

    async def caller(name: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks[name] = task
        try:
            outcome[name] = await gate.run(calls, name)
        except asyncio.CancelledError:
            outcome[name] = "cancelled"

    async with anyio.create_task_group() as tg:
        tg.start_soon(caller, "A")
        await anyio.to_thread.run_sync(calls.entered["A"].wait)
        tasks["A"].cancel()  # native: its thread runs on
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(caller, "B")
        await anyio.wait_all_tasks_blocked()
        assert not calls.entered["B"].is_set()  # B's thread waits for A's call to end
        calls.go["B"].set()
        calls.go["A"].set()
    assert calls.finished == ["A", "B"] and calls.max_active == 1
    assert outcome["B"] == "B"


class SlowRepository:
    """Just enough of a RunRepository for the client: a close that must wait for the call in flight."""

    location = "memory"

    def __init__(self) -> None:
        self.calls = Recorder()
        self.closed_after: list[str] = []

    def close(self) -> None:
        self.closed_after = list(self.calls.finished)


async def test_the_repository_client_closes_after_the_call_in_flight_even_when_cancelled() -> None:
    repository = SlowRepository()
    client = RepositoryClient(repository)  # type: ignore[arg-type]
    seen_before_release: list[list[str]] = []

    async def release_a() -> None:
        await anyio.wait_all_tasks_blocked()  # aclose() is waiting for the call in flight
        seen_before_release.append(list(repository.closed_after))
        repository.calls.go["A"].set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(client.call, repository.calls, "A")
        await anyio.to_thread.run_sync(repository.calls.entered["A"].wait)
        tg.start_soon(release_a)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await client.aclose()  # cancelled already, and closes anyway: after A
    assert seen_before_release == [[]]
    assert repository.closed_after == ["A"] and client.closed
