"""What the command line shows: status lines, progress, and the report each command ends with.

The commands decide what happened and which exit status it earns; this
module turns those values into text, so the wording lives in one place and
so does the rule that a key inside a URL is never shown (:func:`say`,
:func:`shown_command`). Standard output carries what a script may read
(summaries, run descriptions, JSON); standard error carries status lines,
each starting ``trio-batch-llm:``.

The progress displays themselves are the library's (``progress=True`` shows
them in any script); the command line only chooses one and tells it the
input's total, which a streaming run does not know.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, final

from .._observe._display import LogProgress, TerminalProgressBar
from .._observe._snapshot import Progress, ProgressSnapshot
from .._values._batch_result import BatchResult
from .._values._cost import (
    BATCH_PRICE_FACTORS,
    DEFAULT_MODEL_RATES,
    DEFAULT_MODEL_RATES_AS_OF,
    price,
    rates_for,
)
from .._values._results import BatchTermination
from .._values._urls import REDACTED, redact_urls
from ._command import EXIT_FAILED, EXIT_USAGE
from ._input_records import InputError

if TYPE_CHECKING:  # only named in annotations: rendering loads neither the runs nor the mock
    from .._runs import RunSnapshot
    from .._runs.repository._leases import LeaseReport
    from ..mock import MockServerStats
    from ._summary import RunSummary

__all__ = [
    "PROG",
    "ProgressMode",
    "announce_drive",
    "describe",
    "drive_progress_line",
    "fail",
    "identity_mismatch_message",
    "progress_display",
    "progress_mode",
    "print_demo_report",
    "print_run_report",
    "redaction_note",
    "refuse",
    "resolve_hint",
    "run_list_line",
    "say",
    "say_input_error",
    "shown_command",
    "snapshot_json",
    "status_json",
]

PROG: Final = "trio-batch-llm"

ProgressMode: TypeAlias = Literal["bar", "log", "off"]


# --- status lines ------------------------------------------------------------------------------


def say(message: str) -> None:
    """A status line for the operator, on stderr; a key inside any URL in it is never shown."""
    print(f"{PROG}: {redact_urls(message)}", file=sys.stderr, flush=True)


def shown_command(argv: Sequence[str]) -> str:
    """``trio-batch-llm ARGS`` as a shell line to paste, with any key inside a URL argument redacted."""
    return shlex.join([PROG, *(redact_urls(arg) for arg in argv)])


def redaction_note(command: str) -> str:
    """What to add to a printed command whose secret was redacted (empty when none was), naming
    where each was: the run database's password (a ``postgresql://`` URL or a libpq ``password=``,
    the DB argument of ``runs``), the flags whose URL held one (``--quota``'s Redis password has no
    environment variable to move to), a key in ``--base-url``."""
    if REDACTED not in command:
        return ""
    # Only here, when a note is due: rendering does not load the runs.
    from .._values._conninfo import is_postgres_store

    try:
        words = shlex.split(command)
    except ValueError:
        words = []
    # --cache's postgresql:// URL is a cache's, not the run database's (which is a positional DB).
    cached = {index + 1 for index, word in enumerate(words) if word == "--cache"}
    database = any(REDACTED in word and is_postgres_store(word) and index not in cached
                   for index, word in enumerate(words))
    flags = [flag for flag, value in itertools.pairwise(words) if flag.startswith("--") and REDACTED in value
             and (flag == "--cache" or not is_postgres_store(value))]
    flags += [word.partition("=")[0] for word in words if word.startswith("--") and "=" in word
              and REDACTED in word.partition("=")[2]]
    keyed = "--base-url" in flags or not (database or flags)  # unparsable: as before, the usual place
    places = (["the run database's password"] if database else []) + [
        f"the password in {flag}" for flag in dict.fromkeys(flags) if flag != "--base-url"]
    if keyed:
        places.append("a key in --base-url")
    if len(places) == 1:
        tail = ""
        if database:
            tail = ", or better, leave it out and let libpq read it from PGPASSWORD or ~/.pgpass"
        elif keyed:
            tail = ", or better, pass it in an environment variable named by --api-key-env"
        return f" ({places[0]} is shown as {REDACTED}: put it back{tail})"
    tips = (["libpq also reads the database's password from PGPASSWORD or ~/.pgpass"] if database else []) + (
        ["the key is better passed in an environment variable named by --api-key-env"] if keyed else [])
    return (f" ({', '.join(places[:-1])} and {places[-1]} are shown as {REDACTED}: put them back"
            + "".join(f"; {tip}" for tip in tips) + ")")


# --- progress ------------------------------------------------------------------------------------


def progress_mode(flag: bool | None, *, off_terminal: ProgressMode = "log") -> ProgressMode:
    """``--progress`` / ``--no-progress`` / neither: a bar, log lines or nothing.

    Without the flag: a bar when stderr is a terminal, else ``off_terminal``.
    """
    if flag is False:
        return "off"
    if flag or sys.stderr.isatty():
        return "bar"
    return off_terminal


def progress_display(mode: ProgressMode, *, total: int | None = None) -> Progress | None:
    """The display for ``mode`` on stderr; ``total`` fills in the count a streaming run's snapshots lack."""
    display: Progress
    if mode == "bar":
        display = TerminalProgressBar(sys.stderr)
    elif mode == "log":
        display = LogProgress()
    else:
        return None
    return display if total is None else _KnownTotal(display, total)


