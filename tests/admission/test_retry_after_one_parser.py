"""Issue 31 point 14: one Retry-After reader, the same answer on every path that reads one.

The paths: rate-limit headers a strategy reports (the quota scope's observation), an exception
the engine classifies (its response's headers, or its own ``retry_after`` text), the OpenAI SDK
strategy's ``classify_error`` and the lean HTTP strategy's error answers (``error_from_status``).
Each is fed the same header value with the wall clock pinned, and must give the same seconds.
"""

from __future__ import annotations

import email.utils
import time

import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_batch_llm._admission._headers import parse_rate_limit_headers
from trio_batch_llm._engine._classify import classify
from trio_batch_llm._strategies.openai._sdk import OpenAIStrategy
from trio_batch_llm._strategies.openai._wire_errors import error_from_status

NOW = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT


def _date(offset: float) -> str:
    return email.utils.formatdate(NOW + offset, usegmt=True)


# (header value, seconds) -- None: not a Retry-After at all.
TABLE: list[tuple[str, float | None]] = [
    ("120", 120.0),
    (" 3 ", 3.0),
    ("0", 0.0),
    ("1.5", 1.5),  # not HTTP, but providers send it
    ("99999999999", 99999999999.0),  # huge: honest; the engine's own caps bound the wait
    ("-5", None),
    ("+5", None),  # delta-seconds is digits only
    ("1e3", None),  # float() would take these; HTTP does not
    ("1_000", None),
    ("nan", None),
    ("inf", None),
    ("1" + "0" * 400, None),
    ("", None),
    ("soon", None),
    ("12 apples", None),
    (_date(90), 90.0),  # IMF-fixdate, GMT
    (_date(90).replace("GMT", "+0000"), 90.0),
    (_date(90).replace("GMT", "-0000"), 90.0),  # "-0000": UTC, no claim about local time
    (_date(90).replace("GMT", "UTC"), 90.0),
    ("Tuesday, 14-Nov-23 22:14:50 GMT", 90.0),  # obsolete RFC 850 form
    ("Tue Nov 14 22:14:50 2023", 90.0),  # obsolete asctime form (always GMT)
    (_date(-90), 0.0),  # in the past: no wait, never negative
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ("Wed, 99 Foo 2015 07:28:00 GMT", None),
    ("Fri, 31 Dec 99999 23:59:59 GMT", None),
]


@pytest.fixture
def wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path reads the wall clock for an HTTP date; pin it (the SDK paths take no ``now``)."""
    monkeypatch.setattr(time, "time", lambda: NOW)


class _Response:
    def __init__(self, headers: dict[str, str]) -> None:
        self.status_code = 429
        self.headers = headers
        self.text = ""


class _StatusError(Exception):
    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("429")
        self.response = _Response(headers)


def _sdk_error(headers: dict[str, str]) -> openai.RateLimitError:
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    response = httpx2.Response(429, headers=headers, request=request)
    return openai.RateLimitError("rate limited", response=response, body=None)


SDK = OpenAIStrategy("m", api_key="sk-test-0000", base_url="http://127.0.0.1:9/v1")


def _paths(headers: dict[str, str]) -> dict[str, float | None]:
    observation = parse_rate_limit_headers(headers, 0.0)
    verdict = SDK.classify_error(_sdk_error(headers))
    assert verdict is not None
    return {
        "observation": None if observation is None else observation.retry_after,
        "classify(headers)": classify(_StatusError(headers)).retry_after,
        "openai sdk": verdict[1],
        "error_from_status": error_from_status(429, headers, None).retry_after,
    }


@pytest.mark.usefixtures("wall_clock")
@pytest.mark.parametrize(("value", "expected"), TABLE)
def test_every_path_reads_retry_after_alike(value: str, expected: float | None) -> None:
    got = _paths({"retry-after": value})
    exc = _StatusError({})
    exc.retry_after = value  # type: ignore[attr-defined]  # an exception's own Retry-After text
    got["classify(attribute)"] = classify(exc).retry_after
    assert got == dict.fromkeys(got, expected)


@pytest.mark.usefixtures("wall_clock")
@pytest.mark.parametrize(("headers", "expected"), [
    ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # milliseconds win
    ({"Retry-After-Ms": "1500", "Retry-After": "9"}, 1.5),  # any case
    ({"retry-after-ms": "-1", "retry-after": "9"}, 9.0),  # unreadable: Retry-After instead
    ({"retry-after-ms": "1e3", "retry-after": "9"}, 9.0),
    ({"retry-after-ms": "junk"}, None),
    ({"RETRY-AFTER": "7"}, 7.0),
])
def test_every_path_reads_retry_after_ms_alike(headers: dict[str, str], expected: float | None) -> None:
    got = _paths(headers)
    assert got == dict.fromkeys(got, expected)


@given(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
       | st.builds(lambda n: _date(n), st.integers(-10**7, 10**7)))
def test_one_answer_for_any_text(value: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: NOW)
        got = _paths({"retry-after": value})
    first = next(iter(got.values()))
    assert got == dict.fromkeys(got, first)
    assert first is None or first >= 0
