"""Helpers for testing pipelines built on trio-batch-llm: the scripted fake strategy and more."""

from .._strategies._fake import FakeStrategy as FakeStrategy

__all__ = ["FakeStrategy"]
