"""Trace and span ids: random, never zero (W3C trace context's invalid value)."""

from __future__ import annotations

import random


def new_span_id() -> int:
    return random.getrandbits(64) or 1


def new_trace_id() -> int:
    return random.getrandbits(128) or 1