@final
class _KnownTotal(Progress):
    """Fills in the total a streaming run's snapshots lack: the command read the whole input first."""

    def __init__(self, inner: Progress, total: int) -> None:
        self._inner = inner
        self._total = total

    def _fill(self, snapshot: ProgressSnapshot, *, final: bool = False) -> ProgressSnapshot:
        if snapshot.total is not None:
            return snapshot
        # At the close, the items never read are not run, as the summary counts them.
        return snapshot.with_total(self._total, final=final)

    def update(self, snapshot: ProgressSnapshot) -> None:
        self._inner.update(self._fill(snapshot))

    def close(self, final: ProgressSnapshot) -> None:
        self._inner.close(self._fill(final, final=True))

    async def aclose(self, final: ProgressSnapshot) -> None:
        await self._inner.aclose(self._fill(final, final=True))


# --- run and demo --------------------------------------------------------------------------------


def print_run_report(summary: RunSummary, termination: BatchTermination, wall_time: float, out: Path,
                     endpoint: str = "") -> None:
    """The run's summary (after which API it spoke, and where) and which file is which (stdout), then
    its first failure of each kind."""
    print(summary.text(termination, wall_time), flush=True)
    if endpoint:
        print(f"  {endpoint}", flush=True)
    print(f"checkpoint: {out}; a flat table of it: {PROG} export {shlex.quote(str(out))} TABLE.csv",
          flush=True)
    for line in summary.first_failure_lines():
        say(line)


def say_input_error(error: InputError) -> None:
    """Every problem an input check reported, one ``error:`` line each."""
    for line in error.lines():
        say(f"error: {line}")


def refuse(error: object) -> int:
    """``error: ...`` for a command that cannot run as given (an input file's problems one a line,
    as :func:`say_input_error`); the usage exit status, which tells a script nothing was done."""
    if isinstance(error, InputError):
        say_input_error(error)
    else:
        say(f"error: {error}")
    return EXIT_USAGE


def fail(error: BaseException) -> int:
    """``error: the run failed: Type: message``; the failed exit status."""
    say(f"error: the run failed: {type(error).__name__}: {error}")
    return EXIT_FAILED


