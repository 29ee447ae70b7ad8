"""The artifact-store protocol the engine calls, and the records it exchanges.

The engine's use of a store, in order::

    await store.open()                        # create, or open and check the identity
    records = await store.load()              # item_id -> newest StoredRecord
    ...                                       # per item: decide_resume(...) (see _resume.py)
    await store.append(result, fingerprint=fp)  # returns once durable; then publish
    await store.aclose()                      # idempotent; phase (d) of the ordered close

``iter_results()`` is synchronous and blocking, for offline inspection (a
script, a notebook, a test); do not call it on a running event loop.

The protocol is deliberately narrow (no queries beyond "everything, newest
per item") so a shared store, for example PostgreSQL with claimed items, can
implement it later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol, final, runtime_checkable

from .._values._errors import ArtifactStoreError
from .._values._results import WorkItemResult
from ._fingerprint import encode_record, jsonable_or_repr

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "ArtifactStore",
    "check_format_version",
    "StoreState",
    "StoreStatistics",
    "StoredRecord",
    "encode_result",
]

FORMAT_NAME: Final = "trio-batch-llm-artifacts"
FORMAT_VERSION: Final = 1
"""Bumped on an incompatible change of the stored record layout."""


def check_format_version(path: object, header: dict[str, Any]) -> None:
    """Refuse a header written by a newer format than this library reads (JSONL and SQLite alike)."""
    version = header.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ArtifactStoreError(
            f"{path}: format version {version!r} is newer than this library reads "
            f"({FORMAT_VERSION}); upgrade trio-batch-llm"
        )

StoreState = Literal["unopened", "opening", "open", "closing", "closed"]


@final
@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One stored result as loaded back: the newest record for its item id."""

    item_id: str
    fingerprint: str
    """The input fingerprint (prompt + context) the result was produced for."""
    result: dict[str, Any]
    """The result in :meth:`WorkItemResult.to_dict` form (the output decoded, if the store decodes)."""
    identity_matches: bool
    """Whether it was written under the identity this store was opened with."""
    prompt: str | None = None
    """The raw prompt, only when the writing store had ``store_prompts=True``."""
    position: int = 0
    """Where it is stored: the line number (JSONL) or the row id (SQLite)."""

    @property
    def success(self) -> bool:
        return bool(self.result.get("success"))

    def to_result(self, *, replayed: bool = True) -> WorkItemResult[Any]:
        """Rebuild the :class:`WorkItemResult` (marked replayed unless told otherwise)."""
        return WorkItemResult.from_dict(self.result, replayed=replayed)


_UNSET: Final[Any] = object()


def encode_result(
    result: WorkItemResult[Any],
    envelope: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    output: Any = _UNSET,
) -> bytes:
    """Encode ``envelope(result.to_dict())`` as strict JSON: what a store keeps of a result.

    ``output`` replaces ``result.output`` (a store passes what its
    :class:`~._codec.OutputCodec` made of it). The output must encode because
    a replay returns it; if it does not, TypeError/ValueError propagates.
    ``context`` and ``metadata`` values that cannot be encoded (an arbitrary
    object, a ``NaN``) are kept as their ``repr()``, since they are audit
    copies (a replay takes the current item's context). The common case
    encodes once; only a failure pays for the value-by-value fallback.
    """
    payload = result.to_dict()
    if output is not _UNSET:
        payload["output"] = output
    try:
        return encode_record(envelope(payload))
    except (TypeError, ValueError, RecursionError):
        payload["context"] = jsonable_or_repr(payload["context"])
        payload["metadata"] = {str(k): jsonable_or_repr(v) for k, v in payload["metadata"].items()}
        return encode_record(envelope(payload))


@final
@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """A snapshot of one store, for tests and progress reporting."""

    path: Path
    state: StoreState
    records_written: int
    """Records durably appended by this store object (not counting earlier runs)."""
    write_batches: int
    """Group-commit batches written; fewer than records under concurrency."""
    pending: int
    """Appends waiting for the next batch."""
    in_flight: int
    """Records in the batch being written now."""


@runtime_checkable
class ArtifactStore(Protocol):
    """What the engine needs from a checkpoint store. All async methods use anyio only."""

    @property
    def path(self) -> Path: ...

    async def open(self) -> None:
        """Create the store, or open it and check its identity (ArtifactMismatchError)."""

    async def load(self) -> dict[str, StoredRecord]:
        """Every item's newest stored record, by item id."""

    async def count_records(self) -> int:
        """How many records are stored (superseded ones included)."""

    async def append(
        self, result: WorkItemResult[Any], *, fingerprint: str, prompt: str | None = None
    ) -> None:
        """Return only once ``result`` is written and flushed (fsynced / committed).

        Raise :class:`ArtifactEncodeError` before writing anything when this one
        result cannot be stored faithfully: the engine then stores and
        publishes a failure of the item instead, and goes on.
        """

    async def aclose(self) -> None:
        """Close; idempotent; closes even when cancelled."""

    def iter_results(self) -> Iterator[WorkItemResult[Any]]:
        """Every stored result in write order (blocking; offline use)."""

    def statistics(self) -> StoreStatistics: ...
