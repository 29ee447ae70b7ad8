"""One 429 pauses the whole quota scope, then admission ramps back up (on Trio's virtual clock)."""

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
    """A provider that answers in 1 s and rate-limits one request (at once) with Retry-After: 20."""
    call_starts.append(anyio.current_time())
    if prompt == "prompt 12" and attempt == 1:
        await anyio.sleep(0.1)
        raise ProviderError("429 Too Many Requests", category=ErrorCategory.RATE_LIMIT,
                            retry_after=20.0, status_code=429)
    await anyio.sleep(1.0)
    return "ok"


async def main() -> None:
    config = ProcessorConfig(
        concurrency=10,
        rate_limit=RateLimitConfig(
            cooldown_seconds=5.0,  # the pause when the provider gives no Retry-After
            slow_start_seconds=10.0,  # then back from 20 % to full concurrency over 10 s
            slow_start_initial_fraction=0.2,
        ),
    )
    started = anyio.current_time()
    batch = await process_prompts(CallableStrategy(provider), [f"prompt {i}" for i in range(100)],
                                  config=config)
    elapsed = anyio.current_time() - started
    per_second = Counter(int(t - started) for t in call_starts)
    print("calls started per second:", dict(sorted(per_second.items())))
    print(f"{batch.succeeded} succeeded with {len(call_starts)} calls in {elapsed:.0f} s; "
          f"{sum(1 for r in batch if r.timing.cooldown > 0)} items waited out the cooldown")


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
