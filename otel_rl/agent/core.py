"""The agent: reads a producer's segment and feeds the outputs built from its configuration.

The outputs are an ordinary :class:`otel_rl.telemetry.Telemetry` of the
producer's configuration (pipeline, OTLP, ``motrix.metrics/v1``, Perfetto,
summary, panel, trackers), built in the agent's host: a separate process
(``otel-rl agent``), or a thread of the producer when no process can be
started. Each pass moves what the producer wrote since the last one into the
outputs' recorder queues, in the producer's order, and runs one pipeline
pass.

The producer is watched: when it dies without closing (SIGKILL, OOM kill,
segfault, a second SIGTERM), everything it wrote is still in the segment; the
agent reads it all, ends an open run as ``killed`` (with the signal when the
kernel still tells it) or ``failed`` (with the exit code), and closes every
output.
"""

from __future__ import annotations

import logging
import marshal
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
from dataclasses import dataclass, replace
from time import perf_counter_ns
from typing import Any, Callable

import numpy as np

from otel_rl import schema
from otel_rl._logging import logger, once
from otel_rl.background import pid_alive
from otel_rl.shm import segment as shm
from otel_rl.training.recorder import CORRELATE, FLOW, ITERATION_END, ITERATION_START, PyLane
from otel_rl.core.records import RunRecord

_logger = logger(__name__)

RECORDS_PER_PASS = 65_536
"""Lane records moved per lane and pass at most (what the outputs' lanes hold)."""
MESSAGE_BYTES_PER_PASS = 64 << 20
CONTROL_POLL_S = 0.05
"""How often the agent reads the producer's requests (close, flush) between passes."""


@dataclass(frozen=True)
class AgentConfig:
    """What the producer hands its agent (pickled into the segment)."""

    config: Any
    """The producer's :class:`otel_rl.config.TelemetryConfig`, with ``agent="off"`` (the outputs run where the agent runs)."""
    trace_id: int
    parent_span_id: int | None
    pid: int
    started_ns: int
    """When the producer called :func:`otel_rl.init` (the run's ``pending`` record)."""


class _Replayed:
    """Stands for a producer's phase in a replayed raw record: the pipeline reads only ``spec``."""

    __slots__ = ("spec",)

    def __init__(self, spec: Any) -> None:
        self.spec = spec


