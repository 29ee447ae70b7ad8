"""What a provider said about its answer besides the text: finish reason, refusal, tool calls, logprobs.

A frozen record on :attr:`WorkItemResult.details`, serialised by ``to_dict``/``from_dict``
(and so by the stores): results written before it existed read back with ``details=None``.
A strategy hands it over in its metadata under :data:`DETAILS_METADATA_KEY`; the result
takes it out of the metadata, so the metadata stays plain JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, final

__all__ = ["DETAILS_METADATA_KEY", "ResponseDetails", "ToolCall"]

DETAILS_METADATA_KEY: Final = "response_details"


@final
@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the model asked for; ``arguments`` is the JSON text the model wrote."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@final
@dataclass(frozen=True, slots=True)
class ResponseDetails:
    """The answer's details, in one form for both APIs.

    ``finish_reason``: ``"stop"``, ``"length"`` (the output token limit), ``"tool_calls"``,
    ``"content_filter"`` or what the provider said (the Responses API's statuses are mapped to
    these). ``refusal``: the model's refusal text, if it refused. ``tool_calls``: the function
    calls it asked for. ``logprobs``: the provider's log-probabilities, as sent, when asked for
    (``params={"logprobs": True}``).
    """

    finish_reason: str | None = None
    refusal: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: list[Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "finish_reason": self.finish_reason,
            "refusal": self.refusal,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "logprobs": self.logprobs,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResponseDetails:
        calls = tuple(
            ToolCall(str(c.get("id", "")), str(c.get("name", "")), str(c.get("arguments", "")))
            for c in data.get("tool_calls") or () if isinstance(c, Mapping)
        )
        logprobs = data.get("logprobs")
        return cls(
            finish_reason=data.get("finish_reason"),
            refusal=data.get("refusal"),
            tool_calls=calls,
            logprobs=list(logprobs) if isinstance(logprobs, list) else None,
        )
