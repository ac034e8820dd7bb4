"""What the experiment-tracker outputs (TensorBoard, W&B) share: one sink shape, one queue, one thread each.

:class:`TrackerSink` turns the pipeline's records into small tuples for a
:class:`TrackerWriter`, whose own thread hands them to the tracker's library;
the pipeline thread only appends. The items, in the order they were recorded:

- ``("start", time_ns, attributes)``: the run began (``attributes`` of the
  ``running`` record: ``config``, ``provenance``, ``resumed``...).
- ``("scalars", time_ns, step, values, axes)``: one ``scalars()`` call (values
  are numbers or None for non-finite), and ``Perf/*`` phase timings per window.
  ``axes`` (or None) holds :data:`AXIS_ITERATION` and :data:`AXIS_ENV_STEPS`
  in the first item of each iteration: written beside the values, so a chart can be switched to
  either axis (seed 003's ``axis/*`` scalars; W&B's x axis is any logged key).
- ``("distribution", time_ns, step, key, histogram)``: one ``distribution()``
  call: its :class:`otel_rl.core.distributions.Histogram`.
- ``("event", time_ns, step, name, attributes)``: a named event, at the step
  of the last scalars recorded before it (else of the latest iteration).
- ``("media", time_ns, step, attributes)``: a video or image written to the
  run folder (``attributes`` of the ``media`` record: ``key``, ``type``,
  ``path`` under :attr:`TrackerWriter.media_root`...), for a tracker that
  has a ``media_root``.
- ``("end", time_ns, status, reason)``: the run ended.

``step`` is the call's ``step``, else the env-step count (as in
``metrics.jsonl``), else the iteration: a loop that gives neither still has
an axis, never every point at step 0. After a resume the steps never go
back (AReaL's ``max(global_step, last_commit_step + 1)``): while the loop's
steps are behind the earlier parts' last one, each step it gives is written
at the next free step after it (the records of one step stay together), until
the loop's own steps pass them. The queue is bounded: past :data:`CAPACITY` the oldest
scalars and distributions make room (counted under the output's name);
lifecycle and events are kept. A tracker that fails is warned about once
and stops; what it would have written is counted as dropped.

At close a tracker gets what it took: in an agent process (where nothing
waits on it) a writer still behind at the producer's deadline goes on for up
to :data:`BACKGROUND_S` after it (:meth:`TrackerSink.go_on_after`), and the
producer's end line says how many records it had yet to hand over
(:attr:`TrackerSink.behind`); where it shares the training process (the
thread host) what the deadline leaves is counted as dropped, and the end line
says so. ``metrics.jsonl`` holds every one of them either way.
"""

from __future__ import annotations

import contextlib
import os
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otel_rl.formats import lifecycle, schema
from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.base.log import logger
from otel_rl.base.loops import BackgroundLoop
from otel_rl.core.batches import ScalarBatch
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import DistributionRecord, EventRecord, RunEnd, RunStart, ScalarsRecord

_logger = logger(__name__)

CAPACITY = 100_000
AXIS_ITERATION = "axis/iteration"
"""The loop's iteration, written beside its scalars: TensorBoard's and W&B's second axis."""
AXIS_ENV_STEPS = "axis/env_steps_total"
"""The env steps so far (the iteration where the loop gives none), written beside its scalars."""
_DROPPABLE = ("scalars", "distribution")
_LIFECYCLE = ("start", "end")
BACKGROUND_S = 120.0
"""How long an agent process goes on handing a tracker the records it took, after the producer's close deadline."""
HANDOVER_S = 0.5
"""How long before the producer's deadline a tracker still writing stops being waited for (its count must reach the producer)."""
RELEASE_S = 15.0
"""How long a tracker's run may take to end (W&B's ``finish``) once its records are handed over, in the background."""
WRITE_SLICE = 256
"""Items handed to :meth:`TrackerWriter.write` at a time: what is still on its way is known to within one slice."""


