"""PNG plots of the benchmark results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _common import results_path

_COLORS = {"trio": "tab:blue", "asyncio": "tab:orange", "uvloop": "tab:green"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_drain(records: list[dict[str, Any]], name: str = "drain.png") -> Path:
    """p95 drain by N, one panel per (group, scenario): ours solid, floor dashed, async-batch-llm black."""
    plt = _pyplot()
    panels = [(g, s) for g in ("in-process", "http") for s in ("cancel", "graceful", "deadline")
              if any(r["group"] == g and r["scenario"] == s for r in records)]
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (group, scenario) in zip(axes.flat, panels, strict=False):
        chosen = [r for r in records if r["group"] == group and r["scenario"] == scenario]
        for (impl, backend) in sorted({(r["impl"], r["backend"]) for r in chosen}):
            series = sorted((r["n"], max(r["p95"], 0.01)) for r in chosen if r["impl"] == impl and r["backend"] == backend)
            ns, p95 = zip(*series, strict=True)
            if impl == "async-batch-llm":
                style = {"color": "black", "linestyle": "-", "marker": "s", "label": "async-batch-llm (asyncio)"}
            elif impl == "ours":
                style = {"color": _COLORS.get(backend), "linestyle": "-", "marker": "o", "label": f"ours ({backend})"}
            elif impl == "floor":
                style = {"color": _COLORS.get(backend), "linestyle": "--", "marker": ".", "label": f"floor ({backend})"}
            else:
                style = {"color": _COLORS.get(backend), "linestyle": ":", "marker": "x",
                         "label": f"native floor ({backend})"}
            ax.plot(ns, p95, **style)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N calls in flight (+10×N queued)")
        extra = " beyond remaining time" if scenario == "graceful" else ""
        ax.set_ylabel(f"p95 drain{extra} (ms)")
        ax.set_title(f"{group}: {scenario}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = results_path(name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_bars(title: str, labels: list[str], values: list[float], ylabel: str, name: str,
              reference: tuple[str, float] | None = None) -> Path:
    """One horizontal bar per variant (throughput, CPU/item, ...), with an optional reference line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(labels) + 1.5))
    colors = ["black" if "async-batch-llm" in label else
              next((c for k, c in _COLORS.items() if k in label), "tab:gray") for label in labels]
    ax.barh(range(len(labels)), values, color=colors)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(ylabel)
    ax.set_title(title)
    if reference is not None:
        ax.axvline(reference[1], color="red", linestyle="--", label=reference[0])
        ax.legend(fontsize=8)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,.0f}" if v >= 10 else f" {v:.2f}", va="center", fontsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    path = results_path(name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
