"""What both analysis engines extract from a trace: slices, flows and counters.

Engines differ only in how they read the file; every number of the analysis
is computed from this model, so the two engines give the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
