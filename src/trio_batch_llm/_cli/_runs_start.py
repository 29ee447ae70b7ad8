"""``trio-batch-llm runs start``: create or reattach a durable run, and drive it.

Checks first (exit status 2, before any call): the input file, the model,
the endpoint, the key and the live-mode limits go through ``run``'s own
:func:`plan_run`; then the flags of the other mode are refused, and a stored
run of that name must have been started with the same ``--mode`` and
``--model``. The validated records are the run's source (a list, so on
reattach it is fast-forwarded to the stored checkpoint and checked against the
item id recorded there), which is also why a ``.csv`` input works.

Driving is ``run.wait(timeout)``. A live run is driven under a lease by
default (``--lease-seconds``, 30 s): every ``start`` of it, on this machine or
another sharing the database, works on it beside the others, and each says how
many drivers are working (when it joins, and whenever the number changes).
``--lease-seconds 0`` (and provider-batch mode, which keeps one submitter)
drives only with the run's claim: a ``start`` elsewhere watches, and takes over
if that driver dies.

A database that cannot be reached (at the start, or while driving for longer
than ``--unreachable-timeout``, default 60 s: shorter outages are ridden out)
exits with status 69 (``EX_UNAVAILABLE``), never 1 or 2: the run's stored
state is as it was, and the same command continues it.

Signals (SIGINT, SIGTERM) stop *this process's* drive at once, exactly as
``--timeout`` does: calls in flight are abandoned (their items stay pending and
are called again), provider batches keep running, and the run's stored status
does not change, so the next ``runs start`` (here or anywhere) continues it.
Unlike ``run``, the first signal does not drain: the only drain a run has is
:meth:`Run.pause`, which changes the status for every process, and a deploy
that sends SIGTERM to its workers must not leave its runs paused. To drain,
use ``runs pause`` first. Further signals are ignored; ``SIGKILL`` is safe
too (the claim dies with the process).
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

import anyio

from .._core._ledger import unwrap_group
from .._runs import ProviderBatchConfig, Run, RunSnapshot, open_run, read_run_snapshot
from .._strategies._base import LLMCallStrategy
from .._values._config import ArtifactIdentity, ProcessorConfig
from .._values._errors import (
    ArtifactStoreError,
    BatchLLMError,
    ConfigurationError,
    DatabaseUnavailableError,
    QuotaBackendError,
    RunSourceError,
    RunStateError,
)
from ._cache_flags import CACHE_FLAGS, CacheCheckError, check_cache
from ._command import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE, UsageError, signal_receiver
from ._input import InputError, iter_input
from ._render import (
    PROG,
    announce_drive,
    describe,
    drive_progress_line,
    fail,
    redaction_note,
    refuse,
    resolve_hint,
    say,
    shown_command,
)
from ._request_flags import REQUEST_FLAGS
from ._run import check_quota, plan_run
from ._runs_db import RunDb
from ._runs_ops import check_db_path
from ._terminal import end_echoed_ctrl_c

# Stands in for --out when the database is a PostgreSQL URL: plan_run checks it and never opens it.
_NO_OUT_FILE: Final = "/nonexistent-out-of-a-postgresql-run"

__all__ = ["DEFAULT_LEASE_SECONDS", "EXIT_TIMED_OUT", "StartPlan", "plan_start", "start_command"]

EXIT_TIMED_OUT: Final = 3
_PROGRESS_EVERY: Final = 10.0  # seconds between progress lines while the run is not terminal
_DRIVERS_EVERY: Final = 1.0  # seconds between looks at how many drivers work on the run
# The lease of a live run's driver. It is renewed every third of it while the driver runs, however
# long its calls take, so it bounds how long a healthy driver may stall (a pause of the process,
# a database failover) before its calls in flight are made again elsewhere, and how long a dead
# driver's items wait for the others: the same 30 s as a shared quota's in-flight expiry.
DEFAULT_LEASE_SECONDS: Final = 30.0
_LIVE_FLAGS: Final = {"concurrency": "--concurrency", "rpm": "--rpm", "tpm": "--tpm",
                      "lease_seconds": "--lease-seconds",
                      "attempt_timeout": "--attempt-timeout", "max_attempts": "--max-attempts",
                      "quota": "--quota", "quota_max_in_flight": "--quota-max-in-flight",
                      "cache": "--cache", **CACHE_FLAGS}  # provider batches are not looked up in a cache
_BATCH_FLAGS: Final = {"batch_size": "--batch-size", "enqueued_token_limit": "--enqueued-token-limit",
                       "poll_interval": "--poll-interval", "request_timeout": "--request-timeout"}


@final
@dataclass(frozen=True, slots=True)
class StartPlan:
    db: RunDb
    run_id: str
    source: list[tuple[str, str, Any]]
    strategy: LLMCallStrategy[str]
    identity: ArtifactIdentity
    config: ProcessorConfig
    mode: str
    batch: ProviderBatchConfig | None
    timeout: float | None
    lease_seconds: float | None
    """None: driven with the run's claim, one process at a time (provider-batch, or --lease-seconds 0)."""
    unreachable_timeout: float
    backend: str
    existing: RunSnapshot | None
    command: str
    endpoint: str = ""
    """Which API the drive speaks, and where (printed after the run's description)."""
    """This command line again: what continues the run."""


