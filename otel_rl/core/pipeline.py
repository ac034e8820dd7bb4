"""The pipeline: a producer's raw records from its sources in, assembled batches and records out to its sinks.

Each pass (:meth:`Pipeline.drain`, run by the one loop that serves the
producer: :class:`otel_rl.agent.serve.SegmentServer`, in an agent process or
on a thread of the training process) takes what every :class:`RecordSource`
holds into one :class:`Batch`, assembles it (lanes into iterations and phases:
:mod:`otel_rl.core.assembly`; scalars into batches: :mod:`otel_rl.core.scalars`),
numbers the records (the ``motrix.metrics/v1`` sequence number is assigned
here and nowhere else), decides which become spans (:mod:`otel_rl.core.sampling`)
and calls each sink. Every sink receives the same frozen records and batches
and writes nothing into them, so no output depends on another or on their
order. Sinks run on the loop's thread and must not block on the network: a
sink that does IO hands records to its own bounded queue and worker. The run
folder's files are the exception by design: their full queues make this
thread wait for the disk (back-pressure on the pipeline, never on training;
the source fills and counts what it drops). An exception in a sink is
logged once and never reaches training. New drops of any bounded queue become
``records_dropped`` events (:mod:`otel_rl.base.drops`). At shutdown every sink
is shut down at once, each on its own helper thread, so a hung network
exporter cannot starve the files of their final records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from otel_rl.base.clock import Clock
from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.base.log import logger
from otel_rl.base.values import NAME_LIMIT, shorten
from otel_rl.core import distributions
from otel_rl.core.assembly import LaneAssembler
from otel_rl.core.batches import IterationBatch, PhaseBatch, ScalarBatch
from otel_rl.core.keys import KeyPolicy
from otel_rl.core.live_verdict import LiveVerdict
from otel_rl.core.perf_windows import PerfWindows
from otel_rl.core.records import (
    CudaFallback,
    DeviceIntervalRecord,
    DistributionRecord,
    EventRecord,
    RemoteCycle,
    RunEnd,
    RunStart,
    ScalarsRecord,
)
from otel_rl.core.sampling import SpanSampler
from otel_rl.core.scalar_rows import ScalarRows
from otel_rl.core.scalars import ScalarAssembler, checked_axes
from otel_rl.core.step_check import StepCheck
from otel_rl.core.totals import CycleTotals, PassTotals
from otel_rl.formats import schema

_logger = logger(__name__)


class RecordSink:
    """Receiver of assembled records, called on the pipeline thread, in the order the producer made them.

    Every method has a no-op default. Implementations must return quickly
    and must not change what they receive (every sink gets the same objects).
    """

    def on_run_start(self, run: RunStart) -> None:
        """The run started."""

    def on_run_end(self, run: RunEnd) -> None:
        """The run ended, after every record made before its end."""

    def on_iterations(self, batch: IterationBatch) -> None:
        """Consecutive completed cycles of one thread and timeline, and their phases."""

    def on_phases(self, batch: PhaseBatch) -> None:
        """Phases a thread recorded outside any iteration of their timeline."""

    def on_device_interval(self, interval: DeviceIntervalRecord) -> None:
        """Where a CUDA-timed phase ran on the GPU."""

    def on_cycles(self, totals: PassTotals) -> None:
        """What one pass added per timeline: cycles (local and relayed) and loose phases.

        Windowed readers (the panel, ``Perf/*`` records) add these instead of
        walking every iteration themselves. Called once per pass that had any.
        """

    def on_scalars(self, batch: ScalarBatch) -> None:
        """Consecutive ``scalars()`` calls of one key set, values already made finite or None."""

    def on_perf(self, record: ScalarsRecord) -> None:
        """A ``Perf/*`` window (:mod:`otel_rl.core.perf_windows`), made once for every output that shows phase time as
        scalars; ``step`` is the learner's env steps, ``iteration`` its latest."""

    def on_distribution(self, record: DistributionRecord) -> None:
        """One ``distribution()`` call, summarised; its statistics also arrive through :meth:`on_scalars`."""

    def on_event(self, event: EventRecord) -> None:
        """A named event."""

    def on_cuda_fallback(self, fallback: CudaFallback) -> None:
        """A CUDA phase timed on the host, and why."""

    def on_notice(self, text: str) -> None:
        """A warning line of the training process, written while a panel draws (the panel prints it above itself)."""

    def on_drain(self, now_ns: int) -> None:
        """End of one pipeline pass: a chance to emit windowed aggregates."""

    def flush(self, deadline: Deadline) -> bool:
        """Push out everything received so far, by ``deadline``; True when it all went."""
        return True

    def shutdown(self, deadline: Deadline) -> None:
        """Flush and release resources by ``deadline``. Called once."""


@dataclass(slots=True)
class Lane:
    """One pass's records of one lane: :data:`otel_rl.shm.layout.LANE_RECORD` rows, in order.

    ``key`` tells lanes apart across passes (a lane passes to another thread
    once its own ended); ``names`` is the producer's string table, which the
    records' ids index.
    """

    key: object
    thread_id: int
    thread_name: str
    records: Any
    names: Sequence[str]


@dataclass(slots=True)
class Batch:
    """What one pass takes from the record sources, each list in its source's order (times on ``perf_counter_ns()``).

    * ``control``: :class:`RunStart`, :class:`RunEnd` and events ``(time_ns, name, attributes)``;
    * ``lanes``: :class:`Lane`;
    * ``scalars``: packed calls of one key set (:class:`ScalarRows`), or one call
      ``(time_ns, values, step, iteration, env_steps)`` that was not plain;
    * ``distributions``: ``(time_ns, key, array, step, iteration, env_steps)``;
    * ``remote``: relayed worker cycles; ``intervals``: where CUDA-timed phases ran,
      ``(spec, device, stream, start_ns, end_ns, correlation)`` (epoch ns);
      ``cuda_fallbacks``: :class:`CudaFallback`; ``media``: videos and images to write (requests of
      :class:`otel_rl.training.media_out.MediaOut`), for the pipeline's ``media`` handler; ``notices``: the
      training process's warning lines while a panel draws.
    """

    control: list = field(default_factory=list)
    lanes: list[Lane] = field(default_factory=list)
    scalars: list = field(default_factory=list)
    distributions: list = field(default_factory=list)
    remote: list[RemoteCycle] = field(default_factory=list)
    intervals: list = field(default_factory=list)
    cuda_fallbacks: list[CudaFallback] = field(default_factory=list)
    media: list[dict] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


class RecordSource(Protocol):
    """Where a pipeline's raw records come from: a shared-memory segment (:class:`otel_rl.core.segment_source.SegmentSource`)."""

    def take(self, batch: Batch) -> None:
        """Move every record pending since the last call into ``batch``."""

    def dropped(self) -> dict[str, int]:
        """Records the source dropped so far, per queue (cumulative)."""

    def pending(self) -> dict[str, int]:
        """Records waiting to be taken, per queue."""


_DROP_KINDS = {"phases": "phases", "device_intervals": "intervals", "relay": "cycles", "phase_misuse": "phases"}
"""What a source's drop counter counts, per queue (the queue's own name otherwise)."""

_METHODS = tuple(name for name in vars(RecordSink) if name.startswith("on_"))


class Pipeline:
    """Assembles the records of ``sources`` for ``sinks``, one :meth:`drain` at a time.

    Args:
        seq: the writer's sequence counter (see :func:`otel_rl.formats.protocol.seq_counter`).
        drops: the shared drop counters; new drops are reported as ``records_dropped`` events.
        step_check: reports scalar steps that go back (a resumed run's starts from its last steps).
        sampler: which records become spans (none by default).
        verdict: the live verdict, said as ``bottleneck`` events while a run is open (none by default).
        perf: makes the ``Perf/*`` windows handed to :meth:`RecordSink.on_perf` (none by default): the last of a run
            before its end, and one at the final pass.
        media: takes each video or image to write (:attr:`Batch.media`); none: they are not written.
    """

    def __init__(
        self,
        sources: Sequence[RecordSource],
        sinks: Sequence[RecordSink],
        clock: Clock,
        seq: Iterator[int],
        drops: Drops | None = None,
        step_check: StepCheck | None = None,
        sampler: SpanSampler | None = None,
        verdict: LiveVerdict | None = None,
        media: Any = None,
        perf: PerfWindows | None = None,
    ) -> None:
        self.sources = list(sources)
        self.sinks = list(sinks)
        self.sampler = sampler or SpanSampler(None)
        self._clock = clock
        self._seq = seq
        self._drops = drops if drops is not None else Drops()
        self.keys = KeyPolicy(self._drops)
        self.lanes = LaneAssembler(clock.offset_ns, self.sampler, self._drops)
        self.scalars = ScalarAssembler(self.keys, seq, step_check or StepCheck(), clock.offset_ns)
        self._lock = threading.Lock()
        self._failed_sinks: set[str] = set()
        self._pass_totals: dict[str, CycleTotals] = {}
        self.latest_axes: tuple[int | None, int | None] = (None, None)
        """The run's latest iteration and env steps, as passes saw them: the axes of records made beside the run (system metrics)."""
        self._final = False
        self.verdict = verdict
        self.media = media
        self.perf = perf
        self._index_handlers()

    def _index_handlers(self) -> None:
        # Bound methods per record kind, skipping sinks that keep the no-op default.
        self._handlers = {
            method: [getattr(s, method) for s in self.sinks if getattr(type(s), method) is not getattr(RecordSink, method)]
            for method in _METHODS
        }
        self._want_totals = bool(self._handlers["on_cycles"]) or self.verdict is not None or self.perf is not None  # summed only for a reader

    def add_sink(self, sink: RecordSink) -> None:
        """Add a sink while running; it sees records from the next pass on."""
        with self._lock:
            self.sinks.append(sink)
            self._index_handlers()

    def drain(self, timeout_s: float = -1) -> bool:
        """One pass over all sources; False if the lock was not had in time."""
        if not self._lock.acquire(timeout=timeout_s):
            return False
        try:
            self._drain_locked()
        except Exception:  # never let a bug here kill the loop
            _logger.exception("otel-rl: pipeline pass failed")
        finally:
            self._lock.release()
        return True

    def flush(self, deadline: Deadline) -> bool:
        """A pass, then every sink's flush, by ``deadline``."""
        if not self.drain(deadline.left()):
            return False
        return all([bool(self._call(sink, "flush", deadline)) for sink in self.sinks])

    def shutdown(self, deadline: Deadline) -> None:
        """Final pass, then shut every sink down at once, all by ``deadline``."""
        self._final = True
        self.drain(deadline.left())
        helpers = []
        for sink in self.sinks:
            helper = threading.Thread(target=self._call, args=(sink, "shutdown", deadline), name=f"otel-rl-stop-{type(sink).__name__}", daemon=True)
            helper.start()
            helpers.append((sink, helper))
        for sink, helper in helpers:
            if not deadline.join(helper):
                _logger.warning("otel-rl: %s did not finish within the shutdown deadline", type(sink).__name__)

    def dropped(self) -> dict[str, int]:
        """Drops per queue: the sources' (mirrored into the shared counters) and the outputs' own."""
        counts: dict[str, int] = {}
        for source in self.sources:
            for queue, count in source.dropped().items():
                counts[queue] = counts.get(queue, 0) + count
        for queue, count in counts.items():
            self._drops.set(queue, _DROP_KINDS.get(queue, queue), count)
        return self._drops.totals()

    # -- a pass ---------------------------------------------------------

    def _drain_locked(self) -> None:
        batch = Batch()
        for source in self.sources:
            source.take(batch)
        if self.media is not None:
            for request in batch.media:
                self.media(request)
        now_s = time.monotonic()
        ends: list[RunEnd] = []
        for item in batch.control:
            if isinstance(item, RunStart):
                self._fanout("on_run_start", replace(item, seq=next(self._seq)))
                if self.verdict is not None:
                    self.verdict.start()
                if self.perf is not None:
                    self.perf.reset()
            elif isinstance(item, RunEnd):
                ends.append(item)  # after the records written before it
            else:
                time_ns, name, attributes = item
                self._fanout("on_event", EventRecord(self._clock.to_epoch_ns(time_ns), name, attributes, next(self._seq)))
        for fallback in batch.cuda_fallbacks:
            self._fanout("on_cuda_fallback", fallback)
        for text in batch.notices:
            self._fanout("on_notice", text if isinstance(text, str) else str(text))
        for lane in batch.lanes:
            for assembled in self.lanes.assemble(lane.key, (lane.thread_id, lane.thread_name), lane.records, lane.names, now_s):
                self._hand_over(assembled)
            if self._want_totals:
                for timeline, index, env_steps, start_ns in self.lanes.under_way(lane.key):
                    totals = self._totals(timeline)
                    if totals.under_way is None or index > totals.under_way[0]:
                        totals.under_way = (index, env_steps, start_ns)
        for cycle in batch.remote:
            if self._want_totals:
                self._totals(cycle.timeline).add_cycle(cycle.wall_ns, cycle.top, cycle.nested)
        for raw in batch.intervals:
            self._fanout("on_device_interval", DeviceIntervalRecord(*raw, span_id=self.sampler.one(now_s)))
        for raw in batch.scalars:
            if type(raw) is ScalarRows:
                self.scalars.rows(raw)
            else:
                self.scalars.call(raw)
        for raw in batch.distributions:
            self._distribution(raw)
        self._scalars_out()
        self._pass_end(ends)

    def _perf_out(self, now_ns: int) -> None:
        assert self.perf is not None
        values = self.perf.take()
        if values:
            axes = self.perf.axes
            self._fanout("on_perf", ScalarsRecord(now_ns, values, axes["env_steps"], axes["iteration"], axes["env_steps"], next(self._seq)))

    def _hand_over(self, batch: IterationBatch | PhaseBatch) -> None:
        if isinstance(batch, IterationBatch):
            if self._want_totals:
                self._totals(batch.timeline).add_batch(batch)
            self._fanout("on_iterations", batch)
        else:
            if self._want_totals:
                for spec, durations in batch.phases.by_spec():
                    self._totals(spec.timeline).add_loose(spec.name, durations)
            self._fanout("on_phases", batch)

    def _scalars_out(self) -> None:
        for out in self.scalars.take():
            self._fanout("on_scalars" if isinstance(out, ScalarBatch) else "on_event", out)
            if self.verdict is not None and isinstance(out, ScalarBatch):
                self.verdict.note_scalars(out)
            if self.perf is not None and isinstance(out, ScalarBatch):
                self.perf.note_scalars(out.names)

    def _distribution(self, raw: tuple) -> None:
        """Summarise one ``distribution()`` call: a :class:`DistributionRecord`, and its statistics as scalars."""
        monotonic_ns, raw_key, array, step, iteration, env_steps = raw
        key = self.keys.key(raw_key)
        if not key:
            return
        key = shorten(key, NAME_LIMIT - 5)  # room for the longest statistic suffix, "/mean"
        summary = distributions.summarize(array)
        step, iteration, env_steps = checked_axes(step, iteration, env_steps)
        time_ns = self._clock.to_epoch_ns(monotonic_ns)
        if summary.nonfinite:
            self.scalars.nonfinite(key, time_ns, f"{summary.nonfinite} of {array.size} values")
        self._scalars_out()
        self._fanout("on_distribution", DistributionRecord(time_ns, key, summary.values, summary.stats, summary.histogram, step, iteration, env_steps))
        names = schema.distribution_keys(key)
        stats = {names[stat]: value for stat, value in summary.stats.items()}
        self.scalars.record(ScalarsRecord(time_ns, stats, step, iteration, env_steps, next(self._seq)))

    def _pass_end(self, ends: list[RunEnd]) -> None:
        now_ns = self._clock.now_ns()
        if self._pass_totals:
            self._note_axes(self._pass_totals)
            totals, self._pass_totals = PassTotals(now_ns, self._pass_totals), {}
            self._fanout("on_cycles", totals)
            if self.verdict is not None:
                self.verdict.add(totals)
            if self.perf is not None:
                self.perf.add(totals)
        if self.perf is not None and (ends or self._final or self.perf.due()):
            self._perf_out(now_ns)  # the last window of a run goes before its end
        if self.verdict is not None and (said := self.verdict.take(now_ns)) is not None:
            self._fanout("on_event", EventRecord(now_ns, schema.EVENT_BOTTLENECK, said, next(self._seq)))
        self.dropped()  # the sources' counters, mirrored
        for queue, kinds in self._drops.take_report(force=self._final).items():
            attributes = {"queue": queue, "total": sum(kinds.values()), **kinds}
            self._fanout("on_event", EventRecord(now_ns, "records_dropped", attributes, next(self._seq)))
        for run in ends:
            self._fanout("on_run_end", replace(run, seq=next(self._seq)))
            if self.verdict is not None:
                self.verdict.stop()
        self._fanout("on_drain", now_ns)

    def _totals(self, timeline: str) -> CycleTotals:
        totals = self._pass_totals.get(timeline)
        if totals is None:
            totals = self._pass_totals[timeline] = CycleTotals()
        return totals

    def _note_axes(self, totals: dict[str, CycleTotals]) -> None:
        """Keep the latest iteration and env steps of the pass (the learner's, else another timeline's)."""
        for timeline in (schema.LEARNER, *totals):
            cycle = totals.get(timeline)
            if cycle is not None and cycle.index is not None:
                self.latest_axes = (cycle.index, cycle.env_steps)
                return

    # -- sinks ----------------------------------------------------------

    def _fanout(self, method: str, record: object) -> None:
        for handler in self._handlers[method]:
            try:
                handler(record)
            except Exception:
                self._report(handler.__self__, method)

    def _call(self, sink: RecordSink, method: str, *args: object) -> object:
        try:
            return getattr(sink, method)(*args)
        except Exception:
            self._report(sink, method)
            return None

    def _report(self, sink: RecordSink, method: str) -> None:
        key = f"{type(sink).__name__}.{method}"
        if key not in self._failed_sinks:
            self._failed_sinks.add(key)
            _logger.exception("otel-rl: sink %s failed (further failures of it are not logged)", key)
