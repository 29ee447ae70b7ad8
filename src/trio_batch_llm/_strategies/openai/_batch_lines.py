"""Batch API files, both directions, without I/O: request lines out, per-item outcomes back.

A request file holds one line per item, ``custom_id`` = the item id. The
provider answers in two files: the *output* file (requests that got a 2xx)
and the *error* file (non-2xx answers, and requests never executed because
the batch expired or was cancelled). :func:`decode_result_files` folds both
into one :class:`BatchItemOutcome` per ``custom_id``; a line that cannot be
read is skipped, so its item counts as unanswered and is tried again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from ..._values._categories import ErrorCategory
from ..._values._errors import ProviderError
from .._batch import BatchItemOutcome
from ._wire import Api, parse_response_body
from ._wire_errors import error_from_status

__all__ = ["decode_result_files", "request_line"]

NOT_EXECUTED_CODES: Final = frozenset({"batch_expired", "batch_cancelled"})


def request_line(item_id: str, endpoint: str, body: Mapping[str, Any]) -> bytes:
    """One line of a request file (compact JSON, newline-terminated)."""
    line = {"custom_id": item_id, "method": "POST", "url": endpoint, "body": body}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def decode_result_files(api: Api, files: Iterable[bytes]) -> dict[str, BatchItemOutcome]:
    """Every readable line of the output and error files, by ``custom_id`` (a later line wins)."""
    outcomes: dict[str, BatchItemOutcome] = {}
    for content in files:
        for raw in content.splitlines():
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, Mapping) and isinstance(line.get("custom_id"), str):
                outcome = _outcome(api, line)
                if outcome is not None:
                    outcomes[line["custom_id"]] = outcome
    return outcomes


def _outcome(api: Api, line: Mapping[str, Any]) -> BatchItemOutcome | None:
    response = line.get("response")
    error = line.get("error")
    if isinstance(response, Mapping) and isinstance(response.get("status_code"), int):
        status: int = response["status_code"]
        body = response.get("body")
        metadata: dict[str, Any] = {"status_code": status}
        if isinstance(response.get("request_id"), str):
            metadata["request_id"] = response["request_id"]
        if not 200 <= status < 300:
            return BatchItemOutcome(metadata=metadata, error=error_from_status(status, {}, body))
        try:
            text, usage, parsed = parse_response_body(api, body)
        except ProviderError as exc:
            return BatchItemOutcome(metadata=metadata, error=exc)
        parsed.update(metadata)
        return BatchItemOutcome(text=text, usage=usage, metadata=parsed)
    if isinstance(error, Mapping):
        code = str(error.get("code") or "")
        message = str(error.get("message") or "no message")
        if code in NOT_EXECUTED_CODES:
            failure = ProviderError(f"{code}: {message}", category=ErrorCategory.TIMEOUT)
            return BatchItemOutcome(error=failure, executed=False)
        failure = ProviderError(f"{code or 'error'}: {message}", category=ErrorCategory.UNKNOWN)
        return BatchItemOutcome(error=failure)
    return None
