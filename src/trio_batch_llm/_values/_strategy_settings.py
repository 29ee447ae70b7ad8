"""The request settings a strategy carries, read the same way by the identity and the token estimate.

A strategy may carry a ``system_prompt`` and default request ``params`` (a
mapping); the OpenAI strategies also keep ``temperature``, ``max_output_tokens``
and ``extra_body`` as attributes of their own. Both spellings are read, the
``params`` entry winning, so a setting counts once whichever way it was given.
Everything is read with ``getattr``: a user strategy need define none of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["default_params", "system_prompt_of"]

_ATTRIBUTE_PARAMS: Final = ("temperature", "max_output_tokens", "extra_body")


def system_prompt_of(strategy: object) -> str | None:
    """The strategy's system prompt, ``None`` when it has none (an empty one is none)."""
    system = getattr(strategy, "system_prompt", None)
    return system if isinstance(system, str) and system else None


def default_params(strategy: object) -> dict[str, Any]:
    """The strategy's default request params: ``params`` plus the settings it keeps as attributes."""
    given = getattr(strategy, "params", None)
    params: dict[str, Any] = dict(given) if isinstance(given, Mapping) else {}
    for name in _ATTRIBUTE_PARAMS:
        value = getattr(strategy, name, None)
        if value is not None and value != {} and name not in params:
            params[name] = value
    return params
