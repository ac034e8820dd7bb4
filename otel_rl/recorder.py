"""The training thread's side of telemetry: raw timestamps into bounded buffers.

Nothing here builds an OpenTelemetry object, serializes, or does IO. Entering
and leaving a phase costs two ``perf_counter_ns()`` calls and a deque append;
everything else happens on the pipeline thread (:mod:`otel_rl.pipeline`).

Each thread that records gets its own :class:`Lane`: a bounded deque of raw
records plus the stack of open phases. One writer per lane means the lane
needs no lock; the pipeline drains it with ``popleft`` (atomic in CPython).
A full lane drops its oldest record and counts the drop; it never blocks.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from typing import Any, TypeVar

from otel_rl.schema import PhaseSpec

_logger = logging.getLogger(__name__)
_F = TypeVar("_F", bound=Callable[..., Any])

# Raw record tags (first tuple element when the record is not a phase).
ITERATION_START = "iteration_start"
ITERATION_END = "iteration_end"


class Lane:
    """Records of one thread, in the order that thread produced them.

    Raw record shapes:

    * phase: ``(Phase, start_ns, end_ns, depth, exception_type_or_None)``
    * iteration start: ``(ITERATION_START, start_ns, timeline, index, env_steps)``
    * iteration end: ``(ITERATION_END, end_ns, timeline, index, env_steps)``

    Times are ``perf_counter_ns()`` values; the pipeline converts them to epoch.
    """

    __slots__ = ("records", "stack", "capacity", "dropped", "thread_id", "thread_name", "open_iterations")

    def __init__(self, capacity: int) -> None:
        self.records: deque[tuple] = deque(maxlen=capacity)
        self.stack: list[tuple[Phase, int]] = []
        self.capacity = capacity
        self.dropped = 0
        thread = threading.current_thread()
        self.thread_id = threading.get_native_id()
        self.thread_name = thread.name
        self.open_iterations: dict[str, Iteration] = {}

    def append(self, record: tuple) -> None:
        records = self.records
        if len(records) == self.capacity:
            self.dropped += 1
        records.append(record)


class _WarnOnce:
    """Log each distinct problem once, so a hot loop cannot flood the log."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, key: str, message: str, *args: object) -> None:
        if key not in self._seen:
            self._seen.add(key)
            _logger.warning(message, *args)


warn_once = _WarnOnce()


