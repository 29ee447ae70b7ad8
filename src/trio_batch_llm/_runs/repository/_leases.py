"""Leases: how many drivers share one live run, on SQLite and on PostgreSQL alike.

A driver *opens a lease* on a run (a row of ``run_drivers``, with a fencing
``token`` from the run's own counter, never reused) and then *leases items*:
pending items become ``leased`` under its token. It renews the lease by
heartbeat; a lease whose ``expires_at`` has passed is dead for good (a late
heartbeat does not revive it). Whoever leases items next first *expires* the
dead leases of the run: their leased items go back to ``pending``. A result
is recorded only for an item leased under the writer's token, while its lease
is alive -- the check and the write are one transaction -- so a frozen driver
that wakes after its lease expired has its results refused (:class:`LeaseLostError`).

Calls made twice (the at-least-once case) are counted exactly, not guessed from
the items a lost lease held: a driver records that it *starts* an item's call
(:func:`start_calls`, under its live lease, before the call is sent) by writing
its token into the item's ``attempts`` (which a live run has no other use for:
there it is the token of the lease that last started a call of the item, 0 for
none). An item whose ``attempts`` holds another token when a call of it starts
was called before by a driver that never recorded its result (it lost its
lease, was killed or was cut short): that start is a repeated call, and adds one
to the run's ``runs.expired_lease_items`` (named before it counted this; ``runs
status`` shows it as ``reexecuted_after_lease_expiry``). An item a lost lease
held but had not started goes back to the pool uncounted. Writing the token
(rather than adding one) keeps the write a no-op when it is replayed after a
commit whose answer was lost. The start is also a fence: a driver whose lease
died cannot start a call on an item it no longer holds.

Time is the repository's ``clock`` (seconds, ``time.time`` by default; a
test injects a fake one): every expiry decision compares the caller's now with
the stored ``expires_at``. Across machines the clocks must agree to well
within a lease (NTP does).

Lock order, everywhere: the run's row, then driver rows, then item rows; so
leasing, expiring and recording never deadlock against each other on
PostgreSQL. Item leasing there uses ``FOR UPDATE SKIP LOCKED``, so drivers
leasing at once take disjoint slices without waiting for each other; SQLite
has one writer at a time (``BEGIN IMMEDIATE``), which gives the same.

Every function runs inside its caller's write transaction (the repository
opens and commits it); ``d`` says which SQL dialect the connection speaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, final

from .._schema import LeaseLostError, PendingItem
from ._dialect import Connection, Dialect
from ._writes import lock_run

__all__ = [
    "DRIVERS_TABLE_SQL", "DriverRecord", "LeaseReport", "check_lease", "close_lease", "count_done",
    "expire_leases", "lease_items", "open_lease", "renew_lease", "report", "start_calls", "unstart_calls",
]

DRIVERS_TABLE_SQL: Final = """CREATE TABLE IF NOT EXISTS run_drivers (
    run_id TEXT NOT NULL,
    token BIGINT NOT NULL,
    driver_id TEXT NOT NULL,
    state TEXT NOT NULL,
    lease_seconds DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    items_done BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, token)
)"""


@final
@dataclass(frozen=True, slots=True)
class DriverRecord:
    """One lease of a run: who (``driver_id``), its state (active/expired/stopped), its heartbeat."""

    driver_id: str
    token: int
    state: str
    items_done: int
    started_at: float
    last_heartbeat: float
    expires_at: float


@final
@dataclass(frozen=True, slots=True)
class LeaseReport:
    """What ``runs status`` shows of a run's drivers.

    ``reexecuted``: calls started again for an item whose earlier call was started by a driver
    that never recorded its result (see the module docstring); ``working``: the ids of the
    drivers whose lease is alive now (state ``active``, not past ``expires_at``), oldest first.
    """

    drivers: tuple[DriverRecord, ...]
    reexecuted: int
    leased: int
    working: tuple[str, ...] = ()

    @property
    def active(self) -> int:
        """How many drivers work on the run now."""
        return len(self.working)

    @property
    def expired_lease_items(self) -> int:
        """The former name of :attr:`reexecuted` (kept for scripts that read it)."""
        return self.reexecuted


def open_lease(conn: Connection, d: Dialect, location: str, run_id: str, driver_id: str, *,
               lease_seconds: float, now: float) -> int:
    """A new lease for ``driver_id``; its fencing token (the run's next)."""
    # The token comes from a counter on the run's row, bumped under the run's lock: two drivers
    # opening at once get two tokens, and a token is never handed out twice, whatever happened to
    # the lease that had it -- which is what lets a token fence off a driver that wakes up late.
    lock_run(conn, d, location, run_id)
    conn.execute(d.sql("UPDATE runs SET lease_counter = lease_counter + 1 WHERE run_id = ?"), (run_id,))
    (token,) = conn.execute(d.sql("SELECT lease_counter FROM runs WHERE run_id = ?"), (run_id,)).fetchone()
    conn.execute(
        d.sql("INSERT INTO run_drivers (run_id, token, driver_id, state, lease_seconds, started_at,"
              " heartbeat_at, expires_at) VALUES (?, ?, ?, 'active', ?, ?, ?, ?)"),
        (run_id, token, driver_id, lease_seconds, now, now, now + lease_seconds),
    )
    return int(token)


def expire_leases(conn: Connection, d: Dialect, location: str, run_id: str, *, now: float) -> int:
    """End the run's leases past their expiry; their leased items back to pending. How many items."""
    # Read first, without the run's lock: nearly always nothing has expired, and leasing items
    # then never queues behind the run's other writers.
    dead = [token for (token,) in conn.execute(
        d.sql("SELECT token FROM run_drivers WHERE run_id = ? AND state = 'active' AND expires_at < ?"),
        (run_id, now),
    ).fetchall()]
    if not dead:
        return 0
    lock_run(conn, d, location, run_id)  # lock order: the run first
    among, params = d.any_of("token", dead)
    # ``state = 'active'`` again: a second driver expiring the same leases meanwhile (it committed
    # while this one waited for the run's lock) leaves this update nothing to do. A lease once
    # found dead is ended even if a heartbeat from a slower clock slipped in since: its holder
    # learns at its next heartbeat or write, and recorded nothing in between (both check the lease).
    conn.execute(
        d.sql(f"UPDATE run_drivers SET state = 'expired' WHERE run_id = ? AND state = 'active' AND {among}"),
        (run_id, *params),
    )
    # Uncounted here: an item that its dead driver had started counts when its call starts again.
    among, params = d.any_of("lease_token", dead)
    return int(conn.execute(
        d.sql(f"UPDATE run_items SET state = 'pending', lease_token = NULL WHERE run_id = ?"
              f" AND state = 'leased' AND {among}"),
        (run_id, *params),
    ).rowcount)


def check_lease(conn: Connection, d: Dialect, run_id: str, token: int, *, now: float) -> None:
    """Raise :class:`LeaseLostError` unless lease ``token`` is alive at ``now``.

    Called inside the write it guards, after the run's lock (on PostgreSQL): whoever could end the
    lease (an expirer, a close) takes that lock first, so the lease stays alive until the write
    commits -- a driver frozen past its expiry is refused here, never half-recorded."""
    row = conn.execute(
        d.sql("SELECT state, expires_at FROM run_drivers WHERE run_id = ? AND token = ?"), (run_id, token)
    ).fetchone()
    if row is None:
        raise LeaseLostError(f"run {run_id!r}: no lease {token}")
    state, expires_at = row
    # Past ``expires_at`` is dead even while nobody has marked it expired yet: the decision rests
    # on the clock alone, so no driver ever acts on a lease another driver already counts as dead.
    if state != "active" or expires_at < now:
        how = "ended" if state == "stopped" else "expired"
        raise LeaseLostError(f"run {run_id!r}: lease {token} has {how}; its results are refused")


def lease_items(conn: Connection, d: Dialect, location: str, run_id: str, token: int, *, limit: int,
                now: float) -> list[PendingItem]:
    """Expire dead leases, then lease up to ``limit`` pending items (ingestion order) under ``token``;
    none unless the run is ``running``."""
    # Expiring first hands a dead driver's items to this live one (the oldest pending come first).
    expire_leases(conn, d, location, run_id, now=now)
    check_lease(conn, d, run_id, token, now=now)
    (status,) = conn.execute(d.sql("SELECT status FROM runs WHERE run_id = ?"), (run_id,)).fetchone()
    if status != "running":
        return []  # paused or ended: no driver takes new work, whenever it last looked at the status
    # PostgreSQL: FOR UPDATE SKIP LOCKED locks the rows it returns and passes over rows another
    # leaser holds, so drivers leasing at once take disjoint slices without waiting, and the rows
    # chosen cannot change before the UPDATE below marks them ours.
    rows = conn.execute(
        d.sql("SELECT ingest_seq, item_id, prompt, context, attempts FROM run_items"
              f" WHERE run_id = ? AND state = 'pending' ORDER BY ingest_seq LIMIT ?{d.skip_locked}"),
        (run_id, limit),
    ).fetchall()
    items = [PendingItem(*row) for row in rows]
    if items:
        among, params = d.any_of("item_id", [item.item_id for item in items])
        conn.execute(
            d.sql(f"UPDATE run_items SET state = 'leased', lease_token = ? WHERE run_id = ? AND {among}"),
            (token, run_id, *params),
        )
    return items


def renew_lease(conn: Connection, d: Dialect, run_id: str, token: int, *, now: float) -> bool:
    """Extend a live lease by its length from ``now``; False if it is dead already (it stays dead)."""
    # One conditional UPDATE: the liveness check and the extension cannot be split by an expirer,
    # and a heartbeat that comes late finds ``expires_at`` passed and revives nothing.
    return bool(conn.execute(
        d.sql("UPDATE run_drivers SET heartbeat_at = ?, expires_at = ? + lease_seconds"
              " WHERE run_id = ? AND token = ? AND state = 'active' AND expires_at >= ?"),
        (now, now, run_id, token, now),
    ).rowcount == 1)


def close_lease(conn: Connection, d: Dialect, location: str, run_id: str, token: int) -> int:
    """End the lease (its driver stops); its unrecorded items back to pending. How many.

    Uncounted, whether the driver stopped cleanly or was cut short: those of them whose call it
    had started count when their call starts again (:func:`start_calls`)."""
    lock_run(conn, d, location, run_id)
    # ``state = 'active'``: a lease that expired first stays 'expired' (the report tells them apart).
    conn.execute(
        d.sql("UPDATE run_drivers SET state = 'stopped' WHERE run_id = ? AND token = ? AND state = 'active'"),
        (run_id, token),
    )
    return int(conn.execute(
        d.sql("UPDATE run_items SET state = 'pending', lease_token = NULL"
              " WHERE run_id = ? AND state = 'leased' AND lease_token = ?"),
        (run_id, token),
    ).rowcount)


def start_calls(conn: Connection, d: Dialect, location: str, run_id: str, token: int, item_ids: list[str], *,
                now: float) -> list[str]:
    """Record that calls of ``item_ids`` start now under lease ``token``; the ids it holds (only
    those may be called). Each start of an item called before without a recorded result adds
    one to the run's count of repeated calls. :class:`LeaseLostError` if the lease is dead."""
    lock_run(conn, d, location, run_id)  # lock order: the run, then its items (as record does)
    check_lease(conn, d, run_id, token, now=now)
    held: list[str] = []
    again = 0
    for chunk in d.chunks(item_ids):
        among, params = d.any_of("item_id", chunk)
        where = f" WHERE run_id = ? AND state = 'leased' AND lease_token = ? AND {among}"
        rows = conn.execute(d.sql("SELECT item_id, attempts FROM run_items" + where),
                            (run_id, token, *params)).fetchall()
        # The token, not attempts + 1: a start replayed after a commit whose answer was lost
        # writes what is there already, and counts nothing twice (``started_by == token``).
        if rows:
            conn.execute(d.sql("UPDATE run_items SET attempts = ?" + where), (token, run_id, token, *params))
        held += [item_id for item_id, _ in rows]
        again += sum(1 for _, started_by in rows if started_by not in (0, token))
    if again:
        conn.execute(d.sql("UPDATE runs SET expired_lease_items = expired_lease_items + ? WHERE run_id = ?"),
                     (again, run_id))
    return held


def unstart_calls(conn: Connection, d: Dialect, location: str, run_id: str, token: int,
                  item_ids: list[str]) -> None:
    """Forget the starts of ``item_ids`` under lease ``token``: their calls never went out (a stop
    ended them while they waited for admission), so starting them again repeats no call."""
    lock_run(conn, d, location, run_id)
    for chunk in d.chunks(item_ids):
        among, params = d.any_of("item_id", chunk)
        # ``attempts = token``: only this lease's own starts are forgotten, never an earlier
        # driver's start that a later call of the item must still count as repeated.
        conn.execute(d.sql("UPDATE run_items SET attempts = 0 WHERE run_id = ? AND state = 'leased'"
                           f" AND lease_token = ? AND attempts = ? AND {among}"),
                     (run_id, token, token, *params))


def count_done(conn: Connection, d: Dialect, run_id: str, token: int, n: int) -> None:
    conn.execute(d.sql("UPDATE run_drivers SET items_done = items_done + ? WHERE run_id = ? AND token = ?"),
                 (n, run_id, token))


def report(conn: Connection, d: Dialect, run_id: str, *, now: float, drivers_limit: int = 100) -> LeaseReport:
    # Four reads, not one snapshot: a status display, where counts a moment apart are as good.
    rows = conn.execute(
        d.sql("SELECT driver_id, token, state, items_done, started_at, heartbeat_at, expires_at"
              " FROM run_drivers WHERE run_id = ? ORDER BY token DESC LIMIT ?"),
        (run_id, drivers_limit),
    ).fetchall()
    (expired,) = conn.execute(d.sql("SELECT expired_lease_items FROM runs WHERE run_id = ?"),
                              (run_id,)).fetchone()
    (leased,) = conn.execute(
        d.sql("SELECT COUNT(*) FROM run_items WHERE run_id = ? AND state = 'leased'"), (run_id,)
    ).fetchone()
    working = conn.execute(
        d.sql("SELECT driver_id FROM run_drivers WHERE run_id = ? AND state = 'active' AND expires_at >= ?"
              " ORDER BY token"),
        (run_id, now),
    ).fetchall()
    return LeaseReport(tuple(DriverRecord(*row) for row in reversed(rows)), int(expired), int(leased),
                       tuple(driver_id for (driver_id,) in working))
