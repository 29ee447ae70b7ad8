"""The command line's arguments: the checks of each value, and the arguments several commands share.

Each ``type=`` function turns a bad value into an ``argparse`` error that
names what was expected and what was given, so the command exits with status
2 before it does anything.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from typing import Final, NamedTuple

from .._values._errors import ConfigurationError
from .._values._quota_backend import RedisQuotaBackend
from ._command import UsageError
from ._providers import API_HELP, PROVIDERS

__all__ = [
    "BACKENDS",
    "KEY_HELP",
    "MAX_BATCH_REQUESTS",
    "PROVIDERS",
    "add_backend_argument",
    "add_live_arguments",
    "add_model_arguments",
    "add_progress_argument",
    "add_request_arguments",
    "batch_size",
    "limit_change",
    "model_spec",
    "non_empty",
    "non_negative_float",
    "non_negative_int",
    "port",
    "positive_float",
    "positive_int",
    "probability",
]

BACKENDS: Final = ["trio", "asyncio"]
MAX_BATCH_REQUESTS: Final = 50_000  # the Batch API's lines per file (ProviderBatchConfig refuses more)
KEY_HELP: Final = ("environment variable holding the endpoint's API key, sent to any --base-url; without it "
                   "each provider's own key (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY or "
                   "GOOGLE_API_KEY, OPENROUTER_API_KEY) is sent only to that provider's own API, and "
                   "another --base-url gets no key")


def add_backend_argument(parser: argparse._ActionsContainer,
                         text: str = "the event loop (default trio)") -> None:
    """``--backend``: the event loop a command runs on, for every command that runs one."""
    parser.add_argument("--backend", choices=BACKENDS, default="trio", help=text)


def add_progress_argument(parser: argparse._ActionsContainer, otherwise: str = "") -> None:
    """``--progress/--no-progress`` (``run`` and ``demo``); ``otherwise`` says what is shown
    when stderr is not a terminal."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help=f"a progress bar on stderr (default: when stderr is a terminal{otherwise})")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``INPUT``, ``--model``, ``--base-url`` and ``--api-key-env``: what ``run`` and ``runs start`` share."""
    parser.add_argument("input", metavar="INPUT", help="a .jsonl or .csv file of prompts")
    parser.add_argument("--model", required=True, type=model_spec, metavar="PROVIDER:MODEL",
                        help=f"PROVIDER is one of {', '.join(PROVIDERS)} (openrouter:VENDOR/NAME); "
                             "openai: speaks OpenAI's Responses API unless --api chat (see --api)")
    parser.add_argument("--base-url", help="the endpoint, e.g. http://127.0.0.1:8000/v1 (default: the "
                        "provider's own API; required for openai-compatible)")
    parser.add_argument("--api-key-env", metavar="NAME", help=KEY_HELP)
    parser.add_argument("--api", choices=("chat", "responses"), help=API_HELP)


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """The request settings ``run`` and ``runs start`` pass to the strategy as defaults (a JSONL row's
    own ``params`` win). They are part of the checkpoint's identity: a resume with other settings
    is refused rather than replaying answers to other requests."""
    group = parser.add_argument_group("request settings (defaults for every item)")
    group.add_argument("--system", metavar="TEXT", type=non_empty, help="the system prompt")
    group.add_argument("--temperature", type=non_negative_float, metavar="F", help="the sampling temperature")
    group.add_argument("--max-tokens", type=positive_int, metavar="N",
                       help="the most output tokens per answer (also what --tpm reserves for it)")
    group.add_argument("--response-schema", metavar="FILE.json",
                       help="a JSON schema (a JSON object) each answer must follow: structured output")


class _LiveOption(NamedTuple):
    type: Callable[[str], object]
    metavar: str | None
    help: str


def add_live_arguments(parser: argparse._ActionsContainer, *flags: str,
                       defaults: Mapping[str, object] | None = None,
                       more_help: Mapping[str, str] | None = None) -> None:
    """The live-call options ``run`` and ``runs start`` share, added in the order of ``flags``.

    One table holds each option's type, metavar and help, so the two commands
    cannot drift apart. The defaults differ (``run`` has its own; ``runs
    start`` has none: it tells a flag not given from one given), so the caller
    passes them; ``more_help`` appends a command's own remark to an option's help."""
    for flag in flags:
        option = _LIVE_OPTIONS[flag]
        parser.add_argument(flag, type=option.type, metavar=option.metavar,
                            default=(defaults or {}).get(flag),
                            help=option.help + (more_help or {}).get(flag, ""))


