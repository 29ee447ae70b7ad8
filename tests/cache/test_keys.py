"""Response-cache keys: canonical (order, 1 vs 1.0), and made of each provider's whole wire request."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from trio_batch_llm import (
    AnthropicStrategy,
    ArtifactIdentity,
    CallableStrategy,
    FakeStrategy,
    GeminiStrategy,
    LLMCallStrategy,
    OpenAICompatibleStrategy,
    OpenAIStrategy,
)
from trio_batch_llm._cache._key import canonical_material, request_key
from trio_batch_llm._values._prompts import LLMRequest

KEY = "sk-very-secret-0123456789"


class Answer(BaseModel):
    city: str


class Other(BaseModel):
    town: str


# -- request_key ---------------------------------------------------------------------------


def test_equal_requests_written_differently_have_one_key() -> None:
    a = {"model": "m", "params": {"temperature": 1, "top_p": 0.5}, "stop": ("a", "b"), "seed": -0.0}
    b = {"stop": ["a", "b"], "seed": 0, "params": {"top_p": 0.5, "temperature": 1.0}, "model": "m"}
    assert request_key(a) == request_key(b)
    assert request_key(a, sample=1) != request_key(a)
    assert request_key({**a, "params": {"temperature": 1.5, "top_p": 0.5}}) != request_key(a)
    assert request_key({"x": True}) != request_key({"x": 1})  # a bool is not a number on the wire


def test_pydantic_models_and_classes_are_keyed_by_their_json() -> None:
    assert request_key({"schema": Answer}) == request_key({"schema": Answer.model_json_schema()})
    assert request_key({"schema": Answer}) != request_key({"schema": Other})
    assert request_key({"v": Answer(city="Oslo")}) == request_key({"v": {"city": "Oslo"}})
    opaque = object()
    assert "object at 0x" in json.dumps(canonical_material({"o": opaque}))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


def rewritten(value: Any, rng: random.Random) -> Any:
    """``value`` as another writer might give it: keys reordered, lists as tuples, whole floats as ints."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: rewritten(v, rng) for k, v in items}
    if isinstance(value, list):
        items = [rewritten(v, rng) for v in value]
        return tuple(items) if rng.random() < 0.5 else items
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value) if rng.random() < 0.5 else value
    return value


@given(value=json_values, seed=st.integers(0, 2**16))
def test_a_rewritten_request_has_the_same_key(value: Any, seed: int) -> None:
    material = {"request": value}
    assert request_key(material) == request_key({"request": rewritten(value, random.Random(seed))})


@given(a=json_values, b=json_values)
def test_requests_have_equal_keys_only_when_their_canonical_json_is_equal(a: Any, b: Any) -> None:
    same = json.dumps(canonical_material(a), sort_keys=True) == \
        json.dumps(canonical_material(b), sort_keys=True)
    assert (request_key({"r": a}) == request_key({"r": b})) is same


# -- what each strategy's key is made of --------------------------------------------------


def key_of(strategy: LLMCallStrategy[Any], request: LLMRequest | str = "What is the capital?"
           ) -> str | None:
    material = strategy.cache_key_material(
        request if isinstance(request, LLMRequest) else LLMRequest(request))
    if material is None:
        return None
    assert KEY not in json.dumps(material, default=str)  # never the API key
    return request_key(material).digest


PROVIDERS: dict[str, Any] = {
    "openai-compatible": lambda **kw: OpenAICompatibleStrategy(
        kw.pop("model", "m"), base_url=kw.pop("base_url", "http://127.0.0.1:8001/v1"), api_key=KEY, **kw),
    "openai": lambda **kw: OpenAIStrategy(
        kw.pop("model", "m"), base_url=kw.pop("base_url", "http://127.0.0.1:8001/v1"), api_key=KEY,
        api="chat", **kw),
    "anthropic": lambda **kw: AnthropicStrategy(
        kw.pop("model", "m"), base_url=kw.pop("base_url", "http://127.0.0.1:8001"), api_key=KEY, **kw),
    "gemini": lambda **kw: GeminiStrategy(
        kw.pop("model", "m"), base_url=kw.pop("base_url", "http://127.0.0.1:8001"), api_key=KEY, **kw),
}


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_a_provider_key_holds_every_part_of_the_wire_request(provider: str) -> None:
    make = PROVIDERS[provider]
    base = key_of(make())
    assert base is not None
    assert key_of(make()) == base  # a second, equal strategy
    assert key_of(make(base_url="http://127.0.0.1:9999/other/v1")) == base  # the same host, another port
    differ = {
        "model": key_of(make(model="m2")),
        "host": key_of(make(base_url="http://10.0.0.7:8001/v1")),
        "system prompt": key_of(make(system_prompt="Be brief.")),
        "strategy params": key_of(make(params={"stop": ["END"]})),
        "max output tokens": key_of(make(max_output_tokens=77)),
        "response model": key_of(make(response_model=Answer)),
        "prompt": key_of(make(), "What is the capital of Norway?"),
        "messages": key_of(make(), LLMRequest([{"role": "user", "content": "What is the capital?"},
                                               {"role": "assistant", "content": "Of what?"},
                                               {"role": "user", "content": "Norway"}])),
        "item params": key_of(make(), LLMRequest("What is the capital?", {"stop": ["HALT"]})),
        "tools": key_of(make(), LLMRequest("What is the capital?", {"tools": [
            {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]})),
    }
    assert key_of(make(response_model=Other)) != differ["response model"]
    assert base not in differ.values(), [name for name, k in differ.items() if k == base]
    assert len(set(differ.values())) == len(differ)


def test_a_strategy_key_is_the_same_for_equal_params_written_differently() -> None:
    one = OpenAICompatibleStrategy("m", base_url="http://h/v1", api_key=KEY,
                                   params={"temperature": 1, "top_p": 1})
    two = OpenAICompatibleStrategy("m", base_url="http://h/v1", api_key="sk-other-key",
                                   params={"top_p": 1.0, "temperature": 1.0})
    assert key_of(one) == key_of(two)


def test_strategies_without_a_model_are_not_cacheable() -> None:
    async def fn(prompt: str) -> str:
        return prompt

    class NoModel(LLMCallStrategy[str]):
        pass

    assert NoModel().cache_key_material(LLMRequest("x")) is None
    assert CallableStrategy(fn).cache_key_material(LLMRequest("x")) is None
    v1 = CallableStrategy(fn, identity=ArtifactIdentity("acme", "m", prompt_version="1"))
    v2 = CallableStrategy(fn, identity=ArtifactIdentity("acme", "m", prompt_version="2"))
    assert key_of(v1) is not None and key_of(v1) != key_of(v2)


def test_a_fake_key_holds_its_model_and_seed() -> None:
    assert key_of(FakeStrategy()) == key_of(FakeStrategy())
    assert key_of(FakeStrategy(seed=1)) != key_of(FakeStrategy())
    assert key_of(FakeStrategy(model="other")) != key_of(FakeStrategy())