class Agent:
    """Moves one producer's records into ``outputs`` (a Telemetry whose pipeline this agent drives)."""

    def __init__(self, reader: shm.SegmentReader, outputs: Any, takeover: bool = False) -> None:
        """``takeover``: another agent read this segment before; the open run is learned from the segment."""
        self.reader = reader
        self.outputs = outputs
        self._recorder = outputs._recorder
        self._lanes: list[PyLane] = []
        self._phases: dict[int, _Replayed | None] = {}
        self.run: RunRecord | None = None
        """The open run (its start record), None before it starts and after it ends."""
        self.last_ns = 0
        published = reader.run() if takeover else None
        if published:
            # Its start was written by the previous agent: only the spans' parent and the panel need it here.
            self.run = pickle.loads(published)
            if outputs._otel is not None:
                outputs._otel.on_run(self.run)
            self._note_num_envs(self.run)

    def _note_num_envs(self, run: RunRecord) -> None:
        num_envs = run.attributes.get("num_envs")
        self.outputs._num_envs = num_envs if isinstance(num_envs, int) else None

    def pump(self) -> int:
        """One pass: move everything written since the last pass, then run the pipeline; returns records moved."""
        reader = self.reader
        names = reader.update_names()
        moved = 0
        for index, (thread_id, thread_name, dropped) in enumerate(reader.lanes()):
            if index == len(self._lanes):
                lane = PyLane(RECORDS_PER_PASS * 2, thread_id, thread_name)
                with self._recorder._lanes_lock:
                    self._recorder.lanes.append(lane)
                self._lanes.append(lane)
            lane = self._lanes[index]
            lane.dropped = dropped
            records = reader.take_lane(index, RECORDS_PER_PASS)
            if len(records):
                lane.records.extend(self._decode(records, names))
                moved += len(records)
        control = reader.control.take(MESSAGE_BYTES_PER_PASS)
        data = reader.data.take(MESSAGE_BYTES_PER_PASS)
        ends = []
        for kind, payload in control:
            decoded = self._decode_message(kind, payload)
            if decoded is None:
                continue
            if decoded[0] == shm.RUN and decoded[1].end_ns is not None:
                ends.append(decoded[1])  # after the data written before it
            else:
                self._route(*decoded)
        for kind, payload in data:
            decoded = self._decode_message(kind, payload)
            if decoded is not None:
                self._route(*decoded)
        for record in ends:
            self._route(shm.RUN, record)
        moved += len(control) + len(data)
        self.outputs._pipeline.drain()
        self.publish()
        return moved

    def publish(self) -> None:
        """Hand the producer what it reports without the outputs: totals for ``window_timings()``, drops for ``stats()``."""
        outputs = self.outputs
        counts = {
            "totals": outputs._aggregates.totals(),
            "dropped": outputs._dropped(),
            "spans_sampled_out": outputs._otel.budget.sampled_out,
        }
        self.reader.publish_totals(pickle.dumps(counts))

    def _decode_message(self, kind: int, payload: bytes) -> tuple[int, Any] | None:
        """A message's record; None (one warning per kind, counted) when it cannot be read here."""
        try:
            return _decode_message(kind, payload, self.reader)
        except Exception as exc:  # a pickled class this process cannot import, say
            self.outputs._drops.add("agent_decode", str(kind & ~shm.PICKLED))
            _logger.warning("otel-rl: agent: a record of kind %d could not be read (%s); dropped", kind & ~shm.PICKLED, exc, extra=once(f"agent-decode:{kind}"))
            return None

    def _route(self, kind: int, record: Any) -> None:
        recorder = self._recorder
        seq = next(self.outputs._seq)  # one writer numbers every record: the agent, in the producer's order
        if kind == shm.SCALARS:
            recorder.add_scalars((*record[:-1], seq))
            self.last_ns = max(self.last_ns, record[0])
        elif kind == shm.EVENT:
            recorder.add_event((*record[:-1], seq))
            self.last_ns = max(self.last_ns, record[0])
        elif kind == shm.RUN:
            record = replace(record, seq=seq)
            if record.end_ns is None:
                self.run = record
                self._note_num_envs(record)
            else:
                self.run = None
            recorder.add_control(record)
        elif kind == shm.DISTRIBUTION:
            recorder.add_distribution((*record[:-1], seq), record[2].nbytes)
        elif kind == shm.DEVICE_INTERVAL:
            recorder.add_device_interval(record)
        elif kind == shm.REMOTE_CYCLE:
            recorder.add_remote(record)
        elif kind == shm.CUDA_FALLBACK:
            timeline, name, reason = record
            self.outputs._otel.cuda_fallback[(timeline, name)] = reason

    def _decode(self, records: Any, names: list[str]) -> list[tuple]:
        """Lane records as the raw tuples :class:`otel_rl.core.pipeline.Pipeline` reads."""
        out = []
        phases = self._phases
        for start, end, a, b, name, depth, kind, flags, exc, _ in records.tolist():
            if kind == shm.PHASE:
                phase = phases.get(name)
                if phase is None and name not in phases:
                    phase = phases[name] = self._phase(name, names)
                if phase is None:
                    continue
                out.append((phase, start, end, depth, names[exc] if 0 <= exc < len(names) else None))
                self.last_ns = max(self.last_ns, end)
            elif kind == shm.ITERATION_START or kind == shm.ITERATION_END:
                timeline = names[name] if 0 <= name < len(names) else schema.LEARNER
                tag = ITERATION_START if kind == shm.ITERATION_START else ITERATION_END
                out.append((tag, start, timeline, a, None if b == shm.NO_STEPS else b, None if end < 0 else end))
                self.last_ns = max(self.last_ns, start)
            elif kind == shm.FLOW:
                out.append((FLOW, start, a % 2**64, bool(flags), depth))
            elif kind == shm.CORRELATE:
                out.append((CORRELATE, a, depth))
        return out

    @staticmethod
    def _phase(name_id: int, names: list[str]) -> _Replayed | None:
        if not 0 <= name_id < len(names) or "\t" not in names[name_id]:
            _logger.warning("otel-rl: agent: a phase record names no phase (id %d); skipped", name_id)
            return None
        timeline, name = names[name_id].split("\t", 1)
        return _Replayed(schema.phase_spec(timeline, name))

    def end_run(self, status: str, reason: str) -> None:
        """End the open run as the producer could not (it died): after everything it wrote."""
        if self.run is None:
            return
        clock = self.outputs._clock
        end_ns = clock.to_epoch_ns(self.last_ns) if self.last_ns else clock.now_ns()
        self._route(shm.RUN, RunRecord(status, self.run.start_ns, max(end_ns, self.run.start_ns), reason, {"detected_by": "agent"}))
        self.outputs._pipeline.drain()

    def record_death(self, status: str, reason: str) -> None:
        """A producer without an open run (a worker) died: a ``process_died`` event closes its timeline."""
        attributes = {"status": status, "reason": reason, "pid": self.outputs._producer_pid or 0, "detected_by": "agent"}
        self._route(shm.EVENT, (max(self.last_ns, perf_counter_ns()), schema.EVENT_PROCESS_DIED, attributes, 0))
        self.outputs._pipeline.drain()