def _int(text: str, expected: str, low: int, high: int | None = None) -> int:
    """``text`` as a whole number from ``low`` (to ``high``): the one check behind every whole-number
    argument, so each names what it expected the same way."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _int(text, "a whole number >= 1", 1)


def limit_change(text: str) -> tuple[float, int | None, int | None]:
    """``AT:RPM:TPM`` (``RPM`` or ``TPM`` empty: no such limit), for ``serve-mock --limit-change``."""
    expected = "AT:RPM:TPM (seconds >= 0, then whole numbers >= 1 or empty), e.g. 90:600:"
    parts = text.split(":")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    try:
        at = non_negative_float(parts[0])
        limits = [None if not part.strip() else positive_int(part) for part in parts[1:]]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    return at, limits[0], limits[1]


def _float(text: str, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _float(text, "a number > 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def wait_bound(text: str) -> float | None:
    """Seconds > 0, or ``none`` for no bound (``--max-rate-limit-wait``)."""
    if text.strip().lower() == "none":
        return None
    value = _float(text, "a number > 0 or none")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0 or none, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _float(text, "a number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def probability(text: str) -> float:
    value = _float(text, "a probability between 0 and 1")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a probability between 0 and 1, got {text!r}")
    return value


def model_spec(text: str) -> tuple[str, str]:
    """``PROVIDER:MODEL`` -> ``(provider, model)``; the provider must be one we know."""
    provider, colon, model = text.partition(":")
    expected = " or ".join(f"{p}:MODEL" for p in PROVIDERS)
    if not colon:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    if provider not in PROVIDERS:
        raise argparse.ArgumentTypeError(
            f"unknown provider {provider!r} in {text!r}; known: {', '.join(PROVIDERS)}"
        )
    if not model.strip():
        raise argparse.ArgumentTypeError(f"the model name after {provider!r}: is empty")
    return provider, model


def non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def non_negative_int(text: str) -> int:
    return _int(text, "a whole number >= 0", 0)


def batch_size(text: str) -> int:
    value = positive_int(text)
    if value > MAX_BATCH_REQUESTS:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_BATCH_REQUESTS} (the Batch API's limit), got {text!r}"
        )
    return value


def port(text: str) -> int:
    """A TCP port, 0 (the system chooses) to 65535."""
    return _int(text, "a port number from 0 to 65535", 0, 65535)


_LIVE_OPTIONS: Final = {
    "--concurrency": _LiveOption(positive_int, None, "calls in flight (default 16)"),
    "--rpm": _LiveOption(positive_float, None, "requests per minute at most"),
    "--tpm": _LiveOption(positive_int, None, "tokens per minute at most (estimated before a call)"),
    # str parses as no type would: --quota's URL is checked by quota_backend, after parsing
    "--quota": _LiveOption(str, "redis://...",
                           "share --rpm/--tpm and cooldowns with every process using this Redis"),
    "--quota-max-in-flight": _LiveOption(positive_int, "N",
                                         "with --quota: at most N calls in flight in all processes together"),
    "--attempt-timeout": _LiveOption(positive_float, "S", "seconds one attempt may take (default 120)"),
    "--max-attempts": _LiveOption(positive_int, "N", "attempts per item before it fails, rate-limit retries "
                                                     "not counted (default 3)"),
}


def quota_backend(text: str | None, max_in_flight: int | None = None) -> RedisQuotaBackend | None:
    """``--quota redis://...`` (and ``--quota-max-in-flight N``): a shared quota backend, or
    :class:`UsageError` in one line (the URL without its password). Not an argparse ``type``:
    argparse would print its usage block too."""
    if text is None:
        if max_in_flight is not None:
            raise UsageError("--quota-max-in-flight needs --quota redis://... (the Redis that counts "
                             "the calls in flight of every process)")
        return None
    try:
        return RedisQuotaBackend(text, max_in_flight=max_in_flight)
    except ConfigurationError as exc:
        raise UsageError(f"--quota {exc.value}: {exc.problem}") from None
