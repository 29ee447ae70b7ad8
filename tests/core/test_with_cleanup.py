"""CONTRACT C1: with_cleanup on every exit path, on both backends.

The matrix: body (returns / raises ValueError / cancelled from outside) ×
cleanup (ok / raises RuntimeError / hangs past the bound). Trio runs under a
virtual clock, so the hanging cleanup's bound costs no real time.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from trio_batch_llm import CLEANUP_FAILED, CLEANUP_TIMED_OUT, ConfigurationError, with_cleanup

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

BOUND = 0.2


@pytest.fixture(scope="module", params=[pytest.param("asyncio", id="asyncio"),
                                        pytest.param(trio_virtual_clock(), id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


class Recorder:
    def __init__(self, body: str, cleanup: str) -> None:
        self.body_mode = body
        self.cleanup_mode = cleanup
        self.events: list[str] = []
        self.body_started = anyio.Event()
        self.body_exc = ValueError("body failed")
        self.cleanup_exc = RuntimeError("cleanup failed")

    async def body(self) -> int:
        self.events.append("body:start")
        try:
            if self.body_mode == "raises":
                await anyio.lowlevel.checkpoint()
                raise self.body_exc
            if self.body_mode == "cancelled":
                self.body_started.set()
                await anyio.sleep_forever()
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            self.events.append("body:cancelled")
            raise
        self.events.append("body:end")
        return 42

    async def cleanup(self) -> None:
        self.events.append("cleanup:start")
        try:
            if self.cleanup_mode == "raises":
                await anyio.lowlevel.checkpoint()
                raise self.cleanup_exc
            if self.cleanup_mode == "hangs":
                await anyio.sleep_forever()
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            self.events.append("cleanup:cancelled")
            raise
        self.events.append("cleanup:end")


async def _run(rec: Recorder) -> tuple[str, Any]:
    """Run with_cleanup; cancel it from another task when the body is 'cancelled'."""
    outcome: list[tuple[str, Any]] = []

    async def target(scope: anyio.CancelScope) -> None:
        with scope:
            try:
                value = await with_cleanup(rec.body, rec.cleanup, cleanup_timeout=BOUND)
            except BaseException as exc:
                outcome.append(("raised", exc))
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    raise  # absorbed by `scope`, which is the canceller
                return
            outcome.append(("returned", value))

    scope = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(target, scope)
        if rec.body_mode == "cancelled":
            await rec.body_started.wait()
            scope.cancel()
    assert len(outcome) == 1
    return outcome[0]


CLEANUP_TAIL = {
    "ok": ["cleanup:start", "cleanup:end"],
    "raises": ["cleanup:start"],
    "hangs": ["cleanup:start", "cleanup:cancelled"],
}
BODY_HEAD = {
    "returns": ["body:start", "body:end"],
    "raises": ["body:start"],
    "cancelled": ["body:start", "body:cancelled"],
}
NOTE = {"ok": None, "raises": CLEANUP_FAILED, "hangs": CLEANUP_TIMED_OUT}


@pytest.mark.parametrize("cleanup_mode", ["ok", "raises", "hangs"])
@pytest.mark.parametrize("body_mode", ["returns", "raises", "cancelled"])
async def test_c1_matrix(body_mode: str, cleanup_mode: str, caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder(body_mode, cleanup_mode)
    caplog.set_level(logging.DEBUG, logger="trio_batch_llm")
    kind, value = await _run(rec)

    # C1.1/C1.6: cleanup started exactly once, and the sequence is exact; the
    # hanging cleanup was really cancelled before with_cleanup returned.
    assert rec.events == BODY_HEAD[body_mode] + CLEANUP_TAIL[cleanup_mode]
    assert rec.events.count("cleanup:start") == 1

    if body_mode == "returns":
        # C1.4: value returned, nothing invented, one log record for a problem.
        assert (kind, value) == ("returned", 42)
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        if cleanup_mode == "ok":
            assert warnings == []
        else:
            assert len(warnings) == 1
            assert NOTE[cleanup_mode] in warnings[0].getMessage()
        assert getattr(rec.cleanup_exc, "__notes__", None) is None
        return

    assert kind == "raised"
    if body_mode == "raises":
        assert value is rec.body_exc  # C1.3: same instance
    else:
        assert isinstance(value, anyio.get_cancelled_exc_class())
    notes = getattr(value, "__notes__", [])
    expected = NOTE[cleanup_mode]
    assert notes == ([] if expected is None else [expected])
    assert getattr(rec.cleanup_exc, "__notes__", None) is None


async def test_c1_cleanup_keyboard_interrupt_keeps_type() -> None:
    async def body() -> int:
        await anyio.lowlevel.checkpoint()
        return 1

    async def cleanup() -> None:
        await anyio.lowlevel.checkpoint()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        await with_cleanup(body, cleanup, cleanup_timeout=BOUND)


async def test_c1_no_task_left_after_hanging_cleanup() -> None:
    rec = Recorder("returns", "hangs")
    before = len(_running_tasks())
    await _run(rec)
    assert rec.events[-1] == "cleanup:cancelled"
    assert len(_running_tasks()) == before


def _running_tasks() -> list[object]:
    return list(anyio.get_running_tasks())


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan"), True])
async def test_c1_bad_timeout_rejected_before_body(timeout: float) -> None:
    started = []

    async def body() -> None:
        started.append(1)

    async def cleanup() -> None:
        started.append(2)

    with pytest.raises(ConfigurationError, match="cleanup_timeout="):
        await with_cleanup(body, cleanup, cleanup_timeout=timeout)
    assert started == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"], indirect=False)
async def test_c1_native_cancel_during_cleanup_not_swallowed() -> None:
    import asyncio

    entered = asyncio.Event()
    events: list[str] = []

    async def body() -> int:
        await asyncio.sleep(0)
        return 1

    async def cleanup() -> None:
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events.append("cleanup:cancelled")
            raise

    task = asyncio.ensure_future(with_cleanup(body, cleanup, cleanup_timeout=60))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events == ["cleanup:cancelled"]