def identity_mismatch_message(out: Path, provider: str, model: str, error: Exception) -> str:
    """Why ``--resume`` cannot continue ``out``, in the command line's terms (the library's message
    names a Python argument, ``allow_identity_mismatch``, that the command line does not have)."""
    stored = _stored_identity(out)
    if stored is None:
        return f"--out {out} was written for another model ({error})"
    stored_provider, stored_model = stored
    if (stored_provider, stored_model) == (provider, model):
        return (f"--out {out} was written with other request settings (--system, --temperature, "
                "--max-tokens, --response-schema): pass the same ones to continue it, or choose another "
                "--out (answers to other requests are never replayed)")
    return (f"--out {out} was written with --model {stored_provider}:{stored_model}, and this run is "
            f"--model {provider}:{model}: pass --model {stored_provider}:{stored_model} to continue it, "
            "or choose another --out for this model (results of one model are never replayed for another)")


def _stored_identity(path: Path) -> tuple[str, str] | None:
    """The provider and model in a checkpoint's header line, or ``None`` if it cannot be read."""
    try:
        with path.open("rb") as f:
            header = json.loads(f.readline(1 << 16))
        identity = header["identity"]
        provider, model = identity["provider"], identity["model"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (provider, model) if isinstance(provider, str) and isinstance(model, str) else None


def print_demo_report(batch: BatchResult[Any], mock: MockServerStats) -> None:
    """The demo's batch summary and what the mock server answered."""
    print(batch.summary())
    print(f"mock server: {mock.requests} requests, {mock.rate_limited} answered 429, "
          f"{mock.server_errors} answered 5xx", flush=True)


# --- durable runs --------------------------------------------------------------------------------


def _cost_lines(snap: RunSnapshot) -> list[str]:
    """A run's cost by the built-in rates of its model, when they have it. The run keeps token
    totals without the cached part, so cached input is priced as input: an upper bound. A provider
    batch is billed at its provider's batch fraction of those rates (:data:`BATCH_PRICE_FACTORS`);
    without a known one, no line."""
    rates = rates_for(snap.identity.model, DEFAULT_MODEL_RATES)
    factor = 1.0 if snap.mode == "live" else BATCH_PRICE_FACTORS.get(snap.identity.provider)
    if rates is None or factor is None or not (snap.input_tokens or snap.output_tokens):
        return []
    cost = price(rates, {"input_tokens": snap.input_tokens, "output_tokens": snap.output_tokens})
    assert cost is not None
    basis = "" if snap.mode == "live" else f"{snap.identity.provider} batch price, {factor:.0%} of standard; "
    return [f"  cost: at most ${cost * factor:.4f} estimated ({basis}built-in rates of "
            f"{DEFAULT_MODEL_RATES_AS_OF}; cached input priced as input)"]


def _since_lines(snap: RunSnapshot, before: RunSnapshot | None) -> list[str]:
    """What a ``runs start`` that continued a run added (by every driver meanwhile), apart from what
    was done before it: the totals above are the run's, so adding them up over starts would count the
    earlier items, and their tokens, again."""
    if before is None or before.done <= 0:
        return []
    return [f"  this start: done {snap.done - before.done} (succeeded {snap.succeeded - before.succeeded}, "
            f"failed {snap.failed - before.failed}), tokens {snap.total_tokens - before.total_tokens:,}; "
            f"done before it: {before.done} (tokens {before.total_tokens:,}): add up starts by these lines, "
            "not the totals"]


def describe(snap: RunSnapshot, *, before: RunSnapshot | None = None) -> list[str]:
    """The snapshot as lines for an operator; ``before``: the run as a ``runs start`` found it, so
    that what it added is said apart (:func:`_since_lines`)."""
    status: str = snap.status
    if snap.termination is not None and snap.termination.kind != snap.status:
        status += f" ({snap.termination.kind})"
    if snap.termination is not None and snap.termination.reason:
        status += f": {snap.termination.reason}"
    read = ("input fully read" if snap.ingestion_complete
            else f"input read to entry {snap.checkpoint.position}")
    lines = [
        f"run {snap.run_id}: {status}",
        f"  mode {snap.mode}, model {snap.identity.provider}:{snap.identity.model}",
        f"  items {snap.items} ({read}): done {snap.done} (succeeded {snap.succeeded}, "
        f"failed {snap.failed}), pending {snap.pending}",
        f"  tokens: input {snap.input_tokens}, output {snap.output_tokens}, total {snap.total_tokens}",
        *_cost_lines(snap),
        *_since_lines(snap, before),
        f"  results: {snap.last_sequence} (sequences 1 to {snap.last_sequence})" if snap.last_sequence
        else "  results: none yet",
    ]
    if snap.mode == "provider-batch":
        lines.append(f"  provider batches open: {snap.open_submissions} (holding {snap.batched} item(s))")
        if snap.unresolved_submission is not None:
            lines.append(f"  unresolved batch create: submission {snap.unresolved_submission}")
    lines.append(f"  created {snap.created_at}, updated {snap.updated_at}")
    return lines


def snapshot_json(snap: RunSnapshot) -> dict[str, Any]:
    """The snapshot as ``--json`` prints it: every field, and the derived ones."""
    data = dataclasses.asdict(snap)
    data.update(pending=snap.pending, ingestion_complete=snap.ingestion_complete, terminal=snap.terminal)
    return data


def status_json(snap: RunSnapshot, report: LeaseReport) -> dict[str, Any]:
    """``runs status --json``: the snapshot's fields, plus ``total`` and who drives the run.

    ``drivers`` lists the run's leases (newest 100), each with ``driver_id`` (host:pid:tag),
    ``items_done``, ``last_heartbeat`` (ISO 8601, UTC) and ``state`` (active, expired, stopped);
    ``reexecuted_after_lease_expiry`` counts the calls made again because the driver that had
    started them never recorded their result (its lease expired, it was killed or cut short):
    the only at-least-once case, counted call by call, not items held."""
    data = snapshot_json(snap)
    data.update(
        total=snap.items,
        leased=report.leased,
        reexecuted_after_lease_expiry=report.reexecuted,
        drivers=[
            {"driver_id": d.driver_id, "items_done": d.items_done, "last_heartbeat": _iso(d.last_heartbeat),
             "state": d.state, "lease": d.token}
            for d in report.drivers
        ],
    )
    return data


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat()


def run_list_line(snap: RunSnapshot) -> str:
    """One tab-separated line of ``runs list``."""
    return (f"{snap.run_id}\t{snap.status}\t{snap.mode}\t{snap.done}/{snap.items} done"
            f"\t{snap.failed} failed" + ("" if snap.ingestion_complete else "\tingesting"))


def resolve_hint(snap: RunSnapshot, db: object) -> str:
    """How to settle the run's batch create whose outcome is unknown."""
    base = shlex.join([PROG, "runs", "resolve", str(db), snap.run_id])
    return (f"a batch create's outcome is unknown: look for a batch whose metadata "
            f"trio_batch_llm_submission is {snap.unresolved_submission}, then run: "
            f"{base} --created BATCH_ID  (or --not-created)")


def drive_progress_line(snap: RunSnapshot) -> str:
    """The line ``runs start`` says every few seconds while it drives."""
    return (f"run {snap.run_id}: {snap.status}, {snap.done}/{snap.items} done "
            f"({snap.succeeded} succeeded, {snap.failed} failed)")


def announce_drive(run_id: str, db: object, mode: str, existing: RunSnapshot | None,
                   timeout: float | None) -> None:
    """What ``runs start`` is about to do: start the run, or continue it (and what it waits for)."""
    if existing is None:
        say(f"starting run {run_id} in {db} ({mode})")
        return
    say(f"continuing run {run_id} in {db}: {existing.status}, {existing.done}/{existing.items} done")
    if existing.status == "paused":
        say(f"it is paused: this waits for `{PROG} runs resume {db} {run_id}`"
            + (f" or {timeout} s" if timeout else " (Ctrl+C to stop waiting)"))
    elif existing.status == "failed":
        say(f"it failed: `{PROG} runs resume {db} {run_id}` makes it running again")
