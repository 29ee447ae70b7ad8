"""Helpers shared by the run tests, and the child process they start.

:class:`CountingStrategy` counts calls per prompt (the exactly-once evidence),
can append each call to a log file with one ``os.write`` on an ``O_APPEND``
descriptor (the bytes survive a SIGKILL of the process), can SIGKILL its own
process at the M-th call, can set an event at the N-th call, and can hold
every call from the H-th on until released.

Run as a script, a child opens a run and drives it until it is terminal::

    python tests/_runs_child.py --db P --run-id R --items N [--jsonl FILE]
        [--resume] [--kill-at-entry K [--entry-delay SECONDS]] [--kill-at-call M]
        [--calls-log F] [--slice-items S] [--backend trio|asyncio]

It prints one JSON line: ``{"status": ..., "calls": {prompt: count}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from trio_batch_llm import ArtifactIdentity, LLMCallStrategy, ProcessorConfig, RetryState

IDENTITY = ArtifactIdentity(provider="test", model="counting", prompt_version="1")


class CountingStrategy(LLMCallStrategy[str]):
    """Answers ``"out: " + prompt``; see the module docstring."""

    def __init__(
        self,
        *,
        latency: float = 0.0,
        calls_log: str | None = None,
        kill_at_call: int | None = None,
        signal_at_call: int | None = None,
        hold_from_call: int | None = None,
    ) -> None:
        self.latency = latency
        self.calls: Counter[str] = Counter()
        self.starts: list[float] = []
        self.kill_at_call = kill_at_call
        self.signal_at_call = signal_at_call
        self.hold_from_call = hold_from_call
        self._reached: anyio.Event | None = None
        self._release: anyio.Event | None = None
        self._log_fd = (
            os.open(calls_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if calls_log else None
        )

    @property
    def model_name(self) -> str:
        return "counting"

    @property
    def reached(self) -> anyio.Event:
        if self._reached is None:
            self._reached = anyio.Event()
        return self._reached

    @property
    def release(self) -> anyio.Event:
        """Calls from ``hold_from_call`` on wait for this event."""
        if self._release is None:
            self._release = anyio.Event()
        return self._release

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, Any, Any]:
        self.calls[prompt] += 1
        self.starts.append(anyio.current_time())
        if self._log_fd is not None:
            os.write(self._log_fd, (prompt + "\n").encode())
        if self.kill_at_call is not None and self.total == self.kill_at_call:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.signal_at_call is not None and self.total == self.signal_at_call:
            self.reached.set()
        if self.hold_from_call is not None and self.total >= self.hold_from_call:
            await self.release.wait()
        if self.latency:
            await anyio.sleep(self.latency)
        else:
            await anyio.lowlevel.checkpoint()
        return "out: " + prompt, {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}, None


def prompts(n: int) -> list[str]:
    return [f"p{i}" for i in range(n)]


def killing_source(n: int, kill_at_entry: int) -> Iterator[str]:
    """``p0 … p{n-1}``, but SIGKILL this process when asked for entry ``kill_at_entry``."""
    for i in range(n):
        if i == kill_at_entry:
            os.kill(os.getpid(), signal.SIGKILL)
        yield f"p{i}"


async def slow_killing_source(n: int, kill_at_entry: int, delay: float) -> AsyncIterator[str]:
    """The same, one entry every ``delay`` seconds, so processing runs alongside ingestion."""
    for entry in killing_source(n, kill_at_entry):
        await anyio.sleep(delay)
        yield entry


async def _child(args: argparse.Namespace) -> dict[str, Any]:
    from trio_batch_llm._runs import open_run

    strategy = CountingStrategy(calls_log=args.calls_log, kill_at_call=args.kill_at_call)
    source: Any
    if args.jsonl:
        source = Path(args.jsonl)
    elif args.kill_at_entry is not None and args.entry_delay:
        source = slow_killing_source(args.items, args.kill_at_entry, args.entry_delay)
    elif args.kill_at_entry is not None:
        source = killing_source(args.items, args.kill_at_entry)
    else:
        source = prompts(args.items)
    async with await open_run(
        args.db, args.run_id, strategy, source, config=ProcessorConfig(concurrency=4),
        identity=IDENTITY, slice_items=args.slice_items, poll_interval=0.05,
    ) as run:
        if args.resume:
            await run.resume()
        snap = await run.wait(timeout=60)
    return {"status": snap.status, "calls": dict(strategy.calls)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--jsonl")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at-entry", type=int)
    parser.add_argument("--kill-at-call", type=int)
    parser.add_argument("--calls-log")
    parser.add_argument("--slice-items", type=int, default=5)
    parser.add_argument("--entry-delay", type=float, default=0.0)
    parser.add_argument("--backend", default="trio")
    args = parser.parse_args()
    outcome = anyio.run(_child, args, backend=args.backend)
    sys.stdout.write(json.dumps(outcome) + "\n")


if __name__ == "__main__":
    main()
