"""Make public names report the public module they are imported from, not the private one they live in.

``ParallelBatchProcessor.__module__`` would otherwise say
``trio_batch_llm._engine._processor``: reprs, tracebacks, docs and pickles
would show a path that is ours to change. Each public face (``__init__.py``
of the package and of its public subpackages) calls :func:`fixup_module_metadata`
once, after its imports. Pickles still resolve: every rewritten class and
function is importable from the module it now reports (a method inherited from
a private base is reached through the public class that inherits it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["fixup_module_metadata"]


def _is_private(module: object) -> bool:
    return isinstance(module, str) and module.startswith("trio_batch_llm.") and (
        module.rpartition(".")[2].startswith("_") or "._" in module)


def _functions_of(cls: type) -> list[Any]:
    """The functions a class defines: methods, class and static methods, and properties' accessors."""
    found: list[Any] = []
    for attr in vars(cls).values():
        if isinstance(attr, property):
            found += [f for f in (attr.fget, attr.fset, attr.fdel) if f is not None]
        else:
            attr = getattr(attr, "__func__", attr)  # classmethods and staticmethods wrap a function
            found.append(getattr(attr, "func", attr))  # functools.cached_property
    return [f for f in found if callable(f)]


def fixup_module_metadata(module_name: str, namespace: Mapping[str, Any]) -> None:
    """Rewrite ``__module__`` of the classes (and their methods) and functions named in ``__all__``.

    A public class's methods inherited from a private base (``ParallelBatchProcessor.aclose``,
    defined on ``HostedOwner``) are rewritten too: they are part of the public class, and
    ``help()`` should not send a reader into a private module. The private base itself keeps
    its module (it is importable from nowhere else).
    """
    seen: set[int] = set()

    def fix(obj: Any) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        module = getattr(obj, "__module__", None)
        if not isinstance(module, str) or not module.startswith("trio_batch_llm."):
            return  # a name we re-export from elsewhere, or an object without a module
        if _is_private(module):
            obj.__module__ = module_name
        if isinstance(obj, type):
            for base in obj.__mro__:
                base_module = module if base is obj else base.__module__
                if base is obj or _is_private(base_module):
                    for function in _functions_of(base):
                        if getattr(function, "__module__", None) == base_module:
                            fix(function)

    for name in namespace["__all__"]:
        obj = namespace[name]
        if isinstance(obj, type) or callable(obj):
            fix(obj)