def _lease_seconds(args: argparse.Namespace) -> float | None:
    """The driver's lease: the default in live mode, none with ``--lease-seconds 0`` or a provider batch."""
    if args.mode != "live":
        return None  # (a --lease-seconds given with it was refused)
    if args.lease_seconds is None:
        return DEFAULT_LEASE_SECONDS
    return float(args.lease_seconds) or None


def _existing(db: RunDb, run_id: str) -> RunSnapshot | None:
    """The stored run, or ``None`` if there is none yet (or the file cannot tell: open_run will)."""
    if not db.exists():
        return None
    try:
        return read_run_snapshot(db.target, run_id)
    except DatabaseUnavailableError:
        raise  # not "no run yet": start_command says the database is unreachable
    except (RunStateError, ArtifactStoreError):
        return None


def _refuse_other_mode_flags(args: argparse.Namespace) -> None:
    other = _BATCH_FLAGS if args.mode == "live" else _LIVE_FLAGS
    for name, flag in other.items():
        if getattr(args, name) is not None:
            raise UsageError(f"{flag} is not used with --mode {args.mode}")


def _check_matches(snap: RunSnapshot, args: argparse.Namespace, identity: ArtifactIdentity) -> None:
    if snap.mode != args.mode:
        raise UsageError(f"run {snap.run_id!r} was started with --mode {snap.mode}; pass that again "
                         "(the mode of a run never changes), or choose another RUN_ID")
    if snap.identity != identity:
        stored = f"{snap.identity.provider}:{snap.identity.model}"
        if (snap.identity.provider, snap.identity.model) == (identity.provider, identity.model):
            raise UsageError(f"run {snap.run_id!r} was started with other request settings "
                             f"({REQUEST_FLAGS}); "
                             "pass the same ones again, or choose another RUN_ID")
        raise UsageError(f"run {snap.run_id!r} was started with --model {stored}; pass that again, "
                         "or choose another RUN_ID")


