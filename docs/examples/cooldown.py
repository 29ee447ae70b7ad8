"""One 429 pauses the whole quota scope, then admission ramps back up (virtual time)."""

import textwrap
from collections import Counter

import anyio
import trio
import trio.testing

from trio_batch_llm import (
    CallableStrategy,
    ErrorCategory,
    ProcessorConfig,
    ProviderError,
    RateLimitConfig,
    process_prompts,
)

call_starts: list[float] = []


async def provider(prompt: str, *, attempt: int) -> str:
    """Answers in 1 s; rate-limits one request (at once) with Retry-After: 20."""
    call_starts.append(anyio.current_time())
    if prompt == "prompt 12" and attempt == 1:
        await anyio.sleep(0.1)
        raise ProviderError(
            "429 Too Many Requests",
            category=ErrorCategory.RATE_LIMIT,
            retry_after=20.0,
            status_code=429,
        )
    await anyio.sleep(1.0)
    return "ok"


async def main() -> None:
    config = ProcessorConfig(
        concurrency=10,
        rate_limit=RateLimitConfig(
            cooldown_seconds=5.0,  # the pause when the provider gives no Retry-After
            # then back from 20 % to full concurrency over 10 s
            slow_start_seconds=10.0,
            slow_start_initial_fraction=0.2,
        ),
    )
    started = anyio.current_time()
    batch = await process_prompts(
        CallableStrategy(provider), [f"prompt {i}" for i in range(100)], config=config
    )
    elapsed = anyio.current_time() - started
    per_second = Counter(int(t - started) for t in call_starts)
    print("calls started per second (second: calls):")
    counts = ", ".join(
        f"{second}: {calls}" for second, calls in sorted(per_second.items())
    )
    print(textwrap.fill(counts, width=86, initial_indent="  ", subsequent_indent="  "))
    print(
        f"{batch.succeeded} succeeded with "
        f"{len(call_starts)} calls in {elapsed:.0f} s; "
        f"{sum(1 for r in batch if r.timing.cooldown > 0)} "
        f"items waited out the cooldown"
    )


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
