"""Render benchmarks/results/*.json as Markdown tables (for docs/benchmarks.md).

    python benchmarks/report.py > /tmp/figures.md
"""

from __future__ import annotations

import json
from typing import Any

from _common import RESULTS
from drain import summarize


def _f(value: Any, digits: int = 1) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(_f(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def drain_section(payload: dict[str, Any]) -> str:
    rows, goals = summarize(payload["records"])
    out = []
    for group in ("in-process", "http"):
        for scenario in ("cancel", "graceful", "deadline"):
            chosen = [r for r in rows if r["group"] == group and r["scenario"] == scenario]
            if not chosen:
                continue
            unit = "ms beyond the 50 ms still to run" if scenario == "graceful" and group == "in-process" else (
                "ms beyond the last answer's due time" if scenario == "graceful" else "ms")
            body = []
            for r in chosen:
                o, f, a, nat = r["ours"], r["floor"], r["abl"], r["native"]
                body.append([r["n"], r["backend"], o["p50"], o["p95"], o["max"], o["reps"], f["p95"] if f else "-",
                             f"{r['vs_floor']:.2f}×", nat["p95"] if nat else "-", a["p95"] if a else "-",
                             f"{r['vs_abl']:.2f}×" if a else "-"])
            out.append(f"**{group} / {scenario}** ({unit})\n\n" + md_table(
                ["N", "backend", "ours p50", "ours p95", "ours max", "reps", "floor p95", "ours/floor",
                 "native floor p95", "ABL p95", "ours/ABL"], body))
    abl = [r for r in payload["records"] if r["impl"] == "async-batch-llm"]
    if abl:
        out.append("**async-batch-llm 0.28 (asyncio), in-process** (ms)\n\n" + md_table(
            ["scenario", "N", "p50", "p95", "max", "reps"],
            [[r["scenario"], r["n"], r["p50"], r["p95"], r["max"], r["reps"]] for r in abl]))
    if goals:
        out.append(md_table(["drain goal", "ratio", "met"],
                            [[g["goal"], f"{g['value']:.2f}×", "yes" if g["met"] else "**no**"] for g in goals]))
    return "\n\n".join(out)


def throughput_section(payload: dict[str, Any]) -> str:
    out = []
    if "latency" in payload:
        out.append("**1. 10,000 items, 100 workers, 5 ms latency** (ceiling 20,000/s)\n\n" + md_table(
            ["variant", "items/s", "vs bare pool", "vs ABL"],
            [[r["variant"], r["items_per_s"], f"{r.get('vs_bare', float('nan')):.2f}×",
              _ratio(r.get("vs_abl"))] for r in payload["latency"]]))
    if "cpu" in payload:
        out.append("**2. zero latency: CPU per item**\n\n" + md_table(
            ["variant", "CPU µs/item", "vs bare pool", "vs ABL"],
            [[r["variant"], r["cpu_us_per_item"], f"{r.get('cpu_vs_bare', float('nan')):.2f}×",
              _ratio(r.get("cpu_vs_abl"))] for r in payload["cpu"]]))
    if "http" in payload:
        first = payload["http"][0]
        out.append(f"**3. mock server over HTTP**, {first['items']:,} requests at concurrency "
                   f"{first['concurrency']}\n\n" + md_table(
                       ["variant", "requests/s", "vs raw httpx2", "vs ABL"],
                       [[r["variant"], r["items_per_s"], f"{r['vs_raw']:.2f}×", _ratio(r["vs_abl"])]
                        for r in payload["http"]]))
    if "memory" in payload:
        out.append("**4. process_stream, bounded queues, fresh process per size**\n\n" + md_table(
            ["backend", "items", "peak RSS before (MiB)", "peak RSS after (MiB)", "growth (MiB)", "items/s"],
            [[r["backend"], r["items"], r["peak_rss_before_mib"], r["peak_rss_after_mib"], r["peak_growth_mib"],
              r["items_per_s"]] for r in payload["memory"]]))
    if "import" in payload:
        out.append("**6. import time** (median cumulative, `-X importtime`)\n\n" + md_table(
            ["module", "ms", "heavy modules it imports"],
            [[r["module"], r["median_us"] / 1000, r["also_imported"]] for r in payload["import"]]))
    if payload.get("goals"):
        out.append(md_table(["throughput goal", "value", "met"],
                            [[g["goal"], f"{g['value']:.2f}", "yes" if g["met"] else "**no**"]
                             for g in payload["goals"]]))
    return "\n\n".join(out)


def _ratio(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.2f}×"


def main() -> None:
    for name, render in (("drain", drain_section), ("throughput", throughput_section)):
        path = RESULTS / f"{name}.json"
        if path.exists():
            payload = json.loads(path.read_text(encoding="utf-8"))
            print(f"<!-- {name}: {payload['machine']} -->\n")
            print(render(payload))
            print()


if __name__ == "__main__":
    main()
