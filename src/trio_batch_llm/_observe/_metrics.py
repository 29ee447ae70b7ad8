"""MetricsObserver: counters and latency histograms from lifecycle events, as JSON or Prometheus text."""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, cast, final

from .._values._categories import ErrorCategory
from .._values._errors import ConfigurationError
from .._values._results import WorkItemResult
from ._events import (
    AttemptFailed,
    BatchFinished,
    BatchStarted,
    ItemCompleted,
    ItemFailed,
    ItemReplayed,
    ItemStarted,
    LifecycleEvent,
)

__all__ = [
    "DEFAULT_LATENCY_BUCKETS", "FAMILIES", "HISTOGRAMS", "MetricsObserver", "check_labels", "family_value",
]


DEFAULT_LATENCY_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
"""Upper bounds (seconds) of the latency histograms; ``+Inf`` is implied."""

_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED_LABELS: Final = frozenset({"le", "outcome", "category", "kind", "termination"})


def check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """``labels`` as a plain dict, checked: Prometheus label names, string values, none of ours."""
    checked: dict[str, str] = {}
    for name, value in (labels or {}).items():
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise ConfigurationError("labels", name, "label names are [a-zA-Z_][a-zA-Z0-9_]*, not __...")
        if name in _RESERVED_LABELS:
            raise ConfigurationError("labels", name, f"is a label the metrics set themselves "
                                     f"({', '.join(sorted(_RESERVED_LABELS))})")
        if not isinstance(value, str):
            raise ConfigurationError(f"labels[{name!r}]", value, "must be a str")
        checked[name] = value
    return checked

HISTOGRAMS: Final = (
    ("admission_wait", "admission_wait_seconds", "Time items waited for admission (slot, RPM, TPM)."),
    ("execution", "execution_seconds", "Time items spent in provider calls, all attempts."),
    ("total", "item_duration_seconds", "Time from an item's start to its result."),
)

FAMILIES: Final = (
    # (family, kind, help, label of its samples or "" for one value, path into to_dict())
    ("items", "counter", "Items that reached a result, by outcome.", "outcome", ("items",)),
    ("items_failed", "counter", "Failed items, by error category.", "category",
     ("items_failed_by_category",)),
    ("items_in_flight", "gauge", "Items started and not yet finished.", "", ("in_flight",)),
    ("attempts", "counter", "Provider attempts made by finished items.", "", ("attempts",)),
    ("attempt_failures", "counter", "Failed attempts, by error category.", "category",
     ("attempt_failures_by_category",)),
    ("retries", "counter", "Failed attempts that were retried, by error category.", "category",
     ("retries_by_category",)),
    ("tokens", "counter", "Tokens used by items executed in this run.", "kind", ("tokens",)),
    ("batches_started", "counter", "Batches started.", "", ("batches", "started")),
    ("batches_finished", "counter", "Batches finished, by termination.", "termination",
     ("batches", "finished_by_termination")),
)
"""The metric families besides the histograms, in exposition order: the one list that
:meth:`MetricsObserver.to_prometheus` and the ``PrometheusCollector`` both expose, so
the two never disagree on a name, a kind or a label. A counter's exposed name adds
``_total``."""


def family_value(data: Mapping[str, object], path: tuple[str, ...]) -> Mapping[str, int] | float:
    """The value at ``path`` in a :meth:`MetricsObserver.to_dict` snapshot: counts by label, or one number."""
    value: object = data
    for step in path:
        value = cast("Mapping[str, object]", value)[step]
    return cast("Mapping[str, int] | float", value)


@final
class _Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # first bound >= value: le semantics
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        running, rows = 0, []
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            rows.append((_number(bound), running))
        return rows


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    return str(value) if isinstance(value, int) else repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _bump(counter: dict[str, int], key: str, by: int = 1) -> None:
    counter[key] = counter.get(key, 0) + by