class TrackerWriter(BackgroundLoop, ABC):
    """Hands queued items to a tracker on its own thread; subclasses implement :meth:`write`.

    Args:
        name: the output's name: its thread is ``otel-rl-<name>``, its drops are counted under it.
        drops: the shared drop counters.
    """

    title = "a tracker"
    """How the end line names it (``W&B``, ``SwanLab``...)."""

    stop_at_exit = True  # its SDK may still be at work when the process exits (see BackgroundLoop.stop_at_exit)

    def __init__(self, name: str, drops: Drops, interval_s: float = 1.0) -> None:
        super().__init__(f"otel-rl-{name}", interval_s)
        self.output = name
        self._drops = drops
        self._queue: deque[tuple] = deque()
        self._lock = threading.Lock()
        self._writing = 0  # records of the slice being written
        self.failed = False
        self.media_root: Path | None = None
        """The run folder a ``media`` item's ``path`` is in (None: this tracker gets no media)."""

    def put(self, item: tuple) -> None:
        """Queue one item (pipeline thread); past :data:`CAPACITY` the oldest scalars make room."""
        with self._lock:
            queue = self._queue
            if len(queue) >= CAPACITY:
                for index, old in enumerate(queue):
                    if old[0] in _DROPPABLE:
                        del queue[index]
                        self._drops.add(self.output, old[0])
                        break
                else:
                    self._drops.add(self.output, item[0])
                    return
            queue.append(item)

    def has_work(self) -> bool:
        return bool(self._queue) and not self.failed

    def behind(self) -> int:
        """Records taken and not yet handed to the tracker (queued, or in the slice being written); 0 once it failed (counted as dropped)."""
        if self.failed:
            return 0
        with self._lock:
            return self._writing + sum(1 for item in self._queue if item[0] not in _LIFECYCLE)

    def run_once(self) -> None:
        while True:
            with self._lock:
                items = [self._queue.popleft() for _ in range(min(WRITE_SLICE, len(self._queue)))]
                self._writing = sum(1 for item in items if item[0] not in _LIFECYCLE)
            if not items:
                return
            try:
                if self.failed:
                    self._drops.add(self.output, "records", len(items))
                    continue
                try:
                    self.write(items)
                except Exception as exc:
                    self.failed = True
                    self._drops.add(self.output, "records", len(items))
                    _logger.warning("otel-rl: %s output failed (%s: %s); it stops, training goes on", self.output, type(exc).__name__, exc, exc_info=True)
            finally:
                with self._lock:
                    self._writing = 0

    def abandon(self) -> int:
        """At the thread's end: the records still queued are lost to the tracker (counted as dropped); how many."""
        with self._lock:
            left = [item for item in self._queue if item[0] not in _LIFECYCLE]
            self._queue.clear()
        if left and not self.failed:
            self._drops.add(self.output, "records", len(left))
        return len(left)

    @abstractmethod
    def write(self, items: list[tuple]) -> None:
        """Write ``items`` (see the module docstring); an exception stops this output."""

    def skipped(self, item: tuple) -> None:
        """Count one item that could not be converted (the rest of the batch goes on), warned once per kind."""
        self._drops.add(self.output, item[0])
        _logger.warning("otel-rl: could not write a %s record to %s; skipped", item[0], self.output, exc_info=True)


