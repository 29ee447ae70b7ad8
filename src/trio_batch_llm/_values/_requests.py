"""What goes in: work items (an id, the strategy that runs it, the request and its context).

A *request* is a prompt (a ``str``, or chat messages in OpenAI's format) and
per-item parameters. Values only: checking an item's id, its messages and its
parameters is here because every entry point and every store must apply the
same rules before any work starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, final

from ._prompts import (
    PARAM_KEYS,
    LLMRequest,
    Message,
    Prompt,
    check_params,
    check_prompt,
    prompt_text,
    request_of_text,
    request_text,
)

if TYPE_CHECKING:
    from .._strategies._base import LLMCallStrategy

__all__ = [
    "PARAM_KEYS",
    "LLMRequest",
    "LLMWorkItem",
    "Message",
    "Prompt",
    "check_params",
    "check_prompt",
    "item_id_problem",
    "prompt_text",
    "request_of_text",
    "request_text",
]

TOutput = TypeVar("TOutput")

def item_id_problem(item_id: object) -> str | None:
    """Why ``item_id`` cannot identify an item, or ``None``: one rule for every store and file.

    An id must be a non-empty ``str`` that is valid Unicode text: a lone
    surrogate (which ``"\\ud800"`` in JSON decodes to) has no UTF-8 encoding,
    so no result file or database could hold it.
    """
    if not isinstance(item_id, str) or not item_id:
        return "must be a non-empty string"
    try:
        item_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"holds a lone surrogate ({item_id[exc.start]!r} at index {exc.start}), which is not "
                "valid Unicode text and cannot be stored")
    return None


@final
@dataclass(slots=True)
class LLMWorkItem(Generic[TOutput]):
    """One unit of work: an id, the strategy that runs it, the prompt, optional context and params.

    ``prompt`` is a ``str`` or chat messages; ``params`` are this item's request
    parameters (:data:`PARAM_KEYS`), over the strategy's defaults.
    """

    item_id: str
    strategy: LLMCallStrategy[TOutput]
    prompt: Prompt
    context: Any = None
    params: Mapping[str, Any] | None = None

    @property
    def request(self) -> LLMRequest:
        return LLMRequest(self.prompt, self.params or {})

    @property
    def prompt_text(self) -> str:
        """The prompt's text (a text prompt as is; messages' text joined by newlines)."""
        return prompt_text(self.prompt)


