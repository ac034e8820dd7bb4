"""Protobuf wire-format primitives: the two hand-encoded hot paths (OTLP spans, Perfetto slices), and the framing of a
Perfetto trace (a ``Trace`` is its packets, field 1, end to end), walked by every reader of trace bytes.

Both encoders are checked against the official protobuf classes in the tests.
"""

from __future__ import annotations

from collections.abc import Iterator

TRACE_PACKET = 0x0A
"""The tag of ``Trace.packet`` (field 1, length-delimited): what every packet of a trace file starts with."""

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


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it.

    Raises:
        IndexError: ``data`` ends inside it.
        ValueError: it is longer than 64 bits (not protobuf).
    """
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 64 bits")


def length_delimited(data: bytes, pos: int = 0) -> Iterator[tuple[int, int, int, int]]:
    """``(tag, start, body, end)`` of each length-delimited field of ``data`` from ``pos``, none of its bytes copied.

    It stops before a field that ``data`` cuts short, and at one that is not length-delimited (a ``Trace`` has only
    its packets): the caller knows where from the last ``end`` it was given.
    """
    size = len(data)
    while pos < size:
        start = pos
        try:
            tag, pos = read_varint(data, pos)
            if tag & 7 != 2:
                return
            length, pos = read_varint(data, pos)
        except (IndexError, ValueError):
            return
        end = pos + length
        if end > size:
            return
        yield tag, start, pos, end
        pos = end
