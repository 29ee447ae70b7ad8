"""The crash test's child process, and the parent-side harness that kills and resumes it.

Shared by tests/e2e/test_crash_resume.py (20+ trials per store) and
benchmarks/crash_fuzz.py (hundreds). One *trial*:

1. **Child phases.** A child Python process (this file run as a script) runs
   ``process_stream`` over ``items`` prompts against a JSONL or SQLite store
   (FakeStrategy: small random latency, 2 % terminal INVALID_REQUEST failures).
   It appends one line to a *calls log* when an execute starts (the evidence
   of what ran) and one line to a *published log* for every result it
   receives from the stream (the evidence of what was published). Both are
   written with one ``os.write`` on an ``O_APPEND`` descriptor before the
   child goes on: the bytes are in the kernel, which keeps them through a
   SIGKILL of the process (``--fsync-published`` adds an fsync per line, which
   only matters for power loss). The parent sends SIGKILL at a seeded moment:
   during start-up, or once a chosen number of results were published (spread
   from the first to the last). A trial may kill a resumed child again.
2. **Final phase.** The parent resumes in-process with
   ``ResumePolicy.REUSE_SUCCESSES`` until every item has a result.
3. **Checks** (``CrashInvariantError`` names the broken one):
   every published result is in the store as it was published; no phase
   executes an item that was stored as a success before it began; the final
   phase executes exactly the items not stored as successes, once each; the
   final batch holds every item exactly once, stored successes replayed with
   their stored output; and the store's whole history holds at most one
   success per item (no success ran, or was written, twice).

Run as a child: ``python tests/_crash_child.py --store jsonl --path P ...``
(see ``main``); the parent passes every argument.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.lowlevel

from trio_batch_llm import (
    ArtifactIdentity,
    ArtifactStoreError,
    ErrorCategory,
    FakeStrategy,
    LLMCallStrategy,
    ResumePolicy,
    WorkItemResult,
    process_prompts,
    process_stream,
)
from trio_batch_llm._artifacts import JsonlArtifactStore, SqliteArtifactStore

IDENTITY = ArtifactIdentity(provider="fake", model="crash-fuzz", prompt_version="1")
LATENCY = (0.0, 0.001)
FAILURE_RATE = 0.02
CHILD_TIMEOUT = 60.0
POLL_INTERVAL = 0.0005
CHILD_SCRIPT = str(Path(__file__).resolve())
_APPEND_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)


class CrashInvariantError(AssertionError):
    """A durability invariant failed (raised explicitly so ``python -O`` keeps the checks)."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CrashInvariantError(message)


# --- what both sides run --------------------------------------------------------


def work(items: int) -> list[tuple[str, str]]:
    return [(f"item-{i}", f"p{i}") for i in range(items)]


def item_of(prompt: str) -> str:
    return "item-" + prompt[1:]


def make_store(kind: str, path: Path) -> JsonlArtifactStore | SqliteArtifactStore:
    if kind == "jsonl":
        return JsonlArtifactStore(path, identity=IDENTITY)
    if kind == "sqlite":
        return SqliteArtifactStore(path, identity=IDENTITY)
    raise ValueError(f"store kind {kind!r}: expected 'jsonl' or 'sqlite'")


class CallLogging(LLMCallStrategy[str]):
    """A FakeStrategy that reports ``(prompt, attempt)`` before each execute starts."""

    def __init__(self, seed: int, log: Callable[[str, int], None]) -> None:
        self._fake = FakeStrategy(
            latency=LATENCY,
            failure_rate=FAILURE_RATE,
            failure_category=ErrorCategory.INVALID_REQUEST,
            seed=seed,
            record_calls=False,
        )
        self._log = log

    async def prepare(self) -> None:
        await self._fake.prepare()

    async def cleanup(self) -> None:
        await self._fake.cleanup()

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: Any = None
    ) -> tuple[str, Any, Any]:
        self._log(prompt, attempt)
        return await self._fake.execute(prompt, attempt, timeout, state)


