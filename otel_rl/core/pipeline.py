"""The pipeline: raw records from its sources in, assembled records out to sinks.

Each pass (:meth:`Pipeline.drain`, run by one loop: :class:`PipelineLoop` in
the training process, the agent's server in an agent) takes what every
:class:`RecordSource` holds into one :class:`Batch`, rebuilds phase nesting and
iterations, numbers the records (the ``motrix.metrics/v1`` sequence number is
assigned here and nowhere else) and calls each sink. Consecutive iterations
and consecutive scalars records reach a sink in one call each (a pass's worth,
in the order they were made, never after a record made later), so a sink pays
its per-call costs once per pass, not per record. Sinks run on the loop's
thread and must not block: a sink that does IO hands records to its own
bounded queue and worker. An exception in a sink is logged once and never
reaches training. New drops of any bounded queue become ``records_dropped``
events (:mod:`otel_rl.base.drops`). At shutdown every sink is shut down at once,
each on its own helper thread, so a hung network exporter cannot starve the
files of their final records.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from otel_rl.base.clock import Clock
from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.base.log import logger, once
from otel_rl.base.loops import BackgroundLoop
from otel_rl.base.values import INT64_MAX, INT64_MIN, MAX_REPR, NAME_LIMIT, as_step, clean_text, describe, scalar_number, shorten
from otel_rl.core import distributions
from otel_rl.core.iteration_rows import ITERATION_ROWS, IterationRows, IterationRun
from otel_rl.core.records import (
    DeviceIntervalRecord,
    DistributionRecord,
    EventRecord,
    IterationRecord,
    PhaseRecord,
    RunRecord,
    ScalarsBlock,
    ScalarsRecord,
)
from otel_rl.core.scalar_rows import ScalarRows, ScalarRun
from otel_rl.core.step_check import StepCheck
from otel_rl.formats import schema
from otel_rl.training.recorder import CORRELATE, FLOW, ITERATION_END, ITERATION_START

_logger = logger(__name__)
_PLAIN_NUMBERS = frozenset((float, int))


def _plain_finite(values: Iterable[object]) -> bool:
    """Every value an int of the signed 64-bit range or a finite float, checked by C loops (no Python loop per value)."""
    types = set(map(type, values))
    if not types <= _PLAIN_NUMBERS:
        return False
    if int in types and not INT64_MIN <= min(values) <= max(values) <= INT64_MAX:
        return False  # an int past 64 bits goes out as a float (the slow path), as in documents
    try:
        total = sum(values)  # inf or nan if any value is, or if the floats overflow (then the slow path decides)
    except OverflowError:  # an int too large for a float
        return False
    return type(total) is int or math.isfinite(total)


def _in_range(value: int | None, fallback: int | None) -> int | None:
    """``value`` if it is in the signed 64-bit range the protocol carries, else ``fallback`` (one warning)."""
    if value is None or INT64_MIN <= value <= INT64_MAX:
        return value
    as_step(value, "a step or iteration index")  # warns
    return fallback


def _axes(step: int | None, iteration: int | None, env_steps: int | None) -> tuple[int | None, int | None, int | None]:
    """A record's step axes, each kept only if in the signed 64-bit range (Python ints are checked here, off the training thread)."""
    for axis in (step, iteration, env_steps):
        if axis is not None and not INT64_MIN <= axis <= INT64_MAX:
            return _in_range(step, None), _in_range(iteration, None), _in_range(env_steps, None)
    return step, iteration, env_steps


