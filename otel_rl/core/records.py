"""The records a pipeline pass hands its sinks: typed, frozen, built once and shared by every sink.

Times are epoch nanoseconds (one calibration of the monotonic clock per
producer). ``seq`` is a record's ``motrix.metrics/v1`` sequence number and
``span_id`` the id of the span a record is exported as (0: none), both
assigned where the pipeline assembles the record: no sink writes into a
record, so no output depends on another's side effects or on their order.
Stretches of iterations and of ``scalars()`` calls reach the sinks as batches
(:mod:`otel_rl.core.batches`), which hold them as columns and build these
records from them once, for the sinks that read records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_rl.formats import lifecycle
from otel_rl.formats.schema import PhaseSpec


@dataclass(frozen=True, slots=True)
class PhaseRecord:
    """One completed phase, with the phases nested in it in ``children``.

    ``iteration`` and ``env_steps`` are those of its iteration (None for a
    phase outside any). ``flows`` are ``(flow_id, terminating)`` pairs marked
    inside the phase (:meth:`otel_rl.Telemetry.flow`); ``correlation`` pairs a
    CUDA-timed phase with its :class:`DeviceIntervalRecord`.
    """

    spec: PhaseSpec
    start_ns: int
    end_ns: int
    depth: int
    thread_id: int
    thread_name: str
    error: str | None = None
    children: tuple[PhaseRecord, ...] = ()
    iteration: int | None = None
    env_steps: int | None = None
    span_id: int = 0
    flows: tuple[tuple[int, bool], ...] = ()
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


@dataclass(frozen=True, slots=True)
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
    phases: tuple[PhaseRecord, ...]
    accounted_ns: int
    thread_cpu_ns: int | None = None
    span_id: int = 0

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def other_ns(self) -> int:
        return max(self.wall_ns - self.accounted_ns, 0)


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class ScalarsRecord:
    """Values of one ``scalars()`` call: floats, ints or None (a value that was not finite)."""

    time_ns: int
    values: Mapping[str, Any]
    step: int | None
    iteration: int | None
    env_steps: int | None
    seq: int = 0

    @property
    def axis_step(self) -> int | None:
        """The step it is plotted and checked at: its step, else its env steps (the protocol's ``step``)."""
        return self.step if self.step is not None else self.env_steps


@dataclass(frozen=True, slots=True)
class DistributionRecord:
    """One ``distribution()`` call, summarised (:mod:`otel_rl.core.distributions`).

    ``values`` holds the call's finite values (a numpy array, read-only for
    sinks); ``stats`` what also went out as ``<key>/<stat>`` scalars;
    ``histogram`` is None when no value was finite.
    """

    time_ns: int
    key: str
    values: Any
    stats: Mapping[str, float | None]
    histogram: Any
    step: int | None
    iteration: int | None
    env_steps: int | None


@dataclass(frozen=True, slots=True)
class EventRecord:
    time_ns: int
    name: str
    attributes: Mapping[str, Any]
    seq: int = 0


@dataclass(frozen=True, slots=True)
class RunStart:
    """The run started: its span, what it plans, its configuration and where it comes from."""

    start_ns: int
    span_id: int
    parent_span_id: int | None = None
    family: str | None = None
    total_steps: int | None = None
    num_envs: int | None = None
    config: Mapping[str, Any] | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict)
    seq: int = 0

    status = lifecycle.RUNNING.value


@dataclass(frozen=True, slots=True)
class RunEnd:
    """The run ended: ``finished``, ``failed`` or ``killed``, and why.

    ``error_logs`` are a failed run's log files; ``detected_by`` is ``agent``
    when the agent ended the run of a producer that died.
    """

    status: str
    start_ns: int
    end_ns: int
    reason: str | None = None
    error_logs: tuple[str, ...] = ()
    detected_by: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", str(self.status))  # a lifecycle.RunStatus in, its plain text out to every output
    seq: int = 0


@dataclass(frozen=True, slots=True)
class CudaFallback:
    """A phase asked to be CUDA-timed that is timed on the host, and why."""

    timeline: str
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class RemoteCycle:
    """One cycle of a worker, as relayed to the learner (durations in ns)."""

    role: str
    timeline: str
    end_ns: int
    wall_ns: int
    top: Mapping[str, int]
    nested: Mapping[str, int]
