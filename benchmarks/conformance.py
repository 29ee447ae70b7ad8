"""Wire conformance against a server we did not write: our command line behind LiteLLM's proxy.

    python benchmarks/conformance.py [--litellm PATH] [--backend trio|asyncio] [--json OUT]

Our own mock server is written from the providers' documents, but by us; LiteLLM's
proxy is an independent implementation of the same three dialects. It is started
(``pip install 'litellm[proxy]'``; found by ``--litellm``, ``$LITELLM_BIN`` or PATH)
with ``mock_response`` models, so no provider is ever called:

- ``conformance-plain`` answers ``conformance ok``;
- ``conformance-json`` answers ``{"answer": "42"}`` (for a ``--response-schema`` run);
- ``conformance-429`` raises LiteLLM's mock ``RateLimitError`` (HTTP 429) on every call.

Then ``trio-batch-llm run`` is run against it in every dialect the proxy serves --
OpenAI's ``/v1/chat/completions`` and ``/v1/responses`` (``openai-compatible:``, ``--api``),
Anthropic's ``/v1/messages`` (``anthropic:``) and Gemini's
``/v1beta/models/...:generateContent`` (``gemini:``) -- with the key passed by
``--api-key-env`` in each dialect's own header. Each case checks what the run wrote:

- ``plain``: every item succeeded with the text ``conformance ok``;
- ``structured``: every item succeeded with the object ``{"answer": "42"}``;
- ``always-429``: no item succeeded, and the failures are ``rate_limit`` (or items a
  stop kept from running), within ``--max-rate-limit-wait``.

A case is ``pass``, ``FAIL`` (with why), ``proxy`` (LiteLLM did not produce what the
case needs in that dialect; said how) or ``skip`` (the strategy is not installed).
Prints the table and writes JSON (``benchmarks/results/conformance.json`` or
``--json``). Not part of the test suite: it needs LiteLLM and minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import table, write_json
from _litellm_process import start_proxy, stop_proxy
from gateway_litellm import find_litellm, free_port

MASTER_KEY = "sk-conformance-local-0123456789abcdef"  # the local proxy's own key; nothing secret
KEY_ENV = "CONFORMANCE_PROXY_KEY"
PLAIN, JSON_ANSWER = "conformance ok", {"answer": "42"}
ITEMS = 3
MODELS = {
    "plain": ("conformance-plain", PLAIN),
    "structured": ("conformance-json", json.dumps(JSON_ANSWER)),
    "always-429": ("conformance-429", "litellm.RateLimitError"),
}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
          "additionalProperties": False}


@dataclass(frozen=True)
class Dialect:
    name: str
    provider: str
    path: str  # appended to the proxy's root for --base-url
    extra: tuple[str, ...] = ()
    module: str | None = None  # the strategy module that must be importable


DIALECTS = (
    Dialect("openai chat", "openai-compatible", "/v1", ("--api", "chat")),
    Dialect("openai responses", "openai-compatible", "/v1", ("--api", "responses")),
    Dialect("anthropic messages", "anthropic", "", module="trio_batch_llm._strategies.anthropic._strategy"),
    Dialect("gemini generateContent", "gemini", "", module="trio_batch_llm._strategies.gemini._strategy"),
)


@dataclass
class Outcome:
    dialect: str
    case: str
    verdict: str
    detail: str
    exit_status: int | None
    seconds: float


class Proxy:
    """LiteLLM's proxy with the three ``mock_response`` models, on a free port."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.port = free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        lines = ["model_list:"]
        for model, answer in MODELS.values():
            lines += [f"  - model_name: {model}", "    litellm_params:", "      model: openai/gpt-4o-mini",
                      "      api_key: sk-upstream-never-called", f"      mock_response: {json.dumps(answer)}"]
        lines += ["litellm_settings:", "  num_retries: 0", "router_settings:", "  num_retries: 0"]
        config = workdir / "litellm.yaml"
        config.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self._args = [binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(self.port)]
        self.log = workdir / "litellm.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Proxy:
        self._proc = start_proxy(self._args, self.log, self.root, MASTER_KEY)
        return self

    def __exit__(self, *exc: object) -> None:
        stop_proxy(self._proc)


def _records(out: Path) -> list[dict[str, Any]]:
    """The newest record per item of a run's checkpoint (a header line, then one record per result)."""
    if not out.exists():
        return []
    newest: dict[str, dict[str, Any]] = {}
    for line in out.read_text(encoding="utf-8").splitlines()[1:]:
        record = json.loads(line)
        result = record.get("result", record)
        newest[str(result.get("item_id"))] = result
    return list(newest.values())


