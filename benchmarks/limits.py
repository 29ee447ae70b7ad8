"""Admission that learns the provider's limits (issue 19): how close each client gets to a limit it is not told.

    python benchmarks/limits.py [--quick] [--only rpm,tpm,step] [--variants ours-headers,...]

Each client runs in its own process against its own mock server process
(``_mock_process.py``), which enforces a limit over sliding 60 s windows and
answers 429 with a truthful Retry-After when it is exceeded. All the
(variant, backend) pairs of a scenario run at the same time, side by side, so
they share the machine alike; the scenarios run one after another:

- ``rpm``: 1,200 requests per minute, no token limit, for 180 s;
- ``tpm``: 60,000 tokens per minute (100 tokens a request: 600 requests a
  minute), no request limit, for 150 s;
- ``step``: 1,200 requests per minute, halved to 600 at 60 s, for 180 s.

The mock's clock is not accelerated (it has no way to be): every scenario
lasts a few real 60 s windows, the same for every variant. Variants:

- ``ours-headers``: ``process_prompts`` + ``OpenAICompatibleStrategy``, no limit
  configured, learning on (the default); the mock sends OpenAI's rate-limit headers;
- ``ours-no-headers``: the same, the mock sends no rate-limit headers (only Retry-After on 429s);
- ``ours-2x-no-learn``: a configured RPM (TPM) twice the server's, ``learn_limits=False``:
  the library before issue 19; no headers;
- ``abl-true`` / ``abl-2x``: async-batch-llm configured with the true limit / twice it
  (skipped, and said so, when it is not installed);
- ``gather``: a plain ``asyncio.Semaphore`` + ``asyncio.gather`` loop that sleeps each 429's Retry-After.

Every client runs 64 calls at once against a server that answers in 0.1-0.3 s,
so only the limit binds. Measured on the server's own records (per server,
times from its first request):

- ``fraction_of_limit``: what was served per minute over the whole windows from
  the end of the first window (from one window after the step, for ``step``),
  over the limit in force (for ``tpm``: tokens); ``measured_s`` says which span;
- ``fraction_first_window``: the same over the first window (learning included);
- ``rate_429``: the share of all requests of the run answered 429;
- ``convergence_s`` (``step``): seconds from the halving until, from then on, no
  60 s window holds more requests (served or refused) than the new limit: the
  client is back under it (``null``: not by the end of the run). A window that
  ends less than 60 s after the halving also holds what was sent before it, so
  even a client that sent nothing more would take up to a window (here about 30 s: the
  server refuses everything until the window holds less than the new limit);
- ``convergence_1pct_s``: the same, with windows up to 1 % over the new limit allowed (a
  probe refused now and then in a full window).

Writes ``benchmarks/results/limits.json`` (rows) and ``limits.png``.
"""

from __future__ import annotations

import argparse
import bisect
import importlib.util
import json
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import results_path, table, use_quick_results
from _mock_process import MockServerProcess

HERE = Path(__file__).resolve().parent
WINDOW = 60.0
CONCURRENCY = 64
LATENCY = (0.1, 0.3)


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # "requests" or "tokens": what the limit counts
    limit: int  # the server's limit at the start
    duration: float
    prompt_chars: int
    output_tokens: int
    step_at: float | None = None  # seconds after the first request
    step_to: int | None = None

    def server(self, headers: bool) -> dict[str, Any]:
        config: dict[str, Any] = {"latency": list(LATENCY), "output_tokens": self.output_tokens,
                                  "ratelimit_headers": headers, "retry_after": None}
        config["rpm_limit" if self.kind == "requests" else "tpm_limit"] = self.limit
        if self.step_at is not None:
            config["limit_schedule"] = [[self.step_at, self.step_to, None]]
        return config

    def limit_at(self, t: float) -> int:
        if self.step_at is not None and self.step_to is not None and t >= self.step_at:
            return self.step_to
        return self.limit


SCENARIOS = {
    "rpm": Scenario("rpm", "requests", 1200, 180.0, prompt_chars=40, output_tokens=10),
    "tpm": Scenario("tpm", "tokens", 60_000, 150.0, prompt_chars=200, output_tokens=50),
    "step": Scenario("step", "requests", 1200, 180.0, prompt_chars=40, output_tokens=10,
                     step_at=60.0, step_to=600),
}


@dataclass(frozen=True)
class Variant:
    name: str
    client: str  # _limits_client.py --variant
    headers: bool  # whether the mock sends rate-limit headers
    limit_factor: float | None = None  # configure the limit times this (None: configure none)
    learn: bool = True
    backends: tuple[str, ...] = ("asyncio",)


VARIANTS = [
    Variant("ours-headers", "ours", True, backends=("trio", "asyncio")),
    Variant("ours-no-headers", "ours", False, backends=("trio", "asyncio")),
    Variant("ours-2x-no-learn", "ours", False, limit_factor=2.0, learn=False, backends=("trio", "asyncio")),
    Variant("abl-true", "abl", False, limit_factor=1.0),
    Variant("abl-2x", "abl", False, limit_factor=2.0),
    Variant("gather", "gather", False),
]