def _decode_message(kind: int, payload: bytes, reader: shm.SegmentReader) -> tuple[int, Any]:
    if kind == shm.SCALARS_PACKED:
        return shm.SCALARS, _unpack_scalars(payload, reader)
    if kind & shm.PICKLED:
        return kind & ~shm.PICKLED, pickle.loads(payload)
    return kind, _restore(marshal.loads(payload))


_ENTRY = struct.Struct("<IB3xd")
""":data:`segment.SCALAR_ENTRY`, for the entries that are not all floats."""
_INT64 = struct.Struct("<q")


def _unpack_scalars(payload: bytes, reader: shm.SegmentReader) -> tuple:
    time_ns, step, iteration, env_steps, count, _ = shm.SCALARS_HEADER.unpack_from(payload)
    start = shm.SCALARS_HEADER.size
    names = reader.names
    entries = np.frombuffer(payload, shm.SCALAR_ENTRY, count, start)
    keys = entries["key"].tolist()
    if keys and max(keys) >= len(names):  # interned after this pass read the table
        names = reader.update_names()
    tags = payload[start + 4 : start + count * _ENTRY.size : _ENTRY.size]  # one byte per entry
    if tags.count(shm.VALUE_FLOAT) == count:  # the common case, in C: every value a float
        values: dict[str, Any] = dict(zip(map(names.__getitem__, keys), entries["value"].tolist()))
    else:
        values = {}
        for index, (key, tag, value) in enumerate(_ENTRY.iter_unpack(payload[start : start + count * _ENTRY.size])):
            if tag == shm.VALUE_FLOAT:
                values[names[key]] = value
            elif tag == shm.VALUE_NONE:
                values[names[key]] = None
            else:  # the same 8 bytes as a signed integer
                integer = _INT64.unpack_from(payload, start + index * _ENTRY.size + 8)[0]
                values[names[key]] = bool(integer) if tag == shm.VALUE_BOOL else integer
    axes = [None if v == shm.NO_STEPS else v for v in (step, iteration, env_steps)]
    return (time_ns, values, *axes, 0)


_STAND_INS: dict[str, type] = {}


def _restore(item: Any) -> Any:
    """Stand-ins of odd keys and values (see :data:`segment.FOREIGN`) as objects with their type's name and repr.

    The pipeline's checks then word their warnings as they would for the original.
    """
    kind = type(item)
    if kind is dict:
        return {_restore(k): _restore(v) for k, v in item.items()} if any(type(k) is tuple or type(v) is tuple for k, v in item.items()) else item
    if kind is tuple:
        if len(item) == 3 and item[0] == shm.FOREIGN:
            stand_in = _STAND_INS.get(item[1])
            if stand_in is None:
                stand_in = _STAND_INS[item[1]] = type(item[1], (_StandIn,), {})
            return stand_in(item[2])
        return tuple(_restore(v) for v in item)
    return item


class _StandIn:
    __slots__ = ("_repr",)

    def __init__(self, text: str) -> None:
        self._repr = text

    def __repr__(self) -> str:
        return self._repr

    __str__ = __repr__


class LogForwarder(logging.Handler):
    """The agent process's otel-rl log records, sent to a producer, which logs them as its own.

    Warnings about a producer's input then reach the training process's
    logging (its handlers, its files), not only the terminal. A record goes to
    the producer whose segment the logging thread serves (see :meth:`serving`);
    one from another thread (an exporter's) goes to the first producer still
    alive; with none, to stderr.
    """

    _current = threading.local()

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._producers: list[tuple[shm.SegmentReader, int]] = []
        self._lock = threading.Lock()

    @classmethod
    def serving(cls, reader: shm.SegmentReader, pid: int) -> None:
        """Records logged on this thread from now on are the producer ``pid``'s."""
        cls._current.producer = (reader, pid)

    def add(self, reader: shm.SegmentReader, pid: int) -> None:
        with self._lock:
            self._producers.append((reader, pid))

    def remove(self, reader: shm.SegmentReader) -> None:
        with self._lock:
            self._producers = [p for p in self._producers if p[0] is not reader]

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            payload = marshal.dumps((record.levelno, record.name, message))
            current = getattr(self._current, "producer", None)
            with self._lock:
                candidates = [current] if current is not None else list(self._producers)
            for reader, pid in candidates:
                if reader.logs is not None and pid_alive(pid) and reader.logs.put(shm.LOG, payload, reader.logs.capacity):
                    return
            sys.stderr.write(message + "\n")
        except Exception:
            self.handleError(record)

    @classmethod
    def install(cls) -> LogForwarder:
        forwarder = cls()
        logging.getLogger("otel_rl").addHandler(forwarder)
        return forwarder


