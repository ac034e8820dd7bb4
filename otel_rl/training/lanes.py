"""The pure-Python twins of ``otel_rl.training._hotpath``: the same records, written with ``struct``.

Used when the C extension is not built, or with ``OTEL_RL_PURE_PYTHON=1``.
A :class:`PyLane` writes :data:`otel_rl.shm.layout.LANE_RECORD` records into
its ring in the segment, as ``_hotpath.Lane`` does; :func:`pack_scalars`
packs a ``scalars()`` call as ``_hotpath.put_scalars`` does. The tests run
both implementations against the same reader.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable
from time import perf_counter_ns, thread_time_ns
from typing import Any

from otel_rl.shm import layout
from otel_rl.shm import segment as shm
from otel_rl.shm.layout import MessageKind, RecordKind, ValueTag
from otel_rl.training import misuse
from otel_rl.training.misuse import MAX_DEPTH

_RECORD = layout.LANE_RECORD.struct()
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FLOAT_ENTRY = struct.Struct("<IB3xd")
_INT_ENTRY = struct.Struct("<IB3xq")
assert _FLOAT_ENTRY.size == _INT_ENTRY.size == layout.SCALAR_ENTRY.itemsize


class PyLane:
    """One thread's lane in a segment: its ring of records and its open-phase stack.

    Without a buffer (a thread beyond the segment's lanes, or a lane detached
    from its segment) it records nothing and counts every record as dropped.
    """

    __slots__ = ("capacity", "dropped", "thread_id", "thread_name", "open_iterations", "stack", "_buffer", "_offset", "_intern", "_write", "_read", "_dropped")

    def __init__(
        self, capacity: int, thread_id: int, thread_name: str, buffer: Any = None, offset: int = 0, intern: Callable[[object], int] | None = None
    ) -> None:
        self.dropped = 0
        self.thread_id, self.thread_name = thread_id, thread_name
        self.open_iterations: dict[str, PyIteration] = {}
        self.stack: list[tuple[PyPhase, int]] = []
        self._buffer, self._offset, self._intern = buffer, offset, intern
        self.capacity = capacity if buffer is not None else 0
        if buffer is None:
            return
        header = layout.LANE_HEADER
        self._write, self._read, self._dropped = (ctypes.c_uint64.from_buffer(buffer, offset + header.offset(name)) for name in ("write", "read", "dropped"))
        ctypes.c_uint64.from_buffer(buffer, offset + header.offset("capacity")).value = capacity
        self._identify()

    @property
    def depth(self) -> int:
        return len(self.stack)

    def __len__(self) -> int:
        return self._write.value - self._read.value if self.capacity else 0

    def _identify(self) -> None:
        identity = struct.Struct("<q24s")
        identity.pack_into(self._buffer, self._offset + layout.LANE_HEADER.offset("thread_id"), self.thread_id, self.thread_name.encode("utf-8", "replace")[:23])

    def rebind(self, thread_id: int, thread_name: str) -> None:
        """Give this lane of an ended thread, all of it read, to another thread (its open phases are forgotten)."""
        self.thread_id, self.thread_name = thread_id, thread_name
        self.open_iterations = {}
        self.stack = []
        if self.capacity:
            self._identify()

    def detach(self) -> None:
        """Stop writing to the segment; later records are dropped (counted here only)."""
        self.capacity = 0
        self._buffer = self._write = self._read = self._dropped = None  # each view holds the mapping

    def record(self, kind: int, start: int = 0, end: int = 0, a: int = 0, b: int = 0, name: int = -1, flags: int = 0, exc: int = -1, depth: int | None = None) -> None:
        """One :data:`otel_rl.shm.layout.LANE_RECORD` (``depth``: the open phases' by default); refused and counted when the ring is full.

        Another thread may detach the lane at any moment (the segment was
        truncated): a record it cuts short is counted as dropped.
        """
        try:
            capacity, counter = self.capacity, self._write
            write = counter.value
            if write - self._read.value >= capacity:
                self._dropped.value = self.dropped + 1
                self.dropped += 1
                return
            position = self._offset + layout.LANE_HEADER.itemsize + (write % capacity) * layout.LANE_RECORD.itemsize
            _RECORD.pack_into(self._buffer, position, start, end, a, b, name, len(self.stack) if depth is None else depth, kind, flags, exc)
            counter.value = write + 1  # published after the record
        except (AttributeError, TypeError, ZeroDivisionError):  # no buffer: beyond the lanes, or detached
            self.dropped += 1

    def timeline_id(self, timeline: str) -> int:
        """``timeline``'s id in the string table (-1 on a detached lane)."""
        return self._intern(timeline) if self.capacity else -1

    def iteration_mark(self, kind: int, time_ns: int, cpu_ns: int, index: int, env_steps: int, timeline_id: int) -> None:
        """An iteration's start or end (``cpu_ns`` -1 and ``env_steps`` :data:`otel_rl.shm.layout.NO_STEPS` where not given)."""
        self.record(kind, time_ns, cpu_ns, index, env_steps, timeline_id)

    def phase(self, phase: PyPhase, start_ns: int, end_ns: int, exc_type: Any) -> None:
        """A phase measured elsewhere, nested in the phases open on this lane.

        A Ctrl-C that arrives while the exception's type is looked up is
        raised once the phase is recorded (as the C twin does).
        """
        exc, interrupted = -1, None
        if exc_type is not None and self._intern is not None:
            try:
                exc = self._intern(exc_type)
            except BaseException as raised:
                interrupted = raised
        self.record(RecordKind.PHASE, start_ns, end_ns, name=phase.id, exc=exc)
        if interrupted is not None:
            raise interrupted

    def flow(self, time_ns: int, flow_id: int, terminating: bool) -> None:
        """A flow mark for the innermost open phase (its id's low 64 bits)."""
        low = flow_id & (2**64 - 1) if isinstance(flow_id, int) else 0
        self.record(RecordKind.FLOW, time_ns, a=low - 2**64 if low >= 2**63 else low, flags=1 if terminating else 0)

    def correlate(self, correlation: int) -> None:
        """Pairs the innermost open phase with its GPU interval."""
        self.record(RecordKind.CORRELATE, a=correlation if isinstance(correlation, int) and _INT64_MIN <= correlation <= _INT64_MAX else 0)


class PyPhase:
    """Pure-Python enter/exit of a phase (``otel_rl.training._hotpath.Phase`` is its C twin)."""

    __slots__ = ("spec", "id", "_local", "_recorder", "_warn")

    def __init__(self, spec: Any, local: threading.local, recorder: Any, warn: Callable, phase_id: int = -1) -> None:
        self.spec = spec
        self.id = phase_id
        self._local = local
        self._recorder = recorder
        self._warn = warn

    def __enter__(self) -> PyPhase:
        try:
            lane = self._local.lane
        except AttributeError:
            lane = self._recorder.lane()
        if len(lane.stack) >= MAX_DEPTH:
            self._warn("too-deep", self, None)
            return self
        lane.stack.append((self, perf_counter_ns()))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> bool:
        end = perf_counter_ns()
        try:
            lane = self._local.lane
            stack = lane.stack
            entered, start = stack[-1]
        except (AttributeError, IndexError) as missing:
            self._warn("foreign" if isinstance(missing, AttributeError) else "not-open", self, None)
            return False
        if entered is not self:
            position = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] is self), None)
            if position is None:
                self._warn("not-open", self, None)
                return False
            # Exited out of order: the phases entered after it were never exited; dropped, and the stack unwinds.
            del stack[position + 1 :]
            self._warn("order", self, entered)
            start = stack[-1][1]
        stack.pop()
        lane.phase(self, start, end, exc_type)
        return False


