"""The fast span encoder produces exactly what the SDK's encoder produces."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import (
    encode_spans as sdk_encode,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceState

from otel_rl.outputs.otel.span_encoder import encode_request
from otel_rl.outputs.otel.spans import span_context


def _spans():
    resource = Resource.create({"service.name": "enc", "rl.rank": 3, "weight": 0.5})
    other = Resource.create({"service.name": "other"})
    scope = InstrumentationScope("otel_rl", "1.2", "https://schema")
    parent = span_context(7, 11)
    remote = span_context(7, 12, remote=True)
    spans = []
    for i, (name, attrs) in enumerate(
        [
            ("Learning", {"rl.phase": "learning", "rl.iteration": 5, "rl.env_steps": 2**40, "neg": -3}),
            ("Ünïcode ✓", {"flag": True, "ratio": 0.25, "list": ["a", "b"], "ints": [1, 2], "empty": ""}),
            ("rl.run", {}),
        ]
    ):
        spans.append(
            ReadableSpan(
                name,
                context=span_context(7, 100 + i),
                parent=(parent, remote, None)[i],
                resource=(resource, resource, other)[i],
                attributes=attrs,
                events=(Event("checkpoint", {"path": "x.pt", "n": 2}, 123),) if i == 1 else (),
                links=(Link(span_context(9, 10, remote=True), {"why": "flow"}),) if i == 0 else (),
                kind=(SpanKind.INTERNAL, SpanKind.CLIENT, SpanKind.SERVER)[i],
                status=(Status(StatusCode.UNSET), Status(StatusCode.ERROR, "boom"), Status(StatusCode.OK))[i],
                start_time=1_700_000_000_000_000_000 + i,
                end_time=1_700_000_000_000_500_000 + i,
                instrumentation_scope=scope,
            )
        )
    return spans


def test_fast_encoder_matches_sdk_encoder():
    spans = _spans()
    ours = ExportTraceServiceRequest.FromString(encode_request(spans))
    assert ours == sdk_encode(spans)


def test_trace_state_is_encoded():
    from opentelemetry import trace

    context = trace.SpanContext(7, 1, False, trace.TraceFlags(1), TraceState([("vendor", "x")]))
    span = ReadableSpan("s", context=context, resource=Resource.create({}), start_time=1, end_time=2)
    assert ExportTraceServiceRequest.FromString(encode_request([span])) == sdk_encode([span])


def test_empty_batch():
    assert encode_request([]) == b""
