"""The ``trio-batch-llm`` command line: ``run``, ``demo`` and ``serve-mock``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _run_backend(backend: str, fn: object, *args: object) -> object:
    import anyio

    return anyio.run(fn, *args, backend=backend)  # type: ignore[arg-type]


def _demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    return run_demo(items=args.items, concurrency=args.concurrency, backend=args.backend)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trio-batch-llm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a batch against the built-in provider; no key needed")
    demo.add_argument("--items", type=int, default=200)
    demo.add_argument("--concurrency", type=int, default=32)
    demo.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
