"""Admission against real-world 429s (issues 19 and 32): how close each client gets to a limit it is not told,
and how much throughput it keeps when 429s come at random.

    python benchmarks/limits.py [--quick] [--only rpm,tpm,step,random2,random10,random30,calendar]
                                [--variants ours-headers,...]

The scenarios of issue 32 alone (about 12 minutes), then their rows as docs/benchmarks.md's tables:

    python benchmarks/limits.py --only random2,random10,random30,calendar
    python benchmarks/limits.py --markdown

Each client runs in its own process against its own mock server process
(``_mock_process.py``), which enforces a limit over sliding 60 s windows and
answers 429 with a truthful Retry-After when it is exceeded. All the
(variant, backend) pairs of a scenario run at the same time, side by side, so
they share the machine alike; the scenarios run one after another:

- ``rpm``: 1,200 requests per minute, no token limit, for 180 s;
- ``tpm``: 60,000 tokens per minute (100 tokens a request: 600 requests a
  minute), no request limit, for 150 s;
- ``step``: 1,200 requests per minute, halved to 600 at 60 s, for 180 s;
- ``random2`` / ``random10`` / ``random30`` (issue 32): no limit at all, but 2 %,
  10 % or 30 % of requests answered 429 at random (seeded), with ``Retry-After: 1``
  and no rate-limit headers, as a gateway or an overloaded provider refuses: a lower
  rate cures nothing; 16 calls at once, for 120 s (long enough to see a client's
  rate ratchet down window after window);
- ``calendar`` (issue 32): 600 requests per *calendar minute* (the count starts again
  at every :00 of the wall clock), refused with a 429 that carries no Retry-After and
  no rate-limit headers, as some gateways count; 16 calls at once, for 240 s.

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

Variants of the issue-32 scenarios (the mock sends no rate-limit headers there):

- ``ours``: the library's defaults, no limit configured, learning on; trio and asyncio;
- ``ours-no-learn``: the same with ``RateLimitConfig(learn_limits=False)``; trio and asyncio;
- ``retry-loop``: a semaphore + retry loop as written with tenacity (full-jitter exponential
  backoff, never shorter than Retry-After), by hand (``_limits_client.py --variant retry``);
- ``abl`` (random 429s, no limit configured) / ``abl-true`` (calendar, the true limit configured):
  async-batch-llm, skipped when it is not installed.

Every client of rpm/tpm/step runs 64 calls at once (16 in the issue-32 scenarios) against a
server that answers in 0.1-0.3 s, so only the limit (or the 429s) binds. Measured on the
server's own records (per server, times from its first request):

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
  probe refused now and then in a full window);
- ``items_per_s`` (random 429s): answers served 200 per second over the run, and
  ``ratio_to_retry_loop``: that over the ``retry-loop`` variant's; ``served_per_30s``:
  the series, to show a rate ratcheting down;
- for ``calendar``, ``fraction_of_limit`` counts whole *calendar* minutes (the server's
  wall clock), from the second boundary after its first request (the first whole minute,
  learning included, is ``fraction_first_window``).

Goals (issue 32), printed PASS/MISS and kept in each row (``goal``, ``goal_met``):
random 429s, ``ours`` >= 0.9x the retry loop's items/s; rpm/tpm/step, ``ours-headers``
>= 95 % of the limit with < 1 % 429s, ``ours-no-headers`` >= 85 % with < 5 %; calendar,
``ours`` >= 90 % of the limit with < 2 % 429s. On a machine busy with other work the
figures check the harness, not the library.

Writes ``benchmarks/results/limits.json`` (rows) and ``limits.png`` (``--plot`` draws the PNG again from the JSON).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import importlib.util
import json
import math
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
    limit: int  # the server's limit at the start (0: none)
    duration: float
    prompt_chars: int
    output_tokens: int
    step_at: float | None = None  # seconds after the first request
    step_to: int | None = None
    family: str = "limit"  # "limit" (sliding window), "random" (429s at random), "calendar"
    random_429: float = 0.0  # the share of requests answered 429 at random ("random")
    concurrency: int = CONCURRENCY

    def server(self, headers: bool) -> dict[str, Any]:
        config: dict[str, Any] = {"latency": list(LATENCY), "output_tokens": self.output_tokens,
                                  "ratelimit_headers": headers, "retry_after": None}
        if self.family == "random":
            config.update(rate_limit_rate=self.random_429, retry_after=1.0, ratelimit_headers=False)
            return config
        if self.family == "calendar":
            config.update(calendar_rpm_limit=self.limit, ratelimit_headers=False)
            return config
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
    **{f"random{p}": Scenario(f"random{p}", "requests", 0, 120.0, prompt_chars=40, output_tokens=10,
                              family="random", random_429=p / 100, concurrency=16) for p in (2, 10, 30)},
    "calendar": Scenario("calendar", "requests", 600, 240.0, prompt_chars=40, output_tokens=10,
                         family="calendar", concurrency=16),
}


@dataclass(frozen=True)
class Variant:
    name: str
    client: str  # _limits_client.py --variant
    headers: bool  # whether the mock sends rate-limit headers
    limit_factor: float | None = None  # configure the limit times this (None: configure none)
    learn: bool = True
    backends: tuple[str, ...] = ("asyncio",)
    families: tuple[str, ...] = ("limit",)  # the scenario families it runs in


BOTH = ("trio", "asyncio")
VARIANTS = [
    Variant("ours-headers", "ours", True, backends=BOTH),
    Variant("ours-no-headers", "ours", False, backends=BOTH),
    Variant("ours-2x-no-learn", "ours", False, limit_factor=2.0, learn=False, backends=BOTH),
    Variant("ours", "ours", False, backends=BOTH, families=("random", "calendar")),
    Variant("ours-no-learn", "ours", False, learn=False, backends=BOTH, families=("random", "calendar")),
    Variant("retry-loop", "retry", False, families=("random", "calendar")),
    Variant("abl", "abl", False, families=("random",)),
    Variant("abl-true", "abl", False, limit_factor=1.0, families=("limit", "calendar")),
    Variant("abl-2x", "abl", False, limit_factor=2.0),
    Variant("gather", "gather", False),
]
BASELINE = "retry-loop"  # what ours is held against under random 429s


@dataclass
class Pair:
    variant: Variant
    backend: str
    server: MockServerProcess
    process: subprocess.Popen[str] | None = None
    records: list[list[Any]] = field(default_factory=list)
    wall_offset: float = 0.0  # time.time() - time.monotonic() in the server process


def client_args(scenario: Scenario, variant: Variant, backend: str, base_url: str) -> list[str]:
    args = [sys.executable, str(HERE / "_limits_client.py"), "--variant", variant.client, "--backend", backend,
            "--base-url", base_url, "--duration", str(scenario.duration + 3.0),
            "--concurrency", str(scenario.concurrency), "--prompt-chars", str(scenario.prompt_chars),
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


def measure_random(scenario: Scenario, records: list[list[Any]]) -> dict[str, Any]:
    """Items/s under random 429s: the answers served 200 per second over the run, and their series."""
    if not records:
        return {"requests": 0, "served": 0, "items_per_s": 0.0, "rate_429": None, "served_per_30s": []}
    start = min(r[0] for r in records)
    end = scenario.duration
    rows = [(r[0] - start, r[1]) for r in records if r[0] - start < end]
    served = [at for at, outcome in rows if outcome == "ok"]
    refused = sum(1 for _, outcome in rows if outcome in ("error:429", "rate_limited_enforced"))
    per_30s = [0] * math.ceil(end / 30.0)
    for at in served:
        per_30s[int(at // 30.0)] += 1
    return {"requests": len(rows), "served": len(served), "items_per_s": round(len(served) / end, 2),
            "rate_429": round(refused / len(rows), 4) if rows else None, "served_per_30s": per_30s}


def measure_calendar(scenario: Scenario, records: list[list[Any]], wall_offset: float) -> dict[str, Any]:
    """The share of a calendar-minute limit served, over whole minutes of the server's wall clock."""
    if not records:
        return {"requests": 0, "fraction_of_limit": 0.0, "fraction_first_window": 0.0, "rate_429": None}
    walls = sorted((r[0] + wall_offset, r[1]) for r in records)
    start = walls[0][0]
    end = start + scenario.duration
    rows = [(at, outcome) for at, outcome in walls if at < end]
    first = math.ceil(start / WINDOW) * WINDOW
    boundaries = [first + WINDOW * k for k in range(int((end - first) // WINDOW) + 1)]

    def served(low: float, high: float) -> int:
        return sum(1 for at, outcome in rows if low <= at < high and outcome == "ok")

    # Skip the partial minute and the first whole one (learning), as rpm skips its first window;
    # a short (--quick) run measures its one whole minute.
    measured_from = boundaries[1] if len(boundaries) >= 3 else boundaries[0]
    measured_to = boundaries[-1]
    minutes = (measured_to - measured_from) / WINDOW
    per_minute = served(measured_from, measured_to) / minutes if minutes else 0.0
    limited = sum(1 for _, outcome in rows if outcome == "rate_limited_enforced")
    whole_first = first + WINDOW <= end
    return {
        "requests": len(rows),
        "measured_s": [round(measured_from - start, 1), round(measured_to - start, 1)],
        "served_per_minute": round(per_minute, 1),
        "limit": scenario.limit,
        "fraction_of_limit": round(per_minute / scenario.limit, 4),
        "fraction_first_window": round(served(first, first + WINDOW) / scenario.limit, 4) if whole_first else 0.0,
        "rate_429": round(limited / len(rows), 4) if rows else None,
        "served_per_calendar_minute": [served(low, low + WINDOW) for low in boundaries[:-1]],
    }


def goal_of(row: dict[str, Any]) -> tuple[str, bool] | None:
    """The issue-32 goal this row is held to, and whether it met it (``None``: no goal for it)."""
    variant, family, share = row["variant"], row["family"], row.get("rate_429")
    if family == "random" and variant == "ours":
        ratio = row.get("ratio_to_retry_loop")
        return ">= 0.9x the retry loop's items/s", ratio is not None and ratio >= 0.9
    wanted = {("limit", "ours-headers"): (0.95, 0.01), ("limit", "ours-no-headers"): (0.85, 0.05),
              ("calendar", "ours"): (0.90, 0.02)}.get((family, variant))
    if wanted is None:
        return None
    least, most = wanted
    met = row["fraction_of_limit"] >= least and share is not None and share < most
    return f">= {least:.0%} of the limit, < {most:.0%} 429s", met


def run_scenario(scenario: Scenario, variants: list[Variant]) -> list[dict[str, Any]]:
    variants = [v for v in variants if scenario.family in v.families]
    if scenario.family == "random":
        what = f"{scenario.random_429:.0%} random 429s (Retry-After 1 s, no headers), no limit"
    elif scenario.family == "calendar":
        what = f"{scenario.limit:,} requests per calendar minute, no reset header"
    else:
        what = f"{scenario.kind} limit {scenario.limit:,}" + (
            f" -> {scenario.step_to:,} at {scenario.step_at:g} s" if scenario.step_at is not None else "")
    print(f"\n== {scenario.name}: {what}, {scenario.duration:g} s, {scenario.concurrency} at once", flush=True)
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
            stats = pair.server.stats()
            pair.wall_offset = stats["wall"] - stats["now"]
            pair.records = pair.server.records()
    rows = []
    for pair in pairs:
        if scenario.family == "random":
            figures = measure_random(scenario, pair.records)
        elif scenario.family == "calendar":
            figures = measure_calendar(scenario, pair.records, pair.wall_offset)
        else:
            figures = measure(scenario, pair.records)
        rows.append({"scenario": scenario.name, "family": scenario.family, "variant": pair.variant.name,
                     "backend": pair.backend, **figures})
    if scenario.family == "random":
        baseline = next((r["items_per_s"] for r in rows if r["variant"] == BASELINE), None)
        for row in rows:
            row["ratio_to_retry_loop"] = round(row["items_per_s"] / baseline, 3) if baseline else None
    for row in rows:
        goal = goal_of(row)
        row["goal"], row["goal_met"] = (None, None) if goal is None else goal
    return rows


def _verdict(row: dict[str, Any]) -> str:
    return "-" if row.get("goal_met") is None else ("PASS" if row["goal_met"] else "MISS")


def _share(row: dict[str, Any]) -> str:
    return "-" if row.get("rate_429") is None else f"{100 * row['rate_429']:.2f} %"


def print_table(rows: list[dict[str, Any]]) -> None:
    limits = [r for r in rows if r.get("family", "limit") != "random"]
    randoms = [r for r in rows if r.get("family") == "random"]
    if limits:
        headers = ["scenario", "variant", "backend", "served/min", "limit", "fraction", "first window",
                   "429 share", "converge s", "within 1 %", "goal"]
        body = [[r["scenario"], r["variant"], r["backend"], r.get("served_per_minute", 0.0), r.get("limit", 0),
                 f"{r['fraction_of_limit']:.3f}", f"{r['fraction_first_window']:.3f}", _share(r),
                 *["-" if key not in r else ("never" if r[key] is None else f"{r[key]:g}")
                   for key in ("convergence_s", "convergence_1pct_s")], _verdict(r)]
                for r in limits]
        print(table(headers, body), flush=True)
    if randoms:
        headers = ["scenario", "variant", "backend", "items/s", "x retry loop", "429 share", "served per 30 s",
                   "goal"]
        body = [[r["scenario"], r["variant"], r["backend"], r["items_per_s"],
                 "-" if r.get("ratio_to_retry_loop") is None else f"{r['ratio_to_retry_loop']:.2f}",
                 _share(r), " ".join(str(n) for n in r["served_per_30s"]), _verdict(r)]
                for r in randoms]
        print(table(headers, body), flush=True)


def print_goals(rows: list[dict[str, Any]]) -> None:
    goals = [r for r in rows if r.get("goal") is not None]
    if not goals:
        return
    print("\n== goals (issue 32)", flush=True)
    for r in goals:
        if r["family"] == "random":
            value = f"{r['ratio_to_retry_loop']}x" if r.get("ratio_to_retry_loop") is not None else "no baseline"
        else:
            value = f"{r['fraction_of_limit']:.1%} of the limit, {_share(r)} 429s"
        print(f"{_verdict(r)}  {r['scenario']:<9} {r['variant']:<16} {r['backend']:<8} {r['goal']}: {value}",
              flush=True)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The issue-32 rows as the Markdown tables of docs/benchmarks.md (``--markdown``)."""
    def share(r: dict[str, Any]) -> str:
        return "–" if r.get("rate_429") is None else f"{100 * r['rate_429']:.2f} %"

    def verdict(r: dict[str, Any]) -> str:
        return "" if r.get("goal_met") is None else ("**PASS**" if r["goal_met"] else "**MISS**")

    def ratio(r: dict[str, Any]) -> str:
        return "–" if r.get("ratio_to_retry_loop") is None else f"{r['ratio_to_retry_loop']:.2f}"

    lines = ["| scenario | variant | backend | items/s | × retry loop | 429s | served per 30 s | goal |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['scenario']} | {r['variant']} | {r['backend']} | {r['items_per_s']:.2f} | {ratio(r)} | "
              f"{share(r)} | {' '.join(map(str, r['served_per_30s']))} | {verdict(r)} |"
              for r in rows if r.get("family") == "random"]
    lines += ["", "| scenario | variant | backend | served / limit | first window | 429s "
                  "| served per calendar minute | goal |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['scenario']} | {r['variant']} | {r['backend']} | {100 * r['fraction_of_limit']:.1f} % | "
              f"{100 * r['fraction_first_window']:.0f} % | {share(r)} | "
              f"{' '.join(map(str, r.get('served_per_calendar_minute', [])))} | {verdict(r)} |"
              for r in rows if r.get("family") == "calendar"]
    return "\n".join(lines)


# What the plot calls each variant and scenario: words a reader can take in without the docstring.
VARIANT_LABELS = {
    "ours-headers": "trio-batch-llm, no limit set, server sends rate-limit headers",
    "ours-no-headers": "trio-batch-llm, no limit set, no rate-limit headers",
    "ours-2x-no-learn": "trio-batch-llm, limit set 2x too high, learning off",
    "ours": "trio-batch-llm, defaults (no limit set)",
    "ours-no-learn": "trio-batch-llm, learning off",
    "retry-loop": "hand-written retry loop (tenacity-style backoff)",
    "gather": "semaphore + gather, sleeping each Retry-After",
    "abl": "async-batch-llm 0.28, no limit set",
    "abl-true": "async-batch-llm 0.28, true limit set",
    "abl-2x": "async-batch-llm 0.28, limit set 2x too high",
}
SCENARIO_TITLES = {
    "rpm": "A limit of 1,200 requests/min the client is not told",
    "tpm": "A limit of 60,000 tokens/min the client is not told",
    "step": "1,200 requests/min, halved to 600 after 60 s",
    "random2": "No limit, 2 % of requests refused (429) at random",
    "random10": "No limit, 10 % of requests refused (429) at random",
    "random30": "No limit, 30 % of requests refused (429) at random",
    "calendar": "600 requests per calendar minute, no headers, no Retry-After",
}
_OURS = {"trio": "tab:blue", "asyncio": "tab:orange"}


def _color(row: dict[str, Any]) -> str:
    if row["variant"].startswith("abl"):
        return "black"
    if row["variant"] in ("gather", BASELINE):
        return "tab:gray"
    return _OURS.get(row["backend"], "tab:gray")


def _label(row: dict[str, Any]) -> str:
    return f"{VARIANT_LABELS.get(row['variant'], row['variant'])} ({row['backend']})"


def plot(rows: list[dict[str, Any]]) -> Path | None:
    """Two panels per scenario: what was served (or items/s), and the share of 429s.

    Every bar carries its value. A bar of zero is kept and says why it is empty: async-batch-llm
    served its first minute and then nothing (its default cooldown after a 429 is 300 s, longer than
    the rest of each run), which is a result, not missing data.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError:
        return None
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    fig, axes = plt.subplots(len(scenarios), 2, figsize=(14, 3.0 + 0.5 * 9 * len(scenarios)), squeeze=False,
                             gridspec_kw={"width_ratios": [1.35, 1]})
    for (left, right), name in zip(axes, scenarios, strict=True):
        chosen = [r for r in rows if r["scenario"] == name]
        colors = [_color(r) for r in chosen]
        ticks = range(len(chosen))
        title = SCENARIO_TITLES.get(name, name)
        if chosen[0].get("family") == "random":
            values = [r["items_per_s"] or 0.0 for r in chosen]
            left.barh(ticks, values, color=colors)
            baseline = next((r["items_per_s"] for r in chosen if r["variant"] == BASELINE), None)
            if baseline:
                left.axvline(0.9 * baseline, color="red", linestyle="--", linewidth=1)
            left.set_xlim(0, 1.3 * max(values))
            left.set_title(f"{title}\nanswers per second (goal: 0.9x the retry loop)", fontsize=11)
            texts = [f" {v:.1f}" for v in values]
        else:
            goal = 0.90 if chosen[0].get("family") == "calendar" else 0.95
            values = [100 * r["fraction_of_limit"] for r in chosen]
            left.barh(ticks, values, color=colors)
            left.axvline(100 * goal, color="red", linestyle="--", linewidth=1)
            left.set_xlim(0, 135)
            left.set_title(f"{title}\nserved, % of the limit, after the first minute (goal: {goal:.0%})",
                           fontsize=11)
            texts = [f" {v:.1f} %" if v > 0 else " 0 %: nothing after its first 429 (300 s cooldown)"
                     for v in values]
        for i, text in enumerate(texts):
            left.text(values[i], i, text, va="center", fontsize=9)
        left.set_yticks(ticks, [_label(r) for r in chosen], fontsize=10)
        left.invert_yaxis()
        shares = [100 * (r["rate_429"] or 0.0) for r in chosen]
        right.barh(ticks, shares, color=colors)
        ceiling = {"random": None, "calendar": 2.0}.get(chosen[0].get("family", "limit"), 1.0)
        if ceiling is not None:  # random 429s: their share is the server's, no goal
            right.axvline(ceiling, color="red", linestyle="--", linewidth=1)
        right.set_xscale("symlog", linthresh=1.0)
        right.set_xlim(0, 4 * max([*shares, 1.0]))
        for i, share in enumerate(shares):
            right.text(share, i, f" {share:.2f} %", va="center", fontsize=9)
        right.set_yticks(ticks, [""] * len(chosen))
        right.invert_yaxis()
        goal_text = "" if ceiling is None else f" (goal: under {ceiling:g} %)"
        right.set_title(f"requests answered 429, % of all{goal_text}", fontsize=11)
        for ax in (left, right):
            ax.grid(True, axis="x", alpha=0.3)
    legend = [Patch(color="tab:blue", label="trio-batch-llm on Trio"),
              Patch(color="tab:orange", label="trio-batch-llm on asyncio"),
              Patch(color="tab:gray", label="a plain asyncio loop, for reference"),
              Patch(color="black", label="async-batch-llm 0.28 (asyncio)"),
              Line2D([0], [0], color="red", linestyle="--", linewidth=1, label="goal")]
    fig.legend(handles=legend, loc="upper center", ncol=5, fontsize=11, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    path = results_path("limits.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="40 s scenarios (calendar: 130 s), results to a scratch folder")
    parser.add_argument("--only", default="", help="comma-separated scenarios: " + ",".join(SCENARIOS))
    parser.add_argument("--variants", default="", help="comma-separated variants: "
                        + ",".join(v.name for v in VARIANTS))
    parser.add_argument("--markdown", action="store_true",
                        help="print the random-429 and calendar rows of the last run's limits.json as Markdown, "
                             "run nothing")
    parser.add_argument("--plot", action="store_true", help="draw limits.png again from limits.json, run nothing")
    args = parser.parse_args()
    if args.quick:
        use_quick_results()
    if args.markdown:
        print(markdown(json.loads(results_path("limits.json").read_text(encoding="utf-8"))))
        return
    if args.plot:
        print(plot(json.loads(results_path("limits.json").read_text(encoding="utf-8"))))
        return
    scenarios = [SCENARIOS[n] for n in (args.only.split(",") if args.only else SCENARIOS)]
    if args.quick:
        scenarios = [dataclasses.replace(s, duration=130.0 if s.family == "calendar" else 40.0,
                                         step_at=None if s.step_at is None else 15.0) for s in scenarios]
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
    print_goals(rows)
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
