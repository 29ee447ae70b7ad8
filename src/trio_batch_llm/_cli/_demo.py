"""``trio-batch-llm demo``: a batch end to end against the bundled mock server; no key needed.

The mock server runs in this process, on 127.0.0.1 and an OS-chosen port,
with a little latency and a few injected 429s and 5xx answers so retries and
cooldowns show in the summary. Calls go through :class:`OpenAICompatibleStrategy`
over real HTTP, exactly as they would to a provider.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any, Final

import anyio

from .._engine._entrypoints import process_prompts
from .._values._config import GuardrailConfig, ProcessorConfig, RateLimitConfig, RetryConfig
from ._command import signal_receiver
from ._render import print_demo_report, progress_display, progress_mode
from ._terminal import end_echoed_ctrl_c

__all__ = ["DEMO_MODEL", "run_demo"]

DEMO_MODEL: Final = "demo-model"
GLOSSARY: Final = (
    "What the summary's words mean:",
    "  replayed  = results read back from an earlier run's checkpoint instead of called again "
    "(none in the demo)",
    "  p50 p95 p99 = half, 95 % and 99 % of the items took at most this long",
    "  admission = how long an item waited for its turn (a free slot, the rate limits) before its call",
    "  execution = how long its calls took, every attempt added up",
)
"""The summary's words a first-time reader meets here (the same table as ``BatchResult.summary()``)."""


async def _stop_on_signal(signals: AsyncIterator[int], scope: anyio.CancelScope, stopped: list[str]) -> None:
    async for signum in signals:
        end_echoed_ctrl_c(signum)
        stopped.append(signal.Signals(signum).name)
        scope.cancel(reason="demo interrupted")
        return


def _configs(concurrency: int) -> tuple[Any, ProcessorConfig]:
    from ..mock import MockServerConfig

    mock = MockServerConfig(
        latency=(0.005, 0.04), rate_limit_rate=0.02, retry_after=0.2, server_error_rate=0.03,
        output_tokens=(5, 40), seed=1, model=DEMO_MODEL,
    )
    config = ProcessorConfig(
        concurrency=concurrency,
        attempt_timeout=10.0,
        retry=RetryConfig(max_attempts=4, initial_wait=0.05, max_wait=0.5, jitter_seed=1),
        rate_limit=RateLimitConfig(cooldown_seconds=0.2, max_cooldown_seconds=2.0, slow_start_seconds=0.5),
        guardrails=GuardrailConfig(batch_timeout=120.0),
    )
    return mock, config


async def _demo(
    items: int, concurrency: int, backend: str, progress: bool | None, stopped: list[str]
) -> None:
    from .._strategies.openai._compatible import OpenAICompatibleStrategy
    from ..mock import serve_mock

    mock, config = _configs(concurrency)
    show = progress_display(progress_mode(progress, off_terminal="off")) or False
    prompts = [f"Summarise document {i} in one line." for i in range(items)]
    with signal_receiver() as signals:
        async with anyio.create_task_group() as group:
            if signals is not None:
                group.start_soon(_stop_on_signal, signals, group.cancel_scope, stopped, name="signal watcher")
            async with serve_mock(mock) as server:
                strategy = OpenAICompatibleStrategy(DEMO_MODEL, base_url=server.base_url, api_key_env=None,
                                                    concurrency=concurrency)
                print(f"trio-batch-llm demo: {items} prompts, concurrency {concurrency}, backend {backend}, "
                      f"mock server at {server.base_url}", flush=True)
                batch = await process_prompts(strategy, prompts, config=config, progress=show)
                stats = server.stats
            print_demo_report(batch, stats)
            print("\n".join(GLOSSARY), flush=True)
            group.cancel_scope.cancel(reason="demo finished")


def run_demo(*, items: int, concurrency: int, backend: str, progress: bool | None = None) -> int:
    """Run the demo; returns the exit status (130 when interrupted)."""
    if not all(importlib.util.find_spec(name) for name in ("httpx2", "hypercorn")):
        print("trio-batch-llm demo needs the mock server: pip install 'trio-batch-llm[mock]'",
              file=sys.stderr)
        return 1
    stopped: list[str] = []
    anyio.run(_demo, items, concurrency, backend, progress, stopped, backend=backend)
    if stopped:
        print(f"trio-batch-llm: demo interrupted by {stopped[0]}", file=sys.stderr)
        return 128 + int(signal.Signals[stopped[0]])
    return 0
