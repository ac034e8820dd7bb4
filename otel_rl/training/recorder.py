"""The training thread's side of telemetry: raw timestamps into bounded buffers.

Nothing here builds an OpenTelemetry object, serializes, or does IO. Entering
and leaving a phase costs two ``perf_counter_ns()`` calls and a deque append;
everything else happens off the training thread (:mod:`otel_rl.core.pipeline`).

Each thread that records gets its own lane (:class:`PyLane` or its C twin): a bounded deque of raw
records plus the stack of open phases. One writer per lane means the lane
needs no lock; the pipeline drains it with ``popleft`` (atomic in CPython).
A full lane drops its oldest record and counts the drop; it never blocks.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns, thread_time_ns
from typing import Any, TypeVar

from otel_rl.base.environment_variables import OTEL_RL_PURE_PYTHON
from otel_rl.base.log import logger, once
from otel_rl.formats.schema import PhaseSpec

_logger = logger(__name__)
_RECORDER_IDS = itertools.count()
_F = TypeVar("_F", bound=Callable[..., Any])

# Raw record tags (first tuple element when the record is not a phase).
ITERATION_START = "iteration_start"
ITERATION_END = "iteration_end"
FLOW = "flow"
CORRELATE = "correlate"


class PyLane:
    """Records of one thread, in the order that thread produced them.

    Raw record shapes:

    * phase: ``(Phase, start_ns, end_ns, depth, exception_type_or_its_name_or_None)``
    * iteration start/end: ``(ITERATION_START or ITERATION_END, time_ns, timeline,
      index, env_steps, thread_cpu_ns_or_None, open_phases)``: the phases of an
      iteration are those at the depth its start found (a phase left open
      before it costs only itself)
    * flow mark: ``(FLOW, time_ns, flow_id, terminating, open_phases)``
    * CUDA correlation mark: ``(CORRELATE, correlation, open_phases)``

    Times are ``perf_counter_ns()`` values; the pipeline converts them to epoch.
    This is the pure-Python lane; ``otel_rl.training._hotpath.Lane`` is its C twin.
    """

    __slots__ = ("records", "capacity", "dropped", "thread_id", "thread_name", "open_iterations", "stack")

    def __init__(self, capacity: int, thread_id: int, thread_name: str) -> None:
        self.records: deque[tuple] = deque(maxlen=capacity)
        self.capacity = capacity
        self.dropped = 0
        self.thread_id = thread_id
        self.thread_name = thread_name
        self.open_iterations: dict[str, PyIteration] = {}
        self.stack: list[tuple[PyPhase, int]] = []

    @property
    def depth(self) -> int:
        return len(self.stack)

    def __len__(self) -> int:
        return len(self.records)

    def drain(self) -> list[tuple]:
        """Remove and return every pending record, oldest first (called by the pipeline)."""
        records = self.records
        return [records.popleft() for _ in range(len(records))]

    def rebind(self, thread_id: int, thread_name: str) -> None:
        """Give this drained lane of an ended thread to another thread (its open phases are forgotten)."""
        self.thread_id, self.thread_name = thread_id, thread_name
        self.open_iterations = {}
        self.stack = []

    def append(self, record: tuple) -> None:
        records = self.records
        if len(records) == self.capacity:
            self.dropped += 1
        records.append(record)


MAX_DEPTH = 64
"""Deepest phase nesting recorded; deeper phases warn once and are not recorded."""


class PyPhase:
    """Pure-Python enter/exit of a phase (``otel_rl.training._hotpath.Phase`` is its C twin)."""

    __slots__ = ("spec", "id", "_local", "_recorder", "_warn")

    def __init__(self, spec: PhaseSpec, local: threading.local, recorder: Recorder, warn: Callable) -> None:
        self.spec = spec
        self.id = -1  # its id in a shared-memory segment's string table
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
            stack = self._local.lane.stack
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
        self._local.lane.append((self, start, end, len(stack), exc_type))
        return False


try:
    from otel_rl.training import _hotpath
except ImportError:  # not built (no compiler at install time): pure Python
    _hotpath = None


DISTRIBUTION_BYTES = 64 * 1024 * 1024
"""Values of pending ``distribution()`` calls held at most (the oldest calls are dropped and counted)."""


class Recorder:
    """Owns the lanes and the bounded queues for scalars and events.

    Args:
        lane_capacity: raw phase records kept per thread before the oldest is dropped.
        scalars_capacity: pending ``scalars()`` records before the oldest is dropped.
        events_capacity: pending events; events are never dropped silently, a
            full queue counts the drop and warns once.
    """

    def __init__(
        self,
        lane_capacity: int = 65_536,
        scalars_capacity: int = 10_000,
        events_capacity: int = 10_000,
        implementation: str | None = None,
    ):
        for name, value in (
            ("lane_capacity", lane_capacity),
            ("scalars_capacity", scalars_capacity),
            ("events_capacity", events_capacity),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.implementation = implementation or default_implementation()
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {sorted(IMPLEMENTATIONS)}, got {implementation!r}")
        self._lane_class, self._phase_class = IMPLEMENTATIONS[self.implementation]
        self.lane_capacity = lane_capacity
        self.local = threading.local()
        # Key of this recorder's lane in each thread state's dict (C lanes).
        self._key = f"otel_rl.lane.{next(_RECORDER_IDS)}"
        self.lanes: list[PyLane] = []
        self._lanes_lock = threading.Lock()
        self.scalars: deque[tuple] = deque(maxlen=scalars_capacity)
        self.scalars_dropped = 0
        self.events: deque[tuple] = deque()
        self.events_capacity = events_capacity
        self.events_dropped = 0
        self.device_intervals: deque = deque(maxlen=scalars_capacity)
        self.remote: deque = deque(maxlen=scalars_capacity)
        """Cycles relayed from worker processes (bounded; the oldest go first)."""
        self.remote_dropped = 0
        self.device_intervals_dropped = 0
        self.distributions: deque[tuple] = deque()
        self.distributions_dropped = 0
        self._distribution_bytes = 0
        self._distributions_lock = threading.Lock()
        self.cuda_fallbacks: deque[tuple[str, str, str]] = deque(maxlen=1024)
        self.phase_misuse_dropped = 0
        """Phases lost to misuse (see :meth:`misuse`): each costs only itself."""

    def lane(self) -> PyLane:
        """The calling thread's lane, created on first use."""
        if self.implementation == "c":
            lane = _hotpath.current_lane(self._key)
            if lane is not None:
                return lane
        else:
            try:
                return self.local.lane
            except AttributeError:
                pass
        thread_id, thread_name = threading.get_native_id(), threading.current_thread().name
        with self._lanes_lock:
            lane = self._reusable_lane()
            if lane is not None:
                lane.rebind(thread_id, thread_name)
            else:
                lane = self._new_lane(thread_id, thread_name)
                self.lanes.append(lane)
        if self.implementation == "c":
            _hotpath.bind_lane(self._key, lane)
        else:
            self.local.lane = lane
        return lane

    def _reusable_lane(self) -> PyLane | None:
        """A lane whose thread ended and whose records were all taken (caller holds the lanes' lock)."""
        alive = None
        for lane in self.lanes:
            if lane.capacity > 1 and len(lane) == 0:
                if alive is None:
                    alive = {thread.native_id for thread in threading.enumerate()}
                if lane.thread_id not in alive:
                    return lane
        return None

    def _new_lane(self, thread_id: int, thread_name: str) -> PyLane:
        """A lane for a thread that records for the first time (in this process's memory)."""
        return self._lane_class(self.lane_capacity, thread_id, thread_name)

    def iteration_factory(
        self, on_enter: Callable[[Iteration], None] | None = None, thread_time: bool = False
    ) -> Callable[[str, int, int | None], Iteration]:
        """``factory(timeline, index, env_steps)``: a cycle recorded into the entering thread's lane."""
        if self.implementation == "c":
            return functools.partial(_hotpath.Iteration, self._key, self, iteration_misuse, on_enter, thread_time)
        return lambda timeline, index, env_steps: PyIteration(self, timeline, index, env_steps, on_enter, thread_time)

    def new_phase(self, spec: PhaseSpec) -> Phase:
        where = self._key if self.implementation == "c" else self.local
        return self._phase_class(spec, where, self, self.misuse)

    def misuse(self, kind: str, phase: Phase, other: Phase | None) -> None:
        """A phase used wrongly (exited out of order, twice, on another thread, nested too deep): warned once; a record lost is counted."""
        if kind != "not-open":  # an exit of a phase not open loses nothing more
            self.phase_misuse_dropped += 1
        phase_misuse(kind, phase, other)

    def snapshot_lanes(self) -> list[PyLane]:
        with self._lanes_lock:
            return list(self.lanes)

    def add_scalars(self, record: tuple) -> None:
        if len(self.scalars) == self.scalars.maxlen:
            self.scalars_dropped += 1
        self.scalars.append(record)

    def add_distribution(self, record: tuple, nbytes: int) -> None:
        """Queue a ``distribution()`` call holding ``nbytes`` of values; past :data:`DISTRIBUTION_BYTES` the oldest go."""
        with self._distributions_lock:
            queue = self.distributions
            while queue and self._distribution_bytes + nbytes > DISTRIBUTION_BYTES:
                self._distribution_bytes -= queue.popleft()[1]
                self.distributions_dropped += 1
            queue.append((record, nbytes))
            self._distribution_bytes += nbytes

    def take_distributions(self) -> list[tuple]:
        """The records queued by :meth:`add_distribution`, oldest first."""
        with self._distributions_lock:
            records = [record for record, _ in self.distributions]
            self.distributions.clear()
            self._distribution_bytes = 0
        return records

    def add_event(self, record: tuple) -> bool:
        """Queue an event; False (and one warning) when the event queue is full."""
        if len(self.events) >= self.events_capacity:
            self.events_dropped += 1
            _logger.warning("otel-rl: event queue full (%d); dropping new events", self.events_capacity)
            return False
        self.events.append(record)
        return True

    def add_device_interval(self, record: object) -> None:
        """Queue a resolved GPU interval (from the CUDA resolver thread); bounded like scalars."""
        if len(self.device_intervals) == self.device_intervals.maxlen:
            self.device_intervals_dropped += 1
        self.device_intervals.append(record)

    def add_remote(self, cycle: object) -> None:
        """Queue a cycle relayed from a worker process; bounded like scalars."""
        if len(self.remote) == self.remote.maxlen:
            self.remote_dropped += 1
        self.remote.append(cycle)

    def add_control(self, record: tuple) -> None:
        """Queue a lifecycle record; never dropped (there are only a handful per run)."""
        self.events.append(record)

    def add_cuda_fallback(self, timeline: str, name: str, reason: str) -> None:
        """A CUDA phase timed on the host: its spans say why."""
        self.cuda_fallbacks.append((timeline, name, reason))

    # -- the pipeline's record source (otel_rl.core.pipeline.RecordSource) ---

    def take(self, batch) -> None:
        """Move every pending record into ``batch`` (an :class:`otel_rl.core.pipeline.Batch`)."""
        for queue, into in (
            (self.events, batch.control),
            (self.cuda_fallbacks, batch.cuda_fallbacks),
            (self.remote, batch.remote),
            (self.device_intervals, batch.intervals),
            (self.scalars, batch.scalars),
        ):
            into.extend([queue.popleft() for _ in range(len(queue))])  # popleft: safe against the recording threads
        for lane in self.snapshot_lanes():
            records = lane.drain()
            if records:  # keyed by its thread too: a lane passes to another thread once its own ended
                batch.lanes.append(((lane, lane.thread_id), lane.thread_id, lane.thread_name, records))
        batch.distributions.extend(self.take_distributions())

    def dropped(self) -> dict[str, int]:
        return {
            "phases": self.phases_dropped,
            "scalars": self.scalars_dropped,
            "events": self.events_dropped,
            "distributions": self.distributions_dropped,
            "device_intervals": self.device_intervals_dropped,
            "relay": self.remote_dropped,
            "phase_misuse": self.phase_misuse_dropped,
        }

    def pending(self) -> dict[str, int]:
        return {"phases": self.phases_pending, "scalars": len(self.scalars), "events": len(self.events)}

    @property
    def phases_dropped(self) -> int:
        return sum(lane.dropped for lane in self.snapshot_lanes())

    @property
    def phases_pending(self) -> int:
        return sum(len(lane) for lane in self.snapshot_lanes())


