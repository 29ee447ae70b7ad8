"""Canonical JSON and the fingerprints that key a resume.

A stored result is replayed only for the same item id, the same input
fingerprint (prompt + context) and the same identity fingerprint. Both are
SHA-256 over canonical JSON: sorted keys, compact separators, UTF-8, with a
small set of common non-JSON types normalised (enums, dataclasses, pydantic
models, sets, tuples, dates, UUIDs, paths, decimals).

Everything this module writes is strict JSON (RFC 8259): ``NaN`` and
``Infinity`` are refused (``ValueError``), since strict readers such as jq
reject them. Only the fingerprint's own hashing accepts them, so that a
context holding a ``NaN`` keeps the fingerprint it always had.

A context that still cannot be encoded (an arbitrary object, a dict with
mixed key types) is fingerprinted through ``repr()`` instead. That is stable
for values whose ``repr`` is stable; for objects whose ``repr`` carries a
memory address it differs from run to run, so such items never match and are
always rerun, which is the safe direction.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import hashlib
import json
import pathlib
import uuid
from collections.abc import Mapping
from typing import Any, Final

from .._values._artifact_identity import ArtifactIdentity
from .._values._requests import LLMWorkItem, Prompt

__all__ = [
    "canonical_json",
    "encode_record",
    "fingerprint",
    "identity_fingerprint",
    "item_fingerprint",
    "jsonable_or_repr",
    "request_fingerprint",
]

_FORMAT_TAG = b"trio-batch-llm/fingerprint/v1\x00"


def _normalize(value: Any) -> Any:
    """``json`` ``default=`` hook: turn common non-JSON values into JSON ones, else TypeError."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and not isinstance(value, type):
        return model_dump(mode="json")
    if isinstance(value, (set, frozenset)):
        # Order-independent: sort members by their own canonical text.
        return sorted(value, key=canonical_json)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (uuid.UUID, pathlib.PurePath, decimal.Decimal)):
        return str(value)
    raise TypeError(f"{type(value).__qualname__} is not JSON-serializable")


def canonical_json(value: Any, *, allow_nan: bool = False) -> str:
    """Deterministic, strict JSON text for ``value``; TypeError/ValueError if it cannot be encoded.

    ``allow_nan=True`` is for hashing only: the text is then not strict JSON.
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_normalize,
        allow_nan=allow_nan,
    )


def encode_record(record: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON for one stored record; raises TypeError/ValueError if unencodable.

    Text stays readable (no ``\\u`` escapes) unless it holds a lone surrogate,
    which UTF-8 cannot carry: that record is written with ASCII escapes, so the
    file is always valid UTF-8 and the value round-trips exactly.
    """
    text = json.dumps(
        record, separators=(",", ":"), ensure_ascii=False, default=_normalize, allow_nan=False
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(record, separators=(",", ":"), default=_normalize, allow_nan=False).encode("ascii")


def jsonable_or_repr(value: Any) -> Any:
    """``value`` if it encodes as strict JSON (normalised), else its ``repr()``: for audit-only fields."""
    try:
        return json.loads(canonical_json(value))
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _utf8(text: str) -> bytes:
    # surrogatepass: a lone surrogate in user data must not crash hashing.
    return text.encode("utf-8", "surrogatepass")


def _digest(tag: bytes, body: bytes, context: object) -> str:
    """SHA-256 (hex) of ``tag``, ``body`` and ``context``, as every input fingerprint is made.

    ``body`` (the prompt, or the whole request) is length-prefixed, so no body/context split can
    collide with another; the context is its canonical JSON, else its ``repr()``, tagged by which,
    so that no JSON text and no repr can stand for each other."""
    try:
        context_bytes = b"j" + _utf8(canonical_json(context, allow_nan=True))
    except (TypeError, ValueError, RecursionError):
        context_bytes = b"r" + _utf8(repr(context))
    digest = hashlib.sha256(tag)
    digest.update(len(body).to_bytes(8, "big"))
    digest.update(body)
    digest.update(context_bytes)
    return digest.hexdigest()


def fingerprint(prompt: str, context: Any) -> str:
    """SHA-256 (hex) of the prompt and the canonical JSON of ``context``.

    Stable across processes and dict orderings. The prompt is length-prefixed
    so no prompt/context split can collide with another. Contexts that cannot
    be encoded as JSON are hashed through ``repr()`` (see the module docstring).
    """
    return _digest(_FORMAT_TAG, _utf8(prompt), context)


_REQUEST_TAG: Final = b"trio-batch-llm request fingerprint v1\x00"


def request_fingerprint(prompt: Prompt, params: Mapping[str, Any] | None, context: Any) -> str:
    """The fingerprint of an item's whole request: :func:`fingerprint` for a text prompt without params
    (so checkpoints written before requests existed still match), else SHA-256 over the canonical JSON
    of the messages and params (a changed message or parameter is a changed item: it is not replayed)."""
    if isinstance(prompt, str) and not params:
        return fingerprint(prompt, context)
    try:
        request = _utf8(canonical_json({"prompt": prompt, "params": dict(params or {})}, allow_nan=True))
    except (TypeError, ValueError, RecursionError):
        request = _utf8(repr((prompt, params)))
    return _digest(_REQUEST_TAG, request, context)


_SAMPLE_TAG: Final = b"trio-batch-llm sample\x00"


def item_fingerprint(item: LLMWorkItem[Any]) -> str:
    """:func:`request_fingerprint` of ``item``: what its checkpoint record is keyed by.

    A non-zero ``sample`` is part of it (sample 0 keeps the fingerprint items had before samples
    existed): an item whose sample changed asks for another answer, so it is not replayed."""
    base = request_fingerprint(item.prompt, item.params, item.context)
    if not item.sample:
        return base
    sample = f"{base}\x00{item.sample}".encode("ascii")
    return hashlib.sha256(_SAMPLE_TAG + sample).hexdigest()


def identity_fingerprint(identity: ArtifactIdentity) -> str:
    """A short SHA-256 (16 hex digits) of the canonical identity, stamped on every record."""
    return hashlib.sha256(_utf8(canonical_json(identity.to_dict()))).hexdigest()[:16]