@final
class MetricsObserver:
    """Counters and latency histograms from lifecycle events; export with
    :meth:`to_dict` (JSON-ready) or :meth:`to_prometheus` (text exposition 0.0.4).

    Items count by outcome (``succeeded``, ``failed``, ``replayed``). A retry
    is a failed attempt that was followed by another attempt of the same item,
    counted under the failure's category. Tokens and latencies cover items
    executed in this run (replays cost nothing now). ``labels`` (for example
    ``{"model": "gpt-4o-mini", "scope": "openai"}``) are added to every sample
    of :meth:`to_prometheus`, so observers of several batches can be exposed
    side by side. Read it on the event loop, or accept a snapshot that may be
    one event behind (:class:`PrometheusCollector` reads it from its scrape thread).
    """

    def __init__(self, *, buckets: Iterable[float] = DEFAULT_LATENCY_BUCKETS,
                 prefix: str = "trio_batch_llm", labels: Mapping[str, str] | None = None) -> None:
        bounds = tuple(sorted(float(b) for b in buckets))
        if not bounds or not all(0 < b < math.inf for b in bounds) or len(set(bounds)) != len(bounds):
            raise ConfigurationError("buckets", bounds, "must be distinct finite numbers > 0")
        self.prefix = prefix
        self.labels = check_labels(labels)
        self.bounds = bounds
        self.items = {"succeeded": 0, "failed": 0, "replayed": 0}
        self.failed_by_category: dict[str, int] = {}
        self.attempts = 0
        self.attempt_failures: dict[str, int] = {}
        self.retries: dict[str, int] = {}
        self.tokens = {"input": 0, "output": 0, "total": 0}
        self.batches_started = 0
        self.batches_finished: dict[str, int] = {}
        self.histograms = {key: _Histogram(bounds) for key, _, _ in HISTOGRAMS}
        self._running: dict[str, list[tuple[int, str]]] = {}  # item id -> its failed attempts so far

    @property
    def in_flight(self) -> int:
        return len(self._running)

    @property
    def retries_total(self) -> int:
        return sum(self.retries.values())

    def on_event(self, event: LifecycleEvent) -> None:
        if isinstance(event, ItemStarted):
            self._running.setdefault(event.item_id, [])
        elif isinstance(event, AttemptFailed):
            _bump(self.attempt_failures, event.category.value)
            self._running.setdefault(event.item_id, []).append((event.attempt, event.category.value))
        elif isinstance(event, ItemCompleted | ItemFailed):
            self._finished(event.result)
        elif isinstance(event, ItemReplayed):
            self.items["replayed"] += 1
        elif isinstance(event, BatchStarted):
            self.batches_started += 1
        elif isinstance(event, BatchFinished):
            _bump(self.batches_finished, event.termination.kind)

    __call__ = on_event

    def _finished(self, result: WorkItemResult[Any]) -> None:
        failures = self._running.pop(result.item_id, None)
        if result.success:
            self.items["succeeded"] += 1
        else:
            self.items["failed"] += 1
            _bump(self.failed_by_category, (result.error_category or ErrorCategory.UNKNOWN).value)
        self.attempts += result.attempts
        usage = result.token_usage
        self.tokens["input"] += usage.get("input_tokens", 0)
        self.tokens["output"] += usage.get("output_tokens", 0)
        self.tokens["total"] += usage.get("total_tokens", 0)
        if failures is None:
            return  # never started (stopped before it ran): no latency to record
        if failures and not result.success and failures[-1][0] >= result.attempts:
            failures = failures[:-1]  # the final failure was not retried
        for _, category in failures:
            _bump(self.retries, category)
        timing = result.timing
        for key, histogram in self.histograms.items():
            histogram.observe(getattr(timing, key))

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain JSON types; histogram buckets are cumulative, keyed by ``le``."""
        return {
            "labels": dict(self.labels),
            "items": dict(self.items),
            "items_failed_by_category": dict(sorted(self.failed_by_category.items())),
            "in_flight": self.in_flight,
            "attempts": self.attempts,
            "attempt_failures_by_category": dict(sorted(self.attempt_failures.items())),
            "retries": self.retries_total,
            "retries_by_category": dict(sorted(self.retries.items())),
            "tokens": dict(self.tokens),
            "batches": {"started": self.batches_started,
                        "finished_by_termination": dict(sorted(self.batches_finished.items()))},
            "latency_seconds": {
                key: {"buckets": dict(h.cumulative()), "sum": h.sum, "count": h.count}
                for key, h in self.histograms.items()
            },
        }

    def to_prometheus(self) -> str:
        """The Prometheus text exposition format (version 0.0.4), ending in a newline."""
        p = self.prefix
        lines: list[str] = []
        own = "".join(f'{name}="{_escape(value)}",' for name, value in self.labels.items())

        def braces(extra: str = "") -> str:
            inner = (own + extra).rstrip(",")
            return f"{{{inner}}}" if inner else ""

        def family(name: str, kind: str, help_text: str, samples: Iterable[tuple[str, str, float]]) -> None:
            lines.append(f"# HELP {p}_{name} {help_text}")
            lines.append(f"# TYPE {p}_{name} {kind}")
            for suffix, labels, value in samples:
                lines.append(f"{p}_{name}{suffix}{labels} {_number(value)}")

        def labelled(label: str, counts: Mapping[str, int]) -> list[tuple[str, str, float]]:
            return [("", braces(f'{label}="{_escape(key)}"'), value) for key, value in sorted(counts.items())]

        def single(value: float) -> list[tuple[str, str, float]]:
            return [("", braces(), value)]

        samples: list[tuple[str, str, float]]
        data = self.to_dict()
        for name, kind, help_text, label, path in FAMILIES:
            value = family_value(data, path)
            exposed = f"{name}_total" if kind == "counter" else name
            samples = labelled(label, value) if isinstance(value, Mapping) else single(value)
            family(exposed, kind, help_text, samples)
        for key, name, help_text in HISTOGRAMS:
            histogram = self.histograms[key]
            samples = [
                ("_bucket", braces(f'le="{le}"'), count) for le, count in histogram.cumulative()
            ]
            samples += [("_sum", braces(), histogram.sum), ("_count", braces(), histogram.count)]
            family(name, "histogram", help_text, samples)
        return "\n".join(lines) + "\n"
