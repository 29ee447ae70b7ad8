"""Escalate to a stronger model when the cheap one fails: on_error and RetryState."""

from typing import Any

import anyio
import anyio.lowlevel
import trio

from trio_batch_llm import (
    ErrorCategory,
    LLMCallStrategy,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    RetryState,
    TokenUsage,
    process_prompts,
)


class EscalatingStrategy(LLMCallStrategy[str]):
    """The small model first; after a failure that may be its fault, the large one."""

    models = ("small-model", "large-model")

    async def execute(
        self,
        prompt: str,
        attempt: int,
        timeout: float | None,
        state: RetryState | None = None,
    ) -> tuple[str, TokenUsage | None, Any]:
        model = (
            state.get("model", self.models[0]) if state is not None else self.models[0]
        )
        await anyio.sleep(0.01)  # stands in for the provider call
        if model == "small-model" and "hard" in prompt:
            raise ProviderError(
                "answer did not match the schema", category=ErrorCategory.PARSE
            )
        return f"{model}: answered {prompt!r}", {"total_tokens": 20}, {"model": model}

    async def on_error(
        self, exception: Exception, attempt: int, state: RetryState | None
    ) -> None:
        # Called before each retry, with the item's own RetryState (None never happens
        # on a retry).
        if state is not None and state.last_category is ErrorCategory.PARSE:
            state.set("model", self.models[1])
        await anyio.lowlevel.checkpoint()


async def main() -> None:
    config = ProcessorConfig(retry=RetryConfig(initial_wait=0.0))
    batch = await process_prompts(
        EscalatingStrategy(), ["easy question", "hard question"], config=config
    )
    for result in batch.in_input_order():
        print(f"{result.item_id}: {result.output} after {result.attempts} call(s)")


if __name__ == "__main__":
    trio.run(main)
