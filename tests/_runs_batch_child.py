"""Provider-batch crash trials: the child process, and the parent-side harness that kills and resumes it.

Shared by tests/runs/test_batch_crash.py (a few fixed trials) and
``benchmarks/crash_fuzz.py --mode provider-batch`` (many seeded ones). One trial:

1. **The provider.** The parent serves the mock (``serve_mock``, a real socket)
   in its own event loop for the whole trial, so the provider's record (the
   batches, their result files, every line executed) survives each child's death.
2. **Child phases.** A child (this file run as a script) opens a
   ``mode="provider-batch"`` run on a SQLite file against the mock and drives
   it. The parent SIGKILLs it at a planned moment (:class:`KillPlan`): a delay
   after start-up, the child's own SIGKILL when its source is asked for entry K
   (during ingestion), or a seeded delay after the mock saw the N-th upload,
   create or result download, or the N-th batch created. A scripted create fault
   (``hang_before_create`` / ``hang_after_create``) holds a child inside its create
   call until it is killed. A later phase may kill the resumed child again.
3. **Final phase.** The parent itself (on its own backend), or a fresh child,
   resumes the run to completion.
4. **The operator.** A create whose outcome is unknown and that the provider's
   listing does not show stops the run until ``Run.resolve_submission`` (a hanging
   create, or a kill after the intent was recorded but before the create reached
   the provider, leaves one, listing or not). While a
   phase runs, the parent plays the operator: it settles such a submission with
   ``created=False`` only when the mock (the ground truth) has no batch carrying
   the submission id and no create request undecided; each one is reported.
5. **Checks** (:class:`BatchCrashError` names the broken one), after every phase:
   stored results have gapless sequences, one per item, each from a line the mock
   executed in the batch its metadata names; the tokens the scope holds are those
   of the run's live submissions and within the limit. At the end: the run
   completed, every item has exactly one result, the provider executed every
   item's line exactly once (counted from the batches' result files), it never
   refused a batch for capacity, and the scope holds no tokens.

Run as a child::

    python tests/_runs_batch_child.py --db P --base-url URL --items N [--backend trio|asyncio]
        [--entry-delay S] [--kill-at-entry K]

It prints one JSON line: ``{"status": ..., "done": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import anyio
import anyio.abc
import anyio.lowlevel

from trio_batch_llm import (
    ArtifactIdentity,
    ArtifactStoreError,
    OpenAICompatibleStrategy,
    ProcessorConfig,
    ProviderBatchConfig,
    RetryConfig,
)
from trio_batch_llm._runs import Run, RunSnapshot, RunStateError, SqliteRunRepository, open_run
from trio_batch_llm._runs._batch_submit import METADATA_KEY
from trio_batch_llm._runs._reader import load_results
from trio_batch_llm._runs._schema import LIVE_SUBMISSION_STATES, RunResult, SubmissionRecord
from trio_batch_llm.testing import MockServer, MockServerConfig, MockServerStats, serve_mock

IDENTITY: Final = ArtifactIdentity(provider="mock", model="batch-crash", prompt_version="1")
RUN_ID: Final = "run"
MODEL: Final = "mock-model"
SCOPE: Final = "batch-crash-scope"
TOKENS_PER_ITEM: Final = 10  # every prompt is 40 characters: 10 tokens by the default estimate
TOKEN_LIMIT: Final = 10 * TOKENS_PER_ITEM  # two full batches of four fit at once, a third waits
BATCH_LATENCY: Final = 0.25
REQUEST_TIMEOUT: Final = 1.0
CHILD_TIMEOUT: Final = 30.0
CHILD_SCRIPT: Final = str(Path(__file__).resolve())
CONFIG: Final = ProcessorConfig(
    retry=RetryConfig(max_attempts=3, initial_wait=0.05, max_wait=0.05, jitter=False)
)
_OPERATOR_POLL: Final = 0.1
_OPERATOR_PATIENCE: Final = 3  # polls a submission stays unknown (and not at the mock) before it is settled

Trigger = Literal["start", "entry", "upload", "create", "open", "collect"]


class BatchCrashError(AssertionError):
    """A crash invariant failed (raised explicitly so ``python -O`` keeps the checks)."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise BatchCrashError(message)


def prompt_of(index: int) -> str:
    return f"batch crash prompt {index:04d} ".ljust(4 * TOKENS_PER_ITEM, ".")