def outcome_line(result: WorkItemResult[Any]) -> bytes:
    category = result.error_category.value if result.error_category else None
    record = {"id": result.item_id, "success": result.success, "output": result.output, "category": category}
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def outcome(result: WorkItemResult[Any]) -> tuple[bool, Any, str | None]:
    category = result.error_category.value if result.error_category else None
    return result.success, result.output, category


# --- the child ------------------------------------------------------------------


async def run_child(args: argparse.Namespace, published_fd: int, calls_fd: int) -> None:
    def log_call(prompt: str, attempt: int) -> None:
        os.write(calls_fd, f"{prompt} {attempt}\n".encode())

    strategy = CallLogging(args.seed, log_call)
    store = make_store(args.store, Path(args.path))
    policy = ResumePolicy(args.resume)
    async with process_stream(
        strategy, work(args.items), concurrency=args.concurrency, artifact_store=store, resume=policy
    ) as results:
        async for result in results:
            os.write(published_fd, outcome_line(result))
            if args.fsync_published:
                os.fsync(published_fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["jsonl", "sqlite"], required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", choices=[p.value for p in ResumePolicy], default=ResumePolicy.NONE.value)
    parser.add_argument("--published", required=True, help="append one line per result received")
    parser.add_argument("--calls", required=True, help="append one line per execute started")
    parser.add_argument("--fsync-published", action="store_true")
    args = parser.parse_args(argv)
    published_fd = os.open(args.published, _APPEND_FLAGS, 0o644)
    calls_fd = os.open(args.calls, _APPEND_FLAGS, 0o644)
    anyio.run(run_child, args, published_fd, calls_fd, backend=args.backend)
    return 0


# --- the parent: reading the evidence -------------------------------------------


def read_lines(path: Path) -> list[str]:
    """Complete lines only: a SIGKILL cannot tear an ``os.write`` line, but be strict anyway."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1].decode().splitlines()


def read_published(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in read_lines(path)]


def read_calls(path: Path) -> list[tuple[str, int]]:
    calls = []
    for line in read_lines(path):
        prompt, attempt = line.split()
        calls.append((item_of(prompt), int(attempt)))
    return calls


@dataclass
class Snapshot:
    """The store's whole history, in write order, as the library reads it offline."""

    records: list[WorkItemResult[Any]] = field(default_factory=list)

    @property
    def newest(self) -> dict[str, WorkItemResult[Any]]:
        return {r.item_id: r for r in self.records}

    @property
    def successes(self) -> set[str]:
        return {r.item_id for r in self.records if r.success}


def _sqlite_uninitialised(path: Path) -> bool:
    """A database the child created but was killed before it committed the schema."""
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]) == 0
    finally:
        conn.close()


def read_store(kind: str, path: Path) -> Snapshot:
    if not path.exists():
        return Snapshot()
    store = make_store(kind, path)
    try:
        return Snapshot(list(store.iter_results()))
    except ArtifactStoreError:
        if kind == "sqlite" and _sqlite_uninitialised(path):
            return Snapshot()
        raise


# --- the parent: one trial --------------------------------------------------------


@dataclass(frozen=True)
class KillPlan:
    """When to SIGKILL a child: ``delay`` s after spawn, or once ``after_published`` results were seen."""

    after_published: int | None = None
    delay: float = 0.0

    def describe(self) -> str:
        if self.after_published is None:
            return f"start+{self.delay * 1000:.0f}ms"
        return f"after {self.after_published} published"


@dataclass
class PhaseReport:
    plan: str
    killed: bool
    published: int
    calls: int
    stored_after: int


@dataclass
class TrialReport:
    store: str
    items: int
    child_backend: str
    phases: list[PhaseReport]
    stored_successes_before_final: int
    final_replayed: int
    final_executed: int
    seconds: float

    @property
    def killed_mid_run(self) -> bool:
        """The first kill left some but not all items stored."""
        return self.phases[0].killed and 0 < self.phases[0].stored_after < self.items


