"""Complete iterations of one lane as columns: the steady state of a training loop, assembled at once.

A record source that holds a lane as arrays (a shared-memory segment) hands
the pipeline a run of iterations that hold only top-level phases, each at its
iteration's depth and without an error, a flow or a CUDA correlation, as one
:class:`IterationRows` item (``(ITERATION_ROWS, rows)`` among the lane's raw
records). An :class:`IterationRun` builds their records with a few array and
list operations (record by record, a pass spent most of its time there), and
only for the sinks that read records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from otel_rl.core.records import IterationRecord, PhaseRecord
from otel_rl.formats.schema import PhaseSpec

ITERATION_ROWS = "iteration_rows"
"""The head of a lane item that holds an :class:`IterationRows`."""


@dataclass(slots=True)
class IterationRows:
    """Consecutive iterations of one timeline on one lane, and their phases in one set of columns.

    Times are on the producer's ``perf_counter_ns()`` clock. The phases of
    iteration ``i`` are the ``counts[i]`` after those of iteration ``i - 1``;
    ``phase_ids`` index ``specs``. ``cpu_ns`` is each iteration's thread CPU
    time (None where not measured). ``expand`` gives the same records as raw
    lane tuples, for a lane whose assembly state holds something open.
    """

    timeline: str
    depth: int
    indices: list[int]
    env_steps: list[int | None]
    starts: np.ndarray
    ends: np.ndarray
    cpu_ns: list[int | None]
    counts: np.ndarray
    specs: dict[int, PhaseSpec]
    phase_ids: np.ndarray
    phase_starts: np.ndarray
    phase_ends: np.ndarray
    expand: Callable[[], list[tuple]]

    def phase_durations(self) -> list[tuple[PhaseSpec, np.ndarray]]:
        """Each phase's durations (nanoseconds, in order), per phase."""
        durations = self.phase_ends - self.phase_starts
        return [(spec, durations[self.phase_ids == phase_id]) for phase_id, spec in self.specs.items()]

    def phase_totals(self) -> dict[str, int]:
        """Nanoseconds per phase name over all these iterations."""
        totals: dict[str, int] = {}
        for spec, durations in self.phase_durations():
            totals[spec.name] = totals.get(spec.name, 0) + int(durations.sum())
        return totals


class IterationRun(Sequence[IterationRecord]):
    """The iterations of one :class:`IterationRows` as ``on_iterations`` gets them: a sequence of
    :class:`IterationRecord` built when first read (all of them, or one with :meth:`record`).

    A sink that reads ``rows`` instead (times plus ``offset_ns`` are epoch nanoseconds) needs no
    records: the aggregates and the trace read the columns, a span sink builds the iterations it samples.
    """

    def __init__(self, rows: IterationRows, offset_ns: int, thread_id: int, thread_name: str) -> None:
        self.rows = rows
        self.offset_ns = offset_ns
        self.thread_id = thread_id
        self.thread_name = thread_name
        self._built: dict[int, IterationRecord] = {}
        self._all: list[IterationRecord] | None = None

    def __len__(self) -> int:
        return len(self.rows.indices)

    def __getitem__(self, index):  # type: ignore[override]
        return self.records()[index]

    def __iter__(self) -> Iterator[IterationRecord]:
        return iter(self.records())

    def record(self, index: int) -> IterationRecord:
        """Iteration ``index``, built alone (the same object :meth:`records` holds later)."""
        return self.build([index])[0]

    def build(self, indices: list[int]) -> list[IterationRecord]:
        """Iterations ``indices`` (ascending), built in one go (the same objects :meth:`records` holds later)."""
        if self._all is not None:
            return [self._all[index] for index in indices]
        missing = [index for index in indices if index not in self._built]
        if missing:
            first = missing[0]
            for offset, record in enumerate(self._assemble(first, missing[-1] + 1)):
                self._built.setdefault(first + offset, record)
        return [self._built[index] for index in indices]

    def records(self) -> list[IterationRecord]:
        """Every iteration, built once."""
        if self._all is None:
            self._all = self._assemble(0, len(self))
            for index, record in self._built.items():
                self._all[index] = record
        return self._all

    def built(self) -> Iterable[IterationRecord]:
        """The records built so far (by a span sink, say)."""
        return self._all if self._all is not None else self._built.values()

    def first_overlap(self) -> int | None:
        """The first iteration whose phases account for more than its wall time (they overlap), if any."""
        rows = self.rows
        over = np.flatnonzero(_accounted(rows.counts, rows.phase_starts, rows.phase_ends) > rows.ends - rows.starts)
        return int(over[0]) if len(over) else None

    def _assemble(self, first: int, last: int) -> list[IterationRecord]:
        """The records of iterations ``first`` to ``last`` (excluded)."""
        rows, offset_ns, thread_id, thread_name = self.rows, self.offset_ns, self.thread_id, self.thread_name
        counts = rows.counts[first:last]
        below = int(rows.counts[:first].sum())
        bounds = np.concatenate(([0], np.cumsum(counts)))
        phase_starts = rows.phase_starts[below : below + bounds[-1]]
        phase_ends = rows.phase_ends[below : below + bounds[-1]]
        indices, env_steps = rows.indices[first:last], rows.env_steps[first:last]
        phases = list(
            map(
                PhaseRecord,
                map(rows.specs.__getitem__, rows.phase_ids[below : below + bounds[-1]].tolist()),
                (phase_starts + offset_ns).tolist(),
                (phase_ends + offset_ns).tolist(),
                repeat(rows.depth),
                repeat(thread_id),
                repeat(thread_name),
                repeat(None),
                repeat(None),
                np.repeat(indices, counts).tolist(),
                [steps for steps, n in zip(env_steps, counts.tolist()) for _ in range(n)],
            )
        )
        columns = zip(
            indices,
            env_steps,
            (rows.starts[first:last] + offset_ns).tolist(),
            (rows.ends[first:last] + offset_ns).tolist(),
            bounds[:-1].tolist(),
            bounds[1:].tolist(),
            _accounted(counts, phase_starts, phase_ends).tolist(),
            rows.cpu_ns[first:last],
        )
        timeline = rows.timeline
        return [
            IterationRecord(timeline, index, steps, start, end, thread_id, thread_name, phases[a:b], accounted, cpu)
            for index, steps, start, end, a, b, accounted, cpu in columns
        ]


def _accounted(counts: np.ndarray, phase_starts: np.ndarray, phase_ends: np.ndarray) -> np.ndarray:
    """Each iteration's phase time: the durations of its ``counts[i]`` phases summed."""
    bounds = np.concatenate(([0], np.cumsum(counts)))
    spent = np.concatenate(([0], np.cumsum(phase_ends - phase_starts)))
    return spent[bounds[1:]] - spent[bounds[:-1]]