def judge(case: str, results: list[dict[str, Any]]) -> tuple[str, str]:
    """``(verdict, detail)`` of one case from the results its run wrote."""
    if len(results) != ITEMS:
        return "FAIL", f"{len(results)} results written, {ITEMS} expected"
    succeeded = [r for r in results if r.get("success")]
    if case == "always-429":
        answers = {str(r.get("output")) for r in succeeded}
        if succeeded and answers == {"litellm.RateLimitError"}:
            return "proxy", "LiteLLM answered 200 with the mock's text instead of a 429 in this dialect"
        categories = sorted({str(r.get("error_category")) for r in results if not r.get("success")})
        if succeeded or not set(categories) <= {"rate_limit", "not_executed", "budget"}:
            return "FAIL", f"succeeded {len(succeeded)}, failure categories {categories}"
        return "pass", f"all failed: {', '.join(categories)}"
    failed = [r for r in results if not r.get("success")]
    if failed:
        first = failed[0]
        return "FAIL", f"{len(failed)} failed, first: {first.get('error_category')}: {str(first.get('error'))[:160]}"
    expected: Any = JSON_ANSWER if case == "structured" else PLAIN
    outputs = [r.get("output") for r in succeeded]
    wrong = [o for o in outputs if o != expected]
    if wrong:
        return "FAIL", f"answer {wrong[0]!r}, expected {expected!r}"
    return "pass", f"{len(outputs)} answers {expected!r}"


def run_case(proxy: Proxy, dialect: Dialect, case: str, workdir: Path, backend: str) -> Outcome:
    if dialect.module is not None:
        import importlib.util

        try:
            missing = importlib.util.find_spec(dialect.module) is None
        except ImportError:
            missing = True
        if missing:
            return Outcome(dialect.name, case, "skip", f"{dialect.module} is not installed", None, 0.0)
    model = MODELS[case][0]
    folder = workdir / f"{dialect.name.replace(' ', '-')}-{case}"
    folder.mkdir()
    source, out = folder / "in.jsonl", folder / "out.jsonl"
    source.write_text("".join(json.dumps({"id": f"c{i}", "prompt": f"conformance prompt {i}"}) + "\n"
                              for i in range(ITEMS)), encoding="utf-8")
    argv = [sys.executable, "-m", "trio_batch_llm", "run", str(source), "--model", f"{dialect.provider}:{model}",
            "--base-url", proxy.root + dialect.path, "--api-key-env", KEY_ENV, "--out", str(out),
            "--backend", backend, "--max-tokens", "64", "--max-attempts", "2", "--attempt-timeout", "30",
            "--max-rate-limit-wait", "4", *dialect.extra]
    if case == "structured":
        schema = folder / "schema.json"
        schema.write_text(json.dumps(SCHEMA), encoding="utf-8")
        argv += ["--response-schema", str(schema)]
    env = {**os.environ, KEY_ENV: MASTER_KEY, "PYTHONUNBUFFERED": "1"}
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "ANTHROPIC_BASE_URL"):
        env.pop(name, None)  # only the named key may travel
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, timeout=180, check=False)
    except subprocess.TimeoutExpired:
        return Outcome(dialect.name, case, "FAIL", "the run did not end within 180 s", None,
                       time.perf_counter() - started)
    seconds = time.perf_counter() - started
    (folder / "cli.log").write_bytes(done.stdout + done.stderr)
    if done.returncode == 2:  # refused before it ran: say why
        why = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()[-1:] or [""]
        return Outcome(dialect.name, case, "FAIL", f"refused: {why[0][:200]}", 2, seconds)
    verdict, detail = judge(case, _records(out))
    return Outcome(dialect.name, case, verdict, detail, done.returncode, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--litellm", help="the litellm executable (default: $LITELLM_BIN, then PATH)")
    parser.add_argument("--backend", choices=("trio", "asyncio"), default="trio")
    parser.add_argument("--json", help="write the JSON here (default benchmarks/results/conformance.json)")
    parser.add_argument("--only", help="comma-separated dialect names' first words (openai, anthropic, gemini)")
    args = parser.parse_args()
    binary = find_litellm(args.litellm or ("/tmp/litellm-venv/bin/litellm"
                                           if Path("/tmp/litellm-venv/bin/litellm").exists() else None))
    if binary is None:
        print("skipped: LiteLLM's proxy is not installed (pip install 'litellm[proxy]', or --litellm PATH)")
        return 0
    dialects = [d for d in DIALECTS if not args.only or d.name.split()[0] in args.only.split(",")]
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp, Proxy(binary, Path(tmp)) as proxy:
        for dialect in dialects:
            for case in MODELS:
                outcome = run_case(proxy, dialect, case, Path(tmp), args.backend)
                outcomes.append(outcome)
                print(f"{outcome.dialect:24} {outcome.case:11} {outcome.verdict:5} {outcome.detail}", flush=True)
    rows = [[o.dialect, o.case, o.verdict, o.exit_status if o.exit_status is not None else "-", o.seconds,
             o.detail] for o in outcomes]
    print()
    print(table(["dialect", "case", "verdict", "exit", "s", "detail"], rows))
    payload = {"litellm": binary, "backend": args.backend, "outcomes": [asdict(o) for o in outcomes]}
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {args.json}")
    else:
        print(f"\nwrote {write_json('conformance', payload)}")
    return 1 if any(o.verdict == "FAIL" for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
