"""The training thread's side of telemetry: raw timestamps and values into a shared-memory segment.

Nothing here builds an OpenTelemetry object or does IO. Each thread that
records phases gets its own lane in the segment (:class:`otel_rl.shm.segment.Segment`):
entering and leaving a phase costs two clock reads and one fixed 48-byte
record (:data:`otel_rl.shm.layout.LANE_RECORD`), with the open-phase stack
kept in the lane. One writer per lane means the lane needs no lock; a full
lane refuses the new record and counts it, it never blocks. Scalars, events,
run records, distributions, GPU intervals and relayed cycles go into the
segment's message rings: a ``scalars()`` call of string keys and numbers
packed (:data:`otel_rl.shm.layout.SCALARS_HEADER`), other scalars and events
as ``marshal`` (plain values), anything else (run records, distributions,
device intervals) as a small pickle. Nothing stays in this process's memory:
what was recorded is readable by the pipeline (on a thread here, or in an
agent process) even after this process dies.

The hot path is ``otel_rl.training._hotpath`` (C) when it is built, else the
pure-Python twins in :mod:`otel_rl.training.lanes` (``PyLane``, ``PyPhase``,
``PyIteration``), which write the same records; ``OTEL_RL_PURE_PYTHON=1`` takes those.
"""

from __future__ import annotations

import functools
import itertools
import marshal
import os
import pickle
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from otel_rl.formats import lifecycle
from otel_rl.base.environment_variables import OTEL_RL_PURE_PYTHON
from otel_rl.base.log import logger, once
from otel_rl.base.values import describe
from otel_rl.formats.schema import PhaseSpec
from otel_rl.shm import segment as shm
from otel_rl.shm.layout import PICKLED, MessageKind
from otel_rl.training import misuse
from otel_rl.training.lanes import PyIteration, PyLane, PyPhase, pack_scalars

try:
    from otel_rl.training import _hotpath
except ImportError:  # not built (no compiler at install time): pure Python
    _hotpath = None

_logger = logger(__name__)
_RECORDER_IDS = itertools.count()
_F = TypeVar("_F", bound=Callable[..., Any])

_MARSHALLED = frozenset({MessageKind.SCALARS, MessageKind.EVENT, MessageKind.NOTICE})
"""Kinds whose records hold plain values (``marshal`` would turn an array into bytes: the others are pickled)."""
_PLAIN = (str, int, float, bool, type(None))


def phase_name(spec: PhaseSpec) -> str:
    """The string-table entry of a phase: ``timeline<TAB>name``."""
    return f"{spec.timeline}\t{spec.name}"


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
    Iteration = PyIteration | _hotpath.Iteration
else:
    Iteration = PyIteration


def default_implementation() -> str:
    """``c`` when the extension is built, unless ``OTEL_RL_PURE_PYTHON=1``."""
    if os.environ.get(OTEL_RL_PURE_PYTHON, "").lower() in ("1", "true"):
        return "python"
    return "c" if "c" in IMPLEMENTATIONS else "python"


