"""Records assembled by the pipeline thread and handed to every sink.

Times are epoch nanoseconds (one calibration of the monotonic clock per
process). Records are built once and shared read-only by all sinks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_rl.schema import PhaseSpec


@dataclass(slots=True)
class PhaseRecord:
    """One completed phase, with its nested diagnostic phases in ``children``.

    ``iteration`` and ``env_steps`` are set on top-level phases only (nested
    phases share their parent's). ``span_id`` is non-zero once a span sink
    exported the phase as a span (exemplars point at it). ``flows`` are
    ``(flow_id, terminating)`` pairs marked inside the phase
    (:meth:`otel_rl.Telemetry.flow`). ``correlation`` pairs a CUDA-timed
    phase with its :class:`DeviceIntervalRecord`.
    """

    spec: PhaseSpec
    start_ns: int
    end_ns: int
    depth: int
    thread_id: int
    thread_name: str
    error: str | None = None
    children: list[PhaseRecord] | None = None
    iteration: int | None = None
    env_steps: int | None = None
    span_id: int = 0
    flows: list[tuple[int, bool]] | None = None
    correlation: int = 0

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def walk(self) -> list[PhaseRecord]:
        """This phase, then its nested phases depth first."""
        if not self.children:
            return [self]
        out = [self]
        for child in self.children:
            out.extend(child.walk())
        return out


@dataclass(slots=True)
class IterationRecord:
    """One completed cycle of a timeline and its top-level phases.

    ``accounted_ns`` is the sum of top-level phases (nested phases are never
    counted twice); ``other_ns = max(wall - accounted, 0)``.
    """

    timeline: str
    index: int
    env_steps: int | None
    start_ns: int
    end_ns: int
    thread_id: int
    thread_name: str
    phases: list[PhaseRecord]
    accounted_ns: int
    thread_cpu_ns: int | None = None
    _totals: tuple[dict[str, int], dict[str, int]] | None = None

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns

    def totals_ns(self) -> tuple[dict[str, int], dict[str, int]]:
        """Nanoseconds per phase name: (top-level phases, nested phases); computed once, shared by sinks."""
        if self._totals is None:
            top: dict[str, int] = {}
            nested: dict[str, int] = {}
            for phase in self.phases:
                name = phase.spec.name
                top[name] = top.get(name, 0) + phase.end_ns - phase.start_ns
                if phase.children:
                    for child in phase.walk()[1:]:
                        nested[child.spec.name] = nested.get(child.spec.name, 0) + child.end_ns - child.start_ns
            self._totals = (top, nested)
        return self._totals

    @property
    def other_ns(self) -> int:
        return max(self.wall_ns - self.accounted_ns, 0)


@dataclass(slots=True)
class DeviceIntervalRecord:
    """Where a CUDA-timed phase really ran on the GPU (from CUDA events, calibrated to epoch ns)."""

    spec: PhaseSpec
    device: int
    stream: int
    start_ns: int
    end_ns: int
    correlation: int
    span_id: int = 0

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(slots=True)
class ScalarsRecord:
    """Values of one ``scalars()`` call. Values are floats, ints or None (non-finite)."""

    time_ns: int
    values: dict[str, Any]
    step: int | None
    iteration: int | None
    env_steps: int | None
    seq: int = 0

    @property
    def axis_step(self) -> int | None:
        """The step it is plotted and checked at: its step, else its env steps (the protocol's ``step``)."""
        return self.step if self.step is not None else self.env_steps


@dataclass(slots=True)
class ScalarsBlock:
    """Consecutive :class:`ScalarsRecord` of one pipeline pass, in order, handed to sinks at once.

    ``records``: a list, or a :class:`otel_rl.core.scalar_rows.ScalarRun`
    (calls read as one table: its records are built when read, its columns
    can be read instead). ``finite``: no value in them is None, so a key's
    latest value is its value in the last record that holds it.
    """

    records: Sequence[ScalarsRecord]
    finite: bool
    _latest: dict[str, ScalarsRecord] | None = None

    @property
    def names(self) -> tuple[str, ...] | None:
        """The keys every record holds, in this order, where the block is a run's; None otherwise."""
        return getattr(self.records, "names", None)

    def latest(self) -> dict[str, ScalarsRecord]:
        """The last record holding each key (computed once, shared by sinks)."""
        names = self.names
        if self._latest is None and names is not None:
            self._latest = dict.fromkeys(names, self.records[-1])
        if self._latest is None:
            latest: dict[str, ScalarsRecord] = {}
            held = latest.keys()
            for record in reversed(self.records):
                keys = record.values.keys()
                if keys <= held:  # a loop that logs the same keys every call: one subset check per record
                    continue
                for key in keys:
                    if key not in latest:
                        latest[key] = record
            self._latest = latest
        return self._latest

    def latest_values(self) -> dict[str, Any]:
        """Each key's value in the last record holding it (None included)."""
        return {key: record.values[key] for key, record in self.latest().items()}


@dataclass(slots=True)
class DistributionRecord:
    """One ``distribution()`` call, summarised (:mod:`otel_rl.distributions`).

    ``values`` holds the call's finite values (a numpy array, read-only for
    sinks); ``stats`` what also went out as ``<key>/<stat>`` scalars;
    ``histogram`` is None when no value was finite.
    """

    time_ns: int
    key: str
    values: Any
    stats: dict[str, float | None]
    histogram: Any
    step: int | None
    iteration: int | None
    env_steps: int | None


@dataclass(slots=True)
class EventRecord:
    time_ns: int
    name: str
    attributes: dict[str, Any]
    seq: int = 0


@dataclass(slots=True)
class RunRecord:
    """Start (``end_ns is None``) or end of the run, with its final status.

    ``status`` is ``running`` at start, then ``finished``, ``failed`` or ``killed``.
    ``seq`` (here and on scalars and events) is the record's ``motrix.metrics/v1``
    sequence number, assigned when the call was made.
    """

    status: str
    start_ns: int
    end_ns: int | None = None
    reason: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    seq: int = 0


@dataclass(frozen=True)
class RemoteCycle:
    """One cycle of a worker, as relayed to the learner (durations in ns)."""

    role: str
    timeline: str
    end_ns: int
    wall_ns: int
    top: dict[str, int]
    nested: dict[str, int]
