"""The DB argument of the ``runs`` commands: a SQLite file's path, or a PostgreSQL database.

A PostgreSQL database is a ``postgresql://`` URL or a libpq keyword string
(``"host=... dbname=... password=..."``); anything else is a path.
:class:`RunDb` is what the commands pass around: ``target`` goes to
``open_run`` and the readers as it is (with its password), while ``str()``
-- everything printed, every hint and error -- is the path, or the URL or
keyword string with its credentials redacted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import final

from .._values._conninfo import display, is_postgres_store
from ._command import UsageError

__all__ = ["RunDb"]


@final
@dataclass(frozen=True, slots=True)
class RunDb:
    target: str | Path = field(repr=False)

    @classmethod
    def of(cls, text: str) -> RunDb:
        return cls(text if is_postgres_store(text) else Path(text))

    @property
    def is_url(self) -> bool:
        return isinstance(self.target, str)

    @property
    def path(self) -> Path | None:
        return self.target if isinstance(self.target, Path) else None

    def __str__(self) -> str:
        return display(self.target) if isinstance(self.target, str) else str(self.target)

    def exists(self) -> bool:
        """Whether there may be runs there (a URL: the server says, when it is asked)."""
        return self.path.exists() if self.path is not None else True

    def check(self) -> None:
        """A path must be a regular file (or none yet) in an existing directory."""
        path = self.path
        if path is None:
            return
        if path.exists() and not path.is_file():
            raise UsageError(f"{path}: not a regular file")
        if not path.parent.is_dir():
            raise UsageError(f"{path}: the directory {path.parent} does not exist")

    def samefile(self, other: Path) -> bool:
        path = self.path
        return path is not None and path.exists() and other.exists() and path.samefile(other)
