"""Observers, a middleware and a post-processor around one batch, and its metrics."""

import dataclasses

import trio

from trio_batch_llm import (
    ErrorCategory,
    FakeStrategy,
    ItemCompleted,
    ItemFailed,
    LifecycleEvent,
    LLMWorkItem,
    MetricsObserver,
    Middleware,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    WorkItemResult,
    process_prompts,
)

SCRIPT = {  # the fake provider's answers, by the prompt it gets and attempt
    "review 2 (briefly)": [ProviderError("overloaded", category=ErrorCategory.SERVER)],
    "review 4 (briefly)": [
        ProviderError("refused", category=ErrorCategory.CONTENT_POLICY)
    ],
}


class FailureLog:
    """An observer: any object with on_event(event), called on the event loop."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_event(self, event: LifecycleEvent) -> None:
        if isinstance(event, ItemFailed):
            result = event.result
            self.lines.append(f"{result.item_id} failed: {result.error_category}")
        elif isinstance(event, ItemCompleted) and event.result.attempts > 1:
            self.lines.append(f"{event.result.item_id} needed {event.result.attempts}")


class Tag(Middleware):
    """A middleware: rewrite the item before the call, the result after it."""

    def before(self, item: LLMWorkItem[str]) -> LLMWorkItem[str]:
        return dataclasses.replace(item, prompt=f"{item.prompt} (briefly)")

    def after(
        self, item: LLMWorkItem[str], result: WorkItemResult[str]
    ) -> WorkItemResult[str]:
        result.metadata["tagged"] = True
        return result


def shout(result: WorkItemResult[str]) -> WorkItemResult[str]:
    """A post-processor: runs on each fresh success (a sync one, in a worker thread)."""
    result.output = f"{result.output}!"
    return result


async def main() -> None:
    log = FailureLog()
    metrics = MetricsObserver(labels={"model": "fake-model", "scope": "fake"})
    config = ProcessorConfig(
        concurrency=2, retry=RetryConfig(initial_wait=0.001, max_wait=0.01)
    )
    batch = await process_prompts(
        FakeStrategy(script=SCRIPT),
        [f"review {n}" for n in range(5)],
        config=config,
        preserve_order=True,
        observers=[log, metrics],
        middlewares=[Tag()],
        post_processor=shout,
    )
    for result in batch:
        print(result.item_id, result.output, result.metadata)
    print(sorted(log.lines))
    data = metrics.to_dict()
    print("items:", data["items"], "retries:", data["retries_by_category"])
    for line in metrics.to_prometheus().splitlines():
        if line.startswith("trio_batch_llm_items_total"):
            print(line)


if __name__ == "__main__":
    trio.run(main)
