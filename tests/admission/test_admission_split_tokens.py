"""Input and output tokens as separate budgets (issue 33, point 3).

Anthropic reports ``anthropic-ratelimit-input-tokens-*`` and ``-output-tokens-*`` beside
``-tokens-*``. The scope holds a call's input charge (its estimate less its output allowance)
against the input budget and its output allowance against the output budget, each within what
the provider said remains; cache reads (what answers say of ``cached_input_tokens``) are not
charged to the input budget. Checked on the pure quota core: exact cases, and a hypothesis property
that admission never exceeds either reported remaining before its reset.
"""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from trio_batch_llm import RateLimitConfig
from trio_batch_llm._admission import parse_rate_limit_headers
from trio_batch_llm._admission._core import QuotaCore
from trio_batch_llm._values._token_estimates import RequestTokens, TokenCharge, TokenEstimate, output_part
from trio_batch_llm._values._usage import UsedTokens, used_tokens

NO_RAMP = RateLimitConfig(slow_start_seconds=0.0)
RESET = 60.0
WALL = 1_755_000_000.0  # the wall clock at the scope's 0 s


def _observed(input_remaining: int, output_remaining: int, *, input_limit: int = 400_000,
              output_limit: int = 80_000) -> QuotaCore:
    """A scope that has heard one answer (at 0 s) report the two budgets, both reset at 60 s.

    One call stays in flight throughout: with none in flight, the pacing lets one probe go at the
    time the budget would have refilled by one call (its documented rule), beyond what was reported."""
    core = QuotaCore(concurrency=10_000, rate_limit=NO_RAMP)
    reset = datetime.fromtimestamp(WALL + RESET, UTC).isoformat()
    headers = {"anthropic-ratelimit-input-tokens-limit": str(input_limit),
               "anthropic-ratelimit-input-tokens-remaining": str(input_remaining),
               "anthropic-ratelimit-input-tokens-reset": reset,
               "anthropic-ratelimit-output-tokens-limit": str(output_limit),
               "anthropic-ratelimit-output-tokens-remaining": str(output_remaining),
               "anthropic-ratelimit-output-tokens-reset": reset}
    observation = parse_rate_limit_headers(headers, 0.0, wall_time=WALL)
    held = core.try_admit_nowait(0, 0.0)  # a call stays in flight: its answer will move the ceilings,
    core.release(core.try_admit_nowait(0, 0.0), 0, 0.0, observation)  # so no probe goes past them
    assert core.paced and held is not None
    return core


def _admit_until(core: QuotaCore, charges: list[TokenCharge], steps: list[float]) -> list[TokenCharge]:
    """Admit ``charges`` in order whenever the core says they fit, at the times ``steps`` apart, before
    the reset; no call answers (each stays in flight). Returns those admitted."""
    admitted: list[TokenCharge] = []
    now, queue = 0.0, list(charges)
    for step in steps:
        now += step
        if now >= RESET:
            break
        while queue and core.ready_at(queue[0], now) <= now:
            core.try_admit_nowait(queue[0], now)
            admitted.append(queue.pop(0))
    return admitted


def test_the_headers_give_two_budgets_of_their_own() -> None:
    headers = {"anthropic-ratelimit-input-tokens-limit": "400000",
               "anthropic-ratelimit-input-tokens-remaining": "399000",
               "anthropic-ratelimit-output-tokens-limit": "80000",
               "anthropic-ratelimit-output-tokens-remaining": "1000"}
    observation = parse_rate_limit_headers(headers, 5.0)
    assert observation is not None
    assert (observation.input_tokens_limit, observation.input_tokens_remaining) == (400_000, 399_000)
    assert (observation.output_tokens_limit, observation.output_tokens_remaining) == (80_000, 1000)
    assert observation.tokens_remaining is None  # not folded into one token budget


