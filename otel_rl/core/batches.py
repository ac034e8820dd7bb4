"""What a pipeline pass hands its sinks: stretches of records as columns, each one batch built once.

A pass hands the iterations a thread completed as an :class:`IterationBatch`,
the phases it recorded outside any iteration as a :class:`PhaseBatch`, and
consecutive ``scalars()`` calls of one key set as a :class:`ScalarBatch`. A
batch holds its records as columns (numpy arrays and lists: what the trace,
the aggregates and the protocol's lines read) and is a sequence of the
records themselves (:mod:`otel_rl.core.records`, what spans read), built from
the columns once, when first read. Every sink gets the same batch type
whatever the records' shape: the columns are complete (nested phases, flows,
errors and correlations included).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, TypeVar

import numpy as np

from otel_rl.core.records import IterationRecord, PhaseRecord, ScalarsRecord
from otel_rl.formats.schema import PhaseSpec

_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class Phases:
    """Phases of one thread as columns, each followed by the phases nested in it (the order their slices open).

    ``spec_ids`` index ``specs``; times are epoch nanoseconds; ``depths`` are
    0 for a phase at the top level of its iteration (or of its thread, outside
    iterations), 1 for a phase nested in one, and so on; ``span_ids`` are 0 for
    a phase not exported as a span. The rare parts are sparse, by position:
    the exception type a phase ended with, the flows marked inside it, its
    CUDA correlation.
    """

    specs: tuple[PhaseSpec, ...]
    spec_ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    depths: np.ndarray
    span_ids: np.ndarray
    errors: Mapping[int, str] = field(default_factory=dict)
    flows: Mapping[int, tuple[tuple[int, bool], ...]] = field(default_factory=dict)
    correlations: Mapping[int, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.starts)

    def durations(self) -> np.ndarray:
        return self.ends - self.starts

    def by_spec(self, where: np.ndarray | None = None) -> list[tuple[PhaseSpec, np.ndarray]]:
        """Each phase's durations (nanoseconds, in order), per phase spec; ``where``: a mask of the phases to count."""
        durations, ids = self.durations(), self.spec_ids
        if where is not None:
            durations, ids = durations[where], ids[where]
        return [(self.specs[spec_id], durations[ids == spec_id]) for spec_id in np.unique(ids).tolist()]

    def totals(self, where: np.ndarray | None = None) -> dict[str, int]:
        """Nanoseconds per phase name (of the phases ``where`` selects)."""
        totals: dict[str, int] = {}
        for spec, durations in self.by_spec(where):
            totals[spec.name] = totals.get(spec.name, 0) + int(durations.sum())
        return totals

    def trees(self, first: int, last: int, thread: tuple[int, str], iteration: tuple[int | None, int | None] = (None, None)) -> tuple[PhaseRecord, ...]:
        """Phases ``first`` to ``last`` (excluded) as records, each with the phases nested in it."""
        if first == last:
            return ()
        depths = self.depths[first:last]
        if not depths.any() and not self.errors and not self.flows and not self.correlations:
            return self._flat(first, last, thread, iteration)
        built: list[PhaseRecord] = []
        stack: list[tuple[int, list]] = []  # (position, children) of the phases still open, outermost first
        for position in range(first, last):
            depth = int(self.depths[position])
            while len(stack) > depth:
                self._close(stack, built, thread, iteration)
            stack.append((position, []))
        while stack:
            self._close(stack, built, thread, iteration)
        return tuple(built)

    def _flat(self, first: int, last: int, thread: tuple[int, str], iteration: tuple[int | None, int | None]) -> tuple[PhaseRecord, ...]:
        count = last - first
        return tuple(
            map(
                PhaseRecord,
                map(self.specs.__getitem__, self.spec_ids[first:last].tolist()),
                self.starts[first:last].tolist(),
                self.ends[first:last].tolist(),
                repeat(0, count),
                repeat(thread[0], count),
                repeat(thread[1], count),
                repeat(None, count),
                repeat((), count),
                repeat(iteration[0], count),
                repeat(iteration[1], count),
                self.span_ids[first:last].tolist(),
            )
        )

    def _close(self, stack: list, built: list, thread: tuple[int, str], iteration: tuple[int | None, int | None]) -> None:
        position, children = stack.pop()
        record = PhaseRecord(
            self.specs[int(self.spec_ids[position])],
            int(self.starts[position]),
            int(self.ends[position]),
            int(self.depths[position]),
            thread[0],
            thread[1],
            self.errors.get(position),
            tuple(children),
            iteration[0],
            iteration[1],
            int(self.span_ids[position]),
            self.flows.get(position, ()),
            self.correlations.get(position, 0),
        )
        (stack[-1][1] if stack else built).append(record)