def relay_logs(segment: shm.Segment) -> None:
    """Log, in the producer, what the agent forwarded (see :class:`LogForwarder`)."""
    logs = segment.logs
    if logs is None:
        return
    for _, payload in logs.take(shm.LOG_BYTES):
        try:
            level, name, message = marshal.loads(payload)
        except (ValueError, EOFError, TypeError):
            continue
        logging.getLogger(name).log(level, "%s", message)


class ProducerWatch:
    """Whether the producer process lives, and how it ended.

    ``/proc/<pid>/stat`` tells apart a reused pid (its start time) and, while
    the dead process waits for its parent to collect it, its wait status.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        stat = self._stat()
        self._started = stat[1] if stat else None
        try:  # readable the moment the process exits: the agent wakes while its wait status is still there
            self._pidfd: int | None = os.pidfd_open(pid) if pid != os.getpid() else None
        except (AttributeError, OSError):
            self._pidfd = None

    def wait(self, timeout_s: float) -> None:
        """Sleep ``timeout_s``, or less if the producer exits meanwhile."""
        if self._pidfd is None:
            time.sleep(timeout_s)
        else:
            select.select([self._pidfd], [], [], timeout_s)

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _stat(self) -> tuple[str, int | None, int | None] | None:
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                text = f.read().decode("ascii", "replace")
        except OSError:
            return None
        fields = text[text.rindex(")") + 2 :].split()
        state, started = fields[0], int(fields[19])
        exit_code = int(fields[49]) if len(fields) > 49 else None
        return state, started, exit_code

    def ended(self) -> tuple[str, str] | None:
        """None while the producer lives; else ``(status, reason)`` for a run it left open."""
        if self._started is None:  # no /proc here (or the producer was gone before the agent looked)
            return None if pid_alive(self.pid) else ("killed", "the process disappeared without ending its run")
        stat = self._stat()
        if stat is not None and stat[1] == self._started and stat[0] not in ("Z", "X"):
            return None
        if stat is not None and stat[1] == self._started and stat[2] is not None:
            wait_status = stat[2]
            if os.WIFSIGNALED(wait_status):
                number = os.WTERMSIG(wait_status)
                return "killed", f"killed by {signal.Signals(number).name}" if number in signal.valid_signals() else f"killed by signal {number}"
            code = os.WEXITSTATUS(wait_status)
            return "failed", f"exited with code {code} before ending its run"
        return "killed", "the process disappeared without ending its run (SIGKILL, OOM kill or os._exit)"


def serve(
    reader: shm.SegmentReader,
    outputs: Any,
    pid: int,
    interval_s: float,
    deadline_s: float,
    takeover: bool = False,
    before_close: Callable[[], None] | None = None,
) -> None:
    """Run the agent until its producer closes or dies, then close the outputs within ``deadline_s``.

    ``before_close`` runs first when it ends (a learner's agent waits there for its workers' outputs).
    """
    agent = Agent(reader, outputs, takeover)
    watch = ProducerWatch(pid)
    reader.set("agent_pid", os.getpid())
    reader.set("agent_state", shm.AGENT_ATTACHED)
    next_pass = 0.0
    try:
        while True:
            # The header is read every CONTROL_POLL_S: a close or flush never waits for the next pass.
            closing = reader.get("state") == shm.CLOSING
            ended = None if closing else watch.ended()
            request = reader.get("flush_request")
            flushing = request > reader.get("flush_done")
            if closing or ended is not None or flushing or time.monotonic() >= next_pass:
                while agent.pump():  # until the segment is empty
                    pass
                next_pass = time.monotonic() + interval_s
            if closing or ended is not None:
                break
            if flushing:
                outputs.flush(deadline_s)
                reader.set("flush_done", request)
            watch.wait(min(interval_s, CONTROL_POLL_S))
        if ended is not None and agent.run is not None:
            agent.end_run(*ended)
        elif ended is not None:
            agent.record_death(*ended)
    finally:
        watch.close()
        try:
            if before_close is not None:
                before_close()
        finally:
            outputs.close(deadline_s)
            agent.publish()  # what closing dropped, for the producer's last stats()
            reader.set("agent_state", shm.AGENT_DONE)


def attach(reader: shm.SegmentReader) -> int:
    """Count this agent among the segment's; returns how many served it before (0: this one writes the outputs first)."""
    before = reader.get("agents") if reader.get("agent_state") != shm.AGENT_NONE else 0
    reader.set("agents", max(before, reader.get("agents")) + 1)
    return before
