"""PrometheusCollector: the metrics of many batches as one ``prometheus_client`` collector.

A service runs many batches, against several models and quota scopes, and
wants one ``/metrics`` page. The collector hands out one
:class:`MetricsObserver` per label set (``model``, ``scope``, any other
constant label) and, when Prometheus scrapes the registry, turns every one of
them into labelled metric families::

    collector = PrometheusCollector(registry=prometheus_client.REGISTRY)
    observer = collector.observer(model="gpt-4o-mini", scope="openai")
    await process_prompts(strategy, prompts, observers=[observer])
    # trio_batch_llm_items_failed_total{model="gpt-4o-mini",scope="openai",category="rate_limit"} 3

Families (the ``trio_batch_llm`` prefix is configurable): ``items_total``
(``outcome``), ``items_failed_total`` / ``attempt_failures_total`` /
``retries_total`` (``category``), ``tokens_total`` (``kind``),
``attempts_total``, ``items_in_flight`` (a gauge), ``batches_started_total``,
``batches_finished_total`` (``termination``) and the histograms
``admission_wait_seconds``, ``execution_seconds``, ``item_duration_seconds``;
every sample also carries the observer's labels. The same observer for the
same labels is returned every time, so its counters add up across batches,
as a Prometheus counter should.

``prometheus_client`` is imported when the collector is created (``pip
install "trio-batch-llm[prometheus]"``). A scrape runs in the exporter's
thread while the event loop updates the observers: it reads a snapshot that
may be one event behind, and never blocks the loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, cast, final

from ._extras import import_extra
from ._metrics import (
    DEFAULT_LATENCY_BUCKETS,
    FAMILIES,
    HISTOGRAMS,
    MetricsObserver,
    check_labels,
    family_value,
)

__all__ = ["PrometheusCollector"]

# A collector's counters sum every batch its process ran, not one run's.
_HELP: Final = {"tokens": "Tokens used by items executed in this process."}


@final
class PrometheusCollector:
    """A ``prometheus_client`` collector over one :class:`MetricsObserver` per label set.

    ``registry`` (for example ``prometheus_client.REGISTRY``) registers it at
    once; or call ``registry.register(collector)`` yourself. ``label_names``
    are the labels every :meth:`observer` call gives (default ``model`` and
    ``scope``; an empty string when a call leaves one out).
    """

    def __init__(self, *, registry: object = None, prefix: str = "trio_batch_llm",
                 buckets: Iterable[float] = DEFAULT_LATENCY_BUCKETS,
                 label_names: Iterable[str] = ("model", "scope")) -> None:
        self._core = import_extra("prometheus_client.core", user="PrometheusCollector",
                                  needs="prometheus_client", extra="prometheus")
        self.prefix = prefix
        self.label_names = tuple(check_labels(dict.fromkeys(label_names, "")))
        self._buckets = tuple(buckets)
        MetricsObserver(buckets=self._buckets)  # the bucket check, once, here
        self._observers: dict[tuple[str, ...], MetricsObserver] = {}
        self._lock = threading.Lock()  # observer() may race a scrape; the counters need no lock
        if registry is not None:
            cast("Any", registry).register(self)  # a prometheus_client CollectorRegistry

    def observer(self, **labels: str) -> MetricsObserver:
        """The observer for these label values (created on first use, then the same one)."""
        unknown = sorted(set(labels) - set(self.label_names))
        if unknown:
            raise TypeError(f"unknown label(s) {', '.join(unknown)}; this collector's labels are "
                            f"{', '.join(self.label_names)}")
        values = check_labels({name: labels.get(name, "") for name in self.label_names})
        key = tuple(values.values())
        with self._lock:
            found = self._observers.get(key)
            if found is None:
                found = self._observers[key] = MetricsObserver(buckets=self._buckets, prefix=self.prefix,
                                                               labels=values)
            return found

    def describe(self) -> list[Any]:
        """The families without samples, so a registry can check their names at registration."""
        return list(self._families([]))

    def collect(self) -> Iterator[Any]:
        with self._lock:
            observers = list(self._observers.values())
        yield from self._families(observers)

    def _families(self, observers: list[MetricsObserver]) -> Iterator[Any]:
        core, p, names = self._core, self.prefix, list(self.label_names)
        snapshots = [(list(o.labels.values()), o.to_dict()) for o in observers]
        for family, kind, help_text, label, path in FAMILIES:
            make = core.CounterMetricFamily if kind == "counter" else core.GaugeMetricFamily
            labels = [*names, label] if label else names
            metric = make(f"{p}_{family}", _HELP.get(family, help_text), labels=labels)
            for values, data in snapshots:
                value = family_value(data, path)
                if isinstance(value, Mapping):
                    for name, count in value.items():
                        metric.add_metric([*values, name], count)
                else:
                    metric.add_metric(values, value)
            yield metric
        for key, name, help_text in HISTOGRAMS:
            metric = core.HistogramMetricFamily(f"{p}_{name}", help_text, labels=names)
            for values, data in snapshots:
                histogram = data["latency_seconds"][key]
                metric.add_metric(values, buckets=list(histogram["buckets"].items()),
                                  sum_value=histogram["sum"])
            yield metric
