"""What both built-in stores share: lifecycle, the writer thread, group commit, error mapping.

A store owns no task. Every blocking call (file or SQLite I/O) goes through
the store's own :class:`WorkerGate`: a worker thread, one call at a time, a
started call never abandoned, even if a native asyncio cancellation unwinds
the task that started it.

Before a record is built, :meth:`ThreadedStore.append` checks the item id and
turns the output into what the store keeps (see ``_codec.py``); a result that
cannot be kept faithfully raises :class:`ArtifactEncodeError` and writes
nothing. Loading decodes stored outputs (in the thread, with the rest of the load).

Subclasses implement the synchronous halves: ``_encode`` (on the event loop,
cheap: builds the bytes or row of one record), and ``_open_sync``,
``_load_sync``, ``_count_sync``, ``_write_sync``, ``_close_sync`` (in the
gate's thread, under its lock).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import anyio
import anyio.lowlevel

from .._backends._worker_gate import WorkerGate
from .._values._artifact_identity import ArtifactIdentity
from .._values._errors import (
    ArtifactEncodeError,
    ArtifactMismatchError,
    ArtifactStoreError,
    ConfigurationError,
)
from .._values._requests import item_id_problem
from .._values._results import WorkItemResult
from ._codec import JSONValue, OutputCodec
from ._fingerprint import identity_fingerprint
from ._group_commit import GroupCommitter
from ._identity import infer_artifact_identity
from ._protocol import StoredRecord, StoreState, StoreStatistics

if TYPE_CHECKING:
    from .._strategies._base import LLMCallStrategy

__all__ = ["ThreadedStore", "append_result", "logger"]

logger = logging.getLogger("trio_batch_llm.artifacts")

EncodedT = TypeVar("EncodedT")


def _as_stored(stored: Any) -> Any:
    """What a resume gives back for a strategy without ``decode_output``: the stored value."""
    return stored


async def append_result(
    store: Any, result: WorkItemResult[Any], *, fingerprint: str, prompt: str | None, strategy: object
) -> None:
    """``store.append(...)`` for the engine: a built-in store is also given the item's ``strategy``
    (to refuse an output a resume would not give back); another store takes the protocol's arguments."""
    if isinstance(store, ThreadedStore):
        await store.append(result, fingerprint=fingerprint, prompt=prompt, strategy=strategy)
    else:
        await store.append(result, fingerprint=fingerprint, prompt=prompt)


