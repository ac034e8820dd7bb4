"""Building span, metric and log exporters from the standard OTEL_* environment.

The SDK only reads ``OTEL_EXPORTER_OTLP_PROTOCOL`` in its auto-configuration,
which otel-rl does not use, so the protocol, endpoint, headers, timeout and
compression are resolved here (per-signal variable first, then the generic
one) and passed to the exporters explicitly.

With no exporter variable and no endpoint set, no network exporter is built:
the local outputs are the embedded default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from otel_rl.base import compat
from otel_rl.base import environment_variables as env

SIGNALS = ("traces", "metrics", "logs")
PROTOCOLS = ("grpc", "http/protobuf")
_EXPORTER_VARIABLE = {
    "traces": env.OTEL_TRACES_EXPORTER,
    "metrics": env.OTEL_METRICS_EXPORTER,
    "logs": env.OTEL_LOGS_EXPORTER,
}
_EXPORTER_KINDS = ("otlp", "console", "none")


@dataclass(frozen=True, slots=True)
class OtlpSettings:
    """Resolved OTLP settings of one signal."""

    signal: str
    protocol: str
    endpoint: str
    headers: dict[str, str]
    timeout_s: float
    compression: str


def exporter_kinds(signal: str) -> tuple[str, ...]:
    """Exporters requested for a signal: a subset of ``otlp`` and ``console``.

    ``OTEL_<SIGNAL>_EXPORTER`` wins; without it, ``otlp`` is chosen only when an
    OTLP endpoint variable is set for the signal.
    """
    name = _EXPORTER_VARIABLE[signal]
    raw = os.environ.get(name, "").strip()
    if raw:
        kinds = tuple(k.strip().lower() for k in raw.split(",") if k.strip())
        unknown = [k for k in kinds if k not in _EXPORTER_KINDS]
        if unknown:
            env.warn_invalid(name, raw, f"a comma-separated list of {', '.join(_EXPORTER_KINDS)}")
            kinds = tuple(k for k in kinds if k in _EXPORTER_KINDS)
        return tuple(k for k in dict.fromkeys(kinds) if k != "none")
    endpoint_set = bool(
        os.environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT, "").strip()
        or os.environ.get(env.signal_variable(env.OTEL_EXPORTER_OTLP_ENDPOINT, signal), "").strip()
    )
    return ("otlp",) if endpoint_set else ()


def _signal_or_generic(base: str, signal: str) -> tuple[str, str] | None:
    for name in (env.signal_variable(base, signal), base):
        raw = os.environ.get(name, "").strip()
        if raw:
            return name, raw
    return None


def resolve(signal: str) -> OtlpSettings:
    """Resolve the OTLP settings of ``signal`` from the environment."""
    protocol = "grpc"
    found = _signal_or_generic(env.OTEL_EXPORTER_OTLP_PROTOCOL, signal)
    if found:
        name, raw = found
        if raw in PROTOCOLS:
            protocol = raw
        else:
            env.warn_invalid(name, raw, " or ".join(PROTOCOLS))

    per_signal = os.environ.get(env.signal_variable(env.OTEL_EXPORTER_OTLP_ENDPOINT, signal), "").strip()
    generic = os.environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT, "").strip()
    if protocol == "grpc":
        endpoint = per_signal or generic or "http://localhost:4317"
    elif per_signal:
        endpoint = per_signal  # per-signal variables are used verbatim
    else:
        endpoint = (generic or "http://localhost:4318").rstrip("/") + f"/v1/{signal}"

    headers: dict[str, str] = {}
    found = _signal_or_generic(env.OTEL_EXPORTER_OTLP_HEADERS, signal)
    if found:
        try:
            headers = env.parse_key_values(found[1])
        except ValueError:
            env.warn_invalid(found[0], "<redacted>", "comma-separated key=value pairs")

    timeout_s = 10.0
    found = _signal_or_generic(env.OTEL_EXPORTER_OTLP_TIMEOUT, signal)
    if found:
        try:
            timeout_s = env.parse_positive_float(found[1])
        except ValueError:
            env.warn_invalid(found[0], found[1], "a positive number of seconds")

    compression = "none"
    found = _signal_or_generic(env.OTEL_EXPORTER_OTLP_COMPRESSION, signal)
    if found:
        if found[1].lower() in ("gzip", "deflate", "none"):
            compression = found[1].lower()
        else:
            env.warn_invalid(found[0], found[1], "gzip, deflate or none")
    return OtlpSettings(signal, protocol, endpoint, headers, timeout_s, compression)


def _grpc_compression(name: str):
    from grpc import Compression

    return {"gzip": Compression.Gzip, "deflate": Compression.Deflate}.get(name, Compression.NoCompression)


def _http_compression(name: str):
    from opentelemetry.exporter.otlp.proto.http import Compression

    return {"gzip": Compression.Gzip, "deflate": Compression.Deflate}.get(name, Compression.NoCompression)


def _otlp_exporter(settings: OtlpSettings):
    """Construct the SDK's OTLP exporter of a signal with explicit settings."""
    grpc = settings.protocol == "grpc"
    if settings.signal == "traces":
        from otel_rl.outputs.otel.span_encoder import GrpcSpanExporter, HttpSpanExporter

        cls = GrpcSpanExporter if grpc else HttpSpanExporter
    elif settings.signal == "metrics":
        if grpc:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as cls
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as cls
    else:
        cls = compat.otlp_log_exporter(grpc)
    compression = _grpc_compression(settings.compression) if grpc else _http_compression(settings.compression)
    return cls(
        endpoint=settings.endpoint,
        headers=settings.headers or None,
        timeout=settings.timeout_s,
        compression=compression,
    )


def _console_exporter(signal: str):
    if signal == "traces":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if signal == "metrics":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter()
    return compat.otel_logs().ConsoleLogRecordExporter()


def build_exporters(signal: str) -> list:
    """Every exporter the environment asks for on ``signal`` (maybe none)."""
    exporters = []
    for kind in exporter_kinds(signal):
        exporters.append(_otlp_exporter(resolve(signal)) if kind == "otlp" else _console_exporter(signal))
    return exporters
