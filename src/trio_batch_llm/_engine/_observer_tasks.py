"""An owner's async observers: started in a runtime group of their own, closed after the owner's run.

A processor and a pool both run them so: the group outlives the owner's workers (or its callers),
so the last terminal events and ``BatchFinished`` reach them before they close.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from .._host._executor import RuntimeTasks
    from .._observe._hooks import Hooks

__all__ = ["ObserverTasks"]


@final
class ObserverTasks:
    """The async observers of one owner's ``hooks`` (none: nothing to start or close but the hooks)."""

    __slots__ = ("_hooks", "_tasks")

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._tasks: RuntimeTasks | None = None

    def start(self, group: RuntimeTasks) -> None:
        """Run the observers in ``group`` (the owner's, made for them alone)."""
        self._tasks = group
        self._hooks.start_observers(group.start_soon)

    async def close(self) -> None:
        """The owner's ``async observers`` close step: the observers drain, then their group is idle."""
        await self._hooks.close_observers()
        if self._tasks is not None:
            await self._tasks.wait_idle()
