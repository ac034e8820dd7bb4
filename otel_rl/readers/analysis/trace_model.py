"""What both analysis engines extract from a trace: slices, flows and counters.

Engines differ only in how they read the file; every number of the analysis
is computed from this model, so the two engines give the same answers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from otel_rl.formats import trace


@dataclass(slots=True)
class Slice:
    """One slice. ``category`` is the timeline (``learner``, ``collector``) or ``gpu``.

    ``track`` identifies the track (``pid/tid`` of a thread, ``GPU n/stream s``);
    ``parent`` is the index of the enclosing slice on the same track, or -1.
    """

    category: str
    name: str
    start_ns: int
    end_ns: int
    track: str
    process: str
    flows: tuple[int, ...] = ()
    parent: int = -1
    env_steps: int | None = None
    """An iteration's env-step count (its ``env_steps`` annotation), None for other slices."""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class TraceModel:
    slices: list[Slice] = field(default_factory=list)
    counters: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    clock_offsets: dict[str, list[float]] = field(default_factory=dict)
    """Per process: its clock minus rank 0's as measured (ms, :data:`otel_rl.formats.trace.CLOCK_OFFSET_KEY`)."""
    system: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=dict)
    """Per process: its ``sys/*`` counters (each process samples its own view of the host)."""

    def add_counter(self, process: str | None, name: str, ts: int, value: float) -> None:
        """One counter value, also kept per process where it is a clock offset or a ``sys/*`` reading."""
        self.counters.setdefault(name, []).append((ts, value))
        if process is None:
            return
        if name == trace.CLOCK_OFFSET_KEY:
            self.clock_offsets.setdefault(process, []).append(value)
        elif name.startswith("sys/"):
            self.system.setdefault(process, {}).setdefault(name, []).append((ts, value))

    def align_clocks(self) -> dict[str, float]:
        """Put every machine on rank 0's clock: subtract the median of the offsets measured on its processes.

        The processes of one machine (one host in their names) share its clock,
        so they share one offset, and a process's slices keep their nesting;
        processes without a measurement keep their wall-clock times. Returns
        the offset applied per machine (ms).
        """
        measured: dict[str, list[float]] = {}
        for process, values in self.clock_offsets.items():
            measured.setdefault(_machine(process), []).extend(values)
        applied = {machine: statistics.median(values) for machine, values in measured.items() if values}
        shifts = {machine: round(ms * 1e6) for machine, ms in applied.items() if ms}
        for s in self.slices:
            shift = shifts.get(_machine(s.process))
            if shift:
                s.start_ns -= shift
                s.end_ns -= shift
        return applied

    def link_parents(self) -> None:
        """Set each slice's parent from interval nesting on its track."""
        order = sorted(range(len(self.slices)), key=lambda i: (self.slices[i].track, self.slices[i].start_ns, -self.slices[i].end_ns))
        stack: list[int] = []
        track = None
        for index in order:
            s = self.slices[index]
            if s.track != track:
                stack, track = [], s.track
            while stack and self.slices[stack[-1]].end_ns <= s.start_ns:
                stack.pop()
            s.parent = stack[-1] if stack else -1
            stack.append(index)


def _machine(process: str) -> str:
    """The machine a process runs on: its host where its name says one, else the process itself."""
    host = trace.parse_process(process)[2]
    return f"host {host}" if host else process