class RowWriter(TrackerWriter):
    """A tracker whose run takes rows of values at a step (Trackio, SwanLab); subclasses start, log and end it.

    Scalars are rows (with the axes beside them), distributions the tracker's
    histogram where it has one (:meth:`histogram`; their statistics are
    scalars anyway), an event its count series ``events/<name>/count`` at the
    step it happened. The run starts on this output's thread with the run's
    configuration and provenance (:func:`run_provenance`).
    """

    def __init__(self, name: str, drops: Drops) -> None:
        super().__init__(name, drops)
        self.run: Any = None
        self._ended = False
        self._events: dict[str, int] = {}

    def write(self, items: list[tuple]) -> None:
        for item in items:
            kind = item[0]
            if kind == "start":
                if self.run is None:
                    self.run = self.begin(item[2])
                continue
            if self.run is None:  # a part whose start was recorded before this output existed
                self.run = self.begin(None)
            try:
                if kind == "scalars":
                    _, _, step, values, axes = item
                    row = {k: v for k, v in values.items() if v is not None}
                    if row:
                        self.log({**row, **axes} if axes else row, step)
                elif kind == "distribution":
                    _, _, step, key, histogram = item
                    value = None if histogram is None else self.histogram(histogram)
                    if value is not None:
                        self.log({key: value}, step)
                elif kind == "event":
                    _, _, step, name, _ = item
                    self._events[name] = self._events.get(name, 0) + 1
                    self.log({f"events/{name}/count": self._events[name]}, step)
                elif kind == "media" and self.media_root is not None:
                    _, _, step, attributes = item
                    value = self.media(self.media_root / attributes["path"], attributes)
                    if value is not None:
                        self.log({attributes["key"]: value}, step)
                elif kind == "end" and not self._ended:
                    self._ended = True
                    self.end(item[2], item[3])
            except Exception:  # one bad item costs itself
                self.skipped(item)

    def release(self) -> None:
        """The thread's last act: a run still open (its end not recorded) is ended as finished."""
        if self.run is not None and not self._ended:
            self._ended = True
            try:
                self.end(lifecycle.FINISHED, None)
            except Exception:  # the tracker failing on the way out: nothing left to save
                _logger.warning("otel-rl: the %s run did not end cleanly", self.output, exc_info=True)

    @abstractmethod
    def begin(self, started: RunStart | None) -> Any:
        """Start the tracker's run (``started``: the run's start record, None when it was not seen) and return it."""

    @abstractmethod
    def log(self, row: dict[str, Any], step: int | None) -> None:
        """Log ``row`` at ``step`` (None: the tracker's next)."""

    @abstractmethod
    def end(self, status: str, reason: str | None) -> None:
        """End the run with otel-rl's status (``finished``, ``failed``, ``killed``)."""

    def histogram(self, histogram: Any) -> Any:
        """The tracker's histogram of ``histogram`` (:class:`otel_rl.core.distributions.Histogram`); None: it has none."""
        return None

    def media(self, path: Path, attributes: dict[str, Any]) -> Any:
        """The tracker's object of a video or image file (``attributes``: its ``media`` record); None: it shows none of that kind."""
        return None


def run_provenance(started: RunStart | None) -> dict[str, Any]:
    """What a tracker shows next to the configuration: what the run planned and where it came from."""
    if started is None:
        return {}
    plan = {"family": started.family, "total_steps": started.total_steps, "num_envs": started.num_envs}
    return {**{k: v for k, v in plan.items() if v is not None}, **started.provenance}


def run_config(started: RunStart | None) -> dict[str, Any]:
    """The run's configuration (secrets already redacted) with its provenance under ``otel_rl``."""
    config = dict(started.config or {}) if started is not None else {}
    return {**config, "otel_rl": run_provenance(started)}


@contextlib.contextmanager
def without_variables(names: tuple[str, ...]) -> Iterator[None]:
    """The variables ``names`` out of the environment inside the block: a tracker gets their values as keywords."""
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


