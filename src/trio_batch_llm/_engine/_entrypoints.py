"""The high-level surfaces: process_prompts, process_stream, call, call_result.

Thin wrappers over :class:`ParallelBatchProcessor` and :class:`LLMCallPool`;
they validate their input completely (for finite sources) before any call.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import textwrap
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Final, TypedDict, TypeVar, Unpack, final

import anyio

from .._artifacts._identity import adopt_identity
from .._artifacts._protocol import ArtifactStore
from .._observe._log import FailureLog
from .._observe._progress import make_progress
from .._observe._snapshot import Progress
from .._strategies._base import LLMCallStrategy
from .._values._batch_result import BatchResult
from .._values._config import ProcessorConfig, ResumePolicy
from .._values._errors import ConfigurationError
from .._values._results import BatchTermination, WorkItemResult
from ._call_limits import call_limits
from ._channel import ResultChannelStatistics
from ._classifier_objects import ClassifierArg
from ._inputs import CheckedItems, aiter_items, is_sized_source, items_from_sequence, validate_source
from ._pool import LLMCallPool
from ._processor import ParallelBatchProcessor
from ._unowned import StreamBlock

if TYPE_CHECKING:
    from .._host._executor import ExecutorHost

__all__ = ["ResultStream", "call", "call_result", "process_prompts", "process_stream"]

TOutput = TypeVar("TOutput")
Prompts = Iterable[Any] | AsyncIterable[Any]
ProgressArg = bool | Callable[[int, int | None, str], Any] | Progress | None

logger = logging.getLogger("trio_batch_llm.engine")

# The Args text of the parameters process_prompts and process_stream share: one home for it. A docstring
# line ``{_NAME}`` stands for the fragment ``_NAME``, indented as the line (_shared_args fills __doc__;
# docs/_hooks/griffe_public.py fills the reference pages' docstrings the same way, from this source).
_SOURCE_ARGS: Final = """\
strategy: The strategy every item is called through.
prompts: A sync or async iterable of texts, ``(item_id, prompt)`` or ``(item_id, prompt,
    context)`` tuples, mappings (``{"id": ..., "prompt": ...}`` or ``"messages"``, optional
    ``"params"`` and ``"context"``) or :class:`LLMWorkItem`. Bare texts get ids ``item-0``, ...;
    a repeated id is refused before any call.
