"""TPM estimates: TokenEstimate, the request estimator (input + output allowance), the tiktoken path."""

from __future__ import annotations

import sys
import types
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import trio_batch_llm
from trio_batch_llm import CallableStrategy, ConfigurationError, LLMCallPool, ProcessorConfig, TokenEstimate
from trio_batch_llm._engine import _tokenizer
from trio_batch_llm._engine._tokenizer import load_tokenizer, tokenizer_unloaded
from trio_batch_llm._engine._tokenizer import request_tokens as _request_tokens
from trio_batch_llm._values._token_estimates import DEFAULT_OUTPUT_ALLOWANCE, RequestTokens, prompt_text

pytestmark = pytest.mark.anyio


def test_token_estimate_is_frozen_validated_and_exported() -> None:
    estimate = TokenEstimate(input_tokens=120, output_tokens=30)
    assert estimate.total_tokens == 150
    assert TokenEstimate(7).output_tokens == 0
    assert trio_batch_llm.TokenEstimate is TokenEstimate
    with pytest.raises(AttributeError):
        estimate.input_tokens = 1  # type: ignore[misc]
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(ConfigurationError, match="input_tokens"):
            TokenEstimate(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="output_tokens"):
            TokenEstimate(1, bad)  # type: ignore[arg-type]


def test_character_estimate_reserves_input_plus_output_allowance() -> None:
    tokens = RequestTokens(None)
    assert tokens("a" * 400) == 100 + DEFAULT_OUTPUT_ALLOWANCE
    # A request's max output tokens replaces the allowance: item params over strategy params.
    assert tokens("a" * 400, {"max_output_tokens": 50}) == 150
    with_defaults = RequestTokens(None, system="s" * 40, defaults={"max_tokens": 70})
    assert with_defaults("a" * 400) == 100 + 10 + 70
    assert with_defaults("a" * 400, {"max_completion_tokens": 5}) == 100 + 10 + 5
    # An item's own system prompt wins over the strategy's.
    assert with_defaults("a" * 400, {"system": "x" * 400}) == 100 + 100 + 70
    with pytest.raises(ConfigurationError, match="max_output_tokens"):
        tokens("a", {"max_output_tokens": -3})


def test_messages_are_counted_by_their_text() -> None:
    messages = [
        {"role": "system", "content": "b" * 40},
        {"role": "user", "content": [{"type": "text", "text": "c" * 80},
                                     {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
    ]
    assert prompt_text(messages) == "b" * 40 + "\n" + "c" * 80
    assert RequestTokens(None)(messages, {"max_output_tokens": 0}) == 121 // 4


def test_user_estimator_int_is_the_input_and_token_estimate_is_used_whole() -> None:
    as_int = RequestTokens(lambda text: 1000)
    assert as_int("p") == 1000
    assert as_int("p", {"max_output_tokens": 200}) == 1200
    whole = RequestTokens(lambda text: TokenEstimate(1000, 30))
    assert whole("p", {"max_output_tokens": 200}) == 1030
    assert ProcessorConfig(token_estimator=lambda text: TokenEstimate(5, 6)).estimate_tokens("p") == 11
    assert ProcessorConfig().estimate_tokens("a" * 40) == 10 + 256
    with pytest.raises(ConfigurationError, match="token_estimator"):
        RequestTokens(lambda text: -1)("p")


async def request_tokens(strategy: Any, estimator: Any) -> RequestTokens:
    """As the engine binds a strategy: load its tokenizer if needed, then build its estimator."""
    if tokenizer_unloaded(strategy, estimator):
        await load_tokenizer(strategy)
    return _request_tokens(strategy, estimator)


class _Encoding:
    def encode(self, text: str, disallowed_special: Any = ()) -> list[int]:
        return [0] * len(text.split())


@pytest.fixture
def fake_tiktoken(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A stand-in tiktoken module: knows "gpt-4o" (one token a word); any other model fails as an
    offline first load does (its encoding cannot be downloaded)."""
    asked: list[str] = []

    def encoding_for_model(model: str) -> _Encoding:
        asked.append(model)
        if model != "gpt-4o":
            raise ConnectionError("could not download cl100k_base: no network")
        return _Encoding()

    module = types.ModuleType("tiktoken")
    module.encoding_for_model = encoding_for_model  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tiktoken", module)
    monkeypatch.setattr(_tokenizer, "_encoders", {})
    monkeypatch.setattr("trio_batch_llm._engine._tokenizer._TIKTOKEN_INSTALLED", True)
    return asked


class _Model(CallableStrategy[str]):
    def __init__(self, model: str, params: dict[str, Any] | None = None) -> None:
        super().__init__(self._echo)
        self._model, self._params = model, params or {}

    async def _echo(self, prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        return prompt

    @property
    def model_name(self) -> str:
        return self._model

    @property
    def params(self) -> dict[str, Any]:
        return self._params


async def test_tiktoken_counts_a_known_model_once_loaded(fake_tiktoken: list[str]) -> None:
    first = await request_tokens(_Model("gpt-4o"), None)
    again = await request_tokens(_Model("gpt-4o"), None)
    assert first("one two three four", {"max_output_tokens": 10}) == 4 + 10
    assert again("five six") == 2 + DEFAULT_OUTPUT_ALLOWANCE
    assert fake_tiktoken == ["gpt-4o"]  # the encoding is loaded once per model


async def test_tiktoken_that_cannot_load_falls_back_to_characters(fake_tiktoken: list[str]) -> None:
    tokens = await request_tokens(_Model("offline-model"), None)
    assert tokens("a" * 400, {"max_output_tokens": 1}) == 100 + 1
    await request_tokens(_Model("offline-model"), None)
    assert fake_tiktoken == ["offline-model"]  # the failure is cached too: no retry per binding


async def test_a_user_estimator_skips_tiktoken(fake_tiktoken: list[str]) -> None:
    tokens = await request_tokens(_Model("gpt-4o"), lambda text: 9)
    assert tokens("one two") == 9
    assert fake_tiktoken == []


async def test_max_output_tokens_is_part_of_the_reservation() -> None:
    started = anyio.Event()

    class Hanging(_Model):
        async def _echo(self, prompt: str) -> str:
            started.set()
            await anyio.sleep_forever()
            return prompt  # pragma: no cover

    config = ProcessorConfig(concurrency=1, max_tokens_per_minute=100_000)
    strategy = Hanging("not-a-tiktoken-model", {"max_output_tokens": 1000})
    async with LLMCallPool[str](strategy, config=config) as pool:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pool.submit_result, "a" * 400)
                await started.wait()
                reserved = pool.statistics().admission.tokens_reserved_in_window
                scope.cancel()
    assert reserved == 100 + 1000


async def test_a_strategys_own_max_output_tokens_bounds_the_reservation() -> None:
    from trio_batch_llm import OpenAICompatibleStrategy

    strategy = OpenAICompatibleStrategy("not-a-tiktoken-model", base_url="http://127.0.0.1:9/v1",
                                        max_output_tokens=40, system_prompt="s" * 80)
    tokens = await request_tokens(strategy, None)
    assert tokens("a" * 400) == 100 + 20 + 40
    assert tokens("a" * 400, {"max_output_tokens": 5}) == 100 + 20 + 5
