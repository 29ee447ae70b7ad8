"""The routes of the mock's Files and Batch APIs: which request is which store operation.

A matched route's ``template`` (``"GET /v1/batches/{batch_id}"``) is also the
key of the request's generic fault plan (see :mod:`._plan`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, TypeAlias, final

from ._batch_store import BatchReply, BatchStore

__all__ = ["Action", "BatchRoute", "dispatch", "match_route"]

Action: TypeAlias = Literal["upload", "file", "content", "delete_file", "create", "list", "get", "cancel"]
_ROUTE_TABLE: tuple[tuple[str, str, Action], ...] = (
    ("POST", "/files", "upload"),
    ("GET", "/files/{file_id}", "file"),
    ("DELETE", "/files/{file_id}", "delete_file"),
    ("GET", "/files/{file_id}/content", "content"),
    ("POST", "/batches", "create"),
    ("GET", "/batches", "list"),
    ("GET", "/batches/{batch_id}", "get"),
    ("POST", "/batches/{batch_id}/cancel", "cancel"),
)
_PATTERNS = [(method, re.compile(re.sub(r"\{\w+\}", "([^/]+)", template)), template, action)
             for method, template, action in _ROUTE_TABLE]


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
    path_matched = False
    for route_method, pattern, template, action in _PATTERNS:
        found = pattern.fullmatch(bare)
        if found is None:
            continue
        if route_method == method:
            return BatchRoute(f"{method} /v1{template}", action, found.group(1) if found.groups() else None)
        path_matched = True
    return "wrong method" if path_matched else None


def dispatch(store: BatchStore, route: BatchRoute, raw: bytes, content_type: str, query: str,
             now: float) -> BatchReply:
    """Perform one request on ``store`` (after ``store.advance(now)``); ``raw`` is the request body."""
    target = route.target or ""
    match route.action:
        case "upload":
            return store.upload(content_type, raw, now)
        case "file":
            return store.file(target)
        case "content":
            return store.file_content(target)
        case "delete_file":
            return store.delete_file(target)
        case "create":
            return store.create(raw, now)
        case "list":
            return store.list(query)
        case "get":
            return store.get(target)
        case "cancel":
            return store.cancel(target, now)