class ThreadedStore(abc.ABC, Generic[EncodedT]):
    """Base of the built-in stores; see the module docstring."""

    _io_error_types: tuple[type[Exception], ...] = (OSError,)
    _position_name = "line"
    """What :attr:`StoredRecord.position` counts, for messages."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        identity: ArtifactIdentity | None = None,
        store_prompts: bool = False,
        allow_identity_mismatch: bool = False,
        output_encoder: Callable[[Any], JSONValue] | None = None,
        output_decoder: Callable[[JSONValue], Any] | None = None,
    ) -> None:
        if identity is not None and not isinstance(identity, ArtifactIdentity):
            raise ConfigurationError("identity", identity, "must be an ArtifactIdentity or None (inferred)")
        self._codec = OutputCodec(output_encoder, output_decoder)
        self._path = Path(path)
        self._identity = identity
        self._identity_fp = "" if identity is None else identity_fingerprint(identity)
        self._inferred = False  # the identity was inferred from a strategy, not given
        self._store_prompts = bool(store_prompts)
        self._allow_identity_mismatch = bool(allow_identity_mismatch)
        self._state: StoreState = "unopened"
        self._io_closed = False  # set in the gate by close; checked by writes
        self._gate: WorkerGate | None = None
        self._committer: GroupCommitter[EncodedT] | None = None
        self._closed: anyio.Event | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self._path)!r}, state={self._state!r})"

    @property
    def path(self) -> Path:
        return self._path

    @property
    def identity(self) -> ArtifactIdentity | None:
        """The identity records are written under; ``None`` until inferred when none was given."""
        return self._identity

    def infer_identity(self, strategy: LLMCallStrategy[Any]) -> ArtifactIdentity:
        """The identity in force: the one given at construction (it wins), else, the first time,
        ``infer_artifact_identity(strategy)``; once inferred, a strategy with another identity is
        refused. ``process_prompts``, ``process_stream`` and ``open_run`` call it before opening the
        store; call it yourself before handing a store built without an identity to a
        :class:`ParallelBatchProcessor`."""
        if self._identity is None:
            if self._state != "unopened":
                raise ArtifactStoreError(f"{self._path}: the identity is fixed once the store is opened")
            self._identity = infer_artifact_identity(strategy)
            self._identity_fp = identity_fingerprint(self._identity)
            self._inferred = True
        elif self._inferred and infer_artifact_identity(strategy) != self._identity:
            # Inferred from another strategy: its records would be stamped with that one's model.
            raise ConfigurationError(
                "strategy", strategy,
                f"{self._path}: the store's identity was inferred from another strategy "
                f"({self._identity!r}); use a store per strategy, or pass identity= to the store",
            )
        return self._identity

    def strategy_check(self) -> Callable[[LLMCallStrategy[Any]], ArtifactIdentity] | None:
        """What the resume plan checks each item's strategy with: :meth:`infer_identity` when the
        identity was inferred (an item of another strategy is refused), else ``None``."""
        return self.infer_identity if self._inferred else None

    @property
    def _known_identity(self) -> ArtifactIdentity:
        if self._identity is None:
            raise self._no_identity()
        return self._identity

    def _no_identity(self) -> ConfigurationError:
        return ConfigurationError(
            "identity", None,
            f"{self._path} was built without an identity and none was inferred: pass "
            "identity=ArtifactIdentity(...), or call store.infer_identity(strategy) first "
            "(process_prompts, process_stream and open_run do that for you)",
        )

    # -- lifecycle ---------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Create the store, or open it and check its identity. Once per store object."""
        if self._state != "unopened":
            await anyio.lowlevel.checkpoint()
            raise ArtifactStoreError(
                f"{self._path}: this store object is {self._state}; create a new one per run"
            )
        if self._identity is None:  # refused before any file is touched
            await anyio.lowlevel.checkpoint()
            raise self._no_identity()
        gate = self._gate = WorkerGate()
        self._state = "opening"
        try:
            await gate.run(self._open_sync)
        except BaseException:
            self._state = "unopened"
            raise
        self._committer = GroupCommitter(self._write_checked, gate=gate, wrap_error=self._fresh_error)
        self._state = "open"

    async def aclose(self) -> None:
        """Close the store; idempotent. Closes even when cancelled.

        Not-yet-written appends are not waited for: their appenders get an
        ArtifactStoreError. A write in flight finishes first (it holds the
        gate), so the shielded wait is bounded by one batch write.
        """
        if self._state == "closed":
            await anyio.lowlevel.checkpoint()
            return
        if self._state == "closing" and self._closed is not None:
            await self._closed.wait()
            return
        self._state = "closing"
        closed = self._closed = anyio.Event()
        try:
            with anyio.CancelScope(shield=True):
                if self._gate is None:
                    await anyio.lowlevel.checkpoint()
                else:
                    await self._gate.run(self._close_once)
        finally:
            self._state = "closed"
            closed.set()

    def _close_once(self) -> None:
        self._io_closed = True
        self._close_sync()

    # -- reading and writing -----------------------------------------------------

    async def load(self) -> dict[str, StoredRecord]:
        """Every item's newest stored record, by item id, its output decoded."""
        gate = await self._require_open()
        return await gate.run(self._load_decoded)

    def _load_decoded(self) -> dict[str, StoredRecord]:
        records = self._load_sync()
        if not self._codec.decodes:
            return records
        return {item_id: self._decoded(record) for item_id, record in records.items()}

    def _decoded(self, record: StoredRecord) -> StoredRecord:
        """``record`` with its output decoded; ArtifactStoreError naming it if the decoder fails."""
        if not self._codec.decodes:
            return record
        try:
            output = self._codec.decode(record.result.get("output"))
        except Exception as exc:  # the user's decoder: any failure is reported, naming the record
            raise ArtifactStoreError(
                f"{self._path}: output_decoder failed on the stored output of item {record.item_id!r} "
                f"({self._position_name} {record.position}): {exc!r}"
            ) from exc
        return dataclasses.replace(record, result={**record.result, "output": output})

    async def count_records(self) -> int:
        """How many result records the store holds (superseded ones included)."""
        gate = await self._require_open()
        return await gate.run(self._count_sync)

    async def append(
        self, result: WorkItemResult[Any], *, fingerprint: str, prompt: str | None = None,
        strategy: object = None,
    ) -> None:
        """Return only once ``result`` is written and flushed (fsynced or committed).

        ``strategy`` is the item's: a resume passes the stored output through its
        ``decode_output``, so an output it would not give back is refused
        (:class:`ArtifactEncodeError`, see ``_codec.py``). The engine always passes it.

        Concurrent appends are group-committed: one write for all that are
        pending. If this call is cancelled, the record is either not written at
        all or written completely; the store is never left torn by it.
        """
        await self._require_open()
        committer = self._committer
        assert committer is not None
        try:
            encoded = self._encode(
                result, self._stored_output(result, strategy), fingerprint,
                prompt if self._store_prompts else None,
            )
        except (TypeError, ValueError, RecursionError) as exc:
            await anyio.lowlevel.checkpoint()
            raise ArtifactEncodeError(
                f"{self._path}: the result of item {result.item_id!r} cannot be stored: {exc}"
            ) from exc
        await committer.submit(encoded)

    def _stored_output(self, result: WorkItemResult[Any], strategy: object) -> JSONValue:
        """What is kept of the output (ValueError if the id or the output cannot be kept)."""
        problem = item_id_problem(result.item_id)
        if problem is not None:
            raise ValueError(f"its item_id {problem}")
        replay = None
        if strategy is not None:  # as the resume plan decodes: any object may stand in as a strategy
            replay = getattr(strategy, "decode_output", None) or _as_stored
        return self._codec.encode(result.output, replay=replay)

    def statistics(self) -> StoreStatistics:
        stats = self._committer.statistics() if self._committer is not None else None
        return StoreStatistics(
            path=self._path,
            state=self._state,
            records_written=stats.records_written if stats else 0,
            write_batches=stats.batches_written if stats else 0,
            pending=stats.pending if stats else 0,
            in_flight=stats.in_flight if stats else 0,
        )

    async def _require_open(self) -> WorkerGate:
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self._state != "open" or self._gate is None:
            await anyio.lowlevel.checkpoint()
            hint = "call `await store.open()` first" if self._state == "unopened" else "create a new store"
            raise ArtifactStoreError(f"{self._path}: the store is {self._state}; {hint}")
        return self._gate

    # -- thread side -------------------------------------------------------------

    def _write_checked(self, items: Sequence[EncodedT]) -> None:
        # Runs in the gate, as every other blocking call (the committer sends it there).
        if self._io_closed:
            raise ArtifactStoreError(
                f"{self._path}: the store was closed before {len(items)} record(s) could be written"
            )
        self._write_sync(items)

    @contextlib.contextmanager
    def _io_errors(self, doing: str) -> Iterator[None]:
        """Map the backend's I/O errors to ArtifactStoreError naming the path (original as cause)."""
        try:
            yield
        except self._io_error_types as exc:
            raise ArtifactStoreError(f"{self._path}: {doing} failed: {exc}") from exc

    def _fresh_error(self, error: BaseException) -> BaseException:
        """One new exception per appender of a failed batch, keeping the original cause."""
        if isinstance(error, ArtifactStoreError):
            fresh = type(error)(*error.args)
            fresh.__cause__ = error.__cause__
            return fresh
        fresh = ArtifactStoreError(f"{self._path}: writing results failed: {error!r}")
        fresh.__cause__ = error
        return fresh

    def _check_identity(self, stored: object) -> None:
        """Refuse a store written under another identity, unless told to allow it."""
        current = self._known_identity.to_dict()
        if stored == current:
            return
        message = (
            f"{self._path} was written under identity {stored!r}, but this run's identity is "
            f"{current!r}; use another path, or allow_identity_mismatch=True to append anyway "
            "(results stored under the other identity are never replayed)"
        )
        if not self._allow_identity_mismatch:
            raise ArtifactMismatchError(message)
        logger.warning("%s", message)

    @abc.abstractmethod
    def _encode(
        self, result: WorkItemResult[Any], output: JSONValue, fingerprint: str, prompt: str | None
    ) -> EncodedT:
        """Build one record keeping ``output`` (event loop; TypeError/ValueError if it cannot be encoded)."""

    @abc.abstractmethod
    def _open_sync(self) -> None: ...

    @abc.abstractmethod
    def _load_sync(self) -> dict[str, StoredRecord]: ...

    @abc.abstractmethod
    def _count_sync(self) -> int: ...

    @abc.abstractmethod
    def _write_sync(self, items: Sequence[EncodedT]) -> None:
        """Write all items durably or raise (leaving the store as it was if possible)."""

    @abc.abstractmethod
    def _close_sync(self) -> None: ...

    @abc.abstractmethod
    def iter_results(self) -> Iterator[WorkItemResult[Any]]:
        """Every stored result in write order, ``replayed=False`` (blocking; offline use)."""
