"""The mock's Gemini context caches: ``cachedContents`` created, read, listed, renewed, deleted, expired.

Written from Google's REST reference for ``cachedContents``. A cache lives
until its ``expireTime`` on the app's clock (``ttl`` ``"300s"`` or an absolute
``expireTime``; one hour when neither is given) or until it is deleted; from
then on every use answers Google's 403 ``CachedContent not found (or permission
denied)``. A cache smaller than ``min_tokens`` is refused with Google's 400
(``Cached content is too small. total_token_count=…, min_total_token_count=…``).

Times go out as RFC 3339 in UTC on the app's *wall* clock (the app's clock
decides expiry; the wall clock only names the moments), so a client that
compares ``expireTime`` with its own clock sees a consistent story.

The store is synchronous and clock-free (callers pass ``now`` and ``wall``):
exact under a virtual clock. :meth:`CacheStore.statistics` and
:attr:`CacheStore.records` let a test assert that a strategy renewed its cache
before the TTL ran out and deleted it at cleanup.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, final

from ._gemini import MEDIA_TOKENS, content_problem, fields_of, unknown_field
from ._gemini_errors import cache_not_found, google_error
from ._state import mock_token_count

__all__ = ["CacheRecord", "CacheStore", "GeminiCacheStats", "parse_duration"]

DEFAULT_TTL: Final = 3600.0
"""Google's TTL for a cache created with neither ``ttl`` nor ``expireTime``."""
_CREATE: Final = frozenset({"model", "contents", "systemInstruction", "tools", "toolConfig", "ttl",
                            "expireTime", "displayName", "name"})
_DURATION: Final = re.compile(r"(-?\d+(?:\.\d{1,9})?)s")
Answer = tuple[int, dict[str, Any]]


