"""Retries that fit the cause: backoff, a shared cooldown for 429s, or no retry."""

import trio

from trio_batch_llm import (
    ErrorCategory,
    FakeStrategy,
    ProcessorConfig,
    ProviderError,
    RateLimitConfig,
    RetryConfig,
    process_prompts,
)


def server_error() -> ProviderError:
    return ProviderError(
        "502 Bad Gateway", category=ErrorCategory.SERVER, status_code=502
    )


async def main() -> None:
    # Outcomes by attempt, per prompt: an exception is raised, anything else is the
    # answer.
    strategy = FakeStrategy(
        script={
            "flaky": [server_error(), server_error(), "third time lucky"],
            "doomed": [server_error(), server_error(), server_error()],
            "too long": [
                ProviderError(
                    "maximum context length exceeded",
                    category=ErrorCategory.CONTEXT_LENGTH,
                    status_code=400,
                )
            ],
            "busy": [
                ProviderError(
                    "429 Too Many Requests",
                    category=ErrorCategory.RATE_LIMIT,
                    retry_after=0.05,
                    status_code=429,
                ),
                "answered after the cooldown",
            ],
        }
    )
    config = ProcessorConfig(
        retry=RetryConfig(
            # calls per item for retryable failures (429s have their own budget)
            max_attempts=3,
            # backoff ceilings 0.01, 0.02, 0.04 ... capped at max_wait;
            initial_wait=0.01,
            max_wait=0.1,  # full jitter draws each wait uniformly below its ceiling
            max_rate_limit_retries=20,
        ),
        rate_limit=RateLimitConfig(slow_start_seconds=0.1),
    )
    prompts = [(name, name) for name in ("flaky", "doomed", "too long", "busy")]
    batch = await process_prompts(strategy, prompts, config=config, preserve_order=True)
    for r in batch:
        verdict = r.output if r.success else f"failed: {r.error_category}"
        print(f"{r.item_id:>8}: {r.attempts} call(s), {verdict}")


if __name__ == "__main__":
    trio.run(main)
