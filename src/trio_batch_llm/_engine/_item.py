"""One item's path: admit → attempt → parse → decide, one function per stage, over a :class:`Binding`.

Shared by the processor's workers and the pool's callers. Over 400 lines because it is the
path's driver and its stages, which share one runner's state on the hot path; what each stage
decides or builds is elsewhere: a strategy as the path uses it (:mod:`._binding`), the item's
record and its results (:mod:`._item_run`), the cache's lookup (:mod:`._cached`), the breaker
(:mod:`._breaker_item`), the account of an answer (:mod:`._account`), the retry rule
(:mod:`._retry`), the throttle budget (:mod:`._throttled`). Nothing on the hot path calls back
into the host. An :class:`ItemRun` survives its guard firing (:mod:`._guards`), so the caller
can go on with it::

    result = await runner.drive(run, guard)     # in the guard's scope
    ...the scope caught a deadline or a stop; in the guard's next scope:
    result = await runner.resume(run, guard)    # cut(): a result, STOPPED, or drive() again

Every owner (a processor's workers, a pool's callers) goes on through :meth:`ItemRunner.resume`,
so an attempt that timed out is retried by the same rules whatever surface ran it.

In :meth:`ItemRunner.drive`, per attempt:

- :meth:`~ItemRunner.admit`: a slot, an RPM unit, a TPM reservation and the end of any
  cooldown; no call starts at or after a start limit (the item or batch deadline, the
  processor's ``call_start_deadline``);
- :meth:`~ItemRunner.attempt`: one call under the attempt deadline, awaited in ``drive``;
  a failure is classified in :meth:`~ItemRunner.attempt_failed` (the one ``except
  Exception`` boundary); :func:`~._account.release_attempt` gives the admission back;
- :meth:`~ItemRunner.parse`: the raw output becomes the item's output;
- :meth:`~ItemRunner.decide`: a failed attempt becomes the item's result, or the wait
  before the next attempt (separate budgets for rate limits and other failures; no retry
  that cannot start before a deadline). :meth:`~ItemRunner.back_off` runs the hooks,
  ``on_error()`` and that wait.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar

import anyio
import anyio.lowlevel

from .._observe._log import log_retry
from .._values._categories import ErrorCategory
from .._values._errors import AttemptTimedOut
from .._values._requests import LLMWorkItem
from .._values._results import RetryState, WorkItemResult
from .._values._stop_reasons import StopReason
from ._account import as_triple, release_attempt
from ._binding import Binding, resolve_binding
from ._breaker_gate import Breakers, OnRetire, tell_gate
from ._breaker_item import pass_gate, retired_result
from ._cached import ItemCache
from ._classifier_objects import ClassifierArg, user_classifier
from ._item_run import Failure, ItemRun, Usage, start_deadline
from ._retry import retry_or_result
from ._throttled import admit_within_budget, spent

if TYPE_CHECKING:
    from .._admission import Admission
    from .._host._executor import ExecutorHost
    from .._observe._hooks import Hooks
    from .._strategies._base import LLMCallStrategy
    from .._values._config import ProcessorConfig
    from .._values._quota_reports import QuotaScopeStatistics
    from ._guards import Guard

__all__ = ["RETRY", "STOPPED", "AttemptTimedOut", "ItemRunner", "start_deadline"]

TOutput = TypeVar("TOutput")

_ITEM_DEADLINE: Final = "total_timeout_per_item"
"""What an item's deadline is called in its error: the setting that set it."""

RETRY: Final = "retry"
""":meth:`ItemRunner.cut`: the attempt's own deadline fired; drive the run again."""
STOPPED: Final = None
""":meth:`ItemRunner.cut` and :meth:`ItemRunner.drive`: the batch's stop cut the item short."""

Cut = WorkItemResult[TOutput] | Literal["retry"] | None


