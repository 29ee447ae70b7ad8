"""The bundled mock server: an OpenAI-compatible endpoint with latency and faults."""

import trio

from trio_batch_llm import (
    OpenAICompatibleStrategy,
    ProcessorConfig,
    RateLimitConfig,
    RetryConfig,
    process_prompts,
)
from trio_batch_llm.mock import MockServerConfig, serve_mock


async def main() -> None:
    knobs = MockServerConfig(
        latency=(0.005, 0.02),  # seconds, drawn per request
        rate_limit_rate=0.05,  # 5 % of requests get a 429...
        retry_after=0.05,  # ...with this Retry-After
        server_error_rate=0.05,  # and 5 % a 500
        output_tokens=(3, 8),  # answer with that many words instead of an echo
        seed=7,  # the same faults on every run and on both backends
    )
    # Short waits keep this demo fast; see the limits and retries guides for real
    # values.
    config = ProcessorConfig(
        concurrency=16,
        retry=RetryConfig(initial_wait=0.02, max_wait=0.1),
        rate_limit=RateLimitConfig(slow_start_seconds=0.1),
    )
    async with serve_mock(knobs) as server:
        strategy = OpenAICompatibleStrategy("any-model", base_url=server.base_url)
        prompts = [f"question {i}" for i in range(60)]
        prompts.append("[[fail:503x2]] a prompt that fails twice, then succeeds")
        batch = await process_prompts(strategy, prompts, config=config)
        stats = server.stats
    print(
        f"{batch.succeeded}/{len(batch)} succeeded after {stats.requests} requests: "
        f"{stats.rate_limited} rate-limited, {stats.server_errors} server errors, "
        f"at most {stats.max_in_flight} at once"
    )


if __name__ == "__main__":
    trio.run(main)