def item_prompts(items: int) -> list[str]:
    return [prompt_of(i) for i in range(items)]


def item_ids(items: int) -> list[str]:
    return [f"item-{i}" for i in range(items)]


def batch_config() -> ProviderBatchConfig:
    return ProviderBatchConfig(
        max_requests_per_batch=4, max_open_batches=3, enqueued_token_limit=TOKEN_LIMIT, capacity_scope=SCOPE,
        poll_interval=0.03, request_timeout=REQUEST_TIMEOUT,
    )


async def open_trial_run(db: Path, base_url: str, source: Any) -> Run:
    strategy = OpenAICompatibleStrategy(MODEL, base_url=base_url, api_key_env=None)
    return await open_run(
        db, RUN_ID, strategy, source, mode="provider-batch", config=CONFIG, identity=IDENTITY,
        batch=batch_config(), poll_interval=0.05, slice_items=4, slice_seconds=0.05,
    )


# --- the child ----------------------------------------------------------------------------


async def slow_source(items: int, delay: float, kill_at_entry: int | None) -> AsyncIterator[str]:
    """The prompts, one every ``delay`` s; SIGKILL this process when asked for entry ``kill_at_entry``."""
    for index in range(items):
        if index == kill_at_entry:
            os.kill(os.getpid(), signal.SIGKILL)
        await anyio.sleep(delay)
        yield prompt_of(index)
    await anyio.lowlevel.checkpoint()


async def _child(args: argparse.Namespace) -> dict[str, Any]:
    source = slow_source(args.items, args.entry_delay, args.kill_at_entry)
    async with await open_trial_run(Path(args.db), args.base_url, source) as run:
        snap = await run.wait(timeout=CHILD_TIMEOUT)
    return {"status": snap.status, "done": snap.done}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--backend", default="trio")
    parser.add_argument("--entry-delay", type=float, default=0.0)
    parser.add_argument("--kill-at-entry", type=int)
    args = parser.parse_args()
    outcome = anyio.run(_child, args, backend=args.backend)
    sys.stdout.write(json.dumps(outcome) + "\n")


# --- plans and reports --------------------------------------------------------------------


@dataclass(frozen=True)
class KillPlan:
    """When to SIGKILL a child phase; see the module docstring. ``trigger="start"``: ``delay`` after spawn."""

    trigger: Trigger
    count: int = 1
    delay: float = 0.0

    def describe(self) -> str:
        if self.trigger == "start":
            return f"start+{self.delay * 1000:.0f}ms"
        if self.trigger == "entry":
            return f"reading entry {self.count}"
        return f"{self.trigger} #{self.count}+{self.delay * 1000:.0f}ms"


@dataclass(frozen=True)
class BatchTrial:
    """One trial: its kills, the mock's faults, who finishes, the child backend."""

    kills: tuple[KillPlan, ...]
    items: int = 12
    child_backend: str = "trio"
    final: Literal["parent", "child"] = "parent"
    create_faults: tuple[str, ...] = ()
    batch_list: bool = True
    latency: float = 0.0
    """Seconds the mock takes for every request: widens the windows between steps."""
    entry_delay: float = 0.01

    def mock_config(self) -> MockServerConfig:
        return MockServerConfig(
            batch_latency=BATCH_LATENCY, batch_create_faults=self.create_faults, batch_list=self.batch_list,
            batch_enqueued_token_limit=TOKEN_LIMIT, latency=self.latency,
        )

    def describe(self) -> str:
        kills = ", then ".join(plan.describe() for plan in self.kills)
        return (f"kill at {kills}; faults {list(self.create_faults)}; list={self.batch_list}; "
                f"latency={self.latency}; child {self.child_backend}; final in {self.final}")


@dataclass
class PhaseReport:
    plan: str
    killed: bool
    moment: frozenset[str]
    """What the kill interrupted (see :func:`moment_tags`)."""
    done: int


@dataclass
class BatchTrialReport:
    trial: BatchTrial
    phases: list[PhaseReport]
    resolutions: list[str]
    """Submissions the parent settled as the operator (``created=False``)."""
    batches_created: int
    seconds: float


@dataclass
class StoredRun:
    """A run as its database holds it, read from the parent (blocking; run it in a thread)."""

    snapshot: RunSnapshot
    submissions: list[SubmissionRecord]
    results: list[RunResult]
    held_tokens: int

    def live(self) -> list[SubmissionRecord]:
        return [s for s in self.submissions if s.state in LIVE_SUBMISSION_STATES]


