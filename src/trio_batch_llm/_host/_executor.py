"""ExecutorHost: the owner of one task group, its quota scopes, strategy leases and cleanup ledger.

Processors and pools build on a host. Runtime tasks (workers, producers, the
progress task) run in the host's task group and nowhere else: each group of
them (one per processor) in a nested task group under one cancel scope, so a
close can stop them without cancelling the code in the host's ``async with``
body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, final

import anyio
import anyio.abc

from .._admission import QuotaRegistry, QuotaScope
from .._backends import leaves_the_loop
from .._core._deliveries import is_cancellation, unwrap_group
from .._core._leases import Lease, lease_registry
from .._core._ledger import CleanupLedger, CleanupStep, LedgerState, LedgerStatistics
from .._strategies._base import LLMCallStrategy
from .._values._config import ProcessorConfig
from .._values._errors import AdmissionClosedError

__all__ = ["ExecutorHost", "HostStatistics", "RuntimeTasks"]


@final
@dataclass(frozen=True, slots=True)
class HostStatistics:
    """A snapshot of a host, for tests and diagnostics (``ExecutorHost.statistics()``).

    ``state`` is ``unopened``, ``open``, ``closing`` or ``closed``; ``ledger``
    is the snapshot of the host's cleanup ledger.
    """

    state: str
    runtime_tasks: int
    prepared_strategies: int
    quota_scopes: int
    ledger: LedgerStatistics


class _Cohort:
    """Tasks started while one supervisor was live: one task group under one cancel scope."""

    __slots__ = ("group", "idle", "pending", "running", "scope")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.group: anyio.abc.TaskGroup | None = None
        self.pending: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...], str | None]] = []
        self.running = 0
        self.idle: anyio.Event | None = None


class RuntimeTasks:
    """A set of runtime tasks that can be stopped and awaited together.

    The tasks run in one nested task group under one cancel scope, hosted by a
    supervisor task in the host's task group: stopping N tasks is one
    ``CancelScope.cancel()``, not N (on asyncio each cancelled scope runs its
    own delivery loop), and no task carries a scope of its own. The supervisor
    lives only while it has tasks; a task started after ``cancel()`` (or after
    the supervisor left) gets a fresh supervisor, so it is not born cancelled.
    """

    __slots__ = ("_current", "_hand_over", "_idle", "_running", "_supervisors", "_tg")

    def __init__(self, tg: anyio.abc.TaskGroup, hand_over: Callable[[BaseException], None]) -> None:
        self._tg = tg
        self._hand_over = hand_over
        """Takes an interrupt a task caught that would leave the event loop (the host re-raises it)."""
        self._current: _Cohort | None = None
        self._running = 0
        self._supervisors = 0
        self._idle: anyio.Event | None = None

    @property
    def running(self) -> int:
        return self._running

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> None:
        cohort = self._current
        if cohort is None:
            cohort = self._current = _Cohort()
            self._supervisors += 1
            self._tg.start_soon(self._supervise, cohort, name="runtime tasks")
        self._running += 1
        cohort.running += 1
        if cohort.group is None:
            cohort.pending.append((fn, args, name))  # started by the supervisor once it runs
        else:
            cohort.group.start_soon(self._run, cohort, fn, args, name=name)

    async def _supervise(self, cohort: _Cohort) -> None:
        try:
            # Re-raise a lone failure of a task as itself, as if it had run in the host's group.
            with unwrap_group(), cohort.scope:
                async with anyio.create_task_group() as group:
                    cohort.group = group
                    pending, cohort.pending = cohort.pending, []
                    for fn, args, name in pending:
                        group.start_soon(self._run, cohort, fn, args, name=name)
                    try:
                        while cohort.running:
                            cohort.idle = anyio.Event()
                            await cohort.idle.wait()
                    finally:
                        # Synchronously with the last task's exit: later tasks get a new supervisor
                        # rather than a task group that is closing.
                        self._detach(cohort)
        finally:
            self._detach(cohort)
            self._supervisors -= 1
            self._wake_idle()

    async def _run(  # noqa: ASYNC910 - fn() ran on every path (a handed-over interrupt ends it)
        self, cohort: _Cohort, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
    ) -> None:
        try:
            await fn(*args)
        except (KeyboardInterrupt, SystemExit) as exc:
            self._tg.cancel_scope.cancel()  # as for any failure (below)
            if not leaves_the_loop(exc):
                raise
            # Ctrl+C or sys.exit() in a worker, a hook, a callback: on asyncio raising it here
            # would end the event loop, not this task. The host re-raises it, with its type,
            # after its ordered close, where Trio's nursery carries it.
            self._hand_over(exc)
        except BaseException as exc:
            if not is_cancellation(exc):  # (a Trio group of Cancelled too: no failure, issue 37)
                # What the host's task group does when a child of its own fails: cancel it now,
                # not once this task's siblings have unwound (the supervisor relays the error).
                self._tg.cancel_scope.cancel()
            raise
        finally:
            self._running -= 1
            cohort.running -= 1
            if cohort.running == 0 and cohort.idle is not None:
                cohort.idle.set()
            self._wake_idle()

    def _detach(self, cohort: _Cohort) -> None:
        if self._current is cohort:
            self._current = None

    def _wake_idle(self) -> None:
        if self._running == 0 and self._supervisors == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None

    def cancel(self, reason: str) -> None:
        cohort = self._current
        if cohort is not None:
            self._current = None  # tasks started from now on are not born cancelled
            cohort.scope.cancel(reason)
            # A supervisor that has not run yet still owns its pending tasks: they start
            # cancelled and unwind at once, as a task whose own scope was cancelled did.

    @property
    def idle(self) -> bool:
        """Whether every task and its supervisor have exited."""
        return not (self._running or self._supervisors)

    async def wait_idle(self) -> None:
        """Wait until every task and its supervisor have exited (not by parking in a task-group exit)."""
        if not (self._running or self._supervisors):
            await anyio.lowlevel.checkpoint()
            return
        while True:  # each wait is a checkpoint: none more after the last, which costs a round
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()
            if not (self._running or self._supervisors):
                return


@final
class ExecutorHost:
    """Owns a task group, quota scopes, strategy leases and an ordered cleanup ledger.

    Use as ``async with ExecutorHost(config) as host:``; processors and pools
    create their own host unless given one to share (``host=``), in which case
    they share its quota scopes and strategy leases.
    """

    def __init__(self, config: ProcessorConfig | None = None, *, name: str = "ExecutorHost") -> None:
        self.config = config if config is not None else ProcessorConfig()
        self.name = name
        # The ledger's one-way lifecycle (open, closing, closed), and None before __aenter__.
        self._state: LedgerState | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._runtime: RuntimeTasks | None = None
        self._interrupt: BaseException | None = None  # see RuntimeTasks._run; re-raised on leaving
        self._quotas = QuotaRegistry(
            backend=self.config.quota_backend,
            spawn=lambda serve: self.runtime.start_soon(serve, name="quota backend link"),
        )
        self._scope_cache: dict[int, tuple[LLMCallStrategy[Any], QuotaScope]] = {}
        self._ready: dict[int, LLMCallStrategy[Any]] = {}
        self._leases: dict[object, Lease] = {}
        self._preparing: dict[object, anyio.Event] = {}
        self.ledger = CleanupLedger(name)
        quotas_nowait = self._close_quotas_nowait
        self.ledger.add_step("admission", "quota scopes", self._close_quotas, nowait=quotas_nowait)
        self.ledger.add_phase_provider("strategies", self._lease_steps)

    # --- lifecycle -----------------------------------------------------

    async def __aenter__(self) -> ExecutorHost:
        if self._state is not None:
            raise RuntimeError(f"{self.name} is {self._state.value}; a host can be opened once")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._runtime = RuntimeTasks(tg, self._hold_interrupt)
        self._state = LedgerState.OPEN
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        with unwrap_group():  # a public boundary (CONTRACT C6.4), as the processor's and the pool's exits
            return await self.exit_with(exc_type, exc, tb)

    async def exit_with(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Close through the ledger (automatic-exit semantics), then leave the task group."""
        assert self._tg is not None, "exit_with before __aenter__"
        try:
            await self.ledger.aclose(body_exception=exc, automatic=True)
        except BaseException as close_error:
            if not self.ledger.finished:
                # A forced or interrupted close: runtime tasks may still run; take them down with us.
                self._tg.cancel_scope.cancel("host close was forced")
            await self._leave_task_group(close_error)
            raise
        return await self._leave_task_group(exc)

    async def _leave_task_group(self, exc: BaseException | None) -> bool | None:
        assert self._tg is not None
        try:
            suppress = await self._tg.__aexit__(
                type(exc) if exc is not None else None, exc, exc.__traceback__ if exc is not None else None
            )
        except BaseException:
            self._raise_interrupt()  # it takes precedence over what the group raised (CONTRACT C7.4)
            raise
        finally:
            self._state = LedgerState.CLOSED if self.ledger.finished else LedgerState.CLOSING
        self._raise_interrupt()
        return suppress

    def _hold_interrupt(self, interrupt: BaseException) -> None:
        if self._interrupt is None:
            self._interrupt = interrupt

    def _raise_interrupt(self) -> None:
        """Re-raise, after the close, a Ctrl+C or ``sys.exit()`` a runtime task handed over (asyncio)."""
        interrupt, self._interrupt = self._interrupt, None
        if interrupt is not None:
            context = interrupt.__context__  # its own, not what the group raised meanwhile
            try:
                raise interrupt
            finally:
                interrupt.__context__ = context
                del interrupt, context

    async def aclose(self) -> None:
        """Run the ordered close now (explicit close: retries failed steps of an earlier attempt)."""
        with unwrap_group():
            await self.ledger.aclose()

    def force_close(self) -> None:
        """Abandon the running close step and skip the rest: the operator's escape from a cleanup that hangs.

        The same as a second Ctrl+C (see "When you are cancelled while closing" in the cleanup contract).
        """  # CONTRACT C3.3
        self.ledger.force_close()

    def force_close_from_thread(self) -> None:
        self.ledger.force_close_from_thread()

    @property
    def state(self) -> str:
        if self._state is None:
            return "unopened"
        if self._state is LedgerState.OPEN and self.ledger.state != "open":
            return self.ledger.state
        return self._state.value

    # --- runtime -------------------------------------------------------

    @property
    def runtime(self) -> RuntimeTasks:
        if self._runtime is None or self._state is not LedgerState.OPEN:
            raise AdmissionClosedError(f"{self.name} is {self.state}; it runs no new tasks")
        return self._runtime

    def new_runtime_group(self) -> RuntimeTasks:
        """A separately stoppable set of runtime tasks in this host's task group (one per processor)."""
        if self._tg is None or self._state is not LedgerState.OPEN:
            raise AdmissionClosedError(f"{self.name} is {self.state}; it runs no new tasks")
        return RuntimeTasks(self._tg, self._hold_interrupt)

    # --- admission -----------------------------------------------------

    def quota_scope(self, strategy: LLMCallStrategy[Any]) -> QuotaScope:
        cached = self._scope_cache.get(id(strategy))
        if cached is not None and cached[0] is strategy:
            return cached[1]
        declared = strategy.quota_scope
        # A method here; async-batch-llm strategies declare it as a property: both are read.
        key = declared() if callable(declared) else declared
        scope = self._quotas.scope_for(key, self.config)
        self._scope_cache[id(strategy)] = (strategy, scope)
        return scope

    def adopt_quota_scope(self, strategy: LLMCallStrategy[Any], scope: QuotaScope) -> None:
        """Admit ``strategy``'s calls through ``scope``, which someone else owns (this host never closes it).

        For ``call()``: concurrent calls on one strategy share one scope per event loop.
        """
        self._scope_cache[id(strategy)] = (strategy, scope)

    async def _close_quotas(self) -> None:
        await self._quotas.aclose()

    def _close_quotas_nowait(self) -> bool:
        # In-process scopes close synchronously (their waiters wake into AdmissionClosedError);
        # only a shared backend's connection is closed by awaiting (_close_quotas).
        if self.config.quota_backend is not None:
            return False
        self._quotas.close()
        return True

    # --- strategy leases -----------------------------------------------

    async def ensure_prepared(self, strategy: LLMCallStrategy[Any]) -> None:
        """Prepare ``strategy`` once per host (shared by identity across hosts of one event loop)."""
        if id(strategy) in self._ready:
            return  # noqa: ASYNC910 - hot path: the strategy call that follows checkpoints
        await self._prepare_slow(strategy)

    async def _prepare_slow(self, strategy: LLMCallStrategy[Any]) -> None:
        identity = strategy.lease_identity()
        while identity not in self._leases:
            if self.ledger.phase_closing("strategies"):
                raise AdmissionClosedError(f"{self.name} is closing its strategies; no new preparation")
            pending = self._preparing.get(identity)
            if pending is not None:
                await pending.wait()
                continue
            done = anyio.Event()
            self._preparing[identity] = done
            strategy.configure_concurrency(self.config.provider_concurrency)
            try:
                self._leases[identity] = await lease_registry().acquire(strategy)
            finally:
                del self._preparing[identity]
                done.set()
        self._ready[id(strategy)] = strategy
        await anyio.lowlevel.checkpoint()

    def _lease_steps(self) -> list[CleanupStep]:
        # Step names must be unique (the ledger skips a name it knows), and distinct identities can
        # print alike (two equal-looking strategy objects): number the repeats, in the dict's stable
        # insertion order, so a later call names every lease as an earlier one did.
        steps: list[CleanupStep] = []
        if not self._leases:
            return steps
        seen: set[str] = set()
        for index, (identity, lease) in enumerate(self._leases.items()):
            name = f"release strategy {identity!r}"
            if name in seen:
                name = f"{name} #{index}"
            seen.add(name)
            steps.append(CleanupStep(name, lease.release, nowait=lease.release_nowait))
        return steps

    def statistics(self) -> HostStatistics:
        return HostStatistics(
            state=self.state,
            runtime_tasks=self._runtime.running if self._runtime is not None else 0,
            prepared_strategies=len(self._leases),
            quota_scopes=self._quotas.statistics().scopes,
            ledger=self.ledger.statistics(),
        )
