"""The ``trio-batch-llm`` command line (``python -m trio_batch_llm`` runs it too)."""

from ._cli._main import build_parser as build_parser
from ._cli._main import main as main

__all__ = ["build_parser", "main"]
