"""Our request and pydantic-ai's run, both ways: item params -> ``model_settings``, chat messages ->
``message_history``, a run's usage -> :class:`TokenUsage`.

pydantic-ai is imported inside the functions that build its messages, never at module level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..._values._prompts import LLMRequest
from ..._values._results import TokenUsage

__all__ = ["REFUSED_PARAMS", "history_problem", "run_input", "settings_of", "token_usage"]

SETTING_OF_PARAM: Final[Mapping[str, str]] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_output_tokens": "max_tokens",
    "seed": "seed",
    "stop": "stop_sequences",
    "extra_body": "extra_body",
}
"""Our request parameters that are pydantic-ai ``ModelSettings`` (ours -> theirs)."""
REFUSED_PARAMS: Final[Mapping[str, str]] = {
    "response_format": "the agent's output_type decides the answer's shape: give the agent (or "
                       "PydanticAIStrategy) output_type=",
    "tools": "the agent's tools are its own: register them on the agent",
    "tool_choice": "the agent decides when to call its tools",
    "logprobs": "pydantic-ai's ModelSettings have no logprobs",
    "top_logprobs": "pydantic-ai's ModelSettings have no logprobs",
}
"""Our parameters an agent run cannot take, and why (refused at input, before any call)."""
_TEXT_PART: Final = "text"


def settings_of(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` (ours, checked) as pydantic-ai ``model_settings``; ``system`` is not one (see
    :func:`run_input`) and the refused keys never get here."""
    settings: dict[str, Any] = {}
    for key, value in params.items():
        name = SETTING_OF_PARAM.get(key)
        if name is None or value is None:
            continue
        settings[name] = [value] if name == "stop_sequences" and isinstance(value, str) else value
    return settings


def history_problem(request: LLMRequest) -> str | None:
    """Why ``request``'s chat messages cannot become an agent run, or ``None``.

    Taken: text (or text-part) messages of roles system/developer, user and assistant, ending with a
    user message (the run's prompt). Refused: tool calls and results, images and other non-text
    parts (the agent's tools and pydantic-ai's own content types are the way to those).
    """
    if isinstance(request.prompt, str):
        return None
    messages = request.messages
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant"):
            return f"messages[{index}] has role {role!r}: an agent run takes system, user and assistant " \
                   "messages (tool calls belong to the agent's own tools)"
        if message.get("tool_calls") or message.get("function_call"):
            return f"messages[{index}] carries tool calls: the agent's tools make their own"
        if _text_of(message.get("content")) is None:
            return f"messages[{index}] has content that is not text (an image or another part): pass " \
                   "pydantic-ai content to the agent yourself, or text here"
    if messages[-1].get("role") != "user":
        return f"the last message is {messages[-1].get('role')!r}: an agent run answers a user message"
    return None


def run_input(request: LLMRequest) -> tuple[str, list[Any]]:
    """``(user_prompt, message_history)`` for ``agent.run`` (checked first by :func:`history_problem`)."""
    if isinstance(request.prompt, str):
        return request.prompt, []
    from pydantic_ai.messages import ModelRequest, ModelResponse, SystemPromptPart, TextPart, UserPromptPart

    messages = request.messages
    history: list[Any] = []
    pending: list[Any] = []  # request parts gather until an assistant answer closes them
    for message in messages[:-1]:
        text = _text_of(message.get("content")) or ""
        role = message.get("role")
        if role == "assistant":
            if pending:
                history.append(ModelRequest(parts=pending))
                pending = []
            history.append(ModelResponse(parts=[TextPart(content=text)]))
        elif role in ("system", "developer"):
            pending.append(SystemPromptPart(content=text))
        else:
            pending.append(UserPromptPart(content=text))
    if pending:
        history.append(ModelRequest(parts=pending))
    return _text_of(messages[-1].get("content")) or "", history


def token_usage(usage: Any) -> TokenUsage:
    """A run's ``RunUsage`` (all its model requests) as our :class:`TokenUsage`.

    pydantic-ai counts cache reads and writes inside ``input_tokens``, as we do.
    """
    def count(name: str) -> int:
        value = getattr(usage, name, 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    input_tokens, output_tokens = count("input_tokens"), count("output_tokens")
    return TokenUsage(
        input_tokens=input_tokens, output_tokens=output_tokens, total_tokens=input_tokens + output_tokens,
        cached_input_tokens=count("cache_read_tokens"),
        cache_write_input_tokens=count("cache_write_tokens"),  # its one-hour writes are inside it
        reasoning_tokens=count("output_reasoning_tokens"),
    )


def _text_of(content: Any) -> str | None:
    """A message's text (a string, or a list of text parts joined), or ``None`` if it has other parts."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != _TEXT_PART or \
                    not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return "".join(texts)
    return None
