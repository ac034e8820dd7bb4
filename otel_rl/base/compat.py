"""Every use of another library's private names, in one place.

Each reach below names what it touches. ``tests/unit/base/test_compat.py``
exercises every one against the installed libraries and pins them to
:data:`WRITTEN_FOR`: a library upgraded past those versions fails that test
first, before anything in a run depends on it. The libraries are imported
when a function is called, never with this module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

WRITTEN_FOR = {
    "opentelemetry-sdk": ("1.30", "1.45"),
    "opentelemetry-exporter-otlp-proto-grpc": ("1.30", "1.45"),
    "opentelemetry-exporter-otlp-proto-http": ("1.30", "1.45"),
    "torch": ("2.2", "2.15"),
    "stable-baselines3": ("2.0", "2.9"),
    "tensorboard": ("2.14", "2.21"),
}
"""Per distribution, the oldest and newest ``major.minor`` every reach was checked against."""


@functools.cache
def otel_logs() -> Any:
    """The OpenTelemetry logs signal, which the Python SDK still keeps under ``_logs`` modules.

    Returns a namespace with ``LogRecord``, ``ReadWriteLogRecord``,
    ``LoggerProvider``, ``BatchLogRecordProcessor`` and
    ``ConsoleLogRecordExporter``.
    """
    import types

    from opentelemetry._logs import LogRecord
    from opentelemetry.sdk._logs import LoggerProvider, ReadWriteLogRecord
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogRecordExporter

    return types.SimpleNamespace(
        LogRecord=LogRecord,
        ReadWriteLogRecord=ReadWriteLogRecord,
        LoggerProvider=LoggerProvider,
        BatchLogRecordProcessor=BatchLogRecordProcessor,
        ConsoleLogRecordExporter=ConsoleLogRecordExporter,
    )


def otlp_log_exporter(grpc: bool) -> type:
    """The OTLP log exporter class (``_log_exporter`` modules) over gRPC or HTTP."""
    if grpc:
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter  # type: ignore[assignment]
    return OTLPLogExporter


def exporter_preferences(exporter: Any) -> dict[str, Any]:
    """A metric exporter's preferred temporality and aggregation (``_preferred_*``), for a wrapper to declare as its own."""
    return {"preferred_temporality": exporter._preferred_temporality, "preferred_aggregation": exporter._preferred_aggregation}


@functools.cache
def otlp_span_exporters(encode: Callable[[Sequence[Any]], bytes]) -> tuple[type, type]:
    """The SDK's OTLP span exporters (gRPC, HTTP) with each request's bytes made by ``encode(spans)``.

    Transport, retries and timeouts stay the SDK's. Reaches: the gRPC
    exporter's ``_translate_data`` hook; the HTTP exporter's ``_client`` and
    ``_shutdown`` (where a version keeps its client elsewhere, the SDK's own
    export runs).
    """
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.trace.export import SpanExportResult

    class GrpcSpanExporter(Grpc):
        def _translate_data(self, data: Sequence[Any]) -> ExportTraceServiceRequest:
            # Parsing is done by protobuf's C core: far cheaper than building objects in Python.
            return ExportTraceServiceRequest.FromString(encode(data))

    class HttpSpanExporter(Http):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            client = getattr(self, "_client", None)
            if client is None or getattr(self, "_shutdown", False):
                return super().export(spans)
            result = client.export(encode(spans))
            return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE

    return GrpcSpanExporter, HttpSpanExporter


def torch_profiler_running() -> bool:
    """A ``torch.profiler`` session is running in this process (``torch.autograd.profiler._is_profiler_enabled``)."""
    import torch

    return bool(torch.autograd.profiler._is_profiler_enabled)


def sb3_off_policy(model: Any) -> bool:
    """A Stable-Baselines3 model samples its actions itself (off-policy algorithms define ``_sample_action``)."""
    return hasattr(model, "_sample_action")


def sb3_total_steps(model: Any) -> int | None:
    """The steps a Stable-Baselines3 ``learn()`` call was asked for (``_total_timesteps``), when it says."""
    return getattr(model, "_total_timesteps", None)


@functools.cache
def fast_tensorboard_crc() -> bool:
    """TensorBoard's event writer checksums every record with a CRC32C written in Python (its TensorFlow stub's
    ``masked_crc32c``, in ``tensorboard.summary.writer.record_writer``): about 0.2 ms a kilobyte, most of the
    TensorBoard output's cost. Where ``google-crc32c`` (C) is installed, the writer takes its CRC instead (the same
    value); True when it does."""
    try:
        import google_crc32c
        from tensorboard.summary.writer import record_writer
    except ImportError:
        return False
    if getattr(google_crc32c, "implementation", "") != "c":
        return False

    def masked_crc32c(data: bytes) -> int:
        crc = google_crc32c.value(bytes(data))
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    record_writer.masked_crc32c = masked_crc32c
    return True
