"""``trio-batch-llm run``: check everything, run the batch, stop cleanly on signals.

Everything that can be wrong with the command is found before the first
call and before the output file is touched (exit status 2): the input file
is checked whole in a first pass (:func:`scan_input`) that keeps only a hash
per id, then read again item by item as the run takes them, so neither the
input nor the results are ever all in memory; the summary is counted as
results arrive (:class:`RunSummary`). The output file *is* the checkpoint:
a :class:`JsonlArtifactStore` under the identity ``(provider, model)`` plus
fingerprints of the request flags (``--system`` and the others), so
``--resume`` continues it with ``--resume-policy`` (``successes``, the
default: stored successes are replayed, everything else runs again; ``all``:
terminal failures are replayed too), and a later record for an item
supersedes an earlier one. ``trio-batch-llm export`` turns it into a flat table.

Signals (SIGINT, SIGTERM), received by a task of the run's own task group:

1. the first stops admission: nothing new starts, calls in flight finish and
   are checkpointed, queued items are recorded as not executed; the summary
   and the command that resumes are printed;
2. the second abandons the calls in flight (the run's scope is cancelled, so
   the processor closes in contract order with that cancellation deferred)
   and forces a close already in flight (``force_close()``, CONTRACT C3);
3. any further one forces the close again.

Exit status: 0 every item succeeded; 1 some failed or a guardrail stopped the
batch; 2 bad usage or input; 128 + the signal number when interrupted (130
for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

import anyio
import anyio.lowlevel

from .._artifacts import JsonlArtifactStore
from .._core._ledger import unwrap_group
from .._engine._processor import ParallelBatchProcessor
from .._strategies._base import LLMCallStrategy
from .._values._config import ArtifactIdentity, GuardrailConfig, ProcessorConfig, ResumePolicy, RetryConfig
from .._values._errors import (
    AdmissionClosedError,
    ArtifactMismatchError,
    BatchLLMError,
    ConfigurationError,
    QuotaBackendError,
)
from .._values._quota_backend import RedisQuotaBackend
from .._values._requests import LLMWorkItem, request_of_text
from .._values._results import BatchTermination
from .._values._stop_reasons import StopReason
from ._args import quota_backend
from ._cache_flags import CacheCheckError, cache_mode_of, cache_of, check_cache, check_cache_path
from ._command import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    UsageError,
    api_key_from,
    circuit_breaker_of,
    signal_receiver,
)
from ._input import InputError, InputScan, iter_input, scan_input
from ._providers import api_note, build_strategy, endpoint_line
from ._render import (
    ProgressMode,
    fail,
    identity_mismatch_message,
    print_run_report,
    progress_display,
    progress_mode,
    redaction_note,
    refuse,
    say,
    say_input_error,
    shown_command,
)
from ._request_flags import checkpoint_identity, request_settings
from ._summary import RunSummary
from ._terminal import end_echoed_ctrl_c

__all__ = ["RESUME_POLICIES", "RunPlan", "check_quota", "plan_run", "run_command"]

RESUME_POLICIES: Final = {"successes": ResumePolicy.REUSE_SUCCESSES, "all": ResumePolicy.REUSE_ALL}


@final
@dataclass(frozen=True, slots=True)
class RunPlan:
    scan: InputScan
    provider: str
    model: str
    strategy: LLMCallStrategy[str]
    identity: ArtifactIdentity
    out: Path
    config: ProcessorConfig
    resume: ResumePolicy
    backend: str
    progress: ProgressMode
    resume_command: str
    endpoint: str = ""
    """Which API the run speaks, and where (the summary's first line)."""
    api_note: str | None = None
    """Said before the first call: ``openai:``'s default API spoken to another endpoint (issue 35)."""

    @property
    def source(self) -> Path:
        return self.scan.path


def _check_out(out: Path, source: Path, *, resume: bool) -> None:
    if out.exists() and not out.is_file():
        raise UsageError(f"--out {out}: not a regular file")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: the directory {out.parent} does not exist")
    if out.exists() and source.exists() and out.samefile(source):
        raise UsageError(f"--out {out} is the input file; choose another path")
    if not resume and out.exists() and out.stat().st_size > 0:
        raise UsageError(
            f"--out {out} already exists and is not empty: pass --resume to continue that run "
            "(its successes are kept, the rest runs again), or choose another --out"
        )


def _resume_command(argv: Sequence[str]) -> str:
    args = list(argv)
    if "--resume" not in args:
        args.append("--resume")
    return shown_command(args)


def plan_run(args: argparse.Namespace, argv: Sequence[str]) -> RunPlan:
    """Everything the run needs, checked; :class:`UsageError` (or :class:`InputError`) otherwise."""
    source, out = Path(args.input), Path(args.out)
    resume_policy = getattr(args, "resume_policy", None)
    resume = bool(args.resume or resume_policy)  # a policy says how to resume: it implies --resume
    quota = quota_backend(getattr(args, "quota", None), getattr(args, "quota_max_in_flight", None))
    cache = cache_of(args)
    _check_out(out, source, resume=resume)
    check_cache_path(cache, source=source, out=out)
    scan = scan_input(source)
    provider, model = args.model
    # With --api-key-env the key is that variable's, for any endpoint; without it the strategy's own
    # rule applies: each provider's key goes only to its own API, and another --base-url gets no key.
    strategy = build_strategy(provider, model, api=getattr(args, "api", None), base_url=args.base_url,
                              api_key=api_key_from(args.api_key_env), api_key_env=args.api_key_env,
                              settings=request_settings(args), concurrency=args.concurrency)
    try:
        config = ProcessorConfig(
            concurrency=args.concurrency,
            attempt_timeout=args.attempt_timeout,
            max_requests_per_minute=args.rpm,
            max_tokens_per_minute=args.tpm,
            quota_backend=quota,
            # Bounded, so a huge input is read only as fast as it runs and a stop leaves few queued items.
            max_queue_size=max(2 * args.concurrency, 64),
            guardrails=GuardrailConfig(batch_timeout=args.batch_timeout),
            retry=RetryConfig(max_attempts=getattr(args, "max_attempts", None) or 3,
                              max_rate_limit_wait=getattr(args, "max_rate_limit_wait", 600.0)),
            circuit_breaker=circuit_breaker_of(getattr(args, "circuit_breaker", 10)),
            cache=cache, cache_mode=cache_mode_of(args),
        )
    except (ConfigurationError, ImportError) as exc:
        raise UsageError(str(exc)) from None
    policy = RESUME_POLICIES[resume_policy or "successes"] if resume else ResumePolicy.NONE
    try:
        identity = checkpoint_identity(provider, model, strategy)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    return RunPlan(
        scan=scan, provider=provider, model=model, strategy=strategy, identity=identity, out=out,
        config=config,
        resume=policy, backend=args.backend, progress=progress_mode(args.progress),
        resume_command=_resume_command(argv), endpoint=endpoint_line(provider, model, strategy),
        api_note=api_note(provider, model, getattr(args, "api", None), strategy),
    )


def run_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    try:
        plan = plan_run(args, argv)
    except (InputError, UsageError) as exc:
        return refuse(exc)
    if plan.api_note:
        say(plan.api_note)
    outcome = _RunOutcome(plan.scan.items, plan.model)
    try:
        anyio.run(_run_batch, plan, outcome, backend=plan.backend)
    except ArtifactMismatchError as exc:
        if not outcome.opened:  # --resume on a file written for another model: say which flag
            return refuse(identity_mismatch_message(plan.out, plan.provider, plan.model, exc))
        return fail(exc)
    except QuotaBackendError as exc:  # before the checkpoint was made: refused by check_quota
        return fail(exc) if outcome.opened else refuse(f"--quota: {exc}")
    except CacheCheckError as exc:  # refused by check_cache, before the checkpoint was made
        return refuse(exc)
    except (BatchLLMError, OSError) as exc:
        return fail(exc) if outcome.opened else refuse(f"cannot use --out {plan.out}: {exc}")
    if outcome.input_error is not None:
        say_input_error(outcome.input_error)
        say(f"the input changed while the run read it; the {outcome.summary.results:,} result(s) so far "
            f"are kept in {plan.out}: fix the file, then: {plan.resume_command}"
            f"{redaction_note(plan.resume_command)}")
        return EXIT_FAILED
    return _report(plan, outcome)


# --- the run ---------------------------------------------------------------------


@final
class _RunOutcome:
    """What the run produced, and what its signal task decided."""

    def __init__(self, total: int, model: str | None = None) -> None:
        self.opened = False
        self.summary = RunSummary(total, model=model)
        self.input_error: InputError | None = None
        self.termination = BatchTermination()
        self.wall_time = 0.0
        self.signal: signal.Signals | None = None
        self.forced = False
        self.abandoned = 0
        self.processor: ParallelBatchProcessor[Any] | None = None
        self.run_scope: anyio.CancelScope | None = None

    # --- the signal task ---------------------------------------------------------

    async def watch_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            self.on_signal(signal.Signals(signum))

    def on_signal(self, sig: signal.Signals) -> None:
        end_echoed_ctrl_c(sig)  # the message below starts its own line, not after the terminal's ^C
        if self.signal is None:
            self.signal = sig
            self._stop_admission()
        elif not self.forced:
            self.forced = True
            self.abandoned = self._in_flight()
            say(f"second {sig.name}: forced stop: abandoning {self.abandoned} call(s) in flight "
                "(they get no result; --resume runs them again)")
            if self.processor is not None:
                self.processor.force_close()  # a close already in flight is aborted (CONTRACT C3.3)
            if self.run_scope is not None:
                self.run_scope.cancel(reason=f"forced stop by a second {sig.name}")
        elif self.processor is not None:
            say(f"{sig.name} again: forcing the close")
            self.processor.force_close()

    def attach(self, processor: ParallelBatchProcessor[Any]) -> None:
        self.processor = processor
        if self.signal is not None:  # the signal came while the store was opening
            self._stop_admission()

    def _in_flight(self) -> int:
        if self.processor is None:
            return 0
        stats = self.processor.statistics()
        # An item handed to add_work() but not yet queued counts as accepted: cap at the workers.
        return max(0, min(stats.workers, stats.counters.accepted - stats.counters.finished - stats.queued))

    def _stop_admission(self) -> None:
        processor, sig = self.processor, self.signal
        if processor is None or sig is None:
            return
        processor.request_stop(f"interrupted by {sig.name}")
        say(f"{sig.name}: stopping: no new calls start; waiting for {self._in_flight()} call(s) in flight "
            "to finish (press Ctrl+C again to abandon them)")


async def _feed(processor: ParallelBatchProcessor[str], plan: RunPlan, outcome: _RunOutcome) -> None:
    """Read the input again, one record at a time, as the bounded queue takes them.

    The file was checked whole before the run; reading it is a few MiB of
    blocking reads from the page cache at a time, between the queue's waits.
    """
    try:
        for record in iter_input(plan.source):
            prompt, params = request_of_text(record.prompt)  # a row with messages/params: unpacked
            await processor.add_work(
                LLMWorkItem(item_id=record.item_id, strategy=plan.strategy, prompt=prompt,
                            context=record.context, params=params, sample=record.sample)
            )
    except AdmissionClosedError:
        pass  # a stop (a signal, a guardrail) closed admission; the rest is for --resume
    except InputError as exc:  # the file changed since it was checked: stop, keep what finished
        outcome.input_error = exc
        processor.request_stop("the input file changed while the run read it",
                               stop_reason=StopReason.FAIL_FAST)
        await anyio.lowlevel.checkpoint()
    await processor.finish()


QUOTA_WAIT_SAID_AFTER: Final = 1.0
"""Seconds without an answer from ``--quota``'s server before the command line says it waits for it."""


async def check_quota(backend: RedisQuotaBackend | None) -> None:
    """``--quota``: one ``PING`` before the checkpoint is made, so that a wrong password, a database
    the server lacks or a server that stays unreachable is a usage error, not a failed run. A server
    that does not answer at once is said to be waited for (up to its ``unreachable_timeout``)."""
    if backend is None:
        await anyio.lowlevel.checkpoint()
        return
    from .._admission._redis_link import check_backend

    async def say_waiting() -> None:
        await anyio.sleep(QUOTA_WAIT_SAID_AFTER)
        say(f"waiting for the quota backend {backend.display_url}: it does not answer"
            f" (giving up after {backend.unreachable_timeout:g} s)")

    with unwrap_group():
        async with anyio.create_task_group() as waiting:
            waiting.start_soon(say_waiting, name="say that the quota backend is waited for")
            await check_backend(backend)
            waiting.cancel_scope.cancel(reason="the quota backend answered")


async def _run_batch(plan: RunPlan, outcome: _RunOutcome) -> None:
    await check_quota(plan.config.quota_backend)
    await check_cache(plan.config.response_cache)
    store = JsonlArtifactStore(plan.out, identity=plan.identity)
    started = anyio.current_time()
    with unwrap_group(), signal_receiver() as signals:
        async with anyio.create_task_group() as run_group:
            if signals is not None:
                run_group.start_soon(outcome.watch_signals, signals, name="signal watcher")
            with anyio.CancelScope() as run_scope:
                outcome.run_scope = run_scope
                processor: ParallelBatchProcessor[str] = ParallelBatchProcessor(
                    plan.config, progress_callback=progress_display(plan.progress, total=plan.scan.items),
                    artifact_store=store, resume=plan.resume,
                )
                async with processor:
                    outcome.opened = True
                    outcome.attach(processor)
                    processor.start()
                    add = outcome.summary.add
                    async with anyio.create_task_group() as feeding:
                        feeding.start_soon(_feed, processor, plan, outcome)
                        async for result in processor.results():
                            add(result)  # counted, then dropped: the checkpoint holds it
                    outcome.termination = processor.termination
            outcome.wall_time = anyio.current_time() - started
            run_group.cancel_scope.cancel(reason="the run finished")


# --- the report --------------------------------------------------------------------


def _report(plan: RunPlan, outcome: _RunOutcome) -> int:
    termination = outcome.termination
    if outcome.forced and outcome.signal is not None:
        termination = BatchTermination("interrupted", f"forced by a second {outcome.signal.name}")
    summary = outcome.summary
    print_run_report(summary, termination, outcome.wall_time, plan.out, plan.endpoint)
    unfinished = summary.unfinished
    if outcome.signal is not None:
        how = "forced stop" if outcome.forced else "stopped"
        say(f"{how} by {outcome.signal.name}: {summary.succeeded} of {summary.total} item(s) succeeded; "
            f"{unfinished} still to run")
        say(f"resume with: {plan.resume_command}{redaction_note(plan.resume_command)}")
        return 128 + int(outcome.signal)
    if termination.kind == "provider_retired":
        if (termination.reason or "").startswith("provider stopped the batch"):  # a day quota, spend limit
            say(f"the provider stopped the batch (the termination says why); once it takes calls again, "
                f"resume with: {plan.resume_command}{redaction_note(plan.resume_command)}")
        else:
            say(f"the provider was retired: the endpoint is unusable; fix it (URL, key, model), then resume "
                f"with: {plan.resume_command}{redaction_note(plan.resume_command)}")
        return EXIT_UNAVAILABLE
    if summary.failed or not termination.completed or unfinished:
        say(f"{unfinished} item(s) did not succeed; to run them again: {plan.resume_command}"
            f"{redaction_note(plan.resume_command)}")
        return EXIT_FAILED
    return EXIT_OK
