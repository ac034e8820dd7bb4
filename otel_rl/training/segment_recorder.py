"""The training process's recorder when an agent process runs its outputs: records written into a :class:`Segment`.

Phases and iteration marks go into the calling thread's lane of the segment
(fixed binary records, names as ids of its string table); scalars, events,
run records, distributions, GPU intervals and relayed cycles go into its
message rings as small pickles. Nothing stays in this process's memory:
what was recorded is readable by the agent even after this process dies.
"""

from __future__ import annotations

import ctypes
import marshal
import pickle
import struct
from typing import Any

from otel_rl.base.log import logger, once
from otel_rl.base.values import INT64_MAX, INT64_MIN, describe
from otel_rl.formats.schema import PhaseSpec
from otel_rl.shm import layout
from otel_rl.shm import segment as shm
from otel_rl.shm.layout import MessageKind, RecordKind
from otel_rl.training.recorder import (
    CORRELATE,
    FLOW,
    ITERATION_END,
    ITERATION_START,
    Recorder,
    _hotpath,
    phase_misuse,
)

_logger = logger(__name__)
_RECORD = layout.LANE_RECORD.struct()
""":data:`segment.RECORD` as a ``struct`` (for the pure-Python lane)."""
_MARSHALLED = frozenset({MessageKind.SCALARS, MessageKind.EVENT, MessageKind.CUDA_FALLBACK})
"""Kinds whose records hold plain values (``marshal`` would turn an array into bytes: the others are pickled)."""


def phase_name(spec: PhaseSpec) -> str:
    """The string-table entry of a phase: ``timeline<TAB>name``."""
    return f"{spec.timeline}\t{spec.name}"


class PyShmLane:
    """Pure-Python twin of a shared-memory ``_hotpath.Lane``: the same records, written with ``struct``."""

    __slots__ = ("segment", "offset", "capacity", "dropped", "thread_id", "thread_name", "open_iterations", "stack", "_write", "_read", "_dropped")

    def __init__(self, segment: shm.Segment, offset: int, capacity: int, thread_id: int, thread_name: str) -> None:
        self.segment = segment
        self.offset = offset
        self.capacity = capacity
        self.dropped = 0
        self.thread_id = thread_id
        self.thread_name = thread_name
        self.open_iterations: dict = {}
        self.stack: list = []
        buffer = segment.buffer
        self._write = shm._u64(buffer, offset + shm._LANE_WRITE)
        self._read = shm._u64(buffer, offset + shm._LANE_READ)
        self._dropped = shm._u64(buffer, offset + shm._LANE_DROPPED)
        shm._u64(buffer, offset + shm._LANE_CAPACITY).value = capacity
        shm._LANE_IDENTITY.pack_into(buffer, offset + shm._LANE_THREAD, thread_id, thread_name.encode("utf-8", "replace")[:23])

    @property
    def depth(self) -> int:
        return len(self.stack)

    def __len__(self) -> int:
        return self._write.value - self._read.value

    def rebind(self, thread_id: int, thread_name: str) -> None:
        """Give this drained lane of an ended thread to another thread (its open phases are forgotten)."""
        self.thread_id, self.thread_name = thread_id, thread_name
        self.open_iterations = {}
        self.stack = []
        shm._LANE_IDENTITY.pack_into(
            self.segment.buffer, self.offset + shm._LANE_THREAD, thread_id, thread_name.encode("utf-8", "replace")[:23]
        )

    def detach(self) -> None:
        """Stop writing to shared memory; later records are dropped (counted here only)."""
        self.capacity = 0
        self._read = self._write = ctypes.c_uint64(0)
        self._dropped = ctypes.c_uint64(0)

    def append(self, record: tuple) -> None:
        head = record[0]
        intern = self.segment.intern
        if head is ITERATION_START or head is ITERATION_END:
            _, time_ns, timeline, index, env_steps, cpu, open_phases = record
            kind = RecordKind.ITERATION_START if head is ITERATION_START else RecordKind.ITERATION_END
            fields = (time_ns, -1 if cpu is None else cpu, _int64(index, -1), _int64(env_steps, layout.NO_STEPS), intern(timeline), open_phases, kind, 0, -1)
        elif head is FLOW:
            _, time_ns, flow_id, terminating, open_phases = record
            fields = (time_ns, 0, _low64(flow_id), 0, -1, open_phases, RecordKind.FLOW, 1 if terminating else 0, -1)
        elif head is CORRELATE:
            _, correlation, open_phases = record
            fields = (0, 0, _int64(correlation, 0), 0, -1, open_phases, RecordKind.CORRELATE, 0, -1)
        else:
            phase, start, end, depth, exc_type = record
            exc = -1 if exc_type is None else intern(exc_type)
            fields = (start, end, 0, 0, phase.id, depth, RecordKind.PHASE, 0, exc)
        write = self._write.value
        if write - self._read.value >= self.capacity:
            self.dropped += 1
            self._dropped.value = self.dropped
            return
        _RECORD.pack_into(self.segment.buffer, self.offset + shm.LANE_HEADER_BYTES + (write % self.capacity) * shm.RECORD.itemsize, *fields)
        self._write.value = write + 1  # published after the record