config: Concurrency, retries, rate limits, deadlines, the response cache (the defaults if omitted).
concurrency: Workers, provider admission and connection pools sized at once (overrides
    ``config``'s concurrency).
progress: ``True`` for a progress bar on a terminal, a callable ``(completed, total, item_id)``, or
    a :class:`Progress`."""
_STORE_ARGS: Final = """\
artifact_store: A checkpoint store (:class:`JsonlArtifactStore`, :class:`SqliteArtifactStore`, your
    own :class:`ArtifactStore`) that every result is written to.
resume: Which results already in ``artifact_store`` are returned instead of run again."""
_FRAGMENT: Final = re.compile(r"^( *)\{(_[A-Z_]+)\}$", re.MULTILINE)
_FRAGMENTS: Final = {"_SOURCE_ARGS": _SOURCE_ARGS, "_STORE_ARGS": _STORE_ARGS}

TFunction = TypeVar("TFunction", bound=Callable[..., object])


def _shared_args(function: TFunction) -> TFunction:
    """``function`` with its docstring's ``{_NAME}`` lines filled in (see above)."""
    if function.__doc__:  # None under python -OO
        function.__doc__ = _FRAGMENT.sub(lambda m: textwrap.indent(_FRAGMENTS[m[2]], m[1]), function.__doc__)
    return function


class ProcessorOptions(TypedDict, total=False):
    """The :class:`ParallelBatchProcessor` options ``process_prompts`` and ``process_stream`` pass on.

    Each means what it means there; leave one out for the processor's default.
    """

    post_processor: Callable[[WorkItemResult[Any]], Any] | None
    """Runs on each fresh successful result; may return a new one (see the observability guide)."""
    error_classifier: Callable[[Exception], Any] | None
    """Classifies a failed attempt's exception before the strategy's own classifier."""
    middlewares: Sequence[Any] | None
    """:class:`Middleware` objects, applied in order before each item and reversed after it."""
    observers: Sequence[Any] | None
    """:class:`Observer` objects (or plain callables) that receive every lifecycle event."""
    host: ExecutorHost | None
    """A host to share quota scopes and prepared strategies with (the default: one of its own)."""
    post_processor_timeout: float | None
    """Seconds a post-processor may take (30 by default; ``None``: unbounded)."""
    call_start_deadline: float | None
    """No call starts at or after this time of ``anyio.current_time()``."""


def _resolve_config(config: ProcessorConfig | None, concurrency: int | None) -> ProcessorConfig:
    if config is not None and not isinstance(config, ProcessorConfig):
        raise TypeError(f"config={config!r}: must be a ProcessorConfig")
    if concurrency is None:
        return config if config is not None else ProcessorConfig()
    if config is None:
        return ProcessorConfig(concurrency=concurrency)
    if config.workers != concurrency and (config.concurrency is not None or config.max_workers is not None):
        raise ConfigurationError(
            "concurrency", concurrency, f"conflicts with config.workers={config.workers}; set one of them"
        )
    return dataclasses.replace(config, concurrency=concurrency, max_workers=None)


def _progress_callback(progress: ProgressArg) -> Callable[[int, int | None, str], Any] | Progress | None:
    if progress is None or progress is False:
        return None
    if progress is True:
        return make_progress(True)
    if isinstance(progress, Progress) or callable(progress):
        return progress
    raise TypeError(f"progress={progress!r}: must be a bool or a callable (completed, total, item_id)")


def _check_strategy(strategy: object) -> None:
    if not isinstance(strategy, LLMCallStrategy):
        raise TypeError(f"strategy={strategy!r:.80}: must be an LLMCallStrategy (see CallableStrategy)")


@_shared_args
async def process_prompts(
    strategy: LLMCallStrategy[TOutput],
    prompts: Prompts,
    *,
    config: ProcessorConfig | None = None,
    concurrency: int | None = None,
    progress: ProgressArg = False,
    preserve_order: bool = False,
    artifact_store: ArtifactStore | None = None,
    resume: ResumePolicy = ResumePolicy.NONE,
    **processor_kwargs: Unpack[ProcessorOptions],
) -> BatchResult[TOutput]:
    """Run every prompt and return one result per item.

    Controlled stops (batch deadline, abort, budget) still return a
    :class:`BatchResult`; its ``termination`` says why it stopped.

    Args:
        {_SOURCE_ARGS}
        preserve_order: Return the results in input order rather than completion order.
        {_STORE_ARGS}
    """
    _check_strategy(strategy)
    validate_source(prompts)
    cfg = _resolve_config(config, concurrency)
    adopt_identity(artifact_store, strategy)
    callback = _progress_callback(progress)
    proc: ParallelBatchProcessor[TOutput]
    batch: BatchResult[TOutput] | None = None
    if not is_sized_source(prompts):
        proc = ParallelBatchProcessor(
            _bounded_input(cfg),
            progress_callback=callback,
            artifact_store=artifact_store,
            resume=resume,
            **processor_kwargs,
        )
        with _keep_if_only_strategy_cleanup_failed(proc, lambda: batch is not None):
            async with proc:
                stream = _start_stream(proc, prompts, strategy)
                started = anyio.current_time()
                results = [result async for result in stream]
                batch = BatchResult.from_results(
                    results,
                    termination=stream.termination,
                    wall_time=anyio.current_time() - started,
                    input_order=stream.input_order,
                )
    else:
        items = items_from_sequence(prompts, strategy)  # type: ignore[arg-type]
        # The items are in memory already, so the input queue need not bound them.
        proc = ParallelBatchProcessor(
            dataclasses.replace(cfg, max_queue_size=0),
            progress_callback=callback,
            artifact_store=artifact_store,
            resume=resume,
            **processor_kwargs,
        )
        with _keep_if_only_strategy_cleanup_failed(proc, lambda: batch is not None):
            async with proc:
                await proc._add(items)  # same package: the list checked whole above, not again at intake
                batch = await proc.process_all()
    assert batch is not None
    if preserve_order:
        batch.results = batch.in_input_order()
    return batch


@final
class ResultStream(AsyncIterator[WorkItemResult[TOutput]]):
    """What ``process_stream`` yields: results in completion order, then its terminal."""

    def __init__(self, processor: ParallelBatchProcessor[TOutput]) -> None:
        self._processor = processor
        self._iterator = processor.results()

    def __aiter__(self) -> ResultStream[TOutput]:
        return self

    async def __anext__(self) -> WorkItemResult[TOutput]:
        return await self._iterator.__anext__()

    @property
    def termination(self) -> BatchTermination:
        return self._processor.termination

    @property
    def input_order(self) -> list[str]:
        return list(self._processor.input_order)

    def statistics(self) -> ResultChannelStatistics:
        return self._processor.results_statistics()


@_shared_args
def process_stream(
    strategy: LLMCallStrategy[TOutput],
    prompts: Prompts,
    *,
    config: ProcessorConfig | None = None,
    concurrency: int | None = None,
    progress: ProgressArg = False,
    artifact_store: ArtifactStore | None = None,
    resume: ResumePolicy = ResumePolicy.NONE,
    **processor_kwargs: Unpack[ProcessorOptions],
) -> StreamBlock[ResultStream[TOutput]]:
    """``async with process_stream(...) as results: async for r in results: ...``

    Results arrive in completion order. Leaving the block early cancels the
    outstanding work (with a reason) and closes everything in contract order.
    Finite sources (lists, tuples) are validated whole before any call; lazy
    sources are validated as they are read, and a bad entry ends the stream
    with its error.

    Args:
        {_SOURCE_ARGS}
        {_STORE_ARGS}
    """
    return StreamBlock(_stream_block(
        strategy, prompts, config, concurrency, progress, artifact_store, resume, processor_kwargs,
    ))


@asynccontextmanager
async def _stream_block(
    strategy: LLMCallStrategy[TOutput],
    prompts: Prompts,
    config: ProcessorConfig | None,
    concurrency: int | None,
    progress: ProgressArg,
    artifact_store: ArtifactStore | None,
    resume: ResumePolicy,
    processor_kwargs: ProcessorOptions,
) -> AsyncIterator[ResultStream[TOutput]]:
    # process_stream's arguments as it was given them: its signature is the one home of their defaults.
    # The checks run here, when the block is entered, not when process_stream is called.
    _check_strategy(strategy)
    validate_source(prompts)
    cfg = _resolve_config(config, concurrency)
    adopt_identity(artifact_store, strategy)
    source: Prompts | CheckedItems[TOutput] = prompts
    if is_sized_source(prompts):
        source = items_from_sequence(prompts, strategy)  # type: ignore[arg-type]
    async with ParallelBatchProcessor(
        _bounded_input(cfg),
        progress_callback=_progress_callback(progress),
        artifact_store=artifact_store,
        resume=resume,
        record_input_order=False,
        **processor_kwargs,
    ) as proc:
        yield _start_stream(proc, source, strategy)


def _bounded_input(cfg: ProcessorConfig) -> ProcessorConfig:
    if cfg.max_queue_size:
        return cfg
    # Bounded by default so a lazy source of millions is read only as fast as it is processed.
    return dataclasses.replace(cfg, max_queue_size=max(2 * cfg.workers, 64))


def _start_stream(
    proc: ParallelBatchProcessor[TOutput],
    source: Prompts | CheckedItems[TOutput],
    strategy: LLMCallStrategy[TOutput],
) -> ResultStream[TOutput]:
    proc.start()
    proc.feed(aiter_items(source, strategy))
    return ResultStream(proc)


@contextmanager
def _keep_if_only_strategy_cleanup_failed(
    proc: ParallelBatchProcessor[Any] | LLMCallPool[Any], completed: Callable[[], bool]
) -> Iterator[None]:
    """CONTRACT C7.5: a completed result survives a failure of user strategy ``cleanup()`` alone.

    Runtime, admission and store failures (and anything while the work was
    still running) propagate.
    """
    try:
        yield
    except Exception:
        if not completed() or not proc.only_strategy_cleanup_failed():
            raise
        logger.warning("strategy cleanup failed after the work completed; keeping the result", exc_info=True)


async def call_result(
    strategy: LLMCallStrategy[TOutput],
    prompt: str,
    *,
    config: ProcessorConfig | None = None,
    error_classifier: ClassifierArg | None = None,
) -> WorkItemResult[TOutput]:
    """One request through the full retry/admission path; never raises for provider failures.

    Overlapping calls on one strategy in one event loop share its limits: a
    ``gather()`` of ten calls with ``ProcessorConfig(concurrency=4)`` keeps at
    most four requests in flight, and a 429 pauses all of them. Without
    ``config`` they share the default limits. Calls with different limits do
    not share; for one set of limits across many strategies or for a bound
    on waiting callers, use :class:`LLMCallPool`.
    """
    _check_strategy(strategy)
    if not isinstance(prompt, str):
        raise TypeError(f"prompt={prompt!r}: must be a str")
    cfg = config if config is not None else ProcessorConfig(max_workers=1)
    result: WorkItemResult[TOutput] | None = None
    pool = LLMCallPool(strategy, config=cfg, error_classifier=error_classifier)
    # Overlapping calls on one strategy share its limits (and its failure log) in this event loop;
    # without a config, the default limits, not this one call's single worker.
    shared = call_limits().shared(strategy, config if config is not None else ProcessorConfig())
    if shared is not None:
        pool.host.adopt_quota_scope(strategy, shared.scope)
    # The caller holds each failure (the result, or call()'s exception): DEBUG, not the pool's WARNING.
    # Same package: the pool's own log is per pool.
    pool._failures = shared.failures if shared is not None else FailureLog("call", quiet=True)
    with _keep_if_only_strategy_cleanup_failed(pool, lambda: result is not None):
        async with pool:
            result = await pool.submit_result(prompt)
    assert result is not None
    return result


async def call(
    strategy: LLMCallStrategy[TOutput],
    prompt: str,
    *,
    config: ProcessorConfig | None = None,
    error_classifier: ClassifierArg | None = None,
) -> TOutput:
    """One request; returns its output or raises :class:`LLMCallError`.

    Overlapping calls on one strategy share its limits (see :func:`call_result`).
    """
    from .._values._results import LLMCallError

    result = await call_result(strategy, prompt, config=config, error_classifier=error_classifier)
    if result.success:
        return result.output  # type: ignore[return-value]
    raise LLMCallError(f"call failed: {result.error}", result=result) from result.exception
