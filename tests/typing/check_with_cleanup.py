"""Type-checked (not run): mypy must infer the body's result type through with_cleanup."""

from __future__ import annotations

from typing import assert_type

from trio_batch_llm import with_cleanup


async def body() -> list[int]:
    return [1]


async def cleanup() -> None:
    return None


async def use() -> None:
    value = await with_cleanup(body, cleanup, cleanup_timeout=1.0)
    assert_type(value, list[int])
