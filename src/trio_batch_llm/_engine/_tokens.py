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

__all__ = ["request_tokens"]

_TIKTOKEN_INSTALLED = importlib.util.find_spec("tiktoken") is not None


async def request_tokens(
    strategy: LLMCallStrategy[Any], estimator: Callable[[str], int | TokenEstimate] | None
) -> RequestTokens:
    """The estimator of ``strategy``'s requests: ``estimator`` when given, else a tiktoken count for its
    model when tiktoken is installed and can load the encoding, else the character estimate.

    Loading an encoding may block (an import, perhaps a download attempt), so a model's first load
    runs in a worker thread; later bindings of the same model use the cached answer.
    """
    count = None
    if estimator is None and _TIKTOKEN_INSTALLED:
        model = strategy.model_name
        found, count = cached_tiktoken_counter(model)
        if not found:
            count = await anyio.to_thread.run_sync(tiktoken_counter, model)
    return RequestTokens(estimator, system=system_prompt_of(strategy), defaults=default_params(strategy),
                         count=count)