def read_stored(db: Path) -> StoredRun | None:
    """The run, or ``None`` if no process created it yet (or its database is still being set up)."""
    if not db.exists():
        return None
    repository = SqliteRunRepository(db, read_only=True)
    try:
        repository.open()
        try:
            snapshot = repository.snapshot(RUN_ID)
        except RunStateError:
            return None
        return StoredRun(snapshot, repository.submissions(RUN_ID), load_results(repository, RUN_ID, 0, None),
                         repository.held_tokens(SCOPE))
    except (ArtifactStoreError, sqlite3.Error):
        return None  # a database a child had only begun to create when it died
    finally:
        repository.close()


# --- the provider's record ----------------------------------------------------------------


def mock_batches_by_submission(server: MockServer) -> dict[str, dict[str, Any]]:
    batches = server.app.batches
    return {b["metadata"][METADATA_KEY]: b for b in batches if (b["metadata"] or {}).get(METADATA_KEY)}


def create_undecided(server: MockServer) -> bool:
    """A create request the mock has not decided yet (it may still make a batch).

    One whose client went away first never will: the mock cancels its handling then.
    """
    creates = (r for r in server.requests if r.method == "POST" and r.path == "/v1/batches")
    return any(r.outcome == "pending" and not r.client_disconnected for r in creates)


async def executed_lines(server: MockServer) -> dict[str, list[str]]:
    """``{item id: [batch id, ...]}``: every line the mock executed, from the batches' result files."""
    import httpx2

    executed: dict[str, list[str]] = {}
    transport = httpx2.ASGITransport(app=server.app)  # the same app, without a socket
    async with httpx2.AsyncClient(transport=transport, base_url="http://mock") as client:
        for batch in server.app.batches:
            for file_id in (batch["output_file_id"], batch["error_file_id"]):
                if not file_id:
                    continue
                reply = await client.get(f"/v1/files/{file_id}/content")
                check(reply.status_code == 200, f"result file {file_id}: {reply.status_code}")
                for line in reply.content.splitlines():
                    entry = json.loads(line)
                    if entry["response"] is not None:
                        executed.setdefault(entry["custom_id"], []).append(batch["id"])
    return executed


def moment_tags(stored: StoredRun | None, server: MockServer) -> frozenset[str]:
    """What a kill interrupted: ``ingesting``, ``reserved`` (reserved, create never sent),
    ``creating-made`` / ``creating-unmade`` (create outcome unknown; the mock made the batch or not),
    ``open`` (a batch running), ``collecting`` (a finished batch not yet recorded), ``done``."""
    if stored is None:
        return frozenset({"no-run"})
    tags = set[str]()
    if not stored.snapshot.ingestion_complete:
        tags.add("ingesting")
    made = mock_batches_by_submission(server)
    for sub in stored.live():
        batch = made.get(sub.submission_id)
        if sub.state == "reserved":
            tags.add("reserved")
        elif sub.state in ("creating", "unknown"):
            tags.add("creating-made" if batch is not None else "creating-unmade")
        elif batch is not None and batch["status"] in ("completed", "failed", "expired", "cancelled"):
            tags.add("collecting")
        else:
            tags.add("open")
    if stored.snapshot.done == stored.snapshot.items and stored.snapshot.ingestion_complete:
        tags.add("done")
    return frozenset(tags)


# --- checks -------------------------------------------------------------------------------


def check_stored(name: str, stored: StoredRun | None, executed: dict[str, list[str]], items: int) -> None:
    """Invariants that hold after a kill at any moment."""
    if stored is None:
        return
    results, snap = stored.results, stored.snapshot
    check([r.sequence for r in results] == list(range(1, len(results) + 1)),
          f"{name}: result sequences are not 1..{len(results)}: {[r.sequence for r in results]}")
    ids = [r.item_id for r in results]
    check(len(ids) == len(set(ids)), f"{name}: an item has two results: {Counter(ids).most_common(3)}")
    check(set(ids) <= set(item_ids(items)), f"{name}: results for unknown items")
    check(snap.done == len(results), f"{name}: done={snap.done} but {len(results)} results stored")
    for r in results:
        prompt = prompt_of(int(r.item_id.removeprefix("item-")))
        check(r.result.success and r.result.output == "echo: " + prompt, f"{name}: {r.item_id}: {r.result}")
        batch_id = r.result.metadata.get("batch_id")
        check(batch_id in executed.get(r.item_id, []),
              f"{name}: {r.item_id} recorded from batch {batch_id}, which did not execute it")
    live_tokens = sum(s.tokens for s in stored.live())
    check(stored.held_tokens == live_tokens <= TOKEN_LIMIT,
          f"{name}: the scope holds {stored.held_tokens} tokens; live submissions {live_tokens}")


