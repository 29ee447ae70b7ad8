"""What goes in: work items (an id, the strategy that runs it, the prompt and its context).

Values only: checking an item's id is here because every entry point and every
store must apply the same rule before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, final

if TYPE_CHECKING:
    from .._strategies._base import LLMCallStrategy

__all__ = ["LLMWorkItem", "item_id_problem"]

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
    """One unit of work: an id, the strategy that runs it, the prompt and optional context."""

    item_id: str
    strategy: LLMCallStrategy[TOutput]
    prompt: str
    context: Any = None


