"""One trace file from the parts of several machines, every part on rank 0's clock (for ui.perfetto.dev).

Serialized traces concatenate; what a merge adds is the clocks. Each part
holds the processes of one machine (or one process), so one shift per file
puts it on rank 0's clock: the median of the clock offsets measured on its
processes (:data:`otel_rl.formats.trace.CLOCK_OFFSET_KEY`), as
:meth:`~otel_rl.readers.analysis.trace_model.TraceModel.align_clocks` takes
them per machine; a part without a measurement keeps its wall-clock times.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from otel_rl.formats import trace
from otel_rl.formats.protowire import varint
from otel_rl.readers.analysis.protobuf_engine import iter_packets


def measured_offset_ms(path: Path) -> float | None:
    """The median clock offset measured on the processes of one trace file, None when it has none."""
    offset_tracks: set[int] = set()
    values: list[float] = []
    for packet in iter_packets(path):
        if packet.HasField("track_descriptor"):
            if packet.track_descriptor.name == trace.CLOCK_OFFSET_KEY:
                offset_tracks.add(packet.track_descriptor.uuid)
        elif packet.HasField("track_event") and packet.track_event.track_uuid in offset_tracks:
            event = packet.track_event
            values.append(event.double_counter_value if event.HasField("double_counter_value") else event.counter_value)
    return statistics.median(values) if values else None


def merge_parts(paths: list[Path], out: Path) -> dict[str, float]:
    """Write ``paths`` as one trace at ``out``, each moved onto rank 0's clock; returns the shift of each (ms)."""
    shifts = {str(path): measured_offset_ms(path) or 0.0 for path in paths}
    partial = out.with_name(out.name + ".partial")
    with open(partial, "wb") as merged:
        for path in paths:
            shift = round(shifts[str(path)] * 1e6)
            offset_tracks: set[int] = set()
            for packet in iter_packets(path):
                if shift and packet.timestamp:
                    packet.timestamp -= shift
                if packet.track_descriptor.name == trace.CLOCK_OFFSET_KEY:
                    offset_tracks.add(packet.track_descriptor.uuid)
                elif shift and packet.track_event.track_uuid in offset_tracks:  # what is left to align: nothing, read again
                    packet.track_event.double_counter_value -= shifts[str(path)]
                payload = packet.SerializeToString()
                merged.write(b"\x0a" + varint(len(payload)) + payload)
    partial.replace(out)
    return shifts