async def check_final(db: Path, server: MockServer, items: int) -> StoredRun:
    stored = await anyio.to_thread.run_sync(read_stored, db)
    check(stored is not None, "final: the run does not exist")
    assert stored is not None
    snap = stored.snapshot
    check(snap.status == "completed", f"final: the run is {snap.status} ({snap.termination})")
    check((snap.items, snap.done, snap.succeeded) == (items, items, items),
          f"final: items={snap.items} done={snap.done} succeeded={snap.succeeded}, expected {items}")
    executed = await executed_lines(server)
    check_stored("final", stored, executed, items)
    check(Counter(r.item_id for r in stored.results) == Counter(item_ids(items)),
          "final: not exactly one result per item")
    twice = {item: batches for item, batches in executed.items() if len(batches) != 1}
    check(not twice and set(executed) == set(item_ids(items)),
          f"final: the provider did not execute every line exactly once: {twice or sorted(executed)}")
    stats = server.statistics()
    check(stats.batch_lines == items, f"final: the mock executed {stats.batch_lines} lines for {items} items")
    check(stats.batches_token_limited == 0 and stats.max_enqueued_tokens <= TOKEN_LIMIT,
          f"final: over the enqueued-token limit at the provider ({stats.max_enqueued_tokens})")
    check(snap.open_submissions == 0 and stored.held_tokens == 0,
          f"final: {snap.open_submissions} open submissions, {stored.held_tokens} tokens still held")
    return stored


# --- the operator -------------------------------------------------------------------------


async def play_operator(db: Path, server: MockServer, resolutions: list[str]) -> None:
    """Settle a create that stays unknown while the mock certainly made nothing (runs until cancelled)."""
    patience: Counter[str] = Counter()
    handle: Run | None = None
    try:
        while True:
            await anyio.sleep(_OPERATOR_POLL)
            stored = await anyio.to_thread.run_sync(read_stored, db)
            unknown = [s.submission_id for s in stored.live() if s.state == "unknown"] if stored else []
            made = mock_batches_by_submission(server)
            for sid in list(patience):
                if sid not in unknown:
                    del patience[sid]
            for sid in unknown:
                if sid in made or create_undecided(server):
                    patience.pop(sid, None)
                    continue
                patience[sid] += 1
                if patience[sid] < _OPERATOR_PATIENCE:
                    continue
                if handle is None:
                    handle = await open_trial_run(db, server.base_url, None)
                try:
                    await handle.resolve_submission(created=False)
                except RunStateError:
                    continue  # found by the driver meanwhile
                resolutions.append(sid)
    finally:
        if handle is not None:
            with anyio.CancelScope(shield=True):  # bounded: closes one database connection
                await handle.aclose()


# --- phases -------------------------------------------------------------------------------


def _phase_base(server: MockServer) -> tuple[int, int]:
    return len(server.requests), server.statistics().batches_created


StatsPredicate = Callable[[MockServerStats], bool]


def _predicate(server: MockServer, plan: KillPlan, base: tuple[int, int]) -> StatsPredicate:
    first_request, created = base

    def seen(method: str, matches: Callable[[str], bool]) -> bool:
        recent = server.requests[first_request:]
        return sum(1 for r in recent if r.method == method and matches(r.path)) >= plan.count

    match plan.trigger:
        case "upload":
            return lambda _: seen("POST", lambda path: path == "/v1/files")
        case "create":
            return lambda _: seen("POST", lambda path: path == "/v1/batches")
        case "collect":
            return lambda _: seen("GET", lambda path: path.endswith("/content"))
        case "open":
            return lambda stats: stats.batches_created - created >= plan.count
    raise ValueError(plan.trigger)


