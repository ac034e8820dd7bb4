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

The pipeline hands records to a bounded queue; a writer thread encodes and
streams them to ``trace.perfetto-trace``. Track descriptors and the first
packet of a sequence are built with the ``perfetto`` package's protos; the
per-phase slice packets, thousands per second, are written from cached
encoded bytes (the same wire format, checked by decoding in the tests). A
file that outgrows ``max_bytes`` is rotated to ``trace.1.perfetto-trace``.
Timestamps are unix-epoch nanoseconds in every process, so the trace files of
several processes can be concatenated into one trace.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from collections import deque
from pathlib import Path
from typing import Any

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackDescriptor, TrackEvent

from otel_rl import schema
from otel_rl.exporters.files import close_quietly
from otel_rl.exporters.protowire import varint as _varint
from otel_rl.pipeline import RecordSink
from otel_rl.recorder import warn_once
from otel_rl.records import DeviceIntervalRecord, IterationRecord, PhaseRecord, ScalarsRecord

_logger = logging.getLogger(__name__)

TRACE_FILE = "trace.perfetto-trace"
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
QUEUE_CAPACITY = 100_000
COUNTER_PREFIXES = ("Perf/total_fps", "Train/mean_reward", "sys/", "Perf/replay_", "Perf/queue")
MAX_COUNTER_TRACKS = 64

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


