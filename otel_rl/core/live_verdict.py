"""The live verdict: ``otel-rl analyze``'s rules over a sliding window of what the pipeline measured, while the run goes.

The pipeline (:class:`otel_rl.core.pipeline.Pipeline`) adds every pass's
totals (:class:`otel_rl.core.totals.PassTotals`: the learner's own cycles and
a collector's relayed ones meet there) and, every :data:`EVERY_S`, the last
seconds of them become a :class:`~otel_rl.formats.report.Report`
that :func:`otel_rl.formats.diagnosis.diagnose` reads as it reads a trace's: phase
shares per timeline, who waits for whom, what is in no phase, a loop that
collects and learns in turn, and, on rank 0, the straggler among the ranks
(from the ranks' ``Perf/rank_<r>/*`` timings its log windows gather).

The window is the newest :data:`WINDOW_S`, longer (up to :data:`MAX_WINDOW_S`)
until it holds :data:`ENOUGH_CYCLES` cycles: a fast loop's change shows within
seconds, a slow loop's verdict reads enough of it. A window has sums, not every occurrence: a phase's statistics are its mean
per cycle (its median is not known), stalls are not told apart (one long
stall weighs on its window), and taking turns is read from the two sides'
working time (their cycles less their waits for each other) fitting in the
window's time. Each timeline's first cycle is left out (its one-off costs, imports, a CUDA context or a compilation,
are a start-up, not the loop's pace). A verdict is said when it changes and the change held for
:data:`HOLD` evaluations in a row and over :data:`CHANGE_CYCLES` cycles (one window's noise is not a change;
a loop near the line between two verdicts is ``balanced``, :data:`otel_rl.formats.diagnosis.BALANCE_BAND`), as a
``bottleneck`` event: its text (the line ``analyze`` prints), ``side``,
``phase``, ``rank`` (a straggler's), the learner's ``iteration`` then, the window's throughput and cycles, the
previous verdict, and its confidence: ``low`` with fewer than
:data:`MIN_CYCLES` cycles in the window or on a busy host (the reasons in
``caveat``), as ``analyze`` says of a trace. The same verdict, more or less sure,
is said again without a previous one: it is not a change.
"""

from __future__ import annotations

import collections
import re
from typing import Any

from otel_rl.formats import diagnosis as rules
from otel_rl.core.batches import ScalarBatch
from otel_rl.core.totals import CycleTotals, PassTotals
from otel_rl.formats import schema
from otel_rl.formats.report import Diagnosis, PhaseStats, RankTimeline, Report, Stats, Timeline, Turns

WINDOW_S = 2.0
"""The shortest sliding window a verdict reads."""
MAX_WINDOW_S = 10.0
"""The longest: a loop slower than :data:`ENOUGH_CYCLES` cycles in it is read with low confidence."""
ENOUGH_CYCLES = 30
"""Cycles a window grows to hold, past :data:`WINDOW_S`."""
EVERY_S = 0.5
"""How often the window is read."""
HOLD = 2
"""Evaluations in a row a new verdict must hold before it is said."""
CHANGE_CYCLES = 20
"""Cycles a change of verdict must hold over (besides :data:`HOLD` evaluations) before it is said; a loop slower than
that changes once the new verdict held for :data:`MAX_WINDOW_S`."""
MIN_CYCLES = 10
"""Fewer cycles than this in the window: the verdict is said with low confidence."""
TURNS_SLACK = 0.10
"""The two sides' working time may exceed the window's by this share and still be read as taking turns (cycles cross its edges)."""
RANK_STALE_S = MAX_WINDOW_S
"""A rank's timings older than this are not compared (a log window that stopped)."""
LOAD_KEY = "sys/load_per_cpu"


