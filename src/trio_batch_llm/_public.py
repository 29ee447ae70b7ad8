"""Make public names report the public module they are imported from, not the private one they live in.

``ParallelBatchProcessor.__module__`` would otherwise say
``trio_batch_llm._engine._processor``: reprs, tracebacks, docs and pickles
would show a path that is ours to change. Each public face (``__init__.py``
of the package and of its public subpackages) calls :func:`fixup_module_metadata`
once, after its imports. Pickles still resolve: every rewritten name is
importable from the module it now reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["fixup_module_metadata"]


def fixup_module_metadata(module_name: str, namespace: Mapping[str, Any]) -> None:
    """Rewrite ``__module__`` of the classes (and their methods) and functions named in ``__all__``."""
    seen: set[int] = set()

    def fix(name: str, obj: Any, qualname: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        module = getattr(obj, "__module__", None)
        if not isinstance(module, str) or not module.startswith("trio_batch_llm."):
            return  # a name we re-export from elsewhere, or an object without a module
        if module.rpartition(".")[2].startswith("_") or "._" in module:
            obj.__module__ = module_name
        if isinstance(obj, type):
            for attr_name, attr in vars(obj).items():
                attr = getattr(attr, "__func__", attr)  # classmethods and staticmethods wrap a function
                if callable(attr) and getattr(attr, "__module__", None) == module:
                    fix(attr_name, attr, f"{qualname}.{attr_name}")

    for name in namespace["__all__"]:
        obj = namespace[name]
        if isinstance(obj, type) or callable(obj):
            fix(name, obj, name)
