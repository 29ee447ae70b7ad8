"""What an item asks: a prompt (text or chat messages), its params, and the checks on both.

Values only, no dependency on strategies: the strategy protocol and the work item
both speak these.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, final

from ._schema_check import response_schema_problem

__all__ = [
    "PARAM_KEYS",
    "REQUEST_TEXT_PREFIX",
    "ROW_KEYS",
    "LLMRequest",
    "Message",
    "Prompt",
    "check_params",
    "check_prompt",
    "prompt_text",
    "request_of_text",
    "request_text",
    "row_problem",
]

Message: TypeAlias = Mapping[str, Any]
"""One chat message in OpenAI's format: ``{"role": ..., "content": str | [part, ...]}``."""
Prompt: TypeAlias = str | Sequence[Message]
"""What an item asks: a text prompt, or chat messages."""

PARAM_KEYS: Final = frozenset({
    "system", "temperature", "top_p", "max_output_tokens", "seed", "stop", "response_format",
    "tools", "tool_choice", "logprobs", "top_logprobs", "extra_body",
})
"""The request parameters an item (or a strategy's ``params=``) may set; ``max_tokens`` is an alias."""
_ALIASES: Final = {"max_tokens": "max_output_tokens"}
ROW_KEYS: Final = frozenset({"id", "item_id", "prompt", "messages", "params", "context"})
"""The keys of a request given as a mapping: a ``process_prompts`` entry, a JSONL row of the command
line or of a run's source. One rule (:func:`row_problem`) for every reader."""
_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool"})


def check_prompt(prompt: object, where: str) -> Prompt:
    """``prompt`` checked (a ``str``, or a non-empty list of messages); TypeError/ValueError naming it."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
        raise TypeError(f"{where}: prompt={prompt!r:.80} must be a str or a list of chat messages")
    if not prompt:
        raise ValueError(f"{where}: messages must not be empty")
    messages: list[Message] = []
    for index, message in enumerate(prompt):
        if not isinstance(message, Mapping):
            raise TypeError(f"{where}: messages[{index}]={message!r:.80} must be a mapping "
                            '({"role": ..., "content": ...})')
        role = message.get("role")
        if role not in _ROLES:
            raise ValueError(f"{where}: messages[{index}] role={role!r} must be one of {sorted(_ROLES)}")
        content = message.get("content")
        if content is None and role == "assistant" and message.get("tool_calls"):
            pass
        elif not isinstance(content, (str, list)):
            raise TypeError(f"{where}: messages[{index}] content={content!r:.80} must be a str or a list "
                            "of content parts")
        elif isinstance(content, list):
            for part_index, part in enumerate(content):
                if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                    raise TypeError(f"{where}: messages[{index}].content[{part_index}]={part!r:.80} must "
                                    'be a content part with a "type" (e.g. {"type": "text", "text": ...})')
        messages.append(dict(message))
    return messages


def row_problem(row: Mapping[Any, Any]) -> tuple[str, str] | None:
    """``(field, problem)`` when the keys of a request row break the rule, or ``None``.

    A row has ``"id"`` (or ``"item_id"``, not both), exactly one of ``"prompt"`` and
    ``"messages"``, and optionally ``"params"`` and ``"context"``. Any other key is refused
    rather than ignored: a misspelt ``"temprature"`` or a top-level ``"system"`` would
    otherwise run the item without it. Whether a row needs an id is its reader's rule.
    """
    for key in row:
        if key not in ROW_KEYS:
            return str(key), ('unknown key; a row has "id", "prompt" or "messages", and optionally '
                              '"params" and "context" (request parameters such as "temperature" or '
                              '"system" go in "params")')
    if "id" in row and "item_id" in row:
        return "item_id", 'give "id" or "item_id", not both'
    if "prompt" in row and "messages" in row:
        return "messages", 'give exactly one of "prompt" and "messages", not both'
    if "prompt" not in row and "messages" not in row:
        return "prompt", "missing"  # the command line's word for it, as for an id
    return None


def check_params(params: object, where: str) -> dict[str, Any]:
    """``params`` checked and normalised (``max_tokens`` -> ``max_output_tokens``); errors name the key."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise TypeError(f"{where}: params={params!r:.80} must be a mapping of request parameters")
    checked: dict[str, Any] = {}
    for key, value in params.items():
        name = _ALIASES.get(key, key) if isinstance(key, str) else key
        if name not in PARAM_KEYS:
            raise ValueError(
                f"{where}: params has the unknown key {key!r}; known: {', '.join(sorted(PARAM_KEYS))} "
                f"(max_tokens is accepted for max_output_tokens). To send a field the provider knows "
                f"but we do not, put it in params['extra_body'] = {{{key!r}: ...}}"
            )
        if name in checked:
            raise ValueError(f"{where}: params sets max_output_tokens twice (as max_tokens too)")
        problem = _param_problem(name, value)
        if problem is not None:
            raise ValueError(f"{where}: params[{key!r}]={value!r:.80} {problem}")
        checked[name] = dict(value) if isinstance(value, Mapping) else value
    return checked


