"""``runs list``, ``status``, ``pause``, ``resume``, ``cancel``, ``resolve`` and ``export``: a stored run.

``status`` reads the run through :func:`read_run_snapshot` (a read-only
connection, no event loop), so it works while another process drives the run.
The other commands need a :class:`Run` handle, and ``open_run`` needs a
strategy and the run's identity and mode: they are read from the stored
snapshot first (which also means a mistyped RUN_ID is reported instead of
creating an empty run). The handle's strategy is never called, except by
``cancel`` of a provider-batch run with open batches, which asks the provider
to cancel them: through the stored run's own provider (Anthropic's Message
Batches, Gemini's batch mode, else OpenAI's Batch API at ``--base-url``, which
OpenAI-wire runs must pass); otherwise the strategy points at :data:`_NEVER_CALLED`.

Exit status: 0 done; 1 the run refused (a :class:`RunStateError`: pausing a
completed run, resolving when nothing is unresolved) or the operation failed;
2 bad usage (no such database or run, a bad path); 69 the database was
unreachable (:class:`DatabaseUnavailableError` goes up to ``main``, which says so).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Final

import anyio

from .._runs import ProviderBatchConfig, Run, RunSnapshot, list_runs, open_run, read_run_snapshot
from .._runs._reader import read_lease_report
from .._strategies._base import LLMCallStrategy
from .._strategies.openai._compatible import OpenAICompatibleStrategy
from .._values._errors import ArtifactStoreError, BatchLLMError, DatabaseUnavailableError, RunStateError
from ._command import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, api_key_from
from ._export import check_table_out
from ._providers import build_strategy
from ._render import (
    PROG,
    describe,
    redaction_note,
    refuse,
    resolve_hint,
    run_list_line,
    say,
    snapshot_json,
    status_json,
)
from ._runs_db import RunDb

__all__ = ["check_db_path", "control_command", "list_command", "status_command", "stored_snapshot"]

# The discard port on this host: a handle that only controls a run never calls its strategy,
# and if a bug made it call, the connection is refused at once instead of reaching anything.
_NEVER_CALLED: Final = "http://127.0.0.1:9/v1"
_OWN_BATCH_APIS: Final = frozenset({"anthropic", "gemini"})
"""Providers whose batches are cancelled through their own Batch API (their own host by default)."""
_SQLITE_SIDE_FILES: Final = ("-wal", "-shm", "-journal")


# --- reading ------------------------------------------------------------------------------------


def check_db_path(db: RunDb) -> None:
    db.check()


def stored_snapshot(db: RunDb, run_id: str) -> RunSnapshot:
    """The run as stored; :class:`UsageError` if there is no such database or run."""
    db.check()
    if not db.exists():
        raise UsageError(f"{db}: no such run database")
    try:
        return read_run_snapshot(db.target, run_id)
    except RunStateError as exc:  # "no run named ..."
        raise UsageError(str(exc)) from None
    except DatabaseUnavailableError:
        raise  # not a usage error: main() exits with EXIT_UNAVAILABLE
    except ArtifactStoreError as exc:  # not a run database (or not SQLite at all)
        raise UsageError(f"cannot read run {run_id!r}: {exc}") from None


def list_command(args: argparse.Namespace) -> int:
    db = RunDb.of(args.db)
    if db.path is not None and not db.path.is_file():
        say(f"error: {db}: no such run database")
        return EXIT_USAGE
    try:
        snaps = list_runs(db.target)
    except DatabaseUnavailableError:
        raise
    except (ArtifactStoreError, RunStateError) as exc:
        say(f"error: cannot list the runs of {db}: {exc}")
        return EXIT_USAGE
    for snap in snaps:
        if args.json:
            print(json.dumps(snapshot_json(snap), sort_keys=True))
        else:
            print(run_list_line(snap))
    sys.stdout.flush()
    return EXIT_OK


def status_command(args: argparse.Namespace) -> int:
    db = RunDb.of(args.db)
    try:
        snap = stored_snapshot(db, args.run_id)
    except UsageError as exc:
        return refuse(exc)
    try:
        report = read_lease_report(db.target, args.run_id)
    except DatabaseUnavailableError:
        raise
    except (ArtifactStoreError, RunStateError) as exc:
        say(f"error: cannot read the drivers of run {args.run_id!r}: {exc}")
        return EXIT_FAILED
    if args.json:
        print(json.dumps(status_json(snap, report), sort_keys=True), flush=True)
        return EXIT_OK
    print("\n".join(describe(snap)), flush=True)
    if report.working or report.reexecuted:
        print(f"drivers: {report.active} working ({', '.join(report.working) or 'none'}); "
              f"{report.leased} item(s) leased; {report.reexecuted} call(s) made again after their "
              "driver lost its lease mid-call", flush=True)
    if snap.unresolved_submission is not None:
        say(resolve_hint(snap, db) + " (while a create is in flight it is named here too: resolve only "
            "one that stays unresolved)")
    return EXIT_OK


# --- control -----------------------------------------------------------------------------


def _journal_of(out: Path, db: Path) -> bool:
    """Whether ``out`` names one of SQLite's files beside the database ``db`` (as given, or its
    target when it is a link): replacing one would corrupt or roll back the database."""
    names = {os.path.abspath(db), os.path.realpath(db)}
    wanted = {name + suffix for name in names for suffix in _SQLITE_SIDE_FILES}
    return bool({os.path.abspath(out), os.path.realpath(out)} & wanted)


def _check_out(out: Path, db: RunDb) -> None:
    """The ``export`` command's rules for OUT, with the run database (and its journals) as the input."""
    path = db.path
    check_table_out(out, [(path, "the run database")])
    if path is not None and _journal_of(out, path):
        raise UsageError(f"OUT {out} is a journal file of the run database {path}; choose another path")