class _LineCounter:
    """Counts complete lines appended to a file since the last call (cheap, non-blocking reads)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: IO[bytes] | None = None
        self.lines = 0

    def poll(self) -> int:
        if self._file is None:
            if not self._path.exists():
                return 0
            self._file = self._path.open("rb")
        self.lines += self._file.read().count(b"\n")
        return self.lines

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _open_for_writing(path: Path) -> IO[bytes]:
    return path.open("wb")


def _read_text(path: Path) -> str:
    return path.read_text(errors="replace")


async def run_child_phase(cmd: list[str], plan: KillPlan, published: Path, stderr_path: Path) -> bool:
    """Start the child and SIGKILL it as planned; return whether it was killed (vs. finished)."""
    counter = _LineCounter(published)
    err = _open_for_writing(stderr_path)
    try:
        with anyio.fail_after(CHILD_TIMEOUT):
            async with await anyio.open_process(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
            ) as proc, anyio.create_task_group() as tg:
                exited = anyio.Event()

                async def wait_exit() -> None:
                    await proc.wait()
                    exited.set()

                tg.start_soon(wait_exit)
                if plan.after_published is None:
                    with anyio.move_on_after(plan.delay):
                        await exited.wait()
                else:
                    # Polls a file another process appends to: no event to wait for.
                    while not exited.is_set() and counter.poll() < plan.after_published:  # noqa: ASYNC110
                        await anyio.sleep(POLL_INTERVAL)
                killed = False
                if not exited.is_set():
                    try:
                        proc.kill()
                        killed = True
                    except ProcessLookupError:
                        pass  # it finished in the meantime
                await exited.wait()
            code = proc.returncode
    finally:
        counter.close()
        err.close()
    if killed:
        check(code == -9, f"child killed with SIGKILL exited with {code}")
    else:
        check(code == 0, f"child failed with exit code {code}:\n{_read_text(stderr_path)}")
    return killed


def _check_phase_calls(name: str, calls: list[tuple[str, int]], before: Snapshot) -> None:
    repeats = [call for call, n in Counter(calls).items() if n > 1]
    check(not repeats, f"{name}: attempts executed twice in one phase: {repeats[:5]}")
    again = sorted({item for item, _ in calls} & before.successes)
    check(not again, f"{name}: {len(again)} stored success(es) ran again, e.g. {again[:5]}")


def _check_published(name: str, published: list[dict[str, Any]], after: Snapshot) -> None:
    newest = after.newest
    ids = [p["id"] for p in published]
    check(len(ids) == len(set(ids)), f"{name}: an item was published twice")
    for p in published:
        stored = newest.get(p["id"])
        check(stored is not None, f"{name}: published result of {p['id']} is not in the store")
        assert stored is not None
        check(
            outcome(stored) == (p["success"], p["output"], p["category"]),
            f"{name}: {p['id']} published as {p} but stored as {outcome(stored)}",
        )


async def run_trial(
    kind: str,
    directory: Path,
    *,
    kills: list[KillPlan],
    child_backend: str = "trio",
    items: int = 2000,
    concurrency: int = 32,
    seed: int = 0,
    fsync_published: bool = False,
) -> TrialReport:
    """One trial (see the module docstring); raises CrashInvariantError on a broken invariant."""
    started = time.perf_counter()
    path = directory / ("run.jsonl" if kind == "jsonl" else "run.sqlite")
    all_ids = {item_id for item_id, _ in work(items)}
    phases: list[PhaseReport] = []
    published_successes: dict[str, Any] = {}
    before = await anyio.to_thread.run_sync(read_store, kind, path)  # nothing changes it between phases
    for index, plan in enumerate(kills):
        name = f"child phase {index} ({plan.describe()})"
        published_log, calls_log = directory / f"published-{index}.log", directory / f"calls-{index}.log"
        cmd = [
            sys.executable, CHILD_SCRIPT, "--store", kind, "--path", str(path),
            "--backend", child_backend, "--items", str(items), "--concurrency", str(concurrency),
            "--seed", str(seed), "--published", str(published_log), "--calls", str(calls_log),
            "--resume", (ResumePolicy.NONE if index == 0 else ResumePolicy.REUSE_SUCCESSES).value,
        ]
        if fsync_published:
            cmd.append("--fsync-published")
        killed = await run_child_phase(cmd, plan, published_log, directory / f"stderr-{index}.log")
        after = await anyio.to_thread.run_sync(read_store, kind, path)
        published = read_published(published_log)
        calls = read_calls(calls_log)
        _check_phase_calls(name, calls, before)
        _check_published(name, published, after)
        published_successes.update({p["id"]: p["output"] for p in published if p["success"]})
        phases.append(PhaseReport(plan.describe(), killed, len(published), len(calls), len(after.records)))
        before = after

    final_calls: list[tuple[str, int]] = []
    strategy = CallLogging(seed, lambda prompt, attempt: final_calls.append((item_of(prompt), attempt)))
    batch = await process_prompts(
        strategy, work(items), concurrency=concurrency, artifact_store=make_store(kind, path),
        resume=ResumePolicy.REUSE_SUCCESSES,
    )
    after = await anyio.to_thread.run_sync(read_store, kind, path)

    _check_phase_calls("final phase", final_calls, before)
    expected_runs = all_ids - before.successes
    check(
        sorted(final_calls) == sorted((item_id, 1) for item_id in expected_runs),
        f"final phase: executed {len(final_calls)} attempts, expected exactly the {len(expected_runs)} "
        "items not stored as successes, once each",
    )
    ids = [r.item_id for r in batch.results]
    check(len(ids) == items and set(ids) == all_ids, f"final batch: {len(ids)} results for {items} items")
    replayed = {r.item_id for r in batch.results if r.replayed}
    check(replayed == before.successes, "final batch: replayed results are not exactly the stored successes")
    by_id = batch.by_id()
    for item_id, output in published_successes.items():
        final = by_id[item_id]
        check(final.success and final.output == output, f"published success of {item_id} was lost")
    for result in batch.results:
        if result.success:
            check(result.output == "echo: p" + result.item_id[5:], f"{result.item_id}: wrong output")
    success_records = Counter(r.item_id for r in after.records if r.success)
    twice = sorted(item_id for item_id, n in success_records.items() if n > 1)
    check(not twice, f"store: {len(twice)} item(s) hold two success records, e.g. {twice[:5]}")
    newest = after.newest
    check(set(newest) == all_ids, f"store: {len(newest)} of {items} items stored after the final phase")
    for result in batch.results:
        check(outcome(newest[result.item_id]) == outcome(result), f"store: {result.item_id} differs")
    check(
        len(after.records) == len(before.records) + len(final_calls),
        "store: the final phase appended other than one record per executed item (replays re-appended?)",
    )
    return TrialReport(
        store=kind,
        items=items,
        child_backend=child_backend,
        phases=phases,
        stored_successes_before_final=len(before.successes),
        final_replayed=len(replayed),
        final_executed=len(final_calls),
        seconds=time.perf_counter() - started,
    )


def kill_plans(trial: int, trials: int, rng: Any, *, items: int, second_kill: bool) -> list[KillPlan]:
    """Seeded kill moments spread over the run.

    Every fifth trial (trial 0 first; so with alternating child backends both
    get some) dies during start-up: interpreter start, store creation, the
    first results. The others die once a share of the
    results was published, stratified over the trials and squared so that
    early kills (the first percent of the run) are as well covered as the end.
    """
    if trial % 5 == 0:
        plans = [KillPlan(delay=rng.uniform(0.0, 0.3))]
    else:
        share = ((trial + rng.random()) / trials) ** 2
        plans = [KillPlan(after_published=max(1, min(items, round(share * items))))]
    if second_kill:
        plans.append(KillPlan(after_published=rng.randint(1, items)))
    return plans


if __name__ == "__main__":
    sys.exit(main())