_PLAIN = (str, int, float, bool, type(None))


def _plain(item: Any) -> Any:
    """``item`` with every value that is not plain data replaced by its stand-in (see :data:`segment.FOREIGN`)."""
    kind = type(item)
    if kind in _PLAIN:
        return item
    if kind is dict:
        return {_plain(k): _plain(v) for k, v in item.items()}
    if kind is tuple or kind is list:
        return kind(_plain(v) for v in item)
    if isinstance(item, str):  # a str subclass (StrEnum...): its text, as the pipeline reads it
        return str.__str__(item)
    return (shm.FOREIGN, kind.__name__, describe(item))


def _int64(value: Any, fallback: int) -> int:
    return value if type(value) is int and INT64_MIN <= value <= INT64_MAX else fallback


def _low64(value: Any) -> int:
    """A flow id's low 64 bits, as the signed value the record holds (the agent reads them back unsigned)."""
    if not isinstance(value, int):
        return 0
    low = value & (2**64 - 1)
    return low - 2**64 if low >= 2**63 else low


class SegmentRecorder(Recorder):
    """A :class:`Recorder` whose lanes and queues live in ``segment``."""

    def __init__(self, segment: shm.Segment, lane_capacity: int, implementation: str | None = None) -> None:
        super().__init__(lane_capacity=lane_capacity, implementation=implementation)
        self.segment = segment
        self._forked = False

    def unlaned(self) -> int:
        """Phases of the threads beyond the segment's lanes: every one is lost (their stand-in lanes are never read)."""
        return sum(lane.dropped + len(lane) for lane in self.snapshot_lanes() if lane.capacity == 1)

    @property
    def phases_dropped(self) -> int:
        return sum(lane.dropped for lane in self.snapshot_lanes() if lane.capacity != 1) + self.unlaned()

    @property
    def phases_pending(self) -> int:
        return sum(len(lane) for lane in self.snapshot_lanes() if lane.capacity != 1)

    def publish_unlaned(self) -> None:
        """Put the drops of the threads beyond the lanes in the header, where the agent reports them."""
        if not self._forked:
            self.segment.set("dropped_unlaned", self.unlaned())

    def misuse(self, kind: str, phase: Any, other: Any) -> None:
        if kind != "not-open":
            self._count_drop("phase_misuse")
        phase_misuse(kind, phase, other)

    def _count_drop(self, queue: str) -> None:
        """A record its ring refused: counted here and in the header, where the agent reports it."""
        attribute = "remote_dropped" if queue == "relay" else f"{queue}_dropped"  # Recorder's counters
        setattr(self, attribute, getattr(self, attribute) + 1)
        if not self._forked:
            self.segment.set(shm.DROP_FIELDS[queue], getattr(self, attribute))

    def after_fork(self) -> None:
        """In a forked child: the segment belongs to the parent, whose only writer each lane and ring must stay."""
        self.detach()

    def detach(self) -> None:
        """Write nothing more into the segment (a forked child's, a damaged one, or one whose run is over): its lanes let its mapping go."""
        self._forked = True
        for lane in self.snapshot_lanes():
            if hasattr(lane, "detach"):
                lane.detach()

    # -- lanes ------------------------------------------------------------

    def _new_lane(self, thread_id: int, thread_name: str):
        """A lane in the segment (the next free one), or, past :data:`segment.MAX_LANES`, one never read."""
        offset = self.segment.new_lane()
        if offset is None:
            _logger.warning(
                "otel-rl: more than %d threads record phases; the phases of thread %r are dropped (counted)",
                shm.MAX_LANES,
                thread_name,
                extra=once("lanes-full"),
            )
            return self._lane_class(1, thread_id, thread_name)  # its records count as dropped (publish_unlaned)
        if self.implementation == "c":
            return _hotpath.Lane(
                self.lane_capacity, thread_id, thread_name, buffer=self.segment.buffer, offset=offset, intern=self.segment.intern
            )
        return PyShmLane(self.segment, offset, self.lane_capacity, thread_id, thread_name)

    def new_phase(self, spec: PhaseSpec):
        phase_id = self.segment.intern(phase_name(spec))
        if self.implementation == "c":
            return self._phase_class(spec, self._key, self, self.misuse, phase_id)
        phase = self._phase_class(spec, self.local, self, self.misuse)
        phase.id = phase_id
        return phase

    # -- messages ---------------------------------------------------------

    def _put(self, kind: int, record: object) -> bool:
        if self._forked:  # a forked child writes nothing into its parent's rings
            return False
        try:
            if kind not in _MARSHALLED:
                raise ValueError(kind)
            try:
                payload = marshal.dumps(record)  # plain values: the fast encoding
            except ValueError:  # an odd key or value: sent as a stand-in the agent's checks word alike
                payload = marshal.dumps(_plain(record))
        except ValueError:
            try:
                payload = pickle.dumps(record, protocol=5)
                kind |= layout.PICKLED
            except Exception as exc:  # an attribute no pickle can carry: the record is lost, loudly
                _logger.warning("otel-rl: a record could not be encoded (%s); dropped", exc, extra=once(f"encode:{kind}"))
                return False
        if _hotpath is None:
            return self.segment.put(kind, payload)
        ring, limit = self.segment.ring_for(kind)
        return _hotpath.put_frame(self.segment.buffer, ring.offset, ring.capacity, kind, payload, limit)

    def _put_scalars(self, record: tuple) -> bool | None:
        """A ``scalars()`` record packed in C (key ids, 8-byte values): False when the ring is full,
        None when it is not plain (keys not all ``str``, values not all numbers) or C is not built."""
        if _hotpath is None:
            return None
        time_ns, values, step, iteration, env_steps = record
        segment, ring = self.segment, self.segment.data
        return _hotpath.put_scalars(
            segment.buffer, ring.offset, ring.capacity, ring.capacity, MessageKind.SCALARS_PACKED, time_ns, values, step,
            iteration, env_steps, segment.interned, segment.intern,
        )  # fmt: skip

    def add_scalars(self, record: tuple) -> None:
        if self._forked:
            return
        packed = self._put_scalars(record)  # the common case: str keys, numbers
        if packed is None:
            packed = self._put(MessageKind.SCALARS, record)
        if not packed:
            self._count_drop("scalars")

    def add_distribution(self, record: tuple, nbytes: int) -> None:
        if not self._put(MessageKind.DISTRIBUTION, record):
            self._count_drop("distributions")

    def add_event(self, record: tuple) -> bool:
        if self._put(MessageKind.EVENT, record):
            return True
        self._count_drop("events")
        _logger.warning("otel-rl: event ring full; dropping new events", extra=once("event-ring-full"))
        return False

    def add_control(self, record: Any) -> None:
        if self._forked:  # a forked child: the segment is its parent's
            return
        if not self._put(MessageKind.RUN, record):
            self._count_drop("events")
            _logger.error("otel-rl: no room for a run record in the control ring; the agent will not see it")
        # An agent that takes over mid-run learns the open run from here (it missed its start record).
        self.segment.publish_run(pickle.dumps(record, protocol=5) if record.end_ns is None else b"")

    def add_device_interval(self, record: object) -> None:
        if not self._put(MessageKind.DEVICE_INTERVAL, record):
            self._count_drop("device_intervals")

    def add_cuda_fallback(self, timeline: str, name: str, reason: str) -> None:
        """A CUDA phase timed on the host: its spans say why."""
        self._put(MessageKind.CUDA_FALLBACK, (timeline, name, reason))

    def add_remote(self, cycle: object) -> None:
        if not self._put(MessageKind.REMOTE_CYCLE, cycle):
            self._count_drop("relay")
