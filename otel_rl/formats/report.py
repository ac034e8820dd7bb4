"""The analysis report: frozen dataclasses, and their JSON.

:mod:`.measure` fills a :class:`Report` from a trace, :mod:`.rules` gives it
its :class:`Diagnosis`, :mod:`.printer` writes it as text. ``otel-rl analyze
--json``, the server's stored diagnosis and the web page read the JSON of
:meth:`Report.to_json`; :meth:`Report.from_json` reads it back (what a server
is sent), saying which field is wrong when it is not that shape.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Stats:
    """Durations of one thing (ms): count, mean, standard deviation, median, trimmed mean, p95 and total."""

    count: int
    mean_ms: float
    std_ms: float = 0.0
    p50_ms: float = 0.0
    trimmed_mean_ms: float = 0.0
    p95_ms: float = 0.0
    total_ms: float = 0.0


@dataclass(frozen=True)
class CycleStats(Stats):
    """A timeline's cycles, with up to :data:`.measure.MAX_SAMPLES` of their durations in order (the comparison's test)."""

    samples: tuple[float, ...] = ()


@dataclass(frozen=True)
class PhaseStats(Stats):
    """A phase's occurrences without its stalls, the stalls apart, and its share of its timeline's time."""

    stalls: int = 0
    stall_ms: float = 0.0
    stall_max_ms: float = 0.0
    title: str = ""
    nested: bool = False
    background: bool = False
    """Work on other threads, never inside the timeline's cycles: it overlaps them."""
    share: float = 0.0


@dataclass(frozen=True)
class Timeline:
    """A timeline's cycles and phases (largest first, nested ones last), and the shares of its time."""

    cycles: int
    cycle_ms: CycleStats | None
    phases: Mapping[str, PhaseStats]
    accounted_share: float = 0.0
    stall_share: float = 0.0
    other_share: float = 0.0
    ranks: tuple[RankTimeline, ...] = field(default=(), metadata={"omit_empty": True})
    """Each rank's own table, when several ranks recorded this timeline."""


@dataclass(frozen=True)
class RankTimeline(Timeline):
    """One rank's table of a timeline."""

    rank: int = 0
    host: str | None = None


@dataclass(frozen=True)
class Straggler:
    """The rank whose phase of work most exceeds the median rank's, per iteration, and where the others wait for it."""

    rank: int
    host: str | None
    phase: str
    title: str
    ms_per_iteration: float
    median_ms_per_iteration: float
    ratio: float | None
    others_wait_in: str | None
    others_wait_ms_per_iteration: float | None
    verdict: str
    timeline: str = "learner"


@dataclass(frozen=True)
class Turns:
    """For a loop that collects and learns in turn: each side's share of wall time, and neither's."""

    collector: float
    learner: float
    outside: float


@dataclass(frozen=True)
class Finding:
    """What was found, the numbers behind it, and what to look at."""

    finding: str
    evidence: str
    check: str


@dataclass(frozen=True)
class Diagnosis:
    """The main bottleneck in one plain line, and the findings with their evidence."""

    bottleneck: str
    findings: tuple[Finding, ...] = ()
    side: str | None = None
    """The timeline that sets the pace (``learner``, ``collector``), None when none does."""
    phase: str | None = None
    """Its phase (``env_step``...), ``unaccounted`` for time in no phase, None when not instrumented or unknown."""
    rank: int | None = None
    """The straggler's rank, when one holds the job."""


@dataclass(frozen=True)
class Regime:
    """A part of a run's life with a verdict of its own: its start-up, a warm-up, a steady state, a change midway."""

    kind: str
    """``start-up`` (one-off costs: imports, compilation, a CUDA context, the first batch), ``warm-up`` (before a phase
    that every later cycle has starts: learning before ``learning_starts``), ``steady``, or ``changed`` (a steady state
    whose cycle time moved midway from the one before)."""
    first_iteration: int
    last_iteration: int
    cycles: int
    start_s: float
    """Seconds from the trace's start."""
    seconds: float
    cycle_p50_ms: float
    bottleneck: str
    side: str | None = None
    phase: str | None = None
    headline: bool = False
    """The regime whose verdict is the run's (the longest steady one)."""


