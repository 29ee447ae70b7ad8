"""Retry hints from gateways (issue 32, point 2): LiteLLM's ``llm_provider-retry-after`` feeds the one reader.

LiteLLM's proxy passes an upstream provider's headers on with an ``llm_provider-``
prefix, and on the provider's own 429 sends its Retry-After only so. Every path
that reads a wait (the engine's classifier, the OpenAI dialects' error answers, the
quota scope's observation) goes through ``retry_after_from_headers``.
"""

from __future__ import annotations

import pytest

from trio_batch_llm import ErrorCategory
from trio_batch_llm._admission._headers import (
    RATE_LIMIT_METADATA_KEY,
    parse_rate_limit_headers,
    rate_limit_headers,
)
from trio_batch_llm._strategies.openai._wire_errors import error_from_status
from trio_batch_llm._values._retry_after import retry_after_from_headers


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
