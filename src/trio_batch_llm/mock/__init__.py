"""A mock provider server: run, test and measure a pipeline without a provider or a key.

It speaks each provider's wire format on one real socket on 127.0.0.1, under
Trio or asyncio: OpenAI's (``POST /v1/chat/completions``, ``POST /v1/responses``,
``GET /v1/models``, and the Files and Batch APIs under ``/v1/files`` and
``/v1/batches``), Anthropic's (``POST /v1/messages``) and the other dialects
listed in ``server.base_urls``. It is written from the providers' documented
formats and imports nothing from the library's clients, so a strategy (or a
provider's SDK) talks to it over real HTTP exactly as it would to a provider:

    from trio_batch_llm import OpenAICompatibleStrategy, process_prompts
    from trio_batch_llm.mock import MockServerConfig, serve_mock

    async with serve_mock(MockServerConfig(latency=0.01, rate_limit_rate=0.05)) as server:
        strategy = OpenAICompatibleStrategy("any-model", base_url=server.base_url)
        batch = await process_prompts(strategy, prompts)
        print(server.stats.rate_limited, "answers were 429")

- :func:`serve_mock` runs the server for an ``async with`` block, on a port
  the system chooses, and gives the :class:`MockServer`: its ``base_url``, what
  it counted (``stats``), what it received (``requests``), and
  ``wait_for(predicate)`` to wait on its counters without polling.
- :func:`run_mock_server` serves until Ctrl+C (``trio-batch-llm serve-mock``).
- :class:`MockOpenAIApp` is the ASGI app itself, to mount in-process through
  ``httpx2.ASGITransport``: what a test under Trio's virtual clock uses, since
  a real socket needs a real clock.
- :class:`MockServerConfig` turns the knobs: latency, answer sizes, injected
  429s with ``Retry-After``, 5xx answers, hangs, connection resets, truncated
  bodies, RPM/TPM limits the server enforces (with OpenAI's ``x-ratelimit-*``
  headers to tell them, ``ratelimit_headers``, and changes at given times,
  ``limit_schedule``), a gateway's limit per calendar minute that tells nothing
  (``calendar_rpm_limit``), LiteLLM's ``llm_provider-retry-after`` hint beside or
  instead of ``Retry-After`` (``retry_after_headers``), a required API key, and the Batch API's create faults
  and batch outcomes. Faults are drawn from ``seed``
  and the prompt, so a run gets the same answers and faults on every machine
  and on both backends.
- :class:`MockServerStats` is a snapshot of its counters and
  :class:`RecordedRequest` one request as it arrived (keys never recorded).

Markers inside a prompt force a fault for that prompt, for exact tests:
``[[fail:503]]``, ``[[fail:429x2]]`` (only the first two times the prompt
arrives), ``[[hang]]``, ``[[reset]]``, ``[[malformed]]``,
``[[context_length]]``, ``[[content_policy]]``, ``[[latency:0.25]]``,
``[[retry_after:2.5]]``, ``[[spend_limit]]`` (a spent limit, no wait), and OpenRouter's
``[[error_in_200:429]]`` and ``[[no_provider]]``. Each dialect answers in its own shape
(Anthropic: ``{"type": "error", "error": {...}}``, 529 ``overloaded_error``, ``retry-after``,
``anthropic-ratelimit-*``).

Structured output: a request asking for a JSON schema (``response_format``
``json_schema``, or ``text.format``) is answered with deterministic JSON valid
for it, and a required tool choice with a tool call; ``[[schema_violation]]``,
``[[invalid_json]]``, ``[[fenced]]``, ``[[refusal]]`` and ``[[reject_schema]]``
(also ``xN``) break that answer on purpose, and ``invalid_json_rate``,
``schema_violation_rate`` and ``reject_json_schema`` do it by configuration.
Every request is recorded as received (``server.requests[i].body``).

The demo, the command line's ``serve-mock``, the project's own tests and its
benchmarks all use this server. It needs the ``mock`` extra
(``pip install "trio-batch-llm[mock]"``). :mod:`trio_batch_llm.testing`
re-exports every name here, next to the scripted ``FakeStrategy``.
"""

from .._public import fixup_module_metadata as _fixup_module_metadata
from ._app import MockOpenAIApp as MockOpenAIApp
from ._server import MockServer as MockServer
from ._server import run_mock_server as run_mock_server
from ._server import serve_mock as serve_mock
from ._state import MockServerConfig as MockServerConfig
from ._state import MockServerStats as MockServerStats
from ._state import RecordedRequest as RecordedRequest

__all__ = [
    "MockOpenAIApp",
    "MockServer",
    "MockServerConfig",
    "MockServerStats",
    "RecordedRequest",
    "run_mock_server",
    "serve_mock",
]


_fixup_module_metadata(__name__, globals())
del _fixup_module_metadata
