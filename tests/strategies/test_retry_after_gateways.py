"""Retry hints from gateways (issue 32, point 2): LiteLLM's ``llm_provider-retry-after`` feeds the one reader.

LiteLLM's proxy passes an upstream provider's headers on with an ``llm_provider-``
prefix, and on the provider's own 429 sends its Retry-After only so. Every path
that reads a wait (the engine's classifier, the OpenAI dialects' error answers, the
quota scope's observation) goes through ``retry_after_from_headers``.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

import pytest

from trio_batch_llm import ErrorCategory, OpenAICompatibleStrategy, ProcessorConfig, process_prompts
from trio_batch_llm._admission._headers import (
    RATE_LIMIT_METADATA_KEY,
    parse_rate_limit_headers,
    rate_limit_headers,
)
from trio_batch_llm._strategies.openai._wire_errors import error_from_status
from trio_batch_llm._values._retry_after import retry_after_from_headers
from trio_batch_llm.mock import MockServerConfig, serve_mock

from ..admission.test_throttle import virtual_backends as _virtual_backends


@pytest.mark.parametrize(("headers", "expected"), [
    ({"llm_provider-retry-after": "7"}, 7.0),
    ({"LLM_Provider-Retry-After": "7"}, 7.0),
    ({"llm_provider-retry-after-ms": "1500"}, 1.5),
    ({"llm_provider-retry-after-ms": "1500", "llm_provider-retry-after": "9"}, 1.5),
    ({"llm_provider-retry-after-ms": "soon", "llm_provider-retry-after": "9"}, 9.0),
    ({"retry-after": "3", "llm_provider-retry-after": "9"}, 3.0),  # the gateway's own word first
    ({"retry-after-ms": "200", "llm_provider-retry-after-ms": "9000"}, 0.2),
    ({"retry-after": "later", "llm_provider-retry-after": "4"}, 4.0),  # unreadable: the next one decides
    ({"llm_provider-retry-after": "Thu, 01 Jan 1970 00:00:10 GMT"}, 5.0),  # an HTTP date, from now=5
    ({"x-llm_provider-retry-after": "4"}, None),
    ({"llm_provider-retry-after": "-1"}, None),
])
def test_the_gateway_prefixed_pair_is_read_after_the_plain_one(headers: dict[str, str],
                                                                expected: float | None) -> None:
    assert retry_after_from_headers(headers, now=5.0) == expected
    assert retry_after_from_headers({k.encode(): v.encode() for k, v in headers.items()}, now=5.0) == expected


def test_a_litellm_429_carries_its_wait_to_the_strategy_error_and_the_scope() -> None:
    headers = {"content-type": "application/json", "llm_provider-retry-after": "12",
               "x-litellm-call-id": "abc"}
    body = {"error": {"message": "Rate limit reached", "code": "429", "type": "None"}}
    error = error_from_status(429, headers, body)
    assert error.category is ErrorCategory.RATE_LIMIT
    assert error.retry_after == 12.0
    # The scope sees the same wait: the header is kept for the observation, and read there.
    assert error.metadata == {RATE_LIMIT_METADATA_KEY: {"llm_provider-retry-after": "12"}}
    assert rate_limit_headers(headers) == {"llm_provider-retry-after": "12"}
    observation = parse_rate_limit_headers(error.metadata[RATE_LIMIT_METADATA_KEY], 100.0)
    assert observation is not None and observation.retry_after == 12.0
    assert not observation.reports_budget


# --- end to end: every refused call waits what it was told, the scope's learning notwithstanding -----


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", _virtual_backends(threshold=0.01))
@pytest.mark.parametrize("hint", ["retry-after", "llm_provider-retry-after"])
async def test_every_refused_call_waits_its_hint_even_when_random_refusals_lift_the_cooldown(
        hint: str) -> None:
    """10 % random 429s with a 1 s hint (plain, or as LiteLLM sends it): the rule that finds refusals
    random lifts the cooldown the first lone 429s began, but no call comes back before its hint ran
    (the server's own records: a prompt's next arrival after its 429 was answered)."""
    config = MockServerConfig(rate_limit_rate=0.1, retry_after=1.0, latency=0.02, seed=7,
                              retry_after_headers=(hint,))
    async with serve_mock(config) as server:
        strategy = OpenAICompatibleStrategy("m", base_url=server.base_url, api_key="k", api_key_env=None)
        batch = await process_prompts(strategy, [f"gw {i:04d}" for i in range(200)],
                                      config=ProcessorConfig(concurrency=32))
        requests = list(server.requests)
    assert batch.succeeded == 200
    by_prompt: dict[str, list[Any]] = defaultdict(list)
    for request in requests:
        by_prompt[request.prompt].append(request)
    gaps = []
    for seen in by_prompt.values():
        seen.sort(key=lambda r: r.arrival)
        gaps += [after.arrival - before.answered for before, after in itertools.pairwise(seen)
                 if before.outcome == "error:429"]
    assert len(gaps) >= 10
    assert min(gaps) >= 1.0 - 1e-6, sorted(gaps)[:5]
