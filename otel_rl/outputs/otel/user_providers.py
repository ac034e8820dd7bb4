"""SDK providers for the user's own spans and instruments, in a process whose outputs run in an agent.

``tel.tracer_provider`` and ``tel.meter_provider`` hand the user the SDK to
record spans and instruments of their own. When otel-rl's outputs run in an
agent process, the user's spans cannot go there (they are SDK objects made in
this process), so they get providers of this process: exporters built from
the same ``OTEL_*`` variables, the run's resource. Built on first use only:
a job that never asks pays nothing for them.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from otel_rl.base.deadline import Deadline
from otel_rl.base.loops import run_bounded
from otel_rl.outputs.otel import otlp


class UserProviders:
    """A tracer and a meter provider built from the environment on first use (None when it configures no exporter)."""

    def __init__(self, resource: Callable[[], Any]) -> None:
        self._resource = resource
        self._lock = threading.Lock()
        self._built: dict[str, Any] = {}

    def tracer_provider(self):
        return self._get("traces", self._tracer_provider)

    def meter_provider(self):
        return self._get("metrics", self._meter_provider)

    def _get(self, signal: str, build: Callable[[list], Any]):
        with self._lock:
            if signal not in self._built:
                exporters = otlp.build_exporters(signal)
                self._built[signal] = build(exporters) if exporters else None
            return self._built[signal]

    def _tracer_provider(self, exporters: list):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=self._resource(), shutdown_on_exit=False)
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        return provider

    def _meter_provider(self, exporters: list):
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers = [PeriodicExportingMetricReader(e) for e in exporters]
        return MeterProvider(resource=self._resource(), metric_readers=readers, shutdown_on_exit=False)

    def shutdown(self, deadline: Deadline) -> None:
        """Export what the user recorded and stop, within ``deadline`` (telemetry's close does it)."""
        with self._lock:
            built, self._built = self._built, {}
        for signal, provider in built.items():
            if provider is None:
                continue
            if signal == "metrics":
                run_bounded(lambda p=provider, ms=deadline.left() * 1000: p.shutdown(timeout_millis=ms), deadline, "user-metrics-shutdown")
            else:
                run_bounded(provider.shutdown, deadline, "user-traces-shutdown")
