"""The ``trio-batch-llm`` command line's entry: the parser, library logging on stderr, the dispatch.

Each command lives in its own module, imported only when it runs (so
``--help`` stays fast): ``run`` in :mod:`._run` (its input file in
:mod:`._input`), ``export`` in :mod:`._export`, ``runs`` in
:mod:`._runs_parser` (then :mod:`._runs_start` and :mod:`._runs_ops`),
``demo`` in :mod:`._demo`; ``serve-mock`` is the small handler below.
The argument checks are in :mod:`._args`, everything the commands print in
:mod:`._render`. Every command checks its arguments before
doing anything; a bad one exits with status 2. A run database that cannot be
reached (:class:`DatabaseUnavailableError`, from any command) exits with
status 69, ``EX_UNAVAILABLE``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator, Sequence

from ._args import (
    add_backend_argument,
    add_live_arguments,
    add_model_arguments,
    add_progress_argument,
    add_request_arguments,
    limit_change,
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
    probability,
    wait_bound,
)
from ._cache_cmd import add_cache_parser
from ._cache_flags import add_cache_arguments
from ._command import EXIT_UNAVAILABLE
from ._runs_parser import add_runs_parser

__all__ = ["build_parser", "main"]


def _run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ._run import run_command

    return run_command(args, argv)


def _export(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ._export import export_command

    return export_command(args)


def _demo(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ._demo import run_demo

    return run_demo(items=args.items, concurrency=args.concurrency, backend=args.backend,
                    progress=args.progress)


def _retry_hints(chosen: list[str] | None) -> tuple[str, ...]:
    """``--retry-hint`` as ``MockServerConfig.retry_after_headers`` (``none`` alone: no hint)."""
    if not chosen:
        return ("retry-after",)
    return tuple(dict.fromkeys(h for h in chosen if h != "none"))


def _serve_mock(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .._values._errors import ConfigurationError
    from ..mock import MockServerConfig, run_mock_server

    latency: float | tuple[float, float] = args.latency
    if args.latency_max is not None:
        latency = (args.latency, args.latency_max)
    try:
        config = MockServerConfig(
            latency=latency, rate_limit_rate=args.rate_limit_rate, retry_after=args.retry_after,
            server_error_rate=args.server_error_rate, hang_rate=args.hang_rate, rpm_limit=args.rpm_limit,
            tpm_limit=args.tpm_limit, output_tokens=args.output_tokens, seed=args.seed, api_key=args.api_key,
            model=args.model, ratelimit_headers=args.ratelimit_headers,
            limit_schedule=tuple(sorted(args.limit_change or ())),
            calendar_rpm_limit=args.calendar_rpm_limit,
            retry_after_headers=_retry_hints(args.retry_hint), spend_limit_after=args.spend_limit_after,
            input_tpm_limit=args.input_tpm_limit, output_tpm_limit=args.output_tpm_limit,
            gemini_daily_request_limit=args.gemini_daily_limit,
            gemini_min_cache_tokens=args.gemini_min_cache_tokens,
        )
    except ConfigurationError as exc:
        print(f"trio-batch-llm serve-mock: error: {exc}", file=sys.stderr)
        return 2

    def ready(server: object) -> None:
        print(getattr(server, "base_url"), flush=True)  # noqa: B009 - the first line, the one scripts read
        for name, url in getattr(server, "base_urls").items():  # noqa: B009 - then each dialect's
            print(f"{name:<10} {url}", flush=True)

    run_mock_server(args.host, args.port, config, backend=args.backend, on_ready=ready)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trio-batch-llm", description="Run many LLM calls concurrently.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="run every prompt of a JSONL or CSV file; --out is the checkpoint (see export)",
        description="Run every prompt of INPUT (.jsonl: objects with id, prompt, context, or strings; "
                    ".csv: id,prompt columns). INPUT is checked whole before the first call, then read "
                    "as the run goes. --out is the run's checkpoint: a header line, then one JSON "
                    "record per result, written as it finishes (after a resume an item may have "
                    "several; the last one counts). --resume continues an interrupted run from it. "
                    "For a flat table of the results (one row per id: JSONL, CSV or Parquet) run "
                    "`trio-batch-llm export CHECKPOINT OUT`. Ctrl+C once stops admission and drains "
                    "the calls in flight; twice abandons them.",
    )
    add_model_arguments(run)  # INPUT, --model, --base-url, --api-key-env (shared with `runs start`)
    add_request_arguments(run)
    run.add_argument("--out", required=True, metavar="CHECKPOINT.jsonl",
                     help="the checkpoint: every result as it finishes, what --resume continues "
                          "(not a flat table: see `trio-batch-llm export`)")
    add_live_arguments(run, "--concurrency", "--rpm", "--tpm", "--quota", "--quota-max-in-flight",
                       "--attempt-timeout", "--max-attempts",
                       defaults={"--concurrency": 16, "--attempt-timeout": 120.0})
    run.add_argument("--batch-timeout", type=positive_float, metavar="S",
                     help="seconds the whole run may take")
    run.add_argument("--max-rate-limit-wait", type=wait_bound, default=600.0, metavar="S",
                     help="seconds one item may wait throttled by 429s before it fails rate_limit "
                          "(default 600; none: no bound)")
    run.add_argument("--circuit-breaker", type=non_negative_int, default=10, metavar="N",
                     help="stop the run when N attempts in a row find the endpoint unusable (connection "
                          "refused, DNS or TLS failure, HTTP 401/403, 404 on the model) and a probe "
                          "after a pause fails too; exit code 69 (default 10; 0: off)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run recorded in --out: keep its successes, run the rest")
    run.add_argument("--resume-policy", choices=["successes", "all"], metavar="successes|all",
                     help="what --resume keeps (implies --resume): successes (the default), or all, "
                          "which also keeps failures that would fail again (invalid request, context "
                          "length, content policy)")
    add_cache_arguments(run)
    add_backend_argument(run)
    add_progress_argument(run, "; otherwise a plain progress line every 10 s")
    run.set_defaults(handler=_run)

    export = sub.add_parser(
        "export", help="write a checkpoint's results as a flat table: one row per item id",
        description="Write the results in CHECKPOINT (the --out of `run`, or any JSONL or SQLite "
                    "checkpoint store) to OUT as a flat table: one row per item id, the last record "
                    "of an id winning (a resume supersedes earlier records), in input order, with the "
                    "columns id, success, output, error, error_category, stop_reason, attempts, "
                    "input_tokens, output_tokens, total_tokens, execution_seconds and context. Object "
                    "outputs (--response-schema) become output.<field> columns and object contexts (a "
                    "CSV input's own columns) columns of their own, typed (see --no-flatten); other "
                    "values that are not text are written as JSON. OUT is replaced only once it is "
                    "complete, with the mode "
                    "the umask gives a new file. OUT is never CHECKPOINT, --prompts INPUT or another "
                    "checkpoint (links to one included): export only replaces a table.",
    )
    export.add_argument("checkpoint", metavar="CHECKPOINT", help="the checkpoint file to read")
    export.add_argument("out", metavar="OUT", help="the table to write")
    export.add_argument("--format", choices=["jsonl", "csv", "parquet"], metavar="jsonl|csv|parquet",
                        help="the table's format (default: from OUT's extension; parquet needs "
                             "pyarrow: pip install 'trio-batch-llm[parquet]')")
    export.add_argument("--prompts", metavar="INPUT",
                        help="add a prompt column, taken from INPUT (the file `run` read), matched by "
                             "id; the rows then follow INPUT's order")
    export.add_argument("--order", choices=["input", "completion"], default="input",
                        metavar="input|completion",
                        help="the rows' order: input (the default): the order of --prompts INPUT, else the "
                             "order each id was first recorded (a checkpoint keeps no input order; a run "
                             "starts items in input order, so this is close to it); completion: the order "
                             "in which "
                             "each id's last result was written")
    export.add_argument("--flatten", action=argparse.BooleanOptionalAction, default=True,
                        help="spread object outputs (--response-schema) into output.<field> columns (nested "
                             "fields dotted, lists kept as JSON) and object contexts (a CSV input's own "
                             "columns) into columns named by their keys (input.<name> where a name is one of "
                             "the table's own), each with one type: numbers stay numbers (default); "
                             "--no-flatten keeps one JSON cell each in output and context")
    export.set_defaults(handler=_export)

    add_runs_parser(sub)
    add_cache_parser(sub)

    demo = sub.add_parser("demo", help="run a batch against the built-in mock server; no key needed")
    demo.add_argument("--items", type=positive_int, default=200, help="prompts to run (default 200)")
    demo.add_argument("--concurrency", type=positive_int, default=32, help="calls in flight (default 32)")
    add_backend_argument(demo)
    add_progress_argument(demo)
    demo.set_defaults(handler=_demo)

    serve = sub.add_parser(
        "serve-mock", help="serve the mock provider server (OpenAI, Anthropic, ... dialects) until Ctrl+C",
        description="Serve the mock provider server on HOST:PORT until Ctrl+C: OpenAI's chat "
                    "completions, responses, models, files and batches, Anthropic's messages, and the "
                    "other dialects it speaks, all on one port. It prints the OpenAI base URL, then each "
                    "dialect's base URL on a line of its own. It echoes "
                    "each prompt back; the options below make it slow or faulty on purpose. "
                    "Probabilities are per request, from 0 to 1, drawn from --seed.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=port, default=8000,
                       help="the port to listen on (default 8000; 0 lets the system choose)")
    add_backend_argument(serve, "the event loop the server runs on (default trio)")
    serve.add_argument("--latency", type=non_negative_float, default=0.0, metavar="S",
                       help="seconds before each answer (default 0)")
    serve.add_argument("--latency-max", type=non_negative_float, metavar="S",
                       help="draw each latency uniformly from [--latency, --latency-max]")
    serve.add_argument("--rate-limit-rate", type=probability, default=0.0, metavar="P",
                       help="probability of answering 429 Too Many Requests (default 0)")
    serve.add_argument("--retry-after", type=non_negative_float, default=1.0, metavar="S",
                       help="the Retry-After seconds sent with an injected 429 or 503 (default 1)")
    serve.add_argument("--server-error-rate", type=probability, default=0.0, metavar="P",
                       help="probability of answering 500 (default 0)")
    serve.add_argument("--hang-rate", type=probability, default=0.0, metavar="P",
                       help="probability of never answering, until the client gives up (default 0)")
    serve.add_argument("--rpm-limit", type=positive_int, metavar="N",
                       help="requests per minute the server enforces: a request over it gets 429 with "
                            "the exact wait (default: none)")
    serve.add_argument("--tpm-limit", type=positive_int, metavar="N",
                       help="tokens per minute the server enforces, the same way (default: none)")
    serve.add_argument("--input-tpm-limit", type=positive_int, metavar="N",
                       help="input tokens per minute, enforced apart as Anthropic's ITPM (its cache reads "
                            "count none; default: none)")
    serve.add_argument("--output-tpm-limit", type=positive_int, metavar="N",
                       help="output tokens per minute, enforced apart as Anthropic's OTPM (default: none)")
    serve.add_argument("--ratelimit-headers", action="store_true",
                       help="send each dialect's rate-limit headers (OpenAI's x-ratelimit-*, Anthropic's "
                            "anthropic-ratelimit-*) computed from the enforced limits")
    serve.add_argument("--calendar-rpm-limit", type=positive_int, metavar="N",
                       help="requests per calendar minute (counted from each :00) the server enforces, "
                            "as some gateways do: a request over it gets a 429 that tells nothing, no "
                            "Retry-After and no rate-limit headers (default: none)")
    serve.add_argument("--retry-hint", choices=["retry-after", "llm_provider-retry-after", "none"],
                       action="append", metavar="HEADER",
                       help="the header that carries a wait: retry-after (Retry-After and retry-after-ms, "
                            "the default), llm_provider-retry-after (as LiteLLM's proxy sends it), or "
                            "none; repeatable")
    serve.add_argument("--limit-change", type=limit_change, action="append", metavar="AT:RPM:TPM",
                       help="from AT seconds after the first request, enforce these limits (empty: none); "
                            "repeatable")
    serve.add_argument("--output-tokens", type=positive_int, metavar="N",
                       help="answer N seeded words (N completion tokens) instead of echoing the prompt")
    serve.add_argument("--seed", type=int, default=0, help="the seed of every random draw (default 0)")
    serve.add_argument("--api-key", metavar="KEY",
                       help="require KEY where each dialect carries it (OpenAI: Authorization: Bearer KEY; "
                            "Anthropic: x-api-key or Bearer), else 401")
    serve.add_argument("--spend-limit-after", type=non_negative_int, metavar="N",
                       help="after N successful answers, refuse every request as a spent limit does "
                            "(Anthropic: 429 enforced_spend_limit_reached; OpenAI: insufficient_quota)")
    serve.add_argument("--model", help="the model name /v1/models lists (answers echo the requested model)")
    serve.add_argument("--gemini-daily-limit", type=positive_int, metavar="N",
                       help="Gemini requests per day: past N, each gets the per-day 429 (default: none)")
    serve.add_argument("--gemini-min-cache-tokens", type=positive_int, default=1, metavar="N",
                       help="refuse Gemini context caches under N tokens, as Google does (default 1)")
    serve.set_defaults(handler=_serve_mock)
    return parser


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's own convention
            self.handleError(record)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        return f"trio-batch-llm: {level}{record.getMessage()}"


@contextlib.contextmanager
def _cli_logging() -> Iterator[None]:
    """Library warnings and progress lines on stderr for the duration of a command, then as before."""
    package = logging.getLogger("trio_batch_llm")
    progress = logging.getLogger("trio_batch_llm.progress")
    saved = (package.level, package.propagate, progress.level)
    handler = _StderrHandler()
    handler.setFormatter(_Formatter())
    package.addHandler(handler)
    package.setLevel(logging.WARNING)
    package.propagate = False
    progress.setLevel(logging.INFO)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(saved[0])
        package.propagate = saved[1]
        progress.setLevel(saved[2])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (``argv`` defaults to ``sys.argv[1:]``)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(args_list)
    except SystemExit as exc:  # argparse printed the problem (or --help)
        return exc.code if isinstance(exc.code, int) else 2
    from .._values._errors import DatabaseUnavailableError

    with _cli_logging():
        try:
            return int(args.handler(args, args_list))
        except DatabaseUnavailableError as exc:
            from ._render import say

            say(f"error: the run database is unreachable: {exc}")
            return EXIT_UNAVAILABLE
        except KeyboardInterrupt:
            from ._terminal import end_echoed_ctrl_c

            end_echoed_ctrl_c(signal.SIGINT)
            print("trio-batch-llm: interrupted", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
