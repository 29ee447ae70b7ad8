"""Requests and tokens per minute at provider scale, on Trio's virtual clock.

A minute passes in milliseconds under ``MockClock(autojump_threshold=0)``: the
clock jumps ahead whenever every task is waiting. Drop the ``clock=`` argument
to watch the same run take four real minutes.
"""

import anyio
import trio
import trio.testing

from trio_batch_llm import FakeStrategy, ProcessorConfig, process_prompts


async def main() -> None:
    # Requests per minute: at most 100 requests start in any 60 s window.
    config = ProcessorConfig(concurrency=50, max_requests_per_minute=100)
    strategy = FakeStrategy(latency=0.5)
    started = anyio.current_time()
    await process_prompts(
        strategy, [f"question {i}" for i in range(250)], config=config
    )
    print(
        f"250 requests at 100 RPM: {anyio.current_time() - started:.1f} s, "
        f"at most {strategy.max_in_flight} in flight"
    )

    # Tokens per minute: each request reserves its estimate before it starts; the
    # reservation is settled with the real usage when it ends.
    config = ProcessorConfig(
        concurrency=50,
        max_tokens_per_minute=10_000,
        token_estimator=lambda prompt: 1_000,  # prompt plus expected answer, in tokens
    )
    strategy = FakeStrategy(
        latency=0.5, tokens=(400, 600)
    )  # really uses 1,000 tokens a call
    started = anyio.current_time()
    batch = await process_prompts(
        strategy, [f"essay {i}" for i in range(25)], config=config
    )
    longest = max(result.timing.admission_wait for result in batch)
    print(
        f"25 requests of 1,000 tokens at 10,000 TPM: "
        f"{anyio.current_time() - started:.1f} s; "
        f"longest wait for quota {longest:.1f} s"
    )


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