class ItemRunner(Generic[TOutput]):
    """Runs items with one owner's host, config, classifier and hooks; keeps its Bindings."""

    __slots__ = (
        "_attempt_timeout",
        "_bindings",
        "_breakers",
        "_classifier",
        "_clock",
        "_config",
        "_hooks",
        "_host",
        "_item_timeout",
        "_last",
        "_price_attempt",
        "_retry",
        "cache",
        "halted",
        "start_by",
    )

    def __init__(
        self,
        host: ExecutorHost,
        config: ProcessorConfig,
        *,
        classifier: ClassifierArg | None = None,
        hooks: Hooks | None = None,
        start_by: float = math.inf, on_retire: OnRetire | None = None,
    ) -> None:
        self._breakers = Breakers(config.circuit_breaker, on_retire, anyio.current_time)  # one per scope
        self._hooks = hooks if hooks is not None and hooks.active else None
        self._host = host
        self._config = config
        self._retry = config.retry
        self._classifier = user_classifier(classifier)
        self._attempt_timeout = config.attempt_timeout
        self._item_timeout = config.guardrails.total_timeout_per_item
        guard = config.guardrails
        self._price_attempt = guard.item_cost if guard.cost_function is not None else None
        """What prices each attempt's usage (AttemptTiming.cost) instead of the built-in table."""
        self._clock = anyio.current_time
        self._bindings: dict[int, Binding] = {}
        self._last: Binding | None = None
        self.start_by = start_by
        """No call starts at or after this time (``call_start_deadline``)."""
        self.cache: ItemCache | None = None
        """The owner's response cache, set while it is open (``None``: none; the hot path tests only that)."""
        self.halted = False
        """The owner's batch stopped (:meth:`halt`): no call of any of its items starts again."""

    def halt(self) -> None:
        """A stop: no call starts from now on, not even a retry; calls in flight go on. The items
        parked for their next call (``ItemRun.waiting``) are for the owner to cut short; each ends
        :data:`STOPPED` (:meth:`cut`), as does any that reaches its next admission."""
        self.halted = True

    @property
    def has_deadlines(self) -> bool:
        """Whether an attempt, an item or a call start has a deadline (a watcher is needed)."""
        return self._attempt_timeout is not None or self._item_timeout is not None or self.start_by < math.inf

    def begin(
        self,
        item: LLMWorkItem[TOutput],
        *,
        stop_deadline: float = math.inf,
        timeout: float | None = None,
        timeout_name: str = _ITEM_DEADLINE,
    ) -> ItemRun[TOutput]:
        """A run of ``item`` starting now; ``timeout`` overrides ``total_timeout_per_item``
        and ``timeout_name`` then names it in the result's error."""
        if timeout is None:
            timeout, timeout_name = self._item_timeout, _ITEM_DEADLINE
        return ItemRun(
            item, self._clock(), limit=timeout, limit_name=timeout_name, stop_deadline=stop_deadline,
            start_by=self.start_by,
        )

    def scope_statistics(self) -> list[QuotaScopeStatistics]:
        """The statistics of the quota scope of every strategy bound so far, each once (for progress)."""
        scopes = {id(binding.quota): binding.quota for binding in self._bindings.values()}
        return [scope.statistics() for scope in scopes.values()]

    async def bind(self, strategy: LLMCallStrategy[Any]) -> Binding:
        """Resolve the Binding of ``strategy`` (prepare it on the host) and keep it for this owner.

        :meth:`drive` calls it for a strategy it has not seen, in the item's admission
        time; after that nothing is looked up per item.
        """
        binding = await resolve_binding(strategy, self._host, self._config, self._classifier, self._breakers)
        self._bindings[id(strategy)] = binding
        return binding

    async def drive(self, run: ItemRun[TOutput], guard: Guard) -> WorkItemResult[TOutput] | None:
        """Run the stages until ``run`` has its result; ``None`` when the batch's stop cut it short.

        Call it inside ``guard.scope``. A deadline or a stop propagates as the guard
        scope's cancellation; the caller then asks :meth:`cut` what it means.
        """
        guard.arm(run, run.start_limit)
        try:
            if guard.stopped is not None:
                return STOPPED  # noqa: ASYNC910 - the worker's next receive checkpoints
            if (failure := run.take_failure()) is not None:  # driven again after its attempt timed out
                if (result := await self.back_off(run, failure)) is not None:
                    return result
            elif run.backoff_owed > 0:  # a late deadline broke its backoff off (cut): wait out the rest
                await self.wait_out_backoff(run)
            cache = self.cache
            # Before admission, and before the strategy is prepared: a hit takes no slot, no RPM/TPM
            # unit, no breaker turn, no call (a re-run answered whole by the cache opens no client).
            if (cache is not None and run.attempts == 0 and run.cache_key is None
                    and (hit := await cache.look_up(run, self._clock)) is not None):
                return hit  # noqa: ASYNC910 - a hit awaited the cache's lookup
            strategy = run.item.strategy
            binding = self._last
            if binding is None or binding.strategy is not strategy:
                binding = self._bindings.get(id(strategy))
                if binding is None or binding.strategy is not strategy:
                    binding = await self.bind(strategy)
                self._last = binding
            tokens = run.bind(binding)
            while True:
                held = await self.admit(binding, run, tokens)
                if held is None:  # past a start limit (between calls), max_rate_limit_wait, a retired scope
                    retired = retired_result(run, self._breakers.stopped)
                    return retired or self.cut(run, guard)  # type: ignore[return-value]
                # Stage 2's call is awaited here, not in attempt(): a cancellation unwinds one frame
                # fewer per call in flight (a frame object and a traceback: ~2 µs a worker, asyncio).
                timeout = self.attempt(run, held, guard)
                state = run.retries.state if run.retries is not None else None
                try:
                    execute_text = binding.execute_text
                    if execute_text is not None:
                        returned = await execute_text(run.item.request.text, run.attempts, timeout, state)
                    else:
                        returned = await binding.strategy.execute_request(run.item.request, run.attempts,
                                                                          timeout, state)
                    output, usage, meta = as_triple(returned)
                except Exception as exc:  # noqa: BLE001 - the one classification boundary
                    outcome = self.attempt_failed(binding, run, held, guard, exc)
                else:
                    self.attempt_returned(run, held, usage, meta)
                    try:
                        parsed = self.parse(binding, output, meta)
                    except Exception as exc:  # noqa: BLE001 - a parse failure is a failed attempt
                        run.parse_failed(self._clock())
                        guard.set_deadline(run.start_limit)
                        outcome = Failure(exc, binding.classify(exc), parse_stage=True)
                    else:
                        result = run.succeeded(parsed, meta, self._clock())
                        if run.claim is not None:  # a cache miss's validated answer: kept for the next asker
                            await self.keep_answer(run, parsed, usage, meta)
                        return result
                if (result := await self.back_off(run, outcome)) is not None:
                    return result
        finally:
            guard.disarm()
            if run.held is not None or run.gated is not None:
                held = run.held
                gated = run.released()
                if held is not None:
                    held.release(None, answered=False)  # cut short: usage unknown, the reservation stands
                if gated is not None and run.binding is not None:  # let go by the breaker, cut short
                    tell_gate(run.binding.breaker, gated, cut=True)  # (or its admission refused)

    async def keep_answer(self, run: ItemRun[TOutput], output: TOutput, usage: Usage,
                          meta: object) -> None:
        """A miss ended in a validated success: settle its claim with the answer the cache keeps."""
        claim = run.take_claim()
        cache = self.cache
        assert claim is not None and cache is not None
        await cache.settle(claim, cache.answer(run.item.strategy, output, usage or {}, meta))

    async def let_go(self, run: ItemRun[TOutput]) -> None:
        """``run`` ended other than in a success (a failure, a stop, a cancellation): its claim, if it
        holds one, is settled with nothing written. Its owner calls it, shielded within a bound."""
        claim = run.take_claim()
        if claim is not None and self.cache is not None:
            await self.cache.settle(claim, None)
        else:
            await anyio.lowlevel.checkpoint()

    async def admit(self, binding: Binding, run: ItemRun[TOutput], tokens: int) -> Admission | None:
        """Stage 1: the quota scope's admission, or ``None`` at or past the run's start limit."""
        clock = self._clock
        if ((run.start_limit != math.inf and clock() >= run.start_limit) or self._breakers.stopped is not None
                or self.halted):
            await anyio.lowlevel.checkpoint()
            return None
        gate = binding.breaker
        if gate is not None:  # the circuit breaker lets the attempt go at once, or it waits for its turn
            run.gate_passed(gate.try_enter())  # (no coroutine on the hot path)
            if run.gated is None:
                run.park()
                try:
                    passed = await pass_gate(gate, run)
                finally:
                    run.unpark()
                if not passed or self.halted:
                    return None  # noqa: ASYNC910 - pass_gate() awaited: retired, past the start limit, a stop
        scope = binding.quota
        try:
            return scope.try_admit_nowait(tokens)  # noqa: ASYNC910 - hot path; execute() checkpoints
        except anyio.WouldBlock:
            pass
        # Booked by phase, so a wait cut short (by the item deadline, a stop) is counted too.
        cooling = scope.statistics().cooldown_remaining > 0
        run.switch("cooldown" if cooling else "admission_wait", clock())
        run.park()  # a stop cuts this wait short (the owner cancels its guard)
        try:
            if (admission := await admit_within_budget(scope, run, tokens, self._retry)) is None:
                return None
            try:
                # Granted while this worker was being cancelled: the provider never sees the call,
                # so its RPM unit must come back now, not a window after a call that never was.
                await anyio.lowlevel.checkpoint_if_cancelled()
            except BaseException:
                admission.release_unused()
                raise
        finally:
            run.unpark()
        # The guard fires at the start limit too; the clock said it first. A batch-stopping error
        # or a stop while it waited: the call must not go.
        if clock() >= run.start_limit or self._breakers.stopped is not None or self.halted:
            admission.release_unused()
            return None
        return admission

    def attempt(self, run: ItemRun[TOutput], held: Admission, guard: Guard) -> float | None:
        """Stage 2, before its call: count the attempt, start its clock and deadline; its timeout.

        :meth:`drive` awaits the call, then :meth:`attempt_returned` or :meth:`attempt_failed`."""
        started = self._clock()
        run.start_call(held, started)
        timeout = self._attempt_timeout
        if timeout is not None and started + timeout < run.outer:
            guard.set_deadline(started + timeout)
        else:
            guard.set_deadline(run.outer)
        return timeout

    def attempt_returned(self, run: ItemRun[TOutput], held: Admission, usage: Usage,
                         meta: object) -> None:
        """Stage 2, the call answered: its usage is the item's, its admission goes back."""
        gated = run.call_answered(usage, meta, self._price_attempt)
        release_attempt(run, held, gated, usage, meta=meta, exc=None, verdict=None)

    def attempt_failed(
        self, binding: Binding, run: ItemRun[TOutput], held: Admission, guard: Guard, exc: Exception
    ) -> Failure:
        """Stage 2, the call raised (or answered nothing :func:`as_triple` can read): classify it."""
        failed_usage = getattr(exc, "token_usage", None)
        run.call_failed(failed_usage, self._price_attempt, self._clock())
        guard.set_deadline(run.start_limit)
        verdict = binding.classify(exc)
        wait = release_attempt(run, held, run.released(), failed_usage, meta=None, exc=exc, verdict=verdict)
        return Failure(exc, verdict, wait)

    def parse(self, binding: Binding, raw: object, meta: object) -> TOutput:
        """Stage 3: the call's raw output -> the item's output (``strategy.parse_output``).

        A parse failure (any ``Exception``; ``ProviderError(category=PARSE)`` says so, as
        :class:`StructuredOutputError` does) is a failed attempt whose tokens were spent,
        retried at once, without backoff: asking again is the remedy, and the provider is not
        overloaded. A strategy that does not override ``parse_output`` costs nothing here."""
        if binding.parses:
            parsed: TOutput = binding.strategy.parse_output(raw, meta if isinstance(meta, dict) else {})
            return parsed
        return raw  # type: ignore[return-value]  # no parse stage: the raw output is the item's

    def decide(self, run: ItemRun[TOutput], failure: Failure) -> WorkItemResult[TOutput] | float:
        """Stage 4: a failed attempt -> the item's result, or the seconds to wait before the next one
        (:mod:`._retry`); a failure that stops the batch (a per-day quota, a spend limit) ends it here."""
        exc, verdict = failure.exc, failure.verdict
        category = verdict.category
        retries = run.note_error(exc)
        if verdict.stops_batch is not None:  # final whatever its category, and the owner's batch ends
            error = f"{type(exc).__name__}: {exc}"
            self._breakers.stop_batch(run.binding.quota if run.binding is not None else None,
                                      f"provider stopped the batch: {verdict.stops_batch} (item "
                                      f"{run.item.item_id!r}: {error})", error, run.item.item_id)
            result = run.failed_with(exc, category, self._clock())
            # Its own category says what the provider answered; the stop reason says the item itself
            # did nothing wrong (tomorrow's quota may serve it): a durable run keeps it pending.
            result.stop_reason = StopReason.PROVIDER_RETIRED
            return result
        return retry_or_result(run, retries, failure, self._retry, start_by=self.start_by, clock=self._clock)

    async def back_off(self, run: ItemRun[TOutput], failure: Failure) -> WorkItemResult[TOutput] | None:
        """After a failed attempt: its hooks, :meth:`decide`, ``on_error()``, the wait; ``None`` to go on."""
        exc, category = failure.exc, failure.verdict.category
        if self._hooks is not None:
            await self._hooks.on_attempt_error(run.item, exc, run.attempts, category)
        decision = self.decide(run, failure)
        if not isinstance(decision, float):
            return decision  # noqa: ASYNC910 - the failed attempt's execute() was a checkpoint
        if self.halted:  # stopped: no retry, so no on_error() and no backoff; admit() says STOPPED
            return None  # noqa: ASYNC910 - as above
        run.owe_backoff(decision)  # owed from now: see wait_out_backoff()
        retries = run.retries
        assert retries is not None
        state = retries.state
        if state is None:
            state = retries.state = RetryState()
        state.attempt = run.attempts
        state.last_error = exc
        state.last_category = category
        await run.item.strategy.on_error(exc, run.attempts, state)
        log_retry(run.item.item_id, run.attempts, category, decision, exc)
        if decision > 0:
            await self.wait_out_backoff(run)
        return None

    async def wait_out_backoff(self, run: ItemRun[TOutput]) -> None:
        """Sleep the backoff ``run`` owes; what a cancellation leaves of it stays owed, so a late
        attempt deadline (:meth:`cut`) costs the item no part of it: driven again, it waits out the rest."""
        until = self._clock() + run.backoff_owed
        if self.halted:  # no retry follows: admit() says STOPPED
            await anyio.lowlevel.checkpoint()
            return
        run.park()  # a stop cuts this wait short (the owner cancels its guard)
        try:
            await anyio.sleep_until(until)
        finally:
            run.unpark()
            run.owe_backoff(max(0.0, until - self._clock()))

    async def resume(self, run: ItemRun[TOutput], guard: Guard) -> WorkItemResult[TOutput] | None:
        """After ``run``'s guard fired mid-item, in its renewed scope: :meth:`cut`, or :meth:`drive` again."""
        verdict = self.cut(run, guard)
        if verdict == RETRY:
            return await self.drive(run, guard)
        return verdict  # noqa: ASYNC910 - the cancelled scope checkpointed

    def cut(self, run: ItemRun[TOutput], guard: Guard) -> Cut[TOutput]:
        """What cut ``run`` short, read off the clock in the precedence nested scopes had.

        Its scope giving up its wait (``max_rate_limit_wait``), the stop (:data:`STOPPED`), the item deadline,
        the call-start deadline (only between calls), then the attempt's own deadline
        (:data:`RETRY`: the timeout is a failed attempt; drive the run again).
        """
        now = self._clock()
        if run.throttle_spent or guard.stopped is not None or self.halted or now >= guard.stop_deadline:
            return spent(run, self._retry, now) if run.throttle_spent else STOPPED  # spent: its scope gave up
        if now >= run.item_deadline:
            return run.deadline_exceeded(f"{run.limit_name} of {run.limit} s", now)
        if not run.calling:
            if now >= self.start_by:
                return run.refused_start(now)
            # No call was in flight: the attempt's deadline came in the instant its call ended
            # and reached the item after it (asyncio delivers a cancel at the next await). That
            # attempt's answer or failure is counted already; inventing a timeout for it would
            # spend a retry twice. Drive on (what is left of a backoff is waited out).
            return RETRY
        exc = AttemptTimedOut(f"attempt {run.attempts} timed out after {self._attempt_timeout} s")
        assert run.binding is not None
        run.timed_out(Failure(exc, run.binding.classify(exc)), now)
        return RETRY

    def stopped(self, run: ItemRun[TOutput], category: ErrorCategory, reason: str) -> WorkItemResult[TOutput]:
        """The result of an item the batch's stop cut short."""
        return run.stopped(category, reason, self._clock())
