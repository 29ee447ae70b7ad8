"""CleanupLedger: the ordered, resumable close of one owner (CONTRACT C2–C4, C7.3–C7.4).

Over 400 lines because it is one cohesive state machine (phases, steps, attempts, deliveries,
force) whose transitions only make sense read together; splitting it would scatter one invariant.
Its records (steps, reports, statistics) are what the machine reads and writes, and its only
neighbour, ``_deliveries``, already holds the one part that stands alone: the delivery count.

An owner (host, processor, pool) registers named steps in four dependency
phases and closes them with :meth:`CleanupLedger.aclose`:

- Phases run in order, steps within a phase one at a time, in registration
  order (C2.1). A later phase is *discovered* (its providers are called) only
  when every earlier step has finished, so a strategy prepared while the
  runtime phase was draining is still closed (C2.4). Nothing starts while an
  earlier step runs (C2.3).
- Each step runs in a private child task of a task group the close owns,
  under its own cancel scope; the closer waits for it at its own shielded
  checkpoint, never in the task group's exit, so the caller's cancellation is
  never linked to the step (C3.4). Deliveries are counted by ``_deliveries``.
- An ordinary failure is logged with its traceback and does not stop the
  other steps (C2.2); the first one is raised after every step was attempted,
  unless the caller is already propagating an exception or a cancellation,
  which is never replaced (C7.3, C7.4).
- Completed steps are checkpointed; failed, interrupted and abandoned ones
  are retried by the next explicit close, never twice in one call (C4.1–C4.2).
  Concurrent closes share the attempt in flight (C4.4). The lifecycle is
  ``open`` → ``closing`` → ``closed``; a failed or aborted close stays
  ``closing`` (C4.7). No exception outlives the call that reported it (C4.6).

What an owner does::

    ledger = CleanupLedger("ExecutorHost")
    ledger.add_step("runtime", "workers", stop_workers, slow_warning_after=WORKER_CANCELLATION_TIMEOUT)
    ledger.add_phase_provider("strategies", lambda: [(lease.name, lease.release) for lease in leases])

    async def __aexit__(self, exc_type, exc, tb):      # automatic exit (C4.3)
        with unwrap_group():
            await ledger.aclose(body_exception=exc, automatic=True)

    async def aclose(self):                            # explicit close: retries
        with unwrap_group():
            await ledger.aclose()

    def force_close(self):                             # second delivery (C3.3)
        ledger.force_close()

Pass ``body_exception`` wherever an exception is being handled: on asyncio a
native cancellation that reached a bare ``finally:`` is otherwise invisible
(its effective deadline is not ``-inf``), so it could not count as the first
delivery.
"""

from __future__ import annotations

import contextvars
import enum
import logging
import math
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Final, Literal, final

import anyio
import anyio.abc
import anyio.lowlevel

from .._backends import (
    LoopHandle,
    capture_loop_handle,
    propagate_past_scopes,
    protected_from_keyboard_interrupt,
)
from .._values._errors import AdmissionClosedError, CleanupInterruptedError
from ._deliveries import CatchDeliveries, CloseCall, is_cancellation, unwrap_group, wait_counting

__all__ = [
    "CLEANUP_SLOW_WARNING_SECONDS",
    "PHASES",
    "PROGRESS_TASK_CANCELLATION_TIMEOUT",
    "WORKER_CANCELLATION_TIMEOUT",
    "AttemptReport",
    "CleanupLedger",
    "CleanupStep",
    "LedgerState",
    "LedgerStatistics",
    "Phase",
    "PhaseProvider",
    "StepFunction",
    "StepProblem",
    "unwrap_group",
]

logger = logging.getLogger("trio_batch_llm.cleanup")