def test_a_call_is_held_against_the_output_budget_with_its_output_allowance() -> None:
    """Plenty of input left, output nearly spent: calls with a large output allowance wait for the reset."""
    core = _observed(input_remaining=399_000, output_remaining=9_000)
    charges = [TokenCharge(100 + 4_000, 4_000) for _ in range(20)]
    admitted = _admit_until(core, charges, [0.5] * 200)
    # Two fit in 9,000 less the margin; the old single token budget (input's) took a call per pace step.
    assert sum(c.output for c in admitted) <= 9_000
    assert len(admitted) == 2
    assert core.ready_at(charges[0], 30.0) == RESET  # the next one waits for the reset


def test_a_call_is_held_against_the_input_budget_with_its_input_estimate() -> None:
    core = _observed(input_remaining=50_000, output_remaining=80_000)
    charges = [TokenCharge(10_000 + 100, 100) for _ in range(20)]
    admitted = _admit_until(core, charges, [0.5] * 200)
    assert sum(c - c.output for c in admitted) <= 50_000
    assert 1 <= len(admitted) <= 5


def test_a_charge_of_unknown_parts_is_held_whole_against_both() -> None:
    core = _observed(input_remaining=399_000, output_remaining=9_000)
    admitted = _admit_until(core, [4_100] * 5, [0.5] * 200)  # a plain int: its output part unknown
    assert len(admitted) == 2  # 8,200 of the 9,000 output tokens left


def test_request_tokens_say_their_output_part() -> None:
    estimate = RequestTokens(None)("x" * 400, {"max_output_tokens": 700})
    assert (int(estimate), output_part(estimate)) == (100 + 700, 700)
    by_user = RequestTokens(lambda text: TokenEstimate(input_tokens=50, output_tokens=30))("p")
    assert (int(by_user), output_part(by_user)) == (80, 30)
    plain = RequestTokens(lambda text: 50)("p")  # no bound given: the output part is not known
    assert (int(plain), output_part(plain)) == (50, None)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    input_remaining=st.integers(0, 200_000),
    output_remaining=st.integers(0, 40_000),
    calls=st.lists(st.tuples(st.integers(0, 30_000), st.integers(0, 8_000)), min_size=1, max_size=60),
    steps=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=80),
)
def test_admission_never_exceeds_either_reported_remaining(
    input_remaining: int, output_remaining: int, calls: list[tuple[int, int]], steps: list[float],
) -> None:
    core = _observed(input_remaining, output_remaining, input_limit=200_000, output_limit=40_000)
    charges = [TokenCharge(i + o, o) for i, o in calls]
    admitted = _admit_until(core, charges, steps)
    assert sum(c - c.output for c in admitted) <= input_remaining
    assert sum(c.output for c in admitted) <= output_remaining


def test_cache_reads_do_not_count_against_the_input_budget() -> None:
    """Answers that say 90 % of their input were cache reads: each call's input charge is its
    estimate's uncached share, so ten times the calls fit the same input budget."""
    def admitted_with(usage: int) -> int:
        core = _observed(input_remaining=50_000, output_remaining=80_000)
        answer = core.try_admit_nowait(TokenCharge(10_000 + 100, 100), 0.0)  # answered at once:
        core.release(answer, usage, 0.0)  # its usage is what the scope learns from
        charges = [TokenCharge(10_000 + 100, 100) for _ in range(60)]
        return len(_admit_until(core, charges, [0.5] * 200))

    plain = admitted_with(10_100)
    cached = admitted_with(UsedTokens(10_100, 10_000, 9_000))
    assert plain <= 5
    assert cached >= 8 * plain


def test_used_tokens_say_their_cache_reads() -> None:
    used = used_tokens({"input_tokens": 1000, "cached_input_tokens": 600, "output_tokens": 50})
    assert isinstance(used, UsedTokens) and (int(used), used.input, used.cached) == (1050, 1000, 600)
    assert not isinstance(used_tokens({"input_tokens": 10, "output_tokens": 5}), UsedTokens)
    assert used_tokens(None) is None
