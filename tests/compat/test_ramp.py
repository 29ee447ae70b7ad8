"""``StartupRampConfig``: workers start in steps (times on Trio's virtual clock), and a ramp
never holds a batch up once its input is drained (both backends)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    CallableStrategy,
    ConfigurationError,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    StartupRampConfig,
    process_prompts,
    process_stream,
)

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

RAMP = StartupRampConfig(initial_concurrency=2, concurrency_step=2, ramp_interval_seconds=1.0)


def _recording(latency: float) -> tuple[CallableStrategy[str], list[tuple[float, int]]]:
    """A strategy that records (start time, calls in flight) at each call."""
    seen: list[tuple[float, int]] = []
    in_flight = 0

    async def model(prompt: str) -> str:
        nonlocal in_flight
        in_flight += 1
        seen.append((anyio.current_time(), in_flight))
        try:
            await anyio.sleep(latency)
        finally:
            in_flight -= 1
        return prompt

    return CallableStrategy(model), seen


def _peak_by_second(seen: list[tuple[float, int]], start: float) -> list[int]:
    peaks: dict[int, int] = {}
    for at, count in seen:
        second = int(at - start + 1e-9)
        peaks[second] = max(peaks.get(second, 0), count)
    return [peaks[s] for s in sorted(peaks)]


@pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])
async def test_workers_start_in_steps_up_to_full_width() -> None:
    strategy, seen = _recording(latency=1.0)
    start = anyio.current_time()
    config = ProcessorConfig(concurrency=8, startup_ramp=RAMP)
    batch = await process_prompts(strategy, [f"p{i}" for i in range(40)], config=config)
    assert batch.succeeded == 40
    assert _peak_by_second(seen, start)[:5] == [2, 4, 6, 8, 8]


@pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])
async def test_max_concurrency_caps_the_ramp_and_streams_ramp_too() -> None:
    strategy, seen = _recording(latency=1.0)
    start = anyio.current_time()
    ramp = StartupRampConfig(initial_concurrency=1, concurrency_step=1, max_concurrency=3)
    config = ProcessorConfig(concurrency=8, startup_ramp=ramp)
    async with process_stream(strategy, [f"p{i}" for i in range(12)], config=config) as results:
        assert len([r async for r in results]) == 12
    assert max(count for _, count in seen) == 3
    assert _peak_by_second(seen, start)[:3] == [1, 2, 3]


async def test_a_ramp_never_holds_up_a_small_batch() -> None:
    strategy, _seen = _recording(latency=0.0)
    ramp = StartupRampConfig(initial_concurrency=1, ramp_interval_seconds=3600.0, jitter_seconds=5.0)
    with anyio.fail_after(30):  # would wait an hour per ramp step if the ramp held the batch
        proc = ParallelBatchProcessor[Any](ProcessorConfig(concurrency=4, startup_ramp=ramp))
        for prompt in ("a", "b", "c"):
            await proc.add_work(LLMWorkItem(item_id=prompt, strategy=strategy, prompt=prompt))
        batch = await proc.process_all()
    assert batch.succeeded == 3
    assert proc.statistics().workers == 0


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [("initial_concurrency", {"initial_concurrency": 0}),
     ("ramp_interval_seconds", {"ramp_interval_seconds": 0}),
     ("initial_concurrency", {"initial_concurrency": 4, "max_concurrency": 2}),
     ("jitter_seconds", {"jitter_seconds": -1.0})],
)
def test_bad_ramp_settings_are_named(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=field):
        StartupRampConfig(**kwargs)
    with pytest.raises(ConfigurationError, match="startup_ramp"):
        ProcessorConfig(startup_ramp="fast")  # type: ignore[arg-type]