class Phase:
    """A named phase of one timeline: a reusable context manager and decorator.

    Instances are cached per (timeline, name) by :class:`otel_rl.Telemetry`,
    hold no per-call state, and are safe to use from many threads at once: the
    open-phase stack lives in the calling thread's lane. Exceptions propagate
    unchanged; the phase is recorded with the exception's type.

    The enter/exit machinery comes from ``otel_rl.training._hotpath`` (C) when it is
    built, else from :class:`PyPhase`.
    """

    __slots__ = ()
    spec: PhaseSpec

    def __call__(self, fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:  # type: ignore[attr-defined]
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"Phase({self.spec.timeline}/{self.spec.name})"


class PurePythonPhase(Phase, PyPhase):
    __slots__ = ()


IMPLEMENTATIONS: dict[str, tuple[type, type]] = {"python": (PyLane, PurePythonPhase)}
if _hotpath is not None:

    class CPhase(Phase, _hotpath.Phase):
        __slots__ = ()

    IMPLEMENTATIONS["c"] = (_hotpath.Lane, CPhase)


def default_implementation() -> str:
    """``c`` when the extension is built, unless ``OTEL_RL_PURE_PYTHON=1``."""
    if os.environ.get(OTEL_RL_PURE_PYTHON, "").lower() in ("1", "true"):
        return "python"
    return "c" if "c" in IMPLEMENTATIONS else "python"


def phase_misuse(kind: str, phase: Phase, other: Phase | None) -> None:
    """Called by the hot path when a phase is used wrongly; warns once per phase and kind."""
    name = phase.spec.name
    if kind == "foreign":
        message = "otel-rl: phase %r exited on a thread that did not enter it; its record is dropped"
        _logger.warning(message, name, extra=once(f"exit-foreign:{name}"))
    elif kind == "not-open":
        message = "otel-rl: phase %r exited but it is not open on this thread (exited twice, or out of order); ignored"
        _logger.warning(message, name, extra=once(f"exit-not-open:{name}"))
    elif kind == "order":
        inner = other.spec.name if other is not None else "?"
        message = "otel-rl: phase %r exited while phase %r, entered inside it, was still open; %r is dropped, later phases are recorded"
        _logger.warning(message, name, inner, inner, extra=once(f"exit-order:{name}"))
    else:
        message = "otel-rl: phase %r nested deeper than %d phases; it is not recorded"
        _logger.warning(message, name, MAX_DEPTH, extra=once(f"too-deep:{name}"))


class PyIteration:
    """One cycle of a timeline (a learner iteration: its wall time is Iter Wall).

    Pure-Python enter/exit; ``otel_rl.training._hotpath.Iteration`` is its C twin.
    Create through :meth:`Recorder.iteration_factory`.
    """

    __slots__ = ("_recorder", "timeline", "index", "env_steps", "_active", "_on_enter", "_thread_time")

    def __init__(
        self,
        recorder: Recorder,
        timeline: str,
        index: int,
        env_steps: int | None,
        on_enter: Callable[[Iteration], None] | None = None,
        thread_time: bool = False,
    ) -> None:
        self._recorder = recorder
        self.timeline = timeline
        self.index = index
        self.env_steps = env_steps
        self._active = False
        self._on_enter = on_enter
        self._thread_time = thread_time

    def __enter__(self) -> PyIteration:
        lane = self._recorder.lane()
        open_iteration = lane.open_iterations.get(self.timeline)
        if open_iteration is not None:
            iteration_misuse("twice", self, open_iteration)
            return self
        self._active = True
        lane.open_iterations[self.timeline] = self
        if self._on_enter is not None:
            self._on_enter(self)
        cpu = thread_time_ns() if self._thread_time else None
        lane.append((ITERATION_START, perf_counter_ns(), self.timeline, self.index, self.env_steps, cpu, len(lane.stack)))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> bool:
        end = perf_counter_ns()
        if not self._active:
            return False
        self._active = False
        lane = self._recorder.lane()
        if lane.open_iterations.get(self.timeline) is not self:
            iteration_misuse("foreign", self, None)
            return False
        del lane.open_iterations[self.timeline]
        cpu = thread_time_ns() if self._thread_time else None
        lane.append((ITERATION_END, end, self.timeline, self.index, self.env_steps, cpu, len(lane.stack)))
        return False


def iteration_misuse(kind: str, iteration: Iteration, other: Iteration | None) -> None:
    """Called when an iteration is used wrongly (both implementations); warns once per kind."""
    if kind == "twice":
        _logger.warning(
            "otel-rl: %s iteration %r entered while iteration %r is open on this thread; "
            "the inner one is not recorded",
            iteration.timeline,
            iteration.index,
            other.index if other is not None else "?",
            extra=once(f"iteration-twice:{iteration.timeline}"),
        )
    else:
        _logger.warning("otel-rl: iteration %r exited on another thread; dropped", iteration.index)


if _hotpath is not None:
    _hotpath.set_record_tags(ITERATION_START, ITERATION_END, FLOW, CORRELATE)
    Iteration = PyIteration | _hotpath.Iteration
else:
    Iteration = PyIteration
