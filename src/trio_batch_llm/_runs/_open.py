"""``open_run``: check every argument, pick the repository and the driver, attach the run.

Everything that can be refused is refused here, before the repository is
opened (a bad argument never creates or touches a file): the mode and its
batch settings (a ``provider-batch`` run needs a strategy with a
``batch_endpoint()``), the config, the timing knobs. Then the run is created
or reattached (``repository.attach``: same identity and mode, or an error)
and handed to a :class:`Run`, which owns the repository from there on.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import AsyncIterable, Iterable
from typing import Any

from .._artifacts._codec import OutputCodec
from .._artifacts._fingerprint import jsonable_or_repr
from .._artifacts._identity import infer_artifact_identity
from .._artifacts._sqlite import SqliteArtifactStore
from .._strategies._base import LLMCallStrategy
from .._values._config import ArtifactIdentity, ProcessorConfig
from .._values._errors import ConfigurationError
from .._values._response_cache import CacheMode, ResponseCache, as_response_cache
from ._batch_config import ProviderBatchConfig
from ._batch_drive import BatchSegmentDriver
from ._ingest import Ingestor
from ._live_drive import LiveSegmentDriver
from ._run import Run
from ._schema import RunMode, RunSpec
from ._source import make_source
from .repository._client import DEFAULT_UNREACHABLE_TIMEOUT, RepositoryClient
from .repository._locate import RunStore, repository_at

__all__ = ["open_run"]


def _config_summary(config: ProcessorConfig) -> dict[str, Any]:
    return {field.name: jsonable_or_repr(getattr(config, field.name)) for field in dataclasses.fields(config)}


def _with_cache(config: ProcessorConfig, cache: object, cache_mode: CacheMode | None,
                mode: str) -> ProcessorConfig:
    """``config`` with ``open_run``'s ``cache=`` and ``cache_mode=`` (checked as the config checks them)."""
    if cache is not None:
        given = as_response_cache(cache)
        if config.response_cache is not None and given is not None:
            raise ConfigurationError("cache", given.display,
                                     "is given twice: pass it to open_run or in config, not both")
        config = dataclasses.replace(config, cache=cache)  # type: ignore[arg-type]
    if cache_mode is not None:
        config = dataclasses.replace(config, cache_mode=cache_mode)
    if config.response_cache is not None and mode == "provider-batch":
        raise ConfigurationError("cache", config.response_cache.display,
                                 'is for live runs: mode="provider-batch" sends every item to the Batch API')
    return config


def _positive(name: str, value: float, *, whole: bool = False) -> None:
    kind = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0 or value == math.inf:
        raise ConfigurationError(name, value, "must be a positive " + ("whole number" if whole else "number"))