WORKER_CANCELLATION_TIMEOUT: Final = 2.0
"""Seconds after which a still-running worker cancellation step logs one warning (C2.7). Not a deadline."""
PROGRESS_TASK_CANCELLATION_TIMEOUT: Final = 2.0
"""Seconds after which a still-running progress-task cancellation step logs one warning (C2.7)."""
CLEANUP_SLOW_WARNING_SECONDS: Final = 10.0
"""Default seconds after which any still-running cleanup step logs one warning; the wait goes on."""

Phase = Literal["runtime", "admission", "strategies", "store"]
PHASES: Final[tuple[Phase, ...]] = ("runtime", "admission", "strategies", "store")
"""Dependency order of a close (C2.1): (a) runtime tasks and callbacks, (b) admission
resources, (c) prepared strategies (their leases), (d) the artifact store."""


class LedgerState(enum.StrEnum):
    """One-way lifecycle of an owner (C4.7): ``open`` → ``closing`` → ``closed``."""

    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


@final
@dataclass(frozen=True, slots=True)
class CleanupStep:
    """One named cleanup step, as a phase provider returns it.

    ``slow_warning_after`` is diagnostic only (C2.7): one warning when the step
    runs longer, and the close keeps waiting.

    ``nowait`` is the step's synchronous twin (the ``_nowait`` habit): it does
    what needs no waiting and returns whether the step is complete. The closer
    calls it first, in its own task; only when it returns ``False`` does ``run``
    get a private task and scope. It never awaits, so no cancellation reaches
    it and no force or slow warning can find it running; on Trio it runs in the
    KI-protected close. What it raises is settled like a step's exception (a
    ``KeyboardInterrupt`` is a delivery, as one raised in a step).
    """

    name: str
    run: Callable[[], Awaitable[None]]
    slow_warning_after: float = CLEANUP_SLOW_WARNING_SECONDS
    nowait: Callable[[], bool] | None = None


@final
@dataclass(frozen=True, slots=True)
class StepProblem:
    """A step that did not complete in an attempt, described without keeping the exception (C4.6).

    ``kind`` is ``"failed"`` (it raised an ordinary exception) or
    ``"interrupted"`` (a cancellation ended it: CleanupInterruptedError).
    """

    phase: Phase
    name: str
    kind: Literal["failed", "interrupted"]
    error: str


AttemptOutcome = Literal["completed", "failed", "aborted"]


@final
@dataclass(frozen=True, slots=True)
class AttemptReport:
    """What one close attempt did; safe to keep (holds no exception or traceback).

    ``completed`` lists the steps this attempt completed; ``problems`` the ones
    that failed or were interrupted (a later explicit close retries them). An
    ``aborted`` attempt names the step it ``abandoned`` (its private scope was
    cancelled and it exited) and the ``skipped`` steps and ``phases_not_reached``
    that stayed open.
    """

    outcome: AttemptOutcome
    completed: tuple[str, ...]
    problems: tuple[StepProblem, ...]
    abandoned: str | None = None
    skipped: tuple[str, ...] = ()
    phases_not_reached: tuple[Phase, ...] = ()
    abort_reason: str | None = None

    @property
    def problem_phases(self) -> frozenset[Phase]:
        """The phases of the failed or interrupted steps (C7.5: were they all strategies?)."""
        return frozenset(problem.phase for problem in self.problems)


@final
@dataclass(frozen=True, slots=True)
class LedgerStatistics:
    """A snapshot of a ledger, for tests and diagnostics.

    ``failures`` counts the problems of the current (or else the last) attempt;
    ``deliveries`` every cancellation delivery counted by this ledger's close
    calls, forces included.
    """

    state: LedgerState
    completed: tuple[str, ...]
    pending: tuple[str, ...]
    running: str | None
    failures: int
    deliveries: int
    attempts: int
    closing_in_flight: bool


StepFunction = Callable[[], Awaitable[None]]
PhaseProvider = Callable[[], Iterable[CleanupStep | tuple[str, StepFunction]]]
"""Returns the steps of one phase, as ``CleanupStep`` or ``(name, run)``; asked again by each attempt."""

