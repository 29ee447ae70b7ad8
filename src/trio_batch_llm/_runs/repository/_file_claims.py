"""Process-lifetime claims: an exclusive ``flock`` per key on a lock file.

The right to drive a run is an exclusive lock on ``<directory>/<digest of the
key>.lock``. The kernel drops it when the holding descriptor is closed or its
process dies, SIGKILL included, so the run of a dead process can be taken
over at once, with no heartbeat and no expiry to tune. A ``flock`` belongs to
one open file description, so two holders in the same process exclude each
other too. (Locking the SQLite database file itself would break SQLite's own
POSIX locks, which a process loses when it closes *any* descriptor of that file.)

The PostgreSQL counterpart is a session-level advisory lock: it too dies with
its holder's connection.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import final

from ..._values._errors import ArtifactStoreError

__all__ = ["FileClaims"]


@final
class FileClaims:
    """Claims held by this object, by key; blocking calls (run them off the event loop)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._held: dict[str, int] = {}

    def _lock_path(self, key: str) -> Path:
        # A digest, not the key: a run id may hold any character (a slash, a NUL) and any length.
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return self._directory / f"{digest}.lock"

    def try_claim(self, key: str) -> bool:
        """Take the claim on ``key`` if nobody (here or in another process) holds it."""
        if key in self._held:
            return False  # held by this object already (another driver in this process)
        path = self._lock_path(key)
        try:
            path.parent.mkdir(exist_ok=True)
            # O_CLOEXEC: a child process started meanwhile (a provider's CLI, a test's subprocess)
            # must not inherit the descriptor, or the claim would outlive this process in it.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise ArtifactStoreError(f"{path}: cannot open the lock file: {exc}") from exc
        if not _lock_nowait(fd):  # tried, never waited for: the caller reports the run as taken
            os.close(fd)
            return False
        self._held[key] = fd
        return True

    def release(self, key: str) -> None:
        fd = self._held.pop(key, None)
        if fd is not None:
            # Closing the descriptor drops the lock. The file stays: unlinking it would let another
            # process lock a new file under the same name while a third still holds the old one.
            os.close(fd)

    def release_all(self) -> None:
        for key in list(self._held):
            self.release(key)


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _lock_nowait(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

else:
    import fcntl

    def _lock_nowait(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
