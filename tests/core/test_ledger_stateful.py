"""CONTRACT C2.3, C4.1, C4.2, C4.4, C4.7 as properties: hypothesis.stateful over close attempts.

Each rule is one close (run in a fresh event loop of the module's backend):
every step's outcome for this attempt is drawn (ok / raise / interrupt /
hang until forced), and so is the interference (none, caller cancelled at
entry, caller cancelled while the first step runs) and whether a second
close call joins the attempt. The steps themselves check the invariants as
they start: no completed step runs again, no step starts while another runs,
no earlier-phase step starts after a later phase began, no step runs twice in
one call. After each rule the model predicts the outcome of every call, the
completed set and the state, and the lifecycle must only move forward.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from trio_batch_llm._core._ledger import PHASES, CleanupLedger, CleanupStep, LedgerState, Phase
from trio_batch_llm._values._errors import CleanupInterruptedError

from .test_ledger import raise_foreign_cancellation

pytestmark = pytest.mark.anyio

OUTCOMES = ["ok", "raise", "interrupt", "hang"]
ORDER = {LedgerState.OPEN: 0, LedgerState.CLOSING: 1, LedgerState.CLOSED: 2}


class LedgerMachine(RuleBasedStateMachine):
    backend: Any = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self.ledger = CleanupLedger("machine")
        self.layout: list[tuple[Phase, str, bool]] = []  # (phase, name, discovered lazily)
        self.completed: set[str] = set()
        self.states: list[LedgerState] = [self.ledger.state]
        self.violations: list[str] = []
        self.script: dict[str, str] = {}
        self._reset_attempt()

    def _reset_attempt(self) -> None:
        self.running: set[str] = set()
        self.started: list[str] = []
        self.finished_ok: list[str] = []
        self.first_started: anyio.Event | None = None
        self.second_entered: anyio.Event | None = None
        self.hang_started: anyio.Event | None = None
        self.cancel_first: anyio.CancelScope | None = None

    @initialize(
        layout=st.lists(st.tuples(st.sampled_from(PHASES), st.booleans()), min_size=1, max_size=6)
    )
    def build(self, layout: list[tuple[Phase, bool]]) -> None:
        lazy: dict[Phase, list[CleanupStep]] = {phase: [] for phase in PHASES}
        for index, (phase, is_lazy) in enumerate(layout):
            name = f"s{index}"
            self.layout.append((phase, name, is_lazy))
            if is_lazy:
                lazy[phase].append(CleanupStep(name, self._step(phase, name)))
            else:
                self.ledger.add_step(phase, name, self._step(phase, name))
        for phase, found in lazy.items():
            if found:
                self.ledger.add_phase_provider(phase, lambda found=found: found)

    def _order(self) -> list[str]:
        """The order a close visits steps: phase by phase, eager ones first (registered up front)."""
        ordered: list[str] = []
        for phase in PHASES:
            ordered += [n for p, n, lazy in self.layout if p == phase and not lazy]
            ordered += [n for p, n, lazy in self.layout if p == phase and lazy]
        return ordered

    def _step(self, phase: Phase, name: str) -> Any:
        async def run() -> None:
            if name in self.completed:
                self.violations.append(f"{name} ran again after completing (C4.1)")
            if self.running:
                self.violations.append(f"{name} started while {self.running} ran (C2.3)")
            if name in self.started:
                self.violations.append(f"{name} started twice in one call (C4.2)")
            if self.started:
                last_phase = next(p for p, n, _ in self.layout if n == self.started[-1])
                if PHASES.index(phase) < PHASES.index(last_phase):
                    self.violations.append(f"{name} ({phase}) started after a {last_phase} step (C2.1)")
            self.started.append(name)
            self.running.add(name)
            try:
                if self.first_started is not None and not self.first_started.is_set():
                    self.first_started.set()
                    if self.cancel_first is not None:
                        self.cancel_first.cancel()
                    if self.second_entered is not None:
                        await self.second_entered.wait()
                outcome = self.script[name]
                if outcome == "ok":
                    await anyio.lowlevel.checkpoint()
                elif outcome == "raise":
                    await anyio.lowlevel.checkpoint()
                    raise ValueError(name)
                elif outcome == "interrupt":
                    await raise_foreign_cancellation()
                else:
                    assert self.hang_started is not None
                    self.hang_started.set()
                    await anyio.sleep_forever()
            finally:
                self.running.discard(name)
            self.finished_ok.append(name)

        return run

    @rule(
        outcomes=st.lists(st.sampled_from(OUTCOMES), min_size=6, max_size=6),
        interference=st.sampled_from(["none", "cancel_at_entry", "cancel_during"]),
        concurrent=st.booleans(),
        automatic=st.booleans(),
    )
    def close(self, outcomes: list[str], interference: str, concurrent: bool, automatic: bool) -> None:
        self.script = {name: outcomes[i] for i, (_, name, _) in enumerate(self.layout)}
        skip = self.ledger.state is LedgerState.CLOSED or (
            automatic and self.ledger.last_attempt_report is not None
        )
        results: list[tuple[str, Any]] = []
        anyio.run(self._close_once, interference, concurrent, automatic, results, backend=self.backend)

        # -- predict -----------------------------------------------------------------------
        expected_starts: list[str] = []
        aborted = False
        first_failure: type[BaseException] | None = None
        if not skip:
            for name in self._order():
                if name in self.completed:
                    continue
                expected_starts.append(name)
                outcome = self.script[name]
                if outcome == "hang":
                    aborted = True
                    break
                if first_failure is None and outcome != "ok":
                    first_failure = ValueError if outcome == "raise" else CleanupInterruptedError
        assert self.started == expected_starts
        assert not self.violations, self.violations
        self.completed |= {n for n in expected_starts if self.script[n] == "ok"}

        def verdict(cancelled: bool) -> str:
            if cancelled:
                return "cancelled"
            if aborted:
                return "CleanupInterruptedError"
            return first_failure.__name__ if first_failure is not None else "returned"

        first_cancelled = interference == "cancel_at_entry" or (
            interference == "cancel_during" and bool(expected_starts)
        )
        expected = [verdict(first_cancelled)]
        if concurrent and expected_starts:
            expected.append(verdict(False))
        assert [kind for kind, _ in results] == expected
        self.states.append(self.ledger.state)
        self._reset_attempt()

    async def _close_once(
        self, interference: str, concurrent: bool, automatic: bool, results: list[tuple[str, Any]]
    ) -> None:
        self.first_started = anyio.Event()
        self.hang_started = anyio.Event()
        outcomes: dict[int, tuple[str, Any]] = {}

        async def call(index: int, scope: anyio.CancelScope, entered: anyio.Event | None) -> None:
            with scope:
                if entered is not None:
                    entered.set()  # aclose() joins synchronously, before its first checkpoint
                try:
                    report = await self.ledger.aclose(automatic=automatic and index == 0)
                except anyio.get_cancelled_exc_class():
                    outcomes[index] = ("cancelled", None)
                    raise
                except Exception as exc:
                    outcomes[index] = (type(exc).__name__, exc)
                    return
                outcomes[index] = ("returned", report)

        first_scope = anyio.CancelScope()
        if interference == "cancel_at_entry":
            first_scope.cancel()
        elif interference == "cancel_during":
            self.cancel_first = first_scope
        if concurrent:
            self.second_entered = anyio.Event()

        async def forcer() -> None:
            assert self.hang_started is not None
            await self.hang_started.wait()
            assert self.ledger.force_close()

        async def joiner(closers: anyio.abc.TaskGroup) -> None:
            assert self.first_started is not None
            await self.first_started.wait()  # the first call is in flight: the second joins its attempt
            closers.start_soon(call, 1, anyio.CancelScope(), self.second_entered)

        async with anyio.create_task_group() as helpers:
            async with anyio.create_task_group() as closers:
                closers.start_soon(call, 0, first_scope, None)
                helpers.start_soon(forcer)
                if concurrent:
                    helpers.start_soon(joiner, closers)
            helpers.cancel_scope.cancel()  # the close calls are done; so are the helpers
        results.extend(outcomes[i] for i in sorted(outcomes))

    @invariant()
    def lifecycle_is_one_way(self) -> None:
        ranks = [ORDER[state] for state in self.states]
        assert ranks == sorted(ranks)
        stats = self.ledger.statistics()
        assert set(stats.completed) == self.completed
        assert stats.closing_in_flight is False
        if self.ledger.state is LedgerState.CLOSED:
            assert len(self.completed) == len(self.layout)
        elif self.states[-1] is not LedgerState.OPEN:
            assert len(self.completed) < len(self.layout) or self.ledger.last_attempt_report is not None


def test_ledger_state_machine(anyio_backend: Any) -> None:
    LedgerMachine.backend = anyio_backend
    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