class PyIteration:
    """One cycle of a timeline (a learner iteration: its wall time is Iter Wall).

    Pure-Python enter/exit; ``otel_rl.training._hotpath.Iteration`` is its C twin.
    Create through :meth:`otel_rl.training.recorder.Recorder.iteration_factory`.
    """

    __slots__ = ("_recorder", "timeline", "index", "env_steps", "_active", "_on_enter", "_thread_time", "_timeline_id")

    def __init__(self, recorder: Any, timeline: str, index: int, env_steps: int | None, on_enter: Callable | None = None, thread_time: bool = False) -> None:
        self._recorder = recorder
        self.timeline = timeline
        self.index = index
        self.env_steps = env_steps
        self._active = False
        self._on_enter = on_enter
        self._thread_time = thread_time
        self._timeline_id = -1

    def __enter__(self) -> PyIteration:
        lane = self._recorder.lane()
        open_iteration = lane.open_iterations.get(self.timeline)
        if open_iteration is not None:
            misuse.iteration("twice", self, open_iteration)
            return self
        self._timeline_id = lane.timeline_id(self.timeline)  # before the iteration counts as open: a Ctrl-C here leaves nothing open
        self._active = True
        lane.open_iterations[self.timeline] = self
        if self._on_enter is not None:
            self._on_enter(self)
        self._mark(lane, RecordKind.ITERATION_START, perf_counter_ns())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> bool:
        end = perf_counter_ns()
        if not self._active:
            return False
        self._active = False
        lane = getattr(self._recorder.local, "lane", None)  # a thread without a lane did not enter it
        if lane is None or lane.open_iterations.get(self.timeline) is not self:
            misuse.iteration("foreign", self, None)
            return False
        del lane.open_iterations[self.timeline]
        self._mark(lane, RecordKind.ITERATION_END, end)
        return False

    def _mark(self, lane: PyLane, kind: int, time_ns: int) -> None:
        cpu = thread_time_ns() if self._thread_time else -1
        index = _int64(self.index, -1)
        steps = layout.NO_STEPS if self.env_steps is None else _int64(self.env_steps, layout.NO_STEPS)
        lane.iteration_mark(kind, time_ns, cpu, index, steps, self._timeline_id)