def plan_start(args: argparse.Namespace, argv: Sequence[str]) -> StartPlan:
    """Everything ``start`` needs, checked; :class:`UsageError` or :class:`InputError` otherwise."""
    db, source = RunDb.of(args.db), Path(args.input)
    check_db_path(db)
    if db.samefile(source):
        raise UsageError(f"{db} is the input file; the database needs a path of its own")
    _refuse_other_mode_flags(args)
    # `run`'s checks and construction, reused as they are: the database stands where `run`'s
    # --out would, with resume=True so an existing file is accepted; check_db_path above has
    # already refused every path plan_run's --out checks would.
    checked = plan_run(argparse.Namespace(
        input=args.input, out=str(db.path or _NO_OUT_FILE), resume=True, model=args.model,
        base_url=args.base_url, api=args.api,
        api_key_env=args.api_key_env, concurrency=args.concurrency or 16, rpm=args.rpm, tpm=args.tpm,
        attempt_timeout=args.attempt_timeout or 120.0, batch_timeout=None, backend=args.backend,
        progress=False, max_attempts=args.max_attempts, system=args.system, temperature=args.temperature,
        max_tokens=args.max_tokens, response_schema=args.response_schema, quota=args.quota,
        quota_max_in_flight=args.quota_max_in_flight, cache=args.cache, cache_mode=args.cache_mode,
        cache_ttl=args.cache_ttl, cache_no_request=args.cache_no_request,
    ), argv)
    identity = checked.identity
    existing = _existing(db, args.run_id)
    if existing is not None:
        _check_matches(existing, args, identity)
    batch = None
    if args.mode == "provider-batch":
        given = {"max_requests_per_batch": args.batch_size, "enqueued_token_limit": args.enqueued_token_limit,
                 "poll_interval": args.poll_interval, "request_timeout": args.request_timeout}
        try:
            batch = ProviderBatchConfig(**{name: value for name, value in given.items() if value is not None})
        except ConfigurationError as exc:  # the argparse types check each flag; this is a backstop
            raise UsageError(str(exc)) from None
    rows: list[tuple[str, str, Any]] = []
    for record in iter_input(checked.source):
        if record.sample:  # a run stores no sample yet: refused, rather than run as sample 0
            raise InputError(checked.source, "durable runs do not carry a sample yet; run sampled rows "
                             "with `trio-batch-llm run`", line=record.line, field="sample")
        rows.append((record.item_id, record.prompt, record.context))
    return StartPlan(
        db=db, run_id=args.run_id, source=rows,
        strategy=checked.strategy, identity=identity, config=checked.config, mode=args.mode, batch=batch,
        timeout=args.timeout, lease_seconds=_lease_seconds(args),
        unreachable_timeout=args.unreachable_timeout,
        backend=args.backend, existing=existing, command=shown_command(_shown_argv(argv, args.db, db)),
        endpoint=checked.endpoint,
    )


@final
class _Outcome:
    def __init__(self) -> None:
        self.opened = False
        self.snapshot: RunSnapshot | None = None
        self.timed_out = False
        self.signal: signal.Signals | None = None

    async def watch_signals(self, signals: AsyncIterator[int], drive: anyio.CancelScope) -> None:
        async for signum in signals:
            sig = signal.Signals(signum)
            end_echoed_ctrl_c(sig)
            if self.signal is None:
                self.signal = sig
                say(f"{sig.name}: stopping the drive; calls in flight are abandoned and run again later, "
                    "the run's status does not change")
                drive.cancel(reason=f"interrupted by {sig.name}")
            else:
                say(f"{sig.name} again: already stopping")


async def _report_progress(run: Run) -> None:
    """A line every few seconds when something changed, so a long drive is not silent."""
    last: tuple[str, int] | None = None
    while True:
        await anyio.sleep(_PROGRESS_EVERY)
        snap = await run.snapshot()
        if (snap.status, snap.done) != last:
            last = (snap.status, snap.done)
            say(drive_progress_line(snap))


def _working(count: int, run_id: str) -> str:
    return f"{count} driver{'' if count == 1 else 's'} working on run {run_id}"


async def _report_drivers(run: Run, run_id: str) -> None:
    """Say how many drivers work on the run: once this one has its lease (it joined, or works
    alone so far), then whenever the number changes."""
    shown: int | None = None
    while True:
        working = await run.drivers()
        if run.driver_id in working and len(working) != shown:  # (between two of its leases: not)
            count = len(working)
            if shown is not None:
                say(_working(count, run_id))
            elif count > 1:
                say(f"joined run {run_id}: {count} drivers working on it")
            else:
                say(f"{_working(1, run_id)} (this one); a `runs start` of it elsewhere works beside it")
            shown = count
        await anyio.sleep(_DRIVERS_EVERY)