class _Built(Sequence[_R]):
    """A sequence of records built from columns when first read, each once (all of them, or those asked for)."""

    __slots__ = ("_all", "_some")

    def __init__(self, records: list | None = None) -> None:
        self._all: list | None = records
        self._some: dict[int, Any] = {}

    @abstractmethod
    def _build(self, first: int, last: int) -> list:
        """The records ``first`` to ``last`` (excluded), built from the columns."""

    def records(self) -> list[_R]:
        """Every record, built once."""
        if self._all is None:
            built = self._build(0, len(self))
            for index, record in self._some.items():
                built[index] = record
            self._all = built
        return self._all

    def at(self, indices: Sequence[int]) -> list[_R]:
        """The records at ``indices`` (ascending), built in one go (the same objects :meth:`records` gives later)."""
        if self._all is not None:
            return [self._all[index] for index in indices]
        missing = [index for index in indices if index not in self._some]
        if missing:
            first = missing[0]
            for offset, record in enumerate(self._build(first, missing[-1] + 1)):
                self._some.setdefault(first + offset, record)
        return [self._some[index] for index in indices]

    def __getitem__(self, index):  # type: ignore[override]
        return self.records()[index]

    def __iter__(self) -> Iterator[_R]:
        return iter(self.records())


class IterationBatch(_Built[IterationRecord]):
    """Consecutive iterations of one timeline on one thread, and their phases, as columns.

    The phases of iteration ``i`` are the ``counts[i]`` after those of
    iteration ``i - 1`` (nested ones included); ``span_ids`` are 0 for an
    iteration not exported as a span; ``cpu_ns`` is each iteration's thread
    CPU time (None where not measured).
    """

    __slots__ = ("timeline", "thread_id", "thread_name", "indices", "env_steps", "starts", "ends", "cpu_ns", "span_ids", "counts", "phases", "accounted")

    def __init__(
        self,
        timeline: str,
        thread: tuple[int, str],
        indices: list[int],
        env_steps: list[int | None],
        starts: np.ndarray,
        ends: np.ndarray,
        cpu_ns: list[int | None],
        span_ids: np.ndarray,
        counts: np.ndarray,
        phases: Phases,
    ) -> None:
        super().__init__()
        self.timeline = timeline
        self.thread_id, self.thread_name = thread
        self.indices, self.env_steps, self.cpu_ns = indices, env_steps, cpu_ns
        self.starts, self.ends, self.span_ids, self.counts, self.phases = starts, ends, span_ids, counts, phases
        self.accounted = _per_iteration(counts, np.where(phases.depths == 0, phases.durations(), 0))
        """Each iteration's top-level phase time (nanoseconds)."""

    @classmethod
    def of(cls, iterations: Sequence[IterationRecord]) -> IterationBatch:
        """The batch of iterations of one timeline and thread (records made elsewhere: a test's, say)."""
        first = iterations[0]
        phases, counts = _phases_of([it.phases for it in iterations])
        batch = cls(
            first.timeline,
            (first.thread_id, first.thread_name),
            [it.index for it in iterations],
            [it.env_steps for it in iterations],
            np.array([it.start_ns for it in iterations], dtype=np.int64),
            np.array([it.end_ns for it in iterations], dtype=np.int64),
            [it.thread_cpu_ns for it in iterations],
            np.array([it.span_id for it in iterations], dtype=np.uint64),
            counts,
            phases,
        )
        return batch

    def __len__(self) -> int:
        return len(self.indices)

    def walls(self) -> np.ndarray:
        return self.ends - self.starts

    def first_overlap(self) -> int | None:
        """The first iteration whose top-level phases account for more than its wall time (they overlap), if any."""
        over = np.flatnonzero(self.accounted > self.walls())
        return int(over[0]) if len(over) else None

    def _build(self, first: int, last: int) -> list[IterationRecord]:
        bounds = np.concatenate(([0], np.cumsum(self.counts)))
        thread = (self.thread_id, self.thread_name)
        return [
            IterationRecord(
                self.timeline,
                self.indices[i],
                self.env_steps[i],
                int(self.starts[i]),
                int(self.ends[i]),
                self.thread_id,
                self.thread_name,
                self.phases.trees(int(bounds[i]), int(bounds[i + 1]), thread, (self.indices[i], self.env_steps[i])),
                int(self.accounted[i]),
                self.cpu_ns[i],
                int(self.span_ids[i]),
            )
            for i in range(first, last)
        ]


