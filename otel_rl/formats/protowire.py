"""Protobuf wire-format primitives for the two hand-encoded hot paths (OTLP spans, Perfetto slices).

Both encoders are checked against the official protobuf classes in the tests.
"""

from __future__ import annotations

SMALL = [bytes([i]) for i in range(128)]
"""Varints of 0..127 are one byte: the common case for lengths and enums."""


def varint(value: int) -> bytes:
    """Base-128 varint; negative values as 64-bit two's complement (int64 fields)."""
    if 0 <= value < 128:
        return SMALL[value]
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
