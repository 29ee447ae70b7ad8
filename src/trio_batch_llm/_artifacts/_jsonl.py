"""``JsonlArtifactStore``: an append-only JSON Lines checkpoint.

Layout: line 1 is a header (format name and version, the run's identity);
every further line is one result record, all strict JSON::

    {"kind":"header","format":"trio-batch-llm-artifacts","version":1,"identity":{...},...}
    {"kind":"result","item_id":"a","fingerprint":"…","identity":"…","result":{...}}

A file is repaired or appended to only when its fixed leading bytes prove it
ours (``_jsonl_layout.py``); anything else is refused and left untouched.
Records are only ever appended, by whole lines, through one ``O_APPEND`` file
descriptor held under an exclusive advisory lock (POSIX ``flock``), so one
writer owns a file at a time. A later record for an item supersedes an
earlier one. A crash can leave only the final line incomplete: ``open()``
cuts that torn tail (warning with its line, bytes and item) before anything
is appended; a corrupt line anywhere else is an error naming its line. A last
line that is a whole, valid record without its newline (an editor strips it)
is kept, and the newline is written before the next record; a last line that
is neither a record nor the start of one is refused. A write that fails
part-way is truncated back, so a failed append never leaves a fragment.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO, Final, final

from .._values._artifact_identity import ArtifactIdentity
from .._values._errors import ArtifactStoreError
from .._values._results import WorkItemResult
from .._version import __version__
from ._codec import JSONValue
from ._fingerprint import encode_record
from ._jsonl_layout import (
    HEADER_MAGIC,
    RECORD_MAGIC,
    last_newline_end,
    line_number,
    looks_torn,
    parses,
    preview,
    torn_item_id,
)
from ._protocol import FORMAT_NAME, FORMAT_VERSION, StoredRecord, check_format_version, encode_result
from ._store_base import ThreadedStore, logger

__all__ = ["JsonlArtifactStore"]

_MAX_HEADER_BYTES: Final = 1 << 20
_COUNT_CHUNK: Final = 1 << 16
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


@final
class JsonlArtifactStore(ThreadedStore[bytes]):
    """Checkpoint results to a JSON Lines file; see the module docstring for the format.

    ``fsync=True`` makes each group-commit write durable against power loss
    (one ``fdatasync`` per batch, not per record); without it an append
    returns once the bytes are in the operating system, which survives a
    process crash. Raw prompts are stored only with ``store_prompts=True``.

    Outputs are kept only when they come back from JSON as themselves (plain
    JSON); pass ``output_encoder`` and ``output_decoder`` together to keep any
    other type. A result that cannot be kept raises :class:`ArtifactEncodeError`
    from ``append()`` and writes nothing.

    ``identity=None`` (the default) infers it from the strategy that runs the
    items (:func:`infer_artifact_identity`: provider, model, fingerprints of
    the system prompt, params and response schema); an explicit identity wins.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        identity: ArtifactIdentity | None = None,
        fsync: bool = False,
        store_prompts: bool = False,
        allow_identity_mismatch: bool = False,
        output_encoder: Callable[[Any], JSONValue] | None = None,
        output_decoder: Callable[[JSONValue], Any] | None = None,
    ) -> None:
        super().__init__(
            path,
            identity=identity,
            store_prompts=store_prompts,
            allow_identity_mismatch=allow_identity_mismatch,
            output_encoder=output_encoder,
            output_decoder=output_decoder,
        )
        self._fsync = bool(fsync)
        self._fd: int | None = None
        self._size = 0
        # The file's last line is whole but lacks its newline: the next write starts with one.
        self._unterminated = False
        self._broken: BaseException | None = None

    # -- event loop side ---------------------------------------------------------

    def _encode(
        self, result: WorkItemResult[Any], output: JSONValue, fingerprint: str, prompt: str | None
    ) -> bytes:
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

        return encode_result(result, envelope, output=output) + b"\n"

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
        """Write the header into an empty file, or prove the file ours and repair its tail.

        Returns the size to append at. Refuses (ArtifactStoreError, nothing
        written) a file that is not provably ours; see ``_jsonl_layout.py``.
        """
        size = os.fstat(fd).st_size
        if size > 0:
            with open(self._path, "rb") as f:
                first = f.readline(_MAX_HEADER_BYTES)
                if first.endswith(b"\n") or (len(first) == size and parses(first)):
                    self._check_identity(self._parse_header(first)["identity"])
                    if not first.endswith(b"\n"):
                        self._unterminated = True  # a header alone, its newline stripped
                        return size
                    return self._settle_tail(fd, f, size)
            if len(first) < size and first.startswith(HEADER_MAGIC):
                raise ArtifactStoreError(
                    f"{self._path}: line 1 is a corrupt trio-batch-llm header (no end within "
                    f"{_MAX_HEADER_BYTES} bytes); the file was left untouched"
                )
            if len(first) < size or not looks_torn(first, HEADER_MAGIC):
                raise self._not_ours(first)
            # Only a torn header: the first write of a run was interrupted; nothing was stored.
            logger.warning(
                "%s: discarding a torn header (%d bytes: %s), left by an interrupted first write; "
                "starting afresh", self._path, size, preview(first),
            )
            os.ftruncate(fd, 0)
        created = size == 0
        header = {
            "kind": "header",
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "identity": self._known_identity.to_dict(),
            "identity_fingerprint": self._identity_fp,
            "created_at": datetime.datetime.now(datetime.UTC).isoformat(),
            "library_version": __version__,
        }
        data = encode_record(header) + b"\n"
        assert data.startswith(HEADER_MAGIC)
        _write_all(fd, data)
        if self._fsync:
            _datasync(fd)
            if created:
                _sync_directory(self._path)
        return len(data)

    def _not_ours(self, first: bytes) -> ArtifactStoreError:
        return ArtifactStoreError(
            f"{self._path} is not a trio-batch-llm checkpoint: its first line ({preview(first)}) does "
            f"not start with {HEADER_MAGIC.decode()}; it was left untouched. Choose another path, "
            "or remove the file if it holds nothing you need"
        )

    def _settle_tail(self, fd: int, f: BinaryIO, size: int) -> int:
        """Keep a whole last record, cut a torn one, refuse anything else. Returns the size."""
        keep = last_newline_end(f, size)
        if keep == size:
            return size
        f.seek(keep)
        tail = f.read(size - keep)
        body = tail.rstrip(b"\0")
        if body and parses(body):
            line = line_number(f, keep)
            self._parse_record(body, line)  # whole JSON that is not a record of ours: refused
            if len(body) < len(tail):
                self._cut(fd, keep + len(body), f"{len(tail) - len(body)} NUL bytes after line {line}, "
                          "left by an interrupted write (the record before them is whole and kept)")
            self._unterminated = True
            return keep + len(body)
        line = line_number(f, keep)
        if not looks_torn(tail, RECORD_MAGIC):
            raise ArtifactStoreError(
                f"{self._path}: line {line} is not a complete record and not the start of one "
                f"({preview(tail)}); this store did not write it, so it is not cut. Remove or "
                "repair that line to resume from this file"
            )
        item_id = torn_item_id(body)
        who = f"item {item_id!r}" if item_id is not None else "its item"
        self._cut(fd, keep, f"{len(tail)} bytes of line {line} (from byte {keep}: {preview(tail)}): "
                  f"an incomplete record (a torn write, left by an interrupted append); {who} runs again")
        return keep

    def _cut(self, fd: int, size: int, what: str) -> None:
        logger.warning("%s: cutting %s", self._path, what)
        os.ftruncate(fd, size)
        if self._fsync:
            _datasync(fd)

    def _parse_header(self, line: bytes) -> dict[str, Any]:
        if not line.startswith(HEADER_MAGIC):
            raise self._not_ours(line)
        try:
            header = json.loads(line)
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT_NAME or "identity" not in header:
            raise ArtifactStoreError(
                f"{self._path}: line 1 is a corrupt trio-batch-llm header ({preview(line)}); "
                "the file was left untouched"
            )
        check_format_version(self._path, header)
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
        """Every record in file order; a whole last record without its newline included.

        ``skip_torn_tail``: a reader ignores a torn header or last line (the
        writer's ``open()`` repairs it); otherwise an incomplete line is an error.
        """
        with open(self._path, "rb") as f:
            first = f.readline(_MAX_HEADER_BYTES)
            if not first.endswith(b"\n") and not parses(first):
                if f.read(1) or not looks_torn(first, HEADER_MAGIC):
                    raise self._not_ours(first)
                if skip_torn_tail:
                    return  # empty, or only a torn header: no results yet
                raise ArtifactStoreError(f"{self._path}: line 1 is an incomplete header")
            self._parse_header(first)
            for number, line in enumerate(f, start=2):
                if not line.endswith(b"\n") and not parses(line.rstrip(b"\0")):
                    if skip_torn_tail:
                        return  # readers leave a torn tail for the writer's open() to repair
                    raise ArtifactStoreError(f"{self._path}: line {number} is incomplete")
                yield self._parse_record(line.rstrip(b"\0") if not line.endswith(b"\n") else line, number)

    def _load_sync(self) -> dict[str, StoredRecord]:
        with self._io_errors("loading"):
            return {record.item_id: record for record in self._records(skip_torn_tail=False)}

    def _count_sync(self) -> int:
        with self._io_errors("counting records"), open(self._path, "rb") as f:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(_COUNT_CHUNK), b""))
        # An unterminated last line is a whole record, unless it is the header itself.
        return max(0, lines - 1 + (self._unterminated and lines > 0))

    def _write_sync(self, items: Sequence[bytes]) -> None:
        if self._broken is not None:
            raise ArtifactStoreError(
                f"{self._path}: the store is unusable after an earlier write could not be undone"
            ) from self._broken
        fd = self._fd
        assert fd is not None
        data = b"".join(items)
        if self._unterminated:
            data = b"\n" + data  # end the kept last line first; undone with the batch if it fails
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
        self._unterminated = False

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
        open, never modifies the file, ignores a torn last line (but not a
        whole last record without its newline), decodes outputs like
        ``load()``, and does not check the identity. Superseded records are
        included (in order).
        """
        with self._io_errors("reading"):
            for record in self._records(skip_torn_tail=True):
                yield self._decoded(record).to_result(replayed=False)
