"""The close surface shared by the owners built on a host (processor, pool)."""

from __future__ import annotations

from types import TracebackType

from .._core._ledger import CleanupLedger, unwrap_group
from ._executor import ExecutorHost

__all__ = ["HostedOwner"]


class HostedOwner:
    """An owner that either owns its host (and closes through the host's ledger) or shares one.

    Sharing a host, the owner has a ledger of its own for its own steps; the
    host's admission and leases close when the host does.
    """

    _host: ExecutorHost
    _ledger: CleanupLedger
    _owns_host: bool

    def _init_owner(self, host: ExecutorHost | None, default_host: ExecutorHost, name: str) -> None:
        self._owns_host = host is None
        self._host = host if host is not None else default_host
        self._ledger = self._host.ledger if self._owns_host else CleanupLedger(name)

    async def _exit_owner(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        """Close; ``True`` when the host's task group absorbed ``exc`` (the owner's exit returns it)."""
        with unwrap_group():
            if self._owns_host:
                # The owner's block runs inside the host's task group: a Cancelled of that group's
                # own scope (a runtime task failed) ends there. Dropped, this verdict made Python
                # re-raise the Cancelled past its scope, out of the owner's block (issue 37).
                return bool(await self._host.exit_with(exc_type, exc, tb)) and exc is not None
            await self._ledger.aclose(body_exception=exc, automatic=True)
            return False

    async def aclose(self) -> None:
        """Close everything this owner holds, in order; a later call retries the steps that failed.

        See "What closing does" and "Closing again" in the cleanup contract (docs).
        """  # CONTRACT C2, C4.2
        with unwrap_group():
            await self._ledger.aclose()

    async def cleanup(self) -> None:
        """async-batch-llm's name for :meth:`aclose`."""
        await self.aclose()

    async def shutdown(self) -> None:
        """async-batch-llm's name for :meth:`aclose` (there too the ordered close, not a force close)."""
        await self.aclose()

    def force_close(self) -> None:
        """Abandon the running close step and skip the rest: the operator's escape from a cleanup that hangs.

        The same as a second Ctrl+C (see "When you are cancelled while closing" in the cleanup contract).
        """  # CONTRACT C3.3
        self._ledger.force_close()

    def force_close_from_thread(self) -> None:
        """:meth:`force_close` from another thread; never blocks."""
        self._ledger.force_close_from_thread()

    def only_strategy_cleanup_failed(self) -> bool:
        """Whether the last close failed, and only in user strategies' ``cleanup()``.

        Then work that completed before the close may keep its result; ``False``
        after an aborted close, or while no close has finished.
        """
        return self._ledger.only_failed_in("strategies")

    @property
    def state(self) -> str:
        """``open``, ``closing`` or ``closed``, in that order only (a failed close stays ``closing``)."""
        return str(self._ledger.state)

    @property
    def host(self) -> ExecutorHost:
        return self._host
