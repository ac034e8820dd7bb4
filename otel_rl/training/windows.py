"""Log windows on the training side: the learner's timings since the last window, as ``Perf/*`` values."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from otel_rl.base.values import snapshot
from otel_rl.formats import schema

Totals = tuple[dict[tuple[str, str], float], dict[str, tuple[int, float]]]
"""Cumulative host milliseconds per (timeline, phase), and (cycles, wall ms) per timeline (what the outputs publish)."""


class Windows:
    """Learner timings per iteration between calls, from the totals the outputs publish after every pass.

    Args:
        totals: the outputs' latest cumulative totals.
    """

    def __init__(self, totals: Callable[[], Totals]) -> None:
        self._totals = totals
        self._mark: Totals = ({}, {})
        self.count = 0
        """Windows reduced across ranks so far."""

    def timings(self) -> dict[str, float]:
        """See :meth:`otel_rl.Telemetry.window_timings`."""
        phases, cycles = self._totals()
        last_phases, last_cycles = self._mark
        self._mark = (phases, cycles)
        count, wall = cycles.get(schema.LEARNER, (0, 0.0))
        count -= last_cycles.get(schema.LEARNER, (0, 0.0))[0]
        wall -= last_cycles.get(schema.LEARNER, (0, 0.0))[1]
        if count <= 0:
            return {}
        out = {"Perf/iteration_time": wall / count / 1e3}
        for (timeline, name), total in phases.items():
            if timeline == schema.LEARNER:
                delta = total - last_phases.get((timeline, name), 0.0)
                out[schema.phase_key(timeline, name)] = delta / count * schema.phase_key_scale(timeline, name)
        return out

    def across_ranks(self, values: Mapping[str, Any] | None, group: Any, env_steps: int | None = None) -> tuple[dict[str, float], list[dict[str, float]]]:
        """This window's timings and ``values``, reduced across the ranks of ``group`` when one is given, and each
        rank's own timings (none without a group; see :meth:`otel_rl.Telemetry.log_window`). ``env_steps``: this
        rank's latest, summed into the job's (:data:`otel_rl.formats.schema.JOB_ENV_STEPS`)."""
        local = {**self.timings(), **snapshot(values or {})}
        if group is None:
            return local, []
        if env_steps is not None:
            local[schema.JOB_ENV_STEPS] = float(env_steps)
        from otel_rl.training.distributed import reduce_and_gather

        self.count += 1
        return reduce_and_gather(local, schema.is_learner_timing, group)
