"""The producer's recorder: the same training-thread API, records written into a :class:`Segment`.

Phases and iteration marks go into the calling thread's lane of the segment
(fixed binary records, names as ids of its string table); scalars, events,
run records, distributions, GPU intervals and relayed cycles go into its
message rings as small pickles. Nothing stays in this process's memory:
what was recorded is readable by the agent even after this process dies.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import pickle
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

from otel_rl._logging import logger, once
from otel_rl.agent import host
from otel_rl.shm import segment as shm
from otel_rl.agent.core import AgentConfig
from otel_rl.background import Deadline
from otel_rl.config import TelemetryConfig
from otel_rl.outputs.otel.user_providers import UserProviders
from otel_rl.training.recorder import (
    CORRELATE,
    FLOW,
    ITERATION_END,
    ITERATION_START,
    Recorder,
    _hotpath,
    phase_misuse,
)
from otel_rl.schema import PhaseSpec
from otel_rl.telemetry import Telemetry
from otel_rl.values import INT64_MAX, INT64_MIN

_logger = logger(__name__)
_RECORD = struct.Struct("<qqqqihBBii")
_MARSHALLED = frozenset({shm.SCALARS, shm.EVENT, shm.CUDA_FALLBACK})
"""Kinds whose records hold plain values (``marshal`` would turn an array into bytes: the others are pickled)."""
_LANE_IDENTITY = struct.Struct("<q24s")


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
        self._write = shm._u64(buffer, offset)
        self._read = shm._u64(buffer, offset + 8)
        self._dropped = shm._u64(buffer, offset + 16)
        shm._u64(buffer, offset + 24).value = capacity
        _LANE_IDENTITY.pack_into(buffer, offset + 32, thread_id, thread_name.encode("utf-8", "replace")[:23])

    @property
    def depth(self) -> int:
        return len(self.stack)

    def __len__(self) -> int:
        return self._write.value - self._read.value

    def detach(self) -> None:
        """Stop writing to shared memory; later records are dropped (counted here only)."""
        self.capacity = 0
        self._read = self._write = ctypes.c_uint64(0)
        self._dropped = ctypes.c_uint64(0)

    def append(self, record: tuple) -> None:
        head = record[0]
        intern = self.segment.intern
        if head is ITERATION_START or head is ITERATION_END:
            _, time_ns, timeline, index, env_steps, cpu = record
            kind = shm.ITERATION_START if head is ITERATION_START else shm.ITERATION_END
            fields = (time_ns, -1 if cpu is None else cpu, _int64(index, -1), _int64(env_steps, shm.NO_STEPS), intern(timeline), 0, kind, 0, -1, 0)
        elif head is FLOW:
            _, time_ns, flow_id, terminating, open_phases = record
            fields = (time_ns, 0, _low64(flow_id), 0, -1, open_phases, shm.FLOW, 1 if terminating else 0, -1, 0)
        elif head is CORRELATE:
            _, correlation, open_phases = record
            fields = (0, 0, _int64(correlation, 0), 0, -1, open_phases, shm.CORRELATE, 0, -1, 0)
        else:
            phase, start, end, depth, exc_type = record
            exc = -1 if exc_type is None else intern(exc_type)
            fields = (start, end, 0, 0, phase.id, depth, shm.PHASE, 0, exc, 0)
        write = self._write.value
        if write - self._read.value >= self.capacity:
            self.dropped += 1
            self._dropped.value = self.dropped
            return
        _RECORD.pack_into(self.segment.buffer, self.offset + shm.LANE_HEADER_BYTES + (write % self.capacity) * 48, *fields)
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
    return (shm.FOREIGN, kind.__name__, repr(item)[:1000])


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

    def after_fork(self) -> None:
        """In a forked child: the segment belongs to the parent, whose only writer each lane and ring must stay."""
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
            return self._lane_class(1, thread_id, thread_name)  # its records count as dropped
        if self.implementation == "c":
            return _hotpath.Lane(
                self.lane_capacity, thread_id, thread_name, buffer=self.segment.buffer, offset=offset, intern=self.segment.intern
            )
        return PyShmLane(self.segment, offset, self.lane_capacity, thread_id, thread_name)

    def new_phase(self, spec: PhaseSpec):
        phase_id = self.segment.intern(phase_name(spec))
        if self.implementation == "c":
            return self._phase_class(spec, self._key, self, phase_misuse, phase_id)
        phase = self._phase_class(spec, self.local, self, phase_misuse)
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
                kind |= shm.PICKLED
            except Exception as exc:  # an attribute no pickle can carry: the record is lost, loudly
                _logger.warning("otel-rl: a record could not be encoded (%s); dropped", exc, extra=once(f"encode:{kind}"))
                return False
        return self.segment.put(kind, payload)

    def add_scalars(self, record: tuple) -> None:
        if self._forked:
            return
        packed = self.segment.put_scalars(record)  # the common case: str keys, numbers
        if packed is None:
            packed = self._put(shm.SCALARS, record)
        if not packed:
            self.scalars_dropped += 1

    def add_distribution(self, record: tuple, nbytes: int) -> None:
        if not self._put(shm.DISTRIBUTION, record):
            self.distributions_dropped += 1

    def add_event(self, record: tuple) -> bool:
        if self._put(shm.EVENT, record):
            return True
        self.events_dropped += 1
        _logger.warning("otel-rl: event ring full; dropping new events", extra=once("event-ring-full"))
        return False

    def add_control(self, record: Any) -> None:
        if self._forked:  # a forked child: the segment is its parent's
            return
        if not self._put(shm.RUN, record):
            self.events_dropped += 1
            _logger.error("otel-rl: no room for a run record in the control ring; the agent will not see it")
        # An agent that takes over mid-run learns the open run from here (it missed its start record).
        self.segment.publish_run(pickle.dumps(record, protocol=5) if record.end_ns is None else b"")

    def add_device_interval(self, record: object) -> None:
        if not self._put(shm.DEVICE_INTERVAL, record):
            self.device_intervals_dropped += 1

    def add_cuda_fallback(self, timeline: str, name: str, reason: str) -> None:
        """A CUDA phase timed on the host: its spans say why."""
        self._put(shm.CUDA_FALLBACK, (timeline, name, reason))

    def add_remote(self, cycle: object) -> None:
        if not self._put(shm.REMOTE_CYCLE, cycle):
            self.remote_dropped += 1


OWN_AGENT_LINGER_S = 1.0
"""How long the agent started for this process waits, once idle, for late workers before it ends."""
NAMED_AGENT_LINGER_S = 10.0
"""How long an agent started by name waits, once idle: the other ranks of a job start within seconds."""


class ProducerTelemetry(Telemetry):
    """Telemetry whose outputs run in an agent: this process keeps only its recorder.

    The agent is a separate process (``agent="process"``: it outlives this one
    and reads what it wrote even after a SIGKILL) or a thread of this process
    (``agent="thread"``, the fallback where no process can be started or the
    configuration holds objects that cannot leave the process). Either runs
    the same :mod:`otel_rl.agent.core` on the same segment.

    What needs the outputs in this process behaves as follows: :meth:`flush`
    and :meth:`close` wait for the agent (within their deadline);
    :meth:`window_timings` reads the totals the agent publishes in the
    segment after each pass; ``tracer_provider`` and ``meter_provider`` are
    the thread agent's, or (agent process) providers of this process for the
    user's own spans and instruments; :meth:`add_sink` needs a thread agent.
    """

    def __init__(self, config: TelemetryConfig, sinks: list | None = None) -> None:
        self._host: host.ProcessHost | host.ThreadHost | None = None
        self._extra_sinks = list(sinks or [])
        self._user_providers = UserProviders(self._resource)
        super().__init__(config)

    def _new_recorder(self) -> Recorder:
        config = self.config
        mode, self._agent_name = config.agent, None
        if mode not in ("thread", "process"):  # the name of an agent that serves every producer that names it
            mode, self._agent_name = "process", config.agent
        kept = "extra sinks" if self._extra_sinks else host.travels(config) if mode == "process" else None
        if mode == "process" and kept:
            _logger.warning(
                "otel-rl: the configuration holds objects that cannot leave this process (%s); the agent runs on a thread",
                kept,
                extra=once("agent-thread"),
            )
            mode = "thread"
        agent_config = AgentConfig(replace(config, agent="off"), self.trace_id, self._parent_span_id, os.getpid(), self._started_ns)
        segment = None
        if mode == "process":
            try:
                if self._agent_name is None:  # this process's own agent, which its workers share
                    self._agent_name = f"run-{os.getpid()}-{os.urandom(3).hex()}"
                payload = pickle.dumps(agent_config)
                try:
                    segment = shm.Segment(host.segment_path(config, shm.agent_dir(self._agent_name)), payload, config.lane_capacity)
                except FileNotFoundError:  # its idle agent removed the directory just now: a new one is started
                    segment = shm.Segment(host.segment_path(config, shm.agent_dir(self._agent_name)), payload, config.lane_capacity)
            except (OSError, AttributeError) as exc:  # AttributeError: no os.posix_fallocate on this platform
                _logger.warning("otel-rl: no shared memory for the agent (%s); it runs on a thread", exc)
                mode = "thread"
        if segment is None:
            segment = shm.Segment(None, b"", config.lane_capacity)
        segment.set("clock_offset_ns", self._clock.offset_ns)
        self._mode = mode
        self._agent_config = agent_config
        self._segment = segment
        return SegmentRecorder(segment, segment.lane_capacity)

    def _build(self, config: TelemetryConfig, extra_sinks: list) -> None:
        self._otel = None
        self._pipeline = None
        if self._mode == "process":
            try:
                linger_s = NAMED_AGENT_LINGER_S if self.config.agent == self._agent_name else OWN_AGENT_LINGER_S
                self._host = host.ProcessHost(self._segment, linger_s)
                return
            except OSError as exc:  # no process can be started here: the same agent on a thread
                _logger.warning("otel-rl: the agent process could not start (%s); it runs on a thread", exc)
                self._mode, self._agent_name = "thread", None
                Path(self._segment.path).unlink(missing_ok=True)  # type: ignore[arg-type]
        self._host = host.ThreadHost(self._segment, self._agent_config, self._extra_sinks)

    def _abort(self) -> None:
        self._closed = True
        if self._host is not None:
            self._host.stop(Deadline(2.0))

    @property
    def tracer_provider(self):
        """The thread agent's provider; with an agent process, one of this process for the user's own spans."""
        outputs = self._host.outputs if self._host is not None else None
        return outputs.tracer_provider if outputs is not None else self._user_providers.tracer_provider()

    @property
    def meter_provider(self):
        """The thread agent's provider; with an agent process, one of this process for the user's own instruments."""
        outputs = self._host.outputs if self._host is not None else None
        return outputs.meter_provider if outputs is not None else self._user_providers.meter_provider()

    def _agent_counts(self) -> dict[str, Any]:
        """What the agent published after its last pass (it trails this process by one pass): totals and drops."""
        payload = self._segment.totals()
        return pickle.loads(payload) if payload else {}

    def _totals(self):
        return self._agent_counts().get("totals", ({}, {}))

    def add_sink(self, sink) -> None:
        outputs = self._host.outputs if self._host is not None else None
        if outputs is None:
            _logger.warning("otel-rl: add_sink() needs the agent on a thread (agent='thread'); %r not added", sink)
            return
        outputs.add_sink(sink)

    def flush(self, timeout_s: float = 5.0) -> bool:
        if self._closed:
            return True
        return self._host.flush(Deadline(timeout_s))  # type: ignore[union-attr]

    def _stop_outputs(self, deadline: Deadline) -> None:
        """Everything recorded is handed to the agent; returns when it has closed every output, or at the deadline."""
        self._host.stop(deadline, self._at_exit)  # type: ignore[union-attr]
        self._user_providers.shutdown(deadline)

    def _pending(self) -> dict[str, int]:
        segment = self._segment
        return {
            "phases": self._recorder.phases_pending,
            "messages": segment.control.pending() + segment.data.pending() if segment.control is not None else 0,
        }

    def stats(self) -> dict[str, Any]:
        counts = self._agent_counts()
        dropped = self._dropped()
        for queue, n in counts.get("dropped", {}).items():  # the outputs' queues, and the agent's own
            # The agent's lanes carry this process's lane drops (so its outputs report them): not counted twice.
            dropped[queue] = max(dropped.get(queue, 0), n) if queue == "phases" else dropped.get(queue, 0) + n
        return {
            "pending": self._pending(),
            "dropped": dropped,
            "spans_sampled_out": counts.get("spans_sampled_out", 0),
            "agent": self._mode,
            "agent_pid": self._agent_pid(),
        }

    def _agent_pid(self) -> int | None:
        """The pid of the agent serving this process (None before one attached, and for a thread agent)."""
        if self._mode != "process" or self._segment.control is None:
            return None
        return self._segment.get("agent_pid") or None

    def _workers_agent(self) -> str | None:
        return self._agent_name if self._mode == "process" else None