class RecordSink:
    """Receiver of assembled records, called on the pipeline thread.

    Every method has a no-op default. Implementations must return quickly.
    """

    def on_run(self, run: RunRecord) -> None:
        """Run started (``run.end_ns is None``) or ended."""

    def on_iterations(self, iterations: Sequence[IterationRecord]) -> None:
        """Completed cycles and their phases, consecutive ones of one pass at once, in order.

        A sequence: a list, or an :class:`otel_rl.core.iteration_rows.IterationRun`, which
        builds its records when first read and also holds them as columns.
        """

    def on_phase(self, phase: PhaseRecord) -> None:
        """A top-level phase recorded outside any iteration of its thread."""

    def on_device_interval(self, interval: DeviceIntervalRecord) -> None:
        """Where a CUDA-timed phase ran on the GPU."""

    def on_remote_cycle(self, cycle) -> None:
        """A cycle of a worker process (:class:`otel_rl.core.records.RemoteCycle`)."""

    def on_cycles(self, totals: PassTotals) -> None:
        """What one pass added per timeline: cycles (local and relayed) and loose phases.

        Windowed readers (the panel, ``Perf/*`` records) add these instead of
        walking every iteration themselves. Called once per pass that had any.
        """

    def on_scalars(self, block: ScalarsBlock) -> None:
        """Consecutive ``scalars()`` calls of one pass, in order, values already made finite or None.

        A sink that keeps only the latest values reads :meth:`ScalarsBlock.latest`
        once per pass instead of every record.
        """

    def on_distribution(self, record: DistributionRecord) -> None:
        """One ``distribution()`` call, summarised; its statistics also arrive through :meth:`on_scalars`."""

    def on_event(self, event: EventRecord) -> None:
        """A named event."""

    def on_cuda_fallback(self, fallback: tuple[str, str, str]) -> None:
        """``(timeline, name, reason)``: a CUDA phase timed on the host, and why."""

    def on_drain(self, now_ns: int) -> None:
        """End of one pipeline pass: a chance to emit windowed aggregates."""

    def flush(self, timeout_s: float) -> bool:
        """Push out everything received so far, within ``timeout_s``."""
        return True

    def shutdown(self, timeout_s: float) -> None:
        """Flush and release resources within ``timeout_s``. Called once."""


@dataclass(slots=True)
class Batch:
    """What one pass takes from the record sources, each list in its source's order.

    Raw shapes (times on the producer's ``perf_counter_ns()`` clock):

    * ``control``: :class:`RunRecord` (start or end) and events ``(time_ns, name, attributes)``;
    * ``lanes``: ``(lane key, thread id, thread name, raw lane records)`` (see
      :class:`otel_rl.training.recorder.PyLane` for the record shapes; a source
      may hold complete iterations as one ``(ITERATION_ROWS, rows)``, see
      :mod:`otel_rl.core.iteration_rows`);
    * ``scalars``: ``(time_ns, values, step, iteration, env_steps)``, or :class:`ScalarRows`;
    * ``distributions``: ``(time_ns, key, array, step, iteration, env_steps)``;
    * ``remote``: relayed worker cycles; ``intervals``: where CUDA-timed phases ran,
      ``(spec, device, stream, start_ns, end_ns, correlation)`` (epoch ns);
      ``cuda_fallbacks``: ``(timeline, name, reason)``.
    """

    control: list = field(default_factory=list)
    lanes: list = field(default_factory=list)
    scalars: list = field(default_factory=list)
    distributions: list = field(default_factory=list)
    remote: list = field(default_factory=list)
    intervals: list = field(default_factory=list)
    cuda_fallbacks: list = field(default_factory=list)


class RecordSource(Protocol):
    """Where a pipeline's raw records come from: in-memory lanes and queues, or a shared-memory segment."""

    def take(self, batch: Batch) -> None:
        """Move every record pending since the last call into ``batch``."""

    def dropped(self) -> dict[str, int]:
        """Records the source dropped so far, per queue (cumulative)."""

    def pending(self) -> dict[str, int]:
        """Records waiting to be taken, per queue."""