class LiveVerdict:
    """Reads the pipeline's recent totals with the diagnosis rules; not thread-safe (the pipeline thread owns it)."""

    def __init__(self, window_s: float = WINDOW_S, every_s: float = EVERY_S, hold: int = HOLD) -> None:
        self.window_ns = int(window_s * 1e9)
        self.max_window_ns = max(self.window_ns, int(MAX_WINDOW_S * 1e9))
        self.every_ns = int(every_s * 1e9)
        self.hold = hold
        self.open = False
        """A run is open: only then is a verdict said (a worker's pipeline, or one between runs, says none)."""
        self._wanted: dict[tuple[str, ...], bool] = {}
        self._reset()

    def _reset(self) -> None:
        self._buckets: collections.deque[tuple[int, dict[str, CycleTotals]]] = collections.deque()
        self._steps: collections.deque[tuple[int, int]] = collections.deque()
        self._ranks: dict[int, dict[str, tuple[int, float]]] = {}
        self._load: tuple[int, float] | None = None
        self._next_ns: int | None = None
        self._said: tuple | None = None
        self._said_text = ""
        self._pending: tuple | None = None
        self._pending_count = 0
        self._pending_since: tuple[int, int] = (0, 0)  # (time, cycles) when the pending verdict was first read
        self._confidence = ""
        self._iteration: int | None = None  # the learner's latest
        self._cycles = 0  # cycles added since start, the busiest timeline's per pass
        self._last_cycles: tuple[int, dict[str, CycleTotals]] | None = None  # the newest bucket that had cycles
        self._started: set[str] = set()  # timelines whose first cycle (the start-up's: imports, a CUDA context) is behind them

    def start(self) -> None:
        """A run opened: a window of its own, nothing said of it yet."""
        self._reset()
        self.open = True

    def stop(self) -> None:
        """The run ended: nothing more is said."""
        self.open = False

    def add(self, totals: PassTotals) -> None:
        """One pass's totals, into the window's newest bucket."""
        if not self.open:
            return
        start = totals.time_ns - totals.time_ns % self.every_ns
        if not self._buckets or self._buckets[-1][0] != start:
            self._buckets.append((start, {}))
        sums = self._buckets[-1][1]
        most = 0
        for timeline, cycles in totals.timelines.items():
            if not (cycles.cycles or cycles.counts):
                continue  # only an iteration still open: nothing measured yet
            if cycles.cycles and timeline not in self._started:
                self._started.add(timeline)  # the pass that ends a timeline's first cycle: one-off costs, not its pace
                continue
            most = max(most, cycles.cycles)
            own = sums.get(timeline)
            if own is None:
                own = sums[timeline] = CycleTotals()
            own.add(cycles)
        self._cycles += most
        if most:
            self._last_cycles = self._buckets[-1]  # kept past the window: an iteration longer than it is read from here
        learner = totals.timelines.get(schema.LEARNER)
        if learner is not None and learner.index is not None:
            self._iteration = learner.index
        if learner is not None and learner.env_steps is not None:
            self._steps.append((totals.time_ns, learner.env_steps))

    def note_scalars(self, batch: ScalarBatch) -> None:
        """The ranks' timings of a log window (rank 0's ``Perf/rank_<r>/*``) and the host's load, as the latest values."""
        if not self.open:
            return
        names = batch.names
        wanted = self._wanted.get(names)
        if wanted is None:  # a loop logs the same keys call after call: each key set is looked at once
            if len(self._wanted) >= 256:
                self._wanted.clear()
            wanted = self._wanted[names] = LOAD_KEY in names or any(name.startswith("Perf/rank_") for name in names)
        if not wanted:
            return
        time_ns = int(batch.times_ns[-1])
        for name, value in batch.latest_values().items():
            if not isinstance(value, (int, float)) or value != value:
                continue
            if name == LOAD_KEY:
                self._load = (time_ns, float(value))
                continue
            parsed = schema.parse_rank_key(name)
            if parsed is not None:
                self._ranks.setdefault(parsed[0], {})[parsed[1]] = (time_ns, float(value))

    def take(self, now_ns: int) -> dict[str, Any] | None:
        """The attributes of a ``bottleneck`` event when the verdict changed (and held), else None; reads at most every :data:`EVERY_S`."""
        if not self.open:
            return None
        if self._next_ns is not None and now_ns < self._next_ns:
            return None
        self._next_ns = now_ns + self.every_ns
        while self._buckets and self._buckets[0][0] < now_ns - self.max_window_ns:
            self._buckets.popleft()
        while self._steps and self._steps[0][0] < now_ns - self.max_window_ns:
            self._steps.popleft()
        report = self.report(now_ns)
        if report is None:
            return None
        diagnosis = rules.diagnose(report)
        cycles = max((entry.cycles for entry in report.timelines.values()), default=0)
        caveats = []
        if cycles < MIN_CYCLES:
            caveats.append(f"too few cycles ({cycles} in {report.wall_s:.0f} s; {MIN_CYCLES} make a verdict)")
        if self._load is not None and now_ns - self._load[0] <= self.max_window_ns and self._load[1] >= rules.BUSY_LOAD_PER_CPU:
            caveats.append(f"a busy host (load per CPU {self._load[1]:.1f})")
        confidence = "low" if caveats else "high"
        key = (diagnosis.side, diagnosis.phase, diagnosis.rank)
        if key == self._said:
            self._pending, self._pending_count = None, 0
            if confidence == self._confidence:
                return None
            self._confidence = confidence  # the same verdict, now more (or less) sure: said again, with no previous verdict
            return _attributes(diagnosis, report, cycles, confidence, caveats, round(report.wall_s, 1), "", self._iteration)
        if key == self._pending:
            self._pending_count += 1
        else:
            self._pending, self._pending_count, self._pending_since = key, 1, (now_ns, self._cycles)
        if self._pending_count < self.hold:
            return None
        if self._said is not None and self._cycles - self._pending_since[1] < CHANGE_CYCLES and now_ns - self._pending_since[0] < self.max_window_ns:
            return None  # a change holds over enough cycles (or a slow loop's longest window) before it is said
        self._said, self._pending, self._pending_count, self._confidence = key, None, 0, confidence
        attributes = _attributes(diagnosis, report, cycles, confidence, caveats, round(report.wall_s, 1), self._said_text, self._iteration)
        self._said_text = diagnosis.bottleneck
        return attributes

    def report(self, now_ns: int) -> Report | None:
        """The window as a report without its diagnosis; None when no cycle or phase ended in it.

        The newest buckets of :data:`WINDOW_S`, and older ones (up to :data:`MAX_WINDOW_S`) while it holds fewer than
        :data:`ENOUGH_CYCLES` cycles; where none of them holds a cycle, the newest bucket that did (iterations longer
        than the longest window).
        """
        sums: dict[str, CycleTotals] = {}
        first_ns = now_ns
        for start, bucket in reversed(self._buckets):
            if now_ns - first_ns >= self.window_ns and max((own.cycles for own in sums.values()), default=0) >= ENOUGH_CYCLES:
                break
            first_ns = start
            for timeline, own in bucket.items():
                sums.setdefault(timeline, CycleTotals()).add(own)
        last = self._last_cycles
        if last is not None and last[0] < first_ns and not any(own.cycles for own in sums.values()):
            first_ns, sums = last[0], {}  # no cycle ended in the longest window: the last ones that did (a long rollout)
            for timeline, own in last[1].items():
                sums.setdefault(timeline, CycleTotals()).add(own)
        timelines = {name: _timeline(name, own) for name, own in sums.items() if own.cycles or own.loose}
        if not timelines:
            return None
        span_ns = max(now_ns - first_ns, 1)
        steps = [(time_ns, count) for time_ns, count in self._steps if time_ns >= first_ns]
        throughput = None
        if len(steps) > 1 and steps[-1][0] > steps[0][0]:
            throughput = (steps[-1][1] - steps[0][1]) / ((steps[-1][0] - steps[0][0]) / 1e9)
        return Report(
            wall_s=span_ns / 1e9,
            turns=_turns(sums, span_ns),
            env_steps_per_s=throughput if throughput is None or throughput >= 0 else None,
            timelines=timelines,
            straggler=self._straggler(now_ns),
        )

    def _straggler(self, now_ns: int) -> Any:
        """The straggler among the ranks whose timings are recent (rank 0's log windows), else None."""
        tables = []
        for rank, values in sorted(self._ranks.items()):
            fresh = {key: value for key, (time_ns, value) in values.items() if now_ns - time_ns <= RANK_STALE_S * 1e9}
            phases = {}
            for key, value in fresh.items():
                parsed = schema.parse_phase_key(key)
                if parsed is None or parsed[0] != schema.LEARNER:
                    continue
                name = parsed[1]
                ms = value / schema.phase_key_scale(schema.LEARNER, name)
                spec = _spec(schema.LEARNER, name)
                phases[name] = PhaseStats(count=1, mean_ms=ms, p50_ms=ms, total_ms=ms, title=spec[0], nested=spec[1])
            if phases:
                tables.append(RankTimeline(cycles=1, cycle_ms=None, phases=phases, rank=rank, host=None))
        return rules.straggler(tables, schema.LEARNER) if len(tables) > 1 else None


