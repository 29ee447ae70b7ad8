"""The capacity warning: ``concurrency`` above what the process's open-file limit (minus the files it
already has) or a strategy's HTTP connection pool can carry warns once, naming both numbers and the fix."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    LLMCallStrategy,
    OpenAICompatibleStrategy,
    ProcessorConfig,
    RetryState,
    process_prompts,
)
from trio_batch_llm._values import _config_warnings


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh process would: nothing warned yet, a roomy file limit."""
    monkeypatch.setattr(_config_warnings, "_WARNED", set())
    monkeypatch.setattr(_config_warnings, "open_file_limit", lambda: 1 << 20)
    monkeypatch.setattr(_config_warnings, "open_files", lambda: 10)


def _capacity(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)
            and "concurrency=" in str(w.message) and "max_provider_concurrency" not in str(w.message)]


# --- the open-file limit (when the config is made) -------------------------------------------------


def test_files_already_open_count_against_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_config_warnings, "open_file_limit", lambda: 1024)
    monkeypatch.setattr(_config_warnings, "open_files", lambda: 900)
    # 1024 - 900 open - a margin leaves fewer than 100 sockets: the old "2 x concurrency > limit" said nothing
    with pytest.warns(UserWarning, match=r"concurrency=100 .* 1024 \(RLIMIT_NOFILE\).* 900 .*open") as caught:
        ProcessorConfig(concurrency=100)
    text = str(caught[0].message)
    assert "ulimit -n" in text and "lower concurrency" in text
    monkeypatch.setattr(_config_warnings, "open_files", lambda: 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ProcessorConfig(concurrency=500)  # 1024 - 10 open - margin: room for 500


def test_warned_once_per_process_not_per_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_config_warnings, "open_file_limit", lambda: 256)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = ProcessorConfig(concurrency=300)
        dataclasses.replace(config, max_queue_size=10)  # what process_prompts does with a config
        ProcessorConfig(concurrency=300)
    assert len(_capacity(caught)) == 1


def test_small_concurrency_reads_no_file_table(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> int:
        raise AssertionError("listed the open files for a config of few workers")

    monkeypatch.setattr(_config_warnings, "open_files", boom)
    ProcessorConfig(max_workers=1)  # what every call() makes: costs a getrlimit, nothing more
    ProcessorConfig()


# --- the HTTP connection pool (when an owner first uses a strategy) --------------------------------


class _Pooled(LLMCallStrategy[str]):
    """A strategy whose HTTP pool holds ``limit`` connections."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit

    @property
    def connection_limit(self) -> int | None:
        return self.limit

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, dict[str, int], None]:
        await anyio.lowlevel.checkpoint()
        return prompt, {}, None


@pytest.mark.anyio
async def test_a_pool_smaller_than_concurrency_warns_once(anyio_backend: Any) -> None:
    strategy = _Pooled(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # two owners of one strategy: one warning
            batch = await process_prompts(strategy, ["a", "b", "c"], config=ProcessorConfig(concurrency=16))
            assert batch.succeeded == 3
    found = _capacity(caught)
    assert len(found) == 1
    assert "concurrency=16" in found[0] and "4 connections" in found[0] and "_Pooled" in found[0]
    assert "lower concurrency to 4" in found[0] and "max_connections" in found[0]  # what to do


@pytest.mark.anyio
async def test_a_pool_that_fits_or_is_unknown_says_nothing(anyio_backend: Any) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for limit in (16, 100, None):
            await process_prompts(_Pooled(limit), ["a"], config=ProcessorConfig(concurrency=16))
    assert _capacity(caught) == []


def test_the_openai_strategies_know_their_pool() -> None:
    import httpx2

    url = "http://127.0.0.1:9/v1"
    assert OpenAICompatibleStrategy("m", base_url=url).connection_limit is None  # sized by the engine
    assert OpenAICompatibleStrategy("m", base_url=url, concurrency=8).connection_limit == 8
    client = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=5))
    assert OpenAICompatibleStrategy("m", base_url=url, client=client).connection_limit == 5
    unbounded = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=None))
    assert OpenAICompatibleStrategy("m", base_url=url, client=unbounded).connection_limit is None
