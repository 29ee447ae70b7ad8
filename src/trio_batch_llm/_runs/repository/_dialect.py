"""What SQLite and PostgreSQL spell differently in the run-state SQL, and nothing else.

The run-state statements (:mod:`._sql`, :mod:`._writes`, :mod:`._leases`) are
written once, with ``?`` placeholders, and passed through :meth:`Dialect.sql`
on their way to the connection. A :class:`Dialect` holds only what the two
engines truly spell apart: the placeholder, a list parameter, the row locks
PostgreSQL needs and SQLite's single writer makes needless, "no limit", and
the order of runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar, final

__all__ = ["POSTGRES", "SQLITE", "Connection", "Cursor", "Dialect"]

T = TypeVar("T")


class Cursor(Protocol):
    """What the run-state SQL reads back from a statement (sqlite3's and psycopg's cursors alike)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...  # a row of the statement's own columns (or None)

    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """A connection inside its caller's transaction: sqlite3's or psycopg's (which stays an extra)."""

    def execute(self, query: str, params: Sequence[object] = ..., /) -> Cursor: ...


@final
@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    mark: str  # the parameter placeholder
    # Appended to ``SELECT … FROM runs`` to lock the run's row. SQLite: empty, because each write
    # transaction is ``BEGIN IMMEDIATE`` and holds the whole database's write lock from its first
    # statement: no second writer exists to lock against. PostgreSQL: ``FOR UPDATE``.
    lock_run_suffix: str
    # Appended to the item lease SELECT: on PostgreSQL drivers leasing at once skip each other's
    # locked rows (disjoint slices, no waiting); SQLite has nobody to skip.
    skip_locked: str
    # Parameters per list: SQLite builds before 3.32 allow 999 in one statement; PostgreSQL passes a
    # list as one array parameter, so None (one statement, however long the list).
    max_list: int | None
    no_limit: int | None  # the LIMIT that means none: SQLite -1, PostgreSQL NULL (LIMIT ALL)
    # Runs listed oldest first; ties broken by name (SQLite) or by the creation sequence (PostgreSQL,
    # where many machines may create runs within one timestamp).
    run_order: str

    @property
    def row_locks(self) -> bool:
        """Whether a write must lock the run's row itself (no database-wide writer lock)."""
        return bool(self.lock_run_suffix)

    def sql(self, text: str) -> str:
        """``text`` (written with ``?`` placeholders) as this dialect spells it."""
        return text if self.mark == "?" else text.replace("?", self.mark)

    def marks(self, n: int) -> str:
        return ", ".join([self.mark] * n)

    def any_of(self, column: str, values: Sequence[object]) -> tuple[str, tuple[object, ...]]:
        """``column`` is one of ``values``: the SQL condition (``?`` placeholders) and its parameters."""
        if self.name == "postgresql":
            return f"{column} = ANY(?)", (list(values),)
        return f"{column} IN ({', '.join('?' * len(values))})", tuple(values)

    def chunks(self, values: Sequence[T]) -> Iterator[Sequence[T]]:
        """``values`` in lists short enough for one statement each."""
        step = self.max_list or max(len(values), 1)
        for start in range(0, len(values), step):
            yield values[start:start + step]


SQLITE: Final = Dialect("sqlite", "?", "", "", 500, -1, "created_at, run_id")
POSTGRES: Final = Dialect("postgresql", "%s", " FOR UPDATE", " FOR UPDATE SKIP LOCKED", None, None,
                          "created_at, created_seq")