# Set inside a step's private task, so a step that closes its own ledger fails
# loudly instead of waiting for itself forever.
_INSIDE_STEP_OF: contextvars.ContextVar[CleanupLedger | None] = contextvars.ContextVar(
    "trio_batch_llm_inside_cleanup_step", default=None
)


class _StepState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    ABANDONED = "abandoned"


@dataclass(eq=False, slots=True)
class _Step:
    phase: Phase
    spec: CleanupStep
    state: _StepState = _StepState.PENDING


@dataclass(eq=False, slots=True)
class _StepRun:
    """One run of one step: its private scope, its end, and how it ended.

    Used as a context manager around the step in its private task, it hands
    whatever the step raised over to the closer instead of letting it escape
    (which would cancel the closer's task group). Handed over, not swallowed:
    ``_settle()`` reports a cancellation as a step interruption and the close
    re-raises ``KeyboardInterrupt`` and ``SystemExit``. Around a step's
    ``nowait`` twin (run by the closer itself) it has no scope and no event.
    """

    step: _Step
    scope: anyio.CancelScope | None = None
    done: anyio.Event | None = None
    error: BaseException | None = None
    abandoned: bool = False

    def __enter__(self) -> _StepRun:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        self.error = exc
        if self.done is not None:
            self.done.set()
        return True


@dataclass(eq=False, slots=True)
class _Attempt:
    """One run through the steps, shared by every close call that arrives meanwhile (C4.4)."""

    closer: CloseCall
    finished: anyio.Event
    force: Callable[[str], object] = field(default=lambda reason: False)
    running: _StepRun | None = None
    reached: int = -1
    steps_done: bool = False
    aborted: bool = False
    abort_reason: str | None = None
    abandoned: str | None = None
    fatal: BaseException | None = None
    report: AttemptReport | None = None

    completed: list[str] = field(default_factory=list)
    attempted: set[str] = field(default_factory=set)
    problems: list[tuple[StepProblem, BaseException]] = field(default_factory=list)


def _is_fatal(error: BaseException) -> bool:
    """KeyboardInterrupt, SystemExit and other non-Exception, non-cancellation errors abort the close."""
    error = unwrap_group(error)
    return not isinstance(error, Exception) and not is_cancellation(error)


def _describe(error: BaseException) -> str:
    return f"{type(error).__qualname__}: {error}"


