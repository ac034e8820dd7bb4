"""OTLP span exporters with a fast encoder.

The SDK's span encoder builds a protobuf object per attribute through generic
Python code: 35-70 us per span here. At the default budget of 1,000 spans per
second that alone would take several percent of a core from a Python-bound
training loop. :func:`encode_request` writes the same
``ExportTraceServiceRequest`` straight in protobuf wire format, reusing the
encoded bytes of repeated attribute pairs (``rl.timeline=learner`` and the
like), for a few microseconds per span. The tests decode its output with
``opentelemetry-proto`` and compare it with the SDK encoder's, message for
message. Transport, retries and timeouts remain the SDK exporters'.

Field numbers are those of ``opentelemetry/proto/trace/v1/trace.proto`` and
``common/v1/common.proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from otel_rl.base import compat
from otel_rl.base.log import logger
from otel_rl.formats.protowire import SMALL as _SMALL
from otel_rl.formats.protowire import varint as _varint

_logger = logger(__name__)

_CACHE_LIMIT = 8192
_cache: dict[tuple, bytes] = {}
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_pack_double = struct.Struct("<d").pack

# Flags of a span or link: "has is_remote" (0x100), "is remote" (0x200).
_FLAGS_LOCAL = b"\x85\x01" + _pack_fixed32(0x100)  # field 16, wire type 5
_FLAGS_REMOTE = b"\x85\x01" + _pack_fixed32(0x300)
_LINK_FLAGS = {False: b"\x35" + _pack_fixed32(0x100), True: b"\x35" + _pack_fixed32(0x300)}  # field 6


_keys: dict[str, bytes] = {}


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    size = len(payload)
    return tag + (_SMALL[size] if size < 128 else _varint(size)) + payload


def _key(key: str) -> bytes:
    encoded = _keys.get(key)
    if encoded is None:
        encoded = _field(b"\x0a", key.encode("utf-8"))
        if len(_keys) < _CACHE_LIMIT:
            _keys[key] = encoded
    return encoded


def _any_value(value: Any) -> bytes:
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, str):
        return _field(b"\x0a", value.encode("utf-8"))
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, (list, tuple)):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    return _field(b"\x0a", str(value).encode("utf-8"))


def _key_value(key: str, value: Any) -> bytes:
    """An encoded KeyValue."""
    kind = type(value)
    if kind is int:  # the common case after cached strings: iterations, steps, ids
        if 0 <= value < 128:
            return _key(key) + b"\x12\x02\x18" + _SMALL[value]
        encoded = _varint(value)
        return _key(key) + b"\x12" + _SMALL[len(encoded) + 1] + b"\x18" + encoded
    return _key(key) + _field(b"\x12", _any_value(value))


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Repeated KeyValue fields under ``tag``; whole fields of string and bool pairs are cached."""
    if not attributes:
        return b""
    parts = []
    for key, value in attributes.items():
        kind = type(value)
        if kind is str or kind is bool:
            encoded = _cache.get((tag, key, value))
            if encoded is None:
                encoded = _field(tag, _key_value(key, value))
                if len(_cache) < _CACHE_LIMIT:
                    _cache[(tag, key, value)] = encoded
            parts.append(encoded)
        elif value is not None:
            parts.append(_field(tag, _key_value(key, value)))
    return b"".join(parts)


_KIND = {kind: b"\x30" + _varint(kind.value + 1) for kind in SpanKind}
_EMPTY_STATUS = b"\x7a\x00"  # field 15, an empty Status (what the SDK encoder sends for UNSET)
_names: dict[str, bytes] = {}


def _status(span: ReadableSpan) -> bytes:
    status = span.status
    code = status.status_code
    if code is StatusCode.UNSET and not status.description:
        return _EMPTY_STATUS
    payload = b""
    if status.description:
        payload += _field(b"\x12", status.description.encode("utf-8"))
    if code.value:
        payload += b"\x18" + _varint(code.value)
    return _field(b"\x7a", payload)


def encode_span(span: ReadableSpan) -> bytes:
    """One ``Span`` message."""
    context = span.context
    parent = span.parent
    name = span.name
    encoded_name = _names.get(name)
    if encoded_name is None:
        encoded_name = _field(b"\x2a", name.encode("utf-8"))
        if len(_names) < _CACHE_LIMIT:
            _names[name] = encoded_name
    parts = [
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big") + b"\x12\x08" + context.span_id.to_bytes(8, "big"),
    ]
    if context.trace_state:
        parts.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in context.trace_state.items()).encode()))
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    parts.append(encoded_name)
    parts.append(_KIND[span.kind])
    parts.append(b"\x39" + _pack_fixed64(span.start_time or 0) + b"\x41" + _pack_fixed64(span.end_time or 0))
    parts.append(_attributes(b"\x4a", span.attributes))
    for event in span.events:
        event_body = b"\x09" + _pack_fixed64(event.timestamp) + _field(b"\x12", event.name.encode("utf-8"))
        parts.append(_field(b"\x5a", event_body + _attributes(b"\x1a", event.attributes)))
    for link in span.links:
        link_body = (
            b"\x0a\x10"
            + link.context.trace_id.to_bytes(16, "big")
            + b"\x12\x08"
            + link.context.span_id.to_bytes(8, "big")
            + _attributes(b"\x22", link.attributes)
            + _LINK_FLAGS[bool(link.context.is_remote)]
        )
        parts.append(_field(b"\x6a", link_body))
    parts.append(_status(span))
    parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
    return b"".join(parts)


def encode_request(spans: Sequence[ReadableSpan]) -> bytes:
    """A serialized ``ExportTraceServiceRequest``, spans grouped by resource and scope."""
    groups: dict[int, tuple[Any, dict[Any, list[bytes]]]] = {}
    for span in spans:
        entry = groups.get(id(span.resource))
        if entry is None:
            entry = groups[id(span.resource)] = (span.resource, {})
        entry[1].setdefault(span.instrumentation_scope, []).append(_field(b"\x12", encode_span(span)))
    out = []
    for resource, scopes in groups.values():
        body = [_field(b"\x0a", _attributes(b"\x0a", resource.attributes))]
        for scope, encoded in scopes.items():
            scope_body = b""
            if scope is not None:
                scope_body = _field(b"\x0a", scope.name.encode("utf-8"))
                if scope.version:
                    scope_body += _field(b"\x12", scope.version.encode("utf-8"))
            scope_spans = _field(b"\x0a", scope_body) + b"".join(encoded)
            if scope is not None and scope.schema_url:
                scope_spans += _field(b"\x1a", scope.schema_url.encode("utf-8"))
            body.append(_field(b"\x12", scope_spans))
        if resource.schema_url:
            body.append(_field(b"\x1a", resource.schema_url.encode("utf-8")))
        out.append(_field(b"\x0a", b"".join(body)))
    return b"".join(out)


GrpcSpanExporter, HttpSpanExporter = compat.otlp_span_exporters(encode_request)
"""The SDK's OTLP span exporters, fed by :func:`encode_request`."""
