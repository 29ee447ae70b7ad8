"""Child process for tests/core/test_deliveries.py: a Trio close that hangs until the parent presses Ctrl+C.

``python tests/_sigint_child.py MODE PATH``: processes three items into a
``JsonlArtifactStore`` at PATH; the strategy's ``cleanup()`` prints
``cleanup-started`` and waits, in a worker thread, for a line on stdin (the
parent sends it after its first ``SIGINT``), prints ``cleanup-resumed deliveries=N``, then returns
(MODE ``once``) or hangs until the close is forced (MODE ``twice``: the
parent sends a second ``SIGINT``). Every line is flushed at once; the last
one names the exception that left ``trio.run`` and what the close did.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import trio

from trio_batch_llm import (
    ArtifactIdentity,
    JsonlArtifactStore,
    LLMCallStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    RetryState,
    TokenUsage,
)

IDENTITY = ArtifactIdentity(provider="fake", model="sigint", prompt_version="1")


def say(line: str) -> None:
    print(line, flush=True)


def wait_for_the_parent() -> None:
    # Said from the worker thread, so that when the parent presses Ctrl+C the
    # event loop is idle and Trio hands the KeyboardInterrupt to the main
    # task's checkpoint (the closer's wait), not to Python code that happens
    # to be running.
    say("cleanup-started")
    sys.stdin.readline()


def say_then_block(line: str) -> None:
    say(line)
    sys.stdin.readline()  # nothing more comes: blocks until the close abandons this thread


class WaitsForTheParent(LLMCallStrategy[str]):
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.proc: ParallelBatchProcessor[str] | None = None

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        await trio.lowlevel.checkpoint()
        return f"out:{prompt}", None, None

    async def cleanup(self) -> None:
        assert self.proc is not None
        try:
            await trio.to_thread.run_sync(wait_for_the_parent)
            # The parent pressed Ctrl+C before it answered: the KeyboardInterrupt is already
            # scheduled into the closer's wait; let the closer run and count it.
            for _ in range(100):
                if self.proc.host.ledger.statistics().deliveries:
                    break
                await trio.lowlevel.checkpoint()
            resumed = f"cleanup-resumed deliveries={self.proc.host.ledger.statistics().deliveries}"
            if self.mode == "twice":
                # Hang, idle in the event loop, until the second Ctrl+C forces the close.
                await trio.to_thread.run_sync(partial(say_then_block, resumed), abandon_on_cancel=True)
            say(resumed)
        except trio.Cancelled:
            say("cleanup-cancelled")
            raise
        say("cleanup-finished")


def main() -> int:
    mode, path = sys.argv[1], sys.argv[2]
    strategy = WaitsForTheParent(mode)
    proc = ParallelBatchProcessor[str](artifact_store=JsonlArtifactStore(path, identity=IDENTITY))
    strategy.proc = proc

    async def run() -> None:
        async with proc:
            for n in range(3):
                await proc.add_work(LLMWorkItem(item_id=f"i{n}", strategy=strategy, prompt=f"p{n}"))
            await proc.process_all()
        say("after-the-block")

    try:
        trio.run(run)
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    else:
        outcome = "returned"
    stats = proc.host.ledger.statistics()
    completed = list(stats.completed)
    say(f"outcome={outcome} state={stats.state} deliveries={stats.deliveries} completed={completed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
