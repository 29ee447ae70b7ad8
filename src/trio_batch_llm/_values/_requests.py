"""What goes in: work items (an id, the strategy that runs it, the request and its context).

A *request* is a prompt (a ``str``, or chat messages in OpenAI's format) and
per-item parameters. Values only: checking an item's id, its messages and its
parameters is here because every entry point and every store must apply the
same rules before any work starts.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Generic, TypeVar, final

# The one strategy type an item may carry (the engine calls its methods by name). _strategies._base
# imports no module that imports this one, so the import is safe at load time, and a module-level
# name keeps the check in LLMWorkItem.__post_init__ to one isinstance.
from .._strategies._base import LLMCallStrategy
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

__all__ = [
    "PARAM_KEYS",
    "LLMRequest",
    "LLMWorkItem",
    "Message",
    "Prompt",
    "check_params",
    "check_prompt",
    "checked_items",
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
    context: object = None
    params: Mapping[str, Any] | None = None
    sample: int = 0
    """Which sample of its request this item is: part of the response-cache key, so items equal but
    for it are cached apart (draw k distinct answers of one prompt with samples 0..k-1)."""

    def __post_init__(self) -> None:
        """Refuse what no worker could run, now, naming the field and (a shortened repr of) the value.

        Types only, and cheap for the common item (an ASCII id, an ``LLMCallStrategy``, a text
        prompt, no params): a few type checks, nothing built. What is inside messages and params,
        and what needs the whole prompt or context read (a lone surrogate, nesting), is checked at
        intake, where every way in applies it once and can say where the item came from.
        """
        item_id = self.item_id
        if type(item_id) is not str or not item_id or not item_id.isascii():
            problem = item_id_problem(item_id)
            if problem is not None:
                raise ValueError(f"LLMWorkItem: item_id={item_id!r:.80} {problem}")
        strategy: object = self.strategy
        if not isinstance(strategy, LLMCallStrategy):
            raise TypeError(f"LLMWorkItem(item_id={item_id!r:.80}): strategy={strategy!r:.80} must be "
                            "an LLMCallStrategy instance (CallableStrategy wraps an async function)")
        prompt: object = self.prompt  # typed as a Prompt; checked because callers pass anything
        if type(prompt) is not str and (isinstance(prompt, (bytes, bytearray))
                                        or not isinstance(prompt, (str, Sequence))):
            raise TypeError(f"LLMWorkItem(item_id={item_id!r:.80}): prompt={prompt!r:.80} must be a str "
                            "or a list of chat messages")
        sample: object = self.sample
        if sample != 0 and (type(sample) is not int or sample < 0):
            raise ValueError(f"LLMWorkItem(item_id={item_id!r:.80}): sample={sample!r:.80} must be a whole "
                             "number >= 0")
        params: object = self.params
        if params is not None and not isinstance(params, Mapping):
            raise TypeError(f"LLMWorkItem(item_id={item_id!r:.80}): params={params!r:.80} must be a mapping "
                            "of request parameters, or None")

    @property
    def request(self) -> LLMRequest:
        return LLMRequest(self.prompt, self.params or {})

    @property
    def prompt_text(self) -> str:
        """The prompt's text (a text prompt as is; messages' text joined by newlines)."""
        return prompt_text(self.prompt)


def checked_items(strategy: LLMCallStrategy[TOutput], ids: Iterable[str], prompts: Iterable[Prompt],
                  contexts: Iterable[Any] | None = None) -> list[LLMWorkItem[TOutput]]:
    """Items whose every field the caller has checked already (an input check's fast path), without params.

    Built without :meth:`LLMWorkItem.__post_init__`, whose type checks would only repeat the caller's:
    for a list of a million prompts they were a second of its up-front check. The collector is paused
    while they are built (no user code runs here): every object made is kept, so its collections
    would find no garbage, yet rescanning the growing list cost as much again as building it.
    """
    new = object.__new__
    items: list[LLMWorkItem[TOutput]] = []
    append = items.append
    collecting = gc.isenabled()
    gc.disable()
    try:
        for item_id, prompt, context in zip(ids, prompts, repeat(None) if contexts is None else contexts,
                                            strict=False):
            item: LLMWorkItem[TOutput] = new(LLMWorkItem)
            item.item_id = item_id
            item.strategy = strategy
            item.prompt = prompt
            item.context = context
            item.params = None
            item.sample = 0
            append(item)
    finally:
        if collecting:
            gc.enable()
    return items
