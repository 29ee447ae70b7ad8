"""Which run repository a store argument names: the one place a new kind of storage plugs in.

``open_run(store, ...)`` and the offline readers (``read_run_snapshot``,
``list_runs``, ``iter_run_results``) take a store as a user names it: a
database path, a ``postgresql://`` URL or a libpq keyword string
(``"host=... dbname=..."``: :class:`PostgresRunRepository`), a
:class:`SqliteArtifactStore` (its file: the runs get tables of their own
there), or a ready :class:`RunRepository`, used as it is.
"""

from __future__ import annotations

import os

from ..._artifacts._sqlite import SqliteArtifactStore
from ..._values._config import ArtifactIdentity
from ..._values._conninfo import display, is_postgres_store
from ._postgres import PostgresRunRepository
from ._protocol import RunRepository
from ._sqlite import SqliteRunRepository

__all__ = ["RunStore", "describe_store", "repository_at"]

RunStore = str | os.PathLike[str] | SqliteArtifactStore | RunRepository


def repository_at(
    store: RunStore, *, identity: ArtifactIdentity | None = None, read_only: bool = False
) -> RunRepository:
    """The repository of ``store`` (not opened); ``identity`` goes into a file this creates."""
    if isinstance(store, SqliteArtifactStore):
        return SqliteRunRepository(store.path, identity=identity, read_only=read_only)
    if is_postgres_store(store):
        assert isinstance(store, str)
        return PostgresRunRepository(store, read_only=read_only)
    if isinstance(store, (str, os.PathLike)):
        return SqliteRunRepository(store, identity=identity, read_only=read_only)
    if isinstance(store, RunRepository):
        return store
    raise TypeError(f"store={describe_store(store)}: must be a path, a postgresql:// URL or libpq keyword "
                    "string, a SqliteArtifactStore or a RunRepository")


def describe_store(store: object) -> str:
    """``store`` for a message: a URL or keyword string without its credentials."""
    return display(store) if isinstance(store, str) else repr(store)