@dataclass
class Pair:
    variant: Variant
    backend: str
    server: MockServerProcess
    process: subprocess.Popen[str] | None = None
    records: list[list[Any]] = field(default_factory=list)


def client_args(scenario: Scenario, variant: Variant, backend: str, base_url: str) -> list[str]:
    args = [sys.executable, str(HERE / "_limits_client.py"), "--variant", variant.client, "--backend", backend,
            "--base-url", base_url, "--duration", str(scenario.duration + 3.0),
            "--concurrency", str(CONCURRENCY), "--prompt-chars", str(scenario.prompt_chars),
            "--output-tokens", str(scenario.output_tokens), "--items", "40000"]
    if variant.limit_factor is not None:
        configured = scenario.limit * variant.limit_factor
        args += ["--rpm", str(configured)] if scenario.kind == "requests" else ["--tpm", str(int(configured))]
    if not variant.learn:
        args.append("--no-learn")
    return args


def measure(scenario: Scenario, records: list[list[Any]]) -> dict[str, Any]:
    """The row's figures from one server's records: ``[arrival, outcome, prompt_tokens]`` each."""
    if not records:
        return {"requests": 0, "fraction_of_limit": 0.0, "fraction_first_window": 0.0, "rate_429": None}
    start = min(r[0] for r in records)
    end = scenario.duration
    rows = [(r[0] - start, r[1], r[2] + scenario.output_tokens) for r in records if r[0] - start < end]

    def served(low: float, high: float) -> float:
        weight = (lambda t: 1) if scenario.kind == "requests" else (lambda t: t)
        return sum(weight(tokens) for at, outcome, tokens in rows if low <= at < high and outcome == "ok")

    def refused(low: float, high: float) -> tuple[int, int]:
        inside = [outcome for at, outcome, _ in rows if low <= at < high]
        return sum(1 for o in inside if o == "rate_limited_enforced"), len(inside)

    base = 0.0 if scenario.step_at is None else scenario.step_at
    measured_from = base + min(WINDOW, (end - base) / 2)  # quick runs are shorter than a window
    # Whole windows only: a sliding window bounds what any 60 s serve, not what 90 s may (two bursts).
    whole = int((end - measured_from) // WINDOW)
    measured_to = measured_from + whole * WINDOW if whole else end
    limit_after = scenario.limit_at(measured_from)
    per_minute = served(measured_from, measured_to) * WINDOW / (measured_to - measured_from)
    limited, total = refused(0.0, end)
    row: dict[str, Any] = {
        "requests": total,
        "measured_s": [round(measured_from, 1), round(measured_to, 1)],
        "served_per_minute": round(per_minute, 1),
        "limit": limit_after,
        "fraction_of_limit": round(per_minute / limit_after, 4),
        "fraction_first_window": round(served(0.0, min(WINDOW, end)) * WINDOW / min(WINDOW, end)
                                       / scenario.limit, 4),
        "rate_429": round(limited / total, 4) if total else None,
    }
    if scenario.step_at is not None:
        row["fraction_before_step"] = round(served(0.0, scenario.step_at) * WINDOW / scenario.step_at
                                            / scenario.limit, 4)
        # Converged: from then on, no 60 s window ending later holds more requests (served or
        # refused, retries too) than the new limit: the client is back under it.
        arrivals = sorted(at for at, _, _ in rows)
        new_limit = scenario.limit_at(scenario.step_at)

        def converged_at(allowed: float) -> float | None:
            converged: float | None = None
            t = end
            while t >= scenario.step_at:
                low = bisect.bisect_left(arrivals, t - WINDOW)
                high = bisect.bisect_left(arrivals, t)
                if high - low > allowed:
                    break
                converged = t - scenario.step_at
                t -= 1.0
            return converged

        row["convergence_s"] = converged_at(new_limit)
        # The same with 1 % over the limit allowed: a probe refused now and then in a full window
        # is not a client sending above the limit.
        row["convergence_1pct_s"] = converged_at(new_limit * 1.01)
        after, count_after = refused(scenario.step_at, end)
        row["rate_429_after_step"] = round(after / count_after, 4) if count_after else None
    return row


def run_scenario(scenario: Scenario, variants: list[Variant]) -> list[dict[str, Any]]:
    print(f"\n== {scenario.name}: {scenario.kind} limit {scenario.limit:,}"
          + (f" -> {scenario.step_to:,} at {scenario.step_at:g} s" if scenario.step_at is not None else "")
          + f", {scenario.duration:g} s", flush=True)
    pairs: list[Pair] = []
    with ExitStack() as stack:
        for variant in variants:
            for backend in variant.backends:
                server = stack.enter_context(MockServerProcess(record=True, config=scenario.server(variant.headers)))
                pairs.append(Pair(variant, backend, server))
        for pair in pairs:
            pair.process = subprocess.Popen(client_args(scenario, pair.variant, pair.backend, pair.server.base_url),
                                            stdout=subprocess.PIPE, text=True)
        for pair in pairs:
            assert pair.process is not None
            pair.process.communicate(timeout=scenario.duration + 120.0)
            if pair.process.returncode != 0:
                print(f"   {pair.variant.name} ({pair.backend}) exited with {pair.process.returncode}", flush=True)
            pair.records = pair.server.records()
    rows = []
    for pair in pairs:
        row = {"scenario": scenario.name, "variant": pair.variant.name, "backend": pair.backend,
               **measure(scenario, pair.records)}
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    headers = ["scenario", "variant", "backend", "served/min", "limit", "fraction", "first window", "429 share",
               "converge s", "within 1 %"]
    body = [[r["scenario"], r["variant"], r["backend"], r.get("served_per_minute", 0.0), r.get("limit", 0),
             f"{r['fraction_of_limit']:.3f}", f"{r['fraction_first_window']:.3f}",
             "-" if r["rate_429"] is None else f"{100 * r['rate_429']:.2f} %",
             *["-" if key not in r else ("never" if r[key] is None else f"{r[key]:g}")
               for key in ("convergence_s", "convergence_1pct_s")]]
            for r in rows]
    print(table(headers, body), flush=True)


def plot(rows: list[dict[str, Any]]) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    fig, axes = plt.subplots(len(scenarios), 2, figsize=(12, 2.2 + 0.35 * 9 * len(scenarios)), squeeze=False)
    for (left, right), name in zip(axes, scenarios, strict=True):
        chosen = [r for r in rows if r["scenario"] == name]
        labels = [f"{r['variant']} ({r['backend']})" for r in chosen]
        colors = ["black" if r["variant"].startswith("abl") else "tab:gray" if r["variant"] == "gather"
                  else "tab:blue" if r["backend"] == "trio" else "tab:orange" for r in chosen]
        ticks = range(len(chosen))
        left.barh(ticks, [r["fraction_of_limit"] for r in chosen], color=colors)
        left.axvline(0.95, color="red", linestyle="--", linewidth=1)
        left.set_yticks(ticks, labels, fontsize=8)
        left.invert_yaxis()
        left.set_xlim(0, 1.05)
        left.set_title(f"{name}: served as a fraction of the limit", fontsize=9)
        right.barh(ticks, [100 * (r["rate_429"] or 0.0) for r in chosen], color=colors)
        right.axvline(1.0, color="red", linestyle="--", linewidth=1)
        right.set_xscale("symlog", linthresh=1.0)
        right.set_yticks(ticks, [""] * len(chosen))
        right.invert_yaxis()
        right.set_title(f"{name}: requests answered 429 (%)", fontsize=9)
        for ax in (left, right):
            ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    path = results_path("limits.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="30 s scenarios, results to a scratch folder")
    parser.add_argument("--only", default="", help="comma-separated scenarios: " + ",".join(SCENARIOS))
    parser.add_argument("--variants", default="", help="comma-separated variants: "
                        + ",".join(v.name for v in VARIANTS))
    args = parser.parse_args()
    if args.quick:
        use_quick_results()
    scenarios = [SCENARIOS[n] for n in (args.only.split(",") if args.only else SCENARIOS)]
    if args.quick:
        scenarios = [Scenario(s.name, s.kind, s.limit, 40.0, s.prompt_chars, s.output_tokens,
                              None if s.step_at is None else 15.0, s.step_to) for s in scenarios]
    wanted = set(filter(None, args.variants.split(",")))
    variants = [v for v in VARIANTS if not wanted or v.name in wanted]
    skipped = []
    if importlib.util.find_spec("async_batch_llm") is None:
        skipped = [v.name for v in variants if v.client == "abl"]
        variants = [v for v in variants if v.client != "abl"]
        print(f"async-batch-llm is not installed: {', '.join(skipped)} skipped", flush=True)
    began = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for scenario in scenarios:
        rows += run_scenario(scenario, variants)
        print_table([r for r in rows if r["scenario"] == scenario.name])
    print("\n== all", flush=True)
    print_table(rows)
    # The file is the list of rows the issue asks for; how they were made is in each row and above.
    for row in rows:
        row["duration_s"] = next(s.duration for s in scenarios if s.name == row["scenario"])
    path = results_path("limits.json")
    if args.only and path.exists():  # a partial run replaces only its own scenarios' rows
        ran = {s.name for s in scenarios}
        rows = [r for r in json.loads(path.read_text(encoding="utf-8")) if r["scenario"] not in ran] + rows
    path.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {path}" + (f" and {plot(rows)}" if rows else ""), flush=True)
    print(f"{time.perf_counter() - began:.0f} s in all; skipped: {', '.join(skipped) or 'none'}", flush=True)


if __name__ == "__main__":
    main()
