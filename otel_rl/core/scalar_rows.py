"""Consecutive ``scalars()`` calls of one key set as columns: the steady state of a loop that logs every step.

A record source that holds scalars as packed arrays (a shared-memory segment)
hands the pipeline calls of one key set as one :class:`ScalarRows`. When
their keys are canonical, their values finite and their steps rising, the
pipeline hands them on as one :class:`ScalarRun`: the sinks that read columns
(the protocol's lines, the latest values) never build a dictionary per call;
the others get :class:`ScalarsRecord` built when first read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from otel_rl.core.records import ScalarsRecord


@dataclass(slots=True)
class ScalarRows:
    """Consecutive ``scalars()`` calls of one key set, column by column (as a segment holds them).

    ``times_ns`` are on the producer's ``perf_counter_ns()`` clock (int64);
    ``values`` holds a row of floats per call, in ``names``' order; ``finite``
    says per call that every one of them is finite; axes are None where absent.
    """

    times_ns: np.ndarray
    names: tuple[str, ...]
    values: np.ndarray
    finite: list[bool]
    steps: list[int | None]
    iterations: list[int | None]
    env_steps: list[int | None]

    def axis_steps(self) -> list[int | None]:
        """Each call's protocol ``step``: its step, else its env steps."""
        if None not in self.steps:
            return self.steps
        return [e if s is None else s for s, e in zip(self.steps, self.env_steps)]


class ScalarRun(Sequence[ScalarsRecord]):
    """The calls of one :class:`ScalarRows`, with their epoch times and seqs, as a block's ``records``.

    Indexing builds the one record asked for (the same object every time);
    iterating builds them all. ``epoch_ns`` (int64 epoch nanoseconds),
    ``values`` and the axis lists are the columns, for a sink that reads them.
    """

    def __init__(self, rows: ScalarRows, offset_ns: int, seqs: list[int]) -> None:
        self.names = rows.names
        self.epoch_ns = rows.times_ns + offset_ns
        self.values = rows.values
        self.steps, self.iterations, self.env_steps = rows.steps, rows.iterations, rows.env_steps
        self.seqs = seqs
        self._built: dict[int, ScalarsRecord] = {}
        self._times: list[int] | None = None

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        record = self._built.get(index)
        if record is None:
            if not 0 <= index < len(self):
                raise IndexError(index)
            record = self._built[index] = self._record(index, self.values[index].tolist())
        return record

    def __iter__(self) -> Iterator[ScalarsRecord]:
        if len(self._built) < len(self):
            for index, row in enumerate(self.values.tolist()):
                if index not in self._built:
                    self._built[index] = self._record(index, row)
        return (self._built[index] for index in range(len(self)))

    def times_ns(self) -> list[int]:
        """Each call's epoch time in nanoseconds."""
        if self._times is None:
            self._times = self.epoch_ns.tolist()
        return self._times

    def _record(self, index: int, row: list[float]) -> ScalarsRecord:
        values = dict(zip(self.names, row))
        return ScalarsRecord(self.times_ns()[index], values, self.steps[index], self.iterations[index], self.env_steps[index], self.seqs[index])
