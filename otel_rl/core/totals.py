"""What one pipeline pass measured per timeline: the sums windowed readers add up instead of walking every record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from otel_rl.core.batches import IterationBatch
from otel_rl.formats import schema


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
    parents: dict[str, str] = field(default_factory=dict)
    """The top-level phase each custom nested phase ran in (a canonical one names its parent in the schema)."""
    sync_calls: int = 0
    """``gradient_sync`` phases within the cycles (a rank's gradient all-reduces: one per bucket or per update)."""
    under_way: tuple[int, int | None, int] | None = None
    """The local iteration still open at the pass's end, as ``(index, env steps, start epoch ns)``: progress counts it."""

    def add(self, other: CycleTotals) -> None:
        """Another pass's totals of the same timeline (a window adding up passes); its ``index``, ``env_steps`` and ``under_way`` are not kept."""
        self.cycles += other.cycles
        self.wall_ns += other.wall_ns
        self.sync_calls += other.sync_calls
        for mine, theirs in ((self.top, other.top), (self.nested, other.nested), (self.loose, other.loose), (self.counts, other.counts)):
            _add(mine, theirs)

    def add_cycle(self, wall_ns: int, top: Mapping[str, int], nested: Mapping[str, int]) -> None:
        """A cycle relayed from a worker."""
        self.cycles += 1
        self.wall_ns += wall_ns
        _add(self.top, top)
        _add(self.nested, nested)

    def add_batch(self, batch: IterationBatch) -> None:
        """Local cycles."""
        self.cycles += len(batch)
        self.wall_ns += int(batch.walls().sum())
        top = batch.phases.depths == 0
        _add(self.top, batch.phases.totals(top))
        if not top.all():
            _add(self.nested, batch.phases.totals(~top))
            self._note_parents(batch, top)
        sync = [i for i, spec in enumerate(batch.phases.specs) if spec is not None and spec.name == schema.GRADIENT_SYNC]
        if sync:
            self.sync_calls += int(np.isin(batch.phases.spec_ids, sync).sum())
        self.index, self.env_steps = batch.indices[-1], batch.env_steps[-1]

    def _note_parents(self, batch: IterationBatch, top: np.ndarray) -> None:
        """Where each custom nested phase ran: the top-level phase opened last before it."""
        phases = batch.phases
        custom = [i for i, spec in enumerate(phases.specs) if spec is not None and spec.parent is None]
        nested = np.flatnonzero(~top & np.isin(phases.spec_ids, custom)) if custom else ()
        if len(nested) == 0:
            return
        tops = np.flatnonzero(top)
        for position, at in zip(nested.tolist(), (np.searchsorted(tops, nested, side="right") - 1).tolist(), strict=True):
            if at >= 0:
                self.parents.setdefault(phases.specs[phases.spec_ids[position]].name, phases.specs[phases.spec_ids[tops[at]]].name)

    def add_loose(self, name: str, durations: np.ndarray) -> None:
        """Occurrences of a phase outside any cycle (nested ones included)."""
        self.loose[name] = self.loose.get(name, 0) + int(durations.sum())
        self.counts[name] = self.counts.get(name, 0) + len(durations)


@dataclass(slots=True)
class PassTotals:
    """Per timeline, what one pipeline pass added (see :meth:`otel_rl.core.pipeline.RecordSink.on_cycles`); ``time_ns`` is the pass's end."""

    time_ns: int
    timelines: dict[str, CycleTotals]


def _add(totals: dict[str, int], values: Mapping[str, int]) -> None:
    for name, ns in values.items():
        totals[name] = totals.get(name, 0) + ns