async def _drive(plan: StartPlan, outcome: _Outcome) -> None:
    await check_quota(plan.config.quota_backend)  # as `run`: a refused --quota is bad usage, exit 2
    await check_cache(plan.config.response_cache)  # and so is a --cache that cannot be opened
    drive = anyio.CancelScope()  # cancelled by a signal, before or during wait()
    with unwrap_group(), signal_receiver() as signals:
        async with anyio.create_task_group() as group:
            if signals is not None:
                group.start_soon(outcome.watch_signals, signals, drive, name="signal watcher")
            run = await open_run(plan.db.target, plan.run_id, plan.strategy, plan.source, config=plan.config,
                                 mode=plan.mode, identity=plan.identity, batch=plan.batch,
                                 lease_seconds=plan.lease_seconds,
                                 unreachable_timeout=plan.unreachable_timeout)
            async with run:
                outcome.opened = True
                group.start_soon(_report_progress, run, name="progress lines")
                if plan.lease_seconds is not None:
                    group.start_soon(_report_drivers, run, plan.run_id, name="drivers lines")
                with drive:
                    try:
                        outcome.snapshot = await run.wait(plan.timeout)
                    except TimeoutError:
                        outcome.timed_out = True
                if outcome.snapshot is None:  # stopped early: the run as this drive left it
                    outcome.snapshot = await run.snapshot()
                group.cancel_scope.cancel(reason="the drive ended")


def _report(plan: StartPlan, outcome: _Outcome) -> int:
    snap = outcome.snapshot
    assert snap is not None
    print("\n".join(describe(snap, before=plan.existing)), flush=True)
    if plan.endpoint:
        print(f"  {plan.endpoint}", flush=True)
    if snap.unresolved_submission is not None and not snap.terminal:
        say(resolve_hint(snap, plan.db))
    if outcome.signal is not None:
        say(f"stopped driving on {outcome.signal.name}; the run is {snap.status}; "
            f"continue with: {plan.command}{redaction_note(plan.command)}")
        return 128 + int(outcome.signal)
    if outcome.timed_out:
        say(f"not finished after {plan.timeout} s; the run is {snap.status}; continue with: {plan.command}"
            f"{redaction_note(plan.command)}")
        return EXIT_TIMED_OUT
    if snap.status == "completed":
        if snap.failed:
            say(f"{snap.failed} item(s) failed; their results say why")
            return EXIT_FAILED
        return EXIT_OK
    if snap.status == "failed":
        say(f"the run failed; after fixing the cause: {PROG} runs resume {plan.db} {plan.run_id}, "
            f"then: {plan.command}{redaction_note(plan.command)}")
    return EXIT_FAILED


def _shown_argv(argv: Sequence[str], given: str, db: RunDb) -> list[str]:
    """``argv`` with the DB argument as printed (a libpq keyword string without its password)."""
    return [str(db) if arg == given else arg for arg in argv]


def _unavailable(exc: DatabaseUnavailableError, command: str | None) -> int:
    say(f"error: the run database is unreachable: {exc}")
    if command is not None:
        say(f"the run is as stored (not failed); once the database is back, continue with: {command}"
            f"{redaction_note(command)}")
    return EXIT_UNAVAILABLE


def start_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    try:
        plan = plan_start(args, argv)
    except DatabaseUnavailableError as exc:
        return _unavailable(exc, None)
    except (InputError, UsageError) as exc:
        return refuse(exc)
    announce_drive(plan.run_id, plan.db, plan.mode, plan.existing, plan.timeout)
    outcome = _Outcome()
    try:
        anyio.run(_drive, plan, outcome, backend=plan.backend)
    # RunSourceError: the input is not the one the run started with; CacheCheckError: refused by
    # check_cache, before the run was opened.
    except (RunSourceError, CacheCheckError) as exc:
        return refuse(exc)
    except QuotaBackendError as exc:  # before the run was opened: refused by check_quota
        return fail(exc) if outcome.opened else refuse(f"--quota: {exc}")
    except DatabaseUnavailableError as exc:  # before or while driving: the run did not fail
        return _unavailable(exc, plan.command)
    except (BatchLLMError, OSError) as exc:
        if not outcome.opened:  # e.g. not a run database
            return refuse(f"cannot open run {plan.run_id!r} in {plan.db}: {exc}")
        fail(exc)  # the run failed; its snapshot, when it can be read, says how far it came
        try:
            outcome.snapshot = read_run_snapshot(plan.db.target, plan.run_id)
        except BatchLLMError:
            return EXIT_FAILED
    return _report(plan, outcome)