@dataclass(slots=True)
class CycleTotals:
    """Time of one timeline within one pipeline pass, in nanoseconds.

    ``top`` and ``nested`` hold phase time per phase name within cycles
    (top-level phases, and phases nested in them); ``loose`` and ``counts``
    the time and occurrences of phases outside any cycle (a timeline without
    cycles is averaged per occurrence). ``index`` and ``env_steps`` are those
    of the pass's last local iteration.
    """

    cycles: int = 0
    wall_ns: int = 0
    top: dict[str, int] = field(default_factory=dict)
    nested: dict[str, int] = field(default_factory=dict)
    loose: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    index: int | None = None
    env_steps: int | None = None

    def add_cycle(self, wall_ns: int, top: dict[str, int], nested: dict[str, int]) -> None:
        self.cycles += 1
        self.wall_ns += wall_ns
        for totals, values in ((self.top, top), (self.nested, nested)):
            for name, ns in values.items():
                totals[name] = totals.get(name, 0) + ns

    def add_iteration(self, iteration: IterationRecord) -> None:
        """A local cycle: as :meth:`add_cycle` of its totals, summed here without making them."""
        self.cycles += 1
        self.wall_ns += iteration.end_ns - iteration.start_ns
        top = self.top
        for phase in iteration.phases:
            name = phase.spec.name
            top[name] = top.get(name, 0) + phase.end_ns - phase.start_ns
            if phase.children:
                nested = self.nested
                for child in phase.walk()[1:]:
                    nested[child.spec.name] = nested.get(child.spec.name, 0) + child.end_ns - child.start_ns
        self.index, self.env_steps = iteration.index, iteration.env_steps

    def add_rows(self, rows: IterationRows) -> None:
        """Local cycles held as columns (their phases all top-level)."""
        self.cycles += len(rows.indices)
        self.wall_ns += int((rows.ends - rows.starts).sum())
        for name, ns in rows.phase_totals().items():
            self.top[name] = self.top.get(name, 0) + ns
        self.index, self.env_steps = rows.indices[-1], rows.env_steps[-1]

    def add_loose(self, phase: PhaseRecord) -> None:
        loose, counts = self.loose, self.counts
        for part in phase.walk():
            name = part.spec.name
            loose[name] = loose.get(name, 0) + part.end_ns - part.start_ns
            counts[name] = counts.get(name, 0) + 1


@dataclass(slots=True)
class PassTotals:
    """Per timeline, what one pipeline pass added (see :meth:`RecordSink.on_cycles`); ``time_ns`` is the pass's end."""

    time_ns: int
    timelines: dict[str, CycleTotals]


@dataclass
class _LaneState:
    """Assembly state of one lane between pipeline passes."""

    children_by_depth: dict[int, list[PhaseRecord]] = field(default_factory=dict)
    flows_by_depth: dict[int, list[tuple[int, bool]]] = field(default_factory=dict)
    correlations_by_depth: dict[int, int] = field(default_factory=dict)
    open_iterations: dict[str, tuple[int, int, int | None, list[PhaseRecord], int | None, int]] = field(default_factory=dict)


MAX_SCALAR_KEYS = 10_000
"""Distinct scalar keys per run; values of further new keys are dropped and counted (queue ``scalar_keys``)."""


