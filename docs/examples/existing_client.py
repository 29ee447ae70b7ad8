"""Wrap the async client you already have: CallableStrategy, CallOutcome, errors."""

from typing import Any

import anyio
import trio

from trio_batch_llm import CallableStrategy, CallOutcome, ErrorCategory, process_prompts


class RateLimited(Exception):
    """What the client raises on HTTP 429. Most SDKs' errors carry these attributes."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"429 Too Many Requests; retry after {retry_after} s")
        self.status_code = 429
        self.retry_after = retry_after


class GarbledReply(Exception):
    """What the client raises when it cannot parse an answer."""


class ReviewClient:
    """Stands in for the client your application already has (anyio/Trio-compatible)."""

    def __init__(self) -> None:
        self.requests = 0

    async def complete(self, text: str) -> dict[str, Any]:
        self.requests += 1
        number = self.requests
        await anyio.sleep(0.01)
        if number == 3:
            raise RateLimited(retry_after=0.05)
        if number == 5:
            raise GarbledReply("unexpected end of JSON")
        return {
            "label": "positive" if "good" in text else "negative",
            "usage": {"prompt_tokens": len(text.split()), "completion_tokens": 1},
        }


client = ReviewClient()


async def label_review(prompt: str) -> CallOutcome[str]:
    """The one function the library needs: a prompt in, a value (and its usage) out."""
    reply = await client.complete(prompt)
    usage = reply["usage"]
    return CallOutcome(
        reply["label"],
        token_usage={
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
        },
    )


def classify_client_errors(exc: Exception) -> ErrorCategory | None:
    """Teach the engine errors it cannot know; None defers to the built-in rules."""
    if isinstance(exc, GarbledReply):
        return ErrorCategory.PARSE  # retried: the next answer may well parse
    return None


async def main() -> None:
    strategy = CallableStrategy[str](label_review)
    reviews = [f"review {i}: {'good' if i % 2 else 'bad'} product" for i in range(10)]
    batch = await process_prompts(
        strategy, reviews, concurrency=4, error_classifier=classify_client_errors
    )
    print(
        f"{batch.succeeded} succeeded, {batch.failed} "
        f"failed, {client.requests} requests"
    )
    retried = [r for r in batch if r.attempts > 1]
    print("retried:", [(r.item_id, r.attempts) for r in retried])
    print("tokens:", batch.total_tokens())


if __name__ == "__main__":
    trio.run(main)
