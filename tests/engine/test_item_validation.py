"""Issue 31 point 15: a work item is checked when it is made; token usage when a strategy reports it.

``LLMWorkItem`` refuses a strategy that is not an ``LLMCallStrategy``, a prompt that is neither text
nor a sequence of chat messages, params that are not a mapping and an id that is not a non-empty
string, with an error naming the field and (a shortened repr of) the value. What is inside messages
and params is checked at intake, as before, where the error can say which input it was.

Token usage with an unknown key or a count that is not a whole number >= 0 is refused where it is
reported: in ``ProviderError`` at construction, and from a strategy's answer at run time as that
item's own failure (the batch goes on).
"""

from __future__ import annotations

from typing import Any

import pytest

from trio_batch_llm import (
    CallableStrategy,
    CallOutcome,
    ErrorCategory,
    FakeStrategy,
    LLMWorkItem,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    process_prompts,
)

FAKE = FakeStrategy()
CONFIG = ProcessorConfig(retry=RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0))


# --- the item, at construction -----------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "names"), [
    ({"strategy": 42}, TypeError, ["strategy=42", "LLMCallStrategy"]),
    ({"strategy": None}, TypeError, ["strategy=None"]),
    ({"strategy": FakeStrategy}, TypeError, ["strategy=", "FakeStrategy"]),  # the class, not an instance
    ({"prompt": object()}, TypeError, ["prompt=<object object at"]),
    ({"prompt": b"bytes"}, TypeError, ["prompt=b'bytes'"]),
    ({"prompt": 7}, TypeError, ["prompt=7"]),
    ({"prompt": {"role": "user", "content": "x"}}, TypeError, ["prompt={'role': 'user'"]),  # one message
    ({"params": 5}, TypeError, ["params=5"]),
    ({"params": ["temperature"]}, TypeError, ["params=['temperature']"]),
    ({"item_id": 5}, ValueError, ["item_id=5", "non-empty string"]),
    ({"item_id": ""}, ValueError, ["item_id=''"]),
])
def test_a_bad_item_is_refused_when_made(kwargs: dict[str, Any], error: type[Exception],
                                         names: list[str]) -> None:
    fields: dict[str, Any] = {"item_id": "a", "strategy": FAKE, "prompt": "p", **kwargs}
    with pytest.raises(error) as info:
        LLMWorkItem(**fields)
    message = str(info.value)
    for name in names:
        assert name in message, message


def test_the_value_in_the_message_is_shortened() -> None:
    with pytest.raises(TypeError) as info:
        LLMWorkItem("a", FAKE, 12345678901234567890 * 10**300)  # type: ignore[arg-type]
    assert "prompt=" in str(info.value) and len(str(info.value)) < 300
    with pytest.raises(TypeError) as info:
        LLMWorkItem("a", "s" * 10_000, "p")  # type: ignore[arg-type]
    assert "strategy='sss" in str(info.value) and len(str(info.value)) < 300


@pytest.mark.anyio
async def test_what_is_inside_messages_is_checked_at_intake_saying_where() -> None:
    # Made fine (a list), refused before any call by the way in, which names the place.
    item = LLMWorkItem("m", FAKE, [{"role": "nobody", "content": "x"}])
    with pytest.raises(ValueError, match=r"prompts\[0\].*messages\[0\] role='nobody'"):
        await process_prompts(FAKE, [item])


def test_good_items_are_made_as_given() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert LLMWorkItem("a", FAKE, "p").prompt == "p"
    item = LLMWorkItem("b", FAKE, messages, context={"k": 1}, params={"temperature": 0})
    assert (item.prompt, item.params, item.context) == (messages, {"temperature": 0}, {"k": 1})
    assert item.prompt is messages  # made as given: no copy on the way
    assert LLMWorkItem("c", FAKE, ({"role": "user", "content": "hi"},)).prompt_text == "hi"


# --- token usage --------------------------------------------------------------------------------


@pytest.mark.parametrize(("usage", "names"), [
    ({"prompt_tokens": 3}, ["'prompt_tokens'", "input_tokens"]),
    ({"input_tokens": -1}, ["'input_tokens'", "-1"]),
    ({"output_tokens": 1.5}, ["'output_tokens'", "1.5"]),
    ({"total_tokens": "9"}, ["'total_tokens'", "'9'"]),
    ({"reasoning_tokens": True}, ["'reasoning_tokens'", "True"]),
])
def test_provider_error_refuses_bad_token_usage(usage: dict[str, Any], names: list[str]) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        ProviderError("x", category=ErrorCategory.PARSE, token_usage=usage)
    for name in names:
        assert name in str(info.value), str(info.value)


def test_provider_error_keeps_good_token_usage() -> None:
    usage = {"input_tokens": 3, "output_tokens": 0, "total_tokens": 3, "cached_input_tokens": 1,
             "reasoning_tokens": 0}
    assert ProviderError("x", category=ErrorCategory.PARSE, token_usage=usage).token_usage == usage


def _answering(usage: Any, calls: list[str]) -> CallableStrategy[str]:
    async def fn(prompt: str) -> CallOutcome[str] | tuple[str, Any, Any]:
        calls.append(prompt)
        if prompt == "bad":
            return CallOutcome("x", token_usage=usage)
        return CallOutcome(prompt, token_usage={"input_tokens": 2, "output_tokens": 1, "total_tokens": 3})

    return CallableStrategy(fn)


