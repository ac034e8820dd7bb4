"""The Perfetto trace's packets: descriptors and interning with the ``perfetto`` package's protos, slices by hand.

:class:`TraceEncoder` encodes the records of one process as TracePackets of
one sequence. Track descriptors and the first packet of a sequence are built
with the ``perfetto`` package's protos; the slice packets of phases, thousands
per second, are encoded from a batch's columns in C
(``otel_rl.outputs.perfetto._slices.encode_rows``, with :func:`encode_rows`
its pure-Python twin: the same wire format, checked by decoding in the tests)
from bodies prepared once per track and phase. Timestamps are unix-epoch
nanoseconds in every process, so the trace files of several processes can be
concatenated into one trace.
"""

from __future__ import annotations

import functools
import hashlib
import os

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackDescriptor, TrackEvent

from otel_rl.base.environment_variables import OTEL_RL_PURE_PYTHON
from otel_rl.core.batches import IterationBatch, Phases
from otel_rl.formats import trace
from otel_rl.formats.protowire import varint as _varint
from otel_rl.formats.schema import PhaseSpec

try:
    from otel_rl.outputs.perfetto._slices import encode_rows as _c_encode_rows
except ImportError:  # not built (no compiler): the pure-Python twin below
    _c_encode_rows = None

_SLICE_BEGIN = TrackEvent.Type.TYPE_SLICE_BEGIN
_SLICE_END = TrackEvent.Type.TYPE_SLICE_END
_NEEDS_STATE = TracePacket.SequenceFlags.SEQ_NEEDS_INCREMENTAL_STATE
_STATE_CLEARED = TracePacket.SequenceFlags.SEQ_INCREMENTAL_STATE_CLEARED


def track_uuid(*parts: object) -> int:
    """A stable 63-bit track id: the same key gives the same track in every process's file."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1 or 1


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field ``number``."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def trace_entry(packet: bytes) -> bytes:
    """One ``Trace.packet`` (field 1) entry; a trace file is a sequence of these."""
    return b"\x0a" + _varint(len(packet)) + packet


def _packet(ts: int, event: bytes, sequence_tail: bytes) -> bytes:
    """A trace entry of a TracePacket: timestamp, track event, sequence id and flags."""
    return trace_entry(b"\x40" + _varint(ts) + _field(11, event) + sequence_tail)


@functools.lru_cache(maxsize=64)
def annotation_name(key: str) -> bytes:
    """The ``name`` field of a debug annotation, as it precedes the value."""
    return _field(10, key.encode())


_ITERATION = annotation_name("iteration")
_ENV_STEPS = annotation_name("env_steps")

MAX_FLOWS = 64
"""Flows kept per slice (more are not written)."""


def flow_field(flow_id: int, terminating: bool) -> bytes:
    """A TrackEvent's ``flow_ids`` (field 47) or ``terminating_flow_ids`` (48) entry: the id's low 64 bits."""
    return (b"\x81\x03" if terminating else b"\xf9\x02") + (flow_id & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")


def encode_rows(
    out: bytearray,
    starts: list[int] | None,
    ends: list[int] | None,
    indices: list[int] | None,
    env_steps: list[int | None] | None,
    counts: list[int],
    phase_starts: list[int],
    phase_ends: list[int],
    bodies: list[bytes],
    depths: list[int] | None,
    extras: list[bytes | None] | None,
    outer_body: bytes,
    end_body: bytes,
    sequence_tail: bytes,
    iteration_name: bytes,
    env_steps_name: bytes,
) -> None:
    """The pure-Python twin of ``otel_rl.outputs.perfetto._slices.encode_rows`` (see its docstring)."""
    chunks: list[bytes] = []
    position = 0
    for group, count in enumerate(counts):
        if starts is not None:
            body = outer_body + _annotation(iteration_name, indices[group])  # type: ignore[index]
            if env_steps[group] is not None:  # type: ignore[index]
                body += _annotation(env_steps_name, env_steps[group])  # type: ignore[index]
            chunks.append(_packet(starts[group], body, sequence_tail))
        open_ends: list[int] = []
        for phase in range(position, position + count):
            depth = 0 if depths is None else depths[phase]
            while len(open_ends) > depth:  # the phases this one is not nested in end before it begins
                chunks.append(_packet(open_ends.pop(), end_body, sequence_tail))
            extra = None if extras is None else extras[phase]
            chunks.append(_packet(phase_starts[phase], bodies[phase] + (extra or b""), sequence_tail))
            open_ends.append(phase_ends[phase])
        while open_ends:
            chunks.append(_packet(open_ends.pop(), end_body, sequence_tail))
        if starts is not None:
            chunks.append(_packet(ends[group], end_body, sequence_tail))  # type: ignore[index]
        position += count
    out += b"".join(chunks)


def _annotation(name_field: bytes, value: int) -> bytes:
    """A debug annotation (field 4) of an integer value; ``name_field`` precedes the value."""
    return _field(4, name_field + b"\x20" + _varint(value & 0xFFFFFFFFFFFFFFFF if value < 0 else value))


def flows_field(flows: tuple[tuple[int, bool], ...]) -> bytes:
    """The flow fields of a slice's BEGIN (:data:`MAX_FLOWS` at most)."""
    return b"".join(flow_field(flow_id, terminating) for flow_id, terminating in flows[:MAX_FLOWS])


