"""``JsonlArtifactStore``: an append-only JSON Lines checkpoint.

Layout: line 1 is a header (format name and version, the run's identity);
every further line is one result record::

    {"kind":"header","format":"trio-batch-llm-artifacts","version":1,"identity":{...},...}
    {"kind":"result","item_id":"a","fingerprint":"…","identity":"…","result":{...}}

Records are only ever appended, by whole lines, through one ``O_APPEND`` file
descriptor held under an exclusive advisory lock (POSIX ``flock``), so one
writer owns a file at a time. A later record for an item supersedes an
earlier one. A crash can leave only the final line incomplete: ``open()``
truncates that torn tail away (with a warning) before anything is appended,
while a corrupt line anywhere else is an error naming its line number. A
write that fails part-way is truncated back, so a failed append never leaves
a fragment for the next one to land behind.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, Final, final

from .._config import ArtifactIdentity
from .._errors import ArtifactStoreError
from .._results import WorkItemResult
from .._version import __version__
from ._fingerprint import encode_record
from ._protocol import FORMAT_NAME, FORMAT_VERSION, StoredRecord, encode_result
from ._store_base import ThreadedStore, logger

__all__ = ["JsonlArtifactStore"]

_MAX_HEADER_BYTES: Final = 1 << 20
_TAIL_CHUNK: Final = 1 << 16
_OPEN_FLAGS: Final = (
    os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _datasync(fd: int) -> None:
    # fdatasync covers the data and the file size, which is all an append needs.
    # (macOS: fsync does not reach the platter; F_FULLFSYNC is not used.)
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def _sync_directory(path: os.PathLike[str]) -> None:
    """Make a newly created file's directory entry durable (POSIX only)."""
    if sys.platform == "win32":
        return
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock_exclusively(fd: int, path: object) -> None:
    if sys.platform == "win32":
        return  # no advisory lock on Windows: one writer per file is on the user
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ArtifactStoreError(
            f"{path} is already open for writing by another store (in this or another process)"
        ) from None


def _last_newline_end(f: BinaryIO, size: int) -> int:
    """Offset just past the last ``\\n`` in the file (0 if there is none)."""
    end = size
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        f.seek(start)
        chunk = f.read(end - start)
        index = chunk.rfind(b"\n")
        if index >= 0:
            return start + index + 1
        end = start
    return 0


