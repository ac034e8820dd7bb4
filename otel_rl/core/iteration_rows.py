"""Complete iterations of one lane as columns: the steady state of a training loop, assembled at once.

A record source that holds a lane as arrays (a shared-memory segment) hands
the pipeline a run of iterations that hold only top-level phases, each at its
iteration's depth and without an error, a flow or a CUDA correlation, as one
:class:`IterationRows` item (``(ITERATION_ROWS, rows)`` among the lane's raw
records). :func:`assemble` builds their records with a few array and list
operations, where record by record a pass spends most of its time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from otel_rl.core.records import IterationRecord, PhaseRecord
from otel_rl.schema import PhaseSpec

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


class IterationRun(list):
    """The records of one :class:`IterationRows`, as ``on_iterations`` gets them: a list of
    :class:`IterationRecord` whose ``rows`` a sink may read instead (their times plus ``offset_ns``)."""

    __slots__ = ("rows", "offset_ns")

    def __init__(self, records: list[IterationRecord], rows: IterationRows, offset_ns: int) -> None:
        super().__init__(records)
        self.rows = rows
        self.offset_ns = offset_ns


def assemble(rows: IterationRows, offset_ns: int, thread_id: int, thread_name: str) -> IterationRun:
    """The records of ``rows``, times moved by ``offset_ns`` (to epoch nanoseconds)."""
    counts = rows.counts
    bounds = np.concatenate(([0], np.cumsum(counts)))
    durations = np.concatenate(([0], np.cumsum(rows.phase_ends - rows.phase_starts)))
    accounted = (durations[bounds[1:]] - durations[bounds[:-1]]).tolist()
    specs = list(map(rows.specs.__getitem__, rows.phase_ids.tolist()))
    phase_env_steps = [steps for steps, n in zip(rows.env_steps, counts.tolist()) for _ in range(n)]
    phases = list(
        map(
            PhaseRecord,
            specs,
            (rows.phase_starts + offset_ns).tolist(),
            (rows.phase_ends + offset_ns).tolist(),
            repeat(rows.depth),
            repeat(thread_id),
            repeat(thread_name),
            repeat(None),
            repeat(None),
            np.repeat(rows.indices, counts).tolist(),
            phase_env_steps,
        )
    )
    timeline = rows.timeline
    columns = zip(
        rows.indices,
        rows.env_steps,
        (rows.starts + offset_ns).tolist(),
        (rows.ends + offset_ns).tolist(),
        bounds[:-1].tolist(),
        bounds[1:].tolist(),
        accounted,
        rows.cpu_ns,
    )
    records = [
        IterationRecord(timeline, index, env_steps, start, end, thread_id, thread_name, phases[first:last], spent, cpu)
        for index, env_steps, start, end, first, last, spent, cpu in columns
    ]
    return IterationRun(records, rows, offset_ns)
