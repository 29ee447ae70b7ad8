"""Write a strategy: prepare once, execute per attempt, clean up once (idempotently)."""

from typing import Any

import anyio
import anyio.lowlevel
import trio

from trio_batch_llm import LLMCallStrategy, RetryState, TokenUsage, process_prompts


class Session:
    """Stands in for a connection your strategy opens before the first call."""

    opened = 0
    closed = 0

    @classmethod
    async def open(cls) -> "Session":
        await anyio.lowlevel.checkpoint()
        cls.opened += 1
        return cls()

    async def translate(self, text: str, target: str) -> str:
        await anyio.sleep(0.01)
        return f"[{target}] {text}"

    async def aclose(self) -> None:
        await anyio.lowlevel.checkpoint()
        Session.closed += 1


class TranslateStrategy(LLMCallStrategy[str]):
    def __init__(self, target: str) -> None:
        self.target = target
        self._session: Session | None = None

    async def prepare(self) -> None:
        # Runs once before the first call, however many workers there are.
        self._session = await Session.open()

    async def execute(
        self,
        prompt: str,
        attempt: int,
        timeout: float | None,
        state: RetryState | None = None,
    ) -> tuple[str, TokenUsage | None, Any]:
        # Runs once per attempt, inside the attempt's cancel scope: no timeout
        # handling needed here. Raise to fail the attempt; the engine classifies it.
        assert self._session is not None, "prepare() runs before execute()"
        text = await self._session.translate(prompt, self.target)
        usage: TokenUsage = {
            "input_tokens": len(prompt.split()),
            "output_tokens": len(text.split()),
        }
        return text, usage, {"target": self.target}

    async def cleanup(self) -> None:
        # Must be idempotent: a close that failed or was forced may run it again.
        session, self._session = self._session, None
        if session is not None:
            await session.aclose()


async def main() -> None:
    strategy = TranslateStrategy("fr")
    batch = await process_prompts(
        strategy, [f"sentence {i}" for i in range(20)], concurrency=5
    )
    print(batch.results[0].output, batch.results[0].metadata)
    print(
        f"{batch.succeeded} translated; sessions opened "
        f"{Session.opened}, closed {Session.closed}"
    )


if __name__ == "__main__":
    trio.run(main)
