"""Consecutive packed ``scalars()`` calls of one key set as columns: the steady state of a loop that logs every step.

The segment source hands the pipeline stretches of packed calls of one key set of
floats as one :class:`ScalarRows` each; the pipeline checks them as a whole
and, in the steady state, hands them on as one
:class:`~otel_rl.core.batches.ScalarBatch` without a dictionary per call
(:mod:`otel_rl.core.scalars`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