@dataclass(frozen=True)
class Report:
    """Where a run's time goes, and why."""

    wall_s: float
    turns: Turns | None = None
    env_steps_per_s: float | None = None
    env_steps_per_s_by_rank: Mapping[str, float] | None = None
    timelines: Mapping[str, Timeline] = field(default_factory=dict)
    overlap_share: float | None = None
    gpu_busy_share: Mapping[str, float] = field(default_factory=dict)
    host: Mapping[str, float] = field(default_factory=dict)
    profile: Mapping[str, Any] | None = field(default=None, metadata={"omit_empty": True})
    """torch.profiler's operators per phase (:mod:`.operators`), when the trace has them."""
    straggler: Straggler | None = None
    diagnosis: Diagnosis | None = None
    engine: str | None = field(default=None, metadata={"omit_empty": True})
    regimes: tuple[Regime, ...] = field(default=(), metadata={"omit_empty": True})
    """The run's regimes, in order, when it has more than one: the tables and the diagnosis are then the headline regime's."""

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready values (what ``otel-rl analyze --json`` prints)."""
        return _plain(self)

    @classmethod
    def from_json(cls, data: Any) -> Report:
        """A report from :meth:`to_json`'s shape (keys it does not know are left out).

        Raises:
            ValueError: naming the first field that is missing or of another type.
        """
        report = _build(cls, data, "report")
        if report.diagnosis is None:
            raise ValueError("report.diagnosis: missing")
        return report


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("omit_empty") and not item:
                continue
            out[f.name] = _plain(item)
        return out
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _build(kind: Any, data: Any, where: str) -> Any:
    """``data`` (JSON values) as ``kind`` (a type hint of this module's), or ValueError naming ``where`` it is not."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if data is None and type(None) in options:
            return None
        (inner,) = [option for option in options if option is not type(None)]
        return _build(inner, data, where)
    if dataclasses.is_dataclass(kind):
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected an object, got {_kind(data)}")
        hints = _HINTS.get(kind) or _HINTS.setdefault(kind, typing.get_type_hints(kind))
        values = {}
        for f in dataclasses.fields(kind):
            if f.name in data:
                values[f.name] = _build(hints[f.name], data[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}.{f.name}: missing")
        return kind(**values)
    if origin is Mapping:
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected an object, got {_kind(data)}")
        _, inner = typing.get_args(kind)
        return {str(key): _build(inner, item, f"{where}[{str(key)[:100]!r}]") for key, item in data.items()}
    if origin is tuple:
        if not isinstance(data, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {_kind(data)}")
        inner = typing.get_args(kind)[0]
        return tuple(_build(inner, item, f"{where}[{index}]") for index, item in enumerate(data))
    if kind is Any:
        return data
    if kind is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise ValueError(f"{where}: expected a number, got {_kind(data)}")
        return float(data) if math.isfinite(data) else data
    if kind is int or kind is bool or kind is str:
        if type(data) is not kind:
            raise ValueError(f"{where}: expected {'an integer' if kind is int else 'true or false' if kind is bool else 'a text'}, got {_kind(data)}")
        return data
    raise TypeError(f"no reader for {kind!r}")  # a field of a type this module does not read: its own mistake


def _kind(data: Any) -> str:
    return {dict: "an object", list: "a list", str: "a text", bool: "true or false", type(None): "null"}.get(type(data), type(data).__name__)


def build(kind: type[T], data: Any, where: str) -> T:
    """One of this module's dataclasses from its JSON (as :meth:`Report.from_json`, for a part of a report)."""
    return typing.cast(T, _build(kind, data, where))