class Recorder:
    """What the training process records into: the lanes and message rings of ``segment``.

    Args:
        segment: the segment its records go to (a file an agent maps, or this process's memory).
        lane_capacity: records per lane (the segment's, at most).
        implementation: ``c`` or ``python`` (default: :func:`default_implementation`).
    """

    def __init__(self, segment: shm.Segment, lane_capacity: int, implementation: str | None = None) -> None:
        if not isinstance(lane_capacity, int) or lane_capacity < 1:
            raise ValueError(f"lane_capacity must be a positive integer, got {lane_capacity!r}")
        self.implementation = implementation or default_implementation()
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {sorted(IMPLEMENTATIONS)}, got {implementation!r}")
        self._lane_class, self._phase_class = IMPLEMENTATIONS[self.implementation]
        self.segment = segment
        self.lane_capacity = min(lane_capacity, segment.lane_capacity)
        self.local = threading.local()
        self._key = f"otel_rl.lane.{next(_RECORDER_IDS)}"
        """This recorder's lane in each thread state's dict (C lanes)."""
        self.lanes: list = []
        self._lanes_lock = threading.Lock()
        self._dropped = dict.fromkeys(shm.DROP_FIELDS, 0)
        self.detached = False
        """Whether it writes nothing more into the segment (a forked child, a damaged segment, a run over)."""

    # -- lanes ------------------------------------------------------------

    def lane(self):
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

    def _reusable_lane(self):
        """A lane of the segment whose thread ended and whose records were all read (caller holds the lanes' lock)."""
        alive = None
        for lane in self.lanes:
            if lane.capacity and len(lane) == 0:
                if alive is None:
                    alive = {thread.native_id for thread in threading.enumerate()}
                if lane.thread_id not in alive:
                    return lane
        return None

    def _new_lane(self, thread_id: int, thread_name: str):
        """The segment's next free lane, or, past :data:`otel_rl.shm.segment.MAX_LANES`, one that records nothing (counted)."""
        offset = None if self.detached else self.segment.new_lane()
        if offset is None:
            if not self.detached:
                _logger.warning(
                    "otel-rl: more than %d threads record phases; the phases of thread %r are dropped (counted)",
                    shm.MAX_LANES,
                    thread_name,
                    extra=once("lanes-full"),
                )
            return self._lane_class(self.lane_capacity, thread_id, thread_name)
        return self._lane_class(
            self.lane_capacity, thread_id, thread_name, buffer=self.segment.buffer, offset=offset, intern=self.segment.intern
        )

    def iteration_factory(self, on_enter: Callable[[Any], None] | None = None, thread_time: bool = False) -> Callable[[str, int, int | None], Any]:
        """``factory(timeline, index, env_steps)``: a cycle recorded into the entering thread's lane."""
        if self.implementation == "c":
            return functools.partial(_hotpath.Iteration, self._key, self, misuse.iteration, on_enter, thread_time)
        return lambda timeline, index, env_steps: PyIteration(self, timeline, index, env_steps, on_enter, thread_time)

    def new_phase(self, spec: PhaseSpec) -> Phase:
        phase_id = self.segment.intern(phase_name(spec))
        if self.implementation == "c":
            return self._phase_class(spec, self._key, self, self.misuse, phase_id)
        return self._phase_class(spec, self.local, self, self.misuse, phase_id)

    def misuse(self, kind: str, phase: Phase, other: Phase | None) -> None:
        """A phase used wrongly (exited out of order, twice, on another thread, nested too deep): warned once; a record lost is counted."""
        if kind != "not-open":  # an exit of a phase not open loses nothing more
            self._count_drop("phase_misuse")
        misuse.phase(kind, phase, other)

    def snapshot_lanes(self) -> list:
        with self._lanes_lock:
            return list(self.lanes)

    # -- messages ---------------------------------------------------------

    def add_scalars(self, record: tuple) -> None:
        """``(time_ns, values, step, iteration, env_steps)`` of one ``scalars()`` call."""
        if self.detached:
            return
        packed = self._put_scalars(record)  # the common case: str keys, numbers
        if packed is None:
            packed = self._put(MessageKind.SCALARS, record)
        if not packed:
            self._count_drop("scalars")

    def add_distribution(self, record: tuple) -> None:
        """``(time_ns, key, values, step, iteration, env_steps)`` of one ``distribution()`` call."""
        if not self._put(MessageKind.DISTRIBUTION, record):
            self._count_drop("distributions")

    def add_event(self, record: tuple) -> bool:
        """``(time_ns, name, attributes)``; False (one warning) when the event ring is full."""
        if self._put(MessageKind.EVENT, record):
            return True
        self._count_drop("events")
        _logger.warning("otel-rl: event ring full; dropping new events", extra=once("event-ring-full"))
        return False

    def add_run(self, record: Any) -> None:
        """The run's start or end (:class:`otel_rl.core.records.RunStart`, ``RunEnd``): never refused for events' sake."""
        if self.detached:
            return
        if not self._put(MessageKind.RUN, record):
            self._count_drop("events")
            _logger.error("otel-rl: no room for a run record in the control ring; the agent will not see it")
        # An agent that takes over mid-run learns the open run from here (it missed its start record).
        self.segment.publish_run(pickle.dumps(record, protocol=5) if record.status == lifecycle.RUNNING else b"")

    def add_media(self, request: dict) -> bool:
        """A video or image to write (:class:`otel_rl.training.media_out.MediaOut`); False when the control ring is full."""
        return self._put(MessageKind.MEDIA, request)

    def add_device_interval(self, record: tuple) -> None:
        """``(spec, device, stream, start_ns, end_ns, correlation)`` (epoch ns), from the CUDA resolver thread."""
        if not self._put(MessageKind.DEVICE_INTERVAL, record):
            self._count_drop("device_intervals")

    def add_cuda_fallback(self, fallback: Any) -> None:
        """A CUDA phase timed on the host (:class:`otel_rl.core.records.CudaFallback`): its spans say why."""
        self._put(MessageKind.CUDA_FALLBACK, fallback)

    def add_notice(self, text: str) -> bool:
        """A warning line for the panel to print above itself; False where the control ring has no room (or this is a forked child)."""
        return self._put(MessageKind.NOTICE, text)

    def add_remote(self, cycle: Any) -> None:
        """A cycle relayed from a worker process (:class:`otel_rl.core.records.RemoteCycle`)."""
        if not self._put(MessageKind.REMOTE_CYCLE, cycle):
            self._count_drop("relay")

    def _put(self, kind: int, record: object) -> bool:
        if self.detached:  # a forked child writes nothing into its parent's rings
            return False
        try:
            payload = self._encode(kind, record)
        except Exception as exc:  # an attribute no pickle can carry: the record is lost, loudly
            _logger.warning("otel-rl: a record could not be encoded (%s); dropped", exc, extra=once(f"encode:{kind}"))
            return False
        if kind not in _MARSHALLED:
            kind |= PICKLED
        if _hotpath is None:
            return self.segment.put(kind, payload)
        ring, limit = self.segment.ring_for(kind)
        return _hotpath.put_frame(self.segment.buffer, ring.offset, ring.capacity, kind, payload, limit)

    @staticmethod
    def _encode(kind: int, record: object) -> bytes:
        """``marshal`` for plain values (fast), with stand-ins for odd keys and values; a pickle otherwise."""
        if kind in _MARSHALLED:
            try:
                return marshal.dumps(record)
            except ValueError:  # an odd key or value: sent as a stand-in the pipeline's checks word alike
                return marshal.dumps(_plain(record))
        return pickle.dumps(record, protocol=5)

    def _put_scalars(self, record: tuple) -> bool | None:
        """A ``scalars()`` call packed (key ids, 8-byte values): False when the ring is full, None when it is not plain
        (keys not all ``str``, values not all numbers) and goes as a message instead."""
        time_ns, values, step, iteration, env_steps = record
        segment, ring = self.segment, self.segment.data
        if _hotpath is None:
            return pack_scalars(segment, record)
        return _hotpath.put_scalars(
            segment.buffer, ring.offset, ring.capacity, ring.capacity, MessageKind.SCALARS_PACKED, time_ns, values, step,
            iteration, env_steps, segment.interned, segment.intern,
        )  # fmt: skip

    # -- what is lost -------------------------------------------------------

    def _count_drop(self, queue: str) -> None:
        """A record its ring refused: counted here and in the header, where the pipeline reports it."""
        self._dropped[queue] += 1
        if not self.detached:
            self.segment.set(shm.DROP_FIELDS[queue], self._dropped[queue])

    def unlaned(self) -> int:
        """Phases of the threads beyond the segment's lanes: every one is lost."""
        return sum(lane.dropped for lane in self.snapshot_lanes() if not lane.capacity)

    def publish_unlaned(self) -> None:
        """Put the drops of the threads beyond the lanes in the header, where the pipeline reports them."""
        if not self.detached:
            self.segment.set("dropped_unlaned", self.unlaned())

    def dropped(self) -> dict[str, int]:
        """Records lost on this side so far, per queue."""
        lanes = self.snapshot_lanes()
        return {"phases": sum(lane.dropped for lane in lanes), **self._dropped}

    def pending(self) -> dict[str, int]:
        """Records written and not yet read, per queue (phases of every lane; messages of both rings)."""
        segment = self.segment
        messages = 0 if segment.control is None else segment.control.pending() + segment.data.pending()
        return {"phases": sum(len(lane) for lane in self.snapshot_lanes()), "messages": messages}

    def after_fork(self) -> None:
        """In a forked child: the segment belongs to the parent, whose only writer each lane and ring must stay."""
        self.detach()

    def detach(self) -> None:
        """Write nothing more into the segment (a forked child's, a damaged one, or one whose run is over): its lanes let its mapping go."""
        self.detached = True
        for lane in self.snapshot_lanes():
            lane.detach()


def _plain(item: Any) -> Any:
    """``item`` with every value that is not plain data replaced by its stand-in (see :data:`otel_rl.shm.segment.FOREIGN`)."""
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
