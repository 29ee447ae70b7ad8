"""Checking a big JSONL file on every core: byte ranges checked in forked children, then merged.

Parsing is most of the time before the first call (a million lines are
about two seconds of ``json`` on one core of a small machine), and the lines
are independent, so the file is cut at line starts into one range per core
(at most :data:`MAX_WORKERS`). The first range is checked here while forked
children check the others (:func:`~._input_jsonl.scan_range`) and send back
what they found through a pipe: counts, the first problems, the hashes of
their ids. Hashes agree across the children because a forked child keeps its
parent's hash seed. Each child is owned by :func:`scan_parallel`: it is
waited for on every path, and killed first if the parent leaves early (an
error, a Ctrl+C). Where ``fork`` is missing or unsafe (not Linux, or other
threads are running), with one core, or for a small file, the whole file is
checked here.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from ._input_jsonl import JsonlPart, scan_range
from ._input_records import MAX_REPORTED, InputError

__all__ = ["MAX_WORKERS", "PARALLEL_FROM_BYTES", "MergedScan", "scan_parallel"]

MAX_WORKERS: Final = 4
PARALLEL_FROM_BYTES: Final = 16 * 1024 * 1024
"""Smaller files are checked in this process: forking would cost more than it saves."""


class MergedScan:
    """The whole file's findings, numbered as in the file."""

    def __init__(self) -> None:
        self.items = 0
        self.problems: list[InputError] = []
        self.problem_count = 0
        self.suspects: set[int] = set()
        self._seen: set[int] = set()
        self._lines = 0
        self._entries = 0

    def add(self, path: Path, part: JsonlPart) -> None:
        """Fold in the next range's part (ranges in file order)."""
        self.items += part.items
        self.problem_count += part.problem_count
        for problem, line, field in part.problems:
            if len(self.problems) < MAX_REPORTED:
                self.problems.append(InputError(path, problem, line=self._lines + line, field=field))
        suspects = self.suspects
        suspects.update(part.suspects)
        if part.hash_set is not None and not self._seen:
            self._seen = part.hash_set  # the first range, checked here: its set as it is
        elif part.hash_set is not None:
            suspects.update(self._seen.intersection(part.hash_set))
            self._seen.update(part.hash_set)
        seen = self._seen
        generated = [hash(f"item-{self._entries + index}") for index in part.generated]
        for hashes in (part.hashes, generated):  # each list holds a hash once
            suspects.update(seen.intersection(hashes))  # both C loops, no Python code per id
            seen.update(hashes)
        self._lines += part.lines
        self._entries += part.entries


def _workers(size: int) -> int:
    # fork() copies only the calling thread: with other threads running (a program that calls the
    # command line's main() itself) a child could inherit a lock held forever, so it is not used.
    if not sys.platform.startswith("linux") or size < PARALLEL_FROM_BYTES or threading.active_count() > 1:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - Linux has it
        cores = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


def _split(path: Path, size: int, parts: int) -> list[int]:
    """Offsets where each range starts: just after a newline near each ``size / parts``."""
    starts = [0]
    with path.open("rb") as f:
        for n in range(1, parts):
            f.seek(max(starts[-1], size * n // parts))
            f.readline()  # to the start of the next line
            offset = f.tell()
            if offset >= size:
                break
            if offset > starts[-1]:
                starts.append(offset)
    return starts


def scan_parallel(path: Path) -> MergedScan:
    """Check the whole JSONL file, on several cores when it is big (see the module docstring)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(path, f"cannot read it: {exc.strerror or exc}") from None
    workers = _workers(size)
    starts = _split(path, size, workers) if workers > 1 else [0]
    ends: Sequence[int | None] = [*starts[1:], None]
    children: list[tuple[int, int]] = []  # (pid, read end of its pipe)
    try:
        for start, end in zip(starts[1:], ends[1:], strict=True):
            children.append(_fork_scan(path, start, end))
        merged = MergedScan()
        merged.add(path, scan_range(path, 0, ends[0], keep_set=True))
        for pid, reader in children:
            merged.add(path, _collect(path, pid, reader))
        children.clear()
        return merged
    finally:
        for pid, reader in children:  # left early: stop and reap what is still running
            os.close(reader)
            _kill_and_reap(pid)


def _fork_scan(path: Path, start: int, end: int | None) -> tuple[int, int]:
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: check its range, send the part, and leave without running any cleanup
        status = 1
        try:
            os.close(reader)
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # the parent decides about Ctrl+C
            result: tuple[object, ...]
            try:
                result = ("part", scan_range(path, start, end))
            except InputError as exc:  # the file cannot be read: the parent reports it
                result = ("error", exc.problem, exc.line, exc.field)
            data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(data)
            while view:
                view = view[os.write(writer, view):]
            status = 0
        finally:
            os._exit(status)
    os.close(writer)
    return pid, reader


def _collect(path: Path, pid: int, reader: int) -> JsonlPart:
    chunks = []
    try:
        while chunk := os.read(reader, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(reader)
    _, status = os.waitpid(pid, 0)
    if status != 0 or not chunks:
        raise InputError(path, f"checking part of the file failed in a helper process (status {status})")
    result = pickle.loads(b"".join(chunks))
    if result[0] == "error":
        _, problem, line, field = result
        raise InputError(path, problem, line=line, field=field)
    part = result[1]
    assert isinstance(part, JsonlPart)
    return part


def _kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
