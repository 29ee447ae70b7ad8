"""Progress in a Jupyter notebook: one output area, updated in place.

A notebook's ``sys.stderr`` is no terminal, so a bar redrawn with ``\\r``
would print a new line each time, and log lines go to the kernel's log, not
to the cell. What a notebook shows is a *display*: ``IPython.display.display(
obj, display_id=True)`` returns a handle whose ``update(obj)`` replaces the
output in place, in every front end (JupyterLab, classic, VS Code, Colab)
and without ipywidgets. ``obj`` offers HTML (a ``<progress>`` element and the
counters) and plain text (the same line as in a terminal).

IPython is looked up in ``sys.modules`` only: a kernel has imported it long
before any user code runs, and a plain script never pays for importing it.
"""

from __future__ import annotations

import html
import importlib
import sys
from typing import Any, final

from ._progress_line import format_progress_line
from ._snapshot import Progress, ProgressSnapshot

__all__ = ["NotebookProgress", "in_notebook"]


def _shell() -> Any | None:
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    if get_ipython is None:
        return None
    try:
        return get_ipython()
    except Exception:  # noqa: BLE001 - a broken or half-imported IPython is no notebook
        return None


def in_notebook() -> bool:
    """Whether this code runs in a Jupyter kernel (not a terminal IPython, not a script)."""
    shell = _shell()
    if shell is None:
        return False
    name = type(shell).__name__
    return name == "ZMQInteractiveShell" or "google.colab" in type(shell).__module__ or (
        name != "TerminalInteractiveShell" and getattr(shell, "kernel", None) is not None
    )


@final
class _ProgressView:
    """What the display shows for one snapshot: HTML for a notebook, the text line elsewhere."""

    __slots__ = ("line", "snapshot")

    def __init__(self, snapshot: ProgressSnapshot, line: str) -> None:
        self.snapshot = snapshot
        self.line = line

    def __repr__(self) -> str:
        return self.line

    def _repr_html_(self) -> str:
        snap = self.snapshot
        if snap.total is None:
            bar = "<progress style='width:20em'></progress>"  # no value: an indeterminate bar
        else:
            value = f"value='{snap.completed}' max='{max(snap.total, 1)}'"
            bar = f"<progress style='width:20em' {value}></progress>"
        return f"<div>{bar} <code>{html.escape(self.line)}</code></div>"


@final
class NotebookProgress(Progress):
    """A progress display for Jupyter: created by the first draw, updated in place after.

    ``display`` defaults to ``IPython.display.display``; tests (and front ends
    with a display function of their own) may pass another with the same
    signature: ``display(obj, display_id=True)`` returning a handle with
    ``update(obj)``. Drawing happens in :meth:`update`, on the caller's thread.
    """

    def __init__(self, *, display: Any = None) -> None:
        self._display = display
        self._handle: Any = None
        self._closed = False

    def _show(self, snapshot: ProgressSnapshot) -> None:
        view = _ProgressView(snapshot, format_progress_line(snapshot, bar_width=0))
        if self._handle is not None:
            self._handle.update(view)
            return
        display = self._display
        if display is None:  # a kernel has IPython loaded already
            display = importlib.import_module("IPython.display").display
        self._handle = display(view, display_id=True)

    def update(self, snapshot: ProgressSnapshot) -> None:
        if not self._closed:
            self._show(snapshot)

    def close(self, final: ProgressSnapshot) -> None:
        if self._closed:
            return
        self._show(final)
        self._closed = True
