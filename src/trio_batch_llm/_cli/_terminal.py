"""A message after Ctrl+C starts its own line: the terminal echoed ``^C`` where the cursor stood.

A terminal whose line discipline echoes control characters (``ECHOCTL``, the
default of Linux and macOS terminals) prints ``^C`` when Ctrl+C is pressed and
leaves the cursor after it, often at the end of the progress bar's line; the
stop message would follow on that same line. Only a terminal does this: a pipe
or a file gets no ``^C``, so no newline is added there.
"""

from __future__ import annotations

import signal
import sys
from typing import TextIO

__all__ = ["end_echoed_ctrl_c", "echoes_ctrl_c"]


def echoes_ctrl_c(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal that echoes a typed Ctrl+C as ``^C``."""
    try:
        import termios  # not on Windows, whose console echoes nothing
    except ImportError:  # pragma: no cover - Windows
        return False
    try:
        if not stream.isatty():
            return False
        local_modes = termios.tcgetattr(stream.fileno())[3]
    except (AttributeError, OSError, ValueError, termios.error):  # closed, replaced, or not a real file
        return False
    echoctl = getattr(termios, "ECHOCTL", 0)
    return bool(echoctl and local_modes & termios.ECHO and local_modes & echoctl)


def end_echoed_ctrl_c(sig: int) -> None:
    """After a SIGINT on a terminal that echoed ``^C``: end that line on stderr."""
    if sig == signal.SIGINT and echoes_ctrl_c(sys.stderr):
        sys.stderr.write("\n")
        sys.stderr.flush()