def _int64(value: Any, fallback: int) -> int:
    return value if type(value) is int and _INT64_MIN <= value <= _INT64_MAX else fallback


def pack_scalars(segment: shm.Segment, record: tuple) -> bool | None:
    """``_hotpath.put_scalars``'s twin: a ``scalars()`` call packed into the data ring.

    True when written, False when the ring is full, None when the call is not
    plain (a key that is not exactly ``str``, a value that is not a float, an
    int of 64 bits, a bool or None; an axis that is not such an int) and must
    go as a message.
    """
    time_ns, values, step, iteration, env_steps = record
    axes = []
    for axis in (step, iteration, env_steps):
        if axis is None:
            axes.append(layout.NO_STEPS)
        elif type(axis) is int and _INT64_MIN < axis <= _INT64_MAX:
            axes.append(axis)
        else:
            return None
    entries = []
    for key, value in values.items():
        if type(key) is not str:
            return None
        kind = type(value)
        if kind is float:
            entries.append((_FLOAT_ENTRY, key, ValueTag.FLOAT, value))
        elif value is None:
            entries.append((_FLOAT_ENTRY, key, ValueTag.NONE, 0.0))
        elif kind is bool:
            entries.append((_INT_ENTRY, key, ValueTag.BOOL, int(value)))
        elif kind is int and _INT64_MIN <= value <= _INT64_MAX:
            entries.append((_INT_ENTRY, key, ValueTag.INT, value))
        else:
            return None
    ids = [segment.interned.get(key) for _, key, _, _ in entries]
    ids = [segment.intern(key) if found is None else found for found, (_, key, _, _) in zip(ids, entries)]
    if any(found < 0 for found in ids):  # the string table is full
        return None
    header = shm.SCALARS_HEADER.pack(time_ns, *axes, len(entries))
    payload = header + b"".join(entry.pack(key_id, tag, value) for (entry, _, tag, value), key_id in zip(entries, ids))
    return segment.put(MessageKind.SCALARS_PACKED, payload)
