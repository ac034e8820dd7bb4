"""The aggregates as OpenTelemetry metrics, joined to every metric export.

The SDK has no hook for externally produced metrics, so
:class:`MergingMetricExporter` adds the data points of
:class:`otel_rl.outputs.aggregates.Aggregates` at the exporter boundary.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import Exemplar
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
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_rl.base import compat
from otel_rl.formats import schema
from otel_rl.outputs.aggregates import Aggregates, HistogramPoint, Snapshot


def collect(snapshot: Snapshot, trace_id: int) -> list[Metric]:
    """Data points of every aggregate of ``snapshot``; exemplars point at spans of ``trace_id``."""
    metrics: list[Metric] = []
    start, now, base = snapshot.start_ns, snapshot.now_ns, snapshot.base
    for name, series, bounds, unit, description in (
        (schema.METRIC_PHASE_DURATION, snapshot.phases, snapshot.bounds, "ms", "Wall time of one phase"),
        (schema.METRIC_ITERATION_DURATION, snapshot.iterations, snapshot.bounds, "ms", "Wall time of one iteration"),
        (schema.METRIC_DISTRIBUTION, snapshot.distributions, schema.DISTRIBUTION_BOUNDS, "", "Values passed to distribution(), by key"),
    ):
        if series:
            points = [_histogram_point(point, start, now, bounds, trace_id) for point in series]
            metrics.append(Metric(name, description, unit, Histogram(points, AggregationTemporality.CUMULATIVE)))
    for key, (value, time_ns) in snapshot.gauges.items():
        spec = schema.metric_spec(key)
        point = NumberDataPoint({**base, "rl.key": key}, start, time_ns, value)
        metrics.append(Metric(schema.otel_gauge_name(key), spec.description, spec.unit, Gauge([point])))
    if snapshot.run_active is not None:
        point = NumberDataPoint(dict(base), start, now, snapshot.run_active)
        metrics.append(Metric(schema.METRIC_RUN_ACTIVE, "1 while the run is open, 0 once it ended", "", Gauge([point])))
    if snapshot.run_info is not None:
        point = NumberDataPoint({**base, **snapshot.run_info}, start, now, 1)
        metrics.append(Metric(schema.METRIC_RUN_INFO, "The run's commit and configuration as labels", "", Gauge([point])))
    if snapshot.bottleneck is not None:
        point = NumberDataPoint({**base, **snapshot.bottleneck}, start, now, 1)
        metrics.append(Metric(schema.METRIC_BOTTLENECK, "1 for the live verdict's side and phase (its labels)", "", Gauge([point])))
    for name, values, attribute, unit, description in (
        (schema.METRIC_ENV_STEPS, snapshot.env_steps, schema.ATTR_TIMELINE, "{step}", "Environment steps taken"),
        (schema.METRIC_DROPPED, snapshot.dropped, schema.ATTR_QUEUE, "{record}", "Telemetry records dropped or sampled out"),
        (schema.METRIC_EVENTS, snapshot.events, schema.ATTR_EVENT, "{event}", "Events recorded, by name"),
    ):
        if values:
            points = [NumberDataPoint({**base, attribute: k}, start, now, v) for k, v in values.items()]
            metrics.append(Metric(name, description, unit, Sum(points, AggregationTemporality.CUMULATIVE, True)))
    return metrics


def _histogram_point(point: HistogramPoint, start_ns: int, now_ns: int, bounds: tuple[float, ...], trace_id: int) -> HistogramDataPoint:
    return HistogramDataPoint(
        attributes=point.attributes,
        start_time_unix_nano=start_ns,
        time_unix_nano=now_ns,
        count=point.count,
        sum=point.total,
        bucket_counts=point.counts,
        explicit_bounds=list(bounds),
        min=point.minimum,
        max=point.maximum,
        exemplars=[Exemplar({}, value, time_ns, span_id, trace_id) for value, time_ns, span_id in point.exemplars],
    )


class MergingMetricExporter(MetricExporter):
    """Wraps a metric exporter and adds :class:`Aggregates` to every export."""

    def __init__(
        self, inner: MetricExporter, aggregates: Aggregates, trace_id: int, scope: InstrumentationScope, clock, resource=None
    ) -> None:
        """``trace_id``: the trace of the exemplars' spans; ``resource()``: the resource to export under (the SDK's when None)."""
        super().__init__(**compat.exporter_preferences(inner))  # the reader reads these from its exporter
        self._inner = inner
        self._aggregates = aggregates
        self._trace_id = trace_id
        self._scope = scope
        self._clock = clock
        self._resource = resource

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        ours = collect(self._aggregates.snapshot(self._clock.now_ns()), self._trace_id)
        if metrics_data.resource_metrics:
            first = metrics_data.resource_metrics[0]
            merged = ResourceMetrics(
                first.resource if self._resource is None else self._resource(),
                [*first.scope_metrics, ScopeMetrics(self._scope, ours, "")] if ours else first.scope_metrics,
                first.schema_url,
            )
            metrics_data = MetricsData([merged, *metrics_data.resource_metrics[1:]])
        return self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)
