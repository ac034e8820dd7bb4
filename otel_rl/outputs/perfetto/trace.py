"""The Perfetto trace: every phase of every process on one timeline.

The writer reads the raw phase records (not the sampled spans), so the
timeline is complete however the span budget samples. Layout:

* a process track per role (the learner, each collector process), with a
  thread track per thread; iterations and phases are nested slices on it;
* a "GPU n" process with one track per CUDA stream for device intervals;
* flows linking a collector's inference request to the learner's inference
  and back to the collector's action wait (:meth:`otel_rl.Telemetry.flow`);
* counter tracks for throughput, queue depths and ``sys/*`` values, and,
  with ``trace_thread_time``, each thread's CPU share per iteration.

The pipeline thread encodes each record as it arrives and hands the bytes to
a bounded queue; a writer thread streams them to ``trace.perfetto-trace``.
Track descriptors and the first packet of a sequence are built with the
``perfetto`` package's protos; the slice packets of phases, thousands per
second, are encoded in C (``otel_rl.outputs.perfetto._slices``, with a pure-Python
twin) from bodies prepared once per track and phase (the same wire format,
checked by decoding in the tests). A file that outgrows ``max_bytes`` is
rotated to ``trace.1.perfetto-trace``.
Timestamps are unix-epoch nanoseconds in every process, so the trace files of
several processes can be concatenated into one trace.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackDescriptor, TrackEvent

from otel_rl.base.drops import Drops
from otel_rl.base.environment_variables import OTEL_RL_PURE_PYTHON
from otel_rl.base.files import close_quietly
from otel_rl.base.log import logger, once
from otel_rl.base.loops import BackgroundLoop
from otel_rl.base.processes import pid_alive
from otel_rl.core.iteration_rows import IterationRun
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import DeviceIntervalRecord, EventRecord, IterationRecord, PhaseRecord, ScalarsBlock
from otel_rl.core.scalar_rows import ScalarRun
from otel_rl.formats import schema
from otel_rl.formats.protowire import varint as _varint
from otel_rl.formats.schema import PhaseSpec
from otel_rl.outputs.perfetto.profile import KeptRecords, fit, intervals_of, nested_order, read_profile
from otel_rl.run import files

try:
    from otel_rl.outputs.perfetto._slices import encode_phases as _c_encode_phases
    from otel_rl.outputs.perfetto._slices import encode_rows as _c_encode_rows
except ImportError:  # not built (no compiler): the pure-Python twin below
    _c_encode_phases = _c_encode_rows = None

_logger = logger(__name__)

_ROTATE = object()  # a mark in the writer's queue: start the next file here
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
RUN_PIECE = 64
"""Iterations of a run encoded in one piece at first; then as many as the file has room for, at the size they took."""
QUEUE_CAPACITY = 100_000
COUNTER_PREFIXES = ("Perf/total_fps", "Train/mean_reward", "sys/", "Perf/replay_", "Perf/queue")
MAX_COUNTER_TRACKS = 64
LOOSE_BATCH = 1024
"""Loose phases (outside iterations) of one thread encoded in one call at most."""
MAX_CLASSIFIED_KEYS = 10_000
"""Scalar keys whose counter-or-not decision is remembered (bounds memory with ever-new keys)."""

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


def _trace_entry(packet: bytes) -> bytes:
    """One ``Trace.packet`` (field 1) entry; a trace file is a run of these."""
    return b"\x0a" + _varint(len(packet)) + packet


def _packet(ts: int, event: bytes, sequence_tail: bytes) -> bytes:
    """A trace entry of a TracePacket: timestamp, track event, sequence id and flags."""
    return _trace_entry(b"\x40" + _varint(ts) + _field(11, event) + sequence_tail)


Outer = tuple[int, int, bytes, tuple[tuple[bytes, int], ...]]
"""An enclosing slice: (start_ns, end_ns, BEGIN body, integer annotations as (name field, value))."""


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


def encode_phases(
    out: bytearray,
    phases: list[PhaseRecord],
    bodies: dict[int, bytes],
    end_body: bytes,
    sequence_tail: bytes,
    outer: Outer | None = None,
) -> PhaseSpec | None:
    """Append a BEGIN and END slice packet per phase (nested phases in between) to ``out``.

    The pure-Python twin of ``otel_rl.outputs.perfetto._slices.encode_phases``.
    ``bodies`` maps ``id(spec)`` to the BEGIN TrackEvent without flows;
    ``outer`` is an enclosing slice ``(start_ns, end_ns, BEGIN body,
    annotations)`` with integer debug annotations as (name field, value) pairs.
    Returns the first spec without a body, having appended nothing, or None.
    """
    chunks: list[bytes] = []

    def add(phase: PhaseRecord) -> PhaseSpec | None:
        body = bodies.get(id(phase.spec))
        if body is None:
            return phase.spec
        for flow_id, terminating in (phase.flows or ())[:MAX_FLOWS]:
            body += flow_field(flow_id, terminating)
        chunks.append(_packet(phase.start_ns, body, sequence_tail))
        for child in phase.children or ():
            missing = add(child)
            if missing is not None:
                return missing
        chunks.append(_packet(phase.end_ns, end_body, sequence_tail))
        return None

    if outer is not None:
        body = outer[2]
        for name_field, value in outer[3]:
            body += _field(4, name_field + b"\x20" + _varint(value))
        chunks.append(_packet(outer[0], body, sequence_tail))
    for phase in phases:
        missing = add(phase)
        if missing is not None:
            return missing
    if outer is not None:
        chunks.append(_packet(outer[1], end_body, sequence_tail))
    out += b"".join(chunks)
    return None


class TraceEncoder:
    """Encodes records of one process as TracePackets of one sequence.

    Args:
        pid: the process whose records these are.
        process_name: its role (``learner``, ``collector 0``...).
        native: encode phase slices in C (``otel_rl.outputs.perfetto._slices``); by
            default when it is built, unless ``OTEL_RL_PURE_PYTHON=1``.
    """

    def __init__(self, pid: int, process_name: str, native: bool | None = None) -> None:
        self.pid = pid
        if native is None:
            native = _c_encode_phases is not None and os.environ.get(OTEL_RL_PURE_PYTHON, "").lower() not in ("1", "true")
        if native and (_c_encode_phases is None or _c_encode_rows is None):
            raise RuntimeError("otel_rl.outputs.perfetto._slices is not built")
        self._encode_phases = _c_encode_phases if native else encode_phases
        self.columns = native
        """Whether :meth:`iteration_rows` encodes runs of iterations from their columns (in C)."""
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
        return [_trace_entry(packet.SerializeToString())]

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
        gpu_uuid = track_uuid("gpu", device)
        gpu_pid = 0x40000000 + device

        def fill_gpu(d: TrackDescriptor) -> None:
            d.uuid = gpu_uuid
            d.process.pid = gpu_pid
            d.process.process_name = f"GPU {device}"

        out = self._descriptor(gpu_uuid, fill_gpu)
        uuid = track_uuid("gpu", device, "kernels" if kernels else "stream", stream)

        def fill(d: TrackDescriptor) -> None:
            d.uuid = uuid
            d.parent_uuid = gpu_uuid
            d.name = f"stream {stream} (kernels)" if kernels else f"stream {stream}"

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
        return iid, [_trace_entry(packet.SerializeToString())]

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

    def phases(self, track: int, phases: list[PhaseRecord], outer: Outer | None = None) -> bytes:
        """Slice packets of phase records and their nested phases on ``track``.

        ``outer`` is an enclosing slice, ``(start_ns, end_ns, BEGIN body,
        annotations)`` (see :meth:`iteration_body` and :func:`annotation_name`).
        Interning packets for names not seen before come first.
        """
        out = bytearray()
        bodies = self._bodies.setdefault(track, {})
        end_body = self._end_body(track)
        while True:
            missing = self._encode_phases(out, phases, bodies, end_body, self._sequence_tail, outer)
            if missing is None:
                return bytes(out)
            out += b"".join(self._phase_body(track, missing)[1])

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

    def iteration_rows(self, track: int, run: IterationRun, first: int, last: int, body: bytes) -> bytes:
        """Slice packets of iterations ``first`` to ``last`` of ``run`` on ``track`` (``body``: their slices' BEGIN),
        encoded from the run's columns: what :meth:`phases` gives for their records. Interning packets come first."""
        rows, offset = run.rows, run.offset_ns
        out = bytearray()
        bodies = {}
        for phase_id, spec in rows.specs.items():
            bodies[phase_id], interned = self._phase_body(track, spec)
            out += b"".join(interned)
        below = int(rows.counts[:first].sum())
        above = below + int(rows.counts[first:last].sum())
        _c_encode_rows(
            out,
            (rows.starts[first:last] + offset).tolist(),
            (rows.ends[first:last] + offset).tolist(),
            rows.indices[first:last],
            rows.env_steps[first:last],
            rows.counts[first:last].tolist(),
            (rows.phase_starts[below:above] + offset).tolist(),
            (rows.phase_ends[below:above] + offset).tolist(),
            list(map(bodies.__getitem__, rows.phase_ids[below:above].tolist())),
            body,
            self._end_body(track),
            self._sequence_tail,
            _ITERATION,
            _ENV_STEPS,
        )
        return bytes(out)

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
        return _trace_entry(packet.SerializeToString())


class PerfettoTraceSink(RecordSink):
    """Streams this process's records to a Perfetto trace file from a writer thread.

    Args:
        path: the trace file.
        process_name: the role shown as this process's name.
        drops: where records dropped by a full queue are counted (queue ``perfetto``).
        thread_time: add a CPU-share counter per thread (needs iteration thread times).
        cuda_events: put device intervals on GPU stream tracks.
        max_bytes: rotate the file past this size.
        pid: the process the trace shows (default: this one; an agent passes its producer's).
        profile: the ``torch.profiler`` window configured, ``(start, count)``: the iterations and phases
            around it are kept until its event arrives, so that its operators are fitted inside them
            (:mod:`otel_rl.outputs.perfetto.profile`).
        clock_offset_ns: the producer's epoch minus ``perf_counter_ns`` (the profile's markers are read on the latter).
    """

    def __init__(
        self,
        path: Path,
        process_name: str,
        drops: Drops | None = None,
        thread_time: bool = False,
        cuda_events: bool = True,
        max_bytes: int = DEFAULT_MAX_BYTES,
        capacity: int = QUEUE_CAPACITY,
        merge_fragments: bool = False,
        pid: int | None = None,
        profile: tuple[int, int] | None = None,
        clock_offset_ns: int = 0,
    ) -> None:
        self.path = Path(path)
        self._merge_fragments = merge_fragments
        # A worker's fragment is written under a temporary name and renamed when
        # complete, so the learner only ever merges finished fragments.
        self._writing = self.path if merge_fragments else files.partial(self.path)
        self._encoder = TraceEncoder(os.getpid() if pid is None else pid, process_name)
        self._thread_time = thread_time
        self._cuda_events = cuda_events
        self._max_bytes = max_bytes
        self._drops = drops
        self._capacity = capacity
        self._encoded = 0  # bytes encoded for the current file
        self._loose: list[PhaseRecord] = []
        self.dropped = 0
        self._counters: dict[str, int] = {}
        self._classified: set[str] = set()  # scalar keys seen, and those drawn as counter tracks
        self._counter_keys: set[str] = set()
        self._kept = None if profile is None else KeptRecords(*profile)
        self._profile_event: dict | None = None  # the profile's event, merged at the end of its pass
        self._clock_offset_ns = clock_offset_ns
        self._writer = TraceWriter(self.path, self._writing)

    # -- pipeline side: encode (C for the slices), then enqueue bytes ----------

    def _put(self, chunks: list[bytes], records: int, state: bool) -> None:
        """Queue the encoded packets of ``records`` records; when full, new ones are dropped unless they carry state.

        Descriptor and interning packets are never dropped: the packets after
        them refer to their ids, and there are only a handful per file.
        """
        queue = self._writer.queue
        if len(queue) >= self._capacity and not state:
            self.dropped += records
            if self._drops is not None:
                self._drops.add("perfetto", "records", records)
            return
        data = b"".join(chunks)
        queue.append(data)
        self._encoded += len(data)
        if self._encoded > self._max_bytes:
            # Rotate between records, so each file starts with its own descriptors.
            queue.append(_ROTATE)
            self._encoder.reset()
            self._encoded = 0

    def _emit(self, items: Sequence, records: int | None = None) -> None:
        """Encode ``items`` and queue their packets together (``records``: how many records they are, default one each).

        An item that cannot be encoded is skipped alone. Packets are queued
        early where the file would pass its size, so it rotates between records.
        """
        state_before = self._encoder.state_packets
        chunks: list[bytes] = []
        size = held = 0
        for item in items:
            try:
                encoded = self._encode(item)
            except Exception:
                _logger.warning("otel-rl: could not encode a trace record; skipped", exc_info=True)
                continue
            chunks += encoded
            held += 1
            size += sum(map(len, encoded))
            if self._encoded + size > self._max_bytes:
                self._put(chunks, held if records is None else records, self._encoder.state_packets != state_before)
                state_before, chunks, size, held = self._encoder.state_packets, [], 0, 0
        if chunks:
            self._put(chunks, held if records is None else records, self._encoder.state_packets != state_before)

    def _flush_loose(self) -> None:
        if self._loose:
            loose, self._loose = self._loose, []
            self._emit([loose], len(loose))

    def on_iterations(self, iterations: list[IterationRecord]) -> None:
        # Encoded now, so the records die now: records that wait for another
        # thread survive garbage collections and make every later one slower.
        self._flush_loose()
        if type(iterations) is IterationRun and self._encoder.columns and not self._thread_time:
            self._emit_run(iterations)
        else:
            self._emit(iterations)
        if self._kept is not None:
            for iteration in iterations:
                self._keep(iteration)

    def on_phase(self, phase: PhaseRecord) -> None:
        self._keep(phase)
        # Consecutive loose phases of one thread are encoded in one call.
        if self._loose and (self._loose[0].thread_id != phase.thread_id or len(self._loose) >= LOOSE_BATCH):
            self._flush_loose()
        self._loose.append(phase)

    def on_device_interval(self, interval: DeviceIntervalRecord) -> None:
        if self._cuda_events:
            self._flush_loose()
            self._emit([interval])

    def on_scalars(self, block: ScalarsBlock) -> None:
        new = block.latest().keys() - self._classified  # the pass's keys, classified once per pass
        if new:
            if len(self._classified) < MAX_CLASSIFIED_KEYS:
                self._classified |= new
            self._counter_keys |= {k for k in new if k.startswith(COUNTER_PREFIXES)}
        if not self._counter_keys:
            return
        if isinstance(block.records, ScalarRun):
            self._run_counters(block.records)
            return
        for record in block.records:
            counters = record.values.keys() & self._counter_keys
            if counters:
                values = {k: record.values[k] for k in counters if record.values[k] is not None}
                if values:
                    self._flush_loose()
                    self._emit([(record.time_ns, values)])

    def _run_counters(self, run: ScalarRun) -> None:
        """The counter keys of a run (finite throughout), read from its columns."""
        columns = [index for index, key in enumerate(run.names) if key in self._counter_keys]
        if columns:
            names = [run.names[index] for index in columns]
            self._flush_loose()
            self._emit([(time_ns, dict(zip(names, row))) for time_ns, row in zip(run.times_ns(), run.values[:, columns].tolist())])

    def on_event(self, event: EventRecord) -> None:
        if event.name == schema.EVENT_TORCH_PROFILE:
            # Merged at the end of the pass: a pass hands over its events before its phases, and the
            # window's last iteration may be among them.
            self._profile_event = event.attributes
        # The agent saw this process die: its timeline ends with the mark a crashed worker's merged fragment gets.
        elif event.name == schema.EVENT_PROCESS_DIED:
            self._flush_loose()
            self._put([_crash_mark(self._encoder.pid, event.time_ns, f"{CRASH_MARK} ({event.attributes.get('reason')})")], 1, True)

    def _keep(self, record: IterationRecord | PhaseRecord) -> None:
        """Hold ``record`` for a profile window's operators, while one may still come."""
        if self._kept is not None and not self._kept.add(record):
            self._kept = None

    def _merge_profile(self, attributes: dict) -> None:
        """The operators of a ``torch.profiler`` window, on the thread tracks and kernel tracks they ran on."""
        kept = self._kept.records if self._kept is not None else ()
        self._kept = None  # one window per run
        try:
            profile = read_profile(Path(attributes["file"]), attributes["timebase_markers_ns"], self._encoder.pid, self._clock_offset_ns)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _logger.warning("otel-rl: the torch.profiler window is not in the trace (%s: %s)", type(exc).__name__, exc)
            return
        enc = self._encoder
        intervals = intervals_of(kept)
        names = {record.thread_id: record.thread_name for record in kept}
        chunks: list[bytes] = []
        ops = 0
        tracks = [(enc.thread_track(tid, names.get(tid, f"thread {tid}")), intervals.get(tid, ()), thread_ops)
                  for tid, thread_ops in profile.threads.items()]  # fmt: skip
        tracks += [(enc.gpu_stream_track(*stream, kernels=True), (), stream_ops) for stream, stream_ops in profile.streams.items()]
        for (track, descriptors), spans, track_ops in tracks:
            chunks += descriptors
            for ts, op in nested_order(fit(spans, track_ops)):
                if op is None:
                    chunks.append(enc.end(track, ts))
                    continue
                flow = None if op.flow is None else track_uuid("torch flow", enc.pid, op.flow)
                chunks.append(enc.begin(track, op.name, op.category, ts, flow, op.terminating))
                ops += 1
        self._put(chunks, ops, True)

    def on_drain(self, now_ns: int) -> None:
        self._flush_loose()
        if self._profile_event is not None:
            attributes, self._profile_event = self._profile_event, None
            self._merge_profile(attributes)
        if self._writer.queue:
            self._writer.wake()

    def _emit_run(self, run: IterationRun) -> None:
        """A run's iterations encoded from its columns, in pieces so that the file rotates between iterations."""
        enc, first, total, each = self._encoder, 0, len(run), 0
        while first < total:
            last = min(total, first + (max(1, (self._max_bytes - self._encoded) // each) if each else RUN_PIECE))
            state_before = enc.state_packets
            try:
                track, out = enc.thread_track(run.thread_id, run.thread_name)
                body, interned = enc.iteration_body(track, f"{run.rows.timeline} iteration", run.rows.timeline)
                out += interned
                out.append(enc.iteration_rows(track, run, first, last, body))
            except Exception:
                _logger.warning("otel-rl: could not encode a trace record; skipped", exc_info=True)
            else:
                self._put(out, last - first, enc.state_packets != state_before)
                each = max(1, sum(map(len, out)) // (last - first))
            first = last

    def _encode(self, item: object) -> list[bytes]:
        enc = self._encoder
        if isinstance(item, IterationRecord):
            track, out = enc.thread_track(item.thread_id, item.thread_name)
            annotations = ((_ITERATION, item.index),)
            if item.env_steps is not None:
                annotations += ((_ENV_STEPS, item.env_steps),)
            body, interned = enc.iteration_body(track, f"{item.timeline} iteration", item.timeline)
            out += interned
            out.append(enc.phases(track, item.phases, (item.start_ns, item.end_ns, body, annotations)))
            if self._thread_time and item.thread_cpu_ns is not None and item.wall_ns > 0:
                counter, descriptors = enc.counter_track(f"{item.thread_name} CPU", "%")
                out += descriptors
                out.append(enc.counter(counter, item.end_ns, 100.0 * item.thread_cpu_ns / item.wall_ns))
            return out
        if isinstance(item, list):  # loose phases of one thread
            track, out = enc.thread_track(item[0].thread_id, item[0].thread_name)
            out.append(enc.phases(track, item))
            return out
        if isinstance(item, DeviceIntervalRecord):
            track, out = enc.gpu_stream_track(item.device, item.stream)
            out.append(enc.slice(track, item.spec.title, "gpu", item.start_ns, item.end_ns))
            return out
        time_ns, values = item
        out = []
        for key, value in values.items():
            if key not in self._counters and len(self._counters) >= MAX_COUNTER_TRACKS:
                continue
            track, descriptors = enc.counter_track(key, schema.metric_spec(key).unit)
            self._counters[key] = track
            out += descriptors
            out.append(enc.counter(track, time_ns, float(value)))
        return out

    # -- lifecycle --------------------------------------------------------

    def flush(self, timeout_s: float) -> bool:
        self._flush_loose()
        return self._writer.flush(timeout_s)

    @property
    def size(self) -> int:
        """Bytes written to the trace file so far."""
        return self._writer.size

    def shutdown(self, timeout_s: float) -> None:
        self._flush_loose()
        self._writer.shutdown(timeout_s)
        if self.dropped:
            _logger.warning("otel-rl: trace queue was full; %d records are missing from %s", self.dropped, self.path)
        try:
            if self._writing != self.path and self._writing.exists():
                os.replace(self._writing, self.path)
            if self._merge_fragments:
                merge_fragments(self.path)
        except OSError as exc:
            _logger.warning("otel-rl: could not finish %s (%s)", self.path, exc)


class TraceWriter(BackgroundLoop):
    """Writes encoded packets (and rotates files at the marks, once packets follow) on its own thread: file IO only."""

    queue_only = True

    def __init__(self, path: Path, writing: Path) -> None:
        super().__init__("otel-rl-perfetto", 0.5)
        self.path = path
        self._writing = writing
        self.queue: deque = deque()  # encoded packets (bytes) and rotation marks
        self._file = None
        self._rotation_due = False
        self.size = 0
        """Bytes in the file being written."""
        self.start()

    def has_work(self) -> bool:
        return bool(self.queue)

    def run_once(self) -> None:
        queue = self.queue
        chunks: list[bytes] = []
        for _ in range(len(queue)):
            data = queue.popleft()
            if data is _ROTATE:
                self._write(b"".join(chunks))
                chunks = []
                self._rotation_due = True
            else:
                if self._rotation_due:  # rotated once packets follow the mark: a run's last file is never the .1
                    self._rotate()
                    self._rotation_due = False
                chunks.append(data)
        if chunks:
            self._write(b"".join(chunks))

    def finish(self) -> None:
        self._close_file()

    def _write(self, data: bytes) -> None:
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self._writing, "wb")  # noqa: SIM115 - kept open while streaming
                self.size = 0
            self._file.write(data)
            self._file.flush()
            self.size += len(data)
        except OSError as exc:
            _logger.warning("otel-rl: cannot write %s (%s); trace records are lost", self.path, exc, extra=once(f"write:{self.path}"))
            self._close_file()

    def _rotate(self) -> None:
        self._close_file()
        try:
            os.replace(self._writing, files.rotated(self.path))
        except OSError as exc:
            _logger.warning("otel-rl: cannot rotate %s (%s)", self.path, exc)

    def _close_file(self) -> None:
        close_quietly(self._file)
        self._file = None


CRASH_MARK = "worker crashed: its trace ends here"
"""The instant that ends a crashed worker's timeline (the agent adds why, when it saw the death)."""


def merge_fragments(path: Path) -> None:
    """Append the fragments of worker processes to ``path``: serialized traces concatenate.

    Finished fragments (``trace-<role>.perfetto-trace``) go in whole. A
    ``.partial`` fragment whose process is gone is a worker that crashed:
    it is cut after its last whole packet and goes in with a
    :data:`CRASH_MARK` instant on that process. A ``.partial`` fragment of a
    live process is still being written and is left alone.
    """
    fragments = sorted(path.parent.glob(files.FRAGMENT_GLOB))
    crashed = [p for p in sorted(path.parent.glob(files.FRAGMENT_GLOB + files.PARTIAL_SUFFIX)) if not _writer_alive(p)]
    if not fragments and not crashed:
        return
    with open(path, "ab") as merged:
        for fragment in fragments:
            with open(fragment, "rb") as part:
                shutil.copyfileobj(part, merged)
            fragment.unlink()
        for fragment in crashed:
            data = fragment.read_bytes()
            whole, last_ts, pid = _whole_packets(data)
            merged.write(data[:whole])
            if pid is not None:
                merged.write(_crash_mark(pid, last_ts))
            fragment.unlink()
            _logger.warning("otel-rl: merged the trace of a crashed worker (%s), marked as crashed", fragment.name)


def _writer_alive(fragment: Path) -> bool:
    _, _, pid = _whole_packets(fragment.read_bytes()[:65536])
    return pid != os.getpid() and pid_alive(pid)


def _whole_packets(data: bytes) -> tuple[int, int, int | None]:
    """(bytes of whole packets, timestamp of the last packet that has one, pid of the first process descriptor)."""
    offset, pid = 0, None
    size = len(data)
    recent: deque[tuple[int, int]] = deque(maxlen=64)  # the last packets' spans, searched for a timestamp
    while offset < size and data[offset] == 0x0A:  # field 1 of Trace: a length-delimited packet
        length, shift, cursor = 0, 0, offset + 1
        while cursor < size:
            byte = data[cursor]
            cursor += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        else:
            break
        end = cursor + length
        if end > size:
            break
        if pid is None:
            pid = TracePacket.FromString(data[cursor:end]).track_descriptor.process.pid or None
        recent.append((cursor, end))
        offset = end
    last_ts = 0
    for begin, stop in reversed(recent):
        last_ts = TracePacket.FromString(data[begin:stop]).timestamp
        if last_ts:
            break
    return offset, last_ts, pid


def _crash_mark(pid: int, time_ns: int, name: str = "") -> bytes:
    """An instant on a "crashed" track of process ``pid`` at ``time_ns`` (its own packet sequence)."""
    sequence = 0x7FFF0000 + (pid % 0xFFFF)
    uuid = track_uuid("crashed", pid)
    descriptor = TracePacket(trusted_packet_sequence_id=sequence)
    descriptor.track_descriptor.uuid = uuid
    descriptor.track_descriptor.parent_uuid = track_uuid("process", pid)
    descriptor.track_descriptor.name = "crashed"
    mark = TracePacket(trusted_packet_sequence_id=sequence, timestamp=time_ns)
    mark.track_event.type = TrackEvent.TYPE_INSTANT
    mark.track_event.track_uuid = uuid
    mark.track_event.name = name or CRASH_MARK
    return _trace_entry(descriptor.SerializeToString()) + _trace_entry(mark.SerializeToString())
