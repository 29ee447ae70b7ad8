"""Batch API files, both directions, without I/O: request lines out, per-item outcomes back.

A request file holds one line per item, ``custom_id`` = the item id. The
provider answers in two files: the *output* file (requests that got a 2xx)
and the *error* file (non-2xx answers, and requests never executed because
the batch expired or was cancelled). :func:`parse_result_files` folds both
into one :class:`LineOutcome` per ``custom_id``; a line that cannot be read
is skipped, so its item counts as unanswered and is tried again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, final

from ..._values._categories import ErrorCategory
from ..._values._errors import ProviderError
from ..._values._results import TokenUsage
from ._wire import Api, error_from_status, parse_response_body

__all__ = ["LineOutcome", "estimate_input_tokens", "parse_result_files", "request_line"]

NOT_EXECUTED_CODES: Final = frozenset({"batch_expired", "batch_cancelled"})


def request_line(item_id: str, endpoint: str, body: Mapping[str, Any]) -> bytes:
    """One line of a request file (compact JSON, newline-terminated)."""
    line = {"custom_id": item_id, "method": "POST", "url": endpoint, "body": body}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def estimate_input_tokens(text: str) -> int:
    """The default enqueued-token estimate of a request: about four characters a token, at least one.

    Providers count a batch's *input* tokens against the enqueued limit. Pass
    ``ProviderBatchConfig(token_estimator=...)`` (for example a tiktoken count)
    for text where four characters a token is optimistic (code, CJK).
    """
    return max(1, (len(text) + 3) // 4)


@final
@dataclass(frozen=True, slots=True)
class LineOutcome:
    """What the provider's files say about one item."""

    custom_id: str
    text: str | None = None
    usage: TokenUsage | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    error: ProviderError | None = None
    executed: bool = True
    """False for a request the batch never ran (expired or cancelled first)."""

    @property
    def success(self) -> bool:
        return self.error is None


def parse_result_files(api: Api, files: Iterable[bytes]) -> dict[str, LineOutcome]:
    """Every readable line of the output and error files, by ``custom_id`` (a later line wins)."""
    outcomes: dict[str, LineOutcome] = {}
    for content in files:
        for raw in content.splitlines():
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            outcome = _outcome(api, line)
            if outcome is not None:
                outcomes[outcome.custom_id] = outcome
    return outcomes


def _outcome(api: Api, line: Any) -> LineOutcome | None:
    if not isinstance(line, Mapping) or not isinstance(line.get("custom_id"), str):
        return None
    custom_id: str = line["custom_id"]
    response = line.get("response")
    error = line.get("error")
    if isinstance(response, Mapping) and isinstance(response.get("status_code"), int):
        status: int = response["status_code"]
        body = response.get("body")
        metadata: dict[str, Any] = {"status_code": status}
        if isinstance(response.get("request_id"), str):
            metadata["request_id"] = response["request_id"]
        if not 200 <= status < 300:
            return LineOutcome(custom_id, metadata=metadata, error=error_from_status(status, {}, body))
        try:
            text, usage, parsed = parse_response_body(api, body)
        except ProviderError as exc:
            return LineOutcome(custom_id, metadata=metadata, error=exc)
        parsed.update(metadata)
        return LineOutcome(custom_id, text=text, usage=usage, metadata=parsed)
    if isinstance(error, Mapping):
        code = str(error.get("code") or "")
        message = str(error.get("message") or "no message")
        if code in NOT_EXECUTED_CODES:
            failure = ProviderError(f"{code}: {message}", category=ErrorCategory.TIMEOUT)
            return LineOutcome(custom_id, error=failure, executed=False)
        failure = ProviderError(f"{code or 'error'}: {message}", category=ErrorCategory.UNKNOWN)
        return LineOutcome(custom_id, error=failure)
    return None