class PhaseBatch(_Built[PhaseRecord]):
    """Phases one thread recorded outside any iteration of their timeline (a collector without cycles, say).

    The sequence holds the top-level ones, each with the phases nested in it.
    """

    __slots__ = ("thread_id", "thread_name", "phases", "_tops")

    def __init__(self, thread: tuple[int, str], phases: Phases) -> None:
        super().__init__()
        self.thread_id, self.thread_name = thread
        self.phases = phases
        self._tops = np.flatnonzero(phases.depths == 0)

    @classmethod
    def of(cls, phases: Sequence[PhaseRecord]) -> PhaseBatch:
        """The batch of top-level phases of one thread (records made elsewhere: a test's, say)."""
        return cls((phases[0].thread_id, phases[0].thread_name), _phases_of([phases])[0])

    def __len__(self) -> int:
        return len(self._tops)

    def _build(self, first: int, last: int) -> list[PhaseRecord]:
        ends = [*self._tops.tolist(), len(self.phases)]
        thread = (self.thread_id, self.thread_name)
        return [self.phases.trees(ends[i], ends[i + 1], thread)[0] for i in range(first, last)]


class ScalarBatch(_Built[ScalarsRecord]):
    """Consecutive ``scalars()`` calls of one key set, as columns.

    ``values`` holds a row per call in ``names``' order: float64 when every
    value is a finite float, else objects (ints, and None for a value that was
    not finite). Times are epoch nanoseconds; each call's seq is its
    ``motrix.metrics/v1`` sequence number.
    """

    __slots__ = ("names", "times_ns", "values", "steps", "iterations", "env_steps", "seqs")

    def __init__(
        self,
        names: tuple[str, ...],
        times_ns: np.ndarray,
        values: np.ndarray,
        steps: list[int | None],
        iterations: list[int | None],
        env_steps: list[int | None],
        seqs: list[int],
        records: list[ScalarsRecord] | None = None,
    ) -> None:
        """``records``: the records themselves, where they were made first."""
        super().__init__(records)
        self.names, self.times_ns, self.values = names, times_ns, values
        self.steps, self.iterations, self.env_steps, self.seqs = steps, iterations, env_steps, seqs

    @classmethod
    def of(cls, records: Sequence[ScalarsRecord]) -> ScalarBatch:
        """The batch of records of one key set (the rare calls the pipeline checked value by value)."""
        names = tuple(records[0].values)
        rows = [[record.values[name] for name in names] for record in records]
        floats = all(type(v) is float for row in rows for v in row)
        return cls(
            names,
            np.array([record.time_ns for record in records], dtype=np.int64),
            np.array(rows, dtype=np.float64 if floats else object).reshape(len(records), len(names)),
            [record.step for record in records],
            [record.iteration for record in records],
            [record.env_steps for record in records],
            [record.seq for record in records],
            list(records),
        )

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def finite(self) -> bool:
        """Every value is a number: none was replaced by None."""
        return self.values.dtype != object or not any(v is None for v in self.values.flat)

    def axis_steps(self) -> list[int | None]:
        """Each call's protocol ``step``: its step, else its env steps."""
        if None not in self.steps:
            return self.steps
        return [e if s is None else s for s, e in zip(self.steps, self.env_steps)]

    def latest(self) -> dict[str, tuple[Any, int]]:
        """Each key's latest value that is not None, and its time (a key never given one is absent)."""
        times = self.times_ns.tolist()
        if self.finite:
            return dict(zip(self.names, zip(self.values[-1].tolist(), repeat(times[-1]))))
        latest: dict[str, tuple[Any, int]] = {}
        for column, name in enumerate(self.names):
            for row in range(len(self) - 1, -1, -1):
                value = self.values[row, column]
                if value is not None:
                    latest[name] = (value, times[row])
                    break
        return latest

    def latest_values(self) -> dict[str, Any]:
        """Each key's value in the last call (None included)."""
        return dict(zip(self.names, self.values[-1].tolist()))

    def _build(self, first: int, last: int) -> list[ScalarsRecord]:
        names, times = self.names, self.times_ns[first:last].tolist()
        return [
            ScalarsRecord(time_ns, dict(zip(names, row)), step, iteration, env_steps, seq)
            for time_ns, row, step, iteration, env_steps, seq in zip(
                times,
                self.values[first:last].tolist(),
                self.steps[first:last],
                self.iterations[first:last],
                self.env_steps[first:last],
                self.seqs[first:last],
            )
        ]