class Recorder:
    """Owns the lanes and the bounded queues for scalars and events.

    Args:
        lane_capacity: raw phase records kept per thread before the oldest is dropped.
        scalars_capacity: pending ``scalars()`` records before the oldest is dropped.
        events_capacity: pending events; events are never dropped silently, a
            full queue counts the drop and warns once.
    """

    def __init__(self, lane_capacity: int = 65_536, scalars_capacity: int = 10_000, events_capacity: int = 10_000):
        for name, value in (
            ("lane_capacity", lane_capacity),
            ("scalars_capacity", scalars_capacity),
            ("events_capacity", events_capacity),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.lane_capacity = lane_capacity
        self.local = threading.local()
        self.lanes: list[Lane] = []
        self._lanes_lock = threading.Lock()
        self.scalars: deque[tuple] = deque(maxlen=scalars_capacity)
        self.scalars_dropped = 0
        self.events: deque[tuple] = deque()
        self.events_capacity = events_capacity
        self.events_dropped = 0
        self.closed = False

    def lane(self) -> Lane:
        """The calling thread's lane, created on first use."""
        try:
            return self.local.lane
        except AttributeError:
            lane = Lane(self.lane_capacity)
            with self._lanes_lock:
                self.lanes.append(lane)
            self.local.lane = lane
            return lane

    def snapshot_lanes(self) -> list[Lane]:
        with self._lanes_lock:
            return list(self.lanes)

    def add_scalars(self, record: tuple) -> None:
        if len(self.scalars) == self.scalars.maxlen:
            self.scalars_dropped += 1
        self.scalars.append(record)

    def add_event(self, record: tuple) -> bool:
        """Queue an event; False (and one warning) when the event queue is full."""
        if len(self.events) >= self.events_capacity:
            self.events_dropped += 1
            warn_once("events-full", "otel-rl: event queue full (%d); dropping new events", self.events_capacity)
            return False
        self.events.append(record)
        return True

    def add_control(self, record: tuple) -> None:
        """Queue a lifecycle record; never dropped (there are only a handful per run)."""
        self.events.append(record)

    @property
    def phases_dropped(self) -> int:
        return sum(lane.dropped for lane in self.snapshot_lanes())


class Phase:
    """A named phase of one timeline: a reusable context manager and decorator.

    Instances are cached per (timeline, name) by :class:`otel_rl.Telemetry`,
    hold no per-call state, and are safe to use from many threads at once: the
    open-phase stack lives in the calling thread's lane.
    """

    __slots__ = ("spec", "_recorder", "_local")

    def __init__(self, spec: PhaseSpec, recorder: Recorder) -> None:
        self.spec = spec
        self._recorder = recorder
        self._local = recorder.local

    def __enter__(self) -> Phase:
        try:
            lane = self._local.lane
        except AttributeError:
            lane = self._recorder.lane()
        lane.stack.append((self, perf_counter_ns()))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> bool:
        end = perf_counter_ns()
        try:
            lane = self._local.lane
            entered, start = lane.stack.pop()
        except (AttributeError, IndexError):
            warn_once(
                f"exit-foreign:{self.spec.name}",
                "otel-rl: phase %r exited on a thread that did not enter it; its record is dropped",
                self.spec.name,
            )
            return False
        if entered is not self:
            lane.stack.append((entered, start))
            warn_once(
                f"exit-order:{self.spec.name}",
                "otel-rl: phase %r exited while phase %r was innermost; its record is dropped",
                self.spec.name,
                entered.spec.name,
            )
            return False
        records = lane.records
        if len(records) == lane.capacity:
            lane.dropped += 1
        records.append((self, start, end, len(lane.stack), exc_type))
        return False

    def __call__(self, fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"Phase({self.spec.timeline}/{self.spec.name})"


class Iteration:
    """One cycle of a timeline (a learner iteration: its wall time is Iter Wall)."""

    __slots__ = ("_recorder", "timeline", "index", "env_steps", "_active", "_on_enter")

    def __init__(
        self,
        recorder: Recorder,
        timeline: str,
        index: int,
        env_steps: int | None,
        on_enter: Callable[[Iteration], None] | None = None,
    ) -> None:
        self._recorder = recorder
        self.timeline = timeline
        self.index = index
        self.env_steps = env_steps
        self._active = False
        self._on_enter = on_enter

    def __enter__(self) -> Iteration:
        lane = self._recorder.lane()
        if self.timeline in lane.open_iterations:
            warn_once(
                f"iteration-twice:{self.timeline}",
                "otel-rl: %s iteration %r entered while iteration %r is open on this thread; "
                "the inner one is not recorded",
                self.timeline,
                self.index,
                lane.open_iterations[self.timeline].index,
            )
            return self
        self._active = True
        lane.open_iterations[self.timeline] = self
        if self._on_enter is not None:
            self._on_enter(self)
        lane.append((ITERATION_START, perf_counter_ns(), self.timeline, self.index, self.env_steps))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> bool:
        end = perf_counter_ns()
        if not self._active:
            return False
        self._active = False
        lane = self._recorder.lane()
        if lane.open_iterations.get(self.timeline) is not self:
            warn_once("iteration-foreign", "otel-rl: iteration %r exited on another thread; dropped", self.index)
            return False
        del lane.open_iterations[self.timeline]
        lane.append((ITERATION_END, end, self.timeline, self.index, self.env_steps))
        return False


def copy_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Snapshot a scalars mapping on the training thread (the caller may mutate it)."""
    return dict(values)
