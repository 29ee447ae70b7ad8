"""Token estimates for TPM admission: the public :class:`TokenEstimate` and the arithmetic of a charge.

A request is admitted with ``input estimate + output allowance`` tokens. The
input estimate is a count function's (a tiktoken count when tiktoken is
installed and knows the strategy's model, else about four characters a token);
the output allowance is the request's ``max_output_tokens`` (item params over
strategy params) when one is set, else :data:`DEFAULT_OUTPUT_ALLOWANCE`. A user
``token_estimator`` may return an ``int`` (the input estimate: the request's max
output is added) or a :class:`TokenEstimate` (used whole: its output part is the
allowance).

Pure values: loading tiktoken (an import, perhaps a download, in a worker thread,
cached per process) is the runtime's job, :mod:`.._engine._tokenizer`, which hands
its count function in here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from ._errors import ConfigurationError

__all__ = [
    "DEFAULT_OUTPUT_ALLOWANCE",
    "RequestTokens",
    "TokenCharge",
    "TokenEstimate",
    "character_tokens",
    "default_token_estimator",
    "max_output_tokens",
    "output_part",
    "prompt_text",
]

DEFAULT_OUTPUT_ALLOWANCE: Final = 256
"""Tokens reserved for the answer of a request that sets no ``max_output_tokens``."""

MAX_OUTPUT_KEYS: Final = ("max_output_tokens", "max_completion_tokens", "max_tokens")
"""The request parameters that bound the answer, in the order they are looked up."""


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(name, value, "must be a whole number >= 0")
    return value


@final
@dataclass(frozen=True, slots=True)
class TokenEstimate:
    """Estimated input and expected output tokens of one request (as in async-batch-llm).

    A ``ProcessorConfig.token_estimator`` may return one: the TPM reservation is
    :attr:`total_tokens`, so its ``output_tokens`` stand in for the request's
    ``max_output_tokens``.
    """

    input_tokens: int
    output_tokens: int = 0

    def __post_init__(self) -> None:
        _count("input_tokens", self.input_tokens)
        _count("output_tokens", self.output_tokens)

    @property
    def total_tokens(self) -> int:
        """The tokens the quota gate reserves for the request."""
        return self.input_tokens + self.output_tokens


def character_tokens(text: str) -> int:
    """About four characters a token: generous for English, cheap to compute."""
    return len(text) // 4


def default_token_estimator(prompt: str) -> int:
    """A cheap, deliberately generous estimate: about four characters a token, plus room for output."""
    return character_tokens(prompt) + DEFAULT_OUTPUT_ALLOWANCE


def prompt_text(prompt: object) -> str:
    """The text of a prompt for counting: a ``str``, or the text parts of chat messages joined."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Mapping):
        prompt = [prompt]
    if not isinstance(prompt, (list, tuple)):
        return str(prompt)
    parts: list[str] = []
    for message in prompt:
        content = message.get("content") if isinstance(message, Mapping) else message
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, (list, tuple)):
            for part in content:
                text = part.get("text") if isinstance(part, Mapping) else None
                if isinstance(text, str):
                    parts.append(text)
    return "\n".join(parts)


def max_output_tokens(*layers: Mapping[str, Any] | None) -> int | None:
    """The first answer bound set in ``layers`` (most specific first), or ``None``."""
    for params in layers:
        if not params:
            continue
        for key in MAX_OUTPUT_KEYS:
            value = params.get(key)
            if value is not None:
                return _count(f"params[{key!r}]", value)
    return None


@final
class RequestTokens:
    """How the requests of one strategy are estimated for the TPM reservation (one per binding)."""

    __slots__ = ("_count", "_defaults", "_estimator", "_system")

    def __init__(
        self,
        estimator: Callable[[str], int | TokenEstimate] | None,
        *,
        system: str | None = None,
        defaults: Mapping[str, Any] | None = None,
        count: Callable[[str], int] | None = None,
    ) -> None:
        self._estimator = estimator
        self._system = system
        self._defaults = defaults
        self._count = count or character_tokens

    def __call__(self, prompt: object, params: Mapping[str, Any] | None = None) -> int:
        """The tokens to reserve for one request of ``prompt`` with the item's ``params`` (a
        :class:`TokenCharge`: it says its output part too, when known)."""
        text = prompt_text(prompt)
        bound = max_output_tokens(params, self._defaults)
        if self._estimator is not None:
            value = self._estimator(text)
            if isinstance(value, TokenEstimate):
                return TokenCharge(value.total_tokens, value.output_tokens)
            counted = _count("token_estimator()", value)
            return counted + bound if bound is not None else counted  # its output part unknown
        system = params.get("system", self._system) if params else self._system
        tokens = self._count(text)
        if isinstance(system, str) and system:
            tokens += self._count(system)
        output = DEFAULT_OUTPUT_ALLOWANCE if bound is None else bound
        return TokenCharge(tokens + output, output)


class TokenCharge(int):
    """A request's token charge (input estimate + output allowance) that says its output part too.

    An ``int``, so every quota that knows one token budget takes it as it is; a scope paced by
    separate input and output budgets (Anthropic's) charges each its own part (:func:`output_part`).
    """

    output: int

    def __new__(cls, total: int, output: int) -> TokenCharge:
        charge = super().__new__(cls, total)
        charge.output = min(max(0, output), total)
        return charge


def output_part(tokens: int) -> int | None:
    """The output part of a token charge (``None``: not known, a plain ``int``)."""
    return tokens.output if isinstance(tokens, TokenCharge) else None
