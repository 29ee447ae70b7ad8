"""Shared fixtures: every behavioural test runs on both backends.

``anyio_backend`` is module-scoped (hypothesis rejects function-scoped
fixtures). Modules that assert exact times override it with
``virtual_time_backends`` below: Trio under ``MockClock(autojump_threshold=0)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

BACKENDS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param("trio", id="trio"),
]


@pytest.fixture(scope="module", params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def trio_virtual_clock(*, threads: bool = False) -> Any:
    """Trio under ``MockClock``: virtual time that jumps to the next deadline when all tasks wait.

    ``threads=True`` is for modules whose code waits on worker threads (SQLite
    repository and store calls): the clock then jumps after 1 ms of real
    idleness instead of at once. At ``autojump_threshold=0`` Trio's loop polls
    for I/O with a zero timeout for as long as a task waits on a thread, a busy
    loop that holds the GIL against that very thread: repository calls ran about
    100 times slower (4.4 s instead of 0.09 s for three runs), enough to push a
    hypothesis test past its timeout on a loaded CI machine. A positive
    threshold only makes jumps rarer while a thread works; time stays virtual.
    """
    import trio.testing

    threshold = 0.001 if threads else 0
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=threshold)})


ASYNCIO_ONLY = pytest.mark.parametrize("anyio_backend", ["asyncio"])
"""For clauses that exist only on asyncio (native ``Task.cancel()``)."""


async def raise_foreign_cancellation() -> None:
    """Raise a backend cancellation that belongs to none of the caller's scopes (a 'third party')."""
    import anyio
    import anyio.lowlevel

    captured: BaseException | None = None
    with anyio.CancelScope() as inner:
        inner.cancel()
        try:
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class() as exc:
            captured = exc
            raise
    assert captured is not None
    raise captured


@contextlib.contextmanager
def clock_waits_for_threads() -> Iterator[None]:
    """On Trio's virtual clock, jump only after 100 ms of real idleness (repository calls run in threads).

    Otherwise a ``wait(timeout=...)`` could reach its deadline while the first
    repository call is still in its thread. A no-op on asyncio (real time).
    """
    import sniffio

    if sniffio.current_async_library() != "trio":
        yield
        return
    import trio

    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, trio.testing.MockClock)
    before, clock.autojump_threshold = clock.autojump_threshold, 0.1
    try:
        yield
    finally:
        clock.autojump_threshold = before


class _PinnedWallClock:
    """``time`` as the quota scopes' wall clock sees it in tests: a fixed second of the minute.

    Discovery's storm probes meet the wall clock's next minute (issue 32), so on a virtual clock
    a test's probe times would depend on the second of the minute it happened to run in (two
    tests failed at some seconds and not others). Pinned, every run probes alike; the phase
    itself is tested in test_discovery_calendar_minute.py with exact times. Inside an event loop
    the wall clock moves with the loop's clock (Trio's virtual one under ``MockClock``), so a
    scope's wall offset is the same constant however slowly the machine ran the test (a loaded
    machine once moved the phase by a few seconds and failed a test, 48 refusals against 47).
    """

    def __init__(self) -> None:
        import time

        self._monotonic = time.monotonic
        self._start = time.monotonic()

    def time(self) -> float:
        try:
            now = anyio.current_time()  # the loop's clock: a scope's own clock in nearly every test
        except Exception:  # no event loop here: real elapsed time
            now = self._monotonic() - self._start
        return 1_700_000_000.0 + now  # :20 of a minute at the loop's zero


@pytest.fixture(autouse=True)
def _pinned_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    import trio_batch_llm._admission._pacing as pacing

    monkeypatch.setattr(pacing, "time", _PinnedWallClock())


from ._servers.postgres import postgres_server, postgres_url, stop_shared_server  # noqa: E402, F401
from ._servers.redis import redis_server, redis_url  # noqa: E402, F401
from ._servers.redis_cluster import cluster_url, redis_cluster  # noqa: E402, F401


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stop_shared_server()