def _spec(timeline: str, name: str) -> tuple[str, bool]:
    """A phase's title, and whether it is nested (a canonical phase with a parent)."""
    try:
        spec = schema.phase_spec(timeline, name)
    except schema.SchemaError:
        return schema.phase_title(timeline, name), False
    return spec.title, spec.parent is not None


def _timeline(timeline: str, own: CycleTotals) -> Timeline:
    """A timeline's window as the report's table: each phase's mean per cycle and share (per occurrence without cycles)."""
    wall = own.wall_ns if own.cycles else sum(own.loose.values())
    phases: dict[str, PhaseStats] = {}

    def put(name: str, ns: int, per: int, nested: bool, background: bool) -> None:
        title = _spec(timeline, name)[0]
        mean = ns / max(per, 1) / 1e6
        phases[name] = PhaseStats(count=per, mean_ms=mean, p50_ms=mean, trimmed_mean_ms=mean, p95_ms=mean, total_ms=ns / 1e6,
                                  title=title, nested=nested, background=background, share=ns / wall if wall else 0.0)  # fmt: skip

    for name, ns in own.top.items():
        put(name, ns, own.cycles, False, False)
    for name, ns in own.nested.items():
        if name not in own.top:  # a phase inside one of its own name: its time is the outer one's
            put(name, ns, own.cycles, True, False)
    for name, ns in own.loose.items():
        if name not in phases:
            put(name, ns, own.counts.get(name, 1), False, bool(own.cycles))  # beside the cycles: background work
    accounted = sum(own.top.values())
    cycle = own.wall_ns / own.cycles / 1e6 if own.cycles else 0.0
    return Timeline(
        cycles=own.cycles,
        cycle_ms=Stats(count=own.cycles, mean_ms=cycle, p50_ms=cycle, total_ms=own.wall_ns / 1e6) if own.cycles else None,
        phases=dict(sorted(phases.items(), key=lambda kv: (kv[1].nested, -kv[1].total_ms))),
        accounted_share=accounted / wall if wall and own.cycles else 0.0,
        other_share=max(wall - accounted, 0) / wall if wall and own.cycles else 0.0,
    )