def _param_problem(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if name == "system":
        return None if isinstance(value, str) else "must be a str"
    if name in ("temperature", "top_p"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else "must be a number"
    if name in ("max_output_tokens", "seed", "top_logprobs"):
        ok = isinstance(value, int) and not isinstance(value, bool) and (name == "seed" or value >= (
            1 if name == "max_output_tokens" else 0))
        return None if ok else "must be a positive integer" if name == "max_output_tokens" else \
            "must be an integer"
    if name == "stop":
        ok = isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        return None if ok else "must be a str or a list of str"
    if name in ("response_format", "extra_body"):
        if not isinstance(value, Mapping):
            return "must be a mapping"
        return _response_format_problem(value) if name == "response_format" else None
    if name == "tools":
        ok = isinstance(value, list) and all(isinstance(v, Mapping) for v in value)
        return None if ok else "must be a list of tool mappings"
    if name == "tool_choice":
        return None if isinstance(value, (str, Mapping)) else "must be a str or a mapping"
    if name == "logprobs":
        return None if isinstance(value, bool) else "must be a bool"
    return None


def _response_format_problem(value: Mapping[str, Any]) -> str | None:
    """A ``json_schema`` response format's schema, checked as ``response_model=`` checks one."""
    inner = value.get("json_schema")
    schema = inner.get("schema") if isinstance(inner, Mapping) else value.get("schema")
    if value.get("type") != "json_schema" or schema is None:
        return None
    problem = response_schema_problem(schema)
    return None if problem is None else f"holds a malformed JSON schema: the schema {problem}"


def prompt_text(prompt: Prompt) -> str:
    """All the text a prompt carries, joined by newlines (what a text-only strategy or an estimate sees)."""
    if isinstance(prompt, str):
        return prompt
    parts: list[str] = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.append("".join(str(p.get("text", "")) for p in content
                                 if isinstance(p, Mapping) and isinstance(p.get("text"), str)))
    return "\n".join(p for p in parts if p)


REQUEST_TEXT_PREFIX: Final = "\x00trio-batch-llm-request:"
"""Marks a request kept as one text (a run's prompt column, a store's ``prompt``): JSON follows."""


def request_text(prompt: Prompt, params: Mapping[str, Any] | None = None) -> str:
    """A request as one text: a text prompt without params as is, anything else as marked JSON.

    A text prompt that happens to start with the marker is wrapped too, so
    :func:`request_of_text` always gives back what went in.
    """
    if isinstance(prompt, str) and not params and not prompt.startswith(REQUEST_TEXT_PREFIX):
        return prompt
    payload = {"prompt": prompt if isinstance(prompt, str) else [dict(m) for m in prompt],
               "params": dict(params or {})}
    return REQUEST_TEXT_PREFIX + json.dumps(payload, ensure_ascii=False, sort_keys=True,
                                            separators=(",", ":"), allow_nan=False)


def request_of_text(text: str) -> tuple[Prompt, dict[str, Any] | None]:
    """``(prompt, params)`` of a :func:`request_text` (``params`` ``None`` when there were none)."""
    if not text.startswith(REQUEST_TEXT_PREFIX):
        return text, None
    payload = json.loads(text[len(REQUEST_TEXT_PREFIX):])
    return payload["prompt"], payload.get("params") or None


@final
@dataclass(frozen=True, slots=True)
class LLMRequest:
    """What one item asks of a strategy: its prompt (text or messages) and its own ``params``.

    The strategy merges its own defaults (``system_prompt=``, ``params=``) under ``params``.
    """

    prompt: Prompt
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_plain(self) -> bool:
        """A text prompt without parameters: what ``execute(prompt: str, ...)`` can take."""
        return isinstance(self.prompt, str) and not self.params

    @property
    def text(self) -> str:
        return prompt_text(self.prompt)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The prompt as chat messages (a text prompt is one user message); no system message added."""
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [dict(m) for m in self.prompt]
