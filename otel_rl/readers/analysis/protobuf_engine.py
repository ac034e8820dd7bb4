"""Pure-Python reading of a Perfetto trace file with the ``perfetto`` package's protos.

Packets are parsed one at a time while the file is read, so memory holds the
extracted slices, not the file. Interned names and categories are tracked per
sequence, as trace processor does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import DecodeError
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackEvent

from otel_rl.formats.protowire import TRACE_PACKET, length_delimited, read_varint
from otel_rl.readers.analysis.trace_model import Slice, TraceModel

_BEGIN = TrackEvent.Type.TYPE_SLICE_BEGIN
_END = TrackEvent.Type.TYPE_SLICE_END
_COUNTER = TrackEvent.Type.TYPE_COUNTER
_CLEARED = TracePacket.SequenceFlags.SEQ_INCREMENTAL_STATE_CLEARED


def _cut_short(buffer: bytes, pos: int) -> bool:
    """Whether the field at ``pos`` is only cut short (the next chunk continues it), rather than no field at all."""
    try:
        tag, after = read_varint(buffer, pos)
        if tag & 7 != 2:
            return False
        read_varint(buffer, after)
    except IndexError:
        return True  # a varint the next chunk continues
    except ValueError:
        return False
    return True  # a length past the buffer's end


class UnreadableTrace(ValueError):
    """A file that is not a Perfetto trace, or one damaged inside (the message names it and the byte)."""


def iter_packets(path: Path, chunk_bytes: int = 1 << 20) -> Iterator[TracePacket]:
    """Every TracePacket of a trace file, read incrementally.

    Raises:
        UnreadableTrace: the file is not a Perfetto trace, or is damaged (naming the file and the offset).
        ValueError: the file ends in the middle of a packet.
    """
    read_before = 0  # bytes of the file before the buffer
    buffer = b""
    with open(path, "rb") as trace:
        while True:
            chunk = trace.read(chunk_bytes)
            buffer += chunk
            pos = 0
            for tag, start, body, end in length_delimited(buffer):
                if tag == TRACE_PACKET:
                    try:
                        packet = TracePacket.FromString(buffer[body:end])
                    except DecodeError:
                        raise UnreadableTrace(f"{path} is not a readable Perfetto trace (a damaged packet at byte {read_before + start})") from None
                    yield packet
                pos = end  # a field of another kind is passed over
            if pos < len(buffer) and not _cut_short(buffer, pos):  # bytes no field can start: not a trace
                raise UnreadableTrace(f"{path} is not a readable Perfetto trace (byte {read_before + pos} starts no field)")
            read_before += pos
            buffer = buffer[pos:]
            if not chunk:
                if buffer:
                    raise ValueError(f"{path}: trace ends in the middle of a packet ({len(buffer)} bytes left)")
                return


def read(paths: list[Path]) -> TraceModel:
    """Slices, flows and counters of one or more trace files (one trace, several processes)."""
    model = TraceModel()
    process_by_uuid: dict[int, str] = {}
    process_by_pid: dict[int, str] = {}
    threads: dict[int, tuple[int, int]] = {}
    named: dict[int, tuple[int, str]] = {}
    counter_names: dict[int, str] = {}
    counter_process: dict[int, int] = {}

    def track_of(uuid: int) -> tuple[str, str]:
        if uuid in threads:
            pid, tid = threads[uuid]
            return f"{pid}/{tid}", process_by_pid.get(pid, str(pid))
        if uuid in named:
            parent, name = named[uuid]
            process = process_by_uuid.get(parent, "")
            return f"{process}/{name}", process
        return str(uuid), process_by_uuid.get(uuid, "")

    for path in paths:
        names: dict[int, dict[int, str]] = {}
        categories: dict[int, dict[int, str]] = {}
        open_slices: dict[int, list[tuple[int, str, str, tuple[int, ...], int | None]]] = {}
        for packet in iter_packets(path):
            seq = packet.trusted_packet_sequence_id
            if packet.sequence_flags & _CLEARED or packet.incremental_state_cleared:
                names[seq], categories[seq] = {}, {}
            if packet.HasField("interned_data"):
                for entry in packet.interned_data.event_names:
                    names.setdefault(seq, {})[entry.iid] = entry.name
                for entry in packet.interned_data.event_categories:
                    categories.setdefault(seq, {})[entry.iid] = entry.name
            if packet.HasField("track_descriptor"):
                d = packet.track_descriptor
                if d.HasField("thread"):
                    threads[d.uuid] = (d.thread.pid, d.thread.tid)
                elif d.HasField("process"):
                    process_by_uuid[d.uuid] = d.process.process_name
                    process_by_pid[d.process.pid] = d.process.process_name
                elif d.HasField("counter"):
                    counter_names[d.uuid] = d.name
                    counter_process[d.uuid] = d.parent_uuid
                else:
                    named[d.uuid] = (d.parent_uuid, d.name)
                continue
            if not packet.HasField("track_event"):
                continue
            event = packet.track_event
            uuid = event.track_uuid
            if event.type == _COUNTER:
                value = event.double_counter_value if event.HasField("double_counter_value") else event.counter_value
                name = counter_names.get(uuid, str(uuid))
                model.add_counter(process_by_uuid.get(counter_process.get(uuid)), name, packet.timestamp, value)
            elif event.type == _BEGIN:
                name = event.name or names.get(seq, {}).get(event.name_iid, "?")
                category = ",".join(categories.get(seq, {}).get(i, "?") for i in event.category_iids) or "?"
                flows = tuple(event.flow_ids) + tuple(event.terminating_flow_ids)
                steps = next((a.int_value for a in event.debug_annotations if a.name == "env_steps"), None)
                open_slices.setdefault(uuid, []).append((packet.timestamp, name, category, flows, steps))
            elif event.type == _END:
                stack = open_slices.get(uuid)
                if not stack:
                    continue
                start, name, category, flows, steps = stack.pop()
                key, process = track_of(uuid)
                model.slices.append(Slice(category, name, start, packet.timestamp, key, process, flows, env_steps=steps))
    model.align_clocks()
    model.link_parents()
    return model
