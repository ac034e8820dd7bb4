"""The pipeline thread: raw recorder buffers in, assembled records out to sinks.

It wakes every ``interval_s`` (or when flushed), drains every lane, rebuilds
phase nesting and iterations, and calls each sink. Sinks run on this thread
and must not block: a sink that does IO hands records to its own bounded queue
and worker. An exception in a sink is logged once and never reaches training.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns

from otel_rl.recorder import ITERATION_END, ITERATION_START, Lane, Phase, Recorder, warn_once
from otel_rl.records import EventRecord, IterationRecord, PhaseRecord, RunRecord, ScalarsRecord
from otel_rl.values import finite_or_none

_logger = logging.getLogger(__name__)


class Clock:
    """Converts ``perf_counter_ns()`` readings to epoch nanoseconds.

    Calibrated once: the offset is taken from the tightest of a few
    (monotonic, wall, monotonic) samples, so all records share one timebase
    and wall-clock steps during the run do not reorder them.
    """

    def __init__(self, samples: int = 7) -> None:
        best: tuple[int, int] | None = None
        for _ in range(samples):
            before = perf_counter_ns()
            wall = time.time_ns()
            after = perf_counter_ns()
            width = after - before
            if best is None or width < best[0]:
                best = (width, wall - (before + after) // 2)
        assert best is not None
        self.offset_ns = best[1]

    def to_epoch_ns(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.offset_ns

    def now_ns(self) -> int:
        return perf_counter_ns() + self.offset_ns


class RecordSink:
    """Receiver of assembled records, called on the pipeline thread.

    Every method has a no-op default. Implementations must return quickly.
    """

    def on_run(self, run: RunRecord) -> None:
        """Run started (``run.end_ns is None``) or ended."""

    def on_iteration(self, iteration: IterationRecord) -> None:
        """A completed cycle and its phases."""

    def on_phase(self, phase: PhaseRecord) -> None:
        """A top-level phase recorded outside any iteration of its thread."""

    def on_scalars(self, record: ScalarsRecord) -> None:
        """One ``scalars()`` call, values already made finite or None."""

    def on_event(self, event: EventRecord) -> None:
        """A named event."""

    def on_drain(self, now_ns: int) -> None:
        """End of one pipeline pass: a chance to emit windowed aggregates."""

    def flush(self, timeout_s: float) -> bool:
        """Push out everything received so far, within ``timeout_s``."""
        return True

    def shutdown(self, timeout_s: float) -> None:
        """Flush and release resources within ``timeout_s``. Called once."""


@dataclass
class _LaneState:
    """Assembly state of one lane between pipeline passes."""

    children_by_depth: dict[int, list[PhaseRecord]] = field(default_factory=dict)
    open_iterations: dict[str, tuple[int, int, int | None, list[PhaseRecord]]] = field(default_factory=dict)


class Pipeline:
    """Drains a :class:`Recorder` into sinks on a daemon thread."""

    def __init__(self, recorder: Recorder, sinks: Sequence[RecordSink], clock: Clock, interval_s: float = 0.1) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        self._recorder = recorder
        self.sinks = list(sinks)
        self._clock = clock
        self._interval_s = interval_s
        self._lane_states: dict[int, _LaneState] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._failed_sinks: set[str] = set()
        self.seen_nonfinite: set[str] = set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="otel-rl-pipeline", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if self._stopping:
                break
            self.drain()

    def drain(self, timeout_s: float = -1) -> bool:
        """One pass over all buffers; False if the lock was not had in time."""
        if not self._lock.acquire(timeout=timeout_s):
            return False
        try:
            self._drain_locked()
        except Exception:  # never let a bug here kill the thread
            _logger.exception("otel-rl: pipeline pass failed")
        finally:
            self._lock.release()
        return True

    def flush(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        if not self.drain(timeout_s):
            return False
        ok = True
        for sink in self.sinks:
            left = max(deadline - time.monotonic(), 0.0)
            ok = bool(self._call(sink, "flush", left)) and ok
        return ok

    def shutdown(self, timeout_s: float) -> None:
        """Final drain, then shut every sink down, all within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        self._stopping = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(min(deadline - time.monotonic(), 1.0), 0.0))
        self.drain(max(deadline - time.monotonic(), 0.0))
        for sink in self.sinks:
            self._call(sink, "shutdown", max(deadline - time.monotonic(), 0.0))

    # -- assembly -------------------------------------------------------

    def _drain_locked(self) -> None:
        events = self._recorder.events
        ends: list[RunRecord] = []
        for _ in range(len(events)):
            item = events.popleft()
            if isinstance(item, RunRecord):
                if item.end_ns is None:
                    self._fanout("on_run", item)
                else:
                    ends.append(item)
            else:
                time_ns, name, attributes = item
                self._fanout("on_event", EventRecord(self._clock.to_epoch_ns(time_ns), name, attributes))
        for lane in self._recorder.snapshot_lanes():
            self._drain_lane(lane)
        scalars = self._recorder.scalars
        for _ in range(len(scalars)):
            self._fanout("on_scalars", self._scalars_record(scalars.popleft()))
        for run in ends:
            self._fanout("on_run", run)
        self._fanout("on_drain", self._clock.now_ns())

    def _scalars_record(self, raw: tuple) -> ScalarsRecord:
        time_ns, values, step, iteration, env_steps = raw
        clean: dict[str, float | int | None] = {}
        for key, value in values.items():
            clean[key] = cleaned = finite_or_none(key, value)
            if cleaned is None and key not in self.seen_nonfinite:
                self.seen_nonfinite.add(key)
                self._fanout(
                    "on_event",
                    EventRecord(self._clock.to_epoch_ns(time_ns), "nonfinite", {"key": key, "value": repr(value)}),
                )
        return ScalarsRecord(self._clock.to_epoch_ns(time_ns), clean, step, iteration, env_steps)

    def _drain_lane(self, lane: Lane) -> None:
        records = lane.records
        if not records:
            return
        state = self._lane_states.setdefault(id(lane), _LaneState())
        to_epoch = self._clock.to_epoch_ns
        for _ in range(len(records)):
            raw = records.popleft()
            head = raw[0]
            if isinstance(head, Phase):
                _, start, end, depth, exc_type = raw
                phase = PhaseRecord(
                    head.spec,
                    to_epoch(start),
                    to_epoch(end),
                    depth,
                    lane.thread_id,
                    lane.thread_name,
                    error=exc_type.__name__ if exc_type is not None else None,
                    children=state.children_by_depth.pop(depth + 1, []),
                )
                if depth == 0:
                    self._place_top_level(state, phase)
                else:
                    state.children_by_depth.setdefault(depth, []).append(phase)
            elif head == ITERATION_START:
                _, start, timeline, index, env_steps = raw
                state.open_iterations[timeline] = (to_epoch(start), index, env_steps, [])
            elif head == ITERATION_END:
                _, end, timeline, index, env_steps = raw
                opened = state.open_iterations.pop(timeline, None)
                if opened is None:  # its start was dropped with an overflow
                    continue
                start_ns, index, env_steps, phases = opened
                state.children_by_depth.clear()
                self._emit_iteration(
                    IterationRecord(
                        timeline, index, env_steps, start_ns, to_epoch(end), lane.thread_id, lane.thread_name, phases
                    )
                )

    def _place_top_level(self, state: _LaneState, phase: PhaseRecord) -> None:
        # A top-level phase belongs to the open iteration of its own timeline;
        # otherwise it is a loose phase (a collector without cycles, say).
        opened = state.open_iterations.get(phase.spec.timeline)
        if opened is not None and phase.start_ns >= opened[0]:
            for node in phase.walk():
                node.iteration = opened[1]
                node.env_steps = opened[2]
            opened[3].append(phase)
        else:
            self._fanout("on_phase", phase)

    def _emit_iteration(self, iteration: IterationRecord) -> None:
        if iteration.accounted_ns > iteration.wall_ns:
            warn_once(
                f"contract:{iteration.timeline}",
                "otel-rl: contract warning: %s iteration %d accounts %.3f ms of phases in %.3f ms of wall time "
                "(top-level phases overlap or run on other threads)",
                iteration.timeline,
                iteration.index,
                iteration.accounted_ns / 1e6,
                iteration.wall_ns / 1e6,
            )
        self._fanout("on_iteration", iteration)

    def _fanout(self, method: str, record: object) -> None:
        for sink in self.sinks:
            self._call(sink, method, record)

    def _call(self, sink: RecordSink, method: str, *args: object) -> object:
        try:
            return getattr(sink, method)(*args)
        except Exception:
            key = f"{type(sink).__name__}.{method}"
            if key not in self._failed_sinks:
                self._failed_sinks.add(key)
                _logger.exception("otel-rl: sink %s failed (further failures of it are not logged)", key)
            return None
