"""``Perf/*`` from the pipeline's passes: the learner's and collector's walls and seed 001's names."""

from __future__ import annotations

import pytest

from otel_rl.core.perf_windows import PerfWindows
from otel_rl.core.totals import CycleTotals, PassTotals


def test_the_collectors_rollout_wall_and_the_ranks_gradient_sync_have_seed_001s_names():
    windows = PerfWindows()
    learner, collector = CycleTotals(), CycleTotals()
    for _ in range(4):
        learner.add_cycle(10_000_000, {"learning": 6_000_000, "gradient_sync": 3_000_000}, {})
    for _ in range(2):
        collector.add_cycle(250_000_000, {"env_step": 200_000_000}, {})
    windows.add(PassTotals(1, {"learner": learner, "collector": collector}))
    values = windows.take()
    assert values["Perf/iteration_time"] == pytest.approx(0.010) and values["Perf/collection_time"] == pytest.approx(0.250)
    assert values["Perf/learner_gradient_sync_ms"] == pytest.approx(3.0) == values["Perf/dp_gradient_sync_ms_per_rank"]
    assert values["Perf/collector_env_step_ms"] == pytest.approx(200.0)
    assert values["Perf/window_iterations"] == 4  # what the learner's means are over
    assert windows.take() == {}  # a new window


def test_an_iteration_longer_than_the_window_is_its_own_record():
    """Seed 001: the backends keep each iteration's value, not a smoothed one, where iterations outlast the window."""
    windows = PerfWindows(interval_s=0.0)
    for wall_ms in (1500, 2500):
        learner = CycleTotals()
        learner.add_cycle(wall_ms * 1_000_000, {"learning": wall_ms * 900_000}, {})
        windows.add(PassTotals(1, {"learner": learner}))
        values = windows.take()
        assert values["Perf/window_iterations"] == 1 and values["Perf/iteration_time"] == pytest.approx(wall_ms / 1000)
