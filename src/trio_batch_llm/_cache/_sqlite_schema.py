"""The response cache's SQLite file: where it lives by default, how it is created private, whose it is.

* **Location.** ``path=None`` is ``trio-batch-llm/response-cache.sqlite3`` in the
  platform's cache folder: ``$XDG_CACHE_HOME`` (or ``~/.cache``) on Linux and other
  Unixes, ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows.
* **Private.** A new file is created ``0600`` whatever the umask (``os.open`` with
  ``O_EXCL``, then ``fchmod``); SQLite gives its ``-wal`` and ``-shm`` files the mode
  of the database file. An existing file is never chmod-ed behind its owner's back:
  if group or others may read it, a WARNING says so, once per file and process.
* **Provably ours.** The cache writes only to a file that is empty (a new or
  zero-byte file, or a database with no schema at all) or that carries our
  ``application_id``, our ``user_version`` and our ``cache_meta`` row. Anything
  else (another program's database, an artifact store, a text file) is refused with
  an error naming the path, before anything is written: not even WAL mode is set,
  which would change the file's header.

Blocking by design: every function runs in the connection's worker thread.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import sys
import threading
from pathlib import Path
from typing import Final, Literal

from .._values._errors import ArtifactStoreError

__all__ = [
    "CACHE_APPLICATION_ID",
    "SCHEMA_VERSION",
    "classify_cache_file",
    "create_private_file",
    "default_cache_path",
    "initialise_schema",
    "warn_if_shared",
]

logger = logging.getLogger("trio_batch_llm.cache")

CACHE_APPLICATION_ID: Final = 0x54424C43  # "TBLC": not the artifact store's "TBLL"
SCHEMA_VERSION: Final = 1
SCHEMA_NAME: Final = "trio-batch-llm-response-cache"
_OUR_TABLES: Final = frozenset({"cache_meta", "entries", "claims"})
_SCHEMA: Final = (
    "CREATE TABLE cache_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # answer: the CachedAnswer's JSON; request: the key's canonical request, NULL when not stored.
    """CREATE TABLE entries (
        digest TEXT PRIMARY KEY,
        answer TEXT NOT NULL,
        request TEXT,
        created_at REAL NOT NULL,
        last_used REAL NOT NULL
    )""",
    "CREATE INDEX entries_by_use ON entries (last_used)",
    "CREATE TABLE claims (digest TEXT PRIMARY KEY, holder TEXT NOT NULL, until REAL NOT NULL)",
)

_warned: set[str] = set()
_warned_lock = threading.Lock()


def default_cache_path() -> Path:
    """``response-cache.sqlite3`` in this platform's cache folder (see the module docstring)."""
    home = Path.home
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        base = Path(local) if local else home() / "AppData" / "Local"
    elif sys.platform == "darwin":
        base = home() / "Library" / "Caches"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        # The XDG spec: a relative value is invalid and must be ignored.
        base = Path(xdg) if xdg and os.path.isabs(xdg) else home() / ".cache"
    return base / "trio-batch-llm" / "response-cache.sqlite3"


def create_private_file(path: Path, *, default_location: bool) -> bool:
    """Create ``path`` ``0600`` if it does not exist; whether it did.

    For the default location, its folder is created too (``0700``); a path the user
    named must have its folder already, as any file argument must.
    """
    if default_location:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    except FileExistsError:
        return False
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o600)  # the umask may only have narrowed it; set exactly 0600
    finally:
        os.close(fd)
    return True


def warn_if_shared(path: Path) -> None:
    """A WARNING, once per file and process, if group or others may read the cache file at ``path``."""
    if sys.platform == "win32":
        return  # modes do not describe Windows ACLs
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # opening it reports the problem
    if not stat.S_ISREG(mode) or not mode & 0o077:
        return
    key = str(path.resolve())
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(
        "%s: the response cache file is readable by others (mode %s); it holds prompts and answers: "
        "chmod 600 it if that is not meant", path, oct(stat.S_IMODE(mode)))


def classify_cache_file(conn: sqlite3.Connection, path: Path) -> Literal["empty", "ours"]:
    """Whether the open database is empty (may be initialised) or our cache; ArtifactStoreError otherwise.

    Reads only, in one snapshot (a deferred transaction), so another process's commit
    creating the schema is seen whole or not at all.
    """
    own_snapshot = not conn.in_transaction
    try:
        if own_snapshot:
            conn.execute("BEGIN")
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        marker = None
        if "cache_meta" in tables:
            row = conn.execute("SELECT value FROM cache_meta WHERE key = 'schema'").fetchone()
            marker = row[0] if row else None
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", None) != "SQLITE_NOTADB":
            raise
        raise ArtifactStoreError(f"{path} is not a trio-batch-llm response cache (it is not an SQLite "
                                 "database); it was left untouched") from None
    finally:
        if own_snapshot and conn.in_transaction:
            conn.execute("ROLLBACK")  # nothing was written: this only ends the snapshot
    if app_id == CACHE_APPLICATION_ID and tables >= _OUR_TABLES and marker == SCHEMA_NAME:
        if version == SCHEMA_VERSION:
            return "ours"
        raise ArtifactStoreError(
            f"{path}: the response cache's schema version is {version}, and this trio-batch-llm reads "
            f"version {SCHEMA_VERSION}; it was left untouched (use another cache file)")
    if app_id == 0 and version == 0 and objects == 0:
        return "empty"
    if app_id == CACHE_APPLICATION_ID:
        why = "it has the response cache's application_id but not its tables"
    elif app_id != 0:
        why = f"its application_id is {app_id:#x}, not the response cache's ({CACHE_APPLICATION_ID:#x})"
    elif objects:
        why = f"it holds {objects} schema object(s) ({', '.join(sorted(tables)) or 'no tables'})"
    else:
        why = f"its user_version is {version}, set by another program"
    raise ArtifactStoreError(f"{path} is not a trio-batch-llm response cache ({why}); an SQLite file the "
                             "cache did not create is never changed, and it was left untouched")


def initialise_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Inside a write transaction: make an empty database our cache (another process may have meanwhile)."""
    if classify_cache_file(conn, path) == "ours":
        return
    for statement in _SCHEMA:
        conn.execute(statement)
    conn.execute("INSERT INTO cache_meta (key, value) VALUES ('schema', ?)", (SCHEMA_NAME,))
    conn.execute(f"PRAGMA application_id={CACHE_APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
