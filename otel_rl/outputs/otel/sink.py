"""The OpenTelemetry sink: spans, metrics and log records behind the SDK's processors.

Built from the environment (:mod:`otel_rl.outputs.otel.otlp`). Each signal with at least
one exporter gets the SDK's batching machinery: ``BatchSpanProcessor``,
``PeriodicExportingMetricReader`` and ``BatchLogRecordProcessor``, each with
its own thread and bounded queue. A signal without exporters costs nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Status, StatusCode

from otel_rl.formats import lifecycle
from otel_rl.base import compat
from otel_rl.base import environment_variables as env
from otel_rl.base.clock import Clock
from otel_rl.base.deadline import Deadline
from otel_rl.base.loops import run_bounded
from otel_rl.core.batches import IterationBatch, PhaseBatch
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import CudaFallback, DeviceIntervalRecord, EventRecord, PhaseRecord, RunEnd, RunStart
from otel_rl.formats import schema
from otel_rl.outputs.aggregates import Aggregates
from otel_rl.outputs.otel import otlp
from otel_rl.outputs.otel.metrics import MergingMetricExporter
from otel_rl.outputs.otel.spans import SpanBuilder, span_context
from otel_rl.run import provenance

DEFAULT_METRIC_EXPORT_INTERVAL_MS = 10_000
"""Metric export interval when ``OTEL_METRIC_EXPORT_INTERVAL`` is unset (the SDK's 60 s is too coarse for training)."""

MAX_RUN_SPAN_EVENTS = 128
MAX_CORRELATIONS = 4096
"""CPU span ids kept for linking the GPU spans of CUDA-timed phases."""


class OpenTelemetrySink(RecordSink):
    """Feeds assembled records to OpenTelemetry span, metric and log pipelines.

    Args:
        resource: the OpenTelemetry resource of this process.
        clock: the pipeline's clock (for metric timestamps).
        trace_id: trace of this process's run.
        aggregates: histograms and gauges merged into every metric export.
        pending: callable giving queue depths for the ``rl.telemetry.pending`` gauge.
        span_exporters / metric_exporters / log_exporters: override the
            exporters built from the environment (tests, custom backends).
    """

    def __init__(
        self,
        resource: Resource,
        clock: Clock,
        trace_id: int,
        aggregates: Aggregates,
        pending: Callable[[], Mapping[str, int]],
        span_exporters: list | None = None,
        metric_exporters: list | None = None,
        log_exporters: list | None = None,
        metric_export_interval_ms: float | None = None,
        parent_span_id: int | None = None,
    ) -> None:
        from otel_rl.version import __version__

        self._scope = InstrumentationScope("otel_rl", __version__)
        self._resource = resource
        self._clock = clock
        self.trace_id = trace_id
        self._builder = SpanBuilder(resource, self._scope, trace_id)
        self.cuda_fallback = self._builder.cuda_fallback
        self.aggregates = aggregates
        # A worker joined from a traceparent hangs its spans under that (remote) run span.
        self._remote_parent = span_context(trace_id, parent_span_id, remote=True) if parent_span_id else None
        self._run_context: trace_api.SpanContext | None = None
        self._run_parent: trace_api.SpanContext | None = None
        self._run_events: list[Event] = []
        self._run_attributes: dict[str, Any] = {}
        self._pending = pending
        self._cpu_spans: OrderedDict[int, int] = OrderedDict()

        span_exporters = otlp.build_exporters("traces") if span_exporters is None else span_exporters
        metric_exporters = otlp.build_exporters("metrics") if metric_exporters is None else metric_exporters
        log_exporters = otlp.build_exporters("logs") if log_exporters is None else log_exporters

        self.tracer_provider = self._tracer_provider(span_exporters)
        self._span_processors = list(self._processors)
        self.meter_provider = self._meter_provider(metric_exporters, metric_export_interval_ms)
        self.logger_provider, self._event_logger = self._logger_provider(log_exporters)

    @property
    def exports_spans(self) -> bool:
        """Whether spans go anywhere: the pipeline gives records span ids only then."""
        return bool(self._span_processors)

    # -- construction ---------------------------------------------------

    def _tracer_provider(self, exporters: list):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self._processors = [BatchSpanProcessor(e) for e in exporters]
        if not exporters:
            return None
        provider = TracerProvider(resource=self._resource)
        for processor in self._processors:
            provider.add_span_processor(processor)
        return provider

    def _meter_provider(self, exporters: list, interval_ms: float | None):
        if not exporters:
            return None
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        if interval_ms is None:
            interval_ms = env.read(
                env.OTEL_METRIC_EXPORT_INTERVAL,
                env.parse_positive_float,
                DEFAULT_METRIC_EXPORT_INTERVAL_MS,
                "a positive number of milliseconds",
            )
        readers = [
            PeriodicExportingMetricReader(
                MergingMetricExporter(e, self.aggregates, self.trace_id, self._scope, self._clock, lambda: self._resource),
                export_interval_millis=interval_ms,
            )
            for e in exporters
        ]
        provider = MeterProvider(resource=self._resource, metric_readers=readers)
        meter = provider.get_meter("otel_rl")

        def pending_callback(_options):
            return [Observation(v, {schema.ATTR_QUEUE: q}) for q, v in self._pending().items()]

        # Also guarantees every collection has at least one SDK metric, so the
        # reader always exports and our aggregates always ride along.
        meter.create_observable_gauge(
            "rl.telemetry.pending", [pending_callback], unit="{record}", description="Records waiting in otel-rl queues"
        )
        return provider

    def _logger_provider(self, exporters: list):
        if not exporters:
            return None, None
        logs = compat.otel_logs()

        provider = logs.LoggerProvider(resource=self._resource)
        for exporter in exporters:
            provider.add_log_record_processor(logs.BatchLogRecordProcessor(exporter))
        return provider, provider.get_logger("otel_rl")

    # -- records --------------------------------------------------------

    def on_cuda_fallback(self, fallback: CudaFallback) -> None:
        self.cuda_fallback[(fallback.timeline, fallback.name)] = fallback.reason

    def on_run_start(self, run: RunStart) -> None:
        self.aggregates.set_run_active(True)
        self._run_context = span_context(self.trace_id, run.span_id)
        self._run_parent = span_context(self.trace_id, run.parent_span_id, remote=True) if run.parent_span_id else None
        self._run_attributes = provenance.span_attributes(run.config, run.provenance)
        self.aggregates.set_run_info(provenance.info_labels(run.config, run.provenance))

    def on_run_end(self, run: RunEnd) -> None:
        self.aggregates.set_run_active(False)
        if self._run_context is None or not self._span_processors:
            return
        status = Status(StatusCode.ERROR, run.reason) if run.status in (lifecycle.FAILED, lifecycle.KILLED) else Status(StatusCode.OK)
        attributes: dict[str, Any] = {**self._run_attributes, schema.ATTR_STATUS: run.status}
        if run.reason:
            attributes["rl.run.reason"] = run.reason
        span = self._builder.span(
            schema.SPAN_RUN,
            self._run_context,
            self._run_parent,
            run.start_ns,
            run.end_ns,
            attributes,
            events=self._run_events,
            status=status,
        )
        self._end_spans([span])
        self._run_context = None

    def on_iterations(self, batch: IterationBatch) -> None:
        """The iterations the pipeline kept as spans (a span id), with their phases: only those records are built."""
        kept = np.flatnonzero(batch.span_ids).tolist() if self._span_processors else ()
        parent = self._run_context or self._remote_parent
        for iteration in batch.at(kept):
            self._end_spans(self._builder.iteration_spans(iteration, parent))
            self._remember_correlations(iteration.phases)

    def on_phases(self, batch: PhaseBatch) -> None:
        tops = batch.phases.span_ids[batch.phases.depths == 0]
        kept = np.flatnonzero(tops).tolist() if self._span_processors else ()
        for phase in batch.at(kept):
            self._end_spans(self._builder.phase_spans(phase, self._run_context or self._remote_parent))
            self._remember_correlations([phase])

    def _remember_correlations(self, phases: Sequence[PhaseRecord]) -> None:
        for top in phases:
            for phase in top.walk():
                if phase.correlation:
                    self._cpu_spans[phase.correlation] = phase.span_id
                    if len(self._cpu_spans) > MAX_CORRELATIONS:
                        self._cpu_spans.popitem(last=False)

    def on_device_interval(self, interval: DeviceIntervalRecord) -> None:
        """A GPU interval the pipeline kept as a span, linked to the CPU span of its phase when that was sent."""
        if not self._span_processors or not interval.span_id:
            return
        links = ()
        cpu_span = self._cpu_spans.pop(interval.correlation, None)
        if cpu_span:
            links = (trace_api.Link(span_context(self.trace_id, cpu_span), {"rl.link": "host phase"}),)
        context = span_context(self.trace_id, interval.span_id)
        attributes = {
            schema.ATTR_TIMELINE: interval.spec.timeline,
            schema.ATTR_PHASE: interval.spec.name,
            schema.ATTR_CLOCK: "gpu",
            "rl.gpu.device": interval.device,
            "rl.gpu.stream": interval.stream,
        }
        span = self._builder.span(
            interval.spec.title, context, self._run_context or self._remote_parent, interval.start_ns, interval.end_ns, attributes, links=links
        )
        self._end_spans([span])

    def _describe(self, attributes: dict[str, Any]) -> None:
        """The framework and environment an integration named (:data:`otel_rl.formats.schema.EVENT_FRAMEWORK`), on the resource from now on.

        An OpenTelemetry resource is fixed when its providers are built, at
        ``init()``, before any integration exists: the resource that spans,
        metrics and logs are exported under is widened here instead.
        """
        added = {key: attributes[name] for name, key in _DESCRIBED.items() if isinstance(attributes.get(name), str)}
        if added:
            self._resource = self._resource.merge(Resource(added))
            self._builder.resource = self._resource

    def on_event(self, event: EventRecord) -> None:
        if event.name == schema.EVENT_FRAMEWORK:
            self._describe(event.attributes)
        attributes = {k: _attribute_value(v) for k, v in event.attributes.items()}
        if len(self._run_events) < MAX_RUN_SPAN_EVENTS:
            self._run_events.append(Event(event.name, attributes, event.time_ns))
        if self._event_logger is not None:
            context = None
            parent = self._run_context or self._remote_parent
            if parent is not None:
                context = trace_api.set_span_in_context(trace_api.NonRecordingSpan(parent))
            logs = compat.otel_logs()
            record = logs.LogRecord(timestamp=event.time_ns, context=context, event_name=event.name, body=event.name, attributes=attributes)
            self._event_logger.emit(logs.ReadWriteLogRecord(record, self._resource, self._scope))

    def _end_spans(self, spans: list) -> None:
        for processor in self._span_processors:
            for span in spans:
                processor.on_end(span)

    # -- lifecycle ------------------------------------------------------

    def flush(self, deadline: Deadline) -> bool:
        """Flush every provider, all by ``deadline``."""
        ok = True
        for name, provider in self._providers():
            ok = run_bounded(lambda p=provider, ms=int(deadline.left() * 1000): p.force_flush(ms), deadline, f"{name}-flush") and ok
        return ok

    def shutdown(self, deadline: Deadline) -> None:
        """Shut every provider down, all by ``deadline``."""
        for name, provider in self._providers():
            if name == "metrics":
                fn = lambda p=provider, ms=deadline.left() * 1000: p.shutdown(timeout_millis=ms)  # noqa: E731
            else:
                fn = provider.shutdown
            run_bounded(fn, deadline, f"{name}-shutdown")

    def _providers(self):
        if self.tracer_provider is not None:
            yield "traces", self.tracer_provider
        if self.meter_provider is not None:
            yield "metrics", self.meter_provider
        if self.logger_provider is not None:
            yield "logs", self.logger_provider


_DESCRIBED = {"system": schema.ATTR_SYSTEM, "environment": schema.ATTR_ENVIRONMENT, "algorithm": schema.ATTR_ALGORITHM}
"""The attributes of a framework event, and the resource attributes they become."""


def _attribute_value(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    return str(value)