@pytest.mark.anyio
@pytest.mark.parametrize(("usage", "names"), [
    ({"prompt_tokens": 3, "completion_tokens": 1}, ["'prompt_tokens'"]),
    ({"input_tokens": -4}, ["'input_tokens'", "-4"]),
    ({"input_tokens": 2.0}, ["'input_tokens'", "2.0"]),
    (5, ["5", "mapping"]),
    ([("input_tokens", 1)], ["mapping"]),
], ids=["unknown-key", "negative", "float", "not-a-mapping", "pairs"])
async def test_bad_usage_from_a_strategy_fails_that_item_only(usage: Any, names: list[str]) -> None:
    calls: list[str] = []
    batch = await process_prompts(_answering(usage, calls), [("a", "good"), ("b", "bad"), ("c", "good")],
                                  config=CONFIG)
    by_id = batch.by_id()
    assert by_id["a"].success and by_id["c"].success
    bad = by_id["b"]
    assert not bad.success and bad.attempts == 1 and calls.count("bad") == 1  # a bug: not retried
    assert bad.error_category == "logic_error"
    assert bad.error is not None and "token usage" in bad.error
    for name in names:
        assert name in bad.error, bad.error
    assert batch.total_tokens()["total_tokens"] == 6  # the two good items; the refused report adds nothing


@pytest.mark.anyio
async def test_good_usage_is_summed_as_before() -> None:
    usage = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5, "cached_input_tokens": 1,
             "reasoning_tokens": 1}
    batch = await process_prompts(_answering(usage, []), [("b", "bad")], config=CONFIG)
    (result,) = batch.results
    assert result.success and result.token_usage == usage


class _ForeignError(Exception):
    """Another library's exception that happens to carry a ``token_usage`` of its own kind."""

    def __init__(self, usage: Any) -> None:
        super().__init__("foreign")
        self.token_usage = usage


@pytest.mark.anyio
@pytest.mark.parametrize("usage", [5, {"total_tokens": "abc"}, {"input_tokens": -3}, ["x"]],
                         ids=["int", "text-count", "negative", "list"])
async def test_a_foreign_exceptions_token_usage_is_not_ours_to_crash_on(usage: Any) -> None:
    async def fn(prompt: str) -> str:
        raise _ForeignError(usage)

    one = ProcessorConfig(retry=RetryConfig(max_attempts=1))
    batch = await process_prompts(CallableStrategy(fn), ["p"], config=one)
    (result,) = batch.results
    assert not result.success and isinstance(result.exception, _ForeignError)
    assert result.token_usage == {}  # not a report we can read: unknown, not a crash, not negative


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_providers_odd_counts_are_unknown_not_our_strategys_bug(api: str) -> None:
    # A negative or boolean count in a provider's answer must not reach the engine's check of the
    # strategy's report (that would file the provider's glitch as a LOGIC_ERROR in our own strategy).
    from trio_batch_llm._strategies.openai._wire import parse_response_body
    from trio_batch_llm._values._usage import token_usage_problem

    if api == "chat":
        payload: dict[str, Any] = {
            "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": -1, "completion_tokens": 2, "total_tokens": True,
                      "prompt_tokens_details": {"cached_tokens": -5},
                      "completion_tokens_details": {"reasoning_tokens": False}},
        }
    else:
        payload = {
            "status": "completed",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}],
            "usage": {"input_tokens": -1, "output_tokens": 2, "total_tokens": True,
                      "input_tokens_details": {"cached_tokens": -5},
                      "output_tokens_details": {"reasoning_tokens": False}},
        }
    _, usage, _ = parse_response_body(api, payload)  # type: ignore[arg-type]
    assert usage == {"output_tokens": 2}
    assert token_usage_problem(usage) is None


@pytest.mark.parametrize("tokens", [(-1, 5), (1.5, 2), (True, 1), (1,), "ab"])
def test_fake_strategy_refuses_token_counts_it_would_report(tokens: Any) -> None:
    # It reports them as each answer's usage: refused here, not as a LOGIC_ERROR on every item.
    with pytest.raises((TypeError, ValueError), match="tokens="):
        FakeStrategy(tokens=tokens)


def test_the_known_keys_are_token_usages_keys() -> None:
    from trio_batch_llm import TokenUsage
    from trio_batch_llm._values._usage import TOKEN_USAGE_KEYS

    assert frozenset(TokenUsage.__optional_keys__) == TOKEN_USAGE_KEYS


# --- a strategy that is not one, at every entry point -----------------------------------------


class _Wordy:
    """Not a strategy, with a repr as long as a whole prompt file's worth of text."""

    def __repr__(self) -> str:
        return "Wordy(" + "x" * 10_000 + ")"


@pytest.mark.anyio
async def test_every_entry_point_refuses_a_non_strategy_with_a_short_message(tmp_path: Any) -> None:
    from trio_batch_llm import LLMCallPool, open_run

    surfaces = {
        "process_prompts": lambda: process_prompts(_Wordy(), ["a"]),  # type: ignore[arg-type]
        "LLMCallPool": lambda: _pool(LLMCallPool),
        "open_run": lambda: open_run(tmp_path / "runs.sqlite", "r", _Wordy(), ["a"]),  # type: ignore[arg-type]
    }
    for name, start in surfaces.items():
        with pytest.raises(TypeError, match="must be an LLMCallStrategy") as caught:
            await start()
        assert len(str(caught.value)) < 200, (name, len(str(caught.value)))
    assert not (tmp_path / "runs.sqlite").exists()


async def _pool(pool_type: Any) -> None:
    pool_type(_Wordy())
