"""Your pipeline: the code under test takes its strategy as a parameter."""

from trio_batch_llm import (
    LLMCallStrategy,
    ProcessorConfig,
    RetryConfig,
    process_prompts,
)

CONFIG = ProcessorConfig(
    concurrency=8,
    retry=RetryConfig(
        max_attempts=3, initial_wait=2.0, jitter=False
    ),  # waits of 2 s, then 4 s
)


async def label_reviews(
    strategy: LLMCallStrategy[str], reviews: dict[str, str]
) -> dict[str, str]:
    """Label each review positive or negative; one whose call failed is "unknown"."""
    batch = await process_prompts(strategy, list(reviews.items()), config=CONFIG)
    return {
        result.item_id: result.output.strip().lower()
        if result.success and result.output
        else "unknown"
        for result in batch
    }
