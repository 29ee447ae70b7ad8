"""Guardrails: item and batch deadlines, fail-fast categories, token and cost budget."""

import trio

from trio_batch_llm import (
    AbortMode,
    ErrorCategory,
    FakeStrategy,
    GuardrailConfig,
    ProcessorConfig,
    ProviderError,
    TokenUsage,
    process_prompts,
)

PROMPTS = [f"prompt {i}" for i in range(20)]


def dollars(usage: TokenUsage) -> float:
    """One item's price (all attempts): $2.50 per million tokens in, $10 out."""
    return (
        usage.get("input_tokens", 0) * 2.50 + usage.get("output_tokens", 0) * 10.0
    ) / 1e6


async def run(title: str, strategy: FakeStrategy, guardrails: GuardrailConfig) -> None:
    config = ProcessorConfig(concurrency=4, attempt_timeout=1.0, guardrails=guardrails)
    batch = await process_prompts(strategy, PROMPTS, config=config)
    failures = sorted({str(r.error_category) for r in batch.failures()})
    print(
        f"{title}: {batch.termination.kind}; {batch.succeeded} succeeded, "
        f"{batch.failed} failed {failures}"
    )


async def main() -> None:
    # One item may take at most 0.05 s in all: waits, calls and retries together.
    # (Calls here take 0 to 0.1 s, drawn per prompt.)
    await run(
        "item deadline",
        FakeStrategy(latency=(0.0, 0.1)),
        GuardrailConfig(total_timeout_per_item=0.05),
    )

    # The whole batch may take at most 0.1 s; every item still gets one result.
    await run(
        "batch deadline", FakeStrategy(latency=0.04), GuardrailConfig(batch_timeout=0.1)
    )

    # A bad key will not get better: stop at the first AUTHENTICATION failure.
    bad_key = ProviderError(
        "401 invalid api key", category=ErrorCategory.AUTHENTICATION, status_code=401
    )
    await run(
        "fail fast",
        FakeStrategy(latency=0.01, script={"prompt 5": [bad_key]}),
        GuardrailConfig(
            abort_on_error_categories=frozenset({ErrorCategory.AUTHENTICATION}),
            abort_mode=AbortMode.DRAIN_ACTIVE,
        ),
    )

    # Spending caps: checked as each item finishes (calls in flight may overshoot a
    # little).
    await run(
        "token budget",
        FakeStrategy(latency=0.01, tokens=(100, 50)),
        GuardrailConfig(max_total_tokens=1_000),
    )
    await run(
        "cost budget",
        FakeStrategy(latency=0.01, tokens=(1_000, 500)),
        GuardrailConfig(max_total_cost=0.05, cost_function=dollars),
    )


if __name__ == "__main__":
    trio.run(main)
