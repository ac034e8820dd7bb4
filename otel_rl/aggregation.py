"""Metric aggregates kept by otel-rl itself and merged into each metric export.

One ``Histogram.record`` through the SDK costs about 10 us of CPU under the
GIL; at thousands of phases per second that would steal the training loop's
time. The pipeline thread instead bins each phase into explicit buckets (a
bisect and two additions) and the aggregates leave as ready-made
OpenTelemetry data points when the SDK's periodic reader exports: the SDK has
no hook for externally produced metrics, so :class:`MergingMetricExporter`
adds them at the exporter boundary. All points are cumulative.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics import Exemplar
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_rl import schema
from otel_rl.recorder import warn_once

MAX_GAUGE_KEYS = 2000
"""Distinct scalar keys exported as gauges; more are dropped with one warning."""


@dataclass(slots=True)
class _Bins:
    counts: list[int]
    total: float = 0.0
    count: int = 0
    minimum: float = float("inf")
    maximum: float = float("-inf")
    exemplars: dict[int, Exemplar] = field(default_factory=dict)


class Aggregates:
    """Cumulative histograms, gauges and counters, updated on the pipeline thread.

    Args:
        start_time_ns: start of every cumulative series (telemetry start).
        base_attributes: attributes added to every data point (rank, world size).
        bounds_ms: explicit histogram bucket bounds in milliseconds.
    """

    def __init__(
        self,
        start_time_ns: int,
        base_attributes: Mapping[str, Any],
        bounds_ms: tuple[float, ...] = schema.PHASE_BUCKETS_MS,
    ) -> None:
        self._start_ns = start_time_ns
        self._base = dict(base_attributes)
        self._bounds = bounds_ms
        self._lock = threading.Lock()
        self._histograms: dict[str, dict[tuple, _Bins]] = {
            schema.METRIC_PHASE_DURATION: {},
            schema.METRIC_ITERATION_DURATION: {},
        }
        self._gauges: dict[str, tuple[float, int]] = {}
        self._env_steps: dict[str, int] = {}
        self._dropped: dict[str, int] = {}

    def record_duration(
        self,
        metric: str,
        attributes: tuple[tuple[str, Any], ...],
        value_ms: float,
        time_ns: int,
        trace_id: int | None = None,
        span_id: int | None = None,
    ) -> None:
        """Bin one duration; with a span id, keep it as the bucket's exemplar."""
        series = self._histograms[metric]
        bucket = bisect_left(self._bounds, value_ms)
        with self._lock:
            bins = series.get(attributes)
            if bins is None:
                bins = series[attributes] = _Bins([0] * (len(self._bounds) + 1))
            bins.counts[bucket] += 1
            bins.total += value_ms
            bins.count += 1
            if value_ms < bins.minimum:
                bins.minimum = value_ms
            if value_ms > bins.maximum:
                bins.maximum = value_ms
            if span_id is not None and trace_id is not None:
                bins.exemplars[bucket] = Exemplar({}, value_ms, time_ns, span_id, trace_id)

    def set_gauges(self, values: Mapping[str, float | int | None], time_ns: int) -> None:
        """Latest value per scalar key; None (non-finite) leaves the last value."""
        with self._lock:
            for key, value in values.items():
                if value is None:
                    continue
                if key not in self._gauges and len(self._gauges) >= MAX_GAUGE_KEYS:
                    warn_once("gauge-keys", "otel-rl: more than %d scalar keys; extra keys are not exported as gauges", MAX_GAUGE_KEYS)
                    continue
                self._gauges[key] = (value, time_ns)

    def set_env_steps(self, timeline: str, env_steps: int) -> None:
        with self._lock:
            if env_steps > self._env_steps.get(timeline, -1):
                self._env_steps[timeline] = env_steps

    def set_dropped(self, queue: str, count: int) -> None:
        with self._lock:
            self._dropped[queue] = count

    def histogram_snapshot(self, metric: str) -> dict[tuple, tuple[list[int], float, int]]:
        """Bucket counts, sum and count per attribute set (for tests and readers)."""
        with self._lock:
            return {k: (list(b.counts), b.total, b.count) for k, b in self._histograms[metric].items()}

    def collect(self, now_ns: int) -> list[Metric]:
        """Data points of every aggregate; exemplars are handed out once."""
        metrics: list[Metric] = []
        with self._lock:
            for name, series in self._histograms.items():
                if not series:
                    continue
                points = []
                for attrs, bins in series.items():
                    points.append(
                        HistogramDataPoint(
                            attributes={**self._base, **dict(attrs)},
                            start_time_unix_nano=self._start_ns,
                            time_unix_nano=now_ns,
                            count=bins.count,
                            sum=bins.total,
                            bucket_counts=list(bins.counts),
                            explicit_bounds=list(self._bounds),
                            min=bins.minimum,
                            max=bins.maximum,
                            exemplars=list(bins.exemplars.values()),
                        )
                    )
                    bins.exemplars = {}
                description = (
                    "Wall time of one phase" if name == schema.METRIC_PHASE_DURATION else "Wall time of one iteration"
                )
                metrics.append(
                    Metric(name, description, "ms", Histogram(points, AggregationTemporality.CUMULATIVE))
                )
            for key, (value, time_ns) in self._gauges.items():
                spec = schema.metric_spec(key)
                point = NumberDataPoint({**self._base, "rl.key": key}, self._start_ns, time_ns, value)
                metrics.append(Metric(schema.otel_gauge_name(key), spec.description, spec.unit, Gauge([point])))
            if self._env_steps:
                points = [
                    NumberDataPoint({**self._base, schema.ATTR_TIMELINE: t}, self._start_ns, now_ns, v)
                    for t, v in self._env_steps.items()
                ]
                metrics.append(
                    Metric(
                        schema.METRIC_ENV_STEPS,
                        "Environment steps taken",
                        "{step}",
                        Sum(points, AggregationTemporality.CUMULATIVE, True),
                    )
                )
            points = [
                NumberDataPoint({**self._base, schema.ATTR_QUEUE: q}, self._start_ns, now_ns, v)
                for q, v in self._dropped.items()
            ]
            if points:
                metrics.append(
                    Metric(
                        schema.METRIC_DROPPED,
                        "Telemetry records dropped or sampled out, by queue",
                        "{record}",
                        Sum(points, AggregationTemporality.CUMULATIVE, True),
                    )
                )
        return metrics


class MergingMetricExporter(MetricExporter):
    """Wraps a metric exporter and adds :class:`Aggregates` to every export."""

    def __init__(self, inner: MetricExporter, aggregates: Aggregates, scope: InstrumentationScope, clock) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,  # the reader reads these from its exporter
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._aggregates = aggregates
        self._scope = scope
        self._clock = clock

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        ours = self._aggregates.collect(self._clock.now_ns())
        if ours and metrics_data.resource_metrics:
            first = metrics_data.resource_metrics[0]
            merged = ResourceMetrics(
                first.resource,
                [*first.scope_metrics, ScopeMetrics(self._scope, ours, "")],
                first.schema_url,
            )
            metrics_data = MetricsData([merged, *metrics_data.resource_metrics[1:]])
        return self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)