class Pipeline:
    """Assembles the records of ``sources`` for ``sinks``, one :meth:`drain` at a time.

    Args:
        seq: the writer's sequence counter (see :func:`otel_rl.formats.protocol.seq_counter`).
        drops: the shared drop counters; new drops are reported as ``records_dropped`` events.
        step_check: reports scalar steps that go back (a resumed run's starts from its last steps).
    """

    def __init__(
        self,
        sources: Sequence[RecordSource],
        sinks: Sequence[RecordSink],
        clock: Clock,
        seq: Iterator[int],
        drops: Drops | None = None,
        step_check: StepCheck | None = None,
    ) -> None:
        self.step_check = step_check or StepCheck()
        self.sources = list(sources)
        self._seq = seq
        self.sinks = list(sinks)
        self._handlers: dict[str, list] = {}
        self._index_handlers()
        self._clock = clock
        self._drops = drops if drops is not None else Drops()
        self._lane_states: dict[Any, _LaneState] = {}
        self._lock = threading.Lock()
        self._failed_sinks: set[str] = set()
        self.seen_nonfinite: set[str] = set()
        self._accepted_keys: dict[str, str] = {}
        self._pass_totals: dict[str, CycleTotals] = {}
        self.latest_axes: tuple[int | None, int | None] = (None, None)
        """The run's latest iteration and env steps, as passes saw them: the axes of records made beside the run (system metrics)."""
        self._canonical_keys: set[str] = set()  # accepted as they are (the scalars fast path)
        self._pending: list[ScalarsRecord] = []  # scalars records not yet handed over (see _hand_over_scalars)
        self._iterations: list[IterationRecord] = []  # iterations not yet handed over (see _fanout)
        self._pending_finite = True
        self._final = False

    _METHODS = (
        "on_run",
        "on_iterations",
        "on_phase",
        "on_device_interval",
        "on_remote_cycle",
        "on_cycles",
        "on_scalars",
        "on_distribution",
        "on_event",
        "on_cuda_fallback",
        "on_drain",
    )

    def _index_handlers(self) -> None:
        # Bound methods per record kind, skipping sinks that keep the no-op default.
        self._handlers = {
            method: [getattr(s, method) for s in self.sinks if getattr(type(s), method) is not getattr(RecordSink, method)]
            for method in self._METHODS
        }
        self._want_totals = bool(self._handlers["on_cycles"])  # per-pass totals are only summed for a reader

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

    def flush(self, timeout_s: float) -> bool:
        """A pass, then every sink's flush, within ``timeout_s``."""
        deadline = Deadline(timeout_s)
        if not self.drain(timeout_s):
            return False
        ok = True
        for sink in self.sinks:
            ok = bool(self._call(sink, "flush", deadline.left())) and ok
        return ok

    def shutdown(self, deadline: Deadline) -> None:
        """Final pass, then shut every sink down at once, all within ``deadline``."""
        self._final = True
        self.drain(deadline.left())
        helpers = []
        for sink in self.sinks:
            helper = threading.Thread(
                target=self._shutdown_sink, args=(sink, deadline), name=f"otel-rl-stop-{type(sink).__name__}", daemon=True
            )
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


    # -- assembly -------------------------------------------------------

    def _drain_locked(self) -> None:
        batch = Batch()
        for source in self.sources:
            source.take(batch)
        to_epoch_ns = self._clock.to_epoch_ns
        ends: list[RunRecord] = []
        for item in batch.control:
            if isinstance(item, RunRecord):
                if item.end_ns is None:
                    item.seq = next(self._seq)
                    self._fanout("on_run", item)
                else:
                    ends.append(item)  # after the records written before it
            else:
                time_ns, name, attributes = item
                self._fanout("on_event", EventRecord(to_epoch_ns(time_ns), name, attributes, next(self._seq)))
        for fallback in batch.cuda_fallbacks:
            self._fanout("on_cuda_fallback", fallback)
        for lane in batch.lanes:
            self._drain_lane(*lane)
        for cycle in batch.remote:
            if self._want_totals:
                self._totals(cycle.timeline).add_cycle(cycle.wall_ns, cycle.top, cycle.nested)
            self._fanout("on_remote_cycle", cycle)
        for raw in batch.intervals:
            self._fanout("on_device_interval", DeviceIntervalRecord(*raw))
        for raw in batch.scalars:
            if type(raw) is ScalarRows:
                self._scalar_rows(raw)
            else:
                self._emit_scalars(self._scalars_record(raw))
        for raw in batch.distributions:
            self._distribution(raw)
        now_ns = self._clock.now_ns()
        if self._pass_totals:
            self._note_axes(self._pass_totals)
            totals, self._pass_totals = PassTotals(now_ns, self._pass_totals), {}
            self._fanout("on_cycles", totals)
        self._report_drops(now_ns)
        for run in ends:
            run.seq = next(self._seq)
            self._fanout("on_run", run)
        self._fanout("on_drain", now_ns)

    def _report_drops(self, now_ns: int) -> None:
        self.dropped()  # the sources' counters, mirrored
        for queue, kinds in self._drops.take_report(force=self._final).items():
            attributes = {"queue": queue, "total": sum(kinds.values()), **kinds}
            self._fanout("on_event", EventRecord(now_ns, "records_dropped", attributes, next(self._seq)))

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

    def _scalars_record(self, raw: tuple) -> ScalarsRecord:
        time_ns, values, step, iteration, env_steps = raw
        step, iteration, env_steps = _axes(step, iteration, env_steps)
        if values.keys() <= self._canonical_keys and _plain_finite(values.values()):
            # The common case: keys exported as they are, finite plain numbers.
            # The dict is the call's own snapshot, so it is used as is.
            return ScalarsRecord(self._clock.to_epoch_ns(time_ns), values, step, iteration, env_steps, next(self._seq))
        clean: dict[str, float | int | None] = {}
        for raw_key, value in values.items():
            key = self._key(raw_key)
            if not key:
                continue
            cleaned, is_number = scalar_number(key, value)
            if not is_number:
                continue
            clean[key] = cleaned
            if cleaned is None:
                self._pending_finite = False
                self._report_nonfinite(key, time_ns, describe(value))
        return ScalarsRecord(self._clock.to_epoch_ns(time_ns), clean, step, iteration, env_steps, next(self._seq))

    def _scalar_rows(self, table: ScalarRows) -> None:
        """Records of a :class:`ScalarRows`: rows of canonical keys and finite values as they are, the others checked."""
        names, offset = table.names, self._clock.offset_ns
        canonical = set(names) <= self._canonical_keys
        if not canonical and len(self._accepted_keys) + len(names) <= MAX_SCALAR_KEYS:
            for name in names:  # new keys accepted (and warned about) once, so that a first table is one too
                self._key(name)
            canonical = set(names) <= self._canonical_keys
        steps = table.axis_steps()
        if canonical and all(table.finite) and self._rises(steps):
            # The steady state: a loop logging the same keys with rising steps, handed on as one run.
            if self._pending:
                self._hand_over_scalars()
            run = ScalarRun(table, offset, list(itertools.islice(self._seq, len(steps))))
            self._fanout("on_scalars", ScalarsBlock(run, True))
            self.step_check.note(dict.fromkeys(names, steps[-1]))
            return
        columns = zip(table.times_ns.tolist(), table.values.tolist(), table.finite, table.steps, table.iterations, table.env_steps)
        for time_ns, row, finite, step, iteration, env_steps in columns:
            values = dict(zip(names, row))
            if canonical and finite:
                self._emit_scalars(ScalarsRecord(time_ns + offset, values, step, iteration, env_steps, next(self._seq)))
            else:
                self._emit_scalars(self._scalars_record((time_ns, values, step, iteration, env_steps)))

    def _rises(self, steps: list[int | None]) -> bool:
        """Whether every row's axis step is given and none goes back (then :meth:`StepCheck.rises` took the last)."""
        if None in steps or any(a > b for a, b in zip(steps, steps[1:])) or not self.step_check.rises(steps[0]):
            return False
        self.step_check.rises(steps[-1])
        return True

    def _key(self, raw_key: object) -> str:
        """The exported key of ``raw_key`` (remembered), "" when it is not exported (see :meth:`_accept_key`)."""
        key = self._accepted_keys.get(raw_key) if type(raw_key) is str else None
        return self._accept_key(raw_key) if key is None else key

    def _report_nonfinite(self, key: str, time_ns: int, value: str) -> None:
        """One ``nonfinite`` event per key (``time_ns`` on the monotonic clock)."""
        if key not in self.seen_nonfinite:
            self.seen_nonfinite.add(key)
            attributes = {"key": key, "value": value}
            self._fanout("on_event", EventRecord(self._clock.to_epoch_ns(time_ns), "nonfinite", attributes, next(self._seq)))

    def _distribution(self, raw: tuple) -> None:
        """Summarise one ``distribution()`` call: a :class:`DistributionRecord`, and its statistics as scalars."""
        monotonic_ns, raw_key, array, step, iteration, env_steps = raw
        key = self._key(raw_key)
        if not key:
            return
        key = shorten(key, NAME_LIMIT - 5)  # room for the longest statistic suffix, "/mean"
        summary = distributions.summarize(array)
        step, iteration, env_steps = _axes(step, iteration, env_steps)
        if summary.nonfinite:
            self._report_nonfinite(key, monotonic_ns, f"{summary.nonfinite} of {array.size} values")
        time_ns = self._clock.to_epoch_ns(monotonic_ns)
        record = DistributionRecord(time_ns, key, summary.values, summary.stats, summary.histogram, step, iteration, env_steps)
        self._fanout("on_distribution", record)
        names = schema.distribution_keys(key)
        stats = {names[stat]: value for stat, value in summary.stats.items()}
        if None in stats.values():
            self._pending_finite = False
        self._emit_scalars(ScalarsRecord(time_ns, stats, step, iteration, env_steps, next(self._seq)))

    def _emit_scalars(self, record: ScalarsRecord) -> None:
        """Hold ``record`` to hand over with its neighbours (see :meth:`_fanout`); one whose step went back goes alone, with its event."""
        step = record.axis_step
        if step is None or self.step_check.rises(step):
            self._pending.append(record)
            return
        finite = self._pending_finite
        self._hand_over_scalars()  # the records before it first, their steps noted
        self._fanout("on_scalars", ScalarsBlock([record], finite))
        regression = self.step_check.check(record.values, step)
        if regression is not None:
            self._fanout("on_event", EventRecord(record.time_ns, "step_regression", regression, next(self._seq)))

    def _hand_over_scalars(self) -> None:
        """The pending scalars records to the sinks as one block, and their steps noted."""
        records, self._pending = self._pending, []
        block = ScalarsBlock(records, self._pending_finite)
        self._pending_finite = True
        self._fanout("on_scalars", block)
        steps = [r.axis_step for r in records]
        if None not in steps:  # each key's last step is that of the last record holding it
            self.step_check.note({key: record.axis_step for key, record in block.latest().items()})
            return
        for record, step in zip(records, steps):
            if step is not None:
                self.step_check.note(dict.fromkeys(record.values, step))

    def _accept_key(self, raw_key: object) -> str:
        """The key as exported ("" for a key that is not exported).

        Canonical keys as they are; other strings namespaced under ``custom/``
        with one warning; keys longer than the protocol allows shortened (a
        hash keeps them distinct). Not exported: keys that are not strings
        (``1`` and ``"1"`` would otherwise collide), internal weighting counts
        of :mod:`otel_rl.stats_tracker` (``key__count``), and new keys past
        :data:`MAX_SCALAR_KEYS` (counted as drops).
        """
        if not isinstance(raw_key, str):
            _logger.warning(
                "otel-rl: scalars()/distribution() key %s (%s) is not a string; its value is dropped",
                describe(raw_key),
                type(raw_key).__name__,
                extra=once(f"key-type:{type(raw_key).__name__}"),
            )
            return ""
        if type(raw_key) is not str:  # a str subclass (StrEnum, numpy.str_): its text
            raw_key = str.__str__(raw_key)
            known = self._accepted_keys.get(raw_key)
            if known is not None:
                return known
        if len(self._accepted_keys) >= MAX_SCALAR_KEYS:
            self._drops.add("scalar_keys", "scalars")
            _logger.warning(
                "otel-rl: more than %d distinct scalar keys; values of new keys are dropped and counted",
                MAX_SCALAR_KEYS,
            )
            return ""
        if raw_key.endswith("__count"):
            _logger.warning("otel-rl: %r is a stats weighting count; such keys are not exported", raw_key)
            self._accepted_keys[raw_key] = ""
            return ""
        try:
            key = schema.metric_spec(raw_key).key
        except schema.SchemaError as exc:
            key = shorten(clean_text("custom/" + (re.sub(r"[^A-Za-z0-9_.\-]", "_", raw_key) or "unnamed")))
            # An over-long key is named shortened, not in full, in the warning.
            _logger.warning("otel-rl: %s; exporting it as %r", clean_text(str(exc), MAX_REPR), key, extra=once(f"key:{raw_key}"))
        key = shorten(clean_text(key))
        self._accepted_keys[raw_key] = key
        if key == raw_key:
            self._canonical_keys.add(key)
        return key

    def _drain_lane(self, key: Any, thread_id: int, thread_name: str, records: list[tuple]) -> None:
        state = self._lane_states.get(key)
        if state is None:
            state = self._lane_states[key] = _LaneState()
        self._assemble(state, records, thread_id, thread_name)

    def _assemble(self, state: _LaneState, records: list[tuple], thread_id: int, thread_name: str) -> None:
        """A lane's raw records, in order, into phases and iterations (``state`` carries what is open between passes)."""
        offset = self._clock.offset_ns
        children_by_depth, flows_by_depth, correlations_by_depth = state.children_by_depth, state.flows_by_depth, state.correlations_by_depth
        open_iterations = state.open_iterations
        for raw in records:
            head = raw[0]
            if type(head) is str:  # a mark: an iteration's start or end, a flow, a correlation
                self._mark(state, raw, thread_id, thread_name, offset)
                continue
            _, start, end, depth, exc_type = raw
            spec = head.spec
            phase = PhaseRecord(
                spec,
                start + offset,
                end + offset,
                depth,
                thread_id,
                thread_name,
                exc_type if exc_type is None or type(exc_type) is str else exc_type.__name__,
                children_by_depth.pop(depth + 1, None) if children_by_depth else None,
            )
            if flows_by_depth:
                phase.flows = flows_by_depth.pop(depth, None)
            if correlations_by_depth:
                phase.correlation = correlations_by_depth.pop(depth, 0)
            # A top-level phase (at the depth its iteration started at: a phase left open
            # before it costs only itself) belongs to the open iteration of its own timeline;
            # otherwise it is a loose phase (a collector without cycles, say).
            opened = open_iterations.get(spec.timeline)
            if opened is None:
                if depth > 0:
                    children_by_depth.setdefault(depth, []).append(phase)
                    continue
            elif depth == opened[5] and phase.start_ns >= opened[0]:
                phase.iteration, phase.env_steps = opened[1], opened[2]
                opened[3].append(phase)
                continue
            elif depth > opened[5]:
                children_by_depth.setdefault(depth, []).append(phase)
                continue
            if self._want_totals:
                self._totals(spec.timeline).add_loose(phase)
            self._fanout("on_phase", phase)

    def _mark(self, state: _LaneState, raw: tuple, thread_id: int, thread_name: str, offset: int) -> None:
        """A lane's mark: opens or closes an iteration, or notes a flow or a CUDA correlation for the open phase."""
        head = raw[0]
        if head is ITERATION_START:
            _, start, timeline, index, env_steps, cpu, base_depth = raw
            if not INT64_MIN <= index <= INT64_MAX or (env_steps is not None and not INT64_MIN <= env_steps <= INT64_MAX):
                index, env_steps = _in_range(index, -1), _in_range(env_steps, None)
            state.open_iterations[timeline] = (start + offset, index, env_steps, [], cpu, base_depth)
        elif head is ITERATION_END:
            _, end, timeline, _, _, cpu, _ = raw
            opened = state.open_iterations.pop(timeline, None)
            if opened is None:  # its start was dropped with an overflow
                return
            start_ns, index, env_steps, phases, start_cpu, _ = opened
            if state.children_by_depth:
                self._adopt(state.children_by_depth, phases, opened, timeline)
            state.children_by_depth.clear()
            accounted = sum([phase.end_ns - phase.start_ns for phase in phases])
            cpu_ns = None if cpu is None or start_cpu is None else cpu - start_cpu
            self._emit_iteration(
                IterationRecord(timeline, index, env_steps, start_ns, end + offset, thread_id, thread_name, phases, accounted, cpu_ns)
            )
        elif head is CORRELATE:
            _, correlation, open_phases = raw
            if open_phases:
                state.correlations_by_depth[open_phases - 1] = correlation
        elif head is FLOW:
            _, _, flow_id, terminating, open_phases = raw
            if open_phases:
                state.flows_by_depth.setdefault(open_phases - 1, []).append((flow_id, terminating))
            else:
                _logger.warning("otel-rl: flow() called outside any phase; ignored")
        elif head is ITERATION_ROWS:
            self._iteration_rows(state, raw[1], thread_id, thread_name, offset)

    def _adopt(self, leftovers: dict[int, list[PhaseRecord]], phases: list[PhaseRecord], opened: tuple, timeline: str) -> None:
        """Phases of an ending iteration whose enclosing phase was never exited become the iteration's own.

        The phase left open is lost (counted as ``phase_misuse``, one warning);
        what ran inside it was recorded and counts as the iteration's time.
        """
        start_ns, index, env_steps, _, _, base_depth = opened
        adopted = [
            phase for depth, level in leftovers.items() if depth > base_depth for phase in level
            if phase.spec.timeline == timeline and phase.start_ns >= start_ns
        ]  # fmt: skip
        if not adopted:
            return
        for phase in adopted:
            phase.depth, phase.iteration, phase.env_steps = base_depth, index, env_steps
        phases.extend(adopted)
        phases.sort(key=lambda phase: phase.start_ns)
        self._drops.add("phase_misuse", "unclosed phases")
        _logger.warning(
            "otel-rl: a phase of %s iteration %d was never exited; it is not recorded, the phases inside it count as the iteration's",
            timeline,
            index,
            extra=once(f"unclosed:{timeline}"),
        )

    def _iteration_rows(self, state: _LaneState, rows: IterationRows, thread_id: int, thread_name: str, offset: int) -> None:
        """Complete iterations held as columns; record by record when the lane holds something open (a pass began mid-iteration)."""
        if state.open_iterations or state.children_by_depth or state.flows_by_depth or state.correlations_by_depth:
            self._assemble(state, rows.expand(), thread_id, thread_name)
            return
        iterations = IterationRun(rows, offset, thread_id, thread_name)
        overlap = iterations.first_overlap()
        if overlap is not None:
            self._warn_overlap(iterations.record(overlap))
        if self._want_totals:
            self._totals(rows.timeline).add_rows(rows)
        if self._iterations:  # the iterations before these first
            earlier, self._iterations = self._iterations, []
            self._fanout("on_iterations", earlier)
        self._fanout("on_iterations", iterations)  # alone, so that sinks can read its columns

    def _emit_iteration(self, iteration: IterationRecord) -> None:
        if iteration.accounted_ns > iteration.wall_ns:
            self._warn_overlap(iteration)
        if self._want_totals:
            self._totals(iteration.timeline).add_iteration(iteration)
        if self._pending:
            self._hand_over_scalars()
        self._iterations.append(iteration)  # handed over with its neighbours, before any other record

    def _warn_overlap(self, iteration: IterationRecord) -> None:
        _logger.warning(
            "otel-rl: contract warning: %s iteration %d accounts %.3f ms of phases in %.3f ms of wall time "
            "(top-level phases overlap or run on other threads)",
            iteration.timeline,
            iteration.index,
            iteration.accounted_ns / 1e6,
            iteration.wall_ns / 1e6,
            extra=once(f"contract:{iteration.timeline}"),
        )

    def _fanout(self, method: str, record: object) -> None:
        # Records held to be handed over together reach the sinks before any record made after them.
        if self._iterations and method != "on_iterations":
            iterations, self._iterations = self._iterations, []
            self._fanout("on_iterations", iterations)
        if self._pending and method != "on_scalars":
            self._hand_over_scalars()
        for handler in self._handlers[method]:
            try:
                handler(record)
            except Exception:
                self._report(handler.__self__, method)

    def _shutdown_sink(self, sink: RecordSink, deadline: Deadline) -> None:
        self._call(sink, "shutdown", deadline.left())

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


_DROP_KINDS = {"phases": "phases", "device_intervals": "intervals", "relay": "cycles", "phase_misuse": "phases"}
"""What a source's drop counter counts, per queue (the queue's own name otherwise)."""


class PipelineLoop(BackgroundLoop):
    """Drives a :class:`Pipeline` every ``interval_s`` on a daemon thread (the training process's host)."""

    def __init__(self, pipeline: Pipeline, interval_s: float) -> None:
        super().__init__("otel-rl-pipeline", interval_s)
        self.pipeline = pipeline
        self.start()

    def run_once(self) -> None:
        self.pipeline.drain()

    def flush(self, timeout_s: float) -> bool:  # type: ignore[override]
        return self.pipeline.flush(timeout_s)

    def shutdown(self, deadline: Deadline) -> None:  # type: ignore[override]
        """Stop the loop, then the pipeline's final pass and its sinks, all within ``deadline``."""
        self.close(deadline)
        self.join(deadline.left(cap_s=1.0))
        self.pipeline.shutdown(deadline)