@final
class CleanupLedger:
    """The ordered close of one owner; see the module docstring for the contract."""

    def __init__(self, owner: str = "owner") -> None:
        self._owner = owner
        self._steps: dict[Phase, list[_Step]] = {phase: [] for phase in PHASES}
        self._names: set[str] = set()
        self._providers: dict[Phase, list[PhaseProvider]] = {phase: [] for phase in PHASES}
        self._state = LedgerState.OPEN
        self._reached = -1  # the furthest phase any attempt has reached
        self._in_flight: _Attempt | None = None
        self._last_report: AttemptReport | None = None
        self._last_failures = 0
        self._attempts = 0
        self._deliveries = 0
        self._loop: LoopHandle | None = None

    # -- registration -------------------------------------------------------

    def add_step(
        self,
        phase: Phase,
        name: str,
        run: StepFunction,
        *,
        slow_warning_after: float = CLEANUP_SLOW_WARNING_SECONDS,
        nowait: Callable[[], bool] | None = None,
    ) -> None:
        """Register ``run`` as the step ``name`` of ``phase``, after the phase's other steps.

        ``nowait``: the step's synchronous twin (see :class:`CleanupStep`).
        Raises ``AdmissionClosedError`` once ``phase`` is closing (C4.7), and
        ``ValueError`` for an unknown phase, a name already used or a
        ``slow_warning_after`` that is not a positive number.
        """
        self._check_open_phase(phase)
        self._register(phase, CleanupStep(name, run, slow_warning_after, nowait))

    def add_phase_provider(self, phase: Phase, provider: PhaseProvider) -> None:
        """Discover ``phase``'s steps lazily: ``provider()`` is called by each attempt on reaching it.

        Steps whose names are already known are ignored, so a provider may
        return everything it owns every time.
        """
        self._check_open_phase(phase)
        self._providers[phase].append(provider)

    def _check_open_phase(self, phase: Phase) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase={phase!r}: must be one of {', '.join(PHASES)}")
        if self.phase_closing(phase):
            raise AdmissionClosedError(f"{self._owner} is closing its {phase} phase; nothing new is accepted")

    def _register(self, phase: Phase, spec: CleanupStep) -> None:
        if spec.name in self._names:
            raise ValueError(f"name={spec.name!r}: a cleanup step of {self._owner} already has this name")
        bound = spec.slow_warning_after
        if isinstance(bound, bool) or not isinstance(bound, int | float) or math.isnan(bound) or bound <= 0:
            raise ValueError(f"slow_warning_after={bound!r}: must be a number > 0")
        self._names.add(spec.name)
        self._steps[phase].append(_Step(phase, spec))

    # -- observation ----------------------------------------------------------

    @property
    def state(self) -> LedgerState:
        return self._state

    def phase_closing(self, phase: Phase) -> bool:
        """Whether a close has reached ``phase``: from then on it admits nothing new (C4.7)."""
        return PHASES.index(phase) <= self._reached

    @property
    def finished(self) -> bool:
        """Whether every step has completed (the state is ``closed``)."""
        return self._state is LedgerState.CLOSED

    def only_failed_in(self, phase: Phase) -> bool:
        """Whether the last attempt failed, and only in ``phase`` (C7.5: ``"strategies"``).

        ``False`` after an abort: an abandoned close is never only a strategy problem.
        """
        report = self._last_report
        return report is not None and report.outcome == "failed" and report.problem_phases == {phase}

    @property
    def last_attempt_report(self) -> AttemptReport | None:
        """The report of the last finished attempt (no exceptions kept), for an automatic exit (C4.3)."""
        return self._last_report

    def statistics(self) -> LedgerStatistics:
        attempt = self._in_flight
        running = attempt.running if attempt is not None else None
        steps = [step for phase in PHASES for step in self._steps[phase]]
        return LedgerStatistics(
            state=self._state,
            completed=tuple(s.spec.name for s in steps if s.state is _StepState.COMPLETED),
            pending=tuple(
                s.spec.name for s in steps if s.state not in (_StepState.COMPLETED, _StepState.RUNNING)
            ),
            running=running.step.spec.name if running is not None else None,
            failures=len(attempt.problems) if attempt is not None else self._last_failures,
            deliveries=self._deliveries,
            attempts=self._attempts,
            closing_in_flight=attempt is not None,
        )

    # -- closing --------------------------------------------------------------

    @protected_from_keyboard_interrupt  # a Ctrl+C reaches the close at its wait, not mid-statement
    async def aclose(
        self, *, body_exception: BaseException | None = None, automatic: bool = False
    ) -> AttemptReport:
        """Run (or join) one close attempt and report it.

        ``body_exception`` is the exception the caller is already propagating
        (an owner's ``__aexit__`` passes its ``exc_val``): the call then returns
        normally so that exception goes on, unchanged, unless a
        ``KeyboardInterrupt`` or ``SystemExit`` (or a native cancellation
        caught meanwhile) must win. ``automatic=True`` is for automatic exits
        (C4.3): if an attempt has already finished, nothing is retried and its
        report is returned; otherwise it runs (or joins) an attempt as usual.

        Raises, in this order of precedence: a ``KeyboardInterrupt`` that
        reached this call's wait, or a ``KeyboardInterrupt``/``SystemExit`` a
        step raised (this call ran the attempt); the caller's cancellation
        (deferred until teardown finished, or at once on a forced abort);
        ``CleanupInterruptedError`` for an abort; the first failure (an
        interrupted step as ``CleanupInterruptedError``).
        """
        if _INSIDE_STEP_OF.get() is self:
            raise RuntimeError(f"{self._owner}: aclose() was called from one of its own cleanup steps")
        call = CloseCall(body_exception, self._count_delivery)
        call.note_entry()  # before the first checkpoint: a cancelled caller is the first delivery
        attempt = self._in_flight
        if attempt is None:
            report = self._last_report
            if report is not None and (self._state is LedgerState.CLOSED or automatic):
                if call.body_exception is not None:
                    # The caller is propagating an exception: a cancellation raised at our
                    # checkpoint would replace it (C7.3), so this one schedule point is shielded.
                    await anyio.lowlevel.cancel_shielded_checkpoint()
                else:
                    await anyio.lowlevel.checkpoint()
                return report
            attempt = self._begin(call)
            await self._run(attempt, call)
        else:
            # Join the attempt in flight (C4.4) instead of starting another: two closers running
            # steps side by side would break the order. This call counts its own deliveries, and
            # a second one forces the shared attempt, as it would its own.
            await wait_counting(attempt.finished, call, attempt.force)
            call.note_exit()
        verdict = self._verdict(call, attempt)
        if verdict is _REPEAT_CALLER_CANCELLATION:
            try:
                # Level-triggered: the first checkpoint outside our shields raises it again.
                await anyio.lowlevel.checkpoint()
            except BaseException:
                del attempt, call  # no failure outlives the call (C4.6)
                raise
            verdict = self._failure(attempt)
        report = attempt.report
        assert report is not None
        del attempt
        native = verdict is not None and verdict is call.native
        call.release()
        if verdict is not None:
            assert isinstance(verdict, BaseException)
            try:
                raise verdict
            finally:
                if native:
                    propagate_past_scopes(verdict)
                del verdict
        return report

    def force_close(self) -> bool:
        """A second delivery from anywhere in the loop's thread: abort the close in flight (C3.3).

        The running step's private scope is cancelled; the close waits for it
        to exit, starts nothing else, logs one warning and stays ``closing``.
        Returns whether a close was in flight to abort (otherwise nothing happens).
        """
        attempt = self._in_flight
        if attempt is None or attempt.steps_done:
            return False
        self._count_delivery()
        return self._force(attempt, "force_close()")

    def force_close_from_thread(self) -> bool:
        """:meth:`force_close`, asked for from any thread; never blocks.

        Returns whether the request was handed to the event loop of a close in
        flight; the abort itself happens there, soon after.
        """
        loop = self._loop
        if self._in_flight is None or loop is None:
            return False
        return loop.run_sync_soon(self.force_close)

    def _count_delivery(self) -> None:
        self._deliveries += 1

    def _begin(self, call: CloseCall) -> _Attempt:
        attempt = _Attempt(closer=call, finished=anyio.Event())
        attempt.force = partial(self._force, attempt)
        self._in_flight = attempt
        self._state = LedgerState.CLOSING
        self._attempts += 1
        self._loop = capture_loop_handle()
        return attempt

    async def _run(self, attempt: _Attempt, call: CloseCall) -> None:  # noqa: ASYNC910  (both paths checkpoint)
        steps = self._walk(attempt)
        try:
            # The steps' task group is not shielded: each step shields itself
            # (see _run_step), so the closer's own wait can see the caller's
            # cancellation when it happens (C3.1). A delivery can also land on
            # the group's exit checkpoint, after every step finished (on
            # asyncio a native Task.cancel(), or anyio repeating the caller's
            # cancellation while it waits for a finished step's task to be
            # reaped): still the closer's own checkpoint, so it is counted.
            with CatchDeliveries(call, attempt.force, shielded=False):
                step = self._next_to_await(steps, attempt)
                if step is None:
                    # Nothing to wait for: every step completed by its nowait twin, or
                    # there was none. No task group; the one schedule point its exit
                    # would have been, shielded as that is.
                    await anyio.lowlevel.cancel_shielded_checkpoint()
                else:
                    async with anyio.create_task_group() as group:
                        while step is not None:
                            await self._run_step(group, step, attempt, call)
                            # An abort lands while a step is awaited (or as a nowait twin's
                            # outcome is settled), so checking after each step is enough:
                            # nothing later is discovered or started.
                            step = None if attempt.aborted else self._next_to_await(steps, attempt)
            if not attempt.steps_done:
                # Only a KeyboardInterrupt raised by the closer's own code
                # (a phase provider's, say) gets here: the phase loop was
                # broken off, so nothing further starts. An abort, whatever
                # the count says.
                self._force(attempt, "KeyboardInterrupt raised in the close itself")
            call.note_exit()
        finally:
            steps.close()
            self._finish(attempt)

    def _walk(self, attempt: _Attempt) -> Generator[_Step, None, None]:
        """The steps this attempt runs, in order; each phase is discovered when it is reached (C2.4)."""
        # A generator, so a phase is reached only when the closer asks for its first step, that
        # is, after every step of the earlier phases has finished: a strategy prepared while the
        # runtime phase drained is among the leases the strategies phase discovers.
        for index, phase in enumerate(PHASES):
            attempt.reached = index
            # Marked closing before its providers are asked: from this instant add_step() refuses
            # the phase (C4.7), so nothing can be registered after the discovery and missed.
            self._reached = max(self._reached, index)
            self._discover(phase, attempt)
            registered = self._steps[phase]
            if registered:
                for step in tuple(registered):
                    if step.state is not _StepState.COMPLETED:
                        yield step
        attempt.steps_done = True

    def _next_to_await(self, steps: Iterator[_Step], attempt: _Attempt) -> _Step | None:
        """Settle the next steps by their nowait twins; return the first one that needs its task.

        ``None`` once every step was attempted, or the attempt aborted.
        """
        for step in steps:
            nowait = step.spec.nowait
            if nowait is None:
                return step
            attempt.attempted.add(step.spec.name)
            run = _StepRun(step)
            complete = False
            with run:
                complete = nowait()
            if run.error is None and not complete:
                return step  # the rest of it in a task: run() does what nowait() could not
            self._settle(run, attempt)
            if attempt.aborted:
                return None
        return None

    def _discover(self, phase: Phase, attempt: _Attempt) -> None:
        for provider in self._providers[phase]:
            try:
                for found in list(provider()):
                    spec = found if isinstance(found, CleanupStep) else CleanupStep(*found)
                    if spec.name not in self._names:
                        self._register(phase, spec)
            except Exception as exc:
                name = f"{phase} phase discovery"
                logger.exception("%s: %s failed", self._owner, name)
                attempt.problems.append((StepProblem(phase, name, "failed", _describe(exc)), exc))

    async def _run_step(
        self, group: anyio.abc.TaskGroup, step: _Step, attempt: _Attempt, call: CloseCall
    ) -> None:
        # The step's private scope is shielded: the caller's cancellation never reaches the
        # step (C3.4), and a force, which cancels this very scope, does (a shielded scope
        # still cancels what runs inside it when it is cancelled itself). One scope, not a
        # shield around a private scope: each costs a few microseconds per step.
        done = anyio.Event()
        run = _StepRun(step, anyio.CancelScope(shield=True), done)
        step.state = _StepState.RUNNING
        attempt.attempted.add(step.spec.name)
        attempt.running = run
        group.start_soon(self._step_task, run, name=f"cleanup step {step.spec.name!r} of {self._owner}")
        await wait_counting(
            done, call, attempt.force, slow_after=step.spec.slow_warning_after,
            on_slow=partial(self._warn_slow, step),
        )
        attempt.running = None
        self._settle(run, attempt)

    async def _step_task(self, run: _StepRun) -> None:  # noqa: ASYNC910  (a child task; the closer checkpoints)
        _INSIDE_STEP_OF.set(self)
        # `run` hands whatever the step raised over to the closer; its scope
        # (shielded, see _run_step) is entered before the step's first checkpoint.
        assert run.scope is not None
        with run, run.scope:
            await run.step.spec.run()

    def _warn_slow(self, step: _Step) -> None:
        logger.warning(
            "%s: cleanup step %r (%s phase) still running after %s s; still waiting for it",
            self._owner, step.spec.name, step.phase, step.spec.slow_warning_after,
        )

    def _settle(self, run: _StepRun, attempt: _Attempt) -> None:
        step, error = run.step, run.error
        run.error = None
        name = step.spec.name
        if error is not None and isinstance(unwrap_group(error), KeyboardInterrupt) and not run.abandoned:
            self._settle_interrupt(step, unwrap_group(error), attempt)
            return
        if error is not None and _is_fatal(error):
            step.state = _StepState.INTERRUPTED
            if attempt.fatal is None:
                attempt.fatal = unwrap_group(error)
            self._force(attempt, f"step {name!r} raised {type(unwrap_group(error)).__name__}")
            attempt.abandoned = attempt.abandoned or name
            return
        if run.abandoned:
            step.state = _StepState.ABANDONED
            if error is not None and not is_cancellation(error):
                # Part of the abort, which logs its one warning in _finish().
                logger.debug("%s: abandoned step %r raised while exiting", self._owner, name, exc_info=error)
            return
        if error is None:
            step.state = _StepState.COMPLETED
            attempt.completed.append(name)
            return
        if is_cancellation(error):
            step.state = _StepState.INTERRUPTED
            reported: BaseException = CleanupInterruptedError(
                f"{self._owner}: cleanup step {name!r} ({step.phase} phase) was interrupted by a "
                "cancellation; a later close retries it"
            )
            reported.__cause__ = error
            kind: Literal["failed", "interrupted"] = "interrupted"
            logger.warning("%s: cleanup step %r was interrupted", self._owner, name, exc_info=error)
        else:
            step.state = _StepState.FAILED
            reported, kind = error, "failed"
            logger.error(
                "%s: cleanup step %r (%s phase) failed", self._owner, name, step.phase, exc_info=error
            )
        attempt.problems.append((StepProblem(step.phase, name, kind, _describe(error)), reported))

    def _settle_interrupt(self, step: _Step, interrupt: BaseException, attempt: _Attempt) -> None:
        """A ``KeyboardInterrupt`` raised inside a step: a delivery to the close like one at its wait.

        A Ctrl+C that lands while a step's own code runs (a ``cleanup()`` that
        blocks without awaiting) is raised there, not at the closer's wait.
        It is counted by the call running the attempt: the first delivery
        lets teardown go on (the step is interrupted and retried by a later
        close) and is re-raised afterwards; a second forces (C3.2, C3.3).
        """
        name = step.spec.name
        step.state = _StepState.INTERRUPTED
        reported = CleanupInterruptedError(
            f"{self._owner}: cleanup step {name!r} ({step.phase} phase) was interrupted by "
            "KeyboardInterrupt; a later close retries it"
        )
        reported.__cause__ = interrupt
        problem = StepProblem(step.phase, name, "interrupted", _describe(interrupt))
        attempt.problems.append((problem, reported))
        if attempt.closer.count_interrupt(interrupt):
            self._force(attempt, f"KeyboardInterrupt raised in step {name!r}")
            attempt.abandoned = attempt.abandoned or name
        else:
            logger.warning(
                "%s: cleanup step %r was interrupted by KeyboardInterrupt; the close goes on and "
                "re-raises it afterwards (a second one forces the close)",
                self._owner, name,
            )

    def _force(self, attempt: _Attempt, reason: str) -> bool:
        # The force path (a second delivery, force_close(), a fatal error in a step). It cancels
        # only the running step's private scope and never the closer's wait: the closer still
        # waits for the abandoned step to *exit*, so no step task outlives the close, and the
        # steps loop, seeing `aborted`, starts nothing after it.
        if attempt.aborted:
            return True
        if attempt.steps_done:
            # Every step ran; only the task group's exit is left. Nothing is abandoned by then,
            # so the attempt keeps its true outcome instead of reporting an abort.
            return False
        attempt.aborted = True
        attempt.abort_reason = reason
        run = attempt.running
        # A step that already ended (its event set, not yet settled) keeps its outcome: there is
        # nothing left in it to abandon.
        if run is not None and run.done is not None and run.scope is not None and not run.done.is_set():
            run.abandoned = True
            attempt.abandoned = run.step.spec.name
            run.scope.cancel(reason=f"close of {self._owner} forced: {reason}")
        return True

    def _finish(self, attempt: _Attempt) -> None:
        self._in_flight = None
        skipped: tuple[str, ...] = ()
        not_reached: tuple[Phase, ...] = ()
        if attempt.aborted:
            skipped = tuple(
                s.spec.name
                for phase in PHASES
                for s in self._steps[phase]
                if s.state is not _StepState.COMPLETED and s.spec.name not in attempt.attempted
            )
            not_reached = PHASES[attempt.reached + 1 :]
        outcome: AttemptOutcome = (
            "aborted" if attempt.aborted else "failed" if attempt.problems else "completed"
        )
        # Closed only when every registered step has completed, checked over the steps rather
        # than this attempt's list: the state speaks of the owner's resources (C4.7).
        if outcome == "completed" and all(
            s.state is _StepState.COMPLETED for phase in PHASES for s in self._steps[phase]
        ):
            self._state = LedgerState.CLOSED
        attempt.report = self._last_report = AttemptReport(
            outcome=outcome,
            completed=tuple(attempt.completed),
            problems=tuple(problem for problem, _ in attempt.problems),
            abandoned=attempt.abandoned,
            skipped=skipped,
            phases_not_reached=not_reached,
            abort_reason=attempt.abort_reason,
        )
        self._last_failures = len(attempt.problems)
        if attempt.aborted:
            logger.warning(
                "%s: close aborted by %s: abandoned step %s; skipped steps: %s; phases not reached: %s. "
                "Dependent resources stay open; %s stays closing and a later close resumes.",
                self._owner, attempt.abort_reason,
                repr(attempt.abandoned) if attempt.abandoned else "(none running)",
                ", ".join(repr(name) for name in skipped) or "none",
                ", ".join(not_reached) or "none",
                self._owner,
            )
        attempt.finished.set()

    # -- verdict --------------------------------------------------------------

    def _verdict(self, call: CloseCall, attempt: _Attempt) -> BaseException | _Marker | None:
        """What this call raises, by precedence (C3.2, C3.3, C7.3, C7.4)."""
        if call.interrupt is not None:
            return call.interrupt
        if attempt.fatal is not None and attempt.closer is call:
            return attempt.fatal
        if call.native is not None:
            # Edge-triggered: asyncio delivers it once, so it is re-raised
            # whatever the caller was already propagating (even its own
            # cancellation: a scope of the caller may swallow that one, and
            # the native cancellation must get past it).
            return call.native
        if call.body_exception is not None:
            return None  # the caller's exception goes on
        if call.caller_cancelled:
            return _REPEAT_CALLER_CANCELLATION
        return self._failure(attempt)

    def _failure(self, attempt: _Attempt) -> BaseException | None:
        if attempt.aborted:
            return CleanupInterruptedError(
                f"{self._owner}: close aborted by {attempt.abort_reason}; "
                f"abandoned step {attempt.abandoned!r}; a later close resumes the unfinished steps"
            )
        if attempt.problems:
            return attempt.problems[0][1]
        return None


class _Marker(enum.Enum):
    REPEAT_CALLER_CANCELLATION = "repeat caller cancellation"


_REPEAT_CALLER_CANCELLATION: Final = _Marker.REPEAT_CALLER_CANCELLATION