async def _kill_when_due(server: MockServer, proc: anyio.abc.Process, plan: KillPlan,
                         base: tuple[int, int]) -> None:
    """Wait for the plan's moment (or the child's exit), then SIGKILL the child if it still runs."""
    with anyio.move_on_after(CHILD_TIMEOUT):  # the child may finish first
        async with anyio.create_task_group() as watch:

            async def exit_ends_watch() -> None:
                await proc.wait()
                watch.cancel_scope.cancel("the child exited")

            watch.start_soon(exit_ends_watch)
            if plan.trigger == "start":
                await anyio.sleep(plan.delay)
            else:
                await server.wait_for(_predicate(server, plan, base))
                await anyio.sleep(plan.delay)
            watch.cancel_scope.cancel("kill moment reached")
    if proc.returncode is None:
        proc.kill()  # a child that exits meanwhile ends 0 all the same: the kill is then not counted


async def run_child_phase(server: MockServer, db: Path, trial: BatchTrial, plan: KillPlan | None,
                          directory: Path, index: int, resolutions: list[str]) -> bool:
    """Start a child and SIGKILL it as planned (``plan=None``: let it finish); whether it was killed."""
    cmd = [sys.executable, CHILD_SCRIPT, "--db", str(db), "--base-url", server.base_url,
           "--items", str(trial.items), "--backend", trial.child_backend,
           "--entry-delay", str(trial.entry_delay)]
    if plan is not None and plan.trigger == "entry":
        cmd += ["--kill-at-entry", str(plan.count)]  # the child's source kills it: no parent action
    base = _phase_base(server)
    out_path, err_path = directory / f"stdout-{index}.log", directory / f"stderr-{index}.log"
    with out_path.open("wb") as out, err_path.open("wb") as err, anyio.fail_after(CHILD_TIMEOUT + 10):
        proc = await anyio.open_process(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        async with proc, anyio.create_task_group() as tg:
            tg.start_soon(play_operator, db, server, resolutions)
            if plan is not None and plan.trigger != "entry":
                await _kill_when_due(server, proc, plan, base)
            await proc.wait()
            tg.cancel_scope.cancel("the child exited")
    code = proc.returncode
    killed = code == -signal.SIGKILL
    if not killed:
        stderr = err_path.read_text(errors="replace")
        check(code == 0, f"phase {index}: the child failed with exit code {code}:\n{stderr}")
        outcome = json.loads(out_path.read_text())
        check(outcome["status"] == "completed", f"phase {index}: the child ended {outcome}")
    check(plan is not None or not killed, f"phase {index}: a child nobody killed died of SIGKILL")
    return killed


async def finish_in_process(server: MockServer, db: Path, items: int, resolutions: list[str]) -> RunSnapshot:
    """Resume and complete the run in this process (on its backend), the operator watching."""
    run = await open_trial_run(db, server.base_url, item_prompts(items))
    snap: RunSnapshot | None = None
    async with run, anyio.create_task_group() as tg:
        tg.start_soon(play_operator, db, server, resolutions)
        with anyio.move_on_after(CHILD_TIMEOUT):
            snap = await run.wait()
        stuck = await run.snapshot() if snap is None else None
        tg.cancel_scope.cancel("the run is terminal, or stuck")
    check(snap is not None, f"final: the run was not terminal after {CHILD_TIMEOUT} s: {stuck}")
    assert snap is not None
    return snap


async def run_batch_trial(trial: BatchTrial, directory: Path) -> BatchTrialReport:
    """One trial (see the module docstring); raises :class:`BatchCrashError` on a broken invariant."""
    started = time.perf_counter()
    db = directory / "runs.sqlite"
    phases: list[PhaseReport] = []
    resolutions: list[str] = []
    async with serve_mock(trial.mock_config()) as server:
        for index, plan in enumerate(trial.kills):
            killed = await run_child_phase(server, db, trial, plan, directory, index, resolutions)
            stored = await anyio.to_thread.run_sync(read_stored, db)
            moment = moment_tags(stored, server)
            check_stored(f"after phase {index} ({plan.describe()})", stored, await executed_lines(server),
                         trial.items)
            phases.append(PhaseReport(plan.describe(), killed, moment, stored.snapshot.done if stored else 0))
        if trial.final == "child":
            await run_child_phase(server, db, trial, None, directory, len(trial.kills), resolutions)
        else:
            await finish_in_process(server, db, trial.items, resolutions)
        await check_final(db, server, trial.items)
        created = server.statistics().batches_created
    return BatchTrialReport(trial, phases, resolutions, created, time.perf_counter() - started)


if __name__ == "__main__":
    main()
