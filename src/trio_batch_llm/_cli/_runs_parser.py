"""``trio-batch-llm runs``: the parser of the durable-run subcommands, and their dispatch.

Subcommands, each on a run ``RUN_ID`` in the SQLite database ``DB``:

* ``start``: create the run from an input file, or reattach to it, and drive it
  (:mod:`._runs_start`);
* ``list``: one line per run in the database;
* ``status``: print its stored snapshot, read-only, while any process drives it;
* ``pause``, ``resume``, ``cancel``: change its status from any process;
* ``resolve``: settle a provider batch create whose outcome is unknown;
* ``export``: write its results to a JSONL file (:mod:`._runs_ops`).

This module only builds the parser, so ``--help`` stays fast: the handlers
import the library's run machinery when they are called. As for ``run``, every
problem with the command line or the input is found before any call and exits
with status 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ._args import (
    KEY_HELP,
    MAX_BATCH_REQUESTS,
    add_backend_argument,
    add_live_arguments,
    add_model_arguments,
    add_request_arguments,
    batch_size,
    non_empty,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from ._cache_flags import add_cache_arguments

__all__ = ["add_runs_parser"]


def _start(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ._runs_start import start_command

    return start_command(args, argv)


def _list(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ._runs_ops import list_command

    return list_command(args)


def _status(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ._runs_ops import status_command

    return status_command(args)


def _control(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ._runs_ops import control_command

    return control_command(args)


DB_HELP = ("the run database: a SQLite file, or PostgreSQL: a postgresql:// URL or a libpq keyword "
           "string ('host=... dbname=...')")


def _parents() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """``DB RUN_ID`` (every subcommand) and ``--backend`` (those that run an event loop)."""
    target = argparse.ArgumentParser(add_help=False)
    target.add_argument("db", metavar="DB", help=DB_HELP)
    target.add_argument("run_id", metavar="RUN_ID", type=non_empty, help="the run's name")
    backend = argparse.ArgumentParser(add_help=False)
    add_backend_argument(backend)
    return target, backend


def _add_start(group: Any, target: argparse.ArgumentParser, backend: argparse.ArgumentParser) -> None:
    start = group.add_parser(
        "start", parents=[target, backend],
        help="create the run from INPUT, or continue it, and drive it",
        description="Create the run RUN_ID in DB from INPUT (.jsonl or .csv, as for `run`), or reattach "
                    "to it if DB already holds it (pass the same INPUT and --model again), and drive it "
                    "until it ends, or for --timeout seconds. In live mode every start of a run drives "
                    "it together with the others, on this machine or others sharing DB (each says how "
                    "many drivers work on it); with --lease-seconds 0, or in provider-batch mode, one "
                    "process drives at a time and a start elsewhere watches, taking over if the "
                    "driver dies. Ctrl+C or SIGTERM "
                    "stops driving at once, as --timeout does: the run stays as it was, and the next "
                    "start continues it. Exit status: 0 completed and every item succeeded; 1 completed "
                    "with failed items, failed or cancelled; 2 bad usage or input; 3 --timeout reached "
                    "(the run goes on at the next start); 69 the database was unreachable (at the start, "
                    "or for longer than --unreachable-timeout while driving; the run goes on at the "
                    "next start); 128 + the signal number when interrupted.",
    )
    add_model_arguments(start)
    add_request_arguments(start)
    start.add_argument("--mode", choices=["live", "provider-batch"], default="live",
                       help="live calls, or the provider's Batch API; fixed when the run is created "
                            "(default live)")
    start.add_argument("--timeout", type=positive_float, metavar="S",
                       help="drive for at most S seconds, then exit with status 3 (the run goes on later)")
    start.add_argument("--unreachable-timeout", type=positive_float, default=60.0, metavar="S",
                       help="ride out a database outage (a PostgreSQL restart, a network cut) of up to "
                            "S seconds: reconnect and carry on; past it exit with status 69 (default 60)")
    live = start.add_argument_group("live mode")
    # no defaults here: None tells _runs_start the flag was not given (refused in provider-batch mode)
    add_live_arguments(live, "--concurrency", "--rpm", "--tpm", "--attempt-timeout")
    live.add_argument("--lease-seconds", type=non_negative_float, metavar="S",
                      help="drivers of one run share it by leasing slices of items, renewed every S/3 s "
                           "while the driver runs, however long its calls take; a driver silent for S s "
                           "(killed, frozen, cut off) loses its items to the others: its calls in flight "
                           "may run twice (counted by `runs status`), results stay exactly-once "
                           "(default 30; 0: one driver at a time, the others watch)")
    add_live_arguments(live, "--max-attempts", "--quota", "--quota-max-in-flight",
                       more_help={"--quota": " (as `run` does): lease drivers of one run then share "
                                             "one quota"})
    add_cache_arguments(start)
    batch = start.add_argument_group("provider-batch mode")
    batch.add_argument("--batch-size", type=batch_size, metavar="N",
                       help=f"requests per batch file (default and maximum {MAX_BATCH_REQUESTS})")
    batch.add_argument("--enqueued-token-limit", type=positive_int, metavar="N",
                       help="the provider's limit on tokens waiting in unfinished batches, shared by "
                            "every run in DB (default: not checked)")
    batch.add_argument("--poll-interval", type=positive_float, metavar="S",
                       help="seconds between looks at each open batch (default 30)")
    batch.add_argument("--request-timeout", type=positive_float, metavar="S",
                       help="bound on every Batch API request (default 120); a create that times out "
                            "has an unknown outcome (see `runs resolve`)")
    start.set_defaults(handler=_start)


def add_runs_parser(sub: Any) -> None:
    """Add ``runs`` and its subcommands to the top-level subparsers ``sub``."""
    runs = sub.add_parser(
        "runs", help="durable runs: start, status, pause, resume, cancel, resolve, export",
        description="Durable runs: named, resumable jobs whose whole state lives in a SQLite database "
                    "(see the guide on durable runs). Any process may drive, watch or control a run.",
    )
    group = runs.add_subparsers(dest="runs_command", required=True, metavar="COMMAND")
    target, backend = _parents()
    _add_start(group, target, backend)

    listing = group.add_parser("list", help="one line per run in DB (read-only; works while runs are driven)")
    listing.add_argument("db", metavar="DB", help=DB_HELP)
    listing.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    listing.set_defaults(handler=_list)

    status = group.add_parser("status", parents=[target],
                              help="print the run's stored state (read-only; works while it is driven)")
    status.add_argument("--json", action="store_true", help="one JSON object instead of text")
    status.set_defaults(handler=_status)

    pause = group.add_parser("pause", parents=[target, backend],
                             help="stop starting calls; calls in flight finish; resumable")
    pause.add_argument("--reason", default="paused from the command line",
                       help="stored with the pause, shown by `runs status`")
    pause.set_defaults(handler=_control)

    resume = group.add_parser("resume", parents=[target, backend],
                              help="make a paused or failed run running again (a start drives it)")
    resume.set_defaults(handler=_control)

    cancel = group.add_parser(
        "cancel", parents=[target, backend], help="end the run for good",
        description="End the run for good: calls in flight are cancelled, pending items never run. "
                    "In provider-batch mode the run's open batches are cancelled at the provider: an "
                    "Anthropic or Gemini run through its own API (its own host unless --base-url), an "
                    "OpenAI-wire run at --base-url, needed then (and the key) when it has open batches.",
    )
    cancel.add_argument("--reason", default="cancelled from the command line",
                        help="stored with the cancel, shown by `runs status`")
    cancel.add_argument("--base-url", help="provider-batch: the endpoint whose open batches to cancel")
    cancel.add_argument("--api-key-env", metavar="NAME", help=KEY_HELP)
    cancel.add_argument("--request-timeout", type=positive_float, default=30.0, metavar="S",
                        help="bound on each cancel request to the provider (default 30)")
    cancel.set_defaults(handler=_control)

    resolve = group.add_parser(
        "resolve", parents=[target, backend],
        help="settle a provider batch create whose outcome is unknown",
        description="Settle the run's batch create whose outcome is unknown (provider-batch mode): "
                    "look for a batch whose metadata trio_batch_llm_submission is the submission id "
                    "`runs status` shows, then say what you found.",
    )
    outcome = resolve.add_mutually_exclusive_group(required=True)
    outcome.add_argument("--created", type=non_empty, metavar="BATCH_ID",
                         help="the batch exists: the provider's batch id; it is collected like any other")
    outcome.add_argument("--not-created", action="store_true",
                         help="no such batch: its items go back to pending and are submitted again")
    resolve.set_defaults(handler=_control)

    export = group.add_parser(
        "export", parents=[target, backend], help="write the run's results to a JSONL file",
        description="Write the run's results to OUT.jsonl, one {\"sequence\": n, \"result\": {...}} per "
                    "line. OUT is never the run database (by name or through a link) nor one of its "
                    "journal files, nor an existing checkpoint or run database (a JSONL checkpoint, a "
                    "SQLite file): export refuses those and changes nothing. An existing table is "
                    "replaced atomically; the new file gets the mode the umask gives (0o666 less the "
                    "umask), as any new file.",
    )
    export.add_argument("out", metavar="OUT.jsonl",
                        help='one {"sequence": n, "result": {...}} per line; replaced atomically (never '
                             "the run database nor a checkpoint)")
    export.add_argument("--after", type=non_negative_int, default=0, metavar="N",
                        help="only results with a sequence above N (default 0: all)")
    export.set_defaults(handler=_control)