def _phases_of(groups: Sequence[Sequence[PhaseRecord]]) -> tuple[Phases, np.ndarray]:
    """Groups of phase records (each phase with the ones nested in it) as one :class:`Phases`, and each group's size."""
    rows: list[tuple[PhaseRecord, int]] = []
    counts = []

    def add(phase: PhaseRecord, depth: int) -> None:
        rows.append((phase, depth))
        for child in phase.children:
            add(child, depth + 1)

    for group in groups:
        before = len(rows)
        for phase in group:
            add(phase, 0)
        counts.append(len(rows) - before)
    specs: dict[int, int] = {}
    table: list[PhaseSpec] = []
    for phase, _ in rows:
        if id(phase.spec) not in specs:
            specs[id(phase.spec)] = len(table)
            table.append(phase.spec)
    phases = Phases(
        tuple(table),
        np.array([specs[id(phase.spec)] for phase, _ in rows], dtype=np.intp),
        np.array([phase.start_ns for phase, _ in rows], dtype=np.int64),
        np.array([phase.end_ns for phase, _ in rows], dtype=np.int64),
        np.array([depth for _, depth in rows], dtype=np.int16),
        np.array([phase.span_id for phase, _ in rows], dtype=np.uint64),
        {i: phase.error for i, (phase, _) in enumerate(rows) if phase.error is not None},
        {i: tuple(phase.flows) for i, (phase, _) in enumerate(rows) if phase.flows},
        {i: phase.correlation for i, (phase, _) in enumerate(rows) if phase.correlation},
    )
    return phases, np.array(counts, dtype=np.int64)


def _per_iteration(counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` (one per phase) summed per iteration (``counts[i]`` phases each)."""
    bounds = np.concatenate(([0], np.cumsum(counts)))
    spent = np.concatenate(([0], np.cumsum(values)))
    return spent[bounds[1:]] - spent[bounds[:-1]]
