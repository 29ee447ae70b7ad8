"""The routes of the mock's Files and Batch APIs: which request is which store operation.

A matched route's ``template`` (``"GET /v1/batches/{batch_id}"``) is also the
key of the request's generic fault plan (see :mod:`._plan`). :func:`route_table`
and :func:`match_table` are how every dialect's batch routes are matched (OpenAI's
here, Anthropic's and Gemini's in their stores' modules).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias, TypeVar, final

from ._batch_store import BatchReply, BatchStore

__all__ = ["Action", "BatchRoute", "RouteEntry", "dispatch", "match_route", "match_table", "route_table"]

A = TypeVar("A", bound=str)
RouteEntry: TypeAlias = tuple[str, "re.Pattern[str]", str, A]
"""``(method, path pattern, path template, action)``."""


def route_table(routes: Mapping[str, Mapping[str, A]], *, target: str = "[^/]+") -> tuple[RouteEntry[A], ...]:
    """``{path template: {method: action}}`` as rows with their patterns: the template's one ``{name}``
    placeholder, if any, matches ``target`` (the id or model in the path)."""
    return tuple((method, re.compile(re.sub(r"\{\w+\}", f"({target})", template)), template, action)
                 for template, actions in routes.items() for method, action in actions.items())


def match_table(table: Iterable[RouteEntry[A]], method: str,
                path: str) -> tuple[str, A, str | None] | Literal["wrong method"] | None:
    """``("METHOD template", action, the placeholder's value)`` of the row ``method path`` matches;
    ``"wrong method"`` when only the path matches; ``None`` when no path does."""
    path_matched = False
    for route_method, pattern, template, action in table:
        found = pattern.fullmatch(path)
        if found is None:
            continue
        if route_method == method:
            return f"{method} {template}", action, found.group(1) if found.groups() else None
        path_matched = True
    return "wrong method" if path_matched else None


Action: TypeAlias = Literal["upload", "file", "content", "delete_file", "create", "list", "get", "cancel"]
_ROUTES: tuple[RouteEntry[Action], ...] = route_table({
    "/v1/files": {"POST": "upload"},
    "/v1/files/{file_id}": {"GET": "file", "DELETE": "delete_file"},
    "/v1/files/{file_id}/content": {"GET": "content"},
    "/v1/batches": {"POST": "create", "GET": "list"},
    "/v1/batches/{batch_id}": {"GET": "get"},
    "/v1/batches/{batch_id}/cancel": {"POST": "cancel"},
})


@final
@dataclass(frozen=True, slots=True)
class BatchRoute:
    """A matched Files/Batch API request: ``template`` (``"GET /v1/batches/{batch_id}"``) keys the
    generic fault plan; ``target`` is the id in the path, if any."""

    template: str
    action: Action
    target: str | None = None


def match_route(method: str, path: str) -> BatchRoute | Literal["wrong method"] | None:
    """The route of ``method path`` (with or without ``/v1``); ``None`` if the path is not ours."""
    bare = path.removeprefix("/v1") if path.startswith("/v1/") else path
    found = match_table(_ROUTES, method, f"/v1{bare}")
    return BatchRoute(*found) if isinstance(found, tuple) else found


def dispatch(store: BatchStore, route: BatchRoute, raw: bytes, content_type: str, query: str,
             now: float) -> BatchReply:
    """Perform one request on ``store`` (after ``store.advance(now)``); ``raw`` is the request body."""
    target, action = route.target or "", route.action
    if action in ("upload", "create"):
        return store.upload(content_type, raw, now) if action == "upload" else store.create(raw, now)
    if action in ("list", "cancel"):
        return store.list(query) if action == "list" else store.cancel(target, now)
    by_target = {"file": store.file, "content": store.file_content, "delete_file": store.delete_file,
                 "get": store.get}
    return by_target[action](target)