async def open_run(
    store: RunStore,
    run_id: str,
    strategy: LLMCallStrategy[Any],
    source: Iterable[Any] | AsyncIterable[Any] | str | os.PathLike[str] | None,
    *,
    config: ProcessorConfig | None = None,
    mode: str = "live",
    identity: ArtifactIdentity | None = None,
    poll_interval: float = 1.0,
    slice_items: int = 256,
    slice_seconds: float = 1.0,
    batch: ProviderBatchConfig | None = None,
    lease_seconds: float | None = None,
    unreachable_timeout: float = DEFAULT_UNREACHABLE_TIMEOUT,
    cache: ResponseCache | str | os.PathLike[str] | None = None,
    cache_mode: CacheMode | None = None,
) -> Run:
    """Create the run ``run_id`` in ``store``, or reattach to it (from any process).

    ``store`` is a database path, a PostgreSQL database (a ``postgresql://``
    URL or a libpq keyword string such as ``"host=db dbname=runs user=app"``), a
    :class:`SqliteArtifactStore` (its file and identity are used; the run has
    its own tables there; one with an output codec is refused: a run keeps
    outputs by the stores' rule, plain JSON or a ``response_model=`` model),
    or a ``RunRepository``. ``source`` is an iterable of prompts (as for
    ``process_prompts``), an async iterable, a JSONL file (a ``pathlib.Path``
    or a ``.jsonl`` path), or ``None`` for a handle that only watches or
    finishes a run whose ingestion is complete. On reattach the same source
    must be passed again: it is continued from the stored checkpoint.

    ``identity`` (default: the store's, else :func:`infer_artifact_identity` of
    ``strategy``: its provider, model and fingerprints of its system prompt,
    params and response schema) must match the run's stored identity. Ingestion commits slices of at most
    ``slice_items`` entries, and waits at most ``slice_seconds`` after a
    slice's first entry. Status polls happen every ``poll_interval`` seconds.
    The handle is an async context manager; or call ``aclose()``.

    ``lease_seconds`` (live mode) lets many processes drive the run at once,
    on one machine or many (PostgreSQL; SQLite on one machine): each
    ``wait()`` leases slices of pending items for itself and renews its lease
    every ``lease_seconds / 3`` for as long as it drives, however long its
    calls take; a lease not renewed for ``lease_seconds`` (its process killed,
    frozen or cut off) expires, its items go to the other drivers, and its
    late results are refused. Results stay exactly-once; a call its driver
    started and never recorded (the lease lost mid-call) is made again, and
    counted call by call in ``runs status`` as ``reexecuted_after_lease_expiry``
    (each call start is written under the lease just before the call goes).
    Choose it well above the longest pause a healthy process may have; 30 s is
    what ``trio-batch-llm runs start`` uses. ``None`` (the default here): one
    driver at a time, every other ``wait()`` watches, so a handle opened only to
    report on, control or await the run never makes calls of its own.
    :meth:`Run.drivers` lists the drivers working now.

    ``unreachable_timeout`` (seconds, default 60): how long a database outage
    (PostgreSQL restarting, a network cut) is ridden out. Every repository call
    is retried with a capped backoff, reconnecting, while the database has been
    unreachable for less than this; meanwhile calls that finish keep their
    results in memory until they can be recorded. Past it ``wait()`` (or the
    call) raises :class:`DatabaseUnavailableError` and nothing is stored as
    failed: the run continues at the next ``wait()``. Opening is not retried: a
    database unreachable when the handle opens raises it at once.

    ``cache`` (a :class:`ResponseCache`, a SQLite path or a ``postgresql://``/``redis://`` URL;
    or ``config.cache``) is the response cache the run's live calls go through, with
    ``cache_mode`` (default ``config.cache_mode``): a hit is recorded as the item's result
    (``cached=True``, no call, no cost); each drive segment opens its own connection.

    ``mode="provider-batch"`` sends the items through the provider's Batch API
    (OpenAI ``/v1/batches``, Anthropic's Message Batches, Gemini's batch mode) instead of
    live calls; ``strategy`` must then offer one (``strategy.batch_endpoint()``, as the
    OpenAI, Anthropic and Gemini strategies do: their endpoint, key, model and request settings
    are used), and ``batch`` tunes chunking, polling and the shared
    enqueued-token capacity (see :class:`ProviderBatchConfig`).
    """
    if mode not in ("live", "provider-batch"):
        raise ConfigurationError("mode", mode, 'must be "live" or "provider-batch"')
    if mode == "live" and batch is not None:
        raise ConfigurationError("batch", batch, 'is only used with mode="provider-batch"')
    endpoint = None
    if mode == "provider-batch":
        endpoint = strategy.batch_endpoint() if isinstance(strategy, LLMCallStrategy) else None
        if endpoint is None:
            raise ConfigurationError(
                "strategy", type(strategy).__name__,
                'mode="provider-batch" needs a strategy with a Batch API (batch_endpoint() returns none), '
                "such as OpenAICompatibleStrategy, OpenAIStrategy, AnthropicStrategy or GeminiStrategy",
            )
        batch = batch if batch is not None else ProviderBatchConfig()
        if not isinstance(batch, ProviderBatchConfig):
            raise ConfigurationError("batch", batch, "must be a ProviderBatchConfig")
    if not isinstance(run_id, str) or not run_id:
        raise ConfigurationError("run_id", run_id, "must be a non-empty string")
    if not isinstance(strategy, LLMCallStrategy):
        raise TypeError(f"strategy={strategy!r:.80}: must be an LLMCallStrategy (see CallableStrategy)")
    config = config if config is not None else ProcessorConfig()
    if not isinstance(config, ProcessorConfig):
        raise TypeError(f"config={config!r}: must be a ProcessorConfig")
    config = _with_cache(config, cache, cache_mode, mode)
    if config.guardrails.batch_timeout is not None:
        raise ConfigurationError(
            "guardrails.batch_timeout", config.guardrails.batch_timeout,
            "is not used by runs: bound a run's time with run.wait(timeout=...)",
        )
    _positive("poll_interval", poll_interval)
    if lease_seconds is not None:
        _positive("lease_seconds", lease_seconds)
        if mode == "provider-batch":
            raise ConfigurationError("lease_seconds", lease_seconds,
                                     "is for live runs: a provider-batch run keeps one submitter at a time")
    _positive("unreachable_timeout", unreachable_timeout)
    _positive("slice_items", slice_items, whole=True)
    _positive("slice_seconds", slice_seconds)
    codec = getattr(store, "_codec", None)  # a SqliteArtifactStore's output_encoder/output_decoder
    if isinstance(codec, OutputCodec) and codec.decodes:
        raise ConfigurationError(
            "store", store,
            "has output_encoder= and output_decoder=, which open_run does not use (a run keeps outputs "
            "as plain JSON, or a pydantic model with the strategy's response_model=): pass the "
            "store's path, or a store without them",
        )
    if identity is None:  # the store's own, else inferred (the strategy's provider, model and settings)
        identity = (store.infer_identity(strategy) if isinstance(store, SqliteArtifactStore)
                    else infer_artifact_identity(strategy))
    repository = repository_at(store, identity=identity)
    run_source = make_source(source, strategy)
    db = RepositoryClient(repository, unreachable_timeout=unreachable_timeout)
    try:
        await db.open()
        run_mode: RunMode = "provider-batch" if mode == "provider-batch" else "live"
        spec = RunSpec(run_id=run_id, mode=run_mode, identity=identity, config=_config_summary(config))
        await db.call(repository.attach, spec)
    except BaseException:
        await db.aclose()
        raise
    ingestor = None
    if run_source is not None:
        ingestor = Ingestor(
            run_source, strategy, run_id=run_id, db=db, slice_items=slice_items, slice_seconds=slice_seconds
        )
    driver: LiveSegmentDriver | BatchSegmentDriver
    if endpoint is not None:
        assert batch is not None
        driver = BatchSegmentDriver(
            db=db, run_id=run_id, endpoint=endpoint, config=config, batch=batch, ingestor=ingestor,
            poll_interval=poll_interval,
        )
    else:
        driver = LiveSegmentDriver(
            db=db, run_id=run_id, strategy=strategy, config=config, ingestor=ingestor,
            poll_interval=poll_interval, lease_seconds=lease_seconds,
        )
    return Run(db=db, run_id=run_id, driver=driver, poll_interval=poll_interval)

