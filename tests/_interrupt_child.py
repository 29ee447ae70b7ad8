"""Child process for tests/engine/test_worker_interrupts.py: Ctrl+C (or ``sys.exit``) raised inside the work.

``python tests/_interrupt_child.py BACKEND``: for every scenario (a surface, the place
that raises, ``KeyboardInterrupt`` or ``SystemExit(3)``) runs one ``main()`` under
``asyncio.run`` or ``trio.run``; ``main`` wraps the surface in its own
``except KeyboardInterrupt`` / ``except SystemExit``. Prints one JSON line per scenario:
what ``main`` caught (or what escaped the event loop instead), the exit code, and the
order of events (``cleanup`` is the strategy's, run by the ordered close; ``caught``
is main's handler). In a child process because, on the bug, the interrupt leaves
the event loop and would end the test session's own.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel

from trio_batch_llm import (
    ExecutorHost,
    LLMCallPool,
    LLMCallStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    RetryConfig,
    RetryState,
    TokenUsage,
    call_result,
    process_prompts,
    process_stream,
)

PROCESSOR_SURFACES = [
    "process_prompts", "process_prompts_lazy", "process_stream", "processor", "streaming", "shared_host",
]
PROCESSOR_PLACES = ["strategy", "observer", "progress", "post_processor", "middleware"]
CALL_SURFACES = ["call_result", "pool_submit"]
CALL_PLACES = ["strategy", "classifier"]
SOURCE_SURFACES = ["process_prompts_lazy", "process_stream"]
EXCEPTIONS = ["KeyboardInterrupt", "SystemExit"]


def scenarios() -> list[tuple[str, str, str]]:
    found = [(s, p, e) for s in PROCESSOR_SURFACES for p in PROCESSOR_PLACES for e in EXCEPTIONS]
    found += [(s, p, e) for s in CALL_SURFACES for p in CALL_PLACES for e in EXCEPTIONS]
    found += [(s, "source", e) for s in SOURCE_SURFACES for e in EXCEPTIONS]
    return found


class Raiser:
    """Raises the scenario's exception once, from the place it is given, once a call was made.

    After a call, so the strategy was prepared and its ``cleanup()`` shows the ordered close ran.
    """

    def __init__(self, place: str, kind: str, events: list[str]) -> None:
        self.place = place
        self.kind = kind
        self.events = events
        self.raised = False
        self.called = place == "strategy"

    def maybe(self, place: str) -> None:
        if place == self.place and self.called and not self.raised:
            self.raised = True
            self.events.append(f"raise in {place}")
            raise KeyboardInterrupt if self.kind == "KeyboardInterrupt" else SystemExit(3)


class Strategy(LLMCallStrategy[str]):
    def __init__(self, raiser: Raiser) -> None:
        self.raiser = raiser

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        await anyio.lowlevel.checkpoint()
        self.raiser.maybe("strategy")
        self.raiser.called = True
        if attempt == 1 and self.raiser.place == "classifier":
            raise RuntimeError("to be classified")
        return "ok", None, None

    async def cleanup(self) -> None:
        self.raiser.events.append("cleanup")
        await anyio.lowlevel.checkpoint()


class Middleware:
    def __init__(self, raiser: Raiser) -> None:
        self.raiser = raiser

    async def before(self, item: LLMWorkItem[Any]) -> LLMWorkItem[Any]:
        await anyio.lowlevel.checkpoint()
        self.raiser.maybe("middleware")
        return item


async def run_surface(surface: str, raiser: Raiser) -> None:
    strategy = Strategy(raiser)
    cfg = ProcessorConfig(concurrency=1, retry=RetryConfig(initial_wait=0.0, max_wait=0.0))
    hooks: dict[str, Any] = {
        # On an item's event, emitted by a worker (BatchStarted comes from the caller's own task).
        "observers": [lambda event: raiser.maybe("observer") if type(event).__name__ == "ItemCompleted"
                      else None],
        "post_processor": lambda result: raiser.maybe("post_processor"),
        "middlewares": [Middleware(raiser)],
    }

    def progress(done: int, total: int | None, item_id: str) -> None:
        raiser.maybe("progress")

    async def source() -> AsyncIterator[str]:
        for n in range(3):
            await anyio.lowlevel.checkpoint()
            if n == 1:
                while not raiser.called:
                    await anyio.lowlevel.checkpoint()
                raiser.maybe("source")
            yield f"p{n}"

    prompts = ["p0", "p1", "p2"]
    if surface == "process_prompts":
        await process_prompts(strategy, prompts, config=cfg, progress=progress, **hooks)
    elif surface == "process_prompts_lazy":
        await process_prompts(strategy, source(), config=cfg, progress=progress, **hooks)
    elif surface == "process_stream":
        src: Any = source() if raiser.place == "source" else prompts
        async with process_stream(strategy, src, config=cfg, progress=progress, **hooks) as results:
            async for _ in results:
                pass
    elif surface in ("processor", "streaming"):
        async with ParallelBatchProcessor[str](cfg, progress_callback=progress, **hooks) as proc:
            if surface == "processor":
                for prompt in prompts:
                    await proc.add_work(LLMWorkItem(prompt, strategy, prompt))
                await proc.process_all()
            else:
                proc.start()
                for prompt in prompts:
                    await proc.add_work(LLMWorkItem(prompt, strategy, prompt))
                await proc.finish()
                async for _ in proc.results():
                    pass
    elif surface == "shared_host":
        host = ExecutorHost(cfg)
        async with host, ParallelBatchProcessor[str](progress_callback=progress, host=host, **hooks) as proc:
            for prompt in prompts:
                await proc.add_work(LLMWorkItem(prompt, strategy, prompt))
            await proc.process_all()
    elif surface == "call_result":
        await call_result(strategy, "p", config=cfg, error_classifier=classifier(raiser))
    elif surface == "pool_submit":
        async with LLMCallPool(strategy, config=cfg, error_classifier=classifier(raiser)) as pool:
            await pool.submit("p")
    else:
        raise AssertionError(surface)


def classifier(raiser: Raiser) -> Any:
    def classify(exc: Exception) -> None:
        raiser.maybe("classifier")

    return classify


async def main(surface: str, raiser: Raiser, outcome: dict[str, Any]) -> None:
    try:
        await run_surface(surface, raiser)
    except KeyboardInterrupt:
        raiser.events.append("caught")
        outcome["caught"] = "KeyboardInterrupt"
    except SystemExit as exc:
        raiser.events.append("caught")
        outcome["caught"], outcome["code"] = "SystemExit", exc.code
    else:
        outcome["caught"] = None


def run_one(backend: str, surface: str, place: str, kind: str) -> dict[str, Any]:
    events: list[str] = []
    raiser = Raiser(place, kind, events)
    outcome: dict[str, Any] = {"surface": surface, "place": place, "kind": kind, "events": events}
    try:
        if backend == "asyncio":
            import asyncio

            asyncio.run(main(surface, raiser, outcome))
        else:
            import trio

            trio.run(main, surface, raiser, outcome)
    except BaseException as exc:  # what left the event loop is the finding
        outcome["escaped"] = type(exc).__name__
    return outcome


if __name__ == "__main__":
    chosen = sys.argv[1]
    for scenario in scenarios():
        print(json.dumps(run_one(chosen, *scenario)), flush=True)
    # A loop that an interrupt left leaves anyio's worker threads waiting for it: do not join them.
    os._exit(0)