class TrackerSink(RecordSink):
    """Queues scalars, distributions, events, run records and ``Perf/*`` windows for a :class:`TrackerWriter`."""

    def __init__(self, writer: TrackerWriter, resumed_after: int | None = None) -> None:
        """``resumed_after``: a resumed run's last step so far (the earlier parts'), which its steps stay above."""
        self.writer = writer
        self._axes: dict[str, int | None] = {"env_steps": None, "iteration": None}  # the learner's latest, as Perf/* windows said
        self._step: int | None = None
        self._next_free = None if resumed_after is None else resumed_after + 1  # None once the loop's steps passed it
        self._lifted: tuple[int, int] | None = None  # the loop's latest step behind, and where it was written
        self._axes_at = -1  # the latest iteration whose axes were written
        # A pass hands over its events before its scalars: they wait for the pass's steps, then go at theirs.
        self._events: deque[EventRecord] = deque()
        writer.start()

    def on_run_start(self, run: RunStart) -> None:
        self.writer.put(("start", run.start_ns, run))

    def on_run_end(self, run: RunEnd) -> None:
        self._put_events()
        self.writer.put(("end", run.end_ns, run.status, run.reason))

    def on_scalars(self, batch: ScalarBatch) -> None:
        for record in batch:
            step = record.axis_step
            if step is None:  # a loop that gives neither a step nor env steps: its iterations are the axis, never step 0 for all
                step = record.iteration
            self._put_events_before(record.time_ns)
            self._step = step if step is not None else self._step  # the loop's own: an event is lifted as its step is
            self.writer.put(("scalars", record.time_ns, self._above_floor(step), record.values, self._moved(record.iteration, record.env_steps)))

    def _moved(self, iteration: int | None, env_steps: int | None) -> dict[str, int] | None:
        """The axes to write beside a record of ``iteration`` and ``env_steps``: None but for an iteration's first record
        (a distribution's statistics, which may come after later iterations' scalars, write none)."""
        if iteration is None or iteration <= self._axes_at:
            return None
        self._axes_at = iteration
        return {AXIS_ITERATION: iteration, AXIS_ENV_STEPS: iteration if env_steps is None else env_steps}

    def on_distribution(self, record: DistributionRecord) -> None:
        step = next((s for s in (record.step, record.env_steps, record.iteration) if s is not None), None)
        self.writer.put(("distribution", record.time_ns, self._above_floor(step), record.key, record.histogram))

    def _above_floor(self, step: int | None) -> int | None:
        """A resumed run's step, never at or below a step written before (see the module docstring)."""
        free = self._next_free
        if free is None or step is None:
            return step
        lifted = self._lifted
        if lifted is not None and step <= lifted[0]:  # the same step (or a record behind it): where that step went
            return lifted[1]
        if step >= free:  # the loop's own steps have passed what was written: from here on they are the axis
            self._next_free = None
            return step
        self._lifted = (step, free)
        self._next_free = free + 1
        return free

    def on_event(self, event: EventRecord) -> None:
        self._events.append(event)

    def _put_events_before(self, time_ns: int) -> None:
        """Events that happened before ``time_ns``, at the step of the last scalars before them."""
        while self._events and self._events[0].time_ns <= time_ns:
            self._put_event(self._events.popleft())

    def _put_events(self) -> None:
        for event in self._events:
            self._put_event(event)
        self._events.clear()

    def _put_event(self, event: EventRecord) -> None:
        # The step of the latest scalars before it, else of the iterations (a run that logs no scalars).
        step = next((s for s in (self._step, self._axes["env_steps"], self._axes["iteration"]) if s is not None), None)
        if event.name == schema.EVENT_CLOCK_OFFSET:  # the readers' (the trace's), not a curve
            return
        if event.name == schema.EVENT_MEDIA:  # a video or image at its own step, for the trackers that show one
            if self.writer.media_root is not None:
                given = event.attributes.get("step")
                self.writer.put(("media", event.time_ns, self._above_floor(given if isinstance(given, int) else step), event.attributes))
            return
        self.writer.put(("event", event.time_ns, self._above_floor(step), event.name, event.attributes))

    def on_perf(self, record: ScalarsRecord) -> None:
        """The pipeline's ``Perf/*`` window, at the learner's env steps (its iterations for a loop that counts none)."""
        self._put_events_before(record.time_ns)
        self._axes = {"env_steps": record.env_steps, "iteration": record.iteration}
        step = record.env_steps if record.env_steps is not None else record.iteration
        self.writer.put(("scalars", record.time_ns, self._above_floor(step), dict(record.values), None))

    def on_drain(self, now_ns: int) -> None:
        self._put_events()

    def flush(self, deadline: Deadline) -> bool:
        return self.writer.flush(deadline)

    def go_on_after(self, seconds: float) -> None:
        """Let the writer go on for up to ``seconds`` after the close deadline (an agent process, where nothing waits on it)."""
        self.background_s = seconds

    background_s = 0.0
    behind = 0
    """Records the tracker had yet to get when :meth:`shutdown` returned (the end line says how many)."""
    lost = 0
    """Of those, the ones it will never get (no time after the deadline; counted as dropped)."""

    def shutdown(self, deadline: Deadline) -> None:
        self._put_events()
        writer = self.writer
        writer.close(Deadline(max(deadline.left(), self.background_s)))
        # Back a moment before the deadline, so that the count reaches the producer before it stops waiting.
        writer.join(Deadline(max(deadline.left() - min(HANDOVER_S, deadline.left() / 4), 0.0)))
        self.behind = writer.behind()
        if not self.background_s and self.behind:  # what is queued never goes; a slice the deadline caught mid-write, maybe not
            self.lost = writer.abandon() + writer.behind()

    def finish_in_background(self) -> int:
        """After :meth:`shutdown` with :meth:`go_on_after`: wait for the writer (up to that long); the records it never got."""
        if not self.behind:
            return 0
        writer = self.writer
        writer.join(Deadline((writer.time_left() or 0.0) + RELEASE_S))  # its run's end too (W&B's finish syncs its files)
        self.lost = writer.abandon() + writer.behind()
        return self.lost