class TraceEncoder:
    """Encodes records of one process as TracePackets of one sequence.

    Args:
        pid: the process whose records these are.
        process_name: its name in the trace (:func:`otel_rl.formats.trace.process_name`).
        node, host: its machine in a job of several: the trace shows it as pid :func:`otel_rl.formats.trace.node_pid`
            and its GPUs as the machine's (0 and None on one machine).
        native: encode phase slices in C (``otel_rl.outputs.perfetto._slices``); by
            default when it is built, unless ``OTEL_RL_PURE_PYTHON=1``.
    """

    def __init__(self, pid: int, process_name: str, native: bool | None = None, node: int = 0, host: str | None = None) -> None:
        self.pid = trace.node_pid(pid, node)
        self.node, self.host = node, host
        if native is None:
            native = _c_encode_rows is not None and os.environ.get(OTEL_RL_PURE_PYTHON, "").lower() not in ("1", "true")
        if native and _c_encode_rows is None:
            raise RuntimeError("otel_rl.outputs.perfetto._slices is not built")
        self._encode_rows = _c_encode_rows if native else encode_rows
        self.process_name = process_name
        self.sequence_id = (pid % 0x7FFF0000) + 1
        self.reset()

    def reset(self) -> None:
        """Forget emitted descriptors and interned names (a new file starts a new sequence state)."""
        self.state_packets = 0
        """Descriptor and interning packets emitted: later packets depend on them."""
        self._tracks: set[int] = set()
        self._thread_uuids: dict[int, int] = {}
        self._names: dict[str, int] = {}
        self._categories: dict[str, int] = {}
        self._bodies: dict[int, dict[int, bytes]] = {}  # track -> id(spec) -> BEGIN body
        self._end_bodies: dict[int, bytes] = {}
        self._outer_bodies: dict[tuple[int, str, str], bytes] = {}
        self._spec_refs: list[PhaseSpec] = []
        self._started = False
        self._sequence_tail = b"\x50" + _varint(self.sequence_id) + b"\x68" + _varint(_NEEDS_STATE)

    # -- descriptors ------------------------------------------------------

    def _packet(self) -> TracePacket:
        packet = TracePacket()
        packet.trusted_packet_sequence_id = self.sequence_id
        if not self._started:
            packet.sequence_flags = _STATE_CLEARED
            packet.first_packet_on_sequence = True
            self._started = True
        else:
            packet.sequence_flags = _NEEDS_STATE
        return packet

    def _descriptor(self, uuid: int, fill) -> list[bytes]:
        if uuid in self._tracks:
            return []
        self._tracks.add(uuid)
        self.state_packets += 1
        packet = self._packet()
        fill(packet.track_descriptor)
        return [trace_entry(packet.SerializeToString())]

    def process_track(self) -> tuple[int, list[bytes]]:
        uuid = track_uuid("process", self.pid)

        def fill(d: TrackDescriptor) -> None:
            d.uuid = uuid
            d.process.pid = self.pid
            d.process.process_name = self.process_name

        return uuid, self._descriptor(uuid, fill)

    def thread_track(self, tid: int, name: str) -> tuple[int, list[bytes]]:
        uuid = self._thread_uuids.get(tid)
        if uuid is not None and uuid in self._tracks:
            return uuid, []  # the common case: a thread already described in this file
        _, out = self.process_track()
        uuid = self._thread_uuids[tid] = track_uuid("thread", self.pid, tid)

        def fill(d: TrackDescriptor) -> None:
            d.uuid = uuid
            d.thread.pid = self.pid
            d.thread.tid = tid
            d.thread.thread_name = name

        return uuid, out + self._descriptor(uuid, fill)

    def counter_track(self, name: str, unit_name: str = "") -> tuple[int, list[bytes]]:
        parent, out = self.process_track()
        uuid = track_uuid("counter", self.pid, name)

        def fill(d: TrackDescriptor) -> None:
            d.uuid = uuid
            d.parent_uuid = parent
            d.name = name
            d.counter.unit_name = unit_name

        return uuid, out + self._descriptor(uuid, fill)

    def gpu_stream_track(self, device: int, stream: int, kernels: bool = False) -> tuple[int, list[bytes]]:
        """A track of one CUDA stream in the ``GPU n`` process: CUDA-timed phases, or the profiler's ``kernels``."""
        # One "GPU n" process per device; its pid is synthetic (negative pids are reserved).
        machine = (self.node,) if self.node else ()  # one machine's GPUs keep the ids they always had
        gpu_uuid = track_uuid("gpu", *machine, device)

        def fill_gpu(d: TrackDescriptor) -> None:
            d.uuid = gpu_uuid
            d.process.pid = trace.GPU_PID_BASE + self.node % (trace.MAX_NODES + 1) * trace.GPUS_PER_NODE + device % trace.GPUS_PER_NODE
            d.process.process_name = trace.gpu_process(device, self.host)

        out = self._descriptor(gpu_uuid, fill_gpu)
        uuid = track_uuid("gpu", *machine, device, "kernels" if kernels else "stream", stream)

        def fill(d: TrackDescriptor) -> None:
            d.uuid = uuid
            d.parent_uuid = gpu_uuid
            d.name = trace.stream_track(stream, kernels)

        return uuid, out + self._descriptor(uuid, fill)

    # -- events -----------------------------------------------------------

    def _interned(self, name: str, category: bool) -> tuple[int, list[bytes]]:
        table = self._categories if category else self._names
        iid = table.get(name)
        if iid is not None:
            return iid, []
        iid = table[name] = len(table) + 1
        self.state_packets += 1
        packet = self._packet()
        entry = (packet.interned_data.event_categories if category else packet.interned_data.event_names).add()
        entry.iid, entry.name = iid, name
        return iid, [trace_entry(packet.SerializeToString())]

    def _begin_body(self, track: int, name: str, category: str) -> tuple[bytes, list[bytes]]:
        """The TrackEvent of a slice BEGIN without flows, and the interning packets it needs first."""
        iid, out = self._interned(name, category=False)
        category_iid, more = self._interned(category, category=True)
        body = b"\x48" + _varint(_SLICE_BEGIN) + b"\x58" + _varint(track) + b"\x50" + _varint(iid) + b"\x18" + _varint(category_iid)
        return body, out + more

    def _end_body(self, track: int) -> bytes:
        body = self._end_bodies.get(track)
        if body is None:
            body = self._end_bodies[track] = b"\x48" + _varint(_SLICE_END) + b"\x58" + _varint(track)
        return body

    def batch(self, track: int, phases: Phases, first: int, last: int, iterations: IterationBatch | None = None, span: tuple[int, int] = (0, 0)) -> bytes:
        """Slice packets of phases ``first`` to ``last`` of ``phases`` on ``track`` (interning packets first).

        With ``iterations``, the phases are those of its iterations ``span``
        (first, last excluded), each iteration a slice around its own.
        """
        out = bytearray()
        spec_ids = phases.spec_ids[first:last].tolist()
        bodies: dict[int, bytes] = {}
        for spec_id in set(spec_ids):
            bodies[spec_id], interned = self._phase_body(track, phases.specs[spec_id])
            out += b"".join(interned)
        depths = phases.depths[first:last]
        extras = [flows_field(phases.flows[p]) if p in phases.flows else None for p in range(first, last)] if phases.flows else None
        outer = (None, None, None, None, [last - first])
        outer_body = b""
        if iterations is not None:
            low, high = span
            outer_body, interned = self.iteration_body(track, trace.iteration_slice(iterations.timeline), iterations.timeline)
            out += b"".join(interned)
            outer = (
                iterations.starts[low:high].tolist(), iterations.ends[low:high].tolist(), iterations.indices[low:high],
                iterations.env_steps[low:high], iterations.counts[low:high].tolist(),
            )  # fmt: skip
        self._encode_rows(
            out, *outer, phases.starts[first:last].tolist(), phases.ends[first:last].tolist(), list(map(bodies.__getitem__, spec_ids)),
            depths.tolist() if depths.any() else None, extras, outer_body, self._end_body(track), self._sequence_tail, _ITERATION, _ENV_STEPS,
        )  # fmt: skip
        return bytes(out)

    def _phase_body(self, track: int, spec: PhaseSpec) -> tuple[bytes, list[bytes]]:
        """The BEGIN body of ``spec``'s slices on ``track``, and the interning packets it needs first."""
        bodies = self._bodies.setdefault(track, {})
        body = bodies.get(id(spec))
        if body is not None:
            return body, []
        body, interned = self._begin_body(track, spec.title, spec.timeline)
        bodies[id(spec)] = body
        self._spec_refs.append(spec)  # keeps the id valid while the body is cached
        return body, interned

    def iteration_body(self, track: int, name: str, category: str) -> tuple[bytes, list[bytes]]:
        """The BEGIN body of an enclosing slice (an iteration), and the interning packets it needs first."""
        key = (track, name, category)
        body = self._outer_bodies.get(key)
        if body is not None:
            return body, []
        body, interned = self._begin_body(track, name, category)
        self._outer_bodies[key] = body
        return body, interned

    def slice(self, track: int, name: str, category: str, start_ns: int, end_ns: int) -> bytes:
        """One slice without nested phases (a GPU interval, say); ``category`` is the timeline."""
        body, interned = self._begin_body(track, name, category)
        end_body = self._end_body(track)
        packets = _packet(start_ns, body, self._sequence_tail) + _packet(end_ns, end_body, self._sequence_tail)
        return b"".join(interned) + packets

    def begin(self, track: int, name: str, category: str, ts: int, flow: int | None = None, terminating: bool = False) -> bytes:
        """A slice BEGIN packet (after the interning packets it needs), with a flow starting or ``terminating`` there."""
        body, interned = self._begin_body(track, name, category)
        if flow is not None:
            body += flow_field(flow, terminating)
        return b"".join(interned) + _packet(ts, body, self._sequence_tail)

    def end(self, track: int, ts: int) -> bytes:
        """A slice END packet: it closes the latest slice open on ``track``."""
        return _packet(ts, self._end_body(track), self._sequence_tail)

    def counter(self, track: int, ts: int, value: float) -> bytes:
        packet = self._packet()
        packet.timestamp = ts
        packet.track_event.type = TrackEvent.Type.TYPE_COUNTER
        packet.track_event.track_uuid = track
        packet.track_event.double_counter_value = value
        return trace_entry(packet.SerializeToString())


