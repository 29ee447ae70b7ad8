"""The TPM estimate of one strategy's requests, resolved when the strategy is bound to an owner."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from .._values._strategy_settings import default_params, system_prompt_of
from .._values._tokens import RequestTokens, TokenEstimate, cached_tiktoken_counter, tiktoken_counter

if TYPE_CHECKING:
    from .._strategies._base import LLMCallStrategy

__all__ = ["load_tokenizer", "request_tokens", "tokenizer_unloaded"]

_TIKTOKEN_INSTALLED = importlib.util.find_spec("tiktoken") is not None

Estimator = Callable[[str], int | TokenEstimate]


def tokenizer_unloaded(strategy: LLMCallStrategy[Any], estimator: Estimator | None) -> bool:
    """Whether :func:`request_tokens` would use tiktoken for ``strategy``'s model, not yet loaded."""
    return estimator is None and _TIKTOKEN_INSTALLED and not cached_tiktoken_counter(strategy.model_name)[0]


async def load_tokenizer(strategy: LLMCallStrategy[Any]) -> None:
    """Load tiktoken's encoding of ``strategy``'s model, in a worker thread: an import, perhaps a
    download attempt, both blocking. The answer (a failure included) is cached per model."""
    await anyio.to_thread.run_sync(tiktoken_counter, strategy.model_name)


def request_tokens(strategy: LLMCallStrategy[Any], estimator: Estimator | None) -> RequestTokens:
    """The estimator of ``strategy``'s requests: ``estimator`` when given, else a tiktoken count for its
    model when tiktoken is installed and its encoding loaded (:func:`load_tokenizer`), else the
    character estimate."""
    count = None
    if estimator is None and _TIKTOKEN_INSTALLED:
        count = cached_tiktoken_counter(strategy.model_name)[1]
    return RequestTokens(estimator, system=system_prompt_of(strategy), defaults=default_params(strategy),
                         count=count)
