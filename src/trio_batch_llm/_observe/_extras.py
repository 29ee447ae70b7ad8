"""Optional libraries of the observability adapters: imported on first use, or an error naming the extra.

The OpenTelemetry and Prometheus adapters import their library when they are
created, not when the package is imported, so ``import trio_batch_llm`` works
without either; the error then says which extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["import_extra"]


def import_extra(module: str, *, user: str, needs: str, extra: str) -> ModuleType:
    """``module``, imported; or an :class:`ImportError` saying ``user`` needs ``needs`` from ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        # from None: the message says the fix; the chained "No module named ..." only repeats it.
        raise ImportError(f'{user} needs {needs}: pip install "trio-batch-llm[{extra}]"') from None
