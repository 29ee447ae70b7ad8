"""BatchResult's token totals, the two cache hit rates (provider prompt cache, response cache) and the
money the response cache saved, on hand-built batches and on batches the engine made (both backends)."""

from __future__ import annotations

from typing import Any

import pytest

from trio_batch_llm import (
    BatchResult,
    LLMCallStrategy,
    ModelRates,
    ProcessorConfig,
    RetryConfig,
    RetryState,
    WorkItemResult,
    process_prompts,
)
from trio_batch_llm._values._categories import ErrorCategory
from trio_batch_llm._values._errors import ProviderError

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


def _ok(item_id: str, *, model: str | None = "gpt-4o-mini", replayed: bool = False,
        cache_key: str | None = None, cached: bool = False, saved: dict[str, int] | None = None,
        **usage: int) -> WorkItemResult[str]:
    return WorkItemResult(item_id, True, "x", token_usage=dict(usage),
                          metadata={"model": model} if model is not None else {}, replayed=replayed,
                          cache_key=cache_key, cached=cached, saved_usage=dict(saved or {}))


def _batch() -> BatchResult[str]:
    return BatchResult.from_results([
        _ok("a", input_tokens=1_000, cached_input_tokens=400, output_tokens=100, total_tokens=1_100),
        _ok("b", input_tokens=3_000, cached_input_tokens=600, output_tokens=300, total_tokens=3_300),
        # replayed from a checkpoint: counted as every result is, as total_tokens() counts it
        _ok("c", replayed=True, input_tokens=1_000, output_tokens=50, total_tokens=1_050),
        WorkItemResult("d", False, error="boom", error_category=ErrorCategory.SERVER,
                       token_usage={"input_tokens": 0, "output_tokens": 0}),
    ])


def test_token_totals_count_every_result_as_total_tokens_does() -> None:
    batch = _batch()
    totals_seen = (batch.total_input_tokens, batch.total_output_tokens, batch.total_cached_tokens)
    assert totals_seen == (5_000, 450, 1_000)
    totals = batch.total_tokens()
    assert batch.total_input_tokens == totals["input_tokens"]
    assert batch.total_output_tokens == totals["output_tokens"]
    assert batch.total_cached_tokens == totals["cached_input_tokens"]
    empty = BatchResult.from_results([])
    assert (empty.total_input_tokens, empty.total_output_tokens, empty.total_cached_tokens) == (0, 0, 0)


def test_cache_hit_rate_is_the_percent_of_input_read_from_the_prompt_cache() -> None:
    batch = _batch()
    # 1,000 cached of 5,000 input tokens: 20 %, a float property (as async-batch-llm 0.28's)
    assert batch.cache_hit_rate == pytest.approx(20.0)
    assert type(batch.cache_hit_rate) is float
    assert batch.prompt_cache_hit_rate == batch.cache_hit_rate
    assert BatchResult.from_results([]).cache_hit_rate == 0.0


def test_response_cache_hits_misses_rate_and_savings() -> None:
    saved = {"input_tokens": 20_000, "output_tokens": 5_000, "total_tokens": 25_000}
    batch = BatchResult.from_results([
        _ok("hit1", cache_key="k1", cached=True, saved=saved),
        _ok("hit2", cache_key="k2", cached=True, model="gpt-4o", saved={"input_tokens": 10_000,
                                                                       "cached_input_tokens": 2_000,
                                                                       "output_tokens": 1_000}),
        _ok("miss", cache_key="k3", input_tokens=20_000, output_tokens=5_000),
        _ok("nocache", input_tokens=1, output_tokens=1),  # no cache_key: not looked up
    ])
    assert (batch.cache_hits, batch.cache_misses) == (2, 1)
    assert batch.response_cache_hit_rate == pytest.approx(200 / 3)
    # gpt-4o-mini: 20,000 x 0.15 + 5,000 x 0.60 = 3,000 + 3,000 -> $0.006
    # gpt-4o: 8,000 x 2.50 + 2,000 x 1.25 + 1,000 x 10.00 = 32,500 -> $0.0325
    assert batch.cache_savings() == pytest.approx(0.0385)
    # one rates object prices every saved usage: 30,000 in at $1/M + 6,000 out at $2/M (no cached rate)
    assert batch.cache_savings(ModelRates(1.0, 2.0)) == pytest.approx(0.030 + 0.012)
    # the hits cost nothing now: only the miss and the uncached item are in estimated_cost
    assert batch.estimated_cost() == pytest.approx(0.006 + (0.15 + 0.60) / 1e6)
    no_cache = BatchResult.from_results([_ok("a", input_tokens=1, output_tokens=1)])
    assert (no_cache.cache_hits, no_cache.cache_misses, no_cache.response_cache_hit_rate) == (0, 0, 0.0)
    assert no_cache.cache_savings() is None  # nothing came from the cache: nothing to price
    unpriceable = BatchResult.from_results([_ok("h", cache_key="k", cached=True, model="no-such-model",
                                                saved={"input_tokens": 5, "output_tokens": 5})])
    assert unpriceable.cache_savings() is None  # a partial sum would understate the savings


