"""Griffe extension: reference pages show public names only.

A public class may inherit from a private helper (``OpenAIStrategy`` from
``_EndpointStrategy``) and a parameter's default may be a private constant
(``timeout=_DEFAULT_TIMEOUT``). Neither name means anything to a reader, and
neither is importable from the package. Once the package is loaded, this
extension replaces a private base by that base's own bases (recursively, so
the page shows the public ancestry) and a private default by the constant's
value. Keyword arguments typed ``Unpack[ProcessorOptions]`` (expanded by griffe's
``unpack_typeddict``) get the processor's own defaults instead of ``...``.
``docs/_hooks/private_names.py`` then fails the build if any private
name is still shown in a signature or a base list.
"""

from __future__ import annotations

from typing import Any

import griffe


def _is_private(expr: object) -> bool:
    name = getattr(expr, "name", None)
    if name is None and isinstance(expr, griffe.ExprSubscript):
        name = getattr(expr.left, "name", None)
    return isinstance(name, str) and name.startswith("_") and not name.startswith("__")


def _target(expr: object, loader: griffe.GriffeLoader) -> Any:
    if isinstance(expr, griffe.ExprSubscript):
        expr = expr.left
    path = getattr(expr, "canonical_path", None)
    if not path:
        return None
    try:
        return loader.modules_collection[path]
    except KeyError:
        return None


def _public_bases(bases: list[Any], loader: griffe.GriffeLoader) -> list[Any]:
    public: list[Any] = []
    for base in bases:
        if not _is_private(base):
            public.append(base)
            continue
        target = _target(base, loader)
        if isinstance(target, griffe.Alias):
            target = target.final_target
        if isinstance(target, griffe.Class):
            public.extend(_public_bases(list(target.bases), loader))
    return public


def _walk(obj: Any, seen: set[int]) -> Any:
    if id(obj) in seen or isinstance(obj, griffe.Alias):
        return
    seen.add(id(obj))
    yield obj
    for member in obj.members.values():
        if not isinstance(member, griffe.Alias):
            yield from _walk(member, seen)


_OPTIONS_OWNER = "trio_batch_llm._engine._processor.ParallelBatchProcessor.__init__"
"""Where the defaults of ``ProcessorOptions`` (the ``**processor_kwargs`` of the entry points) live."""


def _option_defaults(loader: griffe.GriffeLoader) -> dict[str, Any]:
    try:
        init = loader.modules_collection[_OPTIONS_OWNER]
    except KeyError:
        return {}
    return {p.name: p.default for p in init.parameters if p.default is not None}


class PublicNames(griffe.Extension):
    def on_function(self, *, func: griffe.Function, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        # After unpack_typeddict (listed first) expanded the function's **kwargs.
        expanded = [p for p in func.parameters if str(p.default) == "..."]
        if expanded:
            options = _option_defaults(loader)
            for parameter in expanded:
                if parameter.name in options:
                    parameter.default = options[parameter.name]

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in _walk(pkg, set()):
            if isinstance(obj, griffe.Class) and any(_is_private(base) for base in obj.bases):
                obj.bases = _public_bases(list(obj.bases), loader)
            if isinstance(obj, griffe.Function):
                for parameter in obj.parameters:
                    default = parameter.default
                    if default is not None and not isinstance(default, str) and _is_private(default):
                        target = _target(default, loader)
                        if isinstance(target, griffe.Alias):
                            target = target.final_target
                        value = getattr(target, "value", None)
                        if value is not None:
                            parameter.default = value