def _turns(sums: dict[str, CycleTotals], span_ns: int) -> Turns | None:
    """Each side's share of the window's time when their working time fits in it (they take turns), else None."""
    learner, collector = sums.get(schema.LEARNER), sums.get(schema.COLLECTOR)
    if learner is None or collector is None or not learner.cycles or not collector.cycles:
        return None
    working = {
        side: max(own.wall_ns - own.top.get(schema.SIDE_WAITS[side], 0), 0) for side, own in ((schema.LEARNER, learner), (schema.COLLECTOR, collector))
    }
    span = max(span_ns, learner.wall_ns, collector.wall_ns)
    if sum(working.values()) > (1.0 + TURNS_SLACK) * span:
        return None  # both work at once
    shares = (working[schema.COLLECTOR] / span, working[schema.LEARNER] / span)
    return Turns(collector=shares[0], learner=shares[1], outside=max(0.0, 1.0 - sum(shares)))


def _attributes(diagnosis: Diagnosis, report: Report, cycles: int, confidence: str, caveats: list[str], window_s: float,
                previous: str, iteration: int | None) -> dict[str, Any]:  # fmt: skip
    attributes: dict[str, Any] = {
        "text": diagnosis.bottleneck,
        "side": diagnosis.side or "",
        "phase": diagnosis.phase or "",
        "confidence": confidence,
        "cycles": cycles,
        "window_s": window_s,
    }
    if diagnosis.rank is not None:
        attributes["rank"] = diagnosis.rank
    if caveats:
        attributes["caveat"] = "; ".join(caveats)
    if diagnosis.findings:
        attributes["evidence"] = diagnosis.findings[0].evidence
    if report.env_steps_per_s is not None:
        attributes["env_steps_per_s"] = round(report.env_steps_per_s, 3)
    if previous:
        attributes["previous"] = previous
    if iteration is not None:
        attributes["iteration"] = iteration  # the learner's latest when it was said
    return attributes
