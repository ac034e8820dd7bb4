"""Trace and span ids: random, never zero (W3C trace context's invalid value)."""

from __future__ import annotations

import random


def new_span_id() -> int:
    return random.getrandbits(64) or 1


def new_trace_id() -> int:
    return random.getrandbits(128) or 1


def parse_traceparent(value: str) -> tuple[int, int] | None:
    """(trace id, parent span id) of a W3C ``traceparent``; None if malformed."""
    parts = value.strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    return (trace_id, span_id) if trace_id and span_id else None
