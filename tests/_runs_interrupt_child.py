"""Child process for tests/runs/test_interrupts.py: Ctrl+C (or ``sys.exit``) raised inside a durable run.

``python tests/_runs_interrupt_child.py BACKEND DIR``: for every scenario (a run mode, the
place that raises, ``KeyboardInterrupt`` or ``SystemExit(3)``) runs one ``main()`` under
``asyncio.run`` or ``trio.run``, with an SQLite run database in ``DIR``; ``main`` wraps
``async with await open_run(...) as run: await run.wait()`` in its own
``except KeyboardInterrupt`` / ``except SystemExit``. Prints one JSON line per scenario:
what ``main`` caught (or what escaped the event loop instead), the exit code, the order
of events (``cleanup`` is the strategy's, run by the segment processor's ordered close;
``caught`` is main's handler), and the run as stored afterwards. In a child process
because, on the bug, the interrupt leaves the event loop and would end the test
session's own (as in tests/_interrupt_child.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx2

from trio_batch_llm import (
    ArtifactIdentity,
    LLMCallStrategy,
    OpenAICompatibleStrategy,
    ProcessorConfig,
    ProviderBatchConfig,
    RetryConfig,
    RetryState,
    TokenUsage,
)
from trio_batch_llm._runs import iter_run_results, open_run, read_run_snapshot
from trio_batch_llm.testing import MockOpenAIApp, MockServerConfig

IDENTITY = ArtifactIdentity(provider="test", model="interrupts", prompt_version="1")
LIVE_MODES = ["live", "leased"]
EXCEPTIONS = ["KeyboardInterrupt", "SystemExit"]
ITEMS = 12
RAISE_AT = 6  # the source raises instead of producing this entry


def scenarios() -> list[tuple[str, str, str]]:
    places = ["async_source", "sync_source", "strategy"]
    found = [(m, p, e) for m in LIVE_MODES for p in places for e in EXCEPTIONS]
    found += [("batch", p, e) for p in ("async_source", "sync_source") for e in EXCEPTIONS]
    return found


class Raiser:
    def __init__(self, place: str, kind: str, events: list[str]) -> None:
        self.place = place
        self.kind = kind
        self.events = events
        self.raised = False

    def maybe(self, place: str) -> None:
        if place == self.place and not self.raised:
            self.raised = True
            self.events.append(f"raise in {place}")
            raise KeyboardInterrupt if self.kind == "KeyboardInterrupt" else SystemExit(3)


class Strategy(LLMCallStrategy[str]):
    """Answers at once; raises (place ``strategy``) at its third call; records its cleanup."""

    def __init__(self, raiser: Raiser) -> None:
        self.raiser = raiser
        self.calls = 0
        self.called: anyio.Event | None = None

    @property
    def model_name(self) -> str:
        return "interrupts"

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        await anyio.lowlevel.checkpoint()
        self.calls += 1
        if self.calls == 3:
            self.raiser.maybe("strategy")
        self.reached().set()
        return f"out: {prompt}", None, None

    def reached(self) -> anyio.Event:
        """Set at the first call (made in the event loop, by whoever looks first)."""
        self.called = self.called or anyio.Event()
        return self.called

    async def cleanup(self) -> None:
        self.raiser.events.append("cleanup")
        await anyio.lowlevel.checkpoint()


def async_source(raiser: Raiser, strategy: Strategy | None) -> AsyncIterator[str]:
    async def produce() -> AsyncIterator[str]:
        for n in range(ITEMS):
            await anyio.lowlevel.checkpoint()
            if n == RAISE_AT:
                if strategy is not None:  # after a call: the strategy was prepared, its cleanup shows
                    await strategy.reached().wait()
                raiser.maybe("async_source")
            yield f"p{n}"

    return produce()


def sync_source(raiser: Raiser) -> Iterator[str]:
    for n in range(ITEMS):
        if n == RAISE_AT:
            raiser.maybe("sync_source")
        yield f"p{n}"


async def run_live(db: Path, mode: str, raiser: Raiser) -> None:
    strategy = Strategy(raiser)
    if raiser.place == "async_source":
        source: Any = async_source(raiser, strategy)
    elif raiser.place == "sync_source":
        source = sync_source(raiser)
    else:
        source = [f"p{n}" for n in range(ITEMS)]
    config = ProcessorConfig(concurrency=1, retry=RetryConfig(initial_wait=0.0, max_wait=0.0))
    extra: dict[str, Any] = {"lease_seconds": 30.0} if mode == "leased" else {}
    async with await open_run(db, "run", strategy, source, config=config, identity=IDENTITY,
                              poll_interval=0.05, slice_items=2, slice_seconds=0.01, **extra) as run:
        await run.wait()


async def run_batch(db: Path, raiser: Raiser) -> None:
    app = MockOpenAIApp(MockServerConfig())
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)) as client:
        strategy = OpenAICompatibleStrategy("mock-model", base_url="http://mock/v1", client=client,
                                            api_key_env=None)
        source: Any = async_source(raiser, None) if raiser.place == "async_source" else sync_source(raiser)
        async with await open_run(db, "run", strategy, source, mode="provider-batch", identity=IDENTITY,
                                  batch=ProviderBatchConfig(poll_interval=0.05, request_timeout=5.0),
                                  poll_interval=0.05, slice_items=2, slice_seconds=0.01) as run:
            await run.wait()


async def main(db: Path, mode: str, raiser: Raiser, outcome: dict[str, Any]) -> None:
    try:
        await (run_batch(db, raiser) if mode == "batch" else run_live(db, mode, raiser))
    except KeyboardInterrupt:
        raiser.events.append("caught")
        outcome["caught"] = "KeyboardInterrupt"
    except SystemExit as exc:
        raiser.events.append("caught")
        outcome["caught"], outcome["code"] = "SystemExit", exc.code
    else:
        outcome["caught"] = None


async def resume(db: Path, outcome: dict[str, Any]) -> None:
    """Drive the run to its end from a fresh handle and source: what the interrupt left is consistent."""
    events: list[str] = []
    strategy = Strategy(Raiser("nowhere", "KeyboardInterrupt", events))
    async with await open_run(db, "run", strategy, [f"p{n}" for n in range(ITEMS)], identity=IDENTITY,
                              config=ProcessorConfig(concurrency=2), poll_interval=0.05) as run:
        outcome["resumed"] = (await run.wait(timeout=20)).status


def on_backend(backend: str, fn: Any, *args: Any) -> None:
    if backend == "asyncio":
        import asyncio

        asyncio.run(fn(*args))
    else:
        import trio

        trio.run(fn, *args)


def run_one(backend: str, root: Path, mode: str, place: str, kind: str) -> dict[str, Any]:
    events: list[str] = []
    raiser = Raiser(place, kind, events)
    outcome: dict[str, Any] = {"mode": mode, "place": place, "kind": kind, "events": events}
    db = root / f"{backend}-{mode}-{place}-{kind}.sqlite"
    try:
        on_backend(backend, main, db, mode, raiser, outcome)
    except BaseException as exc:  # what left the event loop is the finding
        outcome["escaped"] = type(exc).__name__
    try:
        snap = read_run_snapshot(db, "run")
        outcome["status"] = snap.status
        outcome["termination"] = None if snap.termination is None else snap.termination.kind
        # Not after an escape (the test fails on that already): the escaped drive's claim is still held.
        # Nor in provider-batch mode: the mock provider that holds the run's submissions is gone.
        if mode != "batch" and "escaped" not in outcome:
            on_backend(backend, resume, db, outcome)
            recorded = Counter(r.item_id for r in iter_run_results(db, "run"))
            outcome["recorded"] = len(recorded)
            outcome["recorded_twice"] = sorted(i for i, n in recorded.items() if n > 1)
    except Exception as exc:  # reported: the test asserts on it
        outcome["db_error"] = f"{type(exc).__name__}: {exc}"
    return outcome


if __name__ == "__main__":
    chosen, directory = sys.argv[1], Path(sys.argv[2])
    for scenario in scenarios():
        print(json.dumps(run_one(chosen, directory, *scenario)), flush=True)
    # A loop that an interrupt left leaves anyio's worker threads waiting for it: do not join them.
    os._exit(0)