def _plan_control(args: argparse.Namespace, db: RunDb, snap: RunSnapshot) -> None:
    """The checks that need the stored run; :class:`UsageError` otherwise."""
    api_key_from(getattr(args, "api_key_env", None))  # only `cancel` has the endpoint flags
    if args.runs_command == "cancel" and snap.mode == "provider-batch" and snap.open_submissions \
            and not args.base_url and snap.identity.provider not in _OWN_BATCH_APIS:
        raise UsageError(
            f"run {snap.run_id!r} has {snap.open_submissions} batch(es) open at the provider: pass "
            "--base-url (and the key, see --api-key-env) so that cancel can cancel them there"
        )


async def _open_control(args: argparse.Namespace, db: RunDb, snap: RunSnapshot) -> Run:
    strategy = _control_strategy(args, snap)
    batch = None
    if snap.mode == "provider-batch":
        batch = ProviderBatchConfig(request_timeout=getattr(args, "request_timeout", None) or 120.0)
    # The stored identity and mode: open_run refuses any other. The run exists (stored_snapshot).
    return await open_run(db.target, snap.run_id, strategy, None, mode=snap.mode, identity=snap.identity,
                          batch=batch)


def _control_strategy(args: argparse.Namespace, snap: RunSnapshot) -> LLMCallStrategy[str]:
    """The handle's strategy: the stored run's own provider where ``cancel`` must reach its batches."""
    base_url: str | None = getattr(args, "base_url", None)  # only `cancel` has the endpoint flags
    provider, model = snap.identity.provider, snap.identity.model
    if args.runs_command == "cancel" and snap.mode == "provider-batch" and provider in _OWN_BATCH_APIS:
        # Its key: the one --api-key-env names, else the provider's own variable for its own host only.
        key = api_key_from(args.api_key_env) if args.api_key_env else None
        return build_strategy(provider, model, api=None, base_url=base_url, api_key=key,
                              api_key_env=args.api_key_env, settings={}, concurrency=None)
    # The key --api-key-env names, for any endpoint; without it only OpenAI's API gets OPENAI_API_KEY.
    key = api_key_from(args.api_key_env) if base_url is not None else None
    return OpenAICompatibleStrategy(model, base_url=base_url or _NEVER_CALLED, api_key=key)


async def _control(args: argparse.Namespace, db: RunDb, snap: RunSnapshot) -> list[str]:
    """Do it; the lines to print."""
    command = args.runs_command
    async with await _open_control(args, db, snap) as run:
        if command == "pause":
            after = await run.pause(args.reason)
            resume = shlex.join([PROG, "runs", "resume", str(db), run.run_id])
            return [*describe(after), "paused: a process driving it starts no new call and finishes "
                    f"those in flight; continue with: {resume}{redaction_note(resume)}"]
        if command == "resume":
            after = await run.resume()
            return [*describe(after), "running again: it makes progress while a `runs start` drives it "
                    "(one that is already waiting carries on by itself)"]
        if command == "cancel":
            after = await run.cancel(args.reason)
            return [*describe(after), f"cancelled: its {after.pending} pending item(s) will never run"]
        if command == "resolve":
            before = await run.snapshot()
            after = await run.resolve_submission(created=args.created is not None, batch_id=args.created)
            how = (f"created as batch {args.created}: it is collected like any other" if args.created
                   else "not created: its items go back to pending")
            return [*describe(after), f"resolved submission {before.unresolved_submission}: {how} (at the "
                    "next `runs start`, or by the one driving it)"]
        written = await run.export_jsonl(args.out, after_sequence=args.after)
        last = args.after + written
        span = f" (sequences {args.after + 1} to {last})" if written else ""
        return [f"wrote {written} result(s) to {args.out}{span}"]


def control_command(args: argparse.Namespace) -> int:
    db = RunDb.of(args.db)
    try:
        if args.runs_command == "export":  # before the database is read: reading it may add its -wal/-shm
            _check_out(Path(args.out), db)
        snap = stored_snapshot(db, args.run_id)
        _plan_control(args, db, snap)
    except UsageError as exc:
        return refuse(exc)
    try:
        lines = anyio.run(_control, args, db, snap, backend=args.backend)
    except RunStateError as exc:
        say(f"error: {exc}")
        return EXIT_FAILED
    except DatabaseUnavailableError:
        raise
    except (BatchLLMError, OSError) as exc:
        say(f"error: {args.runs_command} failed: {type(exc).__name__}: {exc}")
        return EXIT_FAILED
    print("\n".join(lines), flush=True)
    return EXIT_OK
