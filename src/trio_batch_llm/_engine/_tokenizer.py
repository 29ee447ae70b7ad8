"""The tokenizer of a strategy's model: tiktoken loaded off the event loop, and the TPM estimator it feeds.

The estimate's arithmetic is a value (:mod:`.._values._token_estimates`); what
is runtime is here: tiktoken is an optional import that may try to download its
encoding on first use, so it is loaded once per model in a worker thread when a
strategy is bound to an owner, and cached for the process (behind a lock: the
worker threads of two owners may load at once).
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from .._values._strategy_settings import default_params, system_prompt_of
from .._values._token_estimates import RequestTokens, TokenEstimate

if TYPE_CHECKING:
    from .._strategies._base import LLMCallStrategy

__all__ = ["cached_tiktoken_counter", "load_tokenizer", "request_tokens", "tiktoken_counter",
           "tokenizer_unloaded"]

_TIKTOKEN_INSTALLED = importlib.util.find_spec("tiktoken") is not None

Estimator = Callable[[str], int | TokenEstimate]

_encoders: dict[str, Callable[[str], int] | None] = {}
_encoders_lock = threading.Lock()


def cached_tiktoken_counter(model: str | None) -> tuple[bool, Callable[[str], int] | None]:
    """``(True, counter)`` when :func:`tiktoken_counter` has answered for ``model`` already (or
    there is no model), else ``(False, None)``: a first load, which may block."""
    if not model:
        return True, None
    with _encoders_lock:
        if model in _encoders:
            return True, _encoders[model]
    return False, None


def tiktoken_counter(model: str | None) -> Callable[[str], int] | None:
    """A tiktoken token count for ``model``, or ``None``: tiktoken absent, model unknown to it,
    or its encoding not loadable (tiktoken downloads encodings on first use; offline that fails).

    Blocking on a first call per model (import, perhaps a download attempt): call it in a
    worker thread. The answer, ``None`` included, is cached per model for the process.
    """
    if not model:
        return None
    with _encoders_lock:
        if model in _encoders:
            return _encoders[model]
    counter: Callable[[str], int] | None
    try:
        tiktoken = importlib.import_module("tiktoken")  # optional (the [tiktoken] extra), imported late
        encoding = tiktoken.encoding_for_model(model)
        encoding.encode("probe")  # surfaces a broken download now, not on the hot path

        def counter(text: str) -> int:
            return len(encoding.encode(text, disallowed_special=()))
    except Exception:  # noqa: BLE001 - no tiktoken, unknown model, no network: use the character estimate
        counter = None
    with _encoders_lock:
        return _encoders.setdefault(model, counter)


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