def test_summary_shows_cached_input_and_a_cache_line_only_when_used() -> None:
    plain = BatchResult.from_results([_ok("a", input_tokens=10, output_tokens=5, total_tokens=15)])
    assert "cached" not in plain.summary() and "cache " not in plain.summary()
    text = _batch().summary()
    tokens_line = next(line for line in text.splitlines() if line.lstrip().startswith("tokens"))
    assert "cached 1,000 (25.0 %)" in tokens_line  # of this run's 4,000 input tokens (issue 35: no replays)
    saved = {"input_tokens": 20_000, "output_tokens": 5_000}
    cached = BatchResult.from_results([
        _ok("hit", cache_key="k1", cached=True, saved=saved),
        _ok("miss", cache_key="k2", input_tokens=20_000, output_tokens=5_000),
    ], wall_time=1.0).summary()
    assert "2 items/s" in cached  # the cache line leaves the throughput alone
    cache_line = next(line for line in cached.splitlines() if line.lstrip().startswith("cache "))
    assert cache_line.split() == ["cache", "hits", "1", "misses", "1", "rate", "50.0", "%",
                                  "saved", "$0.0060"]


def test_cache_figures_survive_json() -> None:
    batch = BatchResult.from_results([
        _ok("hit", cache_key="k1", cached=True, saved={"input_tokens": 10, "output_tokens": 2}),
        _ok("miss", cache_key="k2", input_tokens=10, cached_input_tokens=5, output_tokens=2),
    ])
    again = BatchResult.from_json(batch.to_json())
    assert (again.cache_hits, again.cache_misses, again.total_cached_tokens) == (1, 1, 5)
    assert again.cache_savings() == batch.cache_savings()


# --- a batch the engine made ---------------------------------------------------------------------


class _Cached(LLMCallStrategy[str]):
    """Answers with a prompt-cache read in its usage; its first call of ``flaky`` fails with usage."""

    @property
    def model_name(self) -> str:
        return "gpt-4o-mini"

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, dict[str, int], dict[str, Any]]:
        import anyio

        await anyio.lowlevel.checkpoint()
        if prompt == "flaky" and attempt == 1:
            error = ProviderError("busy", category=ErrorCategory.SERVER)
            error.token_usage = {"input_tokens": 100, "output_tokens": 0}  # type: ignore[attr-defined]
            raise error
        return prompt, {"input_tokens": 100, "cached_input_tokens": 80, "output_tokens": 10}, \
            {"model": "gpt-4o-mini"}


@pytest.mark.anyio
async def test_totals_of_a_processed_batch(anyio_backend: Any) -> None:
    strategy = _Cached()
    config = ProcessorConfig(concurrency=2, retry=RetryConfig(initial_wait=0.0, jitter=False))
    batch = await process_prompts(strategy, ["a", "b", "flaky"], config=config)
    assert batch.succeeded == 3
    # three answers of 100 in (80 cached) and 10 out, and the failed first call of "flaky": 100 in
    assert (batch.total_input_tokens, batch.total_cached_tokens, batch.total_output_tokens) == (400, 240, 30)
    assert batch.cache_hit_rate == pytest.approx(60.0)
    assert (batch.cache_hits, batch.cache_misses) == (0, 0)
