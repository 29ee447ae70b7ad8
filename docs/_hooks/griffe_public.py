"""Griffe extension: reference pages show public names only.

A reader can import ``trio_batch_llm.X`` and nothing under ``trio_batch_llm._``.
Once the package is loaded, this extension rewrites what the pages render:

- a name the package exports (``WorkItemResult``, defined in
  ``trio_batch_llm._values._results``) is shown, linked and given a tooltip by
  its public path, ``trio_batch_llm.WorkItemResult``;
- a private type alias (``Prompts``, ``ClassifierArg``) or constant default
  (``timeout=_DEFAULT_TIMEOUT``, ``FROM_CONFIG``) is replaced by its value, and a
  private type variable (``TOutput``) is shown as plain text;
- a base class the package does not export (``HostedOwner``, ``ThreadedStore``,
  ``_EndpointStrategy``) is replaced by its own bases (recursively, so the page
  shows the public ancestry), and its public members are listed as the class's
  own: ``ParallelBatchProcessor.aclose`` is documented on ``ParallelBatchProcessor``.

Keyword arguments typed ``Unpack[ProcessorOptions]`` (expanded by griffe's
``unpack_typeddict``) get the processor's own defaults instead of ``...``.
A docstring line ``{_NAME}`` (the Args text ``process_prompts`` and
``process_stream`` share) is filled with the module's string ``_NAME``,
indented as the line, as the module fills ``__doc__`` at import.
A private class that is not exported is left as it is, so
``docs/_hooks/private_names.py`` fails the build on it: that is a gap to close
by exporting the class or changing the signature, not one to paper over here.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import textwrap
from collections.abc import Iterator
from typing import Any

import griffe

PACKAGE = "trio_batch_llm"
PUBLIC_PACKAGES = ("trio_batch_llm", "trio_batch_llm.mock", "trio_batch_llm.testing")


def is_private_path(path: str) -> bool:
    """``trio_batch_llm._values._results.X`` is; ``trio_batch_llm.mock.X`` and ``X.__init__`` are not."""
    parts = path.split(".")
    return parts[0] == PACKAGE and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _final(obj: Any) -> Any:
    if isinstance(obj, griffe.Alias):
        try:
            return obj.final_target
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
    return obj


def _lookup(path: str, loader: griffe.GriffeLoader) -> Any:
    try:
        return _final(loader.modules_collection[path])
    except KeyError:
        return None


def public_paths(loader: griffe.GriffeLoader) -> dict[str, str]:
    """Where each exported object is defined -> the path a reader imports it by."""
    found: dict[str, str] = {}
    for package in PUBLIC_PACKAGES:
        module = _lookup(package, loader)
        if module is None:
            continue
        for name in module.exports or ():
            name = name if isinstance(name, str) else name.name
            target = _final(module.members.get(name))
            if target is not None:
                found.setdefault(target.path, f"{package}.{name}")
    return found


def _expressions(obj: Any) -> Iterator[tuple[Any, str]]:
    """(holder, field) of every expression a reference page renders of ``obj``."""
    if isinstance(obj, griffe.Function):
        for parameter in obj.parameters:
            yield parameter, "annotation"
            yield parameter, "default"
        yield obj, "returns"
    elif isinstance(obj, griffe.Attribute):
        yield obj, "annotation"
        yield obj, "value"


def _walk(obj: Any, seen: set[int]) -> Iterator[Any]:
    if id(obj) in seen or isinstance(obj, griffe.Alias):
        return
    seen.add(id(obj))
    yield obj
    for member in list(obj.members.values()):
        if not isinstance(member, griffe.Alias):
            yield from _walk(member, seen)


class _Rewriter:
    def __init__(self, loader: griffe.GriffeLoader) -> None:
        self.loader = loader
        self.public = public_paths(loader)

    def hidden_class(self, path: object) -> Any:
        """The class at ``path`` if it is private and not exported, else ``None``."""
        if not isinstance(path, str) or not is_private_path(path):
            return None
        target = _lookup(path, self.loader)
        if not isinstance(target, griffe.Class) or target.path in self.public:
            return None
        return target

    def expression(self, expr: Any, depth: int = 0) -> Any:
        """``expr`` with its names made public; a private alias or constant may become its value."""
        if isinstance(expr, griffe.ExprName):
            return self.name(expr, depth)
        if isinstance(expr, griffe.Expr):
            for field in dataclasses.fields(expr):
                value = getattr(expr, field.name)
                if isinstance(value, griffe.Expr):
                    setattr(expr, field.name, self.expression(value, depth))
                elif isinstance(value, list) and any(isinstance(v, griffe.Expr) for v in value):
                    setattr(expr, field.name, [self.expression(v, depth) for v in value])
        return expr

    def name(self, expr: griffe.ExprName, depth: int) -> Any:
        if isinstance(expr.parent, griffe.ExprName):
            return expr  # the tail of ``a.b``: follows its head
        path = expr.canonical_path
        if not is_private_path(path):
            return expr
        target = _lookup(path, self.loader)  # through re-exports (``from .._admission import X``)
        public = self.public.get(getattr(target, "path", path))
        if public is not None:
            # Shown, linked and titled by the path a reader imports it by.
            expr.parent, _, expr.name = public.rpartition(".")
            return expr
        if not isinstance(target, griffe.Attribute) or depth > 5:
            return expr  # a private class nobody exports: left for the build to refuse
        value = target.value
        if isinstance(value, griffe.ExprCall) and str(value.function).rpartition(".")[2] == "TypeVar":
            expr.parent = None  # a type variable: its name, plain text
            return expr
        if value is None:
            return expr
        # A type alias or a constant: its value, itself made public.
        return self.expression(value, depth + 1) if isinstance(value, griffe.Expr) else value

    def bases(self, cls: griffe.Class) -> None:
        """Replace each private base by its public ancestry; list its public members on ``cls``."""
        bases: list[Any] = []
        for base in cls.bases:
            head = base.left if isinstance(base, griffe.ExprSubscript) else base
            target = self.hidden_class(getattr(head, "canonical_path", None))
            if target is None:
                bases.append(base)
                continue
            self.bases(target)
            bases.extend(target.bases)
            for name, member in target.members.items():
                if name in cls.members or (name.startswith("_") and name != "__init__"):
                    continue
                alias = griffe.Alias(name, _final(member) or member, parent=cls)
                alias.public = True  # documented as the class's own (it is, to a reader)
                cls.set_member(name, alias)
        cls.bases = bases


_FRAGMENT = re.compile(r"^( *)\{(_[A-Z_]+)\}$", re.MULTILINE)
"""As ``trio_batch_llm._engine._entrypoints._FRAGMENT``."""


class PublicNames(griffe.Extension):
    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        # While the module is visited, before unpack_typeddict parses the docstring: the fragments are
        # module strings defined above the function, already visited.
        if func.docstring is None or "{_" not in func.docstring.value:
            return

        def fragment(match: re.Match[str]) -> str:
            value = func.module.members[match[2]].value  # the source of a string literal
            return textwrap.indent(ast.literal_eval(str(value)), match[1])

        func.docstring.value = _FRAGMENT.sub(fragment, func.docstring.value)

    def on_function(self, *, func: griffe.Function, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        # After unpack_typeddict (listed first) expanded the function's **kwargs.
        expanded = [p for p in func.parameters if str(p.default) == "..."]
        if expanded:
            options = _option_defaults(loader)
            for parameter in expanded:
                if parameter.name in options:
                    parameter.default = options[parameter.name]
            # unpack_typeddict also wrote them into the docstring's Parameters table with a default of
            # "...": the table's Default column then read "..." for every option.
            for section in func.docstring.parsed if func.docstring else ():
                if section.kind is griffe.DocstringSectionKind.parameters:
                    for documented in section.value:
                        if str(documented.value) == "..." and documented.name in options:
                            documented.value = str(options[documented.name])  # the table shows text

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != PACKAGE:
            return
        rewriter = _Rewriter(loader)
        objects = list(_walk(pkg, set()))
        for obj in objects:
            if isinstance(obj, griffe.Class):
                rewriter.bases(obj)
        for obj in objects:
            if isinstance(obj, griffe.Class):
                obj.bases = [rewriter.expression(base) for base in obj.bases]
            for holder, field in _expressions(obj):
                value = getattr(holder, field)
                if isinstance(value, griffe.Expr):
                    setattr(holder, field, rewriter.expression(value))


_OPTIONS_OWNER = "trio_batch_llm._engine._processor.ParallelBatchProcessor.__init__"
"""Where the defaults of ``ProcessorOptions`` (the ``**processor_kwargs`` of the entry points) live."""


def _option_defaults(loader: griffe.GriffeLoader) -> dict[str, Any]:
    try:
        init = loader.modules_collection[_OPTIONS_OWNER]
    except KeyError:
        return {}
    return {p.name: p.default for p in init.parameters if p.default is not None}