@final
class JsonlArtifactStore(ThreadedStore[bytes]):
    """Checkpoint results to a JSON Lines file; see the module docstring for the format.

    ``fsync=True`` makes each group-commit write durable against power loss
    (one ``fdatasync`` per batch, not per record); without it an append
    returns once the bytes are in the operating system, which survives a
    process crash. Raw prompts are stored only with ``store_prompts=True``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        identity: ArtifactIdentity,
        fsync: bool = False,
        store_prompts: bool = False,
        allow_identity_mismatch: bool = False,
    ) -> None:
        super().__init__(
            path,
            identity=identity,
            store_prompts=store_prompts,
            allow_identity_mismatch=allow_identity_mismatch,
        )
        self._fsync = bool(fsync)
        self._fd: int | None = None
        self._size = 0
        self._broken: BaseException | None = None

    # -- event loop side ---------------------------------------------------------

    def _encode(self, result: WorkItemResult[Any], fingerprint: str, prompt: str | None) -> bytes:
        def envelope(payload: dict[str, Any]) -> dict[str, Any]:
            record: dict[str, Any] = {
                "kind": "result",
                "item_id": result.item_id,
                "fingerprint": fingerprint,
                "identity": self._identity_fp,
                "result": payload,
            }
            if prompt is not None:
                record["prompt"] = prompt
            return record

        return encode_result(result, envelope) + b"\n"

    # -- thread side -------------------------------------------------------------

    def _open_sync(self) -> None:
        with self._io_errors("opening"):
            fd = os.open(self._path, _OPEN_FLAGS, 0o644)
            try:
                _lock_exclusively(fd, self._path)
                self._size = self._prepare(fd)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd

    def _prepare(self, fd: int) -> int:
        """Write the header into an empty file, or check it and cut a torn tail. Returns the size."""
        size = os.fstat(fd).st_size
        if size > 0:
            with open(self._path, "rb") as f:
                first = f.readline(_MAX_HEADER_BYTES)
                if first.endswith(b"\n"):
                    self._check_identity(self._parse_header(first)["identity"])
                    return self._cut_torn_tail(fd, f, size)
            if size > len(first):
                raise ArtifactStoreError(f"{self._path}: line 1 is not a trio-batch-llm header")
            # Only a torn header: the first write of a run was interrupted.
            logger.warning("%s: discarding a torn header (%d bytes) and starting afresh", self._path, size)
            os.ftruncate(fd, 0)
        created = size == 0
        header = {
            "kind": "header",
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "identity": self._identity.to_dict(),
            "identity_fingerprint": self._identity_fp,
            "created_at": datetime.datetime.now(datetime.UTC).isoformat(),
            "library_version": __version__,
        }
        data = encode_record(header) + b"\n"
        _write_all(fd, data)
        if self._fsync:
            _datasync(fd)
            if created:
                _sync_directory(self._path)
        return len(data)

    def _cut_torn_tail(self, fd: int, f: BinaryIO, size: int) -> int:
        keep = _last_newline_end(f, size)
        if keep < size:
            logger.warning(
                "%s: truncating a torn last line (%d bytes after offset %d), left by an interrupted write",
                self._path, size - keep, keep,
            )
            os.ftruncate(fd, keep)
            if self._fsync:
                _datasync(fd)
        return keep

    def _parse_header(self, line: bytes) -> dict[str, Any]:
        try:
            header = json.loads(line)
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
            raise ArtifactStoreError(f"{self._path}: line 1 is not a trio-batch-llm header")
        version = header.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ArtifactStoreError(
                f"{self._path}: format version {version!r} is newer than this library reads "
                f"({FORMAT_VERSION}); upgrade trio-batch-llm"
            )
        return header

    def _parse_record(self, line: bytes, number: int) -> StoredRecord:
        problem = "not a JSON object"
        try:
            record = json.loads(line)
        except ValueError as exc:
            record, problem = None, f"invalid JSON: {exc}"
        if isinstance(record, dict):
            problem = "not a result record"
            item_id, result = record.get("item_id"), record.get("result")
            fingerprint, identity = record.get("fingerprint"), record.get("identity")
            prompt = record.get("prompt")
            if (
                record.get("kind") == "result"
                and isinstance(item_id, str)
                and isinstance(fingerprint, str)
                and isinstance(identity, str)
                and isinstance(result, dict)
                and isinstance(prompt, str | None)
            ):
                return StoredRecord(
                    item_id=item_id,
                    fingerprint=fingerprint,
                    result=result,
                    identity_matches=identity == self._identity_fp,
                    prompt=prompt,
                    position=number,
                )
        raise ArtifactStoreError(
            f"{self._path}: line {number} is corrupt ({problem}); it was not written whole by this "
            "store. Remove or repair that line to resume from this file."
        )

    def _records(self, *, skip_torn_tail: bool) -> Iterator[StoredRecord]:
        with open(self._path, "rb") as f:
            first = f.readline(_MAX_HEADER_BYTES)
            if not first.endswith(b"\n"):
                if skip_torn_tail:
                    return  # empty, or only a torn header: no results yet
                raise ArtifactStoreError(f"{self._path}: line 1 is not a trio-batch-llm header")
            self._parse_header(first)
            for number, line in enumerate(f, start=2):
                if not line.endswith(b"\n"):
                    if skip_torn_tail:
                        return  # readers leave a torn tail for the writer's open() to repair
                    raise ArtifactStoreError(f"{self._path}: line {number} is incomplete")
                yield self._parse_record(line, number)

    def _load_sync(self) -> dict[str, StoredRecord]:
        with self._io_errors("loading"):
            return {record.item_id: record for record in self._records(skip_torn_tail=False)}

    def _count_sync(self) -> int:
        with self._io_errors("counting records"), open(self._path, "rb") as f:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(_TAIL_CHUNK), b""))
        return max(0, lines - 1)

    def _write_sync(self, items: Sequence[bytes]) -> None:
        if self._broken is not None:
            raise ArtifactStoreError(
                f"{self._path}: the store is unusable after an earlier write could not be undone"
            ) from self._broken
        fd = self._fd
        assert fd is not None
        data = b"".join(items)
        start = self._size
        try:
            _write_all(fd, data)
            if self._fsync:
                _datasync(fd)
        except OSError as exc:
            self._undo_partial_write(fd, start)
            raise ArtifactStoreError(
                f"{self._path}: writing {len(items)} record(s) failed: {exc}"
            ) from exc
        self._size = start + len(data)

    def _undo_partial_write(self, fd: int, size: int) -> None:
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            logger.error("%s: could not truncate a failed write back to %d bytes", self._path, size)
            self._broken = exc

    def _close_sync(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with self._io_errors("closing"):
            try:
                if self._fsync:
                    _datasync(fd)
            finally:
                os.close(fd)  # also releases the flock

    def iter_results(self) -> Iterator[WorkItemResult[Any]]:
        """Every stored result in write order, ``replayed=False``.

        Blocking; for offline inspection. Works whether or not the store is
        open, never modifies the file, ignores a torn last line, and does not
        check the identity. Superseded records are included (in order).
        """
        with self._io_errors("reading"):
            for record in self._records(skip_torn_tail=True):
                yield record.to_result(replayed=False)
