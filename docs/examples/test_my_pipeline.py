"""Testing a pipeline: a scripted fake, Trio's virtual clock, and the mock server.

Run with ``pytest test_my_pipeline.py``; anyio's pytest plugin (installed with
anyio) runs each ``async def`` test on the backends ``anyio_backend`` names.
"""

from typing import Any

import anyio
import pytest
import trio.testing
from my_pipeline import label_reviews

from trio_batch_llm import (
    ErrorCategory,
    FakeStrategy,
    OpenAICompatibleStrategy,
    ProviderError,
)
from trio_batch_llm.testing import serve_mock

pytestmark = pytest.mark.anyio

REVIEWS = {"r1": "Love it.", "r2": "Broke in a week."}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("asyncio", id="asyncio"),
        # Virtual time: the clock jumps ahead whenever every task is waiting.
        pytest.param(
            ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}), id="trio"
        ),
    ],
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


async def test_every_review_gets_a_label() -> None:
    strategy = FakeStrategy(
        output=lambda prompt: "Positive" if "Love" in prompt else "Negative"
    )
    assert await label_reviews(strategy, REVIEWS) == {
        "r1": "positive",
        "r2": "negative",
    }
    assert sorted(prompt for prompt, _attempt in strategy.calls) == sorted(
        REVIEWS.values()
    )


async def test_a_refused_review_is_unknown() -> None:
    refused = ProviderError(
        "content policy", category=ErrorCategory.CONTENT_POLICY, status_code=400
    )
    strategy = FakeStrategy(
        output=lambda prompt: "Positive", script={"Broke in a week.": [refused]}
    )
    assert await label_reviews(strategy, REVIEWS) == {"r1": "positive", "r2": "unknown"}
    assert (
        len(strategy.calls) == 2
    )  # not retried: the same request would be refused again


async def test_retries_wait_exactly_as_configured(anyio_backend: Any) -> None:
    if anyio_backend == "asyncio":
        pytest.skip("exact timing runs on Trio's virtual clock")
    busy = ProviderError("503", category=ErrorCategory.SERVER, status_code=503)
    strategy = FakeStrategy(
        output=lambda prompt: "Positive", script={"Love it.": [busy, busy]}
    )
    started = anyio.current_time()
    assert await label_reviews(strategy, {"r1": "Love it."}) == {"r1": "positive"}
    assert anyio.current_time() - started == 6.0  # 2 s, then 4 s: no real time passed
    assert strategy.calls == [("Love it.", 1), ("Love it.", 2), ("Love it.", 3)]


# The mock server listens on a real socket, so it needs a real clock: this test
# overrides the backend fixture with plain backends.
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_over_http_against_the_mock_server(anyio_backend: str) -> None:
    async with serve_mock() as server:
        strategy = OpenAICompatibleStrategy(
            "test-model", base_url=server.base_url, api_key_env=None
        )
        labels = await label_reviews(
            strategy, {"r1": "Positive", "r2": "[[content_policy]] x"}
        )
        assert labels == {"r1": "echo: positive", "r2": "unknown"}
        assert server.stats.requests == 2