class TraceEncoder:
    """Encodes records of one process as TracePackets of one sequence.

    Args:
        pid: the process whose records these are.
        process_name: its role (``learner``, ``collector 0``...).
    """

    def __init__(self, pid: int, process_name: str) -> None:
        self.pid = pid
        self.process_name = process_name
        self.sequence_id = (pid % 0x7FFF0000) + 1
        self.reset()

    def reset(self) -> None:
        """Forget emitted descriptors and interned names (a new file starts a new sequence state)."""
        self._tracks: set[int] = set()
        self._names: dict[str, int] = {}
        self._categories: dict[str, int] = {}
        self._slice_cache: dict[tuple[int, int, int], bytes] = {}
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
        _, out = self.process_track()
        uuid = track_uuid("thread", self.pid, tid)

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

    def gpu_stream_track(self, device: int, stream: int) -> tuple[int, list[bytes]]:
        # One "GPU n" process per device; its pid is synthetic (negative pids are reserved).
        gpu_uuid = track_uuid("gpu", device)
        gpu_pid = 0x40000000 + device

        def fill_gpu(d: TrackDescriptor) -> None:
            d.uuid = gpu_uuid
            d.process.pid = gpu_pid
            d.process.process_name = f"GPU {device}"

        out = self._descriptor(gpu_uuid, fill_gpu)
        uuid = track_uuid("gpu", device, "stream", stream)

        def fill(d: TrackDescriptor) -> None:
            d.uuid = uuid
            d.parent_uuid = gpu_uuid
            d.name = f"stream {stream}"

        return uuid, out + self._descriptor(uuid, fill)

    # -- events -----------------------------------------------------------

    def _interned(self, name: str, category: bool) -> tuple[int, list[bytes]]:
        table = self._categories if category else self._names
        iid = table.get(name)
        if iid is not None:
            return iid, []
        iid = table[name] = len(table) + 1
        packet = self._packet()
        entry = (packet.interned_data.event_categories if category else packet.interned_data.event_names).add()
        entry.iid, entry.name = iid, name
        return iid, [_trace_entry(packet.SerializeToString())]

    def slice(
        self,
        track: int,
        name: str,
        category: str,
        start_ns: int,
        end_ns: int,
        flows: list[tuple[int, bool]] | None = None,
        annotations: dict[str, Any] | None = None,
    ) -> tuple[list[bytes], bytes]:
        """(packets to write before the slice, its END packet); the BEGIN is in the first list.

        ``category`` is the timeline (``learner``, ``collector``, ``gpu``): readers
        tell the timelines apart by it.
        """
        iid, out = self._interned(name, category=False)
        category_iid, more = self._interned(category, category=True)
        out += more
        if flows or annotations:
            packet = self._packet()
            packet.timestamp = start_ns
            event = packet.track_event
            event.type = _SLICE_BEGIN
            event.track_uuid = track
            event.name_iid = iid
            event.category_iids.append(category_iid)
            for flow_id, terminating in flows or ():
                (event.terminating_flow_ids if terminating else event.flow_ids).append(flow_id)
            for key, value in (annotations or {}).items():
                annotation = event.debug_annotations.add()
                annotation.name = key
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    annotation.string_value = str(value)
                elif isinstance(value, int):
                    annotation.int_value = value
                else:
                    annotation.double_value = value
            out.append(_trace_entry(packet.SerializeToString()))
        else:
            out.append(self._cached(track, iid, category_iid, start_ns, begin=True))
        return out, self._cached(track, 0, 0, end_ns, begin=False)

    def _cached(self, track: int, iid: int, category_iid: int, ts: int, begin: bool) -> bytes:
        """A BEGIN or END slice packet from cached bytes: only the timestamp changes."""
        key = (track, iid if begin else -1, category_iid)
        tail = self._slice_cache.get(key)
        if tail is None:
            event = b"\x48" + _varint(_SLICE_BEGIN if begin else _SLICE_END) + b"\x58" + _varint(track)
            if begin:
                event += b"\x50" + _varint(iid) + b"\x18" + _varint(category_iid)
            tail = _field(11, event) + self._sequence_tail
            self._slice_cache[key] = tail
        return _trace_entry(b"\x40" + _varint(ts) + tail)

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
        thread_time: add a CPU-share counter per thread (needs iteration thread times).
        cuda_events: put device intervals on GPU stream tracks.
        max_bytes: rotate the file past this size.
    """

    def __init__(
        self,
        path: Path,
        process_name: str,
        thread_time: bool = False,
        cuda_events: bool = True,
        max_bytes: int = DEFAULT_MAX_BYTES,
        capacity: int = QUEUE_CAPACITY,
        merge_fragments: bool = False,
    ) -> None:
        self.path = Path(path)
        self._merge_fragments = merge_fragments
        # A worker's fragment is written under a temporary name and renamed when
        # complete, so the learner only ever merges finished fragments.
        self._writing = self.path if merge_fragments else self.path.with_name(self.path.name + ".partial")
        self._encoder = TraceEncoder(os.getpid(), process_name)
        self._thread_time = thread_time
        self._cuda_events = cuda_events
        self._max_bytes = max_bytes
        self._queue: deque = deque(maxlen=capacity)
        self.dropped = 0
        self._counters: dict[str, int] = {}
        self._file = None
        self._size = 0
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="otel-rl-perfetto", daemon=True)
        self._thread.start()

    # -- pipeline side: enqueue only -------------------------------------

    def _put(self, item: object) -> None:
        queue = self._queue
        if len(queue) == queue.maxlen:
            self.dropped += 1
        if self._idle.is_set():
            self._idle.clear()
        queue.append(item)

    def on_iteration(self, iteration: IterationRecord) -> None:
        self._put(iteration)

    def on_phase(self, phase: PhaseRecord) -> None:
        self._put(phase)

    def on_device_interval(self, interval: DeviceIntervalRecord) -> None:
        if self._cuda_events:
            self._put(interval)

    def on_scalars(self, record: ScalarsRecord) -> None:
        values = {k: v for k, v in record.values.items() if v is not None and k.startswith(COUNTER_PREFIXES)}
        if values:
            self._put((record.time_ns, values))

    # -- writer thread ----------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(0.5)
            self._wake.clear()
            self._write_pending()
            if not self._queue:
                self._idle.set()
            if self._stop and not self._queue:
                break
        self._close_file()

    def _write_pending(self) -> None:
        queue = self._queue
        chunks: list[bytes] = []
        pending = 0
        for _ in range(len(queue)):
            item = queue.popleft()
            if pending and self._size + pending > self._max_bytes:
                # Rotate between records, so each file starts with its own descriptors.
                self._write(b"".join(chunks))
                chunks, pending = [], 0
                self._rotate()
            try:
                encoded = self._encode(item)
            except Exception:
                warn_once("perfetto-encode", "otel-rl: could not encode a trace record; skipped", exc_info=True)
                continue
            chunks.extend(encoded)
            pending += sum(len(c) for c in encoded)
        if chunks:
            self._write(b"".join(chunks))

    def _encode(self, item: object) -> list[bytes]:
        enc = self._encoder
        if isinstance(item, IterationRecord):
            track, out = enc.thread_track(item.thread_id, item.thread_name)
            annotations = {"iteration": item.index}
            if item.env_steps is not None:
                annotations["env_steps"] = item.env_steps
            begin, end = enc.slice(
                track, f"{item.timeline} iteration", item.timeline, item.start_ns, item.end_ns, None, annotations
            )
            out += begin
            for phase in item.phases:
                out += self._phase(track, phase)
            out.append(end)
            if self._thread_time and item.thread_cpu_ns is not None and item.wall_ns > 0:
                counter, descriptors = enc.counter_track(f"{item.thread_name} CPU", "%")
                out += descriptors
                out.append(enc.counter(counter, item.end_ns, 100.0 * item.thread_cpu_ns / item.wall_ns))
            return out
        if isinstance(item, PhaseRecord):
            track, out = enc.thread_track(item.thread_id, item.thread_name)
            return out + self._phase(track, item)
        if isinstance(item, DeviceIntervalRecord):
            track, out = enc.gpu_stream_track(item.device, item.stream)
            begin, end = enc.slice(track, item.spec.title, "gpu", item.start_ns, item.end_ns)
            return out + begin + [end]
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

    def _phase(self, track: int, phase: PhaseRecord) -> list[bytes]:
        out, end = self._encoder.slice(
            track, phase.spec.title, phase.spec.timeline, phase.start_ns, phase.end_ns, phase.flows
        )
        for child in phase.children or ():
            out += self._phase(track, child)
        out.append(end)
        return out

    def _write(self, data: bytes) -> None:
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self._writing, "wb")  # noqa: SIM115 - kept open while streaming
                self._size = 0
            self._file.write(data)
            self._file.flush()
            self._size += len(data)
        except OSError as exc:
            warn_once("perfetto-write", "otel-rl: cannot write %s (%s); trace records are lost", self.path, exc)
            self._close_file()

    def _rotate(self) -> None:
        self._close_file()
        self._size = 0
        try:
            os.replace(self._writing, self.path.with_name(self.path.stem + ".1" + self.path.suffix))
        except OSError as exc:
            warn_once("perfetto-rotate", "otel-rl: cannot rotate %s (%s)", self.path, exc)
        self._encoder.reset()  # the new file must carry its own descriptors and interned names

    def _close_file(self) -> None:
        close_quietly(self._file)
        self._file = None

    # -- lifecycle --------------------------------------------------------

    def flush(self, timeout_s: float) -> bool:
        self._wake.set()
        return self._idle.wait(timeout_s)

    def shutdown(self, timeout_s: float) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(max(timeout_s, 0.0))
        if self.dropped:
            _logger.warning("otel-rl: trace queue was full; %d records are missing from %s", self.dropped, self.path)
        try:
            if self._writing != self.path and self._writing.exists():
                os.replace(self._writing, self.path)
            if self._merge_fragments:
                self._merge()
        except OSError as exc:
            warn_once("perfetto-merge", "otel-rl: could not finish %s (%s)", self.path, exc)

    def _merge(self) -> None:
        """Append the finished fragments of worker processes: serialized traces concatenate."""
        fragments = sorted(self.path.parent.glob("trace-*.perfetto-trace"))
        if not fragments:
            return
        with open(self.path, "ab") as merged:
            for fragment in fragments:
                with open(fragment, "rb") as part:
                    shutil.copyfileobj(part, merged)
                fragment.unlink()