def parse_duration(text: object) -> float | None:
    """A protobuf Duration in JSON (``"300s"``, ``"1.5s"``) in seconds, or ``None`` if it is not one."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    return float(match.group(1)) if match else None


def _timestamp(seconds: float) -> str:
    moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_timestamp(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


@final
@dataclass(slots=True)
class CacheRecord:
    """One cache as the store keeps it (times on the app's clock); it stays listed after it ends."""

    name: str
    model: str
    display_name: str
    tokens: int
    created: float
    updated: float
    expires: float
    body: dict[str, Any]
    """The create request as received."""
    deleted: float | None = None
    renewals: list[float] = field(default_factory=list)
    """The app-clock times of each successful PATCH of its expiry."""
    uses: int = 0

    def alive(self, now: float) -> bool:
        return self.deleted is None and now < self.expires


@final
@dataclass(frozen=True, slots=True)
class GeminiCacheStats:
    """Counts of the cache store: ``alive`` at the time asked; ``created`` caches; ``deleted`` by a
    ``DELETE``; ``expired`` (their time ran out before any delete); ``renewed`` successful expiry
    updates; ``refused_small`` creates under the minimum size; ``used`` generateContent calls that
    named a live cache; ``missing`` ones that named an unknown, deleted or expired cache."""

    alive: int
    created: int
    deleted: int
    expired: int
    renewed: int
    refused_small: int
    used: int
    missing: int


@final
class CacheStore:
    """The ``cachedContents`` resources of one app. Each method answers ``(status, body)``."""

    def __init__(self, *, min_tokens: int = 1, seed: int = 0) -> None:
        self.min_tokens = min_tokens
        self._seed = seed
        self._records: dict[str, CacheRecord] = {}
        self._refused_small = 0
        self._missing = 0

    @property
    def records(self) -> list[CacheRecord]:
        """Every cache ever created, in creation order (deleted and expired ones included)."""
        return list(self._records.values())

    def statistics(self, now: float) -> GeminiCacheStats:
        records = self._records.values()
        return GeminiCacheStats(
            alive=sum(r.alive(now) for r in records), created=len(self._records),
            deleted=sum(r.deleted is not None for r in records),
            expired=sum(r.deleted is None and now >= r.expires for r in records),
            renewed=sum(len(r.renewals) for r in records), refused_small=self._refused_small,
            used=sum(r.uses for r in records), missing=self._missing,
        )

    def _render(self, record: CacheRecord, now: float, wall: float) -> dict[str, Any]:
        def at(t: float) -> str:
            return _timestamp(wall + (t - now))

        return {"name": record.name, "model": record.model, "displayName": record.display_name,
                "createTime": at(record.created), "updateTime": at(record.updated),
                "expireTime": at(record.expires), "usageMetadata": {"totalTokenCount": record.tokens}}

    def _expiry(self, body: Mapping[str, Any], now: float, wall: float, where: str) -> float | str:
        """The app-clock expiry a body asks for, or the message of the 400 refusing it."""
        if "ttl" in body and "expireTime" in body:
            return f"* {where}: ttl and expire_time cannot both be set.\n"
        if "ttl" in body:
            ttl = parse_duration(body["ttl"])
            if ttl is None:
                return ("Invalid value at 'cached_content.ttl' "
                        f"(type.googleapis.com/google.protobuf.Duration), {body['ttl']!r}")
            if ttl <= 0:
                return f"* {where}.ttl: ttl must be positive.\n"
            return now + ttl
        if "expireTime" in body:
            moment = _parse_timestamp(body["expireTime"])
            if moment is None:
                return (f"Invalid value at 'cached_content.expire_time' "
                        f"(type.googleapis.com/google.protobuf.Timestamp), {body['expireTime']!r}")
            if moment <= wall:
                return f"* {where}.expire_time: expire_time must be in the future.\n"
            return now + (moment - wall)
        return now + DEFAULT_TTL

    def create(self, payload: Any, now: float, wall: float) -> Answer:
        """``POST /v1beta/cachedContents``."""
        if not isinstance(payload, Mapping):
            return 400, google_error(400, "Invalid JSON payload received. Expected an object.")
        problem = unknown_field(payload, _CREATE, "cached_content")
        body = fields_of(payload)
        model = body.get("model")
        if problem is None and not (isinstance(model, str) and model.removeprefix("models/")):
            problem = "* CreateCachedContentRequest.cached_content.model: model is required.\n"
        parts: list[Any] = []
        contents = body.get("contents", [])
        if problem is None and not isinstance(contents, list):
            problem = "Invalid value at 'cached_content.contents': expected a list of Content."
        for content in [body["systemInstruction"]] if "systemInstruction" in body else []:
            problem = problem or content_problem(content, "cached_content.system_instruction")
        for content in contents if isinstance(contents, list) else ():
            problem = problem or content_problem(content, "cached_content.contents")
        if problem is not None:
            return 400, google_error(400, problem)
        for content in [body.get("systemInstruction"), *contents]:
            if isinstance(content, Mapping):
                parts += [fields_of(p) for p in fields_of(content).get("parts", [])]
        text = "\n".join(p["text"] for p in parts if isinstance(p.get("text"), str))
        tokens = mock_token_count(text) + MEDIA_TOKENS * sum("inlineData" in p or "fileData" in p
                                                              for p in parts)
        if "tools" in body:
            tokens += mock_token_count(str(body["tools"]))
        expiry = self._expiry(body, now, wall, "CreateCachedContentRequest.cached_content")
        if isinstance(expiry, str):
            return 400, google_error(400, expiry)
        if tokens < self.min_tokens:
            self._refused_small += 1
            return 400, google_error(400, f"Cached content is too small. total_token_count={tokens}, "
                                          f"min_total_token_count={self.min_tokens}")
        key = f"{self._seed}\x00cache\x00{len(self._records)}"
        name = "cachedContents/" + hashlib.sha256(key.encode()).hexdigest()[:12]
        record = CacheRecord(name=name, model="models/" + str(model).removeprefix("models/"),
                             display_name=str(body.get("displayName") or ""), tokens=tokens,
                             created=now, updated=now, expires=expiry, body=dict(payload))
        self._records[name] = record
        return 200, self._render(record, now, wall)

    def lookup(self, name: object, now: float) -> CacheRecord | None:
        """The live cache ``name`` names (``cachedContents/…``), or ``None``."""
        record = self._records.get(name) if isinstance(name, str) else None
        return record if record is not None and record.alive(now) else None

    def use(self, name: object, now: float) -> CacheRecord | None:
        """:meth:`lookup` for a generateContent: counts the use, or the miss."""
        record = self.lookup(name, now)
        if record is None:
            self._missing += 1
        else:
            record.uses += 1
        return record

    def get(self, cache_id: str, now: float, wall: float) -> Answer:
        """``GET /v1beta/cachedContents/{id}``."""
        record = self.lookup("cachedContents/" + cache_id, now)
        return (200, self._render(record, now, wall)) if record else (403, cache_not_found())

    def list(self, query: Mapping[str, str], now: float, wall: float) -> Answer:
        """``GET /v1beta/cachedContents?pageSize=&pageToken=``: the live caches, oldest first."""
        live = [r for r in self._records.values() if r.alive(now)]
        try:
            size = int(query.get("pageSize") or 50)
            start = int(query.get("pageToken") or 0)
        except ValueError:
            return 400, google_error(400, "Invalid pageSize or pageToken.")
        size = min(max(size, 1), 1000)
        page = live[start: start + size]
        answer: dict[str, Any] = {}
        if page:
            answer["cachedContents"] = [self._render(r, now, wall) for r in page]
        if start + size < len(live):
            answer["nextPageToken"] = str(start + size)
        return 200, answer

    def patch(self, cache_id: str, payload: Any, update_mask: str | None, now: float, wall: float) -> Answer:
        """``PATCH /v1beta/cachedContents/{id}?updateMask=ttl``: only the expiry can change."""
        record = self.lookup("cachedContents/" + cache_id, now)
        if record is None:
            return 403, cache_not_found()
        body = fields_of(payload) if isinstance(payload, Mapping) else {}
        masked = {m.strip() for m in (update_mask or "").split(",") if m.strip()}
        if masked - {"ttl", "expireTime", "expire_time"}:
            return 400, google_error(400, f"* UpdateCachedContentRequest.update_mask: only ttl and "
                                          f"expire_time can be updated (got {update_mask!r}).\n")
        wanted = {k: v for k, v in body.items() if k in ("ttl", "expireTime")}
        if not wanted:
            return 400, google_error(400, "* UpdateCachedContentRequest.cached_content: ttl or expire_time "
                                          "is required.\n")
        expiry = self._expiry(wanted, now, wall, "UpdateCachedContentRequest.cached_content")
        if isinstance(expiry, str):
            return 400, google_error(400, expiry)
        record.expires, record.updated = expiry, now
        record.renewals.append(now)
        return 200, self._render(record, now, wall)

    def delete(self, cache_id: str, now: float) -> Answer:
        """``DELETE /v1beta/cachedContents/{id}``: an empty object."""
        record = self.lookup("cachedContents/" + cache_id, now)
        if record is None:
            return 403, cache_not_found()
        record.deleted = now
        return 200, {}
